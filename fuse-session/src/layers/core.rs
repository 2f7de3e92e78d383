//! The adapter core the layers share ([`crate::node`], [`crate::path`],
//! [`crate::asyncfs`]): turning the values a filesystem answers with
//! ([`crate::layers::values`]) into replies ([`Answer`], one implementation
//! per kind of answer: OPEN and CREATE with or without a backing file,
//! READDIR entries as many as fit, GETXATTR and LISTXATTR by size…);
//! refusing names that could step out of a directory; finding a node id or
//! file handle the kernel sent (`ESTALE`, `EBADF` with a log line when it
//! is not held) and answering a request on an open file; attaching an open
//! to its node's I/O mode; the "." and ".." entries of a listing; the
//! builders of an open file's flags; and the session's notifier, kept for
//! the layers' invalidators.
//!
//! It knows none of the layers: they hand it their tables and values.

use crate::attr::{FileAttr, FileKind, Statfs};
use crate::backing::BackingFile;
use crate::context::RequestContext;
use crate::inodes::{HandleTable, InodeTable, OpenModes};
use crate::layers::values::{Created, DirEntry, Ioctl, Open};
use crate::notify::{Notifier, NotifyError};
use crate::reply::*;
use crate::types::{Entry, FileHandle, Inode, Lock};
use fuse_proto::abi::Statx;
use fuse_proto::flags::FopenFlags;
use fuse_proto::{Errno, Opcode};
use std::ffi::CStr;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

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

/// A reply handle answered with a value or an error: how the layers and
/// the async adapter turn what a filesystem returned into the reply, in one
/// place for each kind of answer.
pub(crate) trait Answer<V>: Fail {
    /// Answers with `r`.
    fn answer(self, r: Result<V, Errno>);
}

macro_rules! answer_with_result {
    ($($reply:ty => $v:ty),* $(,)?) => {
        $(impl Answer<$v> for $reply {
            fn answer(self, r: Result<$v, Errno>) {
                self.result(r)
            }
        })*
    };
}

answer_with_result!(
    ReplyEmpty => (),
    ReplyEntry => Entry,
    ReplyAttr => (Duration, FileAttr),
    ReplyWrite => u32,
    ReplyLseek => u64,
    ReplyCopy => u64,
    ReplyLock => Lock,
    ReplyStatfs => Statfs,
);

impl<D: AsRef<[u8]>> Answer<D> for ReplyData {
    fn answer(self, r: Result<D, Errno>) {
        self.result(r)
    }
}

impl Answer<u64> for ReplyBmap {
    fn answer(self, r: Result<u64, Errno>) {
        match r {
            Ok(b) => self.block(b),
            Err(e) => self.error(e),
        }
    }
}

impl Answer<u32> for ReplyPoll {
    fn answer(self, r: Result<u32, Errno>) {
        match r {
            Ok(ev) => self.revents(ev),
            Err(e) => self.error(e),
        }
    }
}

impl Answer<(Duration, Statx)> for ReplyStatx {
    fn answer(self, r: Result<(Duration, Statx), Errno>) {
        match r {
            Ok((ttl, st)) => self.statx(ttl, &st),
            Err(e) => self.error(e),
        }
    }
}

impl Answer<Ioctl> for ReplyIoctl {
    fn answer(self, r: Result<Ioctl, Errno>) {
        match r {
            Ok(Ioctl::Done { result, data }) => self.ioctl(result, data.as_ref()),
            Ok(Ioctl::Retry { in_iovs, out_iovs }) => self.retry(&in_iovs, &out_iovs),
            Err(e) => self.error(e),
        }
    }
}

/// OPEN and OPENDIR, with or without a backing file.
impl Answer<Open> for ReplyOpen {
    fn answer(self, r: Result<Open, Errno>) {
        match r {
            Ok(Open {
                fh,
                flags,
                backing: Some(b),
            }) => self.passthrough(fh, flags, &b),
            Ok(Open {
                fh,
                flags,
                backing: None,
            }) => self.opened(fh, flags),
            Err(e) => self.error(e),
        }
    }
}

/// CREATE, TMPFILE and atomic open: the entry and its open file.
impl Answer<Created> for ReplyCreate {
    fn answer(self, r: Result<Created, Errno>) {
        let Created { entry, open, created } = match r {
            Ok(c) => c,
            Err(e) => return self.error(e),
        };
        match open.backing {
            Some(b) => self.passthrough(&entry, open.fh, open.flags, &b, created),
            None if created => self.created(&entry, open.fh, open.flags),
            None => self.opened(&entry, open.fh, open.flags),
        }
    }
}

/// READDIR: as many entries as fit.
impl Answer<Vec<DirEntry>> for ReplyDirectory {
    fn answer(mut self, r: Result<Vec<DirEntry>, Errno>) {
        match r {
            Ok(entries) => {
                for e in &entries {
                    if self.add(e.ino, e.offset, e.kind, &e.name).is_full() {
                        break;
                    }
                }
                self.ok()
            }
            Err(e) => self.error(e),
        }
    }
}

/// A GETXATTR or LISTXATTR reply and the size the kernel asked for: it
/// answers the value's length when `size` is 0, `ERANGE` when the value
/// does not fit, else the bytes.
pub(crate) struct SizedXattr(pub(crate) ReplyXattr, pub(crate) u32);

impl Fail for SizedXattr {
    fn fail(self, errno: Errno) {
        self.0.fail(errno)
    }
    fn request(&self) -> (Opcode, u64) {
        self.0.request()
    }
    fn record_panic(&self, message: String) {
        self.0.record_panic(message)
    }
}

impl<V: AsRef<[u8]>> Answer<V> for SizedXattr {
    fn answer(self, value: Result<V, Errno>) {
        let SizedXattr(reply, size) = self;
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
}

/// A LISTXATTR answer as the caller may see it: `trusted.*` names go unless
/// the caller holds `CAP_SYS_ADMIN`. The kernel checks that capability
/// for getting and setting a trusted attribute, but passes a list on
/// unfiltered (a filesystem hides those names itself, as ext4 and tmpfs
/// do), and a daemon that lists as root sees them all. `caller` is asked
/// only when the list holds such a name.
pub(crate) fn hide_trusted<V: AsRef<[u8]> + From<Vec<u8>>>(caller: impl FnOnce() -> bool, list: V) -> V {
    const TRUSTED: &[u8] = b"trusted.";
    let bytes = list.as_ref();
    let names = || bytes.split_inclusive(|&b| b == 0);
    if !names().any(|n| n.starts_with(TRUSTED)) || caller() {
        return list;
    }
    V::from(
        names()
            .filter(|n| !n.starts_with(TRUSTED))
            .flatten()
            .copied()
            .collect::<Vec<u8>>(),
    )
}

/// Answers a request on the open file `fh` of `files` with what `op`
/// returns for it (`EBADF` for a handle that is not open).
pub(crate) fn on_open_file<T: Clone, V>(
    files: &HandleTable<T>,
    fh: FileHandle,
    reply: impl Answer<V>,
    op: impl FnOnce(T) -> Result<V, Errno>,
) {
    reply.answer(open_file(files, fh).and_then(op))
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
/// The largest listing cookie a layer's `readdir` may give an entry: the
/// layers send a filesystem's cookie `c` as `c + 2` on the wire (1 and 2
/// are "." and ".."), so cookies above this one have no wire value.
pub const MAX_COOKIE: u64 = u64::MAX - 2;

/// The wire cookie of a layer filesystem's cookie `next`, or `None` (logged)
/// when it is 0 or above [`MAX_COOKIE`]: such an entry is left out rather
/// than sent with a cookie another entry has.
pub(crate) fn wire_cookie(next: u64, name: &[u8]) -> Option<u64> {
    match next {
        1..=MAX_COOKIE => Some(next + 2),
        _ => {
            log::error!(
                "readdir: leaving out {:?}, whose cookie {next} is not in 1..={MAX_COOKIE}",
                String::from_utf8_lossy(name)
            );
            None
        }
    }
}

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

/// The builder methods of an open file a layer's filesystem returns (the
/// node layer's `Opened`, the path layer's `PathOpened`): a type with public
/// `flags: FopenFlags` and `backing: Option<BackingFile>`.
macro_rules! open_builders {
    () => {
        /// Have the kernel send FLUSH at every `close(2)` of this file, for
        /// a flush that reports errors at close (data written back to a
        /// server) or drops the closing owner's locks. Without it, a close
        /// costs no round trip.
        pub fn with_flush(mut self) -> Self {
            self.flags.remove(FopenFlags::NOFLUSH);
            self
        }

        /// With `flags` added.
        pub fn with_flags(mut self, flags: FopenFlags) -> Self {
            self.flags |= flags;
            self
        }

        /// In passthrough mode on `backing`: the file's READ and WRITE then
        /// never reach the filesystem (the layer must be set up for
        /// passthrough).
        pub fn passthrough(mut self, backing: BackingFile) -> Self {
            self.backing = Some(backing);
            self
        }
    };
}
pub(crate) use open_builders;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trusted_names_are_hidden_from_a_caller_without_the_capability() {
        let list = b"user.a\0trusted.t\0security.s\0trusted.\0".to_vec();
        assert_eq!(hide_trusted(|| false, list.clone()), b"user.a\0security.s\0");
        assert_eq!(hide_trusted(|| true, list.clone()), list);
        let plain = b"user.a\0".to_vec();
        assert_eq!(hide_trusted(|| panic!("not asked"), plain.clone()), plain);
    }
}
