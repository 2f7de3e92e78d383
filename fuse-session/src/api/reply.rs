//! Typed reply handles: each request is answered exactly once.
//!
//! A handle is `Send`, so a handler may answer later from any thread. It
//! remembers the channel the request came on and its slot in the in-flight
//! registry; answering encodes the reply (fuse-proto, no payload copy),
//! writes it with one `writev`, updates the worker's statistics and frees the
//! slot. A handle dropped without an answer sends `EIO` and logs it.
//!
//! Every handle answers an error with `error` (an [`Errno`], or anything
//! that converts to one, such as `std::io::Error`), and has a `result`
//! method taking a `Result` of its success value, so that a handler can
//! compute the answer with `?` in a function of its own:
//!
//! ```
//! use fuse_session::reply::ReplyAttr;
//! use fuse_session::{Errno, FileAttr, FileKind, Inode};
//! use std::time::Duration;
//!
//! fn attr_of(ino: Inode) -> Result<FileAttr, Errno> {
//!     match ino {
//!         Inode::ROOT => Ok(FileAttr::fixed(1, FileKind::Directory, 0o755)),
//!         _ => Err(Errno::ENOENT),
//!     }
//! }
//!
//! fn getattr(ino: Inode, reply: ReplyAttr) {
//!     reply.result(attr_of(ino).map(|a| (Duration::from_secs(1), a)));
//! }
//! ```

mod data;
mod dir;
mod file;
mod meta;
mod open;

pub use dir::{DirAdd, DirPlusAdd, ReplyDirectory, ReplyDirectoryPlus};

use crate::backing::BackingFile;
use crate::conn::WorkerCore;
use crate::interrupt::Slot;
use crate::splice::Pipes;
use crate::types::Inode;
use fuse_proto::flags::FopenFlags;
use fuse_proto::{Errno, Opcode, Reply};
use std::sync::Arc;

impl ReplyCore {
    /// Records a panic of the code answering this request among the
    /// session's handler panics.
    pub(crate) fn record_panic(&self, message: String) {
        self.worker.record_panic(self.opcode, self.unique, message);
    }
}

/// What every handle holds.
pub(crate) struct ReplyCore {
    unique: u64,
    opcode: Opcode,
    worker: Arc<WorkerCore>,
    slot: Slot,
    atomic_open: bool,
    /// An OPEN, CREATE or TMPFILE with `O_DIRECT`: its answer gets the
    /// session's `O_DIRECT` flags ([`ReplyCore::open_flags`]).
    o_direct: bool,
    /// The error to send instead of ENOSYS (the default CREATE).
    enosys_as: Option<Errno>,
    /// The node whose cached attributes the kernel must drop before a
    /// success answer (see [`ReplyCore::set_mode_stale`]).
    mode_stale: Option<u64>,
    /// The request's journal slot, under a keeper ([`crate::journal`]).
    journal: Option<usize>,
    done: bool,
}

impl ReplyCore {
    pub(crate) fn new(unique: u64, opcode: Opcode, worker: Arc<WorkerCore>, slot: Slot) -> Self {
        Self {
            unique,
            opcode,
            worker,
            slot,
            atomic_open: false,
            o_direct: false,
            enosys_as: None,
            mode_stale: None,
            journal: None,
            done: false,
        }
    }

    /// Marks the request as the out-of-tree atomic open (its reply may carry
    /// `FOPEN_FILE_CREATED`).
    pub(crate) fn set_atomic_open(&mut self) {
        self.atomic_open = true;
    }

    /// Marks an open whose caller asked for `O_DIRECT` (see
    /// [`crate::SessionConfig::o_direct_parallel_writes`]).
    pub(crate) fn set_o_direct(&mut self, direct: bool) {
        self.o_direct = direct;
    }

    /// The open flags to answer with: the filesystem's, plus the session's
    /// `O_DIRECT` flags for an `O_DIRECT` open served here (a passed-through
    /// file's reads and writes go to its backing file, which sees the
    /// caller's `O_DIRECT` itself; `DIRECT_IO` would bring them back here).
    fn open_flags(&self, flags: FopenFlags, backing: Option<&BackingFile>) -> FopenFlags {
        if self.o_direct && backing.is_none() && !flags.contains(FopenFlags::PASSTHROUGH) {
            flags | self.worker.shared.o_direct
        } else {
            flags
        }
    }

    /// The request asked the filesystem to clear set-ID bits of `nodeid`
    /// and its answer carries no attributes: the kernel would keep the mode
    /// it cached (a `stat` of the mode alone, and an exec, would still see
    /// set-user-ID on content an unprivileged caller changed). So a success
    /// answer first drops the kernel's cached attributes of the node
    /// (`NOTIFY_INVAL_INODE`, attributes only, which takes no lock the
    /// request may hold). Only such requests pay for it, and the kernel
    /// sends them only while it believes the file has the bits.
    pub(crate) fn set_mode_stale(&mut self, nodeid: u64) {
        self.mode_stale = Some(nodeid);
    }

    /// The request has journal slot `i`: its answer is recorded there
    /// before it is written, and the slot freed after.
    pub(crate) fn set_journal(&mut self, i: usize) {
        self.journal = Some(i);
    }

    fn minor(&self) -> u32 {
        self.worker.minor()
    }

    pub(crate) fn worker(&self) -> Arc<WorkerCore> {
        self.worker.clone()
    }

    /// The request's unique, as read.
    pub(crate) fn unique(&self) -> u64 {
        self.unique
    }

    /// Answers with a message built by the caller (the session's own
    /// answers, such as INIT).
    pub(crate) fn send_raw(self, msg: &Reply<'_>) {
        self.send(msg)
    }

    fn send(mut self, msg: &Reply<'_>) {
        self.finish(msg);
    }

    fn finish(&mut self, msg: &Reply<'_>) {
        self.done = true;
        let is_error = msg.header().error != 0;
        if let Some(nodeid) = self.mode_stale.take()
            && !is_error
        {
            self.drop_cached_attrs(nodeid);
        }
        self.worker.finished(self.opcode, is_error);
        let journal = self.journal.zip(self.worker.shared.journal.as_deref());
        if let Some((i, j)) = journal {
            let resent = self.unique & fuse_proto::consts::UNIQUE_RESEND != 0;
            crate::fault::point(self.opcode, crate::fault::Point::Effect, resent);
            j.answer(i, msg);
            crate::fault::point(self.opcode, crate::fault::Point::Reply, resent);
        }
        self.worker.send_reply(self.opcode, self.unique, msg);
        if let Some((i, j)) = journal {
            j.finish(i);
        }
        self.worker.release(&self.slot);
    }

    /// Answers with a success reply of `total` bytes (header included)
    /// staged in `pipes`' message pipe, counted and released like any other
    /// reply. If the channel took none of it (the pipe still holds it all),
    /// the pipes are drained and `resend` writes the answer instead; it is
    /// counted already, so `resend` only writes.
    fn finish_spliced(&mut self, pipes: &Pipes, total: usize, resend: impl FnOnce(&WorkerCore, u64)) {
        self.done = true;
        self.worker.finished(self.opcode, false);
        if let Err(e) = self.worker.channel().send_spliced(pipes.message(), total) {
            let untouched = pipes.message_len() == total;
            pipes.drain();
            if untouched && e.raw_os_error() != Some(libc::ENOENT) {
                // The sink took none of it: not a failed reply yet.
                log::debug!(
                    "{} reply to {}: splice refused ({e}); writing it",
                    self.opcode,
                    self.unique
                );
                resend(&self.worker, self.unique);
            } else {
                crate::transport::send_failed(&**self.worker.channel(), self.opcode, self.unique, &e);
            }
        }
        self.worker.release(&self.slot);
    }

    fn drop_cached_attrs(&self, nodeid: u64) {
        match self
            .worker
            .notifier()
            .inval_inode(Inode(nodeid), -1, 0)
            .and_then(|t| t.wait())
        {
            Ok(()) => {}
            Err(crate::notify::NotifyError::Kernel(e)) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => log::warn!(
                "{} {}: dropping the kernel's cached attributes of node {nodeid} after set-ID bits were cleared: {e}",
                self.opcode,
                self.unique
            ),
        }
    }

    fn error(mut self, errno: Errno) {
        let errno = match self.enosys_as {
            Some(e) if errno == Errno::ENOSYS => e,
            _ => errno,
        };
        self.finish(&Reply::error(self.unique, errno));
    }

    fn is_interrupted(&self) -> bool {
        self.worker.is_interrupted(&self.slot)
    }
}

impl Drop for ReplyCore {
    fn drop(&mut self) {
        if !self.done {
            log::error!(
                "{} request {} was dropped without a reply; answering EIO",
                self.opcode,
                self.unique
            );
            let msg = Reply::error(self.unique, Errno::EIO);
            self.finish(&msg);
        }
    }
}

/// Any reply handle, answered with an error by code that knows no more of
/// it (the async adapter, when a request is interrupted or its future
/// panics).
pub(crate) trait Fail: Send + 'static {
    /// Answers with `errno`.
    fn fail(self, errno: Errno);
    /// The request's opcode and unique id, for log lines.
    fn request(&self) -> (Opcode, u64);
    /// Records that the code answering this request panicked (a future
    /// of the async adapter), as a panicking handler is recorded
    /// ([`crate::SessionHandle::take_panics`]).
    fn record_panic(&self, message: String);
}

macro_rules! handle {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[must_use = "a request must be answered; dropping the handle answers EIO"]
        pub struct $name {
            core: ReplyCore,
        }

        impl $name {
            pub(crate) fn new(core: ReplyCore) -> Self {
                Self { core }
            }

            /// Answers with an error: an [`Errno`] or anything that converts
            /// to one (`std::io::Error` gives its OS error, EIO if none).
            pub fn error(self, errno: impl Into<Errno>) {
                self.core.error(errno.into());
            }

            /// Answers with an error from an `io::Error` (EIO if it has no errno).
            pub fn io_error(self, err: &std::io::Error) {
                self.core.error(errno_of(err));
            }

            /// The request's unique id.
            pub fn unique(&self) -> u64 {
                self.core.unique
            }

            /// Whether the kernel asked to interrupt this request.
            pub fn is_interrupted(&self) -> bool {
                self.core.is_interrupted()
            }
        }

        impl Fail for $name {
            fn fail(self, errno: Errno) {
                self.core.error(errno)
            }
            fn request(&self) -> (Opcode, u64) {
                (self.core.opcode, self.core.unique)
            }
            fn record_panic(&self, message: String) {
                self.core.record_panic(message)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("opcode", &self.core.opcode)
                    .field("unique", &self.core.unique)
                    .finish()
            }
        }
    };
}

handle!(
    /// Reply with nothing but success (UNLINK, RMDIR, RENAME, RELEASE, FSYNC,
    /// FLUSH, SETXATTR, REMOVEXATTR, ACCESS, SETLK, FALLOCATE, SYNCFS…).
    ReplyEmpty
);
handle!(
    /// Reply with an entry (LOOKUP, MKNOD, MKDIR, SYMLINK, LINK).
    ReplyEntry
);
handle!(
    /// Reply with attributes (GETATTR, SETATTR).
    ReplyAttr
);
handle!(
    /// Reply with bytes (READ, READLINK).
    ReplyData
);
handle!(
    /// Reply to OPEN and OPENDIR.
    ReplyOpen
);
handle!(
    /// Reply to CREATE, TMPFILE and atomic open: an entry and an open file.
    ReplyCreate
);
handle!(
    /// Reply to WRITE.
    ReplyWrite
);
handle!(
    /// Reply to STATFS.
    ReplyStatfs
);
handle!(
    /// Reply to GETXATTR and LISTXATTR.
    ReplyXattr
);
handle!(
    /// Reply to GETLK.
    ReplyLock
);
handle!(
    /// Reply to BMAP.
    ReplyBmap
);
handle!(
    /// Reply to IOCTL.
    ReplyIoctl
);
handle!(
    /// Reply to POLL.
    ReplyPoll
);
handle!(
    /// Reply to LSEEK.
    ReplyLseek
);
handle!(
    /// Reply to COPY_FILE_RANGE and COPY_FILE_RANGE_64.
    ReplyCopy
);
handle!(
    /// Reply to STATX.
    ReplyStatx
);

/// The errno to answer for an I/O error (EIO when it carries none, or one
/// outside what the kernel accepts).
fn errno_of(err: &std::io::Error) -> Errno {
    Errno::new_or_eio(err.raw_os_error().unwrap_or(libc::EIO))
}
