//! The `/dev/fuse` worker pool: how many threads read and serve requests,
//! when another one starts, when one ends, and the reader that is always
//! there.
//!
//! - **Floor.** The session starts `workers` threads and never goes below.
//! - **Growth, by events.** A thread that takes a request while no other
//!   thread is waiting in `read(2)` marks the pool saturated and, if the
//!   manager (the thread that called [`crate::Session::run`]) is not already
//!   watching, wakes it. The manager then sleeps until `grow_after` past the
//!   start of the saturation and, if no thread has gone back to reading
//!   since, starts one. Nothing polls: an idle session's manager sleeps
//!   with no timeout.
//! - **Cap, and the reader beyond it.** At most `max_workers` threads run
//!   handlers at once. One more thread may exist: when all `max_workers`
//!   are busy for `grow_after`, the manager starts it, and a thread that
//!   reads a request while the cap is reached does not serve it. It serves
//!   INTERRUPT, FORGET, BATCH_FORGET and NOTIFY_REPLY at once (they never
//!   wait for a handler) and queues everything else, in order, for the next
//!   thread that finishes a handler; an INTERRUPT for a queued request
//!   answers that request `EINTR` at once. The queue is bounded
//!   ([`MAX_BACKLOG`]); beyond it a request is answered `EAGAIN`. So,
//!   whatever the handlers do, something keeps reading `/dev/fuse`:
//!   interrupts reach their requests, forgets are applied, and another
//!   user's requests wait their turn instead of the whole mount hanging.
//! - **Shrinking.** While the pool is above its floor, a thread whose
//!   per-worker index is not one of the floor's (`0..floor`) reads with a
//!   one-shot timer ([`crate::transport::RequestSource::receive_timeout`]); when it
//!   has waited `idle_timeout` for a request it ends, unless that would go
//!   below the floor. The floor's threads read without a timer: arming and
//!   disarming one costs two system calls per request, and they would not
//!   retire anyway while the others can. A pool at its floor arms no timer.
//! - **Shrinking under load.** The kernel hands each request to the thread
//!   that has waited longest, so under a steady load every thread gets one
//!   now and then and none ever waits `idle_timeout`: a pool that grew for a
//!   burst would keep its threads, and their timers, for good. So the pool
//!   also keeps the lowest number of idle threads seen in each window of
//!   [`SURPLUS_WINDOW`] (or `idle_timeout`, if shorter; one compare per
//!   request, on the counters' own cache line). When a window ends with
//!   threads idle all along, that many threads above the floor were not
//!   needed: the first ones above the floor to come back for a request end
//!   instead. Growing takes `grow_after` (20 ms) of saturation; a window
//!   fifty times as long keeps a pool from shrinking between the bursts of
//!   a load that needs it.
//!
//! Handlers that wait for something other users control (a lock, a lease)
//! should not hold a worker at all: they give their reply handle to a
//! helper thread with [`crate::RequestContext::defer`] ([`crate::deferred`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Most requests queued while every worker is busy at the cap.
pub(crate) const MAX_BACKLOG: usize = 1024;

/// The longest window over which the pool looks for threads to spare.
pub(crate) const SURPLUS_WINDOW: Duration = Duration::from_secs(1);

/// How often a stopping session signals the threads that are still there.
const KICK_EVERY: Duration = Duration::from_millis(20);

/// How the pool is sized.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PoolConfig {
    /// Threads started at once and always kept.
    pub(crate) floor: usize,
    /// Most threads running handlers at once.
    pub(crate) max: usize,
    /// How long every thread must be busy before another starts.
    pub(crate) grow_after: Duration,
    /// How long a thread above the floor waits for a request before it ends.
    pub(crate) idle_timeout: Duration,
}

impl PoolConfig {
    /// How long the pool must have had threads to spare before they end.
    pub(crate) fn surplus_window(&self) -> Duration {
        self.idle_timeout.min(SURPLUS_WINDOW)
    }

    /// Per-worker indices the pool needs: the cap plus the reader beyond it.
    pub(crate) fn slots(&self) -> usize {
        self.max + 1
    }
}

/// What the backlog holds: a request, found again by its `unique` when an
/// INTERRUPT names it.
pub(crate) trait Queued {
    fn unique(&self) -> u64;
}

/// The two counters every request changes, together on a cache line of
/// their own (the thread that changes one changes the other right after).
#[derive(Default)]
#[repr(align(128))]
struct Hot {
    /// Threads waiting for (or about to wait for) a request.
    idle: AtomicUsize,
    /// Threads running a handler.
    busy: AtomicUsize,
    /// The lowest `idle` since the current shrink window began.
    low: AtomicUsize,
}

/// The pool's counters and queue, shared by its threads and the manager.
pub(crate) struct Pool<J> {
    hot: Hot,
    pub(crate) cfg: PoolConfig,
    /// Threads alive (read on every request, written when threads come and go).
    live: AtomicUsize,
    /// When the pool last became saturated (no idle thread), in nanoseconds
    /// since `epoch` plus one; 0 while some thread is idle.
    saturated_since: AtomicU64,
    epoch: Instant,
    /// The manager is watching a saturation (sleeping with a deadline).
    watching: AtomicBool,
    /// The connection ended: start nothing more.
    ended: AtomicBool,
    /// A stop was called off ([`Pool::resume`]): the manager starts the
    /// floor's threads again.
    refill: AtomicBool,
    /// The manager has returned (set under its lock): the pool is over.
    finished: AtomicBool,
    backlog: Mutex<VecDeque<J>>,
    backlog_len: AtomicUsize,
    /// Per-worker table indices not in use.
    free: Mutex<Vec<usize>>,
    /// Threads started so far.
    started: AtomicUsize,
    /// When the current shrink window ends, in nanoseconds since `epoch`.
    window_end: AtomicU64,
    /// Threads above the floor the last window found not needed, still to end.
    surplus: AtomicUsize,
    manager: Mutex<()>,
    wake: Condvar,
}

impl<J: Queued> Pool<J> {
    /// A pool whose threads use per-worker indices `0..=cfg.max`.
    pub(crate) fn new(cfg: PoolConfig) -> Self {
        Self {
            cfg,
            hot: Hot::default(),
            live: AtomicUsize::new(0),
            saturated_since: AtomicU64::new(0),
            epoch: Instant::now(),
            watching: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            refill: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            backlog: Mutex::new(VecDeque::new()),
            backlog_len: AtomicUsize::new(0),
            free: Mutex::new((0..cfg.slots()).rev().collect()),
            started: AtomicUsize::new(0),
            window_end: AtomicU64::new(cfg.surplus_window().as_nanos() as u64),
            surplus: AtomicUsize::new(0),
            manager: Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    /// Threads alive.
    pub(crate) fn live(&self) -> usize {
        self.live.load(SeqCst)
    }

    /// Threads started so far.
    pub(crate) fn started(&self) -> usize {
        self.started.load(SeqCst)
    }

    /// Reserves an index and counts a thread about to start (as idle: it
    /// reads first). `None` when every index is taken.
    pub(crate) fn begin_start(&self) -> Option<usize> {
        let index = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
        self.live.fetch_add(1, SeqCst);
        self.started.fetch_add(1, SeqCst);
        self.enter_idle();
        Some(index)
    }

    /// Undoes [`Pool::begin_start`] for a thread that could not be started.
    pub(crate) fn start_failed(&self, index: usize) {
        self.started.fetch_sub(1, SeqCst);
        self.leave_idle_quietly();
        self.exited(index);
    }

    /// A thread has left its loop (it was counted idle when it left).
    pub(crate) fn exited(&self, index: usize) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(index);
        self.live.fetch_sub(1, SeqCst);
        self.notify_manager();
    }

    /// The calling thread goes back to waiting for requests.
    pub(crate) fn enter_idle(&self) {
        if self.hot.idle.fetch_add(1, SeqCst) == 0 {
            self.saturated_since.store(0, SeqCst);
        }
    }

    /// The calling thread has a request (or leaves): if it was the last
    /// idle one, the pool is saturated and the manager is told.
    pub(crate) fn leave_idle(&self) {
        let before = self.hot.idle.fetch_sub(1, SeqCst);
        // The shrink window's low-water mark: written only when it drops.
        let now_idle = before.saturating_sub(1);
        if now_idle < self.hot.low.load(Relaxed) {
            self.hot.low.fetch_min(now_idle, Relaxed);
        }
        if before == 1 {
            let now = self.epoch.elapsed().as_nanos() as u64 + 1;
            let _ = self.saturated_since.compare_exchange(0, now, SeqCst, SeqCst);
            // A thread that came back meanwhile cleared the mark before we
            // set it: the pool is not saturated after all.
            if self.hot.idle.load(SeqCst) > 0 {
                let _ = self.saturated_since.compare_exchange(now, 0, SeqCst, SeqCst);
            }
            if !self.watching.swap(true, SeqCst) {
                self.notify_manager();
            }
        }
    }

    /// Leaves the idle count without waking anyone (the thread exits).
    pub(crate) fn leave_idle_quietly(&self) {
        self.hot.idle.fetch_sub(1, SeqCst);
    }

    /// Takes a handler slot if fewer than `max` handlers run.
    pub(crate) fn acquire_busy(&self) -> bool {
        // One read-modify-write when there is room (the common case).
        if self.hot.busy.fetch_add(1, SeqCst) < self.cfg.max {
            return true;
        }
        self.hot.busy.fetch_sub(1, SeqCst);
        false
    }

    pub(crate) fn release_busy(&self) {
        self.hot.busy.fetch_sub(1, SeqCst);
    }

    /// Whether an idle thread above the floor should wait with a timeout.
    pub(crate) fn above_floor(&self) -> bool {
        self.live.load(SeqCst) > self.cfg.floor
    }

    /// An idle thread timed out: true if it may end (the pool stays at or
    /// above its floor). It is then no longer counted alive or idle, and
    /// calls [`Pool::retired`] once it has dropped what it holds.
    pub(crate) fn try_retire(&self) -> bool {
        let floor = self.cfg.floor;
        let ok = self
            .live
            .fetch_update(SeqCst, SeqCst, |l| (l > floor).then_some(l - 1))
            .is_ok();
        if ok {
            self.leave_idle_quietly();
        }
        ok
    }

    /// Asked by an idle thread above the floor's indices each time round:
    /// whether it should end because the pool has had a thread to spare for
    /// a whole window (see the module docs). If true, the thread calls
    /// [`Pool::try_retire`] next.
    pub(crate) fn spare(&self) -> bool {
        if self.surplus.load(Relaxed) > 0
            && self
                .surplus
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return true;
        }
        let now = self.epoch.elapsed().as_nanos() as u64;
        let end = self.window_end.load(Relaxed);
        if now < end {
            return false;
        }
        let next = now + self.cfg.surplus_window().as_nanos() as u64;
        if self
            .window_end
            .compare_exchange(end, next, SeqCst, SeqCst)
            .is_err()
        {
            return false; // another thread closed this window
        }
        let low = self.hot.low.swap(self.hot.idle.load(SeqCst), SeqCst);
        let above = self.live.load(SeqCst).saturating_sub(self.cfg.floor);
        let spare = low.min(above);
        if spare == 0 {
            return false;
        }
        log::debug!(
            "the pool had {low} thread(s) to spare for {:?}; ending {spare}",
            self.cfg.surplus_window()
        );
        self.surplus.store(spare - 1, SeqCst);
        true
    }

    /// A thread that retired has ended: its index is free again.
    pub(crate) fn retired(&self, index: usize) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(index);
        self.notify_manager();
    }

    /// Queues a request read at the cap; gives it back if the queue is full.
    pub(crate) fn push_job(&self, job: J) -> Result<(), J> {
        let mut q = self.backlog.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= MAX_BACKLOG {
            return Err(job);
        }
        q.push_back(job);
        self.backlog_len.store(q.len(), SeqCst);
        Ok(())
    }

    /// The oldest queued request, with a handler slot taken for it; `None`
    /// when nothing is queued or the cap is reached.
    pub(crate) fn take_job(&self) -> Option<J> {
        if self.backlog_len.load(SeqCst) == 0 || !self.acquire_busy() {
            return None;
        }
        let mut q = self.backlog.lock().unwrap_or_else(|e| e.into_inner());
        let job = q.pop_front();
        self.backlog_len.store(q.len(), SeqCst);
        drop(q);
        if job.is_none() {
            self.release_busy();
        }
        job
    }

    /// Removes the queued request `unique`, if it is queued and `cancel`
    /// agrees (a request whose loss would leak, such as RELEASE, stays).
    pub(crate) fn remove_job_if(&self, unique: u64, cancel: impl Fn(&J) -> bool) -> Option<J> {
        if self.backlog_len.load(SeqCst) == 0 {
            return None;
        }
        let mut q = self.backlog.lock().unwrap_or_else(|e| e.into_inner());
        let i = q.iter().position(|j| j.unique() == unique && cancel(j))?;
        let job = q.remove(i);
        self.backlog_len.store(q.len(), SeqCst);
        job
    }

    /// Drops every queued request (the connection ended).
    pub(crate) fn clear_backlog(&self) {
        let mut q = self.backlog.lock().unwrap_or_else(|e| e.into_inner());
        q.clear();
        self.backlog_len.store(0, SeqCst);
    }

    /// Whether the connection is gone ([`Pool::end`]).
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(SeqCst)
    }

    /// The connection is gone: the manager starts no more threads.
    pub(crate) fn end(&self) {
        self.ended.store(true, SeqCst);
        self.notify_manager();
    }

    /// Calls a stop off while the pool still runs: `unstop` (which clears
    /// the stop flags) runs under the manager's lock, and the manager starts
    /// the floor's threads again, even if the last one is exiting now.
    /// `false`, and `unstop` not called, when the manager has returned
    /// already: the stop stands.
    pub(crate) fn resume(&self, unstop: impl FnOnce()) -> bool {
        let _guard = self.manager.lock().unwrap_or_else(|e| e.into_inner());
        if self.finished.load(SeqCst) {
            return false;
        }
        unstop();
        self.refill.store(true, SeqCst);
        self.wake.notify_all();
        true
    }

    pub(crate) fn notify_manager(&self) {
        drop(self.manager.lock().unwrap_or_else(|e| e.into_inner()));
        self.wake.notify_all();
    }

    /// The manager's loop: starts a thread with `start` whenever the pool
    /// stays saturated for `grow_after` while below the cap plus the
    /// reader; returns when no thread is left. Sleeps without a timeout
    /// unless a saturation is being watched, or the session is `stopping`:
    /// then it `kick`s the threads again every [`KICK_EVERY`] until they
    /// are gone (a wake-up signal that lands just before a thread enters
    /// `read(2)` is lost).
    pub(crate) fn manage(
        &self,
        mut start: impl FnMut() -> bool,
        kick: impl Fn(),
        stopping: impl Fn() -> bool,
    ) {
        let mut guard = self.manager.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.refill.swap(false, SeqCst) && !self.ended.load(SeqCst) {
                drop(guard);
                while self.live.load(SeqCst) < self.cfg.floor.max(1) && start() {}
                guard = self.manager.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            if self.live.load(SeqCst) == 0 {
                self.finished.store(true, SeqCst);
                return;
            }
            if stopping() {
                kick();
                guard = self
                    .wake
                    .wait_timeout(guard, KICK_EVERY)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                continue;
            }
            let since = self.saturated_since.load(SeqCst);
            let room = self.live.load(SeqCst) < self.cfg.slots();
            if since == 0 || !room || self.ended.load(SeqCst) {
                self.watching.store(false, SeqCst);
                // A saturation that began while we stopped watching.
                if self.saturated_since.load(SeqCst) != 0 && room && !self.ended.load(SeqCst) {
                    self.watching.store(true, SeqCst);
                    continue;
                }
                guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let deadline = Duration::from_nanos(since - 1) + self.cfg.grow_after;
            let now = self.epoch.elapsed();
            if now >= deadline && self.hot.idle.load(SeqCst) > 0 {
                // A thread went back to reading, and the mark is stale:
                // set by a thread that found no other idle a moment
                // before one came back (see `leave_idle`).
                let _ = self.saturated_since.compare_exchange(since, 0, SeqCst, SeqCst);
                continue;
            }
            if now >= deadline {
                drop(guard);
                // Threads an earlier window found to spare are needed now.
                self.surplus.store(0, SeqCst);
                log::info!(
                    "all {} threads of the pool are busy; starting another",
                    self.live.load(SeqCst)
                );
                if !start() {
                    // Could not start one: do not retry before the next saturation.
                    let _ = self.saturated_since.compare_exchange(since, 0, SeqCst, SeqCst);
                }
                guard = self.manager.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            guard = self
                .wake
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Job;
    impl Queued for Job {
        fn unique(&self) -> u64 {
            0
        }
    }

    #[test]
    fn the_manager_grows_on_a_true_saturation_only() {
        let pool: Pool<Job> = Pool::new(PoolConfig {
            floor: 2,
            max: 8,
            grow_after: Duration::from_millis(5),
            idle_timeout: Duration::from_secs(600),
        });
        let (a, b) = (pool.begin_start().unwrap(), pool.begin_start().unwrap());
        let started = Mutex::new(Vec::new());
        let stop = AtomicBool::new(false);
        let (on_stale, on_true, mark) = std::thread::scope(|s| {
            s.spawn(|| {
                let start = || match pool.begin_start() {
                    Some(i) => {
                        started.lock().unwrap().push(i);
                        true
                    }
                    None => false,
                };
                pool.manage(start, || {}, || stop.load(SeqCst))
            });
            // One thread takes a request while the other still waits, and a
            // saturation mark is left behind, as the race between one thread
            // leaving the idle count and another coming back could leave it.
            pool.leave_idle();
            pool.saturated_since.store(1, SeqCst);
            pool.notify_manager();
            std::thread::sleep(Duration::from_millis(100));
            let on_stale = started.lock().unwrap().len();
            let mark = pool.saturated_since.load(SeqCst);
            // Now the other takes one too: saturated, and one thread starts
            // (it counts as idle, which ends the saturation).
            pool.leave_idle();
            let until = Instant::now() + Duration::from_secs(10);
            while started.lock().unwrap().len() == on_stale && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(50));
            let on_true = started.lock().unwrap().len() - on_stale;
            // Every thread ends, whatever was seen: the manager returns.
            stop.store(true, SeqCst);
            pool.enter_idle();
            pool.enter_idle();
            for index in [a, b].into_iter().chain(started.lock().unwrap().drain(..)) {
                pool.leave_idle_quietly();
                pool.exited(index);
            }
            (on_stale, on_true, mark)
        });
        assert_eq!(on_stale, 0, "threads started while one was idle");
        assert_eq!(mark, 0, "the stale mark was not cleared");
        assert_eq!(on_true, 1, "threads started on one saturation");
    }
}
