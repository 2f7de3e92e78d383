//! [`AsyncContext`]: the caller of a request and the session's services,
//! owned, so that a future can keep it across `.await`s (the sync trait's
//! [`RequestContext`](crate::RequestContext) borrows the worker's buffer
//! and lives only as long as the handler call).

use crate::backing::{BackingError, BackingFile};
use crate::conn::WorkerCore;
use crate::context::{MustFinish, RequestContext};
use crate::credentials::Caller;
use crate::init::Negotiated;
use crate::interrupt::Slot;
use crate::journal::Replay;
use crate::notify::Notifier;
use fuse_proto::Errno;
use fuse_proto::abi::InHeader;
use fuse_proto::flags::OpenInFlags;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

/// Who sent a request, and what its future can reach while serving it.
pub struct AsyncContext {
    header: InHeader,
    umask: Option<u32>,
    open_in: OpenInFlags,
    supp_groups: Vec<u32>,
    worker: Arc<WorkerCore>,
    slot: Slot,
    replay: Replay,
    /// The journal slot, and the note a predecessor left in it.
    journal: Option<(usize, Option<u64>)>,
}

impl AsyncContext {
    pub(crate) fn new(ctx: &RequestContext<'_>) -> AsyncContext {
        let (header, umask, open_in, worker, slot) = ctx.parts();
        let (replay, journal) = ctx.journal_parts();
        AsyncContext {
            header,
            umask,
            open_in,
            // Empty (no allocation) unless the kernel sent the group.
            supp_groups: ctx.supp_groups().collect(),
            worker,
            slot,
            replay,
            journal,
        }
    }

    /// Whether a predecessor may have carried this request out already, as
    /// [`RequestContext::replay`] says: under a keeper, a request whose
    /// future a crash cut short reaches the successor as
    /// [`Replay::MaybeDone`]. Always [`Replay::Fresh`] outside a keeper.
    pub fn replay(&self) -> Replay {
        self.replay
    }

    /// The note a predecessor recorded for this request with
    /// [`AsyncContext::set_journal_note`] before it died, if any.
    pub fn journal_note(&self) -> Option<u64> {
        self.journal.and_then(|(_, note)| note)
    }

    /// Records one word about how this request is being carried out, as
    /// [`RequestContext::set_journal_note`] does: call it before the
    /// effect, and a successor sees it with
    /// [`AsyncContext::journal_note`] if this daemon dies first. Ignored
    /// once the request is answered, and outside a keeper.
    pub fn set_journal_note(&self, note: u64) {
        if let Some((i, _)) = self.journal {
            self.worker.set_journal_note(i, self.header.unique, note);
        }
    }

    /// The request's unique id.
    pub fn unique(&self) -> u64 {
        self.header.unique
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

    /// The `open_flags` of OPEN, CREATE and TMPFILE (see
    /// [`RequestContext::open_in_flags`]).
    pub fn open_in_flags(&self) -> OpenInFlags {
        self.open_in
    }

    /// Whether the kernel sent this request again after a takeover.
    pub fn is_resent(&self) -> bool {
        self.header.unique & fuse_proto::consts::UNIQUE_RESEND != 0
    }

    /// Supplementary groups the kernel sent (CREATE_SUPP_GROUP).
    pub fn supp_groups(&self) -> &[u32] {
        &self.supp_groups
    }

    /// The caller's credentials, as [`RequestContext::caller`] gives them.
    pub fn caller(&self) -> Caller {
        Caller::resolve(
            self.header.uid,
            self.header.gid,
            self.header.pid,
            self.supp_groups.iter().copied(),
            &self.worker.shared.callers,
        )
    }

    /// Whether the kernel asked to interrupt this request. The adapter
    /// drops the future when it is (see the
    /// [module documentation](crate::asyncfs#interrupts)), so a future sees
    /// this only between the INTERRUPT and its next poll.
    pub fn is_interrupted(&self) -> bool {
        self.worker.is_interrupted(&self.slot)
    }

    /// Opens a section of this request's future that an INTERRUPT does not
    /// cancel, as [`RequestContext::must_finish`] does for a sync handler:
    /// while the guard lives, an INTERRUPT neither drops the future nor
    /// answers `EINTR`; it is delivered when the last section ends, so a
    /// future that returns with the guard still alive (or in the poll
    /// that drops it) answers its true result, and one still pending
    /// after the section is dropped and answered `EINTR` as usual.
    /// `Err(EINTR)` if the request was interrupted before (the future is
    /// then dropped at its next `.await` that waits). See
    /// [`MustFinish`] for which requests are cancellable.
    ///
    /// ```ignore
    /// async fn flush(&self, ctx: &AsyncContext, ino: Inode, fh: FileHandle, _: u64) -> Result<(), Errno> {
    ///     let _upload = ctx.must_finish()?;
    ///     self.upload(ino, fh).await // Ctrl-C now waits for it
    /// }
    /// ```
    pub fn must_finish(&self) -> Result<MustFinish, Errno> {
        MustFinish::begin(&self.worker, self.slot, self.header.unique)
    }

    /// The session's notifier.
    pub fn notifier(&self) -> &Notifier {
        self.worker.notifier()
    }

    /// What INIT negotiated.
    pub fn negotiated(&self) -> &Negotiated {
        self.worker.negotiated()
    }

    /// Registers `file` as a kernel passthrough backing file (see
    /// [`RequestContext::open_backing`]).
    pub fn open_backing(&self, file: BorrowedFd<'_>) -> Result<BackingFile, BackingError> {
        self.worker.open_backing(file)
    }
}

impl std::fmt::Debug for AsyncContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncContext")
            .field("unique", &self.header.unique)
            .field("uid", &self.header.uid)
            .field("gid", &self.header.gid)
            .field("pid", &self.header.pid)
            .finish()
    }
}
