//! [`RequestContext`]: who sent a request, and what a handler can reach
//! while serving it (interrupts, notifications, backing files).

use crate::attr::FileAttr;
use crate::backing::{BackingError, BackingFile};
use crate::conn::WorkerCore;
use crate::credentials::Caller;
use crate::deferred::{Refused, Submission, Wait, WaitState};
use crate::init::Negotiated;
use crate::interrupt::InterruptCallback;
use crate::interrupt::Slot;
use crate::journal::Replay;
use crate::notify::Notifier;
use fuse_proto::Errno;
use fuse_proto::abi::InHeader;
use fuse_proto::flags::OpenInFlags;
use fuse_proto::request::{Extensions, SecurityContext};
use std::cell::Cell;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

/// The caller of a request and the session's services.
pub struct RequestContext<'a> {
    header: InHeader,
    umask: Option<u32>,
    extensions: Extensions<'a>,
    worker: &'a Arc<WorkerCore>,
    slot: Slot,
    open_in: OpenInFlags,
    replay: Replay,
    /// The journal slot, and the note a predecessor left in it.
    journal: Option<(usize, Option<u64>)>,
    /// What a layer last reported of the node a request acts on by name
    /// (see [`RequestContext::node_attr`]).
    node_attr: Cell<Option<FileAttr>>,
}

impl<'a> RequestContext<'a> {
    pub(crate) fn new(
        header: InHeader,
        umask: Option<u32>,
        extensions: Extensions<'a>,
        worker: &'a Arc<WorkerCore>,
        slot: Slot,
    ) -> Self {
        Self {
            header,
            umask,
            extensions,
            worker,
            slot,
            open_in: OpenInFlags::empty(),
            replay: Replay::Fresh,
            journal: None,
            node_attr: Cell::new(None),
        }
    }

    pub(crate) fn with_journal(mut self, replay: Replay, journal: Option<(usize, Option<u64>)>) -> Self {
        self.replay = replay;
        self.journal = journal;
        self
    }

    /// Whether a predecessor may have carried this request out already
    /// ([`Replay::MaybeDone`]: it was sent again after the daemon that was
    /// serving it died; see [`crate::journal`]). Always [`Replay::Fresh`]
    /// outside a keeper.
    pub fn replay(&self) -> Replay {
        self.replay
    }

    /// The note a predecessor recorded for this request with
    /// [`RequestContext::set_journal_note`] before it died, if any.
    pub fn journal_note(&self) -> Option<u64> {
        self.journal.and_then(|(_, note)| note)
    }

    /// Records one word about how this request is being carried out (an
    /// offset chosen for an appending write, the inode a rename moves),
    /// which a successor sees with [`RequestContext::journal_note`] if this
    /// daemon dies before answering. Call it before the effect; after the
    /// answer it is ignored. Does nothing for requests that are not
    /// journaled or outside a keeper.
    pub fn set_journal_note(&self, note: u64) {
        if let Some((i, _)) = self.journal {
            self.worker.set_journal_note(i, self.header.unique, note);
        }
    }

    /// The attributes last reported to the kernel for the node this request
    /// acts on by name, as the path layer passes them to a SETATTR, LINK,
    /// SETXATTR or REMOVEXATTR method (`None` elsewhere): the node that the
    /// kernel checked the request against under `default_permissions`.
    /// A method acting on a name that may have been replaced behind the
    /// mount's back, for a caller it cannot check itself (one the kernel
    /// does not name, [`Caller::is_unmapped`]), acts only on a node of this
    /// `st_ino` ([`FileAttr::ino`]) and owner: the kernel's check was then
    /// the check of that very node.
    pub fn node_attr(&self) -> Option<FileAttr> {
        self.node_attr.get()
    }

    /// Sets what [`RequestContext::node_attr`] answers (the path layer,
    /// around the by-name methods it calls).
    pub(crate) fn set_node_attr(&self, attr: Option<FileAttr>) {
        self.node_attr.set(attr);
    }

    /// How the request reaches the filesystem, and its journal slot with
    /// the note a predecessor left in it (for the async adapter's owned
    /// context).
    pub(crate) fn journal_parts(&self) -> (Replay, Option<(usize, Option<u64>)>) {
        (self.replay, self.journal)
    }

    pub(crate) fn with_open_in(mut self, flags: OpenInFlags) -> Self {
        self.open_in = flags;
        self
    }

    /// What an owned copy of the context needs (the async adapter's
    /// [`crate::layers::asyncfs::AsyncContext`]): the header, umask, open flags,
    /// worker and in-flight slot.
    pub(crate) fn parts(&self) -> (InHeader, Option<u32>, OpenInFlags, Arc<WorkerCore>, Slot) {
        (
            self.header,
            self.umask,
            self.open_in,
            self.worker.clone(),
            self.slot,
        )
    }

    /// Whether the session is stopping, or its connection is gone (a
    /// worker saw the unmount).
    pub(crate) fn session_stopping(&self) -> bool {
        let shared = &self.worker.shared;
        shared.shutdown.load(std::sync::atomic::Ordering::Acquire) || shared.pool.is_ended()
    }

    /// The `open_flags` of OPEN, CREATE and TMPFILE (empty for other
    /// requests). `KILL_SUIDGID` asks the filesystem to clear the file's
    /// set-ID bits as part of a truncating open, as the kernel would for a
    /// caller without `CAP_FSETID` (`HANDLE_KILLPRIV_V2`).
    pub fn open_in_flags(&self) -> OpenInFlags {
        self.open_in
    }

    /// The request's unique id.
    pub fn unique(&self) -> u64 {
        self.header.unique
    }

    /// Whether the kernel sent this request again after a takeover
    /// (`FUSE_UNIQUE_RESEND` in its unique; see [`crate::handover`]): a
    /// predecessor read it and may have carried it out before it died.
    pub fn is_resent(&self) -> bool {
        self.header.unique & fuse_proto::consts::UNIQUE_RESEND != 0
    }

    /// The caller's effective uid (`u32::MAX` if unmapped in an idmapped mount).
    pub fn uid(&self) -> u32 {
        self.header.uid
    }

    /// The caller's effective gid.
    pub fn gid(&self) -> u32 {
        self.header.gid
    }

    /// The caller's thread id in the connection's pid namespace (0 for the
    /// kernel's own requests and for callers outside that namespace: never
    /// a sign of privilege by itself).
    pub fn pid(&self) -> u32 {
        self.header.pid
    }

    /// The caller's umask, for MKNOD, MKDIR, CREATE and TMPFILE (the kernel
    /// has applied it unless `DONT_MASK` was negotiated).
    pub fn umask(&self) -> Option<u32> {
        self.umask
    }

    /// The caller's credentials: uid, gid, supplementary groups and
    /// capabilities, as far as they can be known (see
    /// [`crate::credentials`]); [`Caller::act_as`] makes the current thread
    /// act with them.
    pub fn caller(&self) -> Caller {
        Caller::resolve(
            self.header.uid,
            self.header.gid,
            self.header.pid,
            self.supp_groups(),
            &self.worker.shared.callers,
        )
    }

    /// Supplementary groups the kernel sent (CREATE_SUPP_GROUP): the parent
    /// directory's group when the caller is a member of it.
    pub fn supp_groups(&self) -> impl Iterator<Item = u32> + use<'a> {
        self.extensions.supp_groups().into_iter().flat_map(|g| g.iter())
    }

    /// Security contexts the kernel sent for a new inode (SECURITY_CTX).
    pub fn security_contexts(&self) -> impl Iterator<Item = SecurityContext<'a>> + use<'a> {
        self.extensions
            .security_contexts()
            .into_iter()
            .flat_map(|s| s.iter())
    }

    /// The raw request extensions.
    pub fn extensions(&self) -> &Extensions<'a> {
        &self.extensions
    }

    /// Whether the kernel asked to interrupt this request (never while a
    /// [`MustFinish`] section is open: see [`RequestContext::must_finish`]).
    pub fn is_interrupted(&self) -> bool {
        self.worker.is_interrupted(&self.slot)
    }

    /// Opens a section of this request that must finish: until the
    /// returned guard is dropped, an INTERRUPT for the request is held, so
    /// [`is_interrupted`](RequestContext::is_interrupted) stays false and
    /// [`on_interrupt`](RequestContext::on_interrupt) callbacks do not run;
    /// when the last open section ends, a held INTERRUPT is delivered as if
    /// it came then. Answer the request before dropping the guard and its
    /// true result goes out, whatever the caller's signals.
    ///
    /// `Err(EINTR)` if the request was interrupted before: it is then
    /// interrupted as usual (answer `EINTR`, or finish anyway).
    ///
    /// Use it for what the caller must not be told failed once it is done
    /// (an upload or commit at FLUSH or FSYNC; see [`MustFinish`] for which
    /// requests the kernel interrupts at all). The guard can be kept past
    /// the answer: it then does nothing.
    pub fn must_finish(&self) -> Result<MustFinish, Errno> {
        MustFinish::begin(self.worker, self.slot, self.header.unique)
    }

    /// Runs `cb` once if this request is interrupted while in flight (at once
    /// if it already was). The callback runs on the thread that reads the
    /// INTERRUPT: keep it short.
    pub fn on_interrupt(&self, cb: impl FnOnce() + Send + 'static) {
        let cb: InterruptCallback = Box::new(cb);
        self.worker.on_interrupt(&self.slot, cb);
    }

    /// Gives `reply` to a helper thread that runs `f(reply, wait)`, and
    /// returns at once: the worker (or io_uring queue thread) that called
    /// the handler goes back to serving requests while `f` waits. For
    /// waits other processes control: a blocking lock (`SETLKW`, `flock`
    /// without `LOCK_NB`), a lease, a condition another request changes.
    ///
    /// An INTERRUPT for this request marks `wait` interrupted and sends a
    /// signal to the helper thread, so that a blocking system call in `f`
    /// returns `EINTR`; `f` should then answer `EINTR` (check
    /// [`Wait::is_interrupted`] before blocking, too). This replaces any
    /// callback set with [`RequestContext::on_interrupt`].
    ///
    /// Refused, with the handle given back, when the session holds
    /// `max_deferred` waits or the caller's uid its share of them
    /// (`max_deferred_per_uid`, at most half), or (io_uring) when the
    /// request's queue has no ring entry to spare for a wait or the caller's
    /// uid holds half of those it has: answer it then (`ENOLCK` for a lock,
    /// `EAGAIN` otherwise). See [`crate::deferred`].
    pub fn defer<R: Send + 'static>(
        &self,
        reply: R,
        f: impl FnOnce(R, &Wait) + Send + 'static,
    ) -> Result<(), Refused<R>> {
        let state = WaitState::new();
        let sub = Submission {
            uid: self.uid(),
            unique: self.unique(),
            queue: self.worker.defer_queue,
            wait: state.clone(),
        };
        let shared = &self.worker.shared;
        let r = match shared.helpers.reserve(sub) {
            Ok(r) => r,
            Err(reason) => return Err(Refused { reply, reason }),
        };
        let s = state.clone();
        self.worker
            .on_interrupt(&self.slot, Box::new(move || s.interrupt()));
        shared.helpers.start(r, move |wait| f(reply, wait));
        Ok(())
    }

    /// The index of the worker serving this request (0 = the session fd).
    pub fn worker(&self) -> usize {
        self.worker.index
    }

    /// The device fd this request arrived on and its reply will go to
    /// (`None` for transports without one).
    pub fn channel_fd(&self) -> Option<std::os::fd::RawFd> {
        self.worker.chan.raw_fd()
    }

    /// The session's notifier.
    pub fn notifier(&self) -> &Notifier {
        self.worker.notifier()
    }

    /// What INIT negotiated.
    pub fn negotiated(&self) -> &Negotiated {
        self.worker.negotiated()
    }

    /// Registers `file` as a kernel passthrough backing file.
    pub fn open_backing(&self, file: BorrowedFd<'_>) -> Result<BackingFile, BackingError> {
        self.worker.open_backing(file)
    }
}

/// A section of one request that an INTERRUPT does not cut short, from
/// [`RequestContext::must_finish`] or
/// [`AsyncContext::must_finish`](crate::asyncfs::AsyncContext::must_finish);
/// it ends when dropped.
///
/// # Which requests are cancelled by default, and why
///
/// The kernel sends INTERRUPT only for a request a signalled caller waits
/// for: never for RELEASE, RELEASEDIR, FORGET or BATCH_FORGET (they are
/// sent without a waiting caller) nor for the kernel's own requests
/// (INIT, DESTROY, NOTIFY_REPLY). Every other request is interruptible:
/// a sync handler sees [`RequestContext::is_interrupted`] and may answer
/// `EINTR`, and an async future is dropped and answered `EINTR`. This is
/// the default for FLUSH and FSYNC too, and no opcode is must-finish by
/// default: whether the work already done can be dropped is the
/// filesystem's knowledge, not the protocol's. A FLUSH that only reports
/// errors, or an FSYNC of data that stays dirty and is written later, may
/// well give up on Ctrl-C (the caller retries or sees `EINTR`, which
/// close(2) and fsync(2) may return); a FLUSH that uploads an object the
/// caller then believes lost must not. Such a filesystem opens a section
/// around its upload.
///
/// While a section is open an INTERRUPT is held; when the last section of
/// the request ends it is delivered, so work after the section (and a
/// future still pending then) is interrupted as usual. A request answered
/// inside its section answers its true result. An INTERRUPT that came
/// before the section makes [`RequestContext::must_finish`] return
/// `EINTR`. When the session stops, async futures are dropped whether or
/// not a section is open.
#[must_use = "the section ends when the guard is dropped"]
pub struct MustFinish {
    worker: Arc<WorkerCore>,
    slot: Slot,
    unique: u64,
}

impl MustFinish {
    pub(crate) fn begin(worker: &Arc<WorkerCore>, slot: Slot, unique: u64) -> Result<MustFinish, Errno> {
        if !worker.begin_section(&slot, unique) {
            return Err(Errno::EINTR);
        }
        Ok(MustFinish {
            worker: worker.clone(),
            slot,
            unique,
        })
    }
}

impl Drop for MustFinish {
    fn drop(&mut self) {
        self.worker.end_section(&self.slot, self.unique);
    }
}

impl std::fmt::Debug for MustFinish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MustFinish")
            .field("unique", &self.unique)
            .finish()
    }
}
