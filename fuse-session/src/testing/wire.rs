//! The bytes of the test kit's conversation: requests encoded as the
//! kernel writes them (the argument structs of [`fuse_proto::abi`], cut to
//! the size the negotiated minor uses), and replies decoded into those
//! structs for the request they answer, with the size checks the kernel
//! makes before it believes a reply (`fuse_copy_out_args`).
//!
//! Requests are checked by parsing them back with
//! [`fuse_proto::Request`]: the kit speaks only what the session's own
//! parser accepts, and reads each request's arguments from that parse.

use fuse_proto::abi::{
    AttrOut, Dirent, EntryOut, FileLock, GetxattrOut, InHeader, InitOut, LkOut, OpenOut, StatfsOut, StatxOut,
};
use fuse_proto::consts::{NAME_OFFSET, NAME_OFFSET_DIRENTPLUS};
use fuse_proto::reply::{DIRENT_NAME_MAX, dirent_size, direntplus_size};
use fuse_proto::{Opcode, Operation, version};
use std::mem::size_of;
use zerocopy::{FromBytes, IntoBytes};

/// The longest READLINK reply the kernel takes (`PAGE_SIZE - 1`).
const READLINK_MAX: usize = 4095;

/// Who sends a request: the `uid`, `gid` and `pid` of its `fuse_in_header`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Caller {
    /// The caller's filesystem uid.
    pub uid: u32,
    /// The caller's filesystem gid.
    pub gid: u32,
    /// The caller's thread id.
    pub pid: u32,
}

impl Caller {
    /// Root, as process 1.
    pub const ROOT: Caller = Caller {
        uid: 0,
        gid: 0,
        pid: 1,
    };

    /// A caller of the given identity.
    pub const fn new(uid: u32, gid: u32, pid: u32) -> Caller {
        Caller { uid, gid, pid }
    }

    /// The test process itself (its effective uid and gid and its pid), as
    /// the kernel would name it if the test made the system calls.
    pub fn current() -> Caller {
        // SAFETY: geteuid, getegid and getpid have no preconditions and cannot fail.
        let (uid, gid, pid) = unsafe { (libc::geteuid(), libc::getegid(), libc::getpid()) };
        Caller {
            uid,
            gid,
            pid: pid as u32,
        }
    }
}

/// A request: `fuse_in_header` for `caller`, then `args` one after another.
pub(crate) fn encode(unique: u64, opcode: Opcode, nodeid: u64, caller: Caller, args: &[&[u8]]) -> Vec<u8> {
    let body: usize = args.iter().map(|a| a.len()).sum();
    let header = InHeader {
        len: (size_of::<InHeader>() + body) as u32,
        opcode: opcode as u32,
        unique,
        nodeid,
        uid: caller.uid,
        gid: caller.gid,
        pid: caller.pid,
        total_extlen: 0,
        padding: 0,
    };
    let mut v = Vec::with_capacity(header.len as usize);
    v.extend_from_slice(header.as_bytes());
    for a in args {
        v.extend_from_slice(a);
    }
    v
}

/// A name as the kernel sends it: its bytes and a NUL.
pub(crate) fn name(n: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(n.len() + 1);
    v.extend_from_slice(n);
    v.push(0);
    v
}

/// One record of a READDIR reply (`fuse_dirent`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// `d_ino`: the inode number `readdir(3)` shows (not a node id).
    pub ino: u64,
    /// The cookie: where the next READDIR continues after this record.
    pub offset: u64,
    /// `d_type` (`DT_REG`, `DT_DIR`, … : the `S_IFMT` bits shifted right by 12).
    pub kind: u32,
    /// The name, without a NUL.
    pub name: Vec<u8>,
}

impl DirEntry {
    /// The name as text (lossy), for messages and comparisons.
    pub fn name_lossy(&self) -> String {
        String::from_utf8_lossy(&self.name).into_owned()
    }
}

/// One record of a READDIRPLUS reply (`fuse_direntplus`): the entry (a
/// lookup reference unless its node id is 0 or the name is `.` or `..`)
/// and the directory record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntryPlus {
    /// The `fuse_entry_out`, as a LOOKUP of the name would answer.
    pub entry: EntryOut,
    /// The directory record.
    pub dirent: DirEntry,
}

impl DirEntryPlus {
    /// Whether the kernel counts this record as a lookup (node id not 0,
    /// name neither `.` nor `..`).
    pub fn counts_lookup(&self) -> bool {
        self.entry.nodeid != 0 && !is_dot_or_dotdot(&self.dirent.name)
    }
}

/// Whether `name` is `.` or `..`.
pub(crate) fn is_dot_or_dotdot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// A GETXATTR or LISTXATTR answer: the size needed (the request asked
/// with size 0) or the value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Xattr {
    /// The size the value needs.
    Size(u32),
    /// The value (LISTXATTR: NUL-terminated names).
    Data(Vec<u8>),
}

/// The body of a success reply, decoded for the request it answers.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplyBody {
    /// No body (UNLINK, RENAME, RELEASE, FLUSH, SETXATTR, …).
    Empty,
    /// LOOKUP, MKNOD, MKDIR, SYMLINK, LINK.
    Entry(EntryOut),
    /// GETATTR, SETATTR.
    Attr(AttrOut),
    /// OPEN, OPENDIR.
    Open(OpenOut),
    /// CREATE, TMPFILE.
    Created(EntryOut, OpenOut),
    /// WRITE: the bytes written.
    Written(u32),
    /// COPY_FILE_RANGE(_64): the bytes copied.
    Copied(u64),
    /// READ, READLINK.
    Data(Vec<u8>),
    /// GETXATTR, LISTXATTR.
    Xattr(Xattr),
    /// READDIR.
    Dir(Vec<DirEntry>),
    /// READDIRPLUS.
    DirPlus(Vec<DirEntryPlus>),
    /// STATFS.
    Statfs(StatfsOut),
    /// GETLK.
    Lock(FileLock),
    /// LSEEK: the new offset; BMAP: the block.
    Offset(u64),
    /// STATX.
    Statx(Box<StatxOut>),
    /// INIT.
    Init(InitOut),
    /// Another opcode's reply, undecoded (IOCTL, POLL, …).
    Other(Vec<u8>),
}

/// Why a reply is not one the kernel would take (it answers the caller
/// `EIO` and the server's write `EINVAL`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Malformed(pub String);

fn exact(body: &[u8], want: usize, what: &str) -> Result<(), Malformed> {
    if body.len() == want {
        Ok(())
    } else {
        Err(Malformed(format!(
            "{what} of {} bytes, the kernel expects exactly {want}",
            body.len()
        )))
    }
}

fn at_most(body: &[u8], max: usize, what: &str) -> Result<(), Malformed> {
    if body.len() <= max {
        Ok(())
    } else {
        Err(Malformed(format!(
            "{what} of {} bytes, more than the {max} the request asked for",
            body.len()
        )))
    }
}

/// A struct of which the minor may use only a prefix, zero-extended.
fn prefix<T: FromBytes + IntoBytes + Default>(body: &[u8]) -> T {
    let mut t = T::default();
    let n = body.len().min(size_of::<T>());
    t.as_mut_bytes()[..n].copy_from_slice(&body[..n]);
    t
}

/// Decodes the success reply `body` to `op` at `minor`, checking its size
/// as the kernel does.
pub(crate) fn decode(op: &Operation<'_>, minor: u32, body: &[u8]) -> Result<ReplyBody, Malformed> {
    use Operation as O;
    let entry_size = version::entry_out_size(minor);
    Ok(match op {
        O::Lookup { .. } | O::Mknod { .. } | O::Mkdir { .. } | O::Symlink { .. } | O::Link { .. } => {
            exact(body, entry_size, "fuse_entry_out")?;
            ReplyBody::Entry(prefix(body))
        }
        O::Getattr { .. } | O::Setattr { .. } => {
            exact(body, version::attr_out_size(minor), "fuse_attr_out")?;
            ReplyBody::Attr(prefix(body))
        }
        O::Open { .. } | O::Opendir { .. } => {
            exact(body, size_of::<OpenOut>(), "fuse_open_out")?;
            ReplyBody::Open(prefix(body))
        }
        O::Create { .. } | O::Tmpfile { .. } | O::AtomicOpen { .. } => {
            exact(
                body,
                entry_size + size_of::<OpenOut>(),
                "fuse_entry_out + fuse_open_out",
            )?;
            ReplyBody::Created(prefix(&body[..entry_size]), prefix(&body[entry_size..]))
        }
        O::Write { arg, .. } => {
            exact(body, 8, "fuse_write_out")?;
            let size: u32 = prefix::<fuse_proto::abi::WriteOut>(body).size;
            if size > arg.size {
                return Err(Malformed(format!(
                    "fuse_write_out says {size} bytes written of the {} sent",
                    arg.size
                )));
            }
            ReplyBody::Written(size)
        }
        O::CopyFileRange { .. } => {
            exact(body, 8, "fuse_write_out")?;
            ReplyBody::Copied(u64::from(prefix::<fuse_proto::abi::WriteOut>(body).size))
        }
        O::CopyFileRange64 { .. } => {
            exact(body, 8, "fuse_copy_file_range_out")?;
            ReplyBody::Copied(prefix::<fuse_proto::abi::CopyFileRangeOut>(body).bytes_copied)
        }
        O::Read { arg } => {
            at_most(body, arg.size as usize, "READ data")?;
            ReplyBody::Data(body.to_vec())
        }
        O::Readlink => {
            at_most(body, READLINK_MAX, "READLINK target")?;
            ReplyBody::Data(body.to_vec())
        }
        O::Getxattr { arg, .. } | O::Listxattr { arg } => {
            if arg.size == 0 {
                exact(body, size_of::<GetxattrOut>(), "fuse_getxattr_out")?;
                ReplyBody::Xattr(Xattr::Size(prefix::<GetxattrOut>(body).size))
            } else {
                at_most(body, arg.size as usize, "xattr data")?;
                ReplyBody::Xattr(Xattr::Data(body.to_vec()))
            }
        }
        O::Readdir { arg } => {
            at_most(body, arg.size as usize, "READDIR records")?;
            ReplyBody::Dir(dirents(body)?)
        }
        O::Readdirplus { arg } => {
            at_most(body, arg.size as usize, "READDIRPLUS records")?;
            ReplyBody::DirPlus(direntplus(body)?)
        }
        O::Statfs => {
            exact(body, version::statfs_out_size(minor), "fuse_statfs_out")?;
            ReplyBody::Statfs(prefix(body))
        }
        O::Getlk { .. } => {
            exact(body, size_of::<LkOut>(), "fuse_lk_out")?;
            ReplyBody::Lock(prefix::<LkOut>(body).lk)
        }
        O::Lseek { .. } | O::Bmap { .. } => {
            exact(body, 8, "fuse_lseek_out")?;
            ReplyBody::Offset(prefix::<fuse_proto::abi::LseekOut>(body).offset)
        }
        O::Statx { .. } => {
            exact(body, size_of::<StatxOut>(), "fuse_statx_out")?;
            ReplyBody::Statx(Box::new(prefix(body)))
        }
        O::Init { .. } => {
            if body.len() < version::COMPAT_INIT_OUT_SIZE || body.len() > size_of::<InitOut>() {
                return Err(Malformed(format!("fuse_init_out of {} bytes", body.len())));
            }
            ReplyBody::Init(prefix(body))
        }
        O::Unlink { .. }
        | O::Rmdir { .. }
        | O::Rename { .. }
        | O::Rename2 { .. }
        | O::Release { .. }
        | O::Releasedir { .. }
        | O::Fsync { .. }
        | O::Fsyncdir { .. }
        | O::Flush { .. }
        | O::Setxattr { .. }
        | O::Removexattr { .. }
        | O::Access { .. }
        | O::Setlk { .. }
        | O::Setlkw { .. }
        | O::Fallocate { .. }
        | O::Syncfs { .. }
        | O::Destroy => {
            exact(body, 0, "a reply that has no body")?;
            ReplyBody::Empty
        }
        _ => ReplyBody::Other(body.to_vec()),
    })
}

fn dirent_at(body: &[u8], at: usize) -> Result<(Dirent, Vec<u8>, usize), Malformed> {
    let Ok((d, _)) = Dirent::read_from_prefix(&body[at..]) else {
        return Err(Malformed(format!("a directory record cut short at byte {at}")));
    };
    let namelen = d.namelen as usize;
    if namelen == 0 || namelen > DIRENT_NAME_MAX {
        return Err(Malformed(format!(
            "a directory record at byte {at} with a name of {namelen} bytes (1..={DIRENT_NAME_MAX})"
        )));
    }
    let name = body
        .get(at + NAME_OFFSET..at + NAME_OFFSET + namelen)
        .ok_or_else(|| {
            Malformed(format!(
                "the name of the directory record at byte {at} is cut short"
            ))
        })?;
    if name.contains(&b'/') || name.contains(&0) {
        return Err(Malformed(format!(
            "the directory record at byte {at} has a name with '/' or NUL"
        )));
    }
    Ok((d, name.to_vec(), dirent_size(namelen)))
}

/// The records of a READDIR reply body, read as the kernel reads them: an
/// error says where the body is not a sequence of well-formed records.
pub fn decode_dir(body: &[u8]) -> Result<Vec<DirEntry>, String> {
    dirents(body).map_err(|Malformed(m)| m)
}

/// The records of a READDIRPLUS reply body (see [`decode_dir`]).
pub fn decode_dir_plus(body: &[u8]) -> Result<Vec<DirEntryPlus>, String> {
    direntplus(body).map_err(|Malformed(m)| m)
}

/// The records of a READDIR reply.
fn dirents(body: &[u8]) -> Result<Vec<DirEntry>, Malformed> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let (d, name, size) = dirent_at(body, at)?;
        out.push(DirEntry {
            ino: d.ino,
            offset: d.off,
            kind: d.r#type,
            name,
        });
        at += size;
    }
    if at > body.len() {
        return Err(Malformed("the last directory record lacks its padding".into()));
    }
    Ok(out)
}

/// The records of a READDIRPLUS reply.
fn direntplus(body: &[u8]) -> Result<Vec<DirEntryPlus>, Malformed> {
    let mut out = Vec::new();
    let mut at = 0;
    let entry = size_of::<EntryOut>();
    while at < body.len() {
        let Ok((e, _)) = EntryOut::read_from_prefix(&body[at..]) else {
            return Err(Malformed(format!("a READDIRPLUS record cut short at byte {at}")));
        };
        let (d, name, _) = dirent_at(body, at + entry)?;
        out.push(DirEntryPlus {
            entry: e,
            dirent: DirEntry {
                ino: d.ino,
                offset: d.off,
                kind: d.r#type,
                name,
            },
        });
        at += direntplus_size(out.last().map_or(0, |p| p.dirent.name.len()));
    }
    if at > body.len() {
        return Err(Malformed("the last READDIRPLUS record lacks its padding".into()));
    }
    debug_assert_eq!(NAME_OFFSET_DIRENTPLUS, entry + NAME_OFFSET);
    Ok(out)
}
