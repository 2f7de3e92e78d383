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

    /// Whether the kernel asked to interrupt this request.
    pub fn is_interrupted(&self) -> bool {
        self.worker.is_interrupted(&self.slot)
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
