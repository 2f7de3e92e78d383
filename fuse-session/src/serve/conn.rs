//! What the workers of one connection share, and the handle one worker's
//! requests point back to.
//!
//! [`Shared`] is fixed after INIT: the negotiated parameters, the per-worker
//! in-flight tables and statistics, the `/dev/fuse` pool, the helpers for
//! deferred replies. [`WorkerCore`] is one worker (a `/dev/fuse` reader or
//! an io_uring ring entry): its index in those tables and the channel its
//! replies go to; [`RequestContext`](crate::RequestContext) and every reply
//! handle hold one. [`Job`] is a request read while every handler slot was
//! taken, waiting in the pool's backlog for a worker. This module sits
//! below the worker loop, the dispatcher and the reply handles, which all
//! use it, and above the transport, which it only names.

use crate::buffer::AlignedBuf;
use crate::credentials::CallerPolicy;
use crate::deferred::{Helpers, QueueEntries};
use crate::init::Negotiated;
use crate::interrupt::{InflightTable, InterruptCallback, PendingInterrupts, Slot};
use crate::notify::Notifier;
use crate::pool::{Pool, Queued};
use crate::stats::StatsTable;
use crate::transport::ReplySink;
use fuse_proto::flags::FopenFlags;
use fuse_proto::request::ParseConfig;
use fuse_proto::{Opcode, Reply};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// State shared by all workers of a session, fixed after INIT.
pub(crate) struct Shared {
    pub(crate) negotiated: Negotiated,
    pub(crate) parse: ParseConfig,
    /// Per-worker tables; indices from `uring_base` on belong to io_uring
    /// queues (one each), the others to `/dev/fuse` workers.
    pub(crate) tables: Box<[InflightTable]>,
    pub(crate) stats: StatsTable,
    /// The `/dev/fuse` worker pool.
    pub(crate) pool: Pool<Job>,
    /// Helper threads for deferred replies.
    pub(crate) helpers: Helpers,
    /// `allow_root`: the only non-root uid served.
    pub(crate) deny_others: Option<u32>,
    /// `splice_write`: the smallest WRITE payload left in a worker's pipe.
    pub(crate) splice_write: Option<usize>,
    pub(crate) pending: PendingInterrupts,
    pub(crate) notifier: Notifier,
    pub(crate) shutdown: AtomicBool,
    pub(crate) destroyed: AtomicBool,
    /// The first per-worker index that belongs to an io_uring queue.
    pub(crate) uring_base: usize,
    /// The flags an `O_DIRECT` open's answer gets added
    /// ([`crate::SessionConfig::o_direct_parallel_writes`]; empty when off).
    pub(crate) o_direct: FopenFlags,
    /// What can be known about callers' credentials.
    pub(crate) callers: CallerPolicy,
    /// Under a keeper: the journal of requests in flight.
    pub(crate) journal: Option<Arc<crate::journal::Journal>>,
    /// Handlers that panicked, until [`SessionHandle::take_panics`](crate::SessionHandle::take_panics).
    pub(crate) panics: crate::stats::PanicLog,
}

/// One worker: its index in the per-worker tables and where its replies go.
pub(crate) struct WorkerCore {
    pub(crate) index: usize,
    /// The reply sink of this worker's requests: its `/dev/fuse` channel,
    /// or the io_uring ring entry.
    pub(crate) chan: Arc<dyn ReplySink>,
    pub(crate) shared: Arc<Shared>,
    /// io_uring: the queue this entry belongs to, and how many of its
    /// entries deferred waits may hold.
    pub(crate) defer_queue: Option<QueueEntries>,
}

impl WorkerCore {
    pub(crate) fn minor(&self) -> u32 {
        self.shared.negotiated.minor
    }

    pub(crate) fn negotiated(&self) -> &Negotiated {
        &self.shared.negotiated
    }

    pub(crate) fn notifier(&self) -> &Notifier {
        &self.shared.notifier
    }

    pub(crate) fn channel(&self) -> &Arc<dyn ReplySink> {
        &self.chan
    }

    pub(crate) fn table(&self) -> &InflightTable {
        &self.shared.tables[self.index]
    }

    /// Writes a reply to this worker's sink ([`crate::transport::send_reply`]:
    /// a request the kernel no longer waits for is not an error).
    pub(crate) fn send_reply(&self, opcode: Opcode, unique: u64, msg: &Reply<'_>) {
        crate::transport::send_reply(&*self.chan, opcode, unique, msg);
    }

    /// Counts a request as finished. Called before its reply is written, so
    /// that statistics read once the kernel has the reply include it.
    pub(crate) fn finished(&self, opcode: Opcode, is_error: bool) {
        self.shared.stats.finish(self.index, opcode, is_error);
    }

    /// Frees a request's in-flight slot. Called after its reply is written,
    /// so that an INTERRUPT racing the reply still finds its target.
    /// Records `note` in journal slot `slot` for request `unique` (see
    /// [`RequestContext::set_journal_note`](crate::RequestContext::set_journal_note));
    /// nothing without a journal.
    pub(crate) fn set_journal_note(&self, slot: usize, unique: u64, note: u64) {
        if let Some(j) = self.shared.journal.as_deref() {
            j.set_note(slot, unique, note);
        }
    }

    /// Records a panic of the code answering request `unique` among the
    /// session's handler panics.
    pub(crate) fn record_panic(&self, opcode: Opcode, unique: u64, message: String) {
        self.shared.panics.record(crate::stats::HandlerPanic {
            opcode,
            unique,
            message,
        });
    }

    pub(crate) fn release(&self, slot: &Slot) {
        self.table().release(slot);
    }

    pub(crate) fn is_interrupted(&self, slot: &Slot) -> bool {
        self.table().is_interrupted(slot)
    }

    pub(crate) fn on_interrupt(&self, slot: &Slot, cb: InterruptCallback) {
        self.table().on_interrupt(slot, cb)
    }

    pub(crate) fn begin_section(&self, slot: &Slot, unique: u64) -> bool {
        self.table().begin_section(slot, unique)
    }

    pub(crate) fn end_section(&self, slot: &Slot, unique: u64) {
        self.table().end_section(slot, unique)
    }

    /// Registers `file` as a passthrough backing file on this worker's
    /// channel, if INIT granted passthrough.
    pub(crate) fn open_backing(
        &self,
        file: std::os::fd::BorrowedFd<'_>,
    ) -> Result<crate::backing::BackingFile, crate::backing::BackingError> {
        if !self
            .negotiated()
            .flags
            .contains(fuse_proto::flags::InitFlags::PASSTHROUGH)
        {
            return Err(crate::backing::BackingError::NotNegotiated);
        }
        crate::backing::BackingFile::open(self.channel(), file)
    }
}

/// A request read while the pool was at its cap, parked for a worker.
pub(crate) struct Job {
    bytes: JobBytes,
    pub(crate) unique: u64,
    uid: u32,
    /// The worker that read it: its reply must go to that channel.
    pub(crate) core: Arc<WorkerCore>,
}

/// A parked request's bytes: a WRITE in a buffer that keeps its data
/// page-aligned, as a worker's receive buffer does; anything else in just
/// its own length, so that thousands parked cost little.
enum JobBytes {
    Aligned(AlignedBuf, usize),
    Plain(Box<[u8]>),
}

impl Job {
    /// A copy of `msg` (a whole request, header included) read on `core`.
    pub(crate) fn new(core: &Arc<WorkerCore>, msg: &[u8], unique: u64, uid: u32, write: bool) -> Job {
        let bytes = if write {
            let mut buf = AlignedBuf::receive(msg.len());
            buf.as_mut_slice().copy_from_slice(msg);
            JobBytes::Aligned(buf, msg.len())
        } else {
            JobBytes::Plain(msg.into())
        };
        Job {
            bytes,
            unique,
            uid,
            core: core.clone(),
        }
    }

    /// The request.
    pub(crate) fn msg(&self) -> &[u8] {
        match &self.bytes {
            JobBytes::Aligned(buf, len) => &buf.as_slice()[..*len],
            JobBytes::Plain(b) => b,
        }
    }
}

impl Queued for Job {
    fn unique(&self) -> u64 {
        self.unique
    }

    fn uid(&self) -> u32 {
        self.uid
    }

    fn charge(&self) -> usize {
        let held = match &self.bytes {
            JobBytes::Aligned(buf, _) => buf.len() + crate::buffer::PAGE,
            JobBytes::Plain(b) => b.len(),
        };
        held + crate::pool::PARK_OVERHEAD
    }
}
