//! How one request's future runs: the executor it goes to ([`Spawn`]), the
//! bound on futures in flight that makes the readers wait, shared by uid
//! ([`Limit`]), the
//! registry that cancels them all when the session stops ([`Registry`]),
//! and the wrapper ([`run`]) that drops the future on INTERRUPT, turns a
//! panic into `EIO` and answers exactly once.
//!
//! Exactly once holds because only the wrapper answers, from one poll at
//! a time: an INTERRUPT only marks the task and wakes it; the next poll
//! drops the future and answers `EINTR`, unless the future completed first
//! (then its answer goes out, and the late mark is never read).

use crate::layers::core::Answer;
use crate::share::{Place, Shares};
use fuse_proto::Errno;
use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Where [`AsyncFs`](crate::layers::asyncfs::AsyncFs) runs the futures of
/// requests: an executor's spawn function. The core is runtime-agnostic;
/// with the `tokio` feature, `TokioSpawner`
/// spawns on a Tokio runtime.
///
/// `spawn` must not wait for the task: it is called on the thread that
/// reads requests. The task answers the request itself; if the executor
/// drops it unfinished (a runtime shutting down), the request is answered
/// `EIO`.
pub trait Spawn: Send + Sync + 'static {
    /// Runs `task` to completion, on any thread.
    fn spawn<T: Future<Output = ()> + Send + 'static>(&self, task: T);

    /// Runs `f` in the executor's context on the calling thread. The
    /// adapter polls each request's future once in it, on the thread that
    /// read the request, and spawns only a future that is still pending:
    /// one that completes at once costs no hand-off. An executor whose
    /// futures need a thread-local context to be created or first polled
    /// in (Tokio's timers and sockets) enters it here; the default runs
    /// `f` as it is.
    fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        f()
    }
}

/// Locks `m`, also after a panic while it was held.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How often a reader waiting at the bound looks whether the session stops
/// or its request was interrupted.
const STOP_CHECK: Duration = Duration::from_millis(20);

/// The bound on futures in flight, shared by caller uid
/// ([`crate::share`]). Taking an open place costs one atomic add; only a
/// reader that finds none for its uid waits, on a condition variable.
pub(crate) struct Limit {
    places: Shares,
    waiting: AtomicUsize,
    high: AtomicUsize,
    lock: Mutex<()>,
    freed: Condvar,
}

impl Limit {
    pub(crate) fn new(max: usize) -> Limit {
        Limit {
            places: Shares::new(max),
            waiting: AtomicUsize::new(0),
            high: AtomicUsize::new(0),
            lock: Mutex::new(()),
            freed: Condvar::new(),
        }
    }

    /// Takes a place for a request of `uid`, waiting while none is free
    /// to it; says why not if `gave_up` named a reason meanwhile (looked
    /// at every [`STOP_CHECK`] while waiting).
    pub(crate) fn acquire<W>(&self, uid: u32, gave_up: impl Fn() -> Option<W>) -> Result<Place, W> {
        loop {
            if let Ok(place) = self.places.take(uid) {
                let n = self.places.used();
                if n > self.high.load(SeqCst) {
                    self.high.fetch_max(n, SeqCst);
                }
                return Ok(place);
            }
            self.waiting.fetch_add(1, SeqCst);
            let guard = lock(&self.lock);
            let refused = self.places.refuses(uid);
            if refused && let Some(why) = gave_up() {
                self.waiting.fetch_sub(1, SeqCst);
                return Err(why);
            }
            if refused {
                drop(
                    self.freed
                        .wait_timeout(guard, STOP_CHECK)
                        .unwrap_or_else(|e| e.into_inner()),
                );
            } else {
                drop(guard);
            }
            self.waiting.fetch_sub(1, SeqCst);
        }
    }

    pub(crate) fn release(&self, place: Place) {
        self.places.give_back(place);
        if self.waiting.load(SeqCst) > 0 {
            drop(lock(&self.lock));
            // All of them: the first to wake may be a uid at its share.
            self.freed.notify_all();
        }
    }

    /// Futures in flight now.
    pub(crate) fn in_flight(&self) -> usize {
        self.places.used()
    }

    /// The most futures in flight at once so far.
    pub(crate) fn high_water(&self) -> usize {
        self.high.load(SeqCst)
    }

    pub(crate) fn max(&self) -> usize {
        self.places.max()
    }
}

/// What the interrupt callback, the registry and the wrapper share about
/// one running future.
pub(crate) struct TaskState {
    cancelled: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl TaskState {
    pub(crate) fn new() -> Arc<TaskState> {
        Arc::new(TaskState {
            cancelled: AtomicBool::new(false),
            waker: Mutex::new(None),
        })
    }

    /// Marks the task cancelled and wakes it: its next poll drops the
    /// future and answers `EINTR`.
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, SeqCst);
        let w = lock(&self.waker).take();
        if let Some(w) = w {
            w.wake();
        }
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled.load(SeqCst)
    }

    /// Polls `fut` unless the task was cancelled, catching a panic.
    fn poll<T>(&self, fut: Pin<&mut impl Future<Output = T>>, cx: &mut Context<'_>) -> Poll<Outcome<T>> {
        if self.is_cancelled() {
            return Poll::Ready(Outcome::Cancelled);
        }
        {
            let mut w = lock(&self.waker);
            match &*w {
                Some(old) if old.will_wake(cx.waker()) => {}
                _ => *w = Some(cx.waker().clone()),
            }
        }
        // A cancel between the check and storing the waker found no waker.
        if self.is_cancelled() {
            return Poll::Ready(Outcome::Cancelled);
        }
        poll_caught(fut, cx)
    }
}

/// Polls `fut` once, turning a panic into [`Outcome::Panicked`].
fn poll_caught<T>(fut: Pin<&mut impl Future<Output = T>>, cx: &mut Context<'_>) -> Poll<Outcome<T>> {
    match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
        Ok(Poll::Ready(v)) => Poll::Ready(Outcome::Done(v)),
        Ok(Poll::Pending) => Poll::Pending,
        Err(p) => Poll::Ready(Outcome::Panicked(panic_text(&*p))),
    }
}

enum Outcome<T> {
    Done(T),
    Cancelled,
    Panicked(String),
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".into())
}

const SHARDS: usize = 16;

/// The cancellable tasks in flight, sharded by request so that no lock is
/// shared by all requests; [`Registry::close`] cancels them all.
#[derive(Default)]
pub(crate) struct Registry {
    shards: [Mutex<Shard>; SHARDS],
    closed: AtomicBool,
}

#[derive(Default)]
struct Shard {
    tasks: Vec<Option<Arc<TaskState>>>,
    free: Vec<usize>,
}

impl Registry {
    /// Registers `task` (request `unique`); cancels it at once if the
    /// registry is closed.
    fn insert(&self, unique: u64, task: &Arc<TaskState>) -> (usize, usize) {
        let shard = (unique / 2) as usize % SHARDS;
        let mut s = lock(&self.shards[shard]);
        let index = match s.free.pop() {
            Some(i) => {
                s.tasks[i] = Some(task.clone());
                i
            }
            None => {
                s.tasks.push(Some(task.clone()));
                s.tasks.len() - 1
            }
        };
        drop(s);
        if self.closed.load(SeqCst) {
            task.cancel();
        }
        (shard, index)
    }

    fn remove(&self, (shard, index): (usize, usize)) {
        let mut s = lock(&self.shards[shard]);
        s.tasks[index] = None;
        s.free.push(index);
    }

    /// Cancels every task in flight, and every one registered from now on.
    pub(crate) fn close(&self) {
        self.closed.store(true, SeqCst);
        for shard in &self.shards {
            let tasks: Vec<_> = lock(shard).tasks.iter().flatten().cloned().collect();
            for t in tasks {
                t.cancel();
            }
        }
    }
}

/// What the adapter shares with every task it starts.
pub(crate) struct Core {
    pub(crate) limit: Limit,
    pub(crate) registry: Registry,
}

/// A place in the bound, taken before a request's future is made and held
/// until the request is answered, however that ends (the executor dropping
/// the task included): gives the place back and leaves the registry.
pub(crate) struct Held {
    core: Arc<Core>,
    place: Place,
    key: Option<(usize, usize)>,
}

impl Held {
    /// Holds the place [`Limit::acquire`] took.
    pub(crate) fn new(core: Arc<Core>, place: Place) -> Held {
        Held {
            core,
            place,
            key: None,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.core.registry.remove(key);
        }
        self.core.limit.release(self.place);
    }
}

/// Answers `reply` as `outcome` says.
fn finish<R: Answer<T>, T>(reply: R, outcome: Outcome<Result<T, Errno>>) {
    match outcome {
        Outcome::Done(v) => reply.answer(v),
        Outcome::Cancelled => reply.fail(Errno::EINTR),
        Outcome::Panicked(what) => {
            let (op, unique) = reply.request();
            log::error!("{op} future for request {unique} panicked: {what}");
            reply.record_panic(what);
            reply.fail(Errno::EIO)
        }
    }
}

/// The first poll of a request's future, on the thread that read the
/// request: a future that completes at once (most metadata operations of a
/// cache, a memory store) is answered here, without the executor's round
/// trip; `Some` gives back what a pending one needs to be spawned.
pub(crate) fn poll_first<R: Answer<T>, T>(
    fut: Pin<&mut impl Future<Output = Result<T, Errno>>>,
    reply: R,
    held: Held,
) -> Option<(R, Held)> {
    // The executor polls the task again at once when it is spawned, with
    // its own waker: a wake-up meant for this one is not needed.
    match poll_caught(fut, &mut Context::from_waker(Waker::noop())) {
        Poll::Pending => Some((reply, held)),
        Poll::Ready(outcome) => {
            finish(reply, outcome);
            drop(held);
            None
        }
    }
}

/// The task of one request whose first poll was pending: polls `fut` until
/// it completes (then answers with its output), is cancelled (drops it,
/// then answers `EINTR`) or panics (drops it, answers `EIO`). `task`, when
/// given, is the state the interrupt callback cancels; it is then
/// registered, so that closing the registry cancels it too.
pub(crate) fn run<R: Answer<T>, T: Send + 'static>(
    mut held: Held,
    task: Option<Arc<TaskState>>,
    reply: R,
    fut: impl Future<Output = Result<T, Errno>> + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    held.key = task
        .as_ref()
        .map(|t| held.core.registry.insert(reply.request().1, t));
    let state = task.unwrap_or_else(TaskState::new);
    async move {
        let outcome = {
            let mut fut = pin!(fut);
            poll_fn(|cx| state.poll(fut.as_mut(), cx)).await
            // The future is dropped here, before any answer goes out.
        };
        finish(reply, outcome);
        drop(held);
    }
}
