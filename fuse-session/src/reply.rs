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

use crate::attr::{FileAttr, FileKind, Statfs};
use crate::backing::BackingFile;
use crate::buffer::AlignedBuf;
use crate::conn::WorkerCore;
use crate::interrupt::Slot;
use crate::splice::{self, Pipes};
use crate::types::{Entry, FileHandle, Inode, Lock};
use fuse_proto::abi::{
    AttrOut, BmapOut, CopyFileRangeOut, EntryOut, GetxattrOut, IoctlOut, LkOut, LseekOut, OpenOut, PollOut,
    StatfsOut, Statx, StatxOut, WriteOut,
};
use fuse_proto::ext::atomic_open::FOPEN_FILE_CREATED;
use fuse_proto::flags::{FopenFlags, IoctlFlags};
use fuse_proto::reply::{DirentError, DirentWriter};
use fuse_proto::{Errno, Opcode, Reply};
use std::cell::RefCell;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

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

impl ReplyEmpty {
    /// Success.
    pub fn ok(self) {
        let u = self.core.unique;
        self.core.send(&Reply::empty(u));
    }

    /// Success or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<(), E>) {
        match r {
            Ok(()) => self.ok(),
            Err(e) => self.error(e),
        }
    }
}

impl ReplyEntry {
    /// The entry (one more lookup reference on `entry.ino`).
    pub fn entry(self, entry: &Entry) {
        self.entry_raw(&entry.to_out())
    }

    /// The entry in the kernel's form, `fuse_entry_out`.
    pub fn entry_raw(self, out: &EntryOut) {
        let r = Reply::entry(self.core.unique, out, self.core.minor());
        self.core.send(&r);
    }

    /// The entry or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<Entry, E>) {
        match r {
            Ok(e) => self.entry(&e),
            Err(e) => self.error(e),
        }
    }

    /// "No such entry", cacheable for `ttl` (a zero node id with a validity).
    pub fn negative(self, ttl: Duration) {
        let out = EntryOut {
            entry_valid: ttl.as_secs(),
            entry_valid_nsec: ttl.subsec_nanos(),
            ..Default::default()
        };
        let r = Reply::entry(self.core.unique, &out, self.core.minor());
        self.core.send(&r);
    }
}

impl ReplyAttr {
    /// The attributes, cacheable for `ttl`.
    pub fn attr(self, ttl: Duration, attr: &FileAttr) {
        self.attr_raw(ttl, &attr.to_abi())
    }

    /// The attributes (cacheable for `ttl`) or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<(Duration, FileAttr), E>) {
        match r {
            Ok((ttl, a)) => self.attr(ttl, &a),
            Err(e) => self.error(e),
        }
    }

    /// The attributes in the kernel's form, `fuse_attr`.
    pub fn attr_raw(self, ttl: Duration, attr: &fuse_proto::abi::Attr) {
        let out = AttrOut {
            attr_valid: ttl.as_secs(),
            attr_valid_nsec: ttl.subsec_nanos(),
            dummy: 0,
            attr: *attr,
        };
        let r = Reply::attr(self.core.unique, &out, self.core.minor());
        self.core.send(&r);
    }
}

thread_local! {
    static SCRATCH: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

impl ReplyData {
    /// The bytes or the error.
    pub fn result<D: AsRef<[u8]>, E: Into<Errno>>(self, r: Result<D, E>) {
        match r {
            Ok(d) => self.data(d.as_ref()),
            Err(e) => self.error(e),
        }
    }

    /// The bytes (sent with the header in one `writev`, not copied here).
    pub fn data(self, data: &[u8]) {
        match Reply::data(self.core.unique, data) {
            Ok(r) => self.core.send(&r),
            Err(e) => {
                log::error!("{} reply: {e}", self.core.opcode);
                self.core.error(Errno::EIO)
            }
        }
    }

    /// Fills a per-thread, page-aligned scratch buffer of `len` bytes with
    /// `fill` (which returns how many bytes it produced) and sends them. The
    /// buffer is reused across requests on the same thread, so this
    /// allocates only when a thread first needs a larger one; its alignment
    /// suits `O_DIRECT` reads of a backing file.
    pub fn with_buffer(self, len: usize, fill: impl FnOnce(&mut [u8]) -> std::io::Result<usize>) {
        with_scratch(len, |buf| match fill(buf) {
            Ok(n) => self.data(&buf[..n.min(len)]),
            Err(e) => self.error(e),
        })
    }

    /// Answers a READ with up to `len` bytes of `fd` from `offset`, as
    /// `pread(2)` would read them: fewer only where `fd` itself ends. The
    /// end of the descriptor, not of your file: a file that is a byte range
    /// of a larger one (a tar member at `start` with `size` bytes) must
    /// clamp, passing `start + offset` and at most `size - offset` bytes
    /// (none at or past `size`), or the reply runs on into what follows
    /// the member.
    ///
    /// ```no_run
    /// # use fuse_session::{ReadRequest, reply::ReplyData};
    /// # use std::os::fd::AsFd;
    /// /// A member of the archive `tar`: `size` bytes from byte `start`.
    /// fn read_member(tar: &std::fs::File, start: u64, size: u64, req: ReadRequest, reply: ReplyData) {
    ///     let len = size.saturating_sub(req.offset).min(u64::from(req.size));
    ///     reply.splice_from(tar.as_fd(), start.saturating_add(req.offset), len as usize);
    /// }
    /// ```
    ///
    /// On `/dev/fuse` the bytes go from `fd` into the kernel with `splice(2)`
    /// through two per-thread pipes, without passing through user memory.
    /// Where that cannot be done (another transport, a reply larger than the
    /// pipes hold with its header, an `fd` that cannot be spliced, any
    /// splice error before the reply reached the kernel) it reads into the
    /// scratch buffer of [`ReplyData::with_buffer`] and writes the same
    /// reply instead; the caller cannot tell the two apart. A read error is
    /// answered with its errno.
    pub fn splice_from(mut self, fd: BorrowedFd<'_>, offset: u64, len: usize) {
        if len > 0 && self.core.worker.channel().supports_splice() {
            let unique = self.core.unique;
            let opcode = self.core.opcode;
            let core = &mut self.core;
            let sent = splice::with_pipes(|pipes| {
                if !pipes.fits(offset, len) {
                    return false;
                }
                match pipes.stage(fd, offset, len, unique) {
                    Ok(total) => {
                        core.finish_spliced(pipes, total, |worker, unique| {
                            resend_read(worker, opcode, unique, fd, offset, len)
                        });
                        true
                    }
                    Err(e) => {
                        log::debug!("{opcode} {unique}: not spliced ({e}); reading into memory");
                        false
                    }
                }
            });
            if sent == Some(true) {
                return;
            }
        }
        self.with_buffer(len, |buf| splice::pread_full(fd, buf, offset));
    }
}

/// Runs `f` on a per-thread, page-aligned scratch buffer of `len` bytes (a
/// buffer of its own when re-entered from inside `f`).
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|s| {
        let Ok(mut slot) = s.try_borrow_mut() else {
            let mut own = AlignedBuf::new(len, 0);
            return f(&mut own.as_mut_slice()[..len]);
        };
        let scratch = slot.get_or_insert_with(|| AlignedBuf::new(len, 0));
        scratch.ensure(len);
        f(&mut scratch.as_mut_slice()[..len])
    })
}

/// The answer [`ReplyData::splice_from`] writes when a staged reply was
/// refused whole: the same bytes, read into memory (already counted).
fn resend_read(
    worker: &WorkerCore,
    opcode: Opcode,
    unique: u64,
    fd: BorrowedFd<'_>,
    offset: u64,
    len: usize,
) {
    with_scratch(len, |buf| match splice::pread_full(fd, buf, offset) {
        Ok(n) => match Reply::data(unique, &buf[..n]) {
            Ok(r) => worker.send_reply(opcode, unique, &r),
            Err(_) => worker.send_reply(opcode, unique, &Reply::error(unique, Errno::EIO)),
        },
        Err(e) => worker.send_reply(opcode, unique, &Reply::error(unique, errno_of(&e))),
    })
}

/// The errno to answer for an I/O error (EIO when it carries none, or one
/// outside what the kernel accepts).
fn errno_of(err: &std::io::Error) -> Errno {
    Errno::new_or_eio(err.raw_os_error().unwrap_or(libc::EIO))
}

/// How an open reply hands the file to the kernel.
fn open_out(fh: FileHandle, flags: FopenFlags, backing: Option<&BackingFile>) -> Result<OpenOut, Errno> {
    let mut flags = flags;
    let mut backing_id = 0;
    if let Some(b) = backing {
        flags |= FopenFlags::PASSTHROUGH;
        if !FopenFlags::PASSTHROUGH_MASK.contains(flags) {
            log::error!(
                "open reply: {:?} cannot be combined with PASSTHROUGH (only DIRECT_IO, \
                 PARALLEL_DIRECT_WRITES and NOFLUSH can); answering EINVAL",
                flags.difference(FopenFlags::PASSTHROUGH_MASK)
            );
            return Err(Errno::EINVAL);
        }
        backing_id = b.id();
    } else if flags.contains(FopenFlags::PASSTHROUGH) {
        log::error!("open reply: PASSTHROUGH without a backing file; answering EINVAL");
        return Err(Errno::EINVAL);
    }
    Ok(OpenOut {
        fh: fh.0,
        open_flags: flags.bits(),
        backing_id,
    })
}

impl ReplyOpen {
    /// Opened with handle `fh` and `flags` (e.g. `DIRECT_IO | PARALLEL_DIRECT_WRITES`).
    /// The answer of an `O_DIRECT` open gets those two added unless the
    /// session was told otherwise
    /// ([`crate::SessionConfig::o_direct_parallel_writes`]).
    ///
    /// ```no_run
    /// # fn doc(reply: fuse_session::reply::ReplyOpen) {
    /// use fuse_session::FileHandle;
    /// use fuse_session::proto::flags::FopenFlags;
    ///
    /// // Generated content whose size is not known when `stat` asks:
    /// // DIRECT_IO makes every read(2) a READ, whatever the size says.
    /// reply.opened(FileHandle(0), FopenFlags::DIRECT_IO);
    /// # }
    /// ```
    pub fn opened(self, fh: FileHandle, flags: FopenFlags) {
        self.finish(fh, flags, None)
    }

    /// Opened (handle and flags) or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<(FileHandle, FopenFlags), E>) {
        match r {
            Ok((fh, flags)) => self.opened(fh, flags),
            Err(e) => self.error(e),
        }
    }

    /// Opened in kernel passthrough mode: reads and writes go straight to
    /// `backing` (only `DIRECT_IO`, `PARALLEL_DIRECT_WRITES`, `NOFLUSH` may join).
    ///
    /// Keep a clone of `backing` until this file's RELEASE: the kernel looks
    /// the backing id up after it reads this reply, so dropping the last
    /// clone right after answering races with the open and fails it (EIO).
    pub fn passthrough(self, fh: FileHandle, flags: FopenFlags, backing: &BackingFile) {
        self.finish(fh, flags, Some(backing))
    }

    fn finish(self, fh: FileHandle, flags: FopenFlags, backing: Option<&BackingFile>) {
        match open_out(fh, self.core.open_flags(flags, backing), backing) {
            Ok(out) => {
                let u = self.core.unique;
                self.core.send(&Reply::open(u, &out))
            }
            Err(e) => self.core.error(e),
        }
    }
}

impl ReplyCreate {
    /// Makes an `ENOSYS` answer go out as `errno` (the default CREATE).
    pub(crate) fn enosys_as(mut self, errno: Errno) -> Self {
        self.core.enosys_as = Some(errno);
        self
    }

    /// Created and opened (entry, handle, flags), or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<(Entry, FileHandle, FopenFlags), E>) {
        match r {
            Ok((entry, fh, flags)) => self.created(&entry, fh, flags),
            Err(e) => self.error(e),
        }
    }

    /// The file was created by this call and opened.
    pub fn created(self, entry: &Entry, fh: FileHandle, flags: FopenFlags) {
        self.finish(entry, fh, flags, None, true)
    }

    /// The file already existed and was opened (atomic open without
    /// `O_EXCL`); for FUSE_CREATE it is the same as [`ReplyCreate::created`].
    pub fn opened(self, entry: &Entry, fh: FileHandle, flags: FopenFlags) {
        self.finish(entry, fh, flags, None, false)
    }

    /// Like [`ReplyCreate::created`] / [`ReplyCreate::opened`] in passthrough mode.
    pub fn passthrough(
        self,
        entry: &Entry,
        fh: FileHandle,
        flags: FopenFlags,
        backing: &BackingFile,
        created: bool,
    ) {
        self.finish(entry, fh, flags, Some(backing), created)
    }

    fn finish(
        self,
        entry: &Entry,
        fh: FileHandle,
        flags: FopenFlags,
        backing: Option<&BackingFile>,
        created: bool,
    ) {
        match open_out(fh, self.core.open_flags(flags, backing), backing) {
            Ok(mut out) => {
                if created && self.core.atomic_open {
                    out.open_flags |= FOPEN_FILE_CREATED;
                }
                let r = Reply::create(self.core.unique, &entry.to_out(), &out, self.core.minor());
                self.core.send(&r)
            }
            Err(e) => self.core.error(e),
        }
    }
}

impl ReplyWrite {
    /// The count written or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<u32, E>) {
        match r {
            Ok(n) => self.written(n),
            Err(e) => self.error(e),
        }
    }

    /// `size` bytes were written.
    pub fn written(self, size: u32) {
        let u = self.core.unique;
        self.core
            .send(&Reply::with_struct(u, &WriteOut { size, padding: 0 }));
    }
}

impl ReplyStatfs {
    /// The statistics or the error.
    pub fn result<S: Into<Statfs>, E: Into<Errno>>(self, r: Result<S, E>) {
        match r {
            Ok(st) => self.statfs(st),
            Err(e) => self.error(e),
        }
    }

    /// The statistics: a [`Statfs`], or the kernel's raw `fuse_kstatfs`
    /// ([`Kstatfs`](fuse_proto::abi::Kstatfs)).
    pub fn statfs(self, st: impl Into<Statfs>) {
        let out = StatfsOut {
            st: st.into().to_abi(),
        };
        let r = Reply::statfs(self.core.unique, &out, self.core.minor());
        self.core.send(&r);
    }
}

impl ReplyXattr {
    /// The size the value (or name list) needs, for a request with size 0.
    pub fn size(self, size: u32) {
        let u = self.core.unique;
        self.core
            .send(&Reply::with_struct(u, &GetxattrOut { size, padding: 0 }));
    }

    /// The value (or NUL-separated name list).
    pub fn data(self, data: &[u8]) {
        match Reply::data(self.core.unique, data) {
            Ok(r) => self.core.send(&r),
            Err(_) => self.core.error(Errno::ERANGE),
        }
    }
}

impl ReplyLock {
    /// The lock or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<Lock, E>) {
        match r {
            Ok(l) => self.lock(l),
            Err(e) => self.error(e),
        }
    }

    /// The conflicting lock, or one of type `F_UNLCK` if none.
    pub fn lock(self, lock: Lock) {
        let u = self.core.unique;
        self.core.send(&Reply::with_struct(u, &LkOut { lk: lock.into() }));
    }
}

impl ReplyBmap {
    /// The device block.
    pub fn block(self, block: u64) {
        let u = self.core.unique;
        self.core.send(&Reply::with_struct(u, &BmapOut { block }));
    }
}

impl ReplyIoctl {
    /// The ioctl's result and output data.
    pub fn ioctl(self, result: i32, data: &[u8]) {
        let out = IoctlOut {
            result,
            flags: 0,
            in_iovs: 0,
            out_iovs: 0,
        };
        match Reply::ioctl(self.core.unique, &out, data) {
            Ok(r) => self.core.send(&r),
            Err(_) => self.core.error(Errno::EIO),
        }
    }

    /// Ask the kernel to retry an unrestricted ioctl with these iovecs
    /// (`fuse_ioctl_iovec` arrays: input then output).
    pub fn retry(self, in_iovs: &[fuse_proto::abi::IoctlIovec], out_iovs: &[fuse_proto::abi::IoctlIovec]) {
        use zerocopy::IntoBytes;
        let out = IoctlOut {
            result: 0,
            flags: IoctlFlags::RETRY.bits(),
            in_iovs: in_iovs.len() as u32,
            out_iovs: out_iovs.len() as u32,
        };
        let mut iovs = Vec::with_capacity(in_iovs.len() + out_iovs.len());
        iovs.extend_from_slice(in_iovs);
        iovs.extend_from_slice(out_iovs);
        match Reply::ioctl(self.core.unique, &out, iovs.as_bytes()) {
            Ok(r) => self.core.send(&r),
            Err(_) => self.core.error(Errno::EIO),
        }
    }
}

impl ReplyPoll {
    /// The ready events.
    pub fn revents(self, revents: u32) {
        let u = self.core.unique;
        self.core
            .send(&Reply::with_struct(u, &PollOut { revents, padding: 0 }));
    }
}

impl ReplyLseek {
    /// The offset or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<u64, E>) {
        match r {
            Ok(o) => self.offset(o),
            Err(e) => self.error(e),
        }
    }

    /// The resulting offset.
    pub fn offset(self, offset: u64) {
        let u = self.core.unique;
        self.core.send(&Reply::with_struct(u, &LseekOut { offset }));
    }
}

impl ReplyCopy {
    /// The count copied or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<u64, E>) {
        match r {
            Ok(n) => self.copied(n),
            Err(e) => self.error(e),
        }
    }

    /// `copied` bytes were copied. COPY_FILE_RANGE can only report 32 bits,
    /// so larger counts are reported as `u32::MAX` rounded down to a page
    /// (the caller sees a short copy and continues).
    pub fn copied(self, copied: u64) {
        let u = self.core.unique;
        if self.core.opcode == Opcode::CopyFileRange64 {
            self.core
                .send(&Reply::with_struct(u, &CopyFileRangeOut { bytes_copied: copied }));
        } else {
            let size = u32::try_from(copied).unwrap_or(!4095);
            self.core
                .send(&Reply::with_struct(u, &WriteOut { size, padding: 0 }));
        }
    }
}

impl ReplyStatx {
    /// The statx attributes, cacheable for `ttl`.
    pub fn statx(self, ttl: Duration, stat: &Statx) {
        let out = StatxOut {
            attr_valid: ttl.as_secs(),
            attr_valid_nsec: ttl.subsec_nanos(),
            flags: 0,
            spare: [0; 2],
            stat: *stat,
        };
        let u = self.core.unique;
        self.core.send(&Reply::with_struct(u, &out));
    }
}

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
        }
    };
}
dir_handle!(ReplyDirectory);
dir_handle!(ReplyDirectoryPlus);
