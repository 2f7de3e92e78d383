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
//!   handlers at once, shared by caller uid ([`crate::share`]): the last
//!   few slots go to uids that hold none of them, so that one uid's
//!   requests, however many, leave another uid's request a slot at once
//!   (it is parked in its uid's turn, below, only when every slot is
//!   taken); a request of a uid at its share is parked too. One more thread may exist: when all `max_workers`
//!   are busy for `grow_after`, the manager starts it, and a thread that
//!   reads a request while the cap is reached does not serve it. It serves
//!   INTERRUPT, FORGET, BATCH_FORGET and NOTIFY_REPLY at once (they never
//!   wait for a handler) and parks everything else for the next thread
//!   that finishes a handler; an INTERRUPT for a parked request answers
//!   that request `EINTR` at once. So, whatever the handlers do, something
//!   keeps reading `/dev/fuse`: interrupts reach their requests, forgets
//!   are applied, and another user's requests wait their turn instead of
//!   the whole mount hanging.
//! - **Parked requests, by user.** Parked requests are kept by caller uid
//!   and taken in turn, one uid after the other (in arrival order within
//!   one uid), so that one user's thousands of parked requests do not sit
//!   in front of another user's one. They are charged, count and bytes
//!   ([`Queued::charge`]): at most [`MAX_PARKED`] requests and
//!   [`MAX_PARKED_BYTES`] bytes, of which one uid may hold half. A request
//!   beyond its uid's share or the whole bound is never refused: the thread
//!   that read it waits with it until a parked request of that uid (or any,
//!   for the whole bound) is taken, and meanwhile further requests wait in
//!   the kernel's queue, unread, as they would with a daemon that stops
//!   reading.
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

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::share::{Place, Refused, Shares};

/// Most requests parked while every worker is busy at the cap.
pub(crate) const MAX_PARKED: usize = 65536;

/// Most bytes parked requests are charged ([`Queued::charge`]).
pub(crate) const MAX_PARKED_BYTES: usize = 64 << 20;

/// What each parked request is charged besides its own bytes: its place in
/// the queues and its allocation's bookkeeping.
pub(crate) const PARK_OVERHEAD: usize = 64;

/// How often a reader waiting for room among the parked requests looks
/// whether the connection ended.
const ROOM_CHECK: Duration = Duration::from_millis(100);

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

/// What the pool parks: a request, found again by its `unique` when an
/// INTERRUPT names it, kept with the other requests of its caller's uid.
pub(crate) trait Queued {
    fn unique(&self) -> u64;
    /// The caller's uid.
    fn uid(&self) -> u32;
    /// The bytes it holds while parked.
    fn charge(&self) -> usize;
}

/// The parked requests: one queue per uid, and the uids with requests
/// parked in the order they are served.
struct Parked<J> {
    by_uid: HashMap<u32, Share<J>>,
    turn: VecDeque<u32>,
    count: usize,
    bytes: usize,
}

/// One uid's parked requests and what they are charged.
struct Share<J> {
    jobs: VecDeque<J>,
    bytes: usize,
}

impl<J> Default for Parked<J> {
    fn default() -> Self {
        Self {
            by_uid: HashMap::new(),
            turn: VecDeque::new(),
            count: 0,
            bytes: 0,
        }
    }
}

impl<J: Queued> Parked<J> {
    /// Whether `job` fits in the bounds now.
    fn has_room(&self, job: &J) -> bool {
        let charge = job.charge();
        if self.count >= MAX_PARKED || self.bytes + charge > MAX_PARKED_BYTES {
            // An empty park takes any one request, however large.
            return self.count == 0;
        }
        match self.by_uid.get(&job.uid()) {
            None => true,
            Some(s) => s.jobs.len() < MAX_PARKED / 2 && s.bytes + charge <= MAX_PARKED_BYTES / 2,
        }
    }

    fn push(&mut self, job: J) {
        let (uid, charge) = (job.uid(), job.charge());
        let share = self.by_uid.entry(uid).or_insert_with(|| {
            self.turn.push_back(uid);
            Share {
                jobs: VecDeque::new(),
                bytes: 0,
            }
        });
        share.jobs.push_back(job);
        share.bytes += charge;
        self.count += 1;
        self.bytes += charge;
    }

    /// The next uid's oldest request; that uid goes to the back of the turn.
    fn pop(&mut self) -> Option<J> {
        let uid = self.turn.pop_front()?;
        let share = self.by_uid.get_mut(&uid)?;
        let job = share.jobs.pop_front()?;
        if share.jobs.is_empty() {
            self.by_uid.remove(&uid);
        } else {
            self.turn.push_back(uid);
        }
        Some(self.took(job))
    }

    /// The oldest request of the next uid in turn that `slots` gives a
    /// slot to, with that slot; uids at their share keep their turn, and
    /// full slots end the search.
    fn pop_for(&mut self, slots: &Shares) -> Option<(J, Place)> {
        for _ in 0..self.turn.len() {
            let uid = *self.turn.front()?;
            match slots.take(uid) {
                Ok(place) => match self.pop() {
                    Some(job) => return Some((job, place)),
                    None => {
                        slots.give_back(place);
                        return None;
                    }
                },
                Err(Refused::Full) => return None,
                Err(Refused::Share) => self.turn.rotate_left(1),
            }
        }
        None
    }

    /// Counts `job` as no longer parked.
    fn took(&mut self, job: J) -> J {
        let charge = job.charge();
        self.count -= 1;
        self.bytes -= charge;
        if let Some(s) = self.by_uid.get_mut(&job.uid()) {
            s.bytes -= charge;
        }
        job
    }

    /// Takes out the request `unique`, if parked and `cancel` agrees.
    fn remove(&mut self, unique: u64, cancel: impl Fn(&J) -> bool) -> Option<J> {
        let (uid, i) = self.by_uid.iter().find_map(|(uid, s)| {
            let i = s.jobs.iter().position(|j| j.unique() == unique && cancel(j))?;
            Some((*uid, i))
        })?;
        let share = self.by_uid.get_mut(&uid)?;
        let job = share.jobs.remove(i)?;
        if share.jobs.is_empty() {
            self.by_uid.remove(&uid);
            self.turn.retain(|u| *u != uid);
        }
        Some(self.took(job))
    }
}

/// The two counters every request changes, together on a cache line of
/// their own (the thread that changes one changes the other right after).
#[repr(align(128))]
struct Hot {
    /// Threads waiting for (or about to wait for) a request.
    idle: AtomicUsize,
    /// The handler slots, and who holds them.
    busy: Shares,
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
    parked: Mutex<Parked<J>>,
    /// Requests parked (read without the lock by threads looking for one).
    parked_len: AtomicUsize,
    /// A parked request was taken: a reader waiting for room looks again.
    room: Condvar,
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
            hot: Hot {
                idle: AtomicUsize::new(0),
                busy: Shares::new(cfg.max),
                low: AtomicUsize::new(0),
            },
            live: AtomicUsize::new(0),
            saturated_since: AtomicU64::new(0),
            epoch: Instant::now(),
            watching: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            refill: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            parked: Mutex::new(Parked::default()),
            parked_len: AtomicUsize::new(0),
            room: Condvar::new(),
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

    /// Takes a handler slot for a request of `uid`, if fewer than `max`
    /// handlers run and `uid` is within its share ([`crate::share`]).
    pub(crate) fn acquire_busy(&self, uid: u32) -> Option<Place> {
        // One read-modify-write while the open slots last (the common case).
        self.hot.busy.take(uid).ok()
    }

    pub(crate) fn release_busy(&self, slot: Place) {
        self.hot.busy.give_back(slot);
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

    /// Parks a request read at the cap. Waits, while the parked requests
    /// are at their bound or its uid at its share (see the module docs),
    /// until one is taken; gives the request back only if the connection
    /// ends meanwhile or `stopping` becomes true.
    pub(crate) fn park(&self, job: J, stopping: impl Fn() -> bool) -> Result<(), J> {
        let mut p = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        let mut said = false;
        while !p.has_room(&job) {
            if self.is_ended() || stopping() {
                return Err(job);
            }
            if !said {
                said = true;
                log::debug!(
                    "{} requests ({} bytes) are parked, {} of uid {}: reading waits for one to be served",
                    p.count,
                    p.bytes,
                    p.by_uid.get(&job.uid()).map_or(0, |s| s.jobs.len()),
                    job.uid()
                );
            }
            p = self
                .room
                .wait_timeout(p, ROOM_CHECK)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        p.push(job);
        self.parked_len.store(p.count, SeqCst);
        Ok(())
    }

    /// The next parked request (uids in turn, skipping those at their
    /// share of the slots), with a handler slot taken for it; `None` when
    /// nothing is parked that may start now.
    pub(crate) fn take_job(&self) -> Option<(J, Place)> {
        if self.parked_len.load(SeqCst) == 0 || self.hot.busy.full() {
            return None;
        }
        let mut p = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        let job = p.pop_for(&self.hot.busy);
        self.parked_len.store(p.count, SeqCst);
        drop(p);
        if job.is_some() {
            self.room.notify_all();
        }
        job
    }

    /// Removes the parked request `unique`, if it is parked and `cancel`
    /// agrees (a request whose loss would leak, such as RELEASE, stays).
    pub(crate) fn remove_job_if(&self, unique: u64, cancel: impl Fn(&J) -> bool) -> Option<J> {
        if self.parked_len.load(SeqCst) == 0 {
            return None;
        }
        let mut p = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        let job = p.remove(unique, cancel);
        self.parked_len.store(p.count, SeqCst);
        drop(p);
        if job.is_some() {
            self.room.notify_all();
        }
        job
    }

    /// Drops every parked request (the connection ended).
    pub(crate) fn clear_backlog(&self) {
        let mut p = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        *p = Parked::default();
        self.parked_len.store(0, SeqCst);
        drop(p);
        self.room.notify_all();
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
        fn uid(&self) -> u32 {
            0
        }
        fn charge(&self) -> usize {
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

    struct Req(u64, u32, usize);
    impl Queued for Req {
        fn unique(&self) -> u64 {
            self.0
        }
        fn uid(&self) -> u32 {
            self.1
        }
        fn charge(&self) -> usize {
            self.2
        }
    }

    /// Parked requests are served one uid after the other, in order within
    /// a uid; an interrupted one leaves its uid's turn intact.
    #[test]
    fn parked_requests_are_served_by_uid_in_turn() {
        let mut p = Parked::default();
        for (unique, uid) in [(1, 7), (2, 7), (3, 7), (4, 9), (5, 7), (6, 3)] {
            p.push(Req(unique, uid, 100));
        }
        assert_eq!(p.remove(3, |_| true).map(|r| r.0), Some(3));
        assert!(p.remove(3, |_| true).is_none());
        let order: Vec<u64> = std::iter::from_fn(|| p.pop().map(|r| r.0)).collect();
        assert_eq!(order, [1, 4, 6, 2, 5]);
        assert_eq!((p.count, p.bytes, p.by_uid.len(), p.turn.len()), (0, 0, 0, 0));
    }

    /// A thread that finishes a handler passes over the parked requests of
    /// a uid at its share of the slots: the next uid's start.
    #[test]
    fn a_uid_at_its_share_of_slots_leaves_its_turn_to_the_next() {
        let mut p = Parked::default();
        for (unique, uid) in [(1, 7), (2, 7), (3, 9)] {
            p.push(Req(unique, uid, 100));
        }
        let slots = Shares::new(crate::share::SHARED_FROM);
        let held: Vec<Place> = (1..crate::share::SHARED_FROM)
            .map(|_| slots.take(7).expect("uid 7's slots"))
            .collect();
        let (job, slot) = p.pop_for(&slots).expect("uid 9's request");
        assert_eq!((job.0, slot), (3, Place::Reserved(9)));
        assert!(p.pop_for(&slots).is_none(), "every slot is taken");
        held.into_iter().for_each(|s| slots.give_back(s));
        assert_eq!(p.pop_for(&slots).map(|(j, _)| j.0), Some(1));
    }

    /// One uid holds at most half of the parked requests' count and bytes;
    /// another uid still has room then.
    #[test]
    fn one_uid_parks_at_most_half() {
        let mut p = Parked::default();
        for unique in 0..MAX_PARKED as u64 / 2 {
            assert!(p.has_room(&Req(unique, 7, 1)));
            p.push(Req(unique, 7, 1));
        }
        assert!(!p.has_room(&Req(0, 7, 1)), "beyond its count share");
        assert!(p.has_room(&Req(0, 8, 1)));
        let mut p = Parked::default();
        p.push(Req(1, 7, MAX_PARKED_BYTES / 2));
        assert!(!p.has_room(&Req(2, 7, 1)), "beyond its byte share");
        assert!(p.has_room(&Req(2, 8, MAX_PARKED_BYTES / 2)));
        p.push(Req(2, 8, MAX_PARKED_BYTES / 2));
        assert!(!p.has_room(&Req(3, 9, 1)), "beyond the whole bound");
        // An empty park takes any one request, however large.
        assert!(Parked::<Req>::default().has_room(&Req(1, 7, MAX_PARKED_BYTES * 2)));
    }
}
