//! How a session runs: [`SessionConfig`] with its defaults, the
//! mount options it takes (`take_option`), the descriptors it needs, the
//! pool it resolves to, and the hooks a keeper sets (worker channels given,
//! INIT's outcome, the steps of starting).

use crate::credentials::ProcCredentials;
use crate::init::Negotiated;
use crate::pool::PoolConfig;
use crate::transport::uring;
use crate::transport::{Channel, Transport};
use std::sync::Arc;
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
    /// [`MountOptions::parse_known`](crate::mount::MountOptions::parse_known) leaves over): `threads=N` (N > 0, sets
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

    pub(super) fn resolved(&self) -> PoolConfig {
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
