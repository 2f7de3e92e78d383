//! Deferred replies: a handler that has to wait for something other
//! processes control (a lock another process holds, a lease) gives its
//! reply handle to a helper thread and returns at once, so that the wait
//! holds no worker and no io_uring queue thread.
//!
//! [`crate::RequestContext::defer`] runs a closure with the reply handle on
//! a bounded pool of helper threads. Each accepted wait gets a thread of its
//! own at once (a wait never queues behind another one: the wait that would
//! release a lock could otherwise be stuck behind those waiting for it).
//!
//! One accounting, `Helpers`, counts the waits of both transports under
//! one lock that only deferring requests (and ending waits) take. A wait
//! draws on pools, and one caller uid may hold only a share of each:
//!
//! - the session's `max_deferred` waits, of which one uid may hold
//!   `max_deferred_per_uid`, and never more than half ([`share`]);
//! - over io_uring, the entries of the request's queue: a wait keeps its
//!   ring entry until it is answered, and the kernel sends a CPU's requests
//!   to that CPU's queue only, so only some of a queue's entries may wait
//!   (the rest stay for other requests of that CPU), and one uid may hold
//!   at most half of those ([`share`]).
//!
//! So one user's waiters, however many, leave another user's waits room
//! on every pool; and a uid that holds no wait of the session gets one
//! even when the others hold all `max_deferred` (on `/dev/fuse`; over
//! io_uring a queue's entries are a hard bound): every user can wait for a
//! lock, whatever any number of other users hold, at the cost of one
//! helper thread per such user. Beyond a limit the handle comes back in [`Refused`] and
//! the handler answers with the error it finds right (`ENOLCK` for a lock).
//!
//! An INTERRUPT for a deferred request marks its [`Wait`] interrupted and
//! sends the session's wake-up signal to the helper thread running it, so
//! that a blocking system call there (`fcntl(F_SETLKW)`, `flock`) returns
//! `EINTR`; the closure answers `EINTR` then. A signal that lands between
//! the closure's last [`Wait::is_interrupted`] check and the start of its
//! blocking call would be lost, so the signal is sent again, with growing
//! pauses, until the wait ends (see `rekick`). A helper thread that has
//! had nothing to do for the session's idle timeout ends.

use crate::signal::{self, this_thread};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Waits at once in a session, unless configured.
pub const DEFAULT_MAX_DEFERRED: usize = 256;
/// Waits at once of one caller uid, unless configured.
pub const DEFAULT_MAX_DEFERRED_PER_UID: usize = 32;

/// How many of a pool of `pool` waits one caller uid may hold, at most
/// `per_uid`: half of the pool (rounded down), so that the other half stays
/// for other users; one if the pool has a single place (no user would get
/// more by refusing it).
pub fn share(pool: usize, per_uid: usize) -> usize {
    per_uid.min((pool / 2).max(pool.min(1)))
}

/// Why [`crate::RequestContext::defer`] did not take a wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefuseReason {
    /// The caller's uid already holds its share of the session's waits
    /// (`max_deferred_per_uid`, at most half of `max_deferred`).
    PerUid,
    /// The session already holds `max_deferred` waits.
    Session,
    /// The request's io_uring queue has no entry to spare for another wait.
    QueueEntries,
    /// The caller's uid already holds its share (half) of the entries its
    /// io_uring queue lets waits hold.
    QueueShare,
    /// The session is ending, or no helper thread could be started.
    Unavailable,
}

/// A deferral that was refused: the reply handle, to answer now.
#[derive(Debug)]
pub struct Refused<R> {
    /// The reply handle, unanswered.
    pub reply: R,
    /// Why.
    pub reason: RefuseReason,
}

impl<R> Refused<R> {
    /// The reply handle.
    pub fn into_reply(self) -> R {
        self.reply
    }
}

type Hook = Box<dyn FnOnce() + Send>;

pub(crate) struct WaitState {
    interrupted: AtomicBool,
    /// The helper thread running the wait, while it runs.
    thread: Mutex<Option<libc::pthread_t>>,
    /// What the closure asked to run on an interrupt.
    hook: Mutex<Option<Hook>>,
}

impl WaitState {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            interrupted: AtomicBool::new(false),
            thread: Mutex::new(None),
            hook: Mutex::new(None),
        })
    }

    /// Marks the wait interrupted and interrupts the system call of the
    /// thread running it; keeps interrupting it until the wait ends.
    pub(crate) fn interrupt(self: &Arc<Self>) {
        self.interrupted.store(true, Ordering::Release);
        let running = self.signal_thread();
        let hook = self.hook.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = hook {
            h();
        }
        if running {
            rekick::watch(self.clone());
        }
    }

    /// Signals the thread running the wait, if one still does; says whether
    /// one did.
    fn signal_thread(&self) -> bool {
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = *t {
            signal::wake(t);
            true
        } else {
            false
        }
    }
}

/// Sends the wake-up signal again to interrupted waits that are still
/// running. A signal delivered just before the closure enters its blocking
/// call is spent before the call starts; the call would then block until the
/// lock is free, not until the caller gave up. One thread, started when the
/// first interrupted wait outlives its first signal and ended when no such
/// wait is left, repeats the signal after 1, 2, 4, … ms (at most 100 ms
/// apart). It exists only while an interrupted wait is still running, so an
/// idle session has no such thread and no such wake-ups.
pub(crate) mod rekick {
    use super::WaitState;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    static WATCHED: Mutex<Option<Vec<Arc<WaitState>>>> = Mutex::new(None);

    /// Keeps signalling `w`'s thread until it leaves the wait.
    pub(crate) fn watch(w: Arc<WaitState>) {
        let mut g = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(list) = g.as_mut() {
            list.push(w);
            return;
        }
        *g = Some(vec![w]);
        drop(g);
        let spawned = std::thread::Builder::new().name("fuse-rekick".into()).spawn(run);
        if let Err(e) = spawned {
            log::warn!("cannot start the thread that repeats interrupt signals ({e})");
            *WATCHED.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    fn run() {
        let mut pause = Duration::from_millis(1);
        loop {
            std::thread::sleep(pause);
            let mut g = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
            let Some(list) = g.as_mut() else { return };
            list.retain(|w| w.signal_thread());
            if list.is_empty() {
                *g = None;
                return;
            }
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}

/// What a deferred closure can ask about its request.
pub struct Wait {
    state: Arc<WaitState>,
    uid: u32,
    unique: u64,
}

impl Wait {
    /// Whether the kernel asked to interrupt the request. Check it before
    /// blocking, and when a blocking call returns `EINTR`.
    pub fn is_interrupted(&self) -> bool {
        self.state.interrupted.load(Ordering::Acquire)
    }

    /// Runs `cb` once when the request is interrupted (at once if it
    /// already is), on the thread that reads the INTERRUPT: keep it short.
    /// For waits that no signal ends, such as a condition variable: `cb`
    /// wakes the waiter, which then sees [`Wait::is_interrupted`]. Take the
    /// waiter's lock in `cb` before notifying, or the wake-up can fall
    /// between the waiter's check and its wait.
    pub fn on_interrupt(&self, cb: impl FnOnce() + Send + 'static) {
        let mut hook = self.state.hook.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_interrupted() {
            drop(hook);
            cb();
        } else {
            *hook = Some(Box::new(cb));
        }
    }

    /// The caller's uid.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The request's unique id.
    pub fn unique(&self) -> u64 {
        self.unique
    }
}

impl std::fmt::Debug for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wait")
            .field("unique", &self.unique)
            .field("uid", &self.uid)
            .field("interrupted", &self.is_interrupted())
            .finish()
    }
}

/// The ring entries of one io_uring queue that waits may hold: a deferred
/// request keeps its entry until it is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QueueEntries {
    /// The queue's index.
    pub(crate) queue: usize,
    /// How many of its entries waits may hold at once.
    pub(crate) max: usize,
    /// How many of its entries waits may hold at once counting the first
    /// wait of each uid that holds none on the queue: beyond `max`, short
    /// of the few entries kept for requests that never wait.
    pub(crate) first_waits: usize,
}

type Task = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct State {
    queue: VecDeque<Task>,
    idle: usize,
    live: usize,
    running: usize,
    per_uid: HashMap<u32, usize>,
    /// io_uring: the entries waits hold, by queue.
    queue_waits: HashMap<usize, usize>,
    /// io_uring: the entries waits hold, by queue and uid.
    queue_uid_waits: HashMap<(usize, u32), usize>,
    waits: HashMap<u64, Arc<WaitState>>,
    next_id: u64,
    closed: bool,
}

/// A place taken for one wait; dropping it unused gives the place back.
pub(crate) struct Reservation {
    id: u64,
    state: Arc<(Mutex<State>, Condvar)>,
    wait: Wait,
    queue: Option<usize>,
}

impl Reservation {
    fn run(self, f: impl FnOnce(&Wait)) {
        let state = &self.wait.state;
        *state.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(this_thread());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&self.wait)));
        // After this no INTERRUPT signals this thread for this wait.
        *state.thread.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if r.is_err() {
            log::error!("a deferred wait for request {} panicked", self.wait.unique);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut st = self.state.0.lock().unwrap_or_else(|e| e.into_inner());
        st.running -= 1;
        st.waits.remove(&self.id);
        let uid = self.wait.uid;
        give_back(&mut st.per_uid, uid);
        if let Some(q) = self.queue {
            give_back(&mut st.queue_waits, q);
            give_back(&mut st.queue_uid_waits, (q, uid));
        }
    }
}

/// Counts one place of `key` taken.
fn take<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: K) {
    *counts.entry(key).or_insert(0) += 1;
}

/// Counts one place of `key` given back, forgetting keys that hold none.
fn give_back<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: K) {
    if let Some(n) = counts.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(&key);
        }
    }
}

/// The helper threads of a session.
pub(crate) struct Helpers {
    max: usize,
    per_uid: usize,
    idle_timeout: Duration,
    state: Arc<(Mutex<State>, Condvar)>,
}

/// What [`Helpers::submit`] needs besides the closure.
pub(crate) struct Submission {
    pub(crate) uid: u32,
    pub(crate) unique: u64,
    /// io_uring: the request's queue, whose entries the wait holds.
    pub(crate) queue: Option<QueueEntries>,
    pub(crate) wait: Arc<WaitState>,
}

impl Helpers {
    pub(crate) fn new(max: usize, per_uid: usize, idle_timeout: Duration) -> Self {
        let max = if max == 0 { DEFAULT_MAX_DEFERRED } else { max };
        let per_uid = if per_uid == 0 {
            DEFAULT_MAX_DEFERRED_PER_UID
        } else {
            per_uid
        };
        Self {
            max,
            per_uid,
            idle_timeout,
            state: Arc::new((Mutex::new(State::default()), Condvar::new())),
        }
    }

    /// Takes a place for a wait, or says why there is none.
    pub(crate) fn reserve(&self, sub: Submission) -> Result<Reservation, RefuseReason> {
        let (lock, _) = &*self.state;
        let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
        if st.closed {
            return Err(RefuseReason::Unavailable);
        }
        let held = |n: Option<&usize>| n.copied().unwrap_or(0);
        let mine = held(st.per_uid.get(&sub.uid));
        // A uid that holds no wait gets one beyond the session's bound:
        // whatever other users hold, each can wait for a lock.
        if st.running >= self.max && mine > 0 {
            return Err(RefuseReason::Session);
        }
        if mine >= share(self.max, self.per_uid) {
            return Err(RefuseReason::PerUid);
        }
        if let Some(q) = sub.queue {
            // As on the session's bound, a uid that holds no wait on this
            // queue gets one beyond the queue's wait entries, while some
            // entries stay for requests that do not wait.
            let waits = held(st.queue_waits.get(&q.queue));
            let first = !st.queue_uid_waits.contains_key(&(q.queue, sub.uid));
            if waits >= q.max && !(first && waits < q.first_waits) {
                return Err(RefuseReason::QueueEntries);
            }
            if held(st.queue_uid_waits.get(&(q.queue, sub.uid))) >= share(q.max, self.per_uid) {
                return Err(RefuseReason::QueueShare);
            }
            take(&mut st.queue_waits, q.queue);
            take(&mut st.queue_uid_waits, (q.queue, sub.uid));
        }
        st.running += 1;
        take(&mut st.per_uid, sub.uid);
        let id = st.next_id;
        st.next_id += 1;
        st.waits.insert(id, sub.wait.clone());
        Ok(Reservation {
            id,
            state: self.state.clone(),
            wait: Wait {
                state: sub.wait,
                uid: sub.uid,
                unique: sub.unique,
            },
            queue: sub.queue.map(|q| q.queue),
        })
    }

    /// Runs `f` on a helper thread in the place `r` reserved (on the
    /// calling thread if no helper thread can be started).
    pub(crate) fn start(&self, r: Reservation, f: impl FnOnce(&Wait) + Send + 'static) {
        let task: Task = Box::new(move || r.run(f));
        let (lock, cv) = &*self.state;
        let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
        if st.idle > st.queue.len() {
            st.queue.push_back(task);
            cv.notify_one();
            return;
        }
        st.live += 1;
        drop(st);
        let slot = Arc::new(Mutex::new(Some(task)));
        let theirs = slot.clone();
        let state = self.state.clone();
        let idle_timeout = self.idle_timeout;
        let spawned = std::thread::Builder::new()
            .name("fuse-deferred".into())
            .spawn(move || {
                let first = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
                helper(&state, first, idle_timeout)
            });
        if let Err(e) = spawned {
            log::warn!("cannot start a helper thread for a deferred wait ({e}); waiting on this thread");
            lock.lock().unwrap_or_else(|e| e.into_inner()).live -= 1;
            let task = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(task) = task {
                task();
            }
        }
    }

    /// Interrupts every wait (the session is ending) and refuses new ones.
    pub(crate) fn close(&self) {
        let (lock, cv) = &*self.state;
        let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
        st.closed = true;
        for w in st.waits.values() {
            w.interrupt();
        }
        cv.notify_all();
    }
}

/// One helper thread: runs its first task, then waits for more until it has
/// been idle for `idle_timeout`.
fn helper(state: &(Mutex<State>, Condvar), first: Option<Task>, idle_timeout: Duration) {
    signal::install_wake_handler();
    if let Some(first) = first {
        first();
    }
    let (lock, cv) = state;
    let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(task) = st.queue.pop_front() {
            drop(st);
            task();
            st = lock.lock().unwrap_or_else(|e| e.into_inner());
            continue;
        }
        if st.closed {
            break;
        }
        st.idle += 1;
        let (g, timeout) = cv
            .wait_timeout(st, idle_timeout)
            .unwrap_or_else(|e| e.into_inner());
        st = g;
        st.idle -= 1;
        if timeout.timed_out() && st.queue.is_empty() {
            break;
        }
    }
    st.live -= 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn sub(uid: u32, queue: Option<QueueEntries>) -> Submission {
        Submission {
            uid,
            unique: 1,
            queue,
            wait: WaitState::new(),
        }
    }

    #[test]
    fn a_share_is_half_a_pool_at_most_the_per_uid_limit() {
        assert_eq!(share(0, 32), 0);
        // A single place: refusing it would give nobody more.
        assert_eq!(share(1, 32), 1);
        assert_eq!(share(2, 32), 1);
        assert_eq!(share(7, 32), 3);
        assert_eq!(share(256, 32), 32);
        assert_eq!(share(256, 1000), 128);
        assert_eq!(share(6, 1), 1);
    }

    /// Over io_uring one uid's waits take at most half of the entries its
    /// queue lets waits hold; another uid's wait on that queue still gets
    /// one, other queues are counted apart, and a place given back is
    /// taken again.
    #[test]
    fn one_uid_leaves_half_of_a_queues_wait_entries_to_others() {
        let helpers = Helpers::new(256, 32, Duration::from_secs(1));
        let q = |queue| QueueEntries {
            queue,
            max: 6,
            first_waits: 6,
        };
        let (q0, q1) = (Some(q(0)), Some(q(1)));
        let mut greedy: Vec<Reservation> = (0..3)
            .map(|_| helpers.reserve(sub(1000, q0)).expect("within the share"))
            .collect();
        assert_eq!(
            helpers.reserve(sub(1000, q0)).err(),
            Some(RefuseReason::QueueShare)
        );
        // Another queue has a share of its own for the same uid.
        let other_queue = helpers.reserve(sub(1000, q1)).expect("another queue");
        // Another uid waits on the queue the first one filled its share of.
        let others: Vec<Reservation> = (0..3)
            .map(|_| helpers.reserve(sub(2000, q0)).expect("another uid"))
            .collect();
        // Now the queue's wait entries are all held.
        assert_eq!(
            helpers.reserve(sub(3000, q0)).err(),
            Some(RefuseReason::QueueEntries)
        );
        // A `/dev/fuse` request's wait holds no entry.
        let dev = helpers.reserve(sub(1000, None)).expect("no queue");
        drop(greedy.pop());
        let late = helpers
            .reserve(sub(3000, q0))
            .expect("a place given back is free again");
        drop((greedy, others, other_queue, dev, late));
        let st = helpers.state.0.lock().unwrap();
        assert_eq!(st.running, 0);
        assert!(st.per_uid.is_empty() && st.queue_waits.is_empty() && st.queue_uid_waits.is_empty());
    }

    /// Over io_uring, a uid that holds no wait on a queue whose wait
    /// entries are all held still gets one, until only the entries kept
    /// for requests that never wait are left; its second wait is refused.
    #[test]
    fn a_uid_holding_no_wait_on_a_queue_gets_one_beyond_its_wait_entries() {
        let helpers = Helpers::new(256, 32, Duration::from_secs(1));
        let q0 = Some(QueueEntries {
            queue: 0,
            max: 4,
            first_waits: 6,
        });
        let mut held: Vec<Reservation> = [1000, 1000, 2000, 2000]
            .into_iter()
            .map(|uid| helpers.reserve(sub(uid, q0)).expect("within the shares"))
            .collect();
        assert_eq!(
            helpers.reserve(sub(1000, q0)).err(),
            Some(RefuseReason::QueueEntries)
        );
        for uid in [3000, 4000] {
            held.push(helpers.reserve(sub(uid, q0)).expect("a first wait"));
            assert_eq!(
                helpers.reserve(sub(uid, q0)).err(),
                Some(RefuseReason::QueueEntries),
                "uid {uid}'s second wait"
            );
        }
        assert_eq!(
            helpers.reserve(sub(5000, q0)).err(),
            Some(RefuseReason::QueueEntries),
            "the entries kept for requests that never wait"
        );
        drop(held);
        assert!(helpers.state.0.lock().unwrap().queue_waits.is_empty());
    }

    /// The session's waits: one uid takes at most `max_deferred_per_uid`
    /// and never more than half of `max_deferred`.
    #[test]
    fn one_uid_leaves_half_of_the_sessions_waits_to_others() {
        let helpers = Helpers::new(4, 32, Duration::from_secs(1));
        let a: Vec<Reservation> = (0..2)
            .map(|_| helpers.reserve(sub(1000, None)).expect("within the share"))
            .collect();
        assert_eq!(helpers.reserve(sub(1000, None)).err(), Some(RefuseReason::PerUid));
        let b: Vec<Reservation> = (0..2)
            .map(|_| helpers.reserve(sub(2000, None)).expect("another uid"))
            .collect();
        // A third uid, holding none, still gets one; its second is refused.
        let c = helpers.reserve(sub(3000, None)).expect("a uid's first wait");
        assert_eq!(
            helpers.reserve(sub(3000, None)).err(),
            Some(RefuseReason::Session)
        );
        drop((a, b, c));
        let helpers = Helpers::new(256, 2, Duration::from_secs(1));
        let a: Vec<Reservation> = (0..2)
            .map(|_| helpers.reserve(sub(1000, None)).expect("within the limit"))
            .collect();
        assert_eq!(helpers.reserve(sub(1000, None)).err(), Some(RefuseReason::PerUid));
        drop(a);
        assert!(helpers.reserve(sub(1000, None)).is_ok());
    }

    /// The INTERRUPT's signal is spent while the closure is between its
    /// check and its blocking call (here: inside a channel receive, which
    /// retries after the handler); the blocking read that follows must still
    /// end with EINTR, by a repeated signal.
    #[test]
    fn an_interrupt_just_before_the_blocking_call_is_not_lost() {
        signal::install_wake_handler();
        let helpers = Helpers::new(4, 4, Duration::from_secs(1));
        let wait = WaitState::new();
        let r = helpers
            .reserve(Submission {
                uid: 1000,
                unique: 7,
                queue: None,
                wait: wait.clone(),
            })
            .expect("a place for the wait");
        let (about_to_block, checked) = mpsc::channel();
        let (go, proceed) = mpsc::channel::<()>();
        let (done, result) = mpsc::channel();
        helpers.start(r, move |w| {
            let interrupted_before = w.is_interrupted();
            about_to_block.send(()).unwrap();
            proceed.recv().unwrap();
            let (rd, wr) = nix::unistd::pipe().unwrap();
            let mut buf = [0u8; 1];
            let res = nix::unistd::read(&rd, &mut buf);
            drop(wr);
            done.send((interrupted_before, res, w.is_interrupted())).unwrap();
        });
        checked
            .recv_timeout(Duration::from_secs(10))
            .expect("the wait started");
        // The signal is pending once this returns, so the thread takes it in
        // the receive (or on its way out of it), before it starts the read.
        wait.interrupt();
        go.send(()).unwrap();
        let (before, res, after) = result
            .recv_timeout(Duration::from_secs(10))
            .expect("the blocking read was not interrupted: the signal was lost");
        assert!(!before);
        assert_eq!(res, Err(nix::errno::Errno::EINTR));
        assert!(after);
    }
}
