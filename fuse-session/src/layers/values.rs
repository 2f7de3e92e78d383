//! The values the layers answer with where the raw trait answers through
//! a reply handle (what an [`AsyncFilesystem`](crate::asyncfs::AsyncFilesystem)
//! returns, and what the node and path layers make of their filesystems'
//! answers): an open file ([`Open`]), bytes ([`Data`]), a created and
//! opened file ([`Created`]), directory entries ([`DirEntry`],
//! [`DirEntryPlus`]) and the outcome of an ioctl ([`Ioctl`]).

use crate::attr::FileKind;
use crate::backing::BackingFile;
use crate::types::{Entry, FileHandle, Inode};
use fuse_proto::flags::FopenFlags;
use std::sync::Arc;

/// An open file as OPEN, OPENDIR, CREATE and TMPFILE answer it: the
/// handle the kernel passes back in later requests, the flags that tell it
/// how to treat the file, and the backing file of a passthrough open. The
/// node and path layers answer with it, and an
/// [`AsyncFilesystem`](crate::asyncfs::AsyncFilesystem) returns it.
#[derive(Debug)]
pub struct Open {
    /// The handle.
    pub fh: FileHandle,
    /// `DIRECT_IO`, `KEEP_CACHE`, … (the session may add `DIRECT_IO |
    /// PARALLEL_DIRECT_WRITES` for an `O_DIRECT` open: see
    /// [`SessionConfig::o_direct_parallel_writes`](crate::SessionConfig::o_direct_parallel_writes))
    pub flags: FopenFlags,
    /// The backing file the kernel is to pass through to, if any (keep a
    /// clone until RELEASE; see [`ReplyOpen::passthrough`](crate::reply::ReplyOpen::passthrough)).
    pub backing: Option<BackingFile>,
}

impl Open {
    /// Handle `fh`, no flags, no backing file.
    pub fn new(fh: FileHandle) -> Open {
        Open {
            fh,
            flags: FopenFlags::empty(),
            backing: None,
        }
    }

    /// With `flags` added.
    pub fn with_flags(mut self, flags: FopenFlags) -> Open {
        self.flags |= flags;
        self
    }

    /// In passthrough mode on `backing`.
    pub fn passthrough(mut self, backing: BackingFile) -> Open {
        self.backing = Some(backing);
        self
    }
}

/// Bytes a READ, READLINK, GETXATTR, LISTXATTR or IOCTL answers with,
/// owned by the answer so that it can outlive the future that made it.
///
/// Made from what a filesystem already has without copying: a `Vec<u8>`,
/// a `String`, static bytes, a range of an `Arc<[u8]>` (a cached block
/// shared by many readers), or any other owned bytes with [`Data::new`].
///
/// ```
/// use fuse_session::asyncfs::Data;
/// use std::sync::Arc;
///
/// let block: Arc<[u8]> = Arc::from(&b"0123456789"[..]);
/// assert_eq!(Data::shared(block.clone(), 2..5).as_ref(), b"234");
/// assert_eq!(Data::shared(block, 8..64).as_ref(), b"89"); // clamped to the end
/// assert_eq!(Data::from(vec![1, 2]).len(), 2);
/// assert!(Data::from(&b""[..]).is_empty());
/// ```
pub struct Data(Repr);

enum Repr {
    Vec(Vec<u8>),
    Static(&'static [u8]),
    Shared(Arc<[u8]>, usize, usize),
    Other(Box<dyn AsRef<[u8]> + Send + Sync>),
}

impl Data {
    /// No bytes (end of file).
    pub const EMPTY: Data = Data(Repr::Static(&[]));

    /// Any owned bytes (a `bytes::Bytes`, a memory map…); boxed.
    pub fn new(bytes: impl AsRef<[u8]> + Send + Sync + 'static) -> Data {
        Data(Repr::Other(Box::new(bytes)))
    }

    /// The bytes `range` of `block`, clamped to its length (a range past
    /// its end is empty: end of file).
    pub fn shared(block: Arc<[u8]>, range: std::ops::Range<usize>) -> Data {
        let end = range.end.min(block.len());
        let start = range.start.min(end);
        Data(Repr::Shared(block, start, end))
    }

    /// How many bytes.
    pub fn len(&self) -> usize {
        self.as_ref().len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl AsRef<[u8]> for Data {
    fn as_ref(&self) -> &[u8] {
        match &self.0 {
            Repr::Vec(v) => v,
            Repr::Static(s) => s,
            Repr::Shared(b, start, end) => &b[*start..*end],
            Repr::Other(o) => (**o).as_ref(),
        }
    }
}

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Data({} bytes)", self.len())
    }
}

impl From<Vec<u8>> for Data {
    fn from(v: Vec<u8>) -> Data {
        Data(Repr::Vec(v))
    }
}

impl From<String> for Data {
    fn from(s: String) -> Data {
        Data(Repr::Vec(s.into_bytes()))
    }
}

impl From<&'static [u8]> for Data {
    fn from(s: &'static [u8]) -> Data {
        Data(Repr::Static(s))
    }
}

impl From<&'static str> for Data {
    fn from(s: &'static str) -> Data {
        Data(Repr::Static(s.as_bytes()))
    }
}

impl From<Arc<[u8]>> for Data {
    fn from(b: Arc<[u8]>) -> Data {
        let n = b.len();
        Data(Repr::Shared(b, 0, n))
    }
}

/// A file CREATE, TMPFILE or atomic open made (or, for atomic open
/// without `O_EXCL`, found) and opened: its entry (one lookup reference,
/// as for LOOKUP) and the open file.
#[derive(Debug)]
pub struct Created {
    /// The new node's entry.
    pub entry: Entry,
    /// The open file.
    pub open: Open,
    /// Whether this call created the file (false: atomic open found it;
    /// FUSE_CREATE does not tell the kernel either way).
    pub created: bool,
}

impl Created {
    /// `entry`, created by this call and opened as `open`.
    pub fn new(entry: Entry, open: Open) -> Created {
        Created {
            entry,
            open,
            created: true,
        }
    }
}

/// One name of a READDIR answer.
#[derive(Clone, Debug)]
pub struct DirEntry {
    /// Its node (`d_ino`).
    pub ino: Inode,
    /// Its cookie: the READDIR `offset` that continues the listing after
    /// it (never 0).
    pub offset: u64,
    /// Its kind.
    pub kind: FileKind,
    /// Its name.
    pub name: Vec<u8>,
}

impl DirEntry {
    /// Entry `name` for node `ino` of `kind`, with cookie `offset`.
    pub fn new(ino: Inode, offset: u64, kind: FileKind, name: impl Into<Vec<u8>>) -> DirEntry {
        DirEntry {
            ino,
            offset,
            kind,
            name: name.into(),
        }
    }
}

/// One name of a READDIRPLUS answer: a [`DirEntry`] with its entry.
///
/// Every entry returned takes a lookup reference (as a LOOKUP reply does)
/// unless it is "." or ".." or has node id 0; those that the kernel's
/// buffer had no room for are given back at once through
/// [`AsyncFilesystem::forget`](crate::layers::asyncfs::AsyncFilesystem::forget),
/// so count one per returned entry and let FORGET undo it.
#[derive(Clone, Debug)]
pub struct DirEntryPlus {
    /// The entry (node, attributes, TTLs).
    pub entry: Entry,
    /// Its cookie, as for [`DirEntry::offset`].
    pub offset: u64,
    /// Its name.
    pub name: Vec<u8>,
}

/// What an IOCTL answers.
#[derive(Debug)]
pub enum Ioctl {
    /// The ioctl's result and output data.
    Done {
        /// Its return value.
        result: i32,
        /// Its output (at most the `out_size` asked).
        data: Data,
    },
    /// Ask the kernel to retry an unrestricted ioctl with these iovecs.
    Retry {
        /// Input iovecs.
        in_iovs: Vec<fuse_proto::abi::IoctlIovec>,
        /// Output iovecs.
        out_iovs: Vec<fuse_proto::abi::IoctlIovec>,
    },
}
