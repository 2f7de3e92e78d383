//! The request plumbing the node layer ([`crate::node`]) and the path layer
//! ([`crate::path`]) share on top of their inode table and open-file table:
//! refusing names that could step out of a directory; finding a node id or
//! file handle the kernel sent (`ESTALE`, `EBADF` with a log line when it
//! is not held); answering GETXATTR and LISTXATTR by size; attaching an
//! open to its node's I/O mode and answering OPEN and CREATE with or
//! without a backing file; the "." and ".." entries of a listing; and the
//! session's notifier, kept for the layers' invalidators.
//!
//! It knows neither layer: the layers hand it their tables and values.

use crate::backing::BackingFile;
use crate::context::RequestContext;
use crate::inodes::{HandleTable, InodeTable, OpenModes};
use crate::notify::{Notifier, NotifyError};
use crate::reply::{DirAdd, ReplyCreate, ReplyDirectory, ReplyOpen, ReplyXattr};
use crate::types::{Entry, FileHandle, Inode};
use crate::{FileKind, FopenFlags};
use fuse_proto::Errno;
use std::ffi::CStr;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Locks `m`, also after a panic while it was held (the layers' state
/// stays consistent between statements, and a panicking handler must not
/// take the session down with it).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The value of node id `ino`, or `ESTALE` for a node the kernel was not
/// given or has forgotten.
pub(crate) fn held<K: Hash + Eq + Clone, V: Clone>(table: &InodeTable<K, V>, ino: Inode) -> Result<V, Errno> {
    table.get(ino).ok_or_else(|| {
        log::warn!("request for node {ino}, which the kernel was not given or forgot");
        Errno::ESTALE
    })
}

/// The open file `fh`, or `EBADF` for a handle that is not open.
pub(crate) fn open_file<T: Clone>(files: &HandleTable<T>, fh: FileHandle) -> Result<T, Errno> {
    files.get(fh.0).ok_or_else(|| {
        log::warn!("request for file handle {fh}, which is not open");
        Errno::EBADF
    })
}

/// An open file as OPEN, OPENDIR, CREATE and TMPFILE answer it: the
/// handle the kernel passes back in later requests, the flags that tell it
/// how to treat the file, and the backing file of a passthrough open. The
/// node and path layers answer with it, and an
/// [`AsyncFilesystem`](crate::asyncfs::AsyncFilesystem) returns it.
#[derive(Debug)]
pub struct Open {
    /// The handle.
    pub fh: FileHandle,
    /// `DIRECT_IO`, `KEEP_CACHE`, …
    pub flags: FopenFlags,
    /// The backing file the kernel is to pass through to, if any (keep a
    /// clone until RELEASE; see [`ReplyOpen::passthrough`]).
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

/// Attaches a new open of a node (whose I/O mode is `io`) offering
/// `backing`: the flags to answer with (without those a passthrough open
/// cannot carry) and the backing file it gets, if any.
pub(crate) fn attach_open(
    io: &Mutex<OpenModes>,
    mut flags: FopenFlags,
    backing: Option<BackingFile>,
) -> (FopenFlags, Option<BackingFile>) {
    let backing = lock(io).attach(backing);
    if backing.is_some() {
        flags &= FopenFlags::PASSTHROUGH_MASK;
    }
    (flags, backing)
}

/// Answers OPEN or OPENDIR with an open file, or the error.
pub(crate) fn reply_open(reply: ReplyOpen, r: Result<Open, Errno>) {
    match r {
        Ok(Open {
            fh,
            flags,
            backing: Some(b),
        }) => reply.passthrough(fh, flags, &b),
        Ok(Open {
            fh,
            flags,
            backing: None,
        }) => reply.opened(fh, flags),
        Err(e) => reply.error(e),
    }
}

/// Answers CREATE, TMPFILE or atomic open with the entry and its open
/// file (`created`: this call made the file), or the error.
pub(crate) fn reply_create(reply: ReplyCreate, r: Result<(Entry, Open), Errno>, created: bool) {
    match r {
        Ok((
            entry,
            Open {
                fh,
                flags,
                backing: Some(b),
            },
        )) => reply.passthrough(&entry, fh, flags, &b, created),
        Ok((
            entry,
            Open {
                fh,
                flags,
                backing: None,
            },
        )) if created => reply.created(&entry, fh, flags),
        Ok((
            entry,
            Open {
                fh,
                flags,
                backing: None,
            },
        )) => reply.opened(&entry, fh, flags),
        Err(e) => reply.error(e),
    }
}

/// Answers GETXATTR or LISTXATTR with `value` as the kernel asks: its
/// length when `size` is 0, `ERANGE` when it does not fit, else the bytes.
pub(crate) fn reply_xattr<V: AsRef<[u8]>>(reply: ReplyXattr, size: u32, value: Result<V, Errno>) {
    match value {
        Err(e) => reply.error(e),
        Ok(v) if size == 0 => match u32::try_from(v.as_ref().len()) {
            Ok(n) => reply.size(n),
            Err(_) => reply.error(Errno::E2BIG),
        },
        Ok(v) if v.as_ref().len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(v.as_ref()),
    }
}

/// A name a request may carry for an entry of a directory: not empty, not
/// "." or "..", without '/'. The kernel never sends others; a layer
/// refuses them (`EINVAL`) before a filesystem sees them, so that a name
/// can never step out of its directory (a path layer joins names).
pub(crate) fn check_name(name: &CStr) -> Result<(), Errno> {
    match name.to_bytes() {
        b"" | b"." | b".." => Err(Errno::EINVAL),
        n if n.contains(&b'/') => Err(Errno::EINVAL),
        _ => Ok(()),
    }
}

/// Adds the "." and ".." entries of a READDIR from `offset` (their cookies
/// are 1 and 2; both lead to `ino`): [`DirAdd::Full`] if the reply filled
/// up (stop there), else [`DirAdd::Added`].
pub(crate) fn add_dots(reply: &mut ReplyDirectory, ino: Inode, offset: u64) -> DirAdd {
    for (i, name) in [".", ".."].into_iter().enumerate().skip(offset as usize) {
        if reply.add(ino, i as u64 + 1, FileKind::Directory, name).is_full() {
            return DirAdd::Full;
        }
    }
    DirAdd::Added
}

/// The session's notifier, kept from the first request that brings it
/// (the invalidators need it and are made before the session runs).
#[derive(Default)]
pub(crate) struct NotifierSlot(OnceLock<Notifier>);

impl NotifierSlot {
    /// Keeps the notifier of the session serving `ctx`, once.
    pub(crate) fn remember(&self, ctx: &RequestContext<'_>) {
        if self.0.get().is_none() {
            let _ = self.0.set(ctx.notifier().clone());
        }
    }

    fn get(&self) -> Result<&Notifier, NotifyError> {
        self.0.get().ok_or(NotifyError::NotReady)
    }

    /// Drops the cached attributes and content of `ino` (nothing to drop
    /// for `None`, a node the kernel does not hold).
    pub(crate) fn inval_content(&self, ino: Option<Inode>) -> Result<(), NotifyError> {
        match ino {
            Some(ino) => self.get()?.inval_inode(ino, 0, 0).map(drop),
            None => Ok(()),
        }
    }

    /// Drops the cached name `name` in directory `dir` (nothing to drop
    /// for `None`).
    pub(crate) fn inval_entry(&self, dir: Option<Inode>, name: &[u8]) -> Result<(), NotifyError> {
        match dir {
            Some(ino) => self.get()?.inval_entry(ino, name, false).map(drop),
            None => Ok(()),
        }
    }
}
