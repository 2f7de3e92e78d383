//! The test kernel: a [`Filesystem`] served by a real [`Session`] on the
//! in-memory fake kernel ([`crate::transport::fake`]), driven by the test's
//! own thread. It sends INIT at the chosen minor and capabilities, sends
//! each request with the caller identity of the moment, waits (bounded) for
//! the reply to that request, and passes both through the [`Checker`].
//! At the end it forgets every node the kernel still holds, as an unmount
//! does, and ends the session.
//!
//! No thread is started besides the session's own; nothing here panics on
//! what the filesystem answers: a missing or malformed reply is a
//! [`Violation`] and reaches the test as `EIO`, as it reaches a caller.

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
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerocopy::IntoBytes;

/// Reads a filesystem's own lookup counts, by node id (the node and path
/// layers' `lookup_counts()`).
pub type LookupCounts<'a, F> = dyn Fn(&F) -> Vec<(Inode, u64)> + 'a;

/// How long [`TestKernel::compare_lookup_counts`] gives the handlers of
/// FORGETs already read to finish.
const FORGET_GRACE: Duration = Duration::from_secs(1);

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
    /// `min(minor, 45)`. At least 12, the oldest the session speaks.
    pub minor: u32,
    /// What the kernel offers at INIT (default [`KERNEL_OFFERS`]).
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
    /// How long to wait for a reply before reporting it missing.
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
            timeout: Duration::from_secs(10),
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
pub struct TestKernel<F: Filesystem> {
    fs: Arc<F>,
    kernel: FakeKernel,
    running: Option<RunningSession>,
    handle: SessionHandle,
    negotiated: Negotiated,
    init_out: InitOut,
    timeout: Duration,
    caller: Cell<Caller>,
    next_unique: Cell<u64>,
    pub(super) checker: RefCell<Checker>,
    /// Answers that arrived while another was awaited.
    parked: RefCell<HashMap<u64, Answer>>,
    /// Notifications the filesystem sent (whole messages).
    notifications: RefCell<Vec<Vec<u8>>>,
    /// The end was reported already (by [`TestKernel::finish`]).
    finished: bool,
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
        let mut k = TestKernel {
            fs,
            kernel,
            running: Some(running),
            handle,
            negotiated: Negotiated {
                minor,
                kernel_minor: setup.minor,
                offered: setup.offered,
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
            timeout: setup.timeout,
            caller: Cell::new(setup.caller),
            next_unique: Cell::new(0),
            checker: RefCell::new(Checker::new(ParseConfig::new(setup.minor))),
            parked: RefCell::new(HashMap::new()),
            notifications: RefCell::new(Vec::new()),
            finished: false,
        };
        let flags = setup.offered.bits();
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
            if start.elapsed() > k.timeout {
                return Err(KitError::Init("INIT was answered but never took effect".into()));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        k.checker.replace(Checker::new(ParseConfig {
            minor: k.negotiated.minor,
            setxattr_ext: k.negotiated.flags.contains(InitFlags::SETXATTR_EXT),
            atomic_open: false,
        }));
        Ok(k)
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
    pub fn set_caller(&self, caller: Caller) -> Caller {
        self.caller.replace(caller)
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
        self.caller.get()
    }

    /// The checker's violations so far.
    pub fn violations(&self) -> Vec<Violation> {
        self.checker.borrow().violations().to_vec()
    }

    /// Takes the violations so far: a test of a filesystem that breaks a
    /// rule on purpose looks at them, and the kit no longer reports them.
    pub fn take_violations(&self) -> Vec<Violation> {
        self.checker.borrow_mut().take_violations()
    }

    /// The lookup counts the kernel holds now, by node id.
    pub fn lookup_counts(&self) -> Vec<(Inode, u64)> {
        self.checker.borrow().lookup_counts()
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
        self.checker.borrow().open_handles()
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
        let deadline = Instant::now() + self.timeout.min(FORGET_GRACE);
        let mut got = normal(fs_counts(&self.fs));
        while got != want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
            got = normal(fs_counts(&self.fs));
        }
        self.checker.borrow_mut().compare_lookup_counts(&got, what);
    }

    /// Notifications the filesystem sent so far (whole messages, `unique`
    /// 0 and the code in `error`), taken.
    pub fn take_notifications(&self) -> Vec<Vec<u8>> {
        self.drain(Duration::ZERO);
        std::mem::take(&mut self.notifications.borrow_mut())
    }

    fn unique(&self) -> u64 {
        // The kernel's uniques are even: bit 0 marks an INTERRUPT.
        let u = self.next_unique.get() + 2;
        self.next_unique.set(u);
        u
    }

    /// Sends one request of `opcode` on `nodeid` whose arguments are
    /// `args` (the kernel's structs and names as bytes, one after the
    /// other), as the caller of the moment; does not wait. Requests that
    /// take no reply (FORGET…) need no [`TestKernel::wait`].
    pub fn send(&self, opcode: Opcode, nodeid: u64, args: &[&[u8]]) -> Pending {
        let unique = self.unique();
        let bytes = wire::encode(unique, opcode, nodeid, self.caller.get(), args);
        self.checker.borrow_mut().request(&bytes);
        self.kernel.send(bytes);
        Pending { unique }
    }

    /// Waits for the reply to `p`: the decoded body, or the error. A reply
    /// that does not come within the timeout, or that the kernel would
    /// refuse, is a violation and `EIO` here.
    pub fn wait(&self, p: Pending) -> Result<ReplyBody, Errno> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(a) = self.parked.borrow_mut().remove(&p.unique) {
                return a.result;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.receive(left) {
                self.checker.borrow_mut().unanswered(p.unique);
                return Err(Errno::EIO);
            }
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
            let bytes = wire::encode(
                int_unique,
                Opcode::Interrupt,
                0,
                self.caller.get(),
                &[arg.as_bytes()],
            );
            self.checker.borrow_mut().request(&bytes);
            self.kernel.send(bytes);
        };
        send_interrupt();
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(a) = self.parked.borrow_mut().remove(&p.unique) {
                return a.result;
            }
            let again = self.parked.borrow_mut().remove(&int_unique);
            if let Some(Answer {
                result: Err(Errno::EAGAIN),
                ..
            }) = again
            {
                send_interrupt();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.receive(left) {
                self.checker.borrow_mut().unanswered(p.unique);
                return Err(Errno::EIO);
            }
        }
    }

    /// Receives one message (waiting up to `within`); false if none came.
    fn receive(&self, within: Duration) -> bool {
        let Some(w) = self.kernel.recv(within) else {
            return false;
        };
        match self.checker.borrow_mut().reply(&w.bytes) {
            Some(a) => {
                self.parked.borrow_mut().insert(a.unique, a);
            }
            None => {
                if w.bytes.get(8..16).is_some_and(|u| u == [0; 8]) {
                    self.notifications.borrow_mut().push(w.bytes);
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

    /// Ends the test: forgets every node the kernel holds (as an unmount
    /// does), compares with the filesystem's own counts if `fs_counts`
    /// reads them (after the forgets every count should be gone: one left
    /// is a leak), ends the session (bounded), and returns its report, or
    /// every violation the checker saw and the test did not take.
    pub fn finish_with(mut self, fs_counts: Option<&LookupCounts<'_, F>>) -> Result<SessionReport, Report> {
        self.finished = true;
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
        let deadline = Instant::now() + self.timeout;
        while !running.is_finished() {
            if Instant::now() > deadline {
                // Dropping it would wait: keep it for the process's end.
                std::mem::forget(running);
                return Err(KitError::Hung(self.timeout));
            }
            self.drain(Duration::from_millis(5));
        }
        self.drain(Duration::ZERO);
        Ok(running.join()?)
    }
}

/// What [`TestKernel::finish`] found wrong.
#[derive(Debug)]
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
