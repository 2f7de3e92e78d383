//! Typed values that cross the [`crate::Filesystem`] boundary: inode numbers,
//! file handles, lock owners, entries, locks and poll handles (attributes
//! are in [`crate::attr`], grouped request arguments in [`crate::ops`]).

use crate::attr::FileAttr;
use fuse_proto::abi::{Attr, EntryOut, FileLock};
use std::time::Duration;

macro_rules! newtype {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u64);

        impl From<u64> for $name {
            fn from(v: u64) -> Self {
                Self(v)
            }
        }

        impl From<$name> for u64 {
            fn from(v: $name) -> u64 {
                v.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

newtype!(
    /// A FUSE node id (`nodeid` in the kernel's messages). [`Inode::ROOT`] is 1.
    Inode
);
newtype!(
    /// A file handle the filesystem chose in its OPEN/OPENDIR/CREATE reply.
    FileHandle
);
newtype!(
    /// An opaque lock owner the kernel attaches to locks, flushes and releases.
    LockOwner
);

impl Inode {
    /// The root directory (`FUSE_ROOT_ID`).
    pub const ROOT: Inode = Inode(fuse_proto::consts::ROOT_ID);
}

/// A directory entry to return from LOOKUP, MKDIR, CREATE, …
///
/// The reply gives the kernel a lookup reference on `ino` (see
/// [`crate::filesystem`]). While `entry_ttl` runs the kernel resolves the
/// name from its cache without LOOKUP; while `attr_ttl` runs it answers
/// `stat` without GETATTR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// The node id the kernel will use for this entry (0: negative entry).
    pub ino: Inode,
    /// Generation: (ino, generation) must be unique over the filesystem's life.
    pub generation: u64,
    /// The attributes.
    pub attr: FileAttr,
    /// How long the kernel may cache the name.
    pub entry_ttl: Duration,
    /// How long the kernel may cache the attributes.
    pub attr_ttl: Duration,
}

impl Entry {
    /// Node `ino` with `attr`, generation 0, name and attributes cacheable
    /// for `ttl`.
    pub fn new(ino: Inode, attr: FileAttr, ttl: Duration) -> Entry {
        Entry {
            ino,
            generation: 0,
            attr,
            entry_ttl: ttl,
            attr_ttl: ttl,
        }
    }

    /// The wire form, `fuse_entry_out`.
    pub fn to_out(&self) -> EntryOut {
        EntryOut {
            nodeid: self.ino.0,
            generation: self.generation,
            entry_valid: self.entry_ttl.as_secs(),
            attr_valid: self.attr_ttl.as_secs(),
            entry_valid_nsec: self.entry_ttl.subsec_nanos(),
            attr_valid_nsec: self.attr_ttl.subsec_nanos(),
            attr: self.attr.to_abi(),
        }
    }
}

/// Attributes from a `stat` result, in the kernel's layout (the typed form
/// is [`FileAttr::from_stat`]).
pub fn attr_from_stat(st: &libc::stat) -> Attr {
    Attr {
        ino: st.st_ino,
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: st.st_atime as u64,
        mtime: st.st_mtime as u64,
        ctime: st.st_ctime as u64,
        atimensec: st.st_atime_nsec as u32,
        mtimensec: st.st_mtime_nsec as u32,
        ctimensec: st.st_ctime_nsec as u32,
        mode: st.st_mode,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

/// The `d_type` of a directory record from a file mode (`S_IFMT >> 12`).
pub const fn dirent_type(mode: u32) -> u32 {
    (mode & libc::S_IFMT) >> 12
}

/// A byte-range lock as GETLK/SETLK carry it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lock {
    /// First byte.
    pub start: u64,
    /// Last byte (inclusive; `u64::MAX`/`OFFSET_MAX` for "to the end").
    pub end: u64,
    /// `F_RDLCK`, `F_WRLCK` or `F_UNLCK`.
    pub typ: i32,
    /// The owning process (0 when unknown).
    pub pid: u32,
}

impl From<FileLock> for Lock {
    fn from(l: FileLock) -> Self {
        Lock {
            start: l.start,
            end: l.end,
            typ: l.r#type as i32,
            pid: l.pid,
        }
    }
}

impl From<Lock> for FileLock {
    fn from(l: Lock) -> Self {
        FileLock {
            start: l.start,
            end: l.end,
            r#type: l.typ as u32,
            pid: l.pid,
        }
    }
}

/// A kernel poll handle: pass it to [`crate::Notifier::poll_wakeup`] when the
/// file becomes ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PollHandle(pub u64);
