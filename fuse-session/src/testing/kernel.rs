//! The test kernel: a [`Filesystem`] served by a real [`Session`] on the
//! in-memory fake kernel ([`crate::transport::fake`]), driven by the
//! test's threads (it is `Sync`: several may send at once, as several
//! processes do). It sends INIT at the chosen minor and capabilities,
//! sends each request with the caller identity of the moment, waits
//! (bounded) for the reply to that request, and passes both through the
//! [`Checker`], in the order they crossed the fake `/dev/fuse`. At the
//! end it compares the filesystem's lookup counts with the kernel's,
//! forgets every node the kernel still holds, as an unmount does, and
//! ends the session.
//!
//! No thread is started besides the session's own; nothing here panics on
//! what the filesystem answers: a missing or malformed reply, or a
//! handler that panicked, is a [`Violation`] and reaches the test as
//! `EIO`, as it reaches a caller.

use super::checker::{Answer, Checker, Rule, Violation};
use super::wire::{self, Caller, ReplyBody};
use crate::ProcCredentials;
use crate::filesystem::Filesystem;
use crate::init::Negotiated;
use crate::session::{RunningSession, Session, SessionConfig, SessionError, SessionHandle, SessionReport};
use crate::transport::fake::FakeKernel;
use crate::types::Inode;
use fuse_proto::abi::{BatchForgetIn, ForgetIn, ForgetOne, InitIn, InitOut, InterruptIn};
use fuse_proto::consts::{INT_REQ_BIT, KERNEL_MINOR_VERSION, KERNEL_VERSION, MIN_MINOR_VERSION};
use fuse_proto::flags::InitFlags;
use fuse_proto::request::ParseConfig;
use fuse_proto::{Errno, Opcode, version};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use zerocopy::IntoBytes;

/// Reads a filesystem's own lookup counts, by node id (the node and path
/// layers' `lookup_counts()`).
pub type LookupCounts<'a, F> = dyn Fn(&F) -> Vec<(Inode, u64)> + 'a;

/// How long [`TestKernel::compare_lookup_counts`] gives the handlers of
/// FORGETs already read to finish.
const FORGET_GRACE: Duration = Duration::from_secs(1);

/// How long a reply is awaited by default ([`Setup::timeout`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one waiting thread reads the fake `/dev/fuse` before it looks
/// whether another thread received its reply meanwhile.
const RECEIVE_SLICE: Duration = Duration::from_millis(5);

/// What a Linux 6.18 kernel offers at INIT, less what the fake kernel
/// cannot honour: it keeps no page cache (`WRITEBACK_CACHE`), sends no
/// security contexts or group extensions (`SECURITY_CTX`,
/// `CREATE_SUPP_GROUP`), and has no `/dev/fuse` for backing files or
/// rings (`PASSTHROUGH`, `OVER_IO_URING`).
pub const KERNEL_OFFERS: InitFlags = InitFlags::ASYNC_READ
    .union(InitFlags::POSIX_LOCKS)
    .union(InitFlags::ATOMIC_O_TRUNC)
    .union(InitFlags::EXPORT_SUPPORT)
    .union(InitFlags::BIG_WRITES)
    .union(InitFlags::DONT_MASK)
    .union(InitFlags::FLOCK_LOCKS)
    .union(InitFlags::HAS_IOCTL_DIR)
    .union(InitFlags::AUTO_INVAL_DATA)
    .union(InitFlags::DO_READDIRPLUS)
    .union(InitFlags::READDIRPLUS_AUTO)
    .union(InitFlags::ASYNC_DIO)
    .union(InitFlags::NO_OPEN_SUPPORT)
    .union(InitFlags::PARALLEL_DIROPS)
    .union(InitFlags::HANDLE_KILLPRIV)
    .union(InitFlags::POSIX_ACL)
    .union(InitFlags::ABORT_ERROR)
    .union(InitFlags::MAX_PAGES)
    .union(InitFlags::CACHE_SYMLINKS)
    .union(InitFlags::NO_OPENDIR_SUPPORT)
    .union(InitFlags::EXPLICIT_INVAL_DATA)
    .union(InitFlags::HANDLE_KILLPRIV_V2)
    .union(InitFlags::SETXATTR_EXT)
    .union(InitFlags::INIT_EXT)
    .union(InitFlags::HAS_EXPIRE_ONLY)
    .union(InitFlags::DIRECT_IO_ALLOW_MMAP)
    .union(InitFlags::NO_EXPORT_SUPPORT)
    .union(InitFlags::HAS_RESEND)
    .union(InitFlags::ALLOW_IDMAP);

/// How a [`TestKernel`] starts.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The kernel's protocol minor (of major 7): the session negotiates
    /// `min(minor, 45)`. At least 12, the oldest the session speaks. A
    /// kernel of that minor offers only the flags it knows
    /// ([`InitFlags::known_at`]): `offered` is cut to them.
    pub minor: u32,
    /// What the kernel offers at INIT (default [`KERNEL_OFFERS`]), of the
    /// flags known at `minor`.
    pub offered: InitFlags,
    /// The kernel's read-ahead limit.
    pub max_readahead: u32,
    /// The session's configuration. The default runs one worker (the pool
    /// still grows while it is busy) and never reads `/proc` for callers'
    /// groups, since the kit's callers are made up.
    pub session: SessionConfig,
    /// Who sends requests until [`TestKernel::set_caller`] says otherwise
    /// (default: [`Caller::current`]).
    pub caller: Caller,
    /// How long to wait for a reply before reporting it missing (default
    /// [`DEFAULT_TIMEOUT`], 10 s: long enough for a loaded CI machine; a
    /// test of a reply that never comes sets less, see also
    /// [`TestKernel::set_timeout`]).
    pub timeout: Duration,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            minor: KERNEL_MINOR_VERSION,
            offered: KERNEL_OFFERS,
            max_readahead: 128 * 1024,
            session: SessionConfig {
                workers: 1,
                proc_credentials: ProcCredentials::Never,
                ..SessionConfig::default()
            },
            caller: Caller::current(),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// Why a [`TestKernel`] could not start or end cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KitError {
    /// The minor is older than the session speaks.
    #[error("minor {0} is older than 7.{MIN_MINOR_VERSION}, the oldest the session negotiates")]
    Minor(u32),
    /// The session could not be created or started.
    #[error("the session did not start: {0}")]
    Start(String),
    /// INIT was refused or not answered.
    #[error("INIT failed: {0}")]
    Init(String),
    /// The session did not end within the timeout after the unmount.
    #[error("the session did not end within {0:?} of the unmount")]
    Hung(Duration),
    /// The session ended with an error.
    #[error("the session ended with an error: {0}")]
    Session(#[from] SessionError),
}

/// A request sent and not yet waited for ([`TestKernel::send`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "wait for the reply with TestKernel::wait"]
pub struct Pending {
    /// The request's unique.
    pub unique: u64,
}

/// A filesystem served on the fake kernel; see the [module](super) docs.
/// `Send` and `Sync`: share it (`&k` in scoped threads, or an `Arc`) to
/// send requests from several threads at once.
pub struct TestKernel<F: Filesystem> {
    fs: Arc<F>,
    kernel: FakeKernel,
    running: Option<RunningSession>,
    handle: SessionHandle,
    negotiated: Negotiated,
    init_out: InitOut,
    /// The reply timeout, in nanoseconds.
    timeout: AtomicU64,
    caller: Mutex<Caller>,
    next_unique: AtomicU64,
    /// The checker and what the kit keeps beside it.
    state: Mutex<State>,
    /// Held while a thread reads the fake `/dev/fuse` and checks what it
    /// read, so that the checker sees replies in the order they came.
    receiving: Mutex<()>,
    /// The end was reported already (by [`TestKernel::finish`]).
    finished: bool,
}

/// What the kit's threads share.
pub(super) struct State {
    pub(super) checker: Checker,
    /// Answers that arrived while another was awaited.
    parked: HashMap<u64, Answer>,
    /// Notifications the filesystem sent (whole messages).
    notifications: Vec<Vec<u8>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test thread that panicked holding it left nothing half-done that
    // the next one cannot read.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<F: Filesystem> TestKernel<F> {
    /// Serves `fs` with the default [`Setup`] (the newest minor, what a
    /// Linux 6.18 kernel offers, the test process as caller).
    pub fn start(fs: F) -> Result<Self, KitError> {
        Self::start_with(Arc::new(fs), Setup::default())
    }

    /// Serves `fs` (the test keeps a reference to look inside) as `setup` says.
    pub fn start_with(fs: Arc<F>, setup: Setup) -> Result<Self, KitError> {
        if setup.minor < MIN_MINOR_VERSION {
            return Err(KitError::Minor(setup.minor));
        }
        let (kernel, chan) = FakeKernel::new();
        let session = Session::from_arc(fs.clone(), chan, setup.session.clone())
            .map_err(|e| KitError::Start(e.to_string()))?;
        let running = session.spawn().map_err(|e| KitError::Start(e.to_string()))?;
        let handle = running.handle().clone();
        let minor = setup.minor.min(KERNEL_MINOR_VERSION);
        let offered = setup.offered & InitFlags::known_at(setup.minor);
        let mut k = TestKernel {
            fs,
            kernel,
            running: Some(running),
            handle,
            negotiated: Negotiated {
                minor,
                kernel_minor: setup.minor,
                offered,
                flags: InitFlags::empty(),
                refused: Vec::new(),
                max_write: 0,
                max_pages: 0,
                max_readahead: 0,
                max_background: 0,
                congestion_threshold: 0,
                time_gran: 0,
                max_stack_depth: 0,
                request_timeout: 0,
                default_permissions: false,
            },
            init_out: InitOut::default(),
            timeout: AtomicU64::new(nanos(setup.timeout)),
            caller: Mutex::new(setup.caller),
            next_unique: AtomicU64::new(0),
            state: Mutex::new(State {
                checker: Checker::new(ParseConfig::new(setup.minor)),
                parked: HashMap::new(),
                notifications: Vec::new(),
            }),
            receiving: Mutex::new(()),
            finished: false,
        };
        let flags = offered.bits();
        let init = InitIn {
            major: KERNEL_VERSION,
            minor: setup.minor,
            max_readahead: setup.max_readahead,
            flags: flags as u32,
            flags2: (flags >> 32) as u32,
            ..InitIn::default()
        };
        let size = version::init_in_size(setup.minor);
        let r = k.call(Opcode::Init, 0, &[&init.as_bytes()[..size]]);
        match r {
            Ok(ReplyBody::Init(out)) => k.init_out = out,
            Ok(other) => return Err(KitError::Init(format!("unexpected reply {other:?}"))),
            Err(e) => {
                let v = k.take_violations();
                return Err(KitError::Init(format!("{e} {}", list(&v))));
            }
        }
        let start = Instant::now();
        loop {
            if let Some(n) = k.handle.negotiated() {
                k.negotiated = n;
                break;
            }
            if start.elapsed() > k.timeout() {
                return Err(KitError::Init("INIT was answered but never took effect".into()));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        k.state().checker = Checker::new(ParseConfig {
            minor: k.negotiated.minor,
            setxattr_ext: k.negotiated.flags.contains(InitFlags::SETXATTR_EXT),
            atomic_open: false,
        });
        Ok(k)
    }

    /// The checker and the kit's shared state, locked.
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The checker, locked (to ask it more than the kit's methods do).
    pub fn checker(&self) -> CheckerGuard<'_> {
        CheckerGuard(self.state())
    }

    /// How long a reply is awaited before it is reported missing.
    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout.load(Ordering::Relaxed))
    }

    /// Awaits replies `timeout` long from now on (a test of a handler
    /// that never answers sets it short); returns the previous one.
    pub fn set_timeout(&self, timeout: Duration) -> Duration {
        Duration::from_nanos(self.timeout.swap(nanos(timeout), Ordering::Relaxed))
    }

    /// Says that the filesystem's names changed outside the kit (files
    /// made or removed in its backing store): the checker forgets the
    /// names it knew, so that it blames no reply for them.
    pub fn names_changed_outside(&self) {
        self.state().checker.names_changed_outside();
    }

    /// Reports the handlers that panicked so far, each as a violation
    /// naming its request.
    fn collect_panics(&self) {
        let panics = self.handle.take_panics();
        if panics.is_empty() {
            return;
        }
        let mut st = self.state();
        for p in panics {
            st.checker.panicked(p.unique, p.opcode, &p.message);
        }
    }

    /// The filesystem.
    pub fn fs(&self) -> &Arc<F> {
        &self.fs
    }

    /// What INIT negotiated.
    pub fn negotiated(&self) -> &Negotiated {
        &self.negotiated
    }

    /// The INIT reply as the kernel received it.
    pub fn init_reply(&self) -> &InitOut {
        &self.init_out
    }

    /// The session's handle (statistics, notifier).
    pub fn session(&self) -> &SessionHandle {
        &self.handle
    }

    /// The negotiated minor.
    pub fn minor(&self) -> u32 {
        self.negotiated.minor
    }

    /// Sends the following requests as `caller`; returns the previous one.
    /// (One caller for every thread: threads that send as different
    /// callers at once use [`TestKernel::send_as`].)
    pub fn set_caller(&self, caller: Caller) -> Caller {
        std::mem::replace(&mut lock(&self.caller), caller)
    }

    /// Runs `f` with requests sent as `caller`, then goes back to the
    /// caller before.
    pub fn as_caller<R>(&self, caller: Caller, f: impl FnOnce(&Self) -> R) -> R {
        let before = self.set_caller(caller);
        let r = f(self);
        self.set_caller(before);
        r
    }

    /// The caller of the moment.
    pub fn caller(&self) -> Caller {
        *lock(&self.caller)
    }

    /// The checker's violations so far.
    pub fn violations(&self) -> Vec<Violation> {
        self.collect_panics();
        self.state().checker.violations().to_vec()
    }

    /// Takes the violations so far: a test of a filesystem that breaks a
    /// rule on purpose looks at them, and the kit no longer reports them.
    pub fn take_violations(&self) -> Vec<Violation> {
        self.collect_panics();
        self.state().checker.take_violations()
    }

    /// The lookup counts the kernel holds now, by node id.
    pub fn lookup_counts(&self) -> Vec<(Inode, u64)> {
        self.state().checker.lookup_counts()
    }

    /// How many lookups of `node` the kernel holds.
    pub fn lookups_of(&self, node: Inode) -> u64 {
        self.lookup_counts()
            .into_iter()
            .find(|&(n, _)| n == node)
            .map_or(0, |(_, c)| c)
    }

    /// The files and directories the kernel holds open: (node, handle).
    pub fn open_handles(&self) -> Vec<(Inode, u64)> {
        self.state().checker.open_handles()
    }

    /// Compares the filesystem's own lookup counts (what `fs_counts`
    /// reads: the node and path layers' `lookup_counts()`, or a
    /// filesystem's own table) with the kernel's; a difference is a
    /// [`Rule::LookupCount`] violation. FORGETs have no reply: it first
    /// sends a STATFS and waits for its answer (the FORGETs before it were
    /// read by then), then gives their handlers up to a second to agree.
    pub fn compare_lookup_counts(&self, fs_counts: impl Fn(&F) -> Vec<(Inode, u64)>) {
        self.compare_counts(&fs_counts, "lookup counts");
    }

    fn compare_counts(&self, fs_counts: &LookupCounts<'_, F>, what: &str) {
        let want = self.lookup_counts();
        let normal = |mut v: Vec<(Inode, u64)>| {
            v.retain(|&(i, c)| i != Inode::ROOT && c > 0);
            v.sort();
            v
        };
        // FORGETs have no reply: a request answered after them was read
        // after them (one queue), and their handlers, which hold no reply
        // to wait for, are given a moment more to finish.
        let _ = self.statfs(Inode::ROOT);
        let deadline = Instant::now() + self.timeout().min(FORGET_GRACE);
        let mut got = normal(fs_counts(&self.fs));
        while got != want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
            got = normal(fs_counts(&self.fs));
        }
        self.state().checker.compare_lookup_counts(&got, what);
    }

    /// Notifications the filesystem sent so far (whole messages, `unique`
    /// 0 and the code in `error`), taken.
    pub fn take_notifications(&self) -> Vec<Vec<u8>> {
        self.drain(Duration::ZERO);
        std::mem::take(&mut self.state().notifications)
    }

    fn unique(&self) -> u64 {
        // The kernel's uniques are even: bit 0 marks an INTERRUPT.
        self.next_unique.fetch_add(2, Ordering::Relaxed) + 2
    }

    /// Sends one request of `opcode` on `nodeid` whose arguments are
    /// `args` (the kernel's structs and names as bytes, one after the
    /// other), as the caller of the moment; does not wait. Requests that
    /// take no reply (FORGET…) need no [`TestKernel::wait`].
    pub fn send(&self, opcode: Opcode, nodeid: u64, args: &[&[u8]]) -> Pending {
        self.send_as(self.caller(), opcode, nodeid, args)
    }

    /// [`TestKernel::send`] as `caller`, whoever the caller of the moment.
    pub fn send_as(&self, caller: Caller, opcode: Opcode, nodeid: u64, args: &[&[u8]]) -> Pending {
        let unique = self.unique();
        let bytes = wire::encode(unique, opcode, nodeid, caller, args);
        self.sent(bytes);
        Pending { unique }
    }

    /// Shows a request to the checker and sends it, in one step, so that
    /// the checker sees requests in the order the session reads them.
    fn sent(&self, bytes: Vec<u8>) {
        let mut st = self.state();
        st.checker.request(&bytes);
        self.kernel.send(bytes);
    }

    /// The answer to `unique`, if some thread received it.
    fn parked(&self, unique: u64) -> Option<Answer> {
        self.state().parked.remove(&unique)
    }

    /// Waits for the reply to `p`: the decoded body, or the error. A reply
    /// that does not come within the timeout, or that the kernel would
    /// refuse, is a violation and `EIO` here.
    pub fn wait(&self, p: Pending) -> Result<ReplyBody, Errno> {
        let deadline = Instant::now() + self.timeout();
        loop {
            if let Some(a) = self.parked(p.unique) {
                return a.result;
            }
            if Instant::now() >= deadline {
                self.state().checker.unanswered(p.unique);
                return Err(Errno::EIO);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            self.receive(left.min(RECEIVE_SLICE));
        }
    }

    /// Sends a request and waits for its reply.
    pub fn call(&self, opcode: Opcode, nodeid: u64, args: &[&[u8]]) -> Result<ReplyBody, Errno> {
        let p = self.send(opcode, nodeid, args);
        self.wait(p)
    }

    /// Sends INTERRUPT for `p` (which stays pending: wait for it), and
    /// sends it again each time the session answers `EAGAIN` (it had not
    /// read the request yet), as the kernel does, until `p` is answered.
    pub fn interrupt(&self, p: Pending) -> Result<ReplyBody, Errno> {
        let int_unique = p.unique | INT_REQ_BIT;
        let send_interrupt = || {
            let arg = InterruptIn { unique: p.unique };
            let bytes = wire::encode(int_unique, Opcode::Interrupt, 0, self.caller(), &[arg.as_bytes()]);
            self.sent(bytes);
        };
        send_interrupt();
        let deadline = Instant::now() + self.timeout();
        loop {
            if let Some(a) = self.parked(p.unique) {
                return a.result;
            }
            let again = self.parked(int_unique);
            if let Some(Answer {
                result: Err(Errno::EAGAIN),
                ..
            }) = again
            {
                send_interrupt();
            }
            if Instant::now() >= deadline {
                self.state().checker.unanswered(p.unique);
                return Err(Errno::EIO);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            self.receive(left.min(RECEIVE_SLICE));
        }
    }

    /// Receives one message (waiting up to `within`) and checks it; false
    /// if none came.
    fn receive(&self, within: Duration) -> bool {
        let _receiving = lock(&self.receiving);
        let Some(w) = self.kernel.recv(within) else {
            return false;
        };
        let mut st = self.state();
        match st.checker.reply(&w.bytes) {
            Some(a) => {
                st.parked.insert(a.unique, a);
            }
            None => {
                if w.bytes.get(8..16).is_some_and(|u| u == [0; 8]) {
                    st.notifications.push(w.bytes);
                }
            }
        }
        true
    }

    /// Takes every message already written, waiting up to `within` for the
    /// first.
    fn drain(&self, within: Duration) {
        if self.receive(within) {
            while self.receive(Duration::ZERO) {}
        }
    }

    /// FORGET of `n` lookups of `node`.
    pub fn forget(&self, node: Inode, n: u64) {
        let _ = self.send(Opcode::Forget, node.0, &[ForgetIn { nlookup: n }.as_bytes()]);
    }

    /// BATCH_FORGET of several nodes at once.
    pub fn batch_forget(&self, nodes: &[(Inode, u64)]) {
        if nodes.is_empty() {
            return;
        }
        let head = BatchForgetIn {
            count: nodes.len() as u32,
            dummy: 0,
        };
        let ones: Vec<ForgetOne> = nodes
            .iter()
            .map(|&(n, c)| ForgetOne {
                nodeid: n.0,
                nlookup: c,
            })
            .collect();
        let _ = self.send(Opcode::BatchForget, 0, &[head.as_bytes(), ones.as_bytes()]);
    }

    /// Forgets every lookup the kernel holds, as an unmount does (the
    /// kernel evicts its inodes, sending FORGET for each).
    pub fn forget_all(&self) {
        let held = self.lookup_counts();
        self.batch_forget(&held);
    }

    /// Ends the test: compares the kernel's lookup counts with the
    /// filesystem's own if `fs_counts` reads them, forgets every node the
    /// kernel holds (as an unmount does) and compares again (every count
    /// should be gone: one left is a leak), ends the session (bounded),
    /// and returns its report, or every violation the checker saw and the
    /// test did not take (handler panics included).
    pub fn finish_with(mut self, fs_counts: Option<&LookupCounts<'_, F>>) -> Result<SessionReport, Report> {
        self.finished = true;
        if let Some(fs_counts) = fs_counts {
            self.compare_counts(&fs_counts, "at the end of the test");
        }
        self.forget_all();
        if let Some(fs_counts) = fs_counts {
            self.compare_counts(&fs_counts, "after every node was forgotten");
        }
        let ended = self.end();
        let violations = self.take_violations();
        match (ended, violations.is_empty()) {
            (Ok(r), true) => Ok(r),
            (Ok(_), false) => Err(Report {
                violations,
                error: None,
            }),
            (Err(e), _) => Err(Report {
                violations,
                error: Some(e),
            }),
        }
    }

    /// [`TestKernel::finish_with`] for a filesystem whose own counts are
    /// not visible.
    pub fn finish(self) -> Result<SessionReport, Report> {
        self.finish_with(None)
    }

    fn end(&mut self) -> Result<SessionReport, KitError> {
        self.kernel.unmount();
        let Some(running) = self.running.take() else {
            return Err(KitError::Start("the session already ended".into()));
        };
        let deadline = Instant::now() + self.timeout();
        while !running.is_finished() {
            if Instant::now() > deadline {
                // Dropping it would wait: keep it for the process's end.
                std::mem::forget(running);
                return Err(KitError::Hung(self.timeout()));
            }
            self.drain(Duration::from_millis(5));
        }
        self.drain(Duration::ZERO);
        Ok(running.join()?)
    }
}

/// The checker, locked ([`TestKernel::checker`]).
pub struct CheckerGuard<'a>(MutexGuard<'a, State>);

impl std::ops::Deref for CheckerGuard<'_> {
    type Target = Checker;
    fn deref(&self) -> &Checker {
        &self.0.checker
    }
}

impl std::ops::DerefMut for CheckerGuard<'_> {
    fn deref_mut(&mut self) -> &mut Checker {
        &mut self.0.checker
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What [`TestKernel::finish`] found wrong. Its `Debug` is its `Display`
/// (the readable report), so that `finish().unwrap()` prints it.
#[must_use = "a report holds the violations found: fail the test with it"]
pub struct Report {
    /// Every violation the test did not take.
    pub violations: Vec<Violation>,
    /// Why the session did not end cleanly, if it did not.
    pub error: Option<KitError>,
}

impl Report {
    /// Whether some violation breaks `rule`.
    pub fn breaks(&self, rule: Rule) -> bool {
        self.violations.iter().any(|v| v.rule == rule)
    }
}

fn list(v: &[Violation]) -> String {
    v.iter().map(|v| format!("\n  {v}")).collect()
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} protocol violation(s){}",
            self.violations.len(),
            list(&self.violations)
        )?;
        if let Some(e) = &self.error {
            write!(f, "\nand {e}")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Report {}

impl<F: Filesystem> Drop for TestKernel<F> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let _ = self.end();
        let v = self.take_violations();
        if !v.is_empty() && !std::thread::panicking() {
            panic!(
                "the test ended without TestKernel::finish and left {} protocol violation(s):{}",
                v.len(),
                list(&v)
            );
        }
    }
}
