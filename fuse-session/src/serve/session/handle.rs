//! A handle to a running session ([`SessionHandle`]), usable from any
//! thread: statistics, workers, the transport, what INIT negotiated,
//! handler panics, the notifier, stopping and retiring for a handover;
//! and the state it shares with the session's threads.

use crate::conn::Shared;
use crate::init::Negotiated;
use crate::notify::Notifier;
use crate::signal::Threads;
use crate::stats::{HandlerPanic, Stats};
use crate::transport::TransportInfo;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

pub(super) struct HandleInner {
    pub(super) shared: OnceLock<Arc<Shared>>,
    pub(super) transport: OnceLock<TransportInfo>,
    pub(super) notifier: Notifier,
    pub(super) stop: AtomicBool,
    pub(super) threads: Arc<Threads>,
    pub(super) on_stop: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Wakes the io_uring queue threads, once they run.
    pub(super) ring_waker: Mutex<Option<Box<dyn Fn() + Send>>>,
    /// Stopping to hand the connection over: no DESTROY, no unmount, and
    /// deferred waits are left unanswered for the successor (see
    /// [`SessionHandle::retire`]).
    pub(super) retiring: AtomicBool,
}

/// A handle to a session, usable from any thread while it runs.
#[derive(Clone)]
pub struct SessionHandle(pub(super) Arc<HandleInner>);

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle").finish_non_exhaustive()
    }
}

impl SessionHandle {
    /// Current statistics (empty before INIT).
    pub fn stats(&self) -> Stats {
        self.0
            .shared
            .get()
            .map(|s| Stats::collect(&s.stats, s.uring_base))
            .unwrap_or_default()
    }

    /// The `/dev/fuse` worker threads alive now (0 before INIT): the floor,
    /// more while the pool has grown, and at most `max_workers + 1`.
    pub fn workers(&self) -> usize {
        self.0.shared.get().map_or(0, |s| s.pool.live())
    }

    /// The transport in use, once the session has set it up after INIT.
    pub fn transport(&self) -> Option<TransportInfo> {
        self.0.transport.get().cloned()
    }

    /// What INIT negotiated, once it has.
    pub fn negotiated(&self) -> Option<Negotiated> {
        self.0.shared.get().map(|s| s.negotiated.clone())
    }

    /// The handlers that panicked since the last call (the newest
    /// [`PANICS_KEPT`](crate::stats::PANICS_KEPT) at most), taken: each request was answered `EIO`.
    pub fn take_panics(&self) -> Vec<HandlerPanic> {
        self.0.shared.get().map_or_else(Vec::new, |s| s.panics.take())
    }

    /// The notifier (its calls fail with `NotReady` before INIT).
    pub fn notifier(&self) -> Notifier {
        self.0.notifier.clone()
    }

    /// Asks the session to end: workers finish the request they are serving
    /// and exit. A session that owns its mount also unmounts it, if the
    /// topmost mount on the mountpoint is still its own (see
    /// [`MountGuard::unmount`](crate::mount::MountGuard::unmount)).
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::SeqCst);
        // Pairs with the fence in `Session::shared_state`: either it sees
        // `stop`, or this sees the shared state it published.
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(s) = self.0.shared.get() {
            s.shutdown.store(true, Ordering::Release);
        }
        if let Some(f) = self.0.on_stop.lock().unwrap_or_else(|e| e.into_inner()).take() {
            f();
        }
        self.0.wake_all();
        if let Some(s) = self.0.shared.get() {
            s.pool.notify_manager();
        }
    }

    /// Asks the session to end at a request boundary so that another
    /// process can take its connection over ([`crate::handover`]): workers
    /// finish the request they are serving and exit, and the session ends
    /// without calling the filesystem's `destroy` and without unmounting.
    /// Requests waiting in [`crate::RequestContext::defer`] (lock waits)
    /// are left unanswered: the kernel keeps them, and the successor has
    /// them sent again (`FUSE_NOTIFY_RESEND`). So the process must exit once
    /// [`Session::run`](super::Session::run) has returned, before a deferred wait could answer
    /// twice.
    pub fn retire(&self) {
        self.0.retiring.store(true, Ordering::Release);
        *self.0.on_stop.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.stop();
    }

    /// Calls off a [`SessionHandle::retire`] that has not finished (a
    /// handler that does not return holds it up): the session serves on as
    /// before, its workers started again. `false` when it came too late:
    /// every worker had ended and the session ends retired. A keeper uses
    /// it when a retirement passes its deadline, rather than killing the
    /// daemon that holds the filesystem's state.
    pub fn cancel_retire(&self) -> bool {
        let Some(s) = self.0.shared.get() else {
            return false;
        };
        if !self.is_retiring() {
            return false;
        }
        s.pool.resume(|| {
            self.0.retiring.store(false, Ordering::Release);
            self.0.stop.store(false, Ordering::SeqCst);
            s.shutdown.store(false, Ordering::Release);
        })
    }

    /// Whether [`SessionHandle::retire`] was called.
    pub fn is_retiring(&self) -> bool {
        self.0.retiring.load(Ordering::Acquire)
    }

    /// Registers an action run once by [`SessionHandle::stop`] (the mount
    /// layer uses it to unmount).
    pub fn set_on_stop(&self, f: impl FnOnce() + Send + 'static) {
        *self.0.on_stop.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(f));
    }
}

impl HandleInner {
    /// Wakes every thread of the session that may sleep in the kernel.
    pub(super) fn wake_all(&self) {
        self.threads.wake_all();
        if let Some(w) = &*self.ring_waker.lock().unwrap_or_else(|e| e.into_inner()) {
            w();
        }
    }
}
