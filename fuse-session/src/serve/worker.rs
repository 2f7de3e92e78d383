//! The loop one `/dev/fuse` worker runs: receive → parse → dispatch →
//! (reply); the state it works on is in [`crate::conn`].
//!
//! Each worker owns its receive buffer (sized once from the negotiated
//! `max_write`, placed so that WRITE data is page-aligned), its channel (a
//! cloned `/dev/fuse` fd where possible), its in-flight table and its
//! statistics; none of these is shared with other workers on the hot path.
//! With `splice_write` it also owns a receive pipe ([`crate::recv_pipe`]).

use crate::buffer::{AlignedBuf, WRITE_PAYLOAD_OFFSET};
use crate::conn::{Job, WorkerCore};
use crate::filesystem::Filesystem;
use crate::payload::PipePayload;
use crate::recv_pipe::{Received, RecvPipe};
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
    /// The pool did not need it (above the floor: it waited `idle_timeout`
    /// for a request, or the pool had it to spare for that long).
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
    let mut pipe = receive_pipe(&core, source, buf.len());
    let min_payload = shared.splice_write.unwrap_or(usize::MAX);
    loop {
        // Here the thread is counted idle.
        if shared.shutdown.load(Ordering::Acquire) {
            pool.leave_idle_quietly();
            return WorkerEnd::Stopped;
        }
        // A thread above the floor that the pool has not needed ends.
        if core.index >= pool.cfg.floor && pool.above_floor() && pool.spare() && pool.try_retire() {
            return WorkerEnd::Retired;
        }
        if let Some((job, slot)) = pool.take_job() {
            pool.leave_idle();
            crate::dispatch::dispatch(fs, &job.core, job.msg());
            pool.release_busy(slot);
            pool.enter_idle();
            continue;
        }
        // Only threads beyond the floor's indices ever retire, so only they
        // pay for the idle timer (two timer_settime calls per receive): the
        // floor's threads read with a plain read(2), as they would at the floor.
        let timeout = (core.index >= pool.cfg.floor && pool.above_floor()).then_some(pool.cfg.idle_timeout);
        let got = match (&pipe, timeout) {
            (Some(p), _) => p.receive(source, buf.as_mut_slice(), timeout, min_payload),
            (None, Some(t)) => source.receive_timeout(buf.as_mut_slice(), t).map(Received::Whole),
            (None, None) => source.receive(buf.as_mut_slice()).map(Received::Whole),
        };
        let got = match got {
            Ok(got) => got,
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
                _ if pipe.is_some() => {
                    // EINVAL, ENOMEM…: splicing from the device does not
                    // work here; read as without splice_write.
                    log::warn!(
                        "worker {}: splicing requests from {} failed ({e}); reading them instead",
                        core.index,
                        core.chan.describe()
                    );
                    pipe = None;
                    continue;
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
        match (got, &pipe) {
            (Received::Write(size), Some(p)) => {
                let uid = fuse_proto::request::peek_uid(&buf.as_slice()[..WRITE_PAYLOAD_OFFSET]);
                if let Some(slot) = pool.acquire_busy(uid.unwrap_or(u32::MAX)) {
                    serve_piped_write(fs, &core, p, &mut buf, size);
                    pool.release_busy(slot);
                } else {
                    // Another thread will serve it: it needs the bytes.
                    match p.read_payload(buf.as_mut_slice(), size) {
                        Ok(n) => queue_at_cap(&core, &buf.as_slice()[..n], Some(Op::Write as u32)),
                        Err(e) => lost_write(&core, &buf.as_slice()[..WRITE_PAYLOAD_OFFSET], &e),
                    }
                }
            }
            (Received::Write(_), None) => unreachable_write(&core, &buf),
            (Received::Whole(n), _) => {
                let msg = &buf.as_slice()[..n];
                let op = fuse_proto::request::peek_opcode(msg);
                let uid = fuse_proto::request::peek_uid(msg).unwrap_or(u32::MAX);
                if never_waits(op) {
                    crate::dispatch::dispatch(fs, &core, msg);
                } else if let Some(slot) = pool.acquire_busy(uid) {
                    crate::dispatch::dispatch(fs, &core, msg);
                    pool.release_busy(slot);
                } else {
                    queue_at_cap(&core, msg, op);
                }
            }
        }
        pool.enter_idle();
    }
}

/// This worker's receive pipe, with [`crate::SessionConfig::splice_write`]
/// on a transport that splices; `None` (and a log line saying why) if it
/// cannot hold the largest request.
fn receive_pipe(core: &WorkerCore, source: &dyn RequestSource, buffer: usize) -> Option<RecvPipe> {
    core.shared.splice_write?;
    if !source.supports_splice_receive() {
        return None;
    }
    match RecvPipe::new(buffer) {
        Ok(p) => Some(p),
        Err(e) => {
            let msg = format!("splice_write: worker {} reads WRITE payloads: {e}", core.index);
            if core.index == 0 {
                log::warn!("{msg}");
            } else {
                log::debug!("{msg}");
            }
            None
        }
    }
}

/// Serves a WRITE of `size` bytes whose header is in `buf` and whose
/// payload waits in `pipe`; then empties the pipe of whatever the handler
/// left, so that the next request starts at its front.
fn serve_piped_write<F: Filesystem>(
    fs: &F,
    core: &Arc<WorkerCore>,
    pipe: &RecvPipe,
    buf: &mut AlignedBuf,
    size: usize,
) {
    let (head, spare) = buf.as_mut_slice().split_at_mut(WRITE_PAYLOAD_OFFSET);
    let payload = PipePayload::new(pipe.reader(), size, spare);
    crate::dispatch::serve_write_in_pipe(fs, core, head, &payload);
    if payload.left() > 0 && !payload.drain() {
        log::error!(
            "worker {}: a WRITE payload left in the pipe could not be drained",
            core.index
        );
        pipe.drain();
    }
}

/// A WRITE whose payload could not be read back from the pipe: its caller
/// gets EIO rather than waiting for ever.
fn lost_write(core: &WorkerCore, head: &[u8], e: &std::io::Error) {
    log::error!(
        "worker {}: reading a WRITE payload from the pipe: {e}",
        core.index
    );
    if let Some(unique) = fuse_proto::request::peek_unique(head) {
        core.shared.stats.count_error(core.index, Op::Write);
        core.send_reply(Op::Write, unique, &Reply::error(unique, Errno::EIO));
    }
}

fn unreachable_write(core: &WorkerCore, buf: &AlignedBuf) {
    lost_write(
        core,
        &buf.as_slice()[..WRITE_PAYLOAD_OFFSET],
        &std::io::Error::other("internal: a WRITE in a pipe without one"),
    );
}

/// Every handler slot is taken: park the request for the next thread that
/// finishes a handler (its reply still goes to this thread's channel), and
/// keep reading. At the parked requests' bound this thread waits with it
/// (see [`crate::pool`]); nothing is refused for want of room.
fn queue_at_cap(core: &Arc<WorkerCore>, msg: &[u8], op: Option<u32>) {
    let (Some(unique), Some(uid)) = (
        fuse_proto::request::peek_unique(msg),
        fuse_proto::request::peek_uid(msg),
    ) else {
        log::error!("a request too short to have a header; dropped");
        return;
    };
    let write = op == Some(Op::Write as u32);
    let job = Job::new(core, msg, unique, uid, write);
    let shared = &core.shared;
    if let Err(job) = shared.pool.park(job, || shared.shutdown.load(Ordering::Acquire)) {
        // The session stops or the connection ended: the kernel ends the
        // request itself (with the connection) if this answer is not read.
        let opcode = op.and_then(|n| Op::from_u32(n).ok()).unwrap_or(Op::Init);
        shared.stats.count_error(core.index, opcode);
        job.core
            .send_reply(opcode, unique, &Reply::error(unique, Errno::EINTR));
    }
}
