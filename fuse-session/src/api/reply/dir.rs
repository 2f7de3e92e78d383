//! The directory listings, READDIR and READDIRPLUS: entries added to one
//! buffer until it is full, and what adding one did.

use super::{Fail, ReplyCore, errno_of};
use crate::attr::FileKind;
use crate::types::{Entry, Inode};
use fuse_proto::abi::EntryOut;
use fuse_proto::reply::{DirentError, DirentWriter};
use fuse_proto::{Errno, Opcode, Reply};

/// Largest directory reply buffer: the kernel's largest request (256 pages).
const MAX_DIR_REPLY: usize = 256 * 4096;

/// The buffer and handle both directory replies share.
struct DirBuf {
    core: ReplyCore,
    buf: Vec<u8>,
    len: usize,
}

impl DirBuf {
    fn new(core: ReplyCore, size: u32) -> Self {
        // The kernel asks for a page or a few; never let a malformed request
        // make us allocate more than the largest reply it could accept.
        let size = (size as usize).min(MAX_DIR_REPLY);
        Self {
            core,
            buf: vec![0; size],
            len: 0,
        }
    }

    /// Adds one record with `add`.
    fn push(
        &mut self,
        what: &str,
        name: &[u8],
        add: impl FnOnce(&mut DirentWriter<'_>) -> Result<(), DirentError>,
    ) -> DirAdd {
        let mut w = DirentWriter::new(&mut self.buf[self.len..]);
        match add(&mut w) {
            Ok(()) => {
                self.len += w.len();
                DirAdd::Added
            }
            Err(DirentError::Full) => DirAdd::Full,
            Err(DirentError::InvalidName) => {
                log::warn!(
                    "{what}: skipping invalid name {:?}",
                    String::from_utf8_lossy(name)
                );
                DirAdd::Skipped
            }
        }
    }

    fn ok(self) {
        let Self { core, buf, len } = self;
        match Reply::data(core.unique, &buf[..len]) {
            Ok(r) => core.send(&r),
            Err(_) => core.error(Errno::EIO),
        }
    }
}

/// What adding a directory entry did: the answer of
/// [`ReplyDirectory::add`], and of the node and path layers'
/// [`DirFill::add`](crate::node::DirFill::add) and
/// [`PathDirFill::add`](crate::path::PathDirFill::add). Stop adding at
/// `Full`; ignoring the answer warns.
///
/// (fuser's `ReplyDirectory::add` returns a `bool` that is `true` when
/// full; code ported from it tests [`DirAdd::is_full`].)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "stop adding entries once the reply is full"]
pub enum DirAdd {
    /// The entry is in the reply.
    Added,
    /// It did not fit and is not in the reply: stop and send what there is
    /// (the kernel asks again from this entry's offset).
    Full,
    /// Its name is one the kernel would reject (empty, over 1024 bytes,
    /// with `/` or NUL): logged and left out. Go on with the next.
    Skipped,
}

impl DirAdd {
    /// Whether the reply is full.
    pub fn is_full(self) -> bool {
        self == DirAdd::Full
    }
}

/// What [`ReplyDirectoryPlus::add`] did with an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "count the lookup of an added entry, and stop once the reply is full"]
pub enum DirPlusAdd {
    /// The entry is in the reply. With `lookup: true` the kernel takes a
    /// lookup reference on its node (count it, FORGET will return it);
    /// `false` for "." and ".." and an entry with node id 0.
    Added {
        /// Whether a lookup reference was taken.
        lookup: bool,
    },
    /// It did not fit and is not in the reply (no reference taken): stop
    /// and send what there is.
    Full,
    /// Its name is one the kernel would reject: logged and left out, no
    /// reference taken. Go on with the next.
    Skipped,
}

impl DirPlusAdd {
    /// Whether the reply is full.
    pub fn is_full(self) -> bool {
        self == DirPlusAdd::Full
    }

    /// Whether the kernel took a lookup reference.
    pub fn counts_lookup(self) -> bool {
        self == DirPlusAdd::Added { lookup: true }
    }
}

/// Reply to READDIR: add entries until [`ReplyDirectory::add`] says the
/// buffer is full, then call [`ReplyDirectory::ok`].
///
/// Each entry is added with an `offset`, its cookie: the value the kernel
/// passes back as READDIR's `offset` when it continues the listing after
/// that entry (after a full reply, or a program's `seekdir`). READDIR's
/// `offset` 0 asks for the listing from the start, so no cookie is 0.
/// Below, an entry's cookie is its position plus one, so continuing
/// after the entry at position `i` skips `i + 1` entries.
///
/// ```no_run
/// use fuse_session::reply::ReplyDirectory;
/// use fuse_session::{FileKind, Inode};
///
/// fn list(offset: u64, mut reply: ReplyDirectory) {
///     let entries = [
///         (Inode::ROOT, FileKind::Directory, "."),
///         (Inode::ROOT, FileKind::Directory, ".."),
///         (Inode(2), FileKind::RegularFile, "hello"),
///     ];
///     // `offset` is the cookie of the last entry the kernel got (0: none).
///     for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
///         if reply.add(*ino, i as u64 + 1, *kind, name).is_full() {
///             break;
///         }
///     }
///     reply.ok();
/// }
/// ```
#[must_use = "a request must be answered; dropping the handle answers EIO"]
pub struct ReplyDirectory(DirBuf);

/// Reply to READDIRPLUS: like [`ReplyDirectory`], with an entry per name.
#[must_use = "a request must be answered; dropping the handle answers EIO"]
pub struct ReplyDirectoryPlus(DirBuf);

impl ReplyDirectory {
    pub(crate) fn new(core: ReplyCore, size: u32) -> Self {
        Self(DirBuf::new(core, size))
    }

    /// Adds an entry: node `ino` (its `d_ino`), `offset` its cookie (the
    /// READDIR `offset` that continues the listing after it; never 0), its
    /// kind and name. Stop at [`DirAdd::Full`] and call
    /// [`ReplyDirectory::ok`].
    pub fn add(&mut self, ino: Inode, offset: u64, kind: FileKind, name: impl AsRef<[u8]>) -> DirAdd {
        self.add_raw(ino.0, offset, kind.dirent_type(), name.as_ref())
    }

    /// [`ReplyDirectory::add`] with a raw `d_type` (`S_IFMT` bits `>> 12`).
    pub fn add_raw(&mut self, ino: u64, offset: u64, typ: u32, name: &[u8]) -> DirAdd {
        self.0.push("readdir", name, |w| w.add(ino, offset, typ, name))
    }
}

impl ReplyDirectoryPlus {
    pub(crate) fn new(core: ReplyCore, size: u32) -> Self {
        Self(DirBuf::new(core, size))
    }

    /// Adds an entry with its attributes; `offset` is its cookie, as for
    /// [`ReplyDirectory::add`]. See [`DirPlusAdd`] for when the kernel
    /// counts a lookup.
    pub fn add(&mut self, entry: &Entry, offset: u64, name: impl AsRef<[u8]>) -> DirPlusAdd {
        self.add_raw(&entry.to_out(), offset, name.as_ref())
    }

    /// [`ReplyDirectoryPlus::add`] with the kernel's `fuse_entry_out`.
    pub fn add_raw(&mut self, out: &EntryOut, offset: u64, name: &[u8]) -> DirPlusAdd {
        let typ = crate::types::dirent_type(out.attr.mode);
        match self
            .0
            .push("readdirplus", name, |w| w.add_plus(out, offset, typ, name))
        {
            DirAdd::Added => DirPlusAdd::Added {
                lookup: out.nodeid != 0 && name != b"." && name != b"..",
            },
            DirAdd::Full => DirPlusAdd::Full,
            DirAdd::Skipped => DirPlusAdd::Skipped,
        }
    }
}

macro_rules! dir_handle {
    ($t:ident) => {
        impl $t {
            /// Sends the entries added so far (none means end of directory).
            pub fn ok(self) {
                self.0.ok()
            }

            /// Answers with an error (an [`Errno`] or what converts to one).
            pub fn error(self, errno: impl Into<Errno>) {
                self.0.core.error(errno.into());
            }

            /// Sends the entries added so far, or the error.
            pub fn result<E: Into<Errno>>(self, r: Result<(), E>) {
                match r {
                    Ok(()) => self.ok(),
                    Err(e) => self.error(e),
                }
            }

            /// Answers with an error from an `io::Error` (EIO if it has no errno).
            pub fn io_error(self, err: &std::io::Error) {
                self.0.core.error(errno_of(err));
            }

            /// Whether the kernel asked to interrupt this request.
            pub fn is_interrupted(&self) -> bool {
                self.0.core.is_interrupted()
            }
        }

        impl Fail for $t {
            fn fail(self, errno: Errno) {
                self.0.core.error(errno)
            }
            fn request(&self) -> (Opcode, u64) {
                (self.0.core.opcode, self.0.core.unique)
            }
            fn record_panic(&self, message: String) {
                self.0.core.record_panic(message)
            }
        }
    };
}
dir_handle!(ReplyDirectory);
dir_handle!(ReplyDirectoryPlus);
