//! The loop one `/dev/fuse` worker runs: receive → parse → dispatch →
//! (reply); the state it works on is in [`crate::conn`].
//!
//! Each worker owns its receive buffer (sized once from the negotiated
//! `max_write`, placed so that WRITE data is page-aligned), its channel (a
//! cloned `/dev/fuse` fd where possible), its in-flight table and its
//! statistics; none of these is shared with other workers on the hot path.

use crate::buffer::AlignedBuf;
use crate::conn::{Job, WorkerCore};
use crate::filesystem::Filesystem;
use crate::transport::RequestSource;
use fuse_proto::{Errno, Opcode as Op, Reply};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// What ended a worker.
#[derive(Debug)]
pub(crate) enum WorkerEnd {
    /// ENODEV / ECONNABORTED: the filesystem is gone.
    Unmounted,
    /// The session was asked to stop.
    Stopped,
    /// It waited `idle_timeout` for a request above the pool's floor.
    Retired,
    /// An unexpected receive error.
    Failed(std::io::Error),
}

/// Requests that never wait for a handler: a thread at the cap serves them
/// itself instead of queueing them.
fn never_waits(op: Option<u32>) -> bool {
    matches!(
        op.and_then(|n| Op::from_u32(n).ok()),
        Some(Op::Interrupt | Op::Forget | Op::BatchForget | Op::NotifyReply)
    )
}

/// Runs one pool thread, reading requests from `source` (whose replies go
/// to `core`'s sink, the same channel), until the connection ends, the
/// session stops, or it retires. It starts counted as idle ([`crate::pool::Pool::begin_start`]) and leaves
/// the idle count whenever it returns.
pub(crate) fn run<F: Filesystem>(
    fs: &F,
    core: Arc<WorkerCore>,
    source: &dyn RequestSource,
    mut buf: AlignedBuf,
) -> WorkerEnd {
    let shared = &core.shared;
    let pool = &shared.pool;
    loop {
        // Here the thread is counted idle.
        if shared.shutdown.load(Ordering::Acquire) {
            pool.leave_idle_quietly();
            return WorkerEnd::Stopped;
        }
        if let Some(job) = pool.take_job() {
            pool.leave_idle();
            crate::dispatch::dispatch(fs, &job.core, &job.buf.as_slice()[..job.len]);
            pool.release_busy();
            pool.enter_idle();
            continue;
        }
        // Only threads beyond the floor's indices ever retire, so only they
        // pay for the idle timer (two timer_settime calls per receive): the
        // floor's threads read with a plain read(2), as they would at the floor.
        let got = if core.index >= pool.cfg.floor && pool.above_floor() {
            source.receive_timeout(buf.as_mut_slice(), pool.cfg.idle_timeout)
        } else {
            source.receive(buf.as_mut_slice())
        };
        let n = match got {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR | libc::EAGAIN) => continue,
                Some(libc::ETIMEDOUT) => {
                    if pool.try_retire() {
                        return WorkerEnd::Retired;
                    }
                    continue;
                }
                Some(libc::ENODEV | libc::ECONNABORTED) => {
                    pool.leave_idle_quietly();
                    return WorkerEnd::Unmounted;
                }
                _ => {
                    pool.leave_idle_quietly();
                    if shared.shutdown.load(Ordering::Acquire) {
                        return WorkerEnd::Stopped;
                    }
                    log::error!("worker {} receiving on {}: {e}", core.index, core.chan.describe());
                    return WorkerEnd::Failed(e);
                }
            },
        };
        pool.leave_idle();
        let msg = &buf.as_slice()[..n];
        let op = fuse_proto::request::peek_opcode(msg);
        if never_waits(op) {
            crate::dispatch::dispatch(fs, &core, msg);
        } else if pool.acquire_busy() {
            crate::dispatch::dispatch(fs, &core, msg);
            pool.release_busy();
        } else {
            queue_at_cap(&core, msg, op);
        }
        pool.enter_idle();
    }
}

/// Every handler slot is taken: queue the request for the next thread that
/// finishes a handler (its reply still goes to this thread's channel), and
/// keep reading. A full queue answers `EAGAIN`.
fn queue_at_cap(core: &Arc<WorkerCore>, msg: &[u8], op: Option<u32>) {
    let Some(unique) = fuse_proto::request::peek_unique(msg) else {
        log::error!("a request too short to have a header; dropped");
        return;
    };
    let mut buf = AlignedBuf::receive(msg.len());
    buf.as_mut_slice().copy_from_slice(msg);
    let job = Job {
        buf,
        len: msg.len(),
        unique,
        core: core.clone(),
    };
    if let Err(job) = core.shared.pool.push_job(job) {
        let opcode = op.and_then(|n| Op::from_u32(n).ok()).unwrap_or(Op::Init);
        log::warn!(
            "every worker is busy and {} requests wait; answering {opcode} {unique} EAGAIN",
            crate::pool::MAX_BACKLOG
        );
        core.shared.stats.count_error(core.index, opcode);
        job.core
            .send_reply(opcode, unique, &Reply::error(unique, Errno::EAGAIN));
    }
}
