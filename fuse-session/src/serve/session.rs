//! The session: INIT negotiation, then N workers serving the filesystem
//! until it is unmounted or stopped.
//!
//! `Session::run` blocks; `Session::spawn` runs in the background and returns
//! a [`RunningSession`]. Both expose a [`SessionHandle`] for statistics, the
//! negotiated capabilities, the notifier and stopping. Workers start at two
//! per CPU (configurable), each on its own cloned `/dev/fuse` fd where the
//! kernel allows; the pool grows while every worker is busy, shrinks back
//! after an idle timeout, and always keeps a thread reading `/dev/fuse`
//! (see `docs/architecture.md`). The thread that runs the session sleeps until the
//! pool needs it: an idle session makes no periodic wake-ups.
//!
//! With [`Transport::Uring`] (or `Auto`) the session also asks for
//! `FUSE_OVER_IO_URING` and, once INIT granted it, starts one io_uring queue
//! per possible CPU ([`crate::transport::uring`]); the `/dev/fuse` workers
//! keep serving what the kernel still sends there. When io_uring cannot be
//! used the session says why and serves everything over `/dev/fuse`.

use crate::buffer::AlignedBuf;
use crate::conn::{Shared, WorkerCore};
use crate::credentials::{CallerPolicy, ProcCredentials};
use crate::deferred::Helpers;
use crate::filesystem::Filesystem;
use crate::init::{InitConfig, InitOutcome, Negotiated, check_version, negotiate};
use crate::interrupt::{InflightTable, PendingInterrupts};
use crate::mount::{Mount, MountError, MountGuard, MountOptions};
use crate::notify::Notifier;
use crate::pool::{Pool, PoolConfig};
use crate::ring_worker;
use crate::signal::{self, Registered, Threads};
use crate::stats::{HandlerPanic, PanicLog, Stats, StatsTable};
use crate::transport::uring::{self, Unavailable};
use crate::transport::{Channel, Transport, TransportInfo};
use crate::worker::WorkerEnd;
use fuse_proto::abi::InitIn;
use fuse_proto::flags::{FopenFlags, InitFlags};
use fuse_proto::request::{ParseConfig, peek_unique};
use fuse_proto::{Errno, Opcode, Operation, Reply, Request};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// How a session runs.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Workers to start, and the floor the pool shrinks back to (0: two per
    /// CPU, [`DEFAULT_WORKERS_PER_CPU`]).
    pub workers: usize,
    /// Most workers running handlers at once (0: `max(4 x workers, 16)`; at
    /// least `workers`). One more thread may run beyond it, to keep reading
    /// `/dev/fuse` while all of these are busy (see the module docs).
    pub max_workers: usize,
    /// Give each worker its own `/dev/fuse` fd (`FUSE_DEV_IOC_CLONE`); on
    /// failure workers share the session fd.
    pub clone_fd: bool,
    /// Decode the out-of-tree atomic-open request (see
    /// `fuse_proto::ext::atomic_open`); refuses PASSTHROUGH.
    pub atomic_open: bool,
    /// How long every worker must be busy before another is started.
    pub grow_after: Duration,
    /// How long a worker above `workers`, or a helper thread of deferred
    /// waits, waits for work before it ends. Under a steady load, workers
    /// above `workers` also end once the pool has had them to spare (some
    /// threads idle all along) for this long or 1 s, whichever is shorter.
    pub idle_timeout: Duration,
    /// Most deferred waits at once ([`crate::RequestContext::defer`]; 0:
    /// [`crate::deferred::DEFAULT_MAX_DEFERRED`]).
    pub max_deferred: usize,
    /// Most deferred waits at once of one caller uid (0:
    /// [`crate::deferred::DEFAULT_MAX_DEFERRED_PER_UID`]). Never more than
    /// half of `max_deferred`, nor over io_uring more than half of the
    /// waits its queue allows ([`crate::deferred::share`]), so that one
    /// user's waits leave room for other users'.
    pub max_deferred_per_uid: usize,
    /// Serve only this uid and root (the `allow_root` mount option: the kernel
    /// lets everyone in, so the session refuses others with `EACCES`, except
    /// for operations on files they already hold open).
    pub deny_others: Option<u32>,
    /// `/dev/fuse` only, io_uring, or io_uring when available.
    pub transport: Transport,
    /// Ring entries per io_uring queue (0: [`uring::DEFAULT_QUEUE_DEPTH`]).
    pub uring_queue_depth: usize,
    /// Whether callers' groups and capabilities may be read from `/proc`
    /// (see [`crate::credentials`]).
    pub proc_credentials: ProcCredentials,
    /// Keep the per-opcode high-water mark of requests in flight
    /// ([`crate::OpStats::max_inflight`], `None` without it). Off by
    /// default: it costs every request a write to a cache line all workers
    /// share (an exact peak of requests across workers cannot be had
    /// without one).
    pub track_inflight: bool,
    /// `/dev/fuse` workers receive each request with `splice(2)` into a
    /// pipe of their own and leave the data of WRITEs of at least
    /// [`SessionConfig::splice_write_min`] bytes there, for the handler to
    /// move into a file ([`crate::WriteData::splice_to`]) without copying
    /// it through user memory. Every other request costs one syscall more
    /// (the read from the pipe), so this pays only for filesystems that
    /// write large payloads into files (see `docs/performance.md`). Not
    /// used by io_uring queues or transports without splice, nor when
    /// `max_write` and a page do not fit a 1 MiB pipe (`max_write` of at
    /// most 1016 KiB): requests are then read as without it.
    pub splice_write: bool,
    /// The smallest WRITE payload left in the pipe with
    /// [`SessionConfig::splice_write`] (0:
    /// [`SPLICE_WRITE_MIN`]).
    pub splice_write_min: usize,
    /// Answer every `O_DIRECT` OPEN, CREATE and TMPFILE with
    /// [`Negotiated::o_direct_flags`] added to the flags the filesystem
    /// chose, unless it passed the file through to a backing file (on by
    /// default). Such a descriptor bypasses the page cache, as its caller
    /// asked, and its non-extending writes to one file run at once instead
    /// of one after another; buffered opens keep the page cache. It
    /// applies only where [`Negotiated::o_direct_flags`] is not empty: to
    /// filesystems that clear set-ID bits on writes themselves (they asked
    /// for `HANDLE_KILLPRIV_V2`; the kernel leaves that to the filesystem
    /// for a `DIRECT_IO` write), from 7.38 on. Turn it off for a filesystem whose writes to one file must not overlap in
    /// time, or whose `O_DIRECT` descriptors must be mappable shared
    /// without [`InitFlags::DIRECT_IO_ALLOW_MMAP`](crate::proto::flags::InitFlags::DIRECT_IO_ALLOW_MMAP)
    /// (the kernel refuses `MAP_SHARED` on a `DIRECT_IO` file without it).
    /// The kernel does not tell the filesystem about a later
    /// `fcntl(F_SETFL, O_DIRECT)`: such a descriptor keeps the flags of its
    /// open (page cache, writes one at a time).
    pub o_direct_parallel_writes: bool,
    /// The journal of requests in flight, which makes requests that a dead
    /// predecessor carried out take effect once ([`crate::journal`]). Set
    /// by [`crate::keeper::KeeperLink::serve`].
    pub journal: Option<Arc<crate::journal::Journal>>,
    /// Called with what INIT negotiated just before the INIT reply is
    /// written, so that whoever keeps the connection knows it even if this
    /// process dies a moment later (a keeper: [`crate::keeper`]).
    pub on_negotiated: Option<NegotiatedHook>,
    /// For tests: called at each step of the start ([`StartStep`]), on the
    /// thread that runs it, so that a test can stop or retire the session
    /// at that very moment.
    #[doc(hidden)]
    pub on_start_step: Option<StartHook>,
    /// Channels for the workers after the first, by worker index (worker
    /// `i` reads `worker_channels[i - 1]`): clones of the session fd that
    /// someone else made and holds too (a keeper, so that the requests a
    /// worker read outlive this process). Workers beyond them clone their
    /// own when `clone_fd` is set, else share the session fd.
    pub worker_channels: WorkerChannels,
}

/// [`SessionConfig::worker_channels`].
#[derive(Clone, Default)]
pub struct WorkerChannels(pub Vec<Arc<dyn Channel>>);

impl std::fmt::Debug for WorkerChannels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WorkerChannels({})", self.0.len())
    }
}

/// A callback for [`SessionConfig::on_negotiated`].
#[derive(Clone)]
pub struct NegotiatedHook(pub Arc<dyn Fn(&Negotiated) + Send + Sync>);

impl std::fmt::Debug for NegotiatedHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NegotiatedHook")
    }
}

/// The steps of a session's start, in order, at which
/// [`SessionConfig::on_start_step`] is called.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartStep {
    /// `run` has begun; nothing is read yet.
    Begun,
    /// INIT is answered (or the connection was taken over).
    Negotiated,
    /// The state every worker shares is made, not yet published: a stop
    /// now finds nothing to mark.
    SharedMade,
    /// The shared state is published.
    SharedPublished,
    /// The `/dev/fuse` workers run.
    WorkersStarted,
    /// The transport is published; the pool's manager takes over.
    Serving,
}

impl StartStep {
    /// Every step, in order.
    pub const ALL: [StartStep; 6] = [
        StartStep::Begun,
        StartStep::Negotiated,
        StartStep::SharedMade,
        StartStep::SharedPublished,
        StartStep::WorkersStarted,
        StartStep::Serving,
    ];
}

/// A callback for [`SessionConfig::on_start_step`].
#[doc(hidden)]
#[derive(Clone)]
pub struct StartHook(pub Arc<dyn Fn(StartStep) + Send + Sync>);

impl std::fmt::Debug for StartHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StartHook")
    }
}

/// Workers per CPU when [`SessionConfig::workers`] is 0.
///
/// Two, not one, for callers that wait for each reply (a single writer, a
/// single-threaded `ls` or build step). The worker that sends a reply is
/// usually preempted by the caller it woke, stays runnable on that CPU, and
/// is there to read the caller's next request the moment the caller blocks.
/// With one worker per CPU that happened on 61% of requests of one `O_DIRECT`
/// writer on two CPUs (involuntary switches per request); the others were
/// read by a worker woken from sleep, and the writer ran at 0.73x libfuse's
/// example (which runs 3-4 threads there).
/// With two per CPU: 93%, 0.97x, and the same CPU per request as libfuse,
/// for 2.3 MiB more peak memory (each busy worker touches its receive
/// buffer). `docs/performance.md` has the measurements.
pub const DEFAULT_WORKERS_PER_CPU: usize = 2;

/// Default of [`SessionConfig::splice_write_min`]: below it the copy a
/// splice saves costs less than the syscall it adds (measured in
/// `docs/performance.md`).
pub const SPLICE_WRITE_MIN: usize = 64 * 1024;

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            workers: 0,
            max_workers: 0,
            clone_fd: true,
            atomic_open: false,
            grow_after: Duration::from_millis(20),
            idle_timeout: Duration::from_secs(10),
            max_deferred: 0,
            max_deferred_per_uid: 0,
            deny_others: None,
            transport: Transport::DevFuse,
            uring_queue_depth: 0,
            proc_credentials: ProcCredentials::Auto,
            track_inflight: false,
            splice_write: false,
            splice_write_min: 0,
            o_direct_parallel_writes: true,
            journal: None,
            on_negotiated: None,
            on_start_step: None,
            worker_channels: WorkerChannels::default(),
        }
    }
}

impl SessionConfig {
    /// Applies `opt` if it is one of the session's own `-o` options, for a
    /// command line that mixes them with mount options (what
    /// [`MountOptions::parse_known`] leaves over): `threads=N` (N > 0, sets
    /// [`SessionConfig::workers`]), `max_threads=N` (1 to 4096, sets
    /// [`SessionConfig::max_workers`]), `uring` (sets
    /// [`SessionConfig::transport`] to [`Transport::Uring`]) or
    /// `serial_o_direct` (clears [`SessionConfig::o_direct_parallel_writes`]:
    /// `O_DIRECT` opens get the filesystem's flags alone). Returns
    /// whether it took `opt`; anything else, `threads` without a positive
    /// number included, is left to the caller.
    ///
    /// ```
    /// use fuse_session::{MountOptions, SessionConfig, Transport};
    ///
    /// let (mount, ours) =
    ///     MountOptions::parse_known("ro,threads=4,max_threads=8,uring,serial_o_direct,source=/srv").unwrap();
    /// let mut session = SessionConfig::default();
    /// let rest: Vec<String> = ours.into_iter().filter(|o| !session.take_option(o)).collect();
    /// assert!(mount.read_only);
    /// assert_eq!((session.workers, session.max_workers), (4, 8));
    /// assert_eq!(session.transport, Transport::Uring);
    /// assert!(!session.o_direct_parallel_writes);
    /// assert_eq!(rest, ["source=/srv"]);
    /// assert!(!session.take_option("threads=0"));
    /// assert!(!session.take_option("threads=many"));
    /// assert!(!session.take_option("max_threads=0"));
    /// assert!(!session.take_option("max_threads=4097"));
    /// assert_eq!((session.workers, session.max_workers), (4, 8));
    /// ```
    pub fn take_option(&mut self, opt: &str) -> bool {
        match opt.split_once('=') {
            Some(("threads", n)) => match n.parse::<usize>() {
                Ok(n) if n > 0 => self.workers = n,
                _ => return false,
            },
            Some(("max_threads", n)) => match n.parse::<usize>() {
                Ok(n) if (1..=4096).contains(&n) => self.max_workers = n,
                _ => return false,
            },
            None if opt == "uring" => self.transport = Transport::Uring,
            None if opt == "serial_o_direct" => self.o_direct_parallel_writes = false,
            _ => return false,
        }
        true
    }

    /// The most file descriptors a session with this configuration holds
    /// open itself, for an application that sizes its own descriptors
    /// (a cache of them, say) within its open-file limit. It counts the
    /// `/dev/fuse` fd and a few for the mount; for each `/dev/fuse` worker
    /// thread (at most `max_workers`, and one more that only reads) its
    /// clone of the fd (`clone_fd`), the two pipes it splices READ replies
    /// through and, with `splice_write`, the pipe it receives into; with
    /// io_uring (asked for or `Auto`), a copy of the `/dev/fuse` fd and,
    /// per queue (one per possible CPU), the ring, two eventfds and a
    /// timerfd. Helper threads of deferred waits hold none, unless a
    /// deferred closure splices a READ reply (two pipes more each then).
    pub fn max_descriptors(&self) -> usize {
        /// The session's `/dev/fuse` fd and the mount's (its watchdog, the
        /// guard checking the mountpoint).
        const BASE: usize = 8;
        let threads = self.resolved().slots();
        let per_thread = usize::from(self.clone_fd) + 4 + if self.splice_write { 2 } else { 0 };
        let rings = match self.transport {
            Transport::DevFuse => 0,
            Transport::Uring | Transport::Auto => {
                let queues = uring::possible_cpus()
                    .or_else(|_| std::thread::available_parallelism().map(usize::from))
                    .unwrap_or(1);
                1 + 4 * queues
            }
        };
        BASE + threads * per_thread + rings
    }

    fn resolved(&self) -> PoolConfig {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let workers = if self.workers == 0 {
            cpus * DEFAULT_WORKERS_PER_CPU
        } else {
            self.workers
        };
        let max = if self.max_workers == 0 {
            (workers * 4).max(16)
        } else {
            self.max_workers.max(workers)
        };
        PoolConfig {
            floor: workers,
            max,
            grow_after: self.grow_after,
            idle_timeout: self.idle_timeout,
        }
    }
}

/// Why a session failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The connection ended before INIT.
    #[error("the connection ended before INIT completed")]
    EndedBeforeInit,
    /// The kernel's protocol cannot be served.
    #[error("unsupported kernel protocol: {0}")]
    Unsupported(String),
    /// The filesystem's `init` refused.
    #[error("the filesystem refused INIT: {0}")]
    FilesystemRefused(Errno),
    /// An I/O error on the device.
    #[error("FUSE device error: {0}")]
    Io(#[from] std::io::Error),
    /// A worker thread could not be started.
    #[error("could not start a worker thread: {0}")]
    Spawn(std::io::Error),
    /// Mounting failed.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// A request other than INIT came first: the connection was
    /// initialised already, by another process (a descriptor handed over
    /// without what INIT negotiated). Nothing was answered: its holder may
    /// still serve it, or it ends (`ENOTCONN`) when the last holder closes
    /// it.
    #[error(
        "the connection was initialised already ({0} came before INIT): it was handed over without \
         what INIT negotiated, and cannot be served"
    )]
    AlreadyInitialised(Opcode),
    /// The filesystem may not run under a keeper or the fd store
    /// ([`crate::Filesystem::recovery`]).
    #[error("refused under a keeper: {0}")]
    NotRecoverable(String),
}

/// What a finished session reports.
#[derive(Clone, Debug)]
pub struct SessionReport {
    /// What INIT negotiated.
    pub negotiated: Negotiated,
    /// Final statistics.
    pub stats: Stats,
    /// Workers that ran (including those started on demand).
    pub workers_started: usize,
    /// Channels that were cloned fds (the rest shared the session fd).
    pub cloned_channels: usize,
    /// The transport that served requests, and why io_uring was not used
    /// if it was asked for and is not.
    pub transport: TransportInfo,
    /// `Some(why)` when the session owned its mount and left it in place:
    /// covered by another mount (a stacked mount over it), or an unmount
    /// that failed. `None` when it unmounted it, found it unmounted already,
    /// or never owned one (a handed-over descriptor, a resumed or retired
    /// session).
    pub mount_left: Option<String>,
}

struct HandleInner {
    shared: OnceLock<Arc<Shared>>,
    transport: OnceLock<TransportInfo>,
    notifier: Notifier,
    stop: AtomicBool,
    threads: Arc<Threads>,
    on_stop: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Wakes the io_uring queue threads, once they run.
    ring_waker: Mutex<Option<Box<dyn Fn() + Send>>>,
    /// Stopping to hand the connection over: no DESTROY, no unmount, and
    /// deferred waits are left unanswered for the successor (see
    /// [`SessionHandle::retire`]).
    retiring: AtomicBool,
}

/// A handle to a session, usable from any thread while it runs.
#[derive(Clone)]
pub struct SessionHandle(Arc<HandleInner>);

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
    /// [`MountGuard::unmount`]).
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
    /// [`Session::run`] has returned, before a deferred wait could answer
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
    fn wake_all(&self) {
        self.threads.wake_all();
        if let Some(w) = &*self.ring_waker.lock().unwrap_or_else(|e| e.into_inner()) {
            w();
        }
    }
}

/// A filesystem bound to a FUSE connection, ready to run.
pub struct Session<F: Filesystem> {
    fs: Arc<F>,
    chan: Arc<dyn Channel>,
    config: SessionConfig,
    handle: SessionHandle,
    notify_thread: Option<JoinHandle<()>>,
    uring: bool,
    mount: Option<Arc<Mutex<Option<MountGuard>>>>,
    /// The fd came from someone else (its pid namespace is unknown).
    handed_over: bool,
    /// A connection taken over: INIT happened already, with this outcome.
    resumed: Option<Negotiated>,
    /// Why our mount was left in place, once an unmount was tried
    /// ([`SessionReport::mount_left`]).
    mount_left: Arc<Mutex<Option<String>>>,
    /// The mount options said `default_permissions`.
    mount_default_permissions: bool,
    /// Ask the kernel to send INIT again before waiting for it (a
    /// predecessor may have read it and died).
    resend_before_init: bool,
}

impl<F: Filesystem> Session<F> {
    /// Binds `fs` to the connection behind `chan` (a mounted `/dev/fuse` fd,
    /// or the fake kernel).
    pub fn new(fs: F, chan: Arc<dyn Channel>, config: SessionConfig) -> std::io::Result<Self> {
        Self::from_arc(Arc::new(fs), chan, config)
    }

    /// Like [`Session::new`] for a filesystem the caller keeps a reference to.
    pub fn from_arc(fs: Arc<F>, chan: Arc<dyn Channel>, config: SessionConfig) -> std::io::Result<Self> {
        let (notifier, notify_thread) = Notifier::start(chan.clone())?;
        let handle = SessionHandle(Arc::new(HandleInner {
            shared: OnceLock::new(),
            transport: OnceLock::new(),
            notifier,
            stop: AtomicBool::new(false),
            threads: Arc::new(Threads::default()),
            on_stop: Mutex::new(None),
            ring_waker: Mutex::new(None),
            retiring: AtomicBool::new(false),
        }));
        Ok(Self {
            fs,
            chan,
            config,
            handle,
            notify_thread: Some(notify_thread),
            uring: false,
            mount: None,
            handed_over: false,
            resumed: None,
            mount_left: Arc::new(Mutex::new(None)),
            mount_default_permissions: false,
            resend_before_init: false,
        })
    }

    /// Goes on serving a connection a predecessor handed over
    /// ([`crate::handover::Handover`]): no INIT (the kernel negotiates once
    /// per connection; `negotiated` is what it granted, so the filesystem's
    /// `init` is not called and it must restore its own state first), and
    /// before serving, the kernel is asked to send again the requests the
    /// predecessor read and left unanswered (`FUSE_NOTIFY_RESEND`, when the
    /// kernel offered `HAS_RESEND`). Such a session never unmounts: the
    /// mount belongs to whoever mounted it (a keeper).
    ///
    /// It serves over `/dev/fuse`; a connection INIT put on io_uring is
    /// refused (`ErrorKind::Unsupported`): the kernel sends its requests to
    /// ring entries only, and the entries of a daemon that ends fail what
    /// they are handed meanwhile (`docs/recovery.md`). The successor is expected in the pid namespace
    /// of the process that mounted (a keeper starts it so): callers'
    /// credentials are read from `/proc` as for a session that mounted.
    pub fn resume(
        fs: Arc<F>,
        dev: std::os::fd::OwnedFd,
        negotiated: Negotiated,
        config: SessionConfig,
    ) -> std::io::Result<Self> {
        if negotiated.flags.contains(InitFlags::OVER_IO_URING) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "the connection is on FUSE-over-io_uring, which cannot be taken over: the kernel sends its \
                 requests only to ring entries, and fails with ECANCELED those it hands to the entries of \
                 a daemon that ends (see docs/recovery.md)",
            ));
        }
        let chan: Arc<dyn Channel> = Arc::new(crate::transport::dev_fuse::DevFuse::from_fd(dev));
        let mut s = Self::from_arc(fs, chan, config)?;
        s.mount_default_permissions = negotiated.default_permissions;
        s.resumed = Some(negotiated);
        Ok(s)
    }

    /// Mounts `fs` at `mountpoint` with `opts` (privileged `mount(2)` as
    /// root, else through `fusermount3`; a mountpoint `/dev/fd/N` serves an
    /// fd handed over by a privileged helper) and binds a session to it. The
    /// session unmounts when it ends or is stopped, touching only its own
    /// mount (see [`MountGuard::unmount`]).
    pub fn mount(
        fs: F,
        mountpoint: impl AsRef<std::path::Path>,
        opts: &MountOptions,
        config: SessionConfig,
    ) -> Result<Self, SessionError> {
        Self::mount_arc(Arc::new(fs), mountpoint, opts, config)
    }

    /// Like [`Session::mount`] for a filesystem the caller keeps a reference to.
    pub fn mount_arc(
        fs: Arc<F>,
        mountpoint: impl AsRef<std::path::Path>,
        opts: &MountOptions,
        config: SessionConfig,
    ) -> Result<Self, SessionError> {
        let m = Mount::new(mountpoint, opts)?;
        Self::from_mount(fs, m, opts, config)
    }

    /// Binds a session to a mount made with `opts` (its fd and its guard):
    /// the session unmounts when it ends or is stopped, but not when it
    /// retires ([`SessionHandle::retire`]).
    pub fn from_mount(
        fs: Arc<F>,
        m: Mount,
        opts: &MountOptions,
        mut config: SessionConfig,
    ) -> Result<Self, SessionError> {
        if m.allow_root() && config.deny_others.is_none() {
            config.deny_others = Some(nix::unistd::getuid().as_raw());
        }
        let handed_over = m.method() == crate::mount::MountMethod::HandedOver;
        let (dev, guard) = m.into_parts();
        let mut s = Self::from_arc(fs, Arc::new(dev), config)?;
        s.handed_over = handed_over;
        s.mount_default_permissions = opts.default_permissions;
        let guard = Arc::new(Mutex::new(Some(guard)));
        let on_stop = guard.clone();
        let left = s.mount_left.clone();
        s.handle.set_on_stop(move || unmount_guard(&on_stop, &left));
        s.mount = Some(guard);
        Ok(s)
    }

    /// Whether the mount has `default_permissions` (the kernel checks
    /// permissions itself), for a session bound to a connection another
    /// process mounted.
    pub(crate) fn set_default_permissions(&mut self, on: bool) {
        self.mount_default_permissions = on;
    }

    /// Before waiting for INIT, asks the kernel to send again what was read
    /// and not answered (`FUSE_NOTIFY_RESEND`): a predecessor on a new
    /// connection may have read INIT and died before answering it. The
    /// kernel sends nothing else before INIT is answered; one without RESEND
    /// refuses the notification, which is then of no matter.
    pub(crate) fn resend_before_init(&mut self) {
        self.resend_before_init = true;
    }

    /// The handle (statistics, notifier, stop).
    pub fn handle(&self) -> SessionHandle {
        self.handle.clone()
    }

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

    fn step(&self, step: StartStep) {
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

    /// The handshake: what io_uring needs is checked before INIT, so that
    /// the flag is only asked for when the rings can be built; then INIT is
    /// answered. Returns what was negotiated, the first worker's buffer
    /// (sized for it), the number of ring queues to start (0: none) and why
    /// io_uring is not used when it was asked for. On error the notifier is
    /// closed and our mount unmounted.
    fn handshake_phase(
        &mut self,
    ) -> Result<(Negotiated, AlignedBuf, usize, Option<Unavailable>), SessionError> {
        let mut fallback: Option<Unavailable> = None;
        let mut nr_queues = 0;
        if self.config.transport != Transport::DevFuse {
            match uring::probe() {
                Ok(n) => nr_queues = n,
                Err(why) => fallback = Some(why),
            }
        }
        self.uring = self.config.transport != Transport::DevFuse && fallback.is_none();
        let mut buf = AlignedBuf::receive(crate::init::DEFAULT_MAX_WRITE as usize + 4096);
        if self.resend_before_init
            && let Err(e) = self.chan.send(&fuse_proto::reply::notify::resend())
        {
            log::debug!("RESEND before INIT: {e}");
        }
        let negotiated = match self.handshake(buf.as_mut_slice()) {
            Ok(n) => n,
            Err(e) => {
                self.finish_notifier();
                if let Some(g) = &self.mount {
                    unmount_guard(g, &self.mount_left);
                }
                return Err(e);
            }
        };
        if self.uring && !negotiated.flags.contains(InitFlags::OVER_IO_URING) {
            fallback = Some(ring_worker::why_not_granted(&negotiated));
        }
        if fallback.is_some() || !self.uring {
            nr_queues = 0;
        }
        if buf.len() != negotiated.buffer_size() {
            buf = AlignedBuf::receive(negotiated.buffer_size());
        }
        Ok((negotiated, buf, nr_queues, fallback))
    }

    /// The state every worker (and ring entry) shares, fixed after INIT,
    /// published to the handle and the notifier.
    fn shared_state(&self, negotiated: &Negotiated, pool_cfg: PoolConfig, nr_queues: usize) -> Arc<Shared> {
        let slots = pool_cfg.slots();
        let shared = Arc::new(Shared {
            parse: ParseConfig {
                minor: negotiated.minor,
                setxattr_ext: negotiated.flags.contains(InitFlags::SETXATTR_EXT),
                atomic_open: self.config.atomic_open,
            },
            negotiated: negotiated.clone(),
            tables: (0..slots + nr_queues).map(|_| InflightTable::new()).collect(),
            stats: StatsTable::new(slots + nr_queues, self.config.track_inflight),
            pool: Pool::new(pool_cfg),
            helpers: Helpers::new(
                self.config.max_deferred,
                self.config.max_deferred_per_uid,
                self.config.idle_timeout,
            ),
            pending: PendingInterrupts::default(),
            notifier: self.handle.0.notifier.clone(),
            shutdown: AtomicBool::new(self.handle.0.stop.load(Ordering::Acquire)),
            destroyed: AtomicBool::new(false),
            deny_others: self.config.deny_others,
            journal: self.config.journal.clone(),
            splice_write: self
                .config
                .splice_write
                .then_some(match self.config.splice_write_min {
                    0 => SPLICE_WRITE_MIN,
                    n => n,
                }),
            uring_base: slots,
            o_direct: if self.config.o_direct_parallel_writes {
                negotiated.o_direct_flags()
            } else {
                FopenFlags::empty()
            },
            callers: CallerPolicy::new(
                self.config.proc_credentials,
                self.handed_over,
                negotiated.default_permissions,
            ),
            panics: PanicLog::default(),
        });
        // The notifier learns the negotiation before the handle publishes it,
        // so that nobody who sees `negotiated()` gets `NotReady` from it.
        self.handle.0.notifier.set_negotiated(negotiated.clone());
        self.step(StartStep::SharedMade);
        let _ = self.handle.0.shared.set(shared.clone());
        // A stop (or retire) that came between reading `stop` above and
        // publishing found no shared state to mark: it is seen here.
        // (Pairs with the fence in `SessionHandle::stop`.)
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.handle.0.stop.load(Ordering::SeqCst) {
            shared.shutdown.store(true, Ordering::Release);
        }
        shared
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

    fn finish_notifier(&mut self) {
        self.handle.0.notifier.close();
        if let Some(t) = self.notify_thread.take() {
            let _ = t.join();
        }
    }

    /// Reads until INIT, answers it, and returns what was negotiated.
    fn handshake(&mut self, buf: &mut [u8]) -> Result<Negotiated, SessionError> {
        loop {
            if self.handle.0.stop.load(Ordering::Acquire) {
                return Err(SessionError::EndedBeforeInit);
            }
            let n = match self.chan.receive(buf) {
                Ok(n) => n,
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR | libc::EAGAIN) => continue,
                    Some(libc::ENODEV | libc::ECONNABORTED) => return Err(SessionError::EndedBeforeInit),
                    _ => return Err(SessionError::Io(e)),
                },
            };
            let msg = &buf[..n];
            let init = match Request::parse(msg, 0) {
                Ok(Request {
                    op: Operation::Init { arg },
                    header,
                    ..
                }) => (header.unique, arg),
                // The kernel sends nothing before INIT is answered: any
                // other request means someone answered INIT already.
                // Answering it (or the ones after it) with errors would
                // fail every caller of a live mount for good.
                Ok(req) => {
                    return Err(SessionError::AlreadyInitialised(req.op.opcode()));
                }
                Err(e) => {
                    log::error!("malformed request before INIT: {e}");
                    if let Some(u) = peek_unique(msg) {
                        self.send(Opcode::Init, &Reply::error(u, Errno::EIO));
                    }
                    continue;
                }
            };
            let (unique, arg) = init;
            match self.init(unique, &arg)? {
                Some(n) => return Ok(n),
                None => continue,
            }
        }
    }

    fn send(&self, op: Opcode, msg: &Reply<'_>) {
        crate::transport::send_reply(&*self.chan, op, msg.header().unique, msg);
    }

    fn init(&mut self, unique: u64, arg: &InitIn) -> Result<Option<Negotiated>, SessionError> {
        match check_version(arg) {
            Some(InitOutcome::NewerMajor(out)) => {
                log::info!(
                    "kernel speaks protocol {}.{}; offering 7.{}",
                    arg.major,
                    arg.minor,
                    out.minor
                );
                self.send(
                    Opcode::Init,
                    &Reply::init(unique, &out, fuse_proto::consts::KERNEL_MINOR_VERSION),
                );
                return Ok(None);
            }
            Some(InitOutcome::Reject(why)) => {
                log::error!("{why}");
                self.send(
                    Opcode::Init,
                    &Reply::error(unique, Errno::new_or_eio(libc::EPROTO)),
                );
                return Err(SessionError::Unsupported(why));
            }
            None => {}
        }
        let mut cfg = InitConfig::new(arg);
        cfg.default_permissions = self.mount_default_permissions;
        if self.uring {
            cfg.want(InitFlags::OVER_IO_URING);
        }
        if let Err(e) = self.fs.init(&mut cfg) {
            self.send(Opcode::Init, &Reply::error(unique, e));
            return Err(SessionError::FilesystemRefused(e));
        }
        let (n, out) = negotiate(&cfg, self.uring, self.config.atomic_open);
        log::info!(
            "INIT: protocol 7.{} (kernel 7.{}), max_write {}, granted {:?}",
            n.minor,
            n.kernel_minor,
            n.max_write,
            n.flags
        );
        let resent = unique & fuse_proto::consts::UNIQUE_RESEND != 0;
        crate::fault::point(Opcode::Init, crate::fault::Point::Effect, resent);
        if let Some(hook) = &self.config.on_negotiated {
            (hook.0)(&n);
        }
        crate::fault::point(Opcode::Init, crate::fault::Point::Reply, resent);
        self.send(Opcode::Init, &Reply::init(unique, &out, arg.minor));
        Ok(Some(n))
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
fn unmount_guard(g: &Mutex<Option<MountGuard>>, left: &Mutex<Option<String>>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_pool_starts_two_workers_per_cpu_and_explicit_counts_win() {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let pool = SessionConfig::default().resolved();
        assert_eq!(pool.floor, 2 * cpus);
        assert_eq!(pool.max, (8 * cpus).max(16));
        let three = SessionConfig {
            workers: 3,
            max_workers: 2,
            ..SessionConfig::default()
        }
        .resolved();
        assert_eq!((three.floor, three.max), (3, 3));
    }

    #[test]
    fn a_connection_on_io_uring_is_not_taken_over() {
        struct Nothing;
        impl Filesystem for Nothing {}
        let negotiated = |flags| Negotiated {
            minor: 45,
            kernel_minor: 45,
            offered: InitFlags::OVER_IO_URING | InitFlags::HAS_RESEND,
            flags,
            refused: Vec::new(),
            max_write: 1 << 20,
            max_pages: 256,
            max_readahead: 1 << 17,
            max_background: 12,
            congestion_threshold: 9,
            time_gran: 1,
            max_stack_depth: 0,
            request_timeout: 0,
            default_permissions: false,
        };
        let dev = || std::os::fd::OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let refused = Session::resume(
            Arc::new(Nothing),
            dev(),
            negotiated(InitFlags::OVER_IO_URING),
            SessionConfig::default(),
        );
        let e = refused.err().expect("an io_uring connection is refused");
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("ECANCELED"), "{e}");
        // The same connection on /dev/fuse is taken (not served: dropped).
        assert!(
            Session::resume(
                Arc::new(Nothing),
                dev(),
                negotiated(InitFlags::ASYNC_READ),
                SessionConfig::default()
            )
            .is_ok()
        );
    }

    #[test]
    fn the_descriptor_bound_counts_each_worker_thread_and_each_ring() {
        let dev = SessionConfig {
            workers: 2,
            max_workers: 4,
            ..SessionConfig::default()
        };
        // Five threads: each a clone of the fd and two pipes.
        assert_eq!(dev.max_descriptors(), 8 + 5 * 5);
        let spliced = SessionConfig {
            splice_write: true,
            clone_fd: false,
            ..dev.clone()
        };
        assert_eq!(spliced.max_descriptors(), 8 + 5 * 6);
        let queues = uring::possible_cpus().unwrap();
        let ring = SessionConfig {
            transport: Transport::Uring,
            ..dev.clone()
        };
        assert_eq!(ring.max_descriptors(), dev.max_descriptors() + 1 + 4 * queues);
    }
}
