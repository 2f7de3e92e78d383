//! Serving until the end: [`Session::run`] and [`Session::spawn`], the
//! workers and io_uring queues started and the pool managed, the orphans
//! of a predecessor resent, then shutdown (rings stopped, notifier ended,
//! DESTROY, the mount unmounted) and the session run in the background
//! ([`RunningSession`]).

use super::config::StartStep;
use super::handle::{HandleInner, SessionHandle};
use super::{Session, SessionError, SessionReport};
use crate::buffer::AlignedBuf;
use crate::conn::{Shared, WorkerCore};
use crate::filesystem::Filesystem;
use crate::init::Negotiated;
use crate::mount::MountGuard;
use crate::ring_worker;
use crate::signal::{self, Registered};
use crate::stats::Stats;
use crate::transport::uring::{self, Unavailable};
use crate::transport::{Channel, Transport, TransportInfo};
use crate::worker::WorkerEnd;
use fuse_proto::flags::InitFlags;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

impl<F: Filesystem> Session<F> {
    /// Runs in background threads.
    pub fn spawn(self) -> Result<RunningSession, SessionError> {
        let handle = self.handle.clone();
        let t = std::thread::Builder::new()
            .name("fuse-session".into())
            .spawn(move || self.run())
            .map_err(SessionError::Spawn)?;
        Ok(RunningSession {
            handle,
            thread: Some(t),
        })
    }

    /// Serves the filesystem until it is unmounted or the session is stopped.
    /// It does not react to signals: a Ctrl-C kills the process and leaves
    /// the mount behind. [`crate::serve`] mounts, runs and stops on SIGINT,
    /// SIGTERM and SIGHUP.
    ///
    /// In order: the handshake (INIT, after checking what io_uring needs),
    /// the state every worker shares, after a takeover the RESEND of what
    /// the predecessor left, the `/dev/fuse` workers, the rings (if
    /// any), then the pool's manager until no worker is left, and the end
    /// (rings joined, DESTROY, unmount).
    pub fn run(mut self) -> Result<SessionReport, SessionError> {
        signal::install_wake_handler();
        if self.config.journal.is_some() {
            crate::fault::arm();
        }
        let _registered = self.handle.0.threads.register();
        self.step(StartStep::Begun);
        let pool_cfg = self.config.resolved();
        let (negotiated, buf, nr_queues, mut fallback) = match self.resumed.clone() {
            Some(n) => {
                let buf = AlignedBuf::receive(n.buffer_size());
                let why = (self.config.transport != Transport::DevFuse).then(|| Unavailable::Setup {
                    what: "resuming a connection handed over (its io_uring queues were the predecessor's)"
                        .into(),
                    errno: libc::EOPNOTSUPP,
                });
                (n, buf, 0, why)
            }
            None => self.handshake_phase()?,
        };
        self.step(StartStep::Negotiated);
        let shared = self.shared_state(&negotiated, pool_cfg, nr_queues);
        self.step(StartStep::SharedPublished);
        // Before any worker reads: RESEND re-queues every request read and
        // not answered, this daemon's own included. A request a worker
        // of ours had read would come again while it is being carried out
        // (its answer then finds no request, and the second copy reaches
        // the filesystem as possibly done: a CREATE answered EEXIST).
        if self.resumed.is_some() {
            self.resend_orphans(&negotiated);
        }
        let spawner = self.start_workers(&shared, pool_cfg.floor, buf)?;
        self.step(StartStep::WorkersStarted);
        // The rings, once the /dev/fuse workers run (requests go there until
        // every queue has registered its entries).
        let rings = match nr_queues {
            0 => None,
            n => self.start_rings(&shared, n, &mut fallback),
        };
        let info = self.publish_transport(&shared, rings.as_ref(), &negotiated, fallback);
        self.step(StartStep::Serving);
        self.manage_workers(&shared, &spawner);
        let started = shared.pool.started();
        self.stop_rings(&shared, rings);
        self.finish(&shared);
        Ok(SessionReport {
            negotiated,
            stats: Stats::collect(&shared.stats, shared.uring_base),
            workers_started: started,
            cloned_channels: spawner.cloned.load(Ordering::Relaxed),
            transport: info,
            mount_left: self.mount_left.lock().unwrap_or_else(|e| e.into_inner()).take(),
        })
    }

    pub(super) fn step(&self, step: StartStep) {
        if let Some(h) = &self.config.on_start_step {
            (h.0)(step);
        }
    }

    /// After a takeover: the kernel queues again, marked as resent, every
    /// request a predecessor read and did not answer (those still held by
    /// an open `/dev/fuse` file of the connection).
    fn resend_orphans(&self, negotiated: &Negotiated) {
        if !negotiated.offered.contains(InitFlags::HAS_RESEND) {
            log::warn!(
                "the kernel (7.{}) cannot send again the requests the predecessor left unanswered (no HAS_RESEND): their callers wait until interrupted",
                negotiated.kernel_minor
            );
            return;
        }
        match self.handle.0.notifier.resend().and_then(|t| t.wait()) {
            Ok(()) => log::info!("connection taken over; requests left unanswered are sent again"),
            Err(e) => log::warn!("NOTIFY_RESEND after the takeover: {e}"),
        }
    }

    /// Starts the pool's `floor` `/dev/fuse` workers, the first with `buf`.
    /// If one cannot start, the others are stopped and waited for.
    fn start_workers(
        &mut self,
        shared: &Arc<Shared>,
        floor: usize,
        buf: AlignedBuf,
    ) -> Result<Spawner<F>, SessionError> {
        let spawner = Spawner {
            fs: self.fs.clone(),
            chan: self.chan.clone(),
            clone_fd: self.config.clone_fd,
            given: self.config.worker_channels.0.clone(),
            shared: shared.clone(),
            handle: self.handle.0.clone(),
            cloned: Arc::new(AtomicUsize::new(0)),
        };
        let mut first_buf = Some(buf);
        for _ in 0..floor {
            if let Err(e) = spawner.start(first_buf.take()) {
                shared.shutdown.store(true, Ordering::Release);
                self.handle.stop();
                shared.pool.manage(|| false, || self.handle.0.wake_all(), || true);
                self.finish_notifier();
                return Err(SessionError::Spawn(e));
            }
        }
        Ok(spawner)
    }

    /// Says (and logs) which transport serves, once the rings are up: a
    /// stop that came meanwhile wakes them.
    fn publish_transport(
        &self,
        shared: &Shared,
        rings: Option<&ring_worker::Rings>,
        negotiated: &Negotiated,
        fallback: Option<Unavailable>,
    ) -> TransportInfo {
        if let Some(r) = rings {
            *self.handle.0.ring_waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(r.waker()));
            if shared.shutdown.load(Ordering::Acquire) {
                r.wake_all();
            }
        }
        let info = match rings {
            Some(r) => TransportInfo::Uring {
                queues: r.len(),
                depth: r.depth,
                payload_size: ring_worker::payload_size(negotiated),
            },
            None => TransportInfo::DevFuse { fallback },
        };
        match (&info, self.config.transport) {
            (TransportInfo::DevFuse { fallback: Some(why) }, Transport::Uring) => {
                log::warn!("io_uring transport requested but not used, serving over /dev/fuse: {why}")
            }
            (TransportInfo::DevFuse { fallback: Some(why) }, _) => {
                log::info!("io_uring not available, serving over /dev/fuse: {why}")
            }
            _ => log::info!("transport: {info}"),
        }
        let _ = self.handle.0.transport.set(info.clone());
        info
    }

    /// The pool's manager: sleeps until the pool is saturated (then starts
    /// a worker) or a worker ends; returns when none is left. Then nothing
    /// queued or deferred can be answered usefully any more.
    fn manage_workers(&self, shared: &Shared, spawner: &Spawner<F>) {
        shared.pool.manage(
            || match spawner.start(None) {
                Ok(()) => true,
                Err(e) => {
                    log::warn!("could not start another worker: {e}");
                    false
                }
            },
            || self.handle.0.wake_all(),
            || shared.shutdown.load(Ordering::Acquire),
        );
        shared.pool.clear_backlog();
        // Deferred waits can no longer be answered usefully: interrupt them,
        // unless the connection goes to a successor, which gets them again.
        if !self.handle.is_retiring() {
            shared.helpers.close();
        }
    }

    /// Waits for the ring queues to end. On unmount every parked command
    /// completes with ENOTCONN and the queue threads end by themselves; on
    /// stop they were woken.
    fn stop_rings(&self, shared: &Shared, rings: Option<ring_worker::Rings>) {
        if let Some(r) = rings {
            r.join(shared, Duration::from_secs(5));
        }
        self.handle
            .0
            .ring_waker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }

    /// The end: DESTROY (unless the kernel's already came), the notifier
    /// closed, our mount unmounted if it is still there.
    fn finish(&mut self, shared: &Shared) {
        if self.handle.is_retiring() {
            // The connection goes on, served by a successor.
            self.finish_notifier();
            return;
        }
        if !shared.destroyed.swap(true, Ordering::AcqRel) {
            self.fs.destroy();
        }
        self.finish_notifier();
        if let Some(g) = &self.mount {
            // Unmounted from outside is the common end; the guard unmounts
            // only if our own mount is still on top (e.g. the connection was
            // aborted), never whatever is mounted on the path now.
            let guard = g.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(Err(e)) = guard.map(MountGuard::unmount) {
                *self.mount_left.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                log::warn!("not unmounted: {e}");
            }
        }
    }

    fn start_rings(
        &self,
        shared: &Arc<Shared>,
        nr_queues: usize,
        fallback: &mut Option<Unavailable>,
    ) -> Option<ring_worker::Rings> {
        let Some(fd) = self.chan.raw_fd() else {
            *fallback = Some(Unavailable::Setup {
                what: "finding the /dev/fuse fd of the session channel".into(),
                errno: libc::EBADF,
            });
            return None;
        };
        let depth = match self.config.uring_queue_depth {
            0 => uring::DEFAULT_QUEUE_DEPTH,
            n => n,
        };
        let threads = self.handle.0.threads.clone();
        let on_start: Arc<dyn Fn() -> Registered + Send + Sync> = Arc::new(move || threads.register());
        match ring_worker::start(&self.fs, shared, fd, nr_queues, depth, on_start) {
            Ok(r) => Some(r),
            Err(why) => {
                *fallback = Some(why);
                None
            }
        }
    }

    pub(super) fn finish_notifier(&mut self) {
        self.handle.0.notifier.close();
        if let Some(t) = self.notify_thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts pool threads: each on its own cloned `/dev/fuse` fd where the
/// kernel allows (made by the new thread, so that the thread that starts it
/// does not wait for the ioctl), the first on the session fd.
struct Spawner<F: Filesystem> {
    fs: Arc<F>,
    chan: Arc<dyn Channel>,
    clone_fd: bool,
    /// [`SessionConfig::worker_channels`].
    given: Vec<Arc<dyn Channel>>,
    shared: Arc<Shared>,
    handle: Arc<HandleInner>,
    cloned: Arc<AtomicUsize>,
}

impl<F: Filesystem> Spawner<F> {
    fn start(&self, buf: Option<AlignedBuf>) -> std::io::Result<()> {
        let pool = &self.shared.pool;
        let Some(index) = pool.begin_start() else {
            return Err(std::io::Error::other("every worker slot is in use"));
        };
        let fs = self.fs.clone();
        let shared = self.shared.clone();
        let handle = self.handle.clone();
        let cloned = self.cloned.clone();
        let given = index.checked_sub(1).and_then(|i| self.given.get(i)).cloned();
        let chan = given.clone().unwrap_or_else(|| self.chan.clone());
        let clone_fd = self.clone_fd && index != 0 && given.is_none();
        let r = std::thread::Builder::new()
            .name(format!("fuse-worker-{index}"))
            .spawn(move || {
                let _registered = handle.threads.register();
                let chan = if clone_fd {
                    match chan.try_clone() {
                        Ok(c) => {
                            cloned.fetch_add(1, Ordering::Relaxed);
                            c
                        }
                        Err(e) => {
                            log::warn!(
                                "FUSE_DEV_IOC_CLONE failed ({e}); worker {index} shares the session fd"
                            );
                            chan
                        }
                    }
                } else {
                    chan
                };
                let core = Arc::new(WorkerCore {
                    index,
                    chan: chan.clone(),
                    shared: shared.clone(),
                    defer_queue: None,
                });
                let buf = buf.unwrap_or_else(|| AlignedBuf::receive(shared.negotiated.buffer_size()));
                log::debug!("worker {index} serving on {}", core.chan.describe());
                let end = crate::worker::run(&*fs, core, &*chan, buf);
                drop(fs);
                match end {
                    WorkerEnd::Retired => {
                        log::debug!("worker {index} is not needed any more; ending");
                        shared.pool.retired(index);
                        return;
                    }
                    WorkerEnd::Failed(e) => log::warn!("worker {index} ended on an error: {e}"),
                    WorkerEnd::Unmounted => shared.pool.end(),
                    WorkerEnd::Stopped => {}
                }
                shared.pool.exited(index);
            });
        match r {
            Ok(_) => Ok(()),
            Err(e) => {
                pool.start_failed(index);
                Err(e)
            }
        }
    }
}

/// Unmounts (once) the mount a session owns. The guard touches only our own
/// mount: one unmounted from outside is fine, and one with another mount on
/// top of it is left in place (logged here).
pub(super) fn unmount_guard(g: &Mutex<Option<MountGuard>>, left: &Mutex<Option<String>>) {
    let guard = g.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(guard) = guard
        && let Err(e) = guard.unmount()
    {
        *left.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
        log::warn!("not unmounted: {e}");
    }
}

/// A session running in the background.
pub struct RunningSession {
    handle: SessionHandle,
    thread: Option<JoinHandle<Result<SessionReport, SessionError>>>,
}

impl RunningSession {
    /// The session's handle.
    pub fn handle(&self) -> &SessionHandle {
        &self.handle
    }

    /// Whether the session has ended ([`RunningSession::join`] returns at
    /// once).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Waits for the session to end (unmount, DESTROY or stop).
    pub fn join(mut self) -> Result<SessionReport, SessionError> {
        self.join_inner()
    }

    fn join_inner(&mut self) -> Result<SessionReport, SessionError> {
        match self.thread.take() {
            Some(t) => t.join().unwrap_or(Err(SessionError::EndedBeforeInit)),
            None => Err(SessionError::EndedBeforeInit),
        }
    }

    /// Stops the session and waits for it.
    pub fn stop(mut self) -> Result<SessionReport, SessionError> {
        self.handle.stop();
        self.join_inner()
    }
}

impl Drop for RunningSession {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.handle.stop();
            let _ = self.join_inner();
        }
    }
}
