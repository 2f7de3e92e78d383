//! The loop one worker runs: receive → parse → dispatch → (reply), and the
//! per-worker state that reply handles point back to.
//!
//! Each worker owns its receive buffer (sized once from the negotiated
//! `max_write`, placed so that WRITE data is page-aligned), its channel (a cloned `/dev/fuse` fd where possible), its
//! in-flight table and its statistics; none of these is shared with other
//! workers on the hot path.

use crate::buffer::AlignedBuf;
use crate::filesystem::Filesystem;
use crate::init::Negotiated;
use crate::interrupt::{InflightTable, InterruptCallback, PendingInterrupts};
use crate::notify::Notifier;
use crate::stats::WorkerStats;
use crate::transport::Channel;
use fuse_proto::request::ParseConfig;
use fuse_proto::{Opcode, Reply};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub(crate) use crate::interrupt::Slot;

/// Per-worker liveness, read by the session's monitor to decide on growth.
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct Activity {
    pub(crate) busy: AtomicBool,
    pub(crate) served: AtomicU64,
}

/// State shared by all workers of a session, fixed after INIT.
pub(crate) struct Shared {
    pub(crate) negotiated: Negotiated,
    pub(crate) parse: ParseConfig,
    /// Per-worker tables; indices from `uring_base` on belong to io_uring
    /// queues (one each), the others to `/dev/fuse` workers.
    pub(crate) tables: Box<[InflightTable]>,
    pub(crate) stats: Box<[WorkerStats]>,
    pub(crate) activity: Box<[Activity]>,
    /// `allow_root`: the only non-root uid served.
    pub(crate) deny_others: Option<u32>,
    /// Workers started so far; per-worker tables beyond it are unused.
    pub(crate) active: std::sync::atomic::AtomicUsize,
    pub(crate) pending: PendingInterrupts,
    pub(crate) notifier: Notifier,
    pub(crate) shutdown: AtomicBool,
    pub(crate) destroyed: AtomicBool,
    /// The first per-worker index that belongs to an io_uring queue.
    pub(crate) uring_base: usize,
    /// What can be known about callers' credentials.
    pub(crate) callers: crate::credentials::CallerPolicy,
}

/// One worker: its index in the per-worker tables and its channel.
pub(crate) struct WorkerCore {
    pub(crate) index: usize,
    pub(crate) chan: Arc<dyn Channel>,
    pub(crate) shared: Arc<Shared>,
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

    pub(crate) fn channel(&self) -> &Arc<dyn Channel> {
        &self.chan
    }

    pub(crate) fn table(&self) -> &InflightTable {
        &self.shared.tables[self.index]
    }

    /// Writes a reply; a request the kernel no longer waits for (ENOENT) is
    /// not an error.
    pub(crate) fn send_reply(&self, opcode: Opcode, unique: u64, msg: &Reply<'_>) {
        if let Err(e) = self.chan.send(msg) {
            match e.raw_os_error() {
                Some(libc::ENOENT) => {
                    log::debug!("{opcode} reply to {unique}: the kernel no longer waits for it")
                }
                _ => log::error!("{opcode} reply to {unique} on {}: {e}", self.chan.describe()),
            }
        }
    }

    /// Counts a request as finished. Called before its reply is written, so
    /// that statistics read once the kernel has the reply include it.
    pub(crate) fn finished(&self, opcode: Opcode, is_error: bool) {
        crate::stats::finish(&self.shared.stats, self.index, opcode, is_error);
    }

    /// Frees a request's in-flight slot. Called after its reply is written,
    /// so that an INTERRUPT racing the reply still finds its target.
    pub(crate) fn release(&self, slot: &Slot) {
        self.table().release(slot);
    }

    pub(crate) fn is_interrupted(&self, slot: &Slot) -> bool {
        self.table().is_interrupted(slot)
    }

    pub(crate) fn on_interrupt(&self, slot: &Slot, cb: InterruptCallback) {
        self.table().on_interrupt(slot, cb)
    }
}

/// What ended a worker.
#[derive(Debug)]
pub(crate) enum WorkerEnd {
    /// ENODEV / ECONNABORTED: the filesystem is gone.
    Unmounted,
    /// The session was asked to stop.
    Stopped,
    /// An unexpected receive error.
    Failed(std::io::Error),
}

/// Runs one worker until the connection ends or the session stops.
pub(crate) fn run<F: Filesystem>(fs: &F, core: Arc<WorkerCore>, mut buf: AlignedBuf) -> WorkerEnd {
    let buf = buf.as_mut_slice();
    let activity = &core.shared.activity[core.index];
    loop {
        if core.shared.shutdown.load(Ordering::Acquire) {
            return WorkerEnd::Stopped;
        }
        match core.chan.receive(buf) {
            Ok(n) => {
                activity.busy.store(true, Ordering::Relaxed);
                crate::dispatch::dispatch(fs, &core, &buf[..n]);
                activity.served.fetch_add(1, Ordering::Relaxed);
                activity.busy.store(false, Ordering::Relaxed);
            }
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR | libc::EAGAIN) => continue,
                Some(libc::ENODEV | libc::ECONNABORTED) => return WorkerEnd::Unmounted,
                _ => {
                    if core.shared.shutdown.load(Ordering::Acquire) {
                        return WorkerEnd::Stopped;
                    }
                    log::error!("worker {} receiving on {}: {e}", core.index, core.chan.describe());
                    return WorkerEnd::Failed(e);
                }
            },
        }
    }
}
