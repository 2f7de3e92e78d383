//! The threads that serve the io_uring queues: the worker level of FUSE
//! over io_uring, next to [`crate::worker`] for `/dev/fuse`, above the
//! dispatcher and below the session.
//!
//! Each queue ([`ring::Queue`], built in [`crate::transport::uring::ring`])
//! has two to `depth + 1` threads pinned to the queue's CPU. Leader and
//! followers: only the thread holding the queue's role token waits on the
//! ring, takes completions and submits. It runs each request's handler
//! itself (no hand-off between threads per request), through the same
//! [`crate::dispatch::serve`] as the `/dev/fuse` workers, with the ring
//! entry as the reply sink; it gives the token up for the handler's
//! duration and takes it back afterwards if it is still free. While nobody
//! holds it, the kernel signals the standby threads through an eventfd
//! registered with the ring, and a short timer covers completions that were
//! already waiting; a standby then takes the token, so a handler that
//! blocks holds its thread and its entry, never the queue. A thread ends
//! only when the kernel holds none of the commands it submitted (the
//! kernel cancels them when it exits).
//!
//! A handler that waits for something other users control (a blocking
//! lock, whatever the opcode) should still give its reply handle to a
//! helper thread with [`crate::RequestContext::defer`] and return, holding
//! no thread. A deferred request keeps its ring entry until it is answered,
//! so only three quarters of a queue's entries may be held by waits, and
//! one uid at most half of those (counted by [`crate::deferred`], as the
//! waits of `/dev/fuse` requests are); beyond them a uid that holds no
//! wait on the queue still gets one, until only an eighth of the entries
//! is left for requests that do not wait.
//!
//! INIT, FORGET, INTERRUPT and NOTIFY_REPLY keep arriving on `/dev/fuse`,
//! and notifications are still written there; the session keeps its
//! `/dev/fuse` worker pool for them. See `docs/uring.md`.

use crate::conn::{Shared, WorkerCore};
use crate::deferred::QueueEntries;
use crate::filesystem::Filesystem;
use crate::init::Negotiated;
use crate::transport::uring::ring::{self, KIND_COMMIT, Queue, RingEntry, WAKE};
use crate::transport::uring::{MIN_MINOR, Unavailable, knob};
use fuse_proto::Request;
use fuse_proto::flags::InitFlags;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Threads a queue keeps however idle it is: the driver and one standby.
const THREAD_FLOOR: usize = 2;

/// After INIT: why `OVER_IO_URING` was not granted.
pub(crate) fn why_not_granted(n: &Negotiated) -> Unavailable {
    if n.kernel_minor < MIN_MINOR {
        Unavailable::KernelTooOld {
            minor: n.kernel_minor,
        }
    } else if n.offered.contains(InitFlags::OVER_IO_URING) {
        Unavailable::RefusedByFilesystem
    } else {
        match knob() {
            Some(false) => Unavailable::KnobOff,
            None => Unavailable::NotBuilt,
            Some(true) => Unavailable::NotOffered,
        }
    }
}

/// Size of each entry's payload buffer, as the kernel computes its minimum:
/// `max(8192, max_write, max_pages * 4096)` (32 pages when `MAX_PAGES` is off).
pub(crate) fn payload_size(n: &Negotiated) -> usize {
    let pages = if n.max_pages == 0 {
        32
    } else {
        n.max_pages as usize
    };
    (fuse_proto::consts::MIN_READ_BUFFER)
        .max(n.max_write as usize)
        .max(pages * 4096)
}

/// How a queue thread ended.
#[derive(Debug)]
pub(crate) enum QueueEnd {
    /// Every entry completed with ENOTCONN/ECANCELED: the connection ended.
    Disconnected,
    /// The session was stopped.
    Stopped,
    /// It waited as a standby for the idle timeout, above the floor.
    Retired,
    /// `io_uring_enter` failed.
    Failed(io::Error),
}

/// The running rings of a session.
pub(crate) struct Rings {
    queues: Vec<Arc<Queue>>,
    /// The first thread of each queue (the others are not joined: the
    /// queue's `live` count says when they are gone).
    threads: Vec<JoinHandle<QueueEnd>>,
    /// Entries per queue.
    pub(crate) depth: usize,
}

impl Rings {
    /// Number of queues.
    pub(crate) fn len(&self) -> usize {
        self.queues.len()
    }

    /// Wakes every queue thread (they look at the shutdown flag).
    pub(crate) fn wake_all(&self) {
        wake_queues(&self.queues);
    }

    /// A function that wakes every queue thread, for the session's stop.
    pub(crate) fn waker(&self) -> impl Fn() + Send + 'static {
        let queues = self.queues.clone();
        move || wake_queues(&queues)
    }

    fn all_ended(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
            && self.queues.iter().all(|q| q.live.load(Ordering::SeqCst) == 0)
    }

    /// Waits for the queue threads; after `grace` they are told to stop
    /// (their commands are then cancelled as they exit).
    pub(crate) fn join(self, shared: &Shared, grace: Duration) {
        let deadline = Instant::now() + grace;
        while !self.all_ended() {
            if Instant::now() >= deadline && !shared.shutdown.swap(true, Ordering::AcqRel) {
                let state: Vec<String> = self
                    .queues
                    .iter()
                    .filter(|q| q.live.load(Ordering::SeqCst) > 0)
                    .map(|q| q.describe())
                    .collect();
                log::warn!(
                    "io_uring queues still running {grace:?} after the /dev/fuse workers; stopping them: {}",
                    state.join("; ")
                );
            }
            if shared.shutdown.load(Ordering::Acquire) {
                self.wake_all();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for (qid, t) in self.threads.into_iter().enumerate() {
            match t.join() {
                Ok(QueueEnd::Failed(e)) => log::warn!("io_uring queue {qid} ended on an error: {e}"),
                Ok(end) => log::debug!("io_uring queue {qid} ended: {end:?}"),
                Err(_) => log::error!("io_uring queue {qid} thread panicked"),
            }
        }
        // Every thread has left its loop (`live` is 0); wait until they are
        // gone, so that none outlives the session.
        join_followers(&self.queues);
    }
}

fn join_followers(queues: &[Arc<Queue>]) {
    for q in queues {
        let threads = std::mem::take(&mut *q.followers.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            if t.join().is_err() {
                log::error!("io_uring queue {} thread panicked", q.qid);
            }
        }
    }
}

fn wake_queues(queues: &[Arc<Queue>]) {
    for q in queues {
        q.wake();
    }
}

/// Builds one ring per queue with `depth` entries each and starts the queue
/// threads, which register the entries. `on_thread_start` runs first on
/// each queue thread (the session uses it to be able to wake them).
pub(crate) fn start<F: Filesystem>(
    fs: &Arc<F>,
    shared: &Arc<Shared>,
    dev: RawFd,
    nr_queues: usize,
    depth: usize,
    on_thread_start: Arc<dyn Fn() -> crate::signal::Registered + Send + Sync>,
) -> Result<Rings, Unavailable> {
    let setup = |what: &str, e: io::Error| Unavailable::Setup {
        what: what.to_string(),
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    };
    let depth = depth.clamp(1, 1 << 12);
    let dup = nix::unistd::dup(
        // SAFETY: `dev` is the session's /dev/fuse fd, open for the whole call.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(dev) },
    )
    .map_err(|e| setup("dup of the /dev/fuse fd", e.into()))?;
    let dev = Arc::new(dup);
    let payload_len = payload_size(&shared.negotiated);

    // Phase 1: every ring and buffer, before anything is registered, so that
    // a failure leaves the kernel untouched and /dev/fuse serves everything.
    let mut built = Vec::with_capacity(nr_queues);
    for qid in 0..nr_queues {
        let queue = Arc::new(Queue::new(qid, dev.clone(), depth)?);
        let mut entries = Vec::with_capacity(depth);
        let waits = QueueEntries {
            queue: qid,
            max: deferrable_entries(depth),
            first_waits: first_wait_entries(depth),
        };
        for i in 0..depth {
            let e = RingEntry::new(queue.clone(), i as u32, payload_len)
                .map_err(|e| setup(&format!("allocating {payload_len}-byte ring buffers"), e))?;
            let e = Arc::new(e);
            let core = Arc::new(WorkerCore {
                index: shared.uring_base + qid,
                chan: e.clone(),
                shared: shared.clone(),
                defer_queue: Some(waits),
            });
            entries.push((e, core));
        }
        built.push(Arc::new(QueueCtx {
            fs: fs.clone(),
            shared: shared.clone(),
            q: queue,
            entries,
            on_start: on_thread_start.clone(),
        }));
    }

    // Phase 2: a pinned thread per queue registers its entries and serves.
    let (tx, rx) = crossbeam_channel::bounded::<(usize, Result<(), Unavailable>)>(nr_queues);
    let mut queues = Vec::with_capacity(nr_queues);
    let mut threads = Vec::with_capacity(nr_queues);
    for ctx in built {
        let qid = ctx.q.qid as usize;
        queues.push(ctx.q.clone());
        let tx = tx.clone();
        ctx.q.live.fetch_add(1, Ordering::SeqCst);
        let serial = ctx.q.next_serial.fetch_add(1, Ordering::Relaxed);
        let mine = ctx.clone();
        let t = std::thread::Builder::new()
            .name(format!("fuse-uring-{qid}"))
            .spawn(move || mine.first_thread(serial, tx));
        match t {
            Ok(t) => threads.push(t),
            Err(e) => {
                ctx.q.live.fetch_sub(1, Ordering::SeqCst);
                stop_queues(Rings {
                    queues,
                    threads,
                    depth,
                });
                return Err(setup("starting a queue thread", e));
            }
        }
    }
    drop(tx);
    let rings = Rings {
        queues,
        threads,
        depth,
    };
    let mut failure = None;
    for _ in 0..nr_queues {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok((_, Ok(()))) => {}
            Ok((qid, Err(e))) => {
                log::error!("io_uring queue {qid}: {e}");
                failure.get_or_insert(e);
            }
            Err(_) => {
                failure.get_or_insert(Unavailable::Setup {
                    what: "waiting for the queue threads to register".into(),
                    errno: libc::ETIMEDOUT,
                });
                break;
            }
        }
    }
    match failure {
        None => Ok(rings),
        Some(e) => {
            // Without every queue registered the kernel keeps using
            // /dev/fuse; end the threads (their commands are cancelled).
            stop_queues(rings);
            Err(e)
        }
    }
}

fn stop_queues(rings: Rings) {
    for q in &rings.queues {
        q.closed.store(true, Ordering::Release);
    }
    rings.wake_all();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !rings.all_ended() && Instant::now() < deadline {
        rings.wake_all();
        std::thread::sleep(Duration::from_millis(5));
    }
    if !rings.all_ended() {
        log::warn!("io_uring queue threads still running after they were told to stop");
        return;
    }
    for t in rings.threads {
        let _ = t.join();
    }
    join_followers(&rings.queues);
}

fn pin_to_cpu(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    let r = set
        .set(cpu)
        .and_then(|_| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set));
    if let Err(e) = r {
        log::warn!("io_uring queue {cpu}: cannot pin the thread to CPU {cpu}: {e}");
    }
}

/// What the threads of one queue share.
struct QueueCtx<F> {
    fs: Arc<F>,
    shared: Arc<Shared>,
    q: Arc<Queue>,
    entries: Vec<(Arc<RingEntry>, Arc<WorkerCore>)>,
    on_start: Arc<dyn Fn() -> crate::signal::Registered + Send + Sync>,
}

type SetupTx = crossbeam_channel::Sender<(usize, Result<(), Unavailable>)>;

impl<F: Filesystem> QueueCtx<F> {
    fn stopping(&self) -> bool {
        self.shared.shutdown.load(Ordering::Acquire) || self.q.closed.load(Ordering::Acquire)
    }

    fn enter_thread(&self, serial: usize) -> crate::signal::Registered {
        ring::set_thread_serial(serial);
        pin_to_cpu(self.q.qid as usize);
        (self.on_start)()
    }

    /// The queue's first thread: registers the entries, starts the first
    /// standby and serves.
    fn first_thread(self: Arc<Self>, serial: usize, setup: SetupTx) -> QueueEnd {
        let _registered = self.enter_thread(serial);
        let q = &self.q;
        let qid = q.qid as usize;
        // The queue was built with the token taken for this thread.
        q.hold_token_from_start();
        let mut armed = q
            .arm_kick()
            .and_then(|_| self.entries.iter().try_for_each(|(e, _)| e.register()));
        if armed.is_ok() {
            armed = q.enter(false);
        }
        if let Err(e) = armed {
            let _ = setup.send((
                qid,
                Err(Unavailable::Setup {
                    what: format!("submitting REGISTER on queue {qid}"),
                    errno: e.raw_os_error().unwrap_or(libc::EIO),
                }),
            ));
            let end = self.leave_driving(QueueEnd::Failed(e));
            q.live.fetch_sub(1, Ordering::SeqCst);
            return end;
        }
        if !self.spawn_follower() {
            log::warn!("io_uring queue {qid}: no standby thread; a blocking handler will stall the queue");
        }
        self.run(true, &mut Some(setup))
    }

    /// A thread started to wait as a standby.
    fn follower(self: Arc<Self>, serial: usize) {
        let _registered = self.enter_thread(serial);
        let end = self.run(false, &mut None);
        log::debug!("io_uring queue {} thread {serial} ended: {end:?}", self.q.qid);
    }

    /// Starts one more thread, as a standby; false at the cap of `depth + 1`
    /// threads or if it could not start.
    fn spawn_follower(self: &Arc<Self>) -> bool {
        let q = &self.q;
        let cap = q.depth + 1;
        if q.live
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| (l < cap).then_some(l + 1))
            .is_err()
        {
            return false;
        }
        q.standby.fetch_add(1, Ordering::SeqCst);
        let serial = q.next_serial.fetch_add(1, Ordering::Relaxed);
        let ctx = self.clone();
        let t = std::thread::Builder::new()
            .name(format!("fuse-uring-{}", q.qid))
            .spawn(move || ctx.follower(serial));
        match t {
            Ok(t) => {
                let mut f = q.followers.lock().unwrap_or_else(|e| e.into_inner());
                f.retain(|t| !t.is_finished());
                f.push(t);
                true
            }
            Err(e) => {
                q.standby.fetch_sub(1, Ordering::SeqCst);
                q.live.fetch_sub(1, Ordering::SeqCst);
                log::warn!("io_uring queue {}: cannot start a thread: {e}", q.qid);
                false
            }
        }
    }

    /// Drives, or waits as a standby, until the thread ends. A thread that
    /// starts as a standby is counted in `standby` already.
    fn run(self: &Arc<Self>, mut driving: bool, setup: &mut Option<SetupTx>) -> QueueEnd {
        let end = loop {
            if !driving && let Err(end) = self.standby() {
                break end;
            }
            driving = false;
            if let Some(end) = self.drive(setup) {
                break end;
            }
        };
        if !matches!(end, QueueEnd::Retired) {
            self.q.live.fetch_sub(1, Ordering::SeqCst);
        }
        end
    }

    /// Gives the token up for good: the queue is closed, and every other
    /// thread of it is told so.
    fn leave_driving(&self, end: QueueEnd) -> QueueEnd {
        self.q.closed.store(true, Ordering::Release);
        self.q.release();
        self.q.wake_standbys();
        end
    }

    /// Waits until this thread takes the token (`Ok`) or ends. Leaves the
    /// `standby` count either way.
    fn standby(&self) -> Result<(), QueueEnd> {
        let q = &self.q;
        let floor = THREAD_FLOOR.min(q.depth + 1);
        let mut backoff = 1u32;
        let leave = |r: Result<(), QueueEnd>| {
            q.standby.fetch_sub(1, Ordering::SeqCst);
            r
        };
        loop {
            if self.stopping() {
                return leave(Err(QueueEnd::Stopped));
            }
            // Work nobody drives for (it came before this thread was waiting).
            if !q.driving.load(Ordering::SeqCst)
                && (q.has_completions() || q.has_unsubmitted())
                && q.try_drive()
            {
                return leave(Ok(()));
            }
            let above_floor = q.live.load(Ordering::SeqCst) > floor;
            let timeout = above_floor.then(|| self.shared.pool.cfg.idle_timeout * backoff);
            if ring::wait_readable(&q.standby_fd, &q.nudge_fd, timeout) {
                if self.stopping() {
                    // Leave the eventfd readable: every other standby must
                    // see it too (the one write that closed the queue wakes
                    // them all, but a drained eventfd puts them back to sleep).
                    return leave(Err(QueueEnd::Stopped));
                }
                // Read the counters before looking (at the top of the loop):
                // what comes after writes them again.
                ring::drain(&q.standby_fd);
                ring::drain(&q.nudge_fd);
                continue;
            }
            if !above_floor {
                continue;
            }
            // Idle for the timeout above the floor: end, unless the kernel
            // holds a command this thread submitted (exiting would cancel it:
            // wait until a request has used it).
            if q.owns_armed(ring::thread_serial(), self.entries.iter().map(|(e, _)| &**e)) {
                backoff = (backoff * 2).min(64);
                continue;
            }
            if q.live
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| {
                    (l > floor).then_some(l - 1)
                })
                .is_ok()
            {
                return leave(Err(QueueEnd::Retired));
            }
        }
    }

    /// Serves the ring while holding the token. `None`: the thread gave the
    /// token up for a handler and another thread took it; it goes to wait as
    /// a standby (and is counted as one).
    fn drive(self: &Arc<Self>, setup: &mut Option<SetupTx>) -> Option<QueueEnd> {
        let q = &self.q;
        let qid = q.qid as usize;
        let fail = |what: &str, e: &io::Error| Unavailable::Setup {
            what: format!("{what} on queue {qid}"),
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        };
        loop {
            if q.dead.load(Ordering::SeqCst) >= self.entries.len() {
                return Some(self.leave_driving(QueueEnd::Disconnected));
            }
            if self.stopping() {
                return Some(self.leave_driving(QueueEnd::Stopped));
            }
            // One completion at a time: those not taken yet stay in the ring
            // for whoever drives next, should this thread's handler block.
            let cqe = q.next_completion();
            let Some(cqe) = cqe else {
                if let Some(s) = setup.take() {
                    let _ = s.send((qid, Ok(())));
                }
                // Submit what was queued (replies, re-arms) and wait.
                if let Err(e) = q.enter(true) {
                    match e.raw_os_error() {
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY) => {}
                        _ => return Some(self.leave_driving(QueueEnd::Failed(e))),
                    }
                }
                continue;
            };
            let ud = cqe.user_data();
            if ud == WAKE {
                if let Err(e) = q.rearm_kick() {
                    log::error!("io_uring queue {qid}: re-arming the wake-up poll: {e}");
                }
                continue;
            }
            let Some((entry, core)) = self.entries.get((ud & 0xffff_ffff) as usize) else {
                log::error!("io_uring queue {qid}: completion for unknown entry {ud:#x}");
                continue;
            };
            let res = cqe.result();
            if res == 0 {
                entry.took_request();
                q.served.fetch_add(1, Ordering::Relaxed);
                if let Some(s) = setup.take() {
                    let _ = s.send((qid, Ok(())));
                }
                self.release_for_handler();
                serve_entry(&self.fs, entry, core);
                // Counted as a standby before looking at the token, so that a
                // driver that sees neither this thread driving nor waiting
                // does not start another thread for nothing.
                q.standby.fetch_add(1, Ordering::SeqCst);
                if q.try_drive() {
                    q.standby.fetch_sub(1, Ordering::SeqCst);
                    ring::take_unkicked();
                    entry.flush_stash();
                    continue;
                }
                // Another thread drives: hand it what this one queued.
                entry.flush_stash();
                if ring::take_unkicked() {
                    q.kick();
                }
                return None;
            }
            let errno = -res;
            match errno {
                libc::ENOTCONN | libc::ECANCELED | libc::ENODEV => {
                    entry.mark_dead();
                    q.dead.fetch_add(1, Ordering::SeqCst);
                }
                _ if ud & KIND_COMMIT != 0 => {
                    // The kernel refused a commit (e.g. the request is gone);
                    // give the entry back to it with a fresh REGISTER.
                    log::warn!(
                        "io_uring queue {qid} entry {}: COMMIT_AND_FETCH failed: {}; registering it again",
                        entry.index,
                        io::Error::from_raw_os_error(errno)
                    );
                    if let Err(e) = entry.register() {
                        log::error!("io_uring queue {qid}: {e}");
                        entry.mark_dead();
                        q.dead.fetch_add(1, Ordering::SeqCst);
                    }
                }
                _ => {
                    let e = io::Error::from_raw_os_error(errno);
                    log::error!("io_uring queue {qid} entry {}: REGISTER failed: {e}", entry.index);
                    entry.mark_dead();
                    q.dead.fetch_add(1, Ordering::SeqCst);
                    if let Some(s) = setup.take() {
                        let _ = s.send((qid, Err(fail("REGISTER", &e))));
                    }
                }
            }
        }
    }

    /// Before running a handler on the driving thread: makes sure a standby
    /// exists and gives the token up, so that a handler that blocks holds
    /// its entry and its thread, never the queue. Costs no system call when
    /// no other request is waiting and a standby exists.
    ///
    /// Completions already waiting, and replies queued but not submitted
    /// (those of the handlers run before in this batch), do not signal the
    /// standbys. Rather than waking one at once, or submitting at once (a
    /// system call for each request of a burst, though the handler most
    /// likely returns in microseconds), the nudge timer is set: when it
    /// expires a standby looks, and takes the token if nobody holds it.
    fn release_for_handler(self: &Arc<Self>) {
        let q = &self.q;
        if q.has_completions() || q.has_unsubmitted() {
            q.arm_nudge();
        }
        if q.standby.load(Ordering::SeqCst) == 0 {
            self.spawn_follower();
        }
        q.release();
    }
}

/// Parses the request in `entry`'s buffers, in place, and dispatches it
/// like a `/dev/fuse` worker does. The caller commits a reply stashed during
/// the dispatch ([`RingEntry::flush_stash`]).
fn serve_entry<F: Filesystem>(fs: &Arc<F>, entry: &RingEntry, core: &Arc<WorkerCore>) {
    entry.with_request(|in_out, op_in, payload| parse_and_serve(fs, core, in_out, op_in, payload));
}

/// How many of a queue's `depth` entries deferred waits may hold: a
/// deferred request keeps its entry until it is answered, and the kernel
/// gives a CPU's requests to that CPU's queue only, so a quarter (at least
/// one) stays for requests that do not wait.
pub(crate) fn deferrable_entries(depth: usize) -> usize {
    depth - (depth / 4).max(1).min(depth)
}

/// How many of a queue's `depth` entries deferred waits may hold counting
/// the first wait of each uid that holds none on the queue: all but an
/// eighth (at least one), which stays for requests that do not wait.
pub(crate) fn first_wait_entries(depth: usize) -> usize {
    depth - (depth / 8).max(1).min(depth)
}

fn parse_and_serve<F: Filesystem>(
    fs: &Arc<F>,
    core: &Arc<WorkerCore>,
    in_out: &[u8],
    op_in: &[u8],
    payload: &[u8],
) {
    match Request::parse_split(in_out, op_in, payload, &core.shared.parse) {
        Ok(req) => crate::dispatch::serve(&**fs, core, req),
        Err(e) => crate::dispatch::malformed(
            core,
            fuse_proto::request::peek_opcode(in_out),
            fuse_proto::request::peek_unique(in_out),
            payload.len() + 40,
            e,
        ),
    }
}
