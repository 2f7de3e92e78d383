//! The keeper: a small process that mounts, holds the connection, and runs
//! the serving daemon as its child, so that the daemon can die or be
//! upgraded without the mount going away.
//!
//! The kernel keeps a FUSE connection alive while any process holds one of
//! its `/dev/fuse` files; it ends the requests read through a file only
//! when that file's last reference closes (`fuse_dev_release`). The keeper
//! holds every file a daemon reads from: the connection's, and the clones
//! it makes for the workers (a daemon under a keeper makes none of its
//! own), so a request a daemon read before it died stays with the kernel,
//! and the successor has it sent again ([`crate::Session::resume`]).
//!
//! - A child that dies (signal, or exit other than "unmounted") is
//!   replaced at once by a new one from the same program path, which takes
//!   the connection over.
//! - `SIGUSR2` to the keeper is a graceful upgrade: the running child is
//!   asked to retire at a request boundary and hand its state back, then a
//!   new child (from the program on disk now) takes over with that state.
//! - A child that does not retire by the deadline (a request it serves
//!   does not end) is not killed for an upgrade: the retirement is called
//!   off and it serves on.
//! - `SIGINT`, `SIGTERM` or `SIGHUP` to the keeper: the child retires, the
//!   keeper unmounts and exits.
//! - A child that exits with status 0 saw the mount go (unmounted from
//!   outside): the keeper exits too.
//! - A keeper that dies leaves its child serving: the child's copy of the
//!   file keeps the connection, so clients see nothing, but nobody
//!   restarts the daemon any more.
//!
//! The child finds its keeper with [`KeeperLink::from_env`] and serves with
//! [`KeeperLink::serve`]. Messages on the socket between them: keeper to
//! child, the connection (fresh, or a [`Handover`]), then `R` (retire) and
//! `C` (call a retirement off: it passed its deadline, and the child serves
//! on); child to keeper, `N` with what INIT negotiated, `S` with its state
//! when it retires, and `X` with why it refuses to serve (a filesystem
//! without a recovery contract, [`crate::Filesystem::recovery`]).

use crate::filesystem::Filesystem;
use crate::handover::{Handover, HandoverError, recv_fds, send_with_fd};
use crate::init::Negotiated;
use crate::journal::Journal;
use crate::mount::{Mount, MountError, MountOptions};
use crate::session::{NegotiatedHook, Session, SessionConfig, SessionError, SessionHandle};
use crate::transport::dev_fuse::DevFuse;
use crate::vault::{RESERVED_KEYS, Vault, VaultStore};
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// The environment variable naming the child's end of the keeper socket.
pub const KEEPER_FD_ENV: &str = "FUSE_WIRE_KEEPER_FD";

/// Exit status of a child that retired at the keeper's request.
const RETIRED: i32 = 75;

/// Why the keeper stopped.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// Mounting failed.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// Starting a daemon failed.
    #[error("starting the daemon {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A socket or signal set-up failed.
    #[error("keeper: {0}")]
    Io(#[from] io::Error),
    /// The daemon refused to serve under a keeper, and said why (a
    /// filesystem that states no recovery contract,
    /// [`crate::Filesystem::recovery`]). The mount is ended.
    #[error("the daemon refused to serve under a keeper: {0} (the mount is ended)")]
    Refused(String),
    /// Daemons keep dying before they serve.
    #[error("the daemon died {0} times in a row before serving; giving up (the mount is ended)")]
    CrashLoop(u32),
}

/// What the keeper saw, when it ends.
#[derive(Debug, Default)]
pub struct KeeperReport {
    /// Daemons started, the first included.
    pub started: u32,
    /// Daemons that died and were replaced.
    pub crashes: u32,
    /// Graceful upgrades done.
    pub upgrades: u32,
    /// Upgrades that did not go through: refused (the program could not be
    /// started; the running daemon served on) or undone (the upgraded
    /// daemon failed to take over; the previous binary served again) or
    /// called off (the daemon did not retire by the deadline, a request it
    /// served not ending, and served on).
    pub failed_upgrades: u32,
}

static SIGNALLED: AtomicI32 = AtomicI32::new(0);

/// The write end of the keeper's wake-up pipe (-1 before it exists).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn note_signal(sig: libc::c_int) {
    if sig != libc::SIGCHLD {
        SIGNALLED.store(sig, Ordering::SeqCst);
    }
    let fd = WAKE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = 0u8;
        // SAFETY: write(2) is async-signal-safe; a full pipe already wakes.
        unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
    }
}

/// The last signal caught (0: none since the last call).
pub(crate) fn take_signal() -> i32 {
    SIGNALLED.swap(0, Ordering::SeqCst)
}

/// Installs the handlers; returns the read end of the pipe they write to,
/// so that the keeper sleeps until a signal (a child's death included) or
/// a message comes, instead of waking up on a timer.
pub(crate) fn install_signals() -> io::Result<OwnedFd> {
    let (rd, wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(io::Error::from)?;
    WAKE_FD.store(wr.as_raw_fd(), Ordering::Relaxed);
    // The write end lives as long as the process: the handler may run at
    // any time.
    std::mem::forget(wr);
    for sig in [
        libc::SIGUSR2,
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGCHLD,
    ] {
        // SAFETY: a handler that only stores to an atomic and writes to a
        // pipe is async-signal-safe; no SA_RESTART, so waits return EINTR.
        let r = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = note_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(rd)
}

/// Sleeps until the child sends something or a signal comes (the wake-up
/// pipe: a child's death is SIGCHLD), with no timer; then empties the pipe.
/// Deposits are read at most every [`DEPOSIT_BATCH`], so that a daemon
/// opening many files wakes the keeper once per batch, not once per file.
fn wait_for_event(run: &Running, wake: &OwnedFd) {
    let since = run.drained.get().elapsed();
    let mut fds = [
        libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: run.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: run.vault.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let (n, timeout) = if since >= DEPOSIT_BATCH {
        (3, -1)
    } else {
        (2, (DEPOSIT_BATCH - since).as_millis() as i32 + 1)
    };
    // SAFETY: `n` live pollfd entries; EINTR (a signal) is a wake-up too.
    unsafe { libc::poll(fds.as_mut_ptr(), n, timeout) };
    if fds[1..]
        .iter()
        .any(|f| f.revents & (libc::POLLHUP | libc::POLLERR) != 0)
    {
        // The child closed its end (it is exiting): wait for SIGCHLD, not
        // for a socket that stays readable.
        // SAFETY: one live pollfd entry.
        unsafe { libc::poll(fds.as_mut_ptr(), 1, 1000) };
    }
    drain_wake(wake);
}

/// Sleeps until a signal comes (the wake-up pipe of [`install_signals`]),
/// then empties the pipe.
pub(crate) fn wait_for_signal(wake: &OwnedFd) {
    let mut p = libc::pollfd {
        fd: wake.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd entry; EINTR (a signal) is a wake-up too.
    unsafe { libc::poll(&mut p, 1, -1) };
    drain_wake(wake);
}

/// Empties the wake-up pipe, so that the next wait sleeps.
fn drain_wake(wake: &OwnedFd) {
    let mut buf = [0u8; 64];
    // SAFETY: reads into a live buffer from our non-blocking pipe.
    while unsafe { libc::read(wake.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}

/// The longest a deposit waits in the socket before the keeper reads it.
const DEPOSIT_BATCH: Duration = Duration::from_millis(10);

/// One running child, the keeper's end of its socket and of its vault.
struct Running {
    child: Child,
    sock: UnixStream,
    vault: OwnedFd,
    drained: std::cell::Cell<Instant>,
    /// The binary it runs.
    source: Source,
    /// It reported what INIT negotiated: it serves.
    serving: bool,
    /// It refused to serve, and said why (`X`): starting another from the
    /// same binary would be refused the same way.
    refused: Option<String>,
}

impl Running {
    /// Reads its messages; an INIT report says it serves. From then on the
    /// state it was started with is out of date, and is dropped: a daemon
    /// that replaces it after a crash must not start from it (it would
    /// serve the files as they were at the upgrade).
    fn pump(&mut self, negotiated: &mut Option<Negotiated>, state: &mut Vec<u8>) {
        if pump_messages(&mut self.sock, negotiated, state, &mut self.refused) {
            self.serving = true;
            *state = Vec::new();
        }
    }

    /// Takes the deposits waiting. Only a drain that read something starts
    /// a batch period ([`DEPOSIT_BATCH`]): an idle daemon's keeper sleeps
    /// on the socket, it does not wake on a timer.
    fn drain(&self, store: &mut VaultStore) {
        let before = store.messages();
        store.drain(&self.vault);
        if store.messages() != before {
            self.drained.set(Instant::now());
        }
    }

    /// Takes every deposit of a child that has exited (all it sent is in
    /// the socket, then its end).
    fn drain_all(&self, store: &mut VaultStore) {
        if !store.drain(&self.vault) {
            log::warn!("keeper: the daemon's vault did not end with it");
        }
        log::debug!("keeper: holding {} deposited descriptors", store.len());
    }
}

/// Mounts `mountpoint` with `opts`, then runs `program` with `args` as the
/// serving daemon (with [`KEEPER_FD_ENV`] set), replacing it whenever it
/// dies, until the mount goes or the keeper is told to stop. `program` is
/// looked up anew at each upgrade, so an upgrade runs the binary on disk;
/// the keeper holds the binary each daemon was started from, so that an
/// upgraded daemon that fails to take over (it exits before serving: a
/// state it refuses, a broken build) is replaced by one from the previous
/// binary, with the same state, and the mount stays served. An upgrade to
/// a program that is missing or not executable is refused before the
/// running daemon is retired. A daemon that crashes is replaced from the
/// binary it ran.
///
/// What survives depends on the daemon's filesystem
/// ([`Filesystem::recovery`]): one built on the path layer with
/// [`crate::path::PathFs::kept`] keeps every node id, lookup count and open
/// file the kernel holds across crashes and upgrades; a node layer daemon
/// is refused, and the keeper then ends the mount (`docs/recovery.md`).
pub fn run_keeper(
    mountpoint: impl AsRef<std::path::Path>,
    opts: &MountOptions,
    program: PathBuf,
    args: Vec<OsString>,
) -> Result<KeeperReport, KeeperError> {
    let wake = install_signals()?;
    let mount = Mount::new(mountpoint.as_ref(), opts)?;
    let (dev, guard) = mount.into_parts();
    let mut report = KeeperReport::default();
    let mut negotiated: Option<Negotiated> = None;
    let mut state: Vec<u8> = Vec::new();
    let mut store = VaultStore::default();
    hold_worker_clones(&dev, &mut store);
    // Daemons in a row that died before serving.
    let mut failed_starts = 0u32;
    let spawn = |from: Source,
                 negotiated: &Option<Negotiated>,
                 state: &[u8],
                 store: &VaultStore,
                 report: &mut KeeperReport| {
        let r = start_child(
            from,
            &program,
            &args,
            &dev,
            negotiated.as_ref(),
            state,
            store,
            opts.default_permissions,
        );
        report.started += 1;
        r
    };
    let mut run = spawn(Source::Disk, &negotiated, &state, &store, &mut report)?;
    // The binary to go back to if an upgraded daemon fails to take over.
    let mut fallback: Option<Source> = None;
    loop {
        // Messages from the child (what INIT negotiated, deposits), exits,
        // signals.
        run.pump(&mut negotiated, &mut state);
        run.drain(&mut store);
        match take_signal() {
            0 => {}
            libc::SIGUSR2 => {
                // A program that cannot start is refused before anything
                // is retired: the running daemon serves on.
                if let Err(e) = startable(&program) {
                    report.failed_upgrades += 1;
                    log::error!(
                        "keeper: upgrade refused: {} cannot be started ({e}); daemon {} serves on",
                        program.display(),
                        run.child.id()
                    );
                    continue;
                }
                log::info!("keeper: upgrade requested; retiring daemon {}", run.child.id());
                if retire(&mut run, &mut negotiated, &mut state, true) == Retired::CalledOff {
                    report.failed_upgrades += 1;
                    continue;
                }
                run.drain_all(&mut store);
                report.upgrades += 1;
                let previous = run.source.clone();
                run = match spawn(Source::Disk, &negotiated, &state, &store, &mut report) {
                    Ok(r) => {
                        fallback = Some(previous);
                        r
                    }
                    // The program on disk could not start after all
                    // (replaced since the check, busy for too long): the
                    // previous binary takes over again.
                    Err(KeeperError::Spawn { program, source }) => {
                        report.failed_upgrades += 1;
                        log::error!(
                            "keeper: the upgraded daemon {} cannot start ({source}); going back to the previous binary",
                            program.display()
                        );
                        start_retrying(
                            |f| spawn(f, &negotiated, &state, &store, &mut report),
                            &previous,
                            &mut failed_starts,
                        )?
                    }
                    Err(e) => return Err(e),
                };
                continue;
            }
            sig => {
                log::info!("keeper: signal {sig}; retiring the daemon and unmounting");
                retire(&mut run, &mut negotiated, &mut state, false);
                drop(dev);
                if let Err(e) = guard.unmount() {
                    log::warn!("keeper: unmount: {e}");
                }
                return Ok(report);
            }
        }
        match run.child.try_wait()? {
            None => {
                if run.serving {
                    // It took over: no going back any more.
                    fallback = None;
                    failed_starts = 0;
                }
                wait_for_event(&run, &wake);
                continue;
            }
            Some(status) if status.code() == Some(0) => {
                log::info!("keeper: the daemon ended because the mount went; exiting");
                drop(dev);
                if let Err(e) = guard.unmount() {
                    log::debug!("keeper: unmount after the daemon's end: {e}");
                }
                return Ok(report);
            }
            Some(status) => {
                run.pump(&mut negotiated, &mut state);
                run.drain_all(&mut store);
                if let Some(why) = run.refused.take()
                    && fallback.is_none()
                {
                    // Another daemon from the same binary would refuse the
                    // same way: end the connection with the reason.
                    log::error!("keeper: the daemon refused to serve: {why}; unmounting");
                    drop(dev);
                    let _ = guard.unmount();
                    return Err(KeeperError::Refused(why));
                }
                report.crashes += 1;
                let mut from = run.source.clone();
                // SIGKILL comes from outside (an operator, the OOM killer, a
                // test): whatever the daemon was doing, it is not a build
                // that cannot start.
                let killed = {
                    use std::os::unix::process::ExitStatusExt;
                    status.signal() == Some(libc::SIGKILL)
                };
                if run.serving || (killed && fallback.is_none()) {
                    failed_starts = 0;
                    log::warn!(
                        "keeper: daemon {} {}; starting another",
                        run.child.id(),
                        describe(status)
                    );
                } else if let Some(previous) = fallback.take() {
                    report.failed_upgrades += 1;
                    log::error!(
                        "keeper: the upgraded daemon {} {} before taking over; going back to the previous binary",
                        run.child.id(),
                        describe(status)
                    );
                    from = previous;
                } else {
                    failed_starts += 1;
                    log::warn!(
                        "keeper: daemon {} {} before serving ({failed_starts} in a row); starting another",
                        run.child.id(),
                        describe(status)
                    );
                    if failed_starts >= MAX_FAILED_STARTS {
                        // Nobody can serve: end the connection rather than
                        // leave clients waiting for good.
                        drop(dev);
                        let _ = guard.unmount();
                        return Err(KeeperError::CrashLoop(failed_starts));
                    }
                    std::thread::sleep(backoff(failed_starts));
                }
                run = start_retrying(
                    |f| spawn(f, &negotiated, &state, &store, &mut report),
                    &from,
                    &mut failed_starts,
                )?;
            }
        }
    }
}

/// Vault keys of the `/dev/fuse` clones the keeper makes for the workers.
const CLONE_KEYS: std::ops::Range<u64> = (RESERVED_KEYS | 0x1000)..(RESERVED_KEYS | 0x2000);

/// Clones of the connection's file for the daemons' workers, made and held
/// by the keeper and handed to every daemon: requests a worker read stay in
/// a file the keeper holds, so they are sent again after a crash, and the
/// workers do not all read through one file. As many as a pool of this
/// machine's default size grows to.
fn hold_worker_clones(dev: &DevFuse, store: &mut VaultStore) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let n = (cpus * crate::session::DEFAULT_WORKERS_PER_CPU * 4).clamp(16, 256);
    for i in 0..n as u64 {
        match dev.clone_fd().and_then(|c| c.as_fd().try_clone_to_owned()) {
            Ok(fd) => store.hold(CLONE_KEYS.start + i, fd),
            Err(e) => {
                log::warn!("keeper: cloning /dev/fuse for the workers ({i} made): {e}; the others share one");
                return;
            }
        }
    }
}

/// Where a daemon's program comes from.
#[derive(Clone, Debug)]
enum Source {
    /// The program's path, looked up now.
    Disk,
    /// The binary an earlier daemon was started from, held open.
    Held(Arc<std::fs::File>),
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (_, Some(s)) => format!("was killed by signal {s}"),
        _ => "ended".into(),
    }
}

#[allow(clippy::too_many_arguments)]
fn start_child(
    from: Source,
    program: &PathBuf,
    args: &[OsString],
    dev: &DevFuse,
    negotiated: Option<&Negotiated>,
    state: &[u8],
    store: &VaultStore,
    default_permissions: bool,
) -> Result<Running, KeeperError> {
    let (mine, theirs) = UnixStream::pair()?;
    let fd = theirs.as_raw_fd();
    // The binary this daemon runs, held for a later fallback.
    let exe = match from {
        Source::Held(f) => f,
        Source::Disk => Arc::new(std::fs::File::open(program).map_err(|source| KeeperError::Spawn {
            program: program.clone(),
            source,
        })?),
    };
    // Run through the held file, so that what runs is what is held (the
    // descriptor is still open in the child when it execs).
    let mut cmd = Command::new(format!("/proc/self/fd/{}", exe.as_raw_fd()));
    cmd.arg0(program);
    cmd.args(args).env(KEEPER_FD_ENV, fd.to_string());
    let exe_fd = exe.as_raw_fd();
    // SAFETY: between fork and exec only async-signal-safe calls: fcntl to
    // let the child inherit its end of the socket, and the program file (a
    // script's interpreter opens it by its /proc/self/fd path after exec).
    unsafe {
        cmd.pre_exec(move || {
            for fd in [fd, exe_fd] {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    // What the child is given, made before it starts: a failure here is the
    // keeper's own (out of descriptors) and ends it with the mount.
    let dup = dev.try_dup()?;
    let handover = negotiated
        .map(|n| -> io::Result<Handover> {
            Ok(Handover {
                dev: dup.as_fd().try_clone_to_owned()?,
                negotiated: n.clone(),
                state: state.to_vec(),
            })
        })
        .transpose()?;
    let (vault, vault_theirs) = crate::vault::socket_pair()?;
    let child = spawn_program(&mut cmd).map_err(|source| KeeperError::Spawn {
        program: program.clone(),
        source,
    })?;
    drop(theirs);
    // A child that ends before it reads all this (a broken build exits at
    // once) makes these writes fail with EPIPE: that is its failure, seen
    // as its exit like any other, not the keeper's.
    let handed = (|| -> io::Result<()> {
        match handover {
            None => send_with_fd(&mine, &[b'F', u8::from(default_permissions)], dup.as_fd())?,
            Some(h) => {
                (&mine).write_all(b"H")?;
                h.send(&mine).map_err(io::Error::other)?;
            }
        }
        send_with_fd(&mine, b"V", vault_theirs.as_fd())?;
        store.hand_to(&vault)
    })();
    drop(vault_theirs);
    if let Err(e) = handed {
        log::warn!("keeper: handing the connection to daemon {}: {e}", child.id());
    }
    mine.set_nonblocking(true)?;
    Ok(Running {
        child,
        sock: mine,
        vault,
        drained: std::cell::Cell::new(Instant::now()),
        source: Source::Held(exe),
        serving: false,
        refused: None,
    })
}

/// Daemons in a row that die (or cannot start) before serving, after which
/// the keeper ends the connection: nobody can serve it.
const MAX_FAILED_STARTS: u32 = 5;

/// The pause before starting a daemon again after `failed_starts` in a
/// row died before serving.
fn backoff(failed_starts: u32) -> Duration {
    Duration::from_millis(100 << failed_starts.min(4))
}

/// Starts a daemon from `from`; one that cannot start now (out of
/// processes, say) counts as a daemon dead before serving and is tried
/// again after the same backoff, until [`MAX_FAILED_STARTS`] in a row have
/// failed.
fn start_retrying(
    mut spawn: impl FnMut(Source) -> Result<Running, KeeperError>,
    from: &Source,
    failed_starts: &mut u32,
) -> Result<Running, KeeperError> {
    loop {
        match spawn(from.clone()) {
            Err(KeeperError::Spawn { program, source }) if *failed_starts + 1 < MAX_FAILED_STARTS => {
                *failed_starts += 1;
                log::warn!(
                    "keeper: starting {} failed ({source}; {failed_starts} in a row); trying again",
                    program.display()
                );
                std::thread::sleep(backoff(*failed_starts));
            }
            r => return r,
        }
    }
}

/// Whether `program` can be started: it is there and executable by us.
/// Checked before an upgrade retires anything; what only exec can tell
/// (a build for another machine, say) shows as the upgraded daemon's
/// failure, and the previous binary takes over again.
fn startable(program: &std::path::Path) -> io::Result<()> {
    if !std::fs::metadata(program)?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    nix::unistd::access(program, nix::unistd::AccessFlags::X_OK).map_err(io::Error::from)
}

/// Starts `cmd`, again for a while if its program is busy (`ETXTBSY`): a
/// binary just written stays busy until every process that inherited a
/// descriptor open for writing on it (one forked by another thread meanwhile,
/// say) has exec'd or exited.
fn spawn_program(cmd: &mut Command) -> io::Result<std::process::Child> {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 40 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(25));
            }
            r => return r,
        }
    }
}

/// Tells the keeper what INIT negotiated (`N`): the child serves.
fn report_serving(sock: &UnixStream, n: &Negotiated) -> io::Result<()> {
    write_blob(sock, b'N', &crate::handover::negotiated_bytes(n))
}

/// Reads what the child has sent so far: `N` + negotiated, `S` + state.
/// Returns whether an INIT report came.
fn pump_messages(
    sock: &mut UnixStream,
    negotiated: &mut Option<Negotiated>,
    state: &mut Vec<u8>,
    refused: &mut Option<String>,
) -> bool {
    let mut reported = false;
    loop {
        let mut tag = [0u8; 1];
        match sock.read(&mut tag) {
            Ok(1) => {}
            _ => return reported,
        }
        let _ = sock.set_nonblocking(false);
        let _ = sock.set_read_timeout(Some(Duration::from_secs(5)));
        match tag[0] {
            b'N' => match read_blob(sock).map(|b| crate::handover::decode_negotiated_bytes(&b)) {
                Ok(Ok(n)) => {
                    *negotiated = Some(n);
                    reported = true;
                }
                Ok(Err(e)) => log::warn!("keeper: the daemon's INIT report: {e}"),
                Err(e) => log::warn!("keeper: reading the daemon's INIT report: {e}"),
            },
            b'S' => match read_blob(sock) {
                Ok(b) => *state = b,
                Err(e) => log::warn!("keeper: reading the daemon's state: {e}"),
            },
            b'X' => match read_blob(sock) {
                Ok(b) => *refused = Some(String::from_utf8_lossy(&b).into_owned()),
                Err(e) => log::warn!("keeper: reading why the daemon refused to serve: {e}"),
            },
            t => log::warn!("keeper: unknown message {t:#x} from the daemon"),
        }
        let _ = sock.set_nonblocking(true);
    }
}

fn read_blob(sock: &mut UnixStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    sock.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len) as usize;
    if len > crate::handover::MAX_STATE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "state too large"));
    }
    let mut b = vec![0u8; len];
    sock.read_exact(&mut b)?;
    Ok(b)
}

fn write_blob(sock: &UnixStream, tag: u8, b: &[u8]) -> io::Result<()> {
    let mut w = sock;
    w.write_all(&[tag])?;
    w.write_all(&(b.len() as u64).to_le_bytes())?;
    w.write_all(b)?;
    w.flush()
}

/// How long a retiring daemon may take before the keeper calls the
/// retirement off ([`RETIRE_DEADLINE_ENV`] overrides it).
const RETIRE_DEADLINE: Duration = Duration::from_secs(30);

/// The environment variable that sets the retire deadline in milliseconds
/// (the tests shorten it).
pub const RETIRE_DEADLINE_ENV: &str = "FUSE_WIRE_RETIRE_DEADLINE_MS";

fn retire_deadline() -> Duration {
    std::env::var(RETIRE_DEADLINE_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(RETIRE_DEADLINE, Duration::from_millis)
}

/// What became of a retirement the keeper asked for.
#[derive(Debug, PartialEq, Eq)]
enum Retired {
    /// The daemon ended (retired, or otherwise: its exit says).
    Ended,
    /// It did not end by the deadline (a handler that does not return):
    /// the retirement was called off and the daemon serves on.
    CalledOff,
}

/// Asks the child to retire and waits for it. When `keep_serving` and the
/// child has not ended by the deadline (a wedged handler holds it), the
/// retirement is called off: the daemon holds the only copy of whatever
/// state a filesystem keeps in memory, so it serves on instead of being
/// killed. Otherwise (unmounting) a child past the deadline is killed.
fn retire(
    run: &mut Running,
    negotiated: &mut Option<Negotiated>,
    state: &mut Vec<u8>,
    keep_serving: bool,
) -> Retired {
    let _ = run.sock.set_nonblocking(false);
    if (&run.sock).write_all(b"R").is_err() {
        log::debug!("keeper: the daemon is gone already");
    }
    let limit = retire_deadline();
    let deadline = Instant::now() + limit;
    loop {
        let _ = run.sock.set_nonblocking(true);
        pump_messages(&mut run.sock, negotiated, state, &mut run.refused);
        match run.child.try_wait() {
            Ok(Some(status)) => {
                pump_messages(&mut run.sock, negotiated, state, &mut run.refused);
                if status.code() != Some(RETIRED) {
                    log::warn!("keeper: the retiring daemon {}", describe(status));
                }
                return Retired::Ended;
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Ok(None) if keep_serving => {
                log::error!(
                    "keeper: daemon {} did not retire within {limit:?} (a request it serves does not end); \
                     calling the upgrade off: it serves on",
                    run.child.id()
                );
                let _ = run.sock.set_nonblocking(false);
                if (&run.sock).write_all(b"C").is_err() {
                    log::debug!("keeper: the daemon is gone already");
                }
                let _ = run.sock.set_nonblocking(true);
                return Retired::CalledOff;
            }
            _ => {
                log::warn!("keeper: the daemon did not retire within {limit:?}; killing it");
                let _ = run.child.kill();
                let _ = run.child.wait();
                return Retired::Ended;
            }
        }
    }
}

/// The vault key of the journal's shared region.
const JOURNAL_KEY: u64 = RESERVED_KEYS | 1;

/// Why a daemon under a keeper (or systemd's store, [`crate::service`])
/// serves over `/dev/fuse` even when io_uring was asked for. The kernel
/// routes a connection's requests to the ring entries of the daemon that
/// registered them; when that daemon ends, crashed or retired, the requests
/// routed to its idle entries while its rings go away are failed with
/// `ECANCELED`, and no successor can prevent it (`docs/recovery.md`).
pub const URING_REFUSED: &str = "when a daemon ends (crash or upgrade), the kernel fails with ECANCELED \
     the requests it hands to that daemon's io_uring entries meanwhile, which no successor can prevent \
     (see docs/recovery.md)";

/// Under a keeper, `/dev/fuse` only. When the configuration asked for
/// io_uring, says why it is not used: as a warning for a new connection
/// (once per mount), at debug level for each successor.
pub(crate) fn dev_fuse_only(config: &mut SessionConfig, fresh: bool) {
    use crate::transport::Transport;
    if config.transport != Transport::DevFuse {
        if fresh {
            log::warn!("serving over /dev/fuse, not io_uring: {URING_REFUSED}");
        } else {
            log::debug!("serving over /dev/fuse, not io_uring: {URING_REFUSED}");
        }
    }
    config.transport = Transport::DevFuse;
}

/// What a daemon under a keeper starts from.
#[derive(Debug)]
#[non_exhaustive]
pub struct Restore<'a> {
    /// `None` for a new mount; else the state the predecessor handed back
    /// at a graceful upgrade, empty after a crash (then what the
    /// filesystem keeps in the vault is all there is). The keeper drops a
    /// state once a daemon started with it serves; until then (a daemon
    /// that dies first, an upgrade that falls back to the previous binary)
    /// the next daemon gets the same state. A daemon that may die after
    /// reading it but before the keeper hears that it serves must mark it
    /// as taken where the keeper holds it (a vault withdrawal, say).
    pub state: Option<&'a [u8]>,
    /// Where to deposit descriptors that must outlive this daemon, and
    /// where the predecessors' are ([`Vault::take_deposits`],
    /// [`Vault::region`]).
    pub vault: Vault,
    /// The connection's number (its `fuse_connection` in fdinfo), when
    /// known: what the filesystem records in the memory it keeps, to refuse
    /// memory kept for another connection.
    pub connection: Option<u32>,
}

/// What a child under a keeper serves: a fresh connection (INIT to come) or
/// one taken over.
#[derive(Debug)]
pub enum Connection {
    /// A new mount (made with `default_permissions` when the flag is set):
    /// the session answers INIT.
    Fresh(OwnedFd, bool),
    /// A connection a predecessor served.
    TakenOver(Handover),
}

/// Names this process after its program (`argv[0]`'s last part). The
/// keeper runs each daemon through the binary it holds open
/// (`/proc/self/fd/N`), so the kernel names the process "N"; `ps`, `top`
/// and `pgrep` look for the program's name.
fn name_after_program() {
    let Some(arg0) = std::env::args_os().next() else {
        return;
    };
    let Some(base) = std::path::Path::new(&arg0).file_name() else {
        return;
    };
    // The kernel keeps 15 bytes of it.
    let mut name: Vec<u8> = std::os::unix::ffi::OsStrExt::as_bytes(base).to_vec();
    name.truncate(15);
    if let Ok(c) = std::ffi::CString::new(name)
        && let Err(e) = nix::sys::prctl::set_name(&c)
    {
        log::debug!("naming the daemon after its program: {e}");
    }
}

/// A `restore` that failed because the memory it keeps cannot be taken
/// over ([`crate::kept_tree::NotRecoverable`]) is a refusal (the keeper
/// ends the mount rather than start daemons refused the same way); any
/// other failure is the daemon's.
fn refused_restore(e: io::Error, refuse: impl FnOnce(String) -> SessionError) -> SessionError {
    match crate::kept_tree::NotRecoverable::reason(&e) {
        Some(why) => refuse(why),
        None => SessionError::Io(e),
    }
}

/// A daemon's link to its keeper.
#[derive(Debug)]
pub struct KeeperLink {
    sock: UnixStream,
}

impl KeeperLink {
    /// The link, when this process was started by a keeper
    /// ([`KEEPER_FD_ENV`] is set); the variable is removed so that the
    /// daemon's own children do not inherit it.
    pub fn from_env() -> Option<KeeperLink> {
        let v = std::env::var_os(KEEPER_FD_ENV)?;
        // SAFETY: called at start, before other threads read the environment.
        unsafe { std::env::remove_var(KEEPER_FD_ENV) };
        let fd: i32 = v.to_str()?.parse().ok()?;
        name_after_program();
        // SAFETY: the keeper left this descriptor open for us and nothing
        // else in this process owns it. Checked to be a socket below.
        let sock = unsafe { UnixStream::from_raw_fd(fd) };
        if sock.peer_addr().is_err() {
            return None;
        }
        let flags = nix::fcntl::fcntl(sock.as_fd(), nix::fcntl::FcntlArg::F_GETFD).unwrap_or(0);
        let _ = nix::fcntl::fcntl(
            sock.as_fd(),
            nix::fcntl::FcntlArg::F_SETFD(
                nix::fcntl::FdFlag::from_bits_retain(flags) | nix::fcntl::FdFlag::FD_CLOEXEC,
            ),
        );
        Some(KeeperLink { sock })
    }

    /// The connection the keeper hands this daemon.
    pub fn connection(&self) -> Result<Connection, HandoverError> {
        let mut tag = [0u8; 1];
        let (fds, _) = recv_fds(&self.sock, &mut tag, 1)?;
        match tag[0] {
            b'F' => {
                let mut perms = [0u8; 1];
                crate::handover::read_exact(&self.sock, &mut perms)?;
                let fd = fds.into_iter().next().ok_or(HandoverError::NoDescriptor)?;
                Ok(Connection::Fresh(fd, perms[0] != 0))
            }
            b'H' => Ok(Connection::TakenOver(Handover::receive(&self.sock)?)),
            _ => Err(HandoverError::Invalid("keeper message")),
        }
    }

    /// The vault the keeper sends after the connection.
    fn vault(&self) -> Result<Vault, HandoverError> {
        let mut tag = [0u8; 1];
        let (fds, _) = recv_fds(&self.sock, &mut tag, 1)?;
        match (tag[0], fds.into_iter().next()) {
            (b'V', Some(fd)) => Vault::open(fd),
            _ => Err(HandoverError::Invalid("keeper message (no vault)")),
        }
    }

    /// Serves a filesystem on the connection from the keeper. `restore`
    /// builds it, from a [`Restore`]: the state its predecessor handed back
    /// at a graceful upgrade, and the vault with what predecessors
    /// deposited. `save` is called after a retirement, and its bytes go to
    /// the successor. Requests are journaled ([`crate::journal`]) so that
    /// one a dead predecessor answered is answered again from the journal,
    /// and one it started reaches the filesystem as
    /// [`crate::journal::Replay::MaybeDone`]. Under a keeper the workers read
    /// the files the keeper holds (its clones, then the connection's; they
    /// clone none of their own, see the module docs), and io_uring is not
    /// used: a [`SessionConfig::transport`]
    /// asking for it is overridden, and the log says why ([`URING_REFUSED`]).
    ///
    /// The filesystem must state how the node ids and file handles the
    /// kernel holds stay valid in a successor ([`Filesystem::recovery`]):
    /// one that states nothing, or a layer that cannot (the node layer, a
    /// path layer not built with [`crate::path::PathFs::kept`]), is refused
    /// with [`SessionError::NotRecoverable`] before it serves, and so is a
    /// `restore` failing with [`crate::kept_tree::NotRecoverable`] (a kept
    /// table blank on a takeover, or another connection's), and the keeper,
    /// told why, ends the mount ([`KeeperError::Refused`]). A retirement
    /// the keeper calls off (its deadline passed) leaves the session
    /// serving ([`SessionHandle::cancel_retire`]).
    ///
    /// Returns `Ok(true)` when the daemon retired (exit with
    /// [`KeeperLink::exit_retired`]), `Ok(false)` when the mount went.
    pub fn serve<F: Filesystem>(
        self,
        restore: impl FnOnce(Restore<'_>) -> io::Result<F>,
        save: impl FnOnce(&F) -> Vec<u8>,
        mut config: SessionConfig,
    ) -> Result<bool, SessionError> {
        config.clone_fd = false;
        let link_err = |e: HandoverError| SessionError::Io(io::Error::other(e));
        let conn = self.connection().map_err(link_err)?;
        let vault = self.vault().map_err(link_err)?;
        let fresh = matches!(conn, Connection::Fresh(..));
        config.worker_channels = crate::session::WorkerChannels(
            vault
                .take_keys(CLONE_KEYS)
                .into_iter()
                .map(|(_, fd)| Arc::new(DevFuse::from_fd(fd)) as Arc<dyn crate::transport::Channel>)
                .collect(),
        );
        dev_fuse_only(&mut config, fresh);
        let region = vault.region(JOURNAL_KEY, Journal::bytes_needed())?;
        let connection = match &conn {
            Connection::Fresh(dev, _) => crate::handover::connection_of(dev.as_fd()),
            Connection::TakenOver(h) => crate::handover::connection_of(h.dev.as_fd()),
        }
        .flatten();
        config.journal = Some(Arc::new(Journal::open(region, fresh, connection)?));
        let refuse = |why: String| {
            if let Err(e) = write_blob(&self.sock, b'X', why.as_bytes()) {
                log::warn!("telling the keeper why this daemon refuses to serve: {e}");
            }
            SessionError::NotRecoverable(why)
        };
        let (session, resumed, taken_over) = match conn {
            Connection::Fresh(dev, default_permissions) => {
                let fs = Arc::new(
                    restore(Restore {
                        state: None,
                        vault: vault.clone(),
                        connection,
                    })
                    .map_err(|e| refused_restore(e, refuse))?,
                );
                fs.recovery().check().map_err(refuse)?;
                // The keeper learns what INIT negotiated before the kernel
                // has the answer: a daemon dying in between leaves it INIT
                // to send again, never a connection it cannot hand over.
                let sock = self.sock.try_clone()?;
                config.on_negotiated = Some(NegotiatedHook(Arc::new(move |n| {
                    if let Err(e) = report_serving(&sock, n) {
                        log::warn!("telling the keeper what INIT negotiated: {e}");
                    }
                })));
                let chan = Arc::new(DevFuse::from_fd(dev));
                let mut s = Session::from_arc(fs.clone(), chan, config)?;
                s.set_default_permissions(default_permissions);
                // A predecessor may have read INIT and died.
                s.resend_before_init();
                (s, fs, None)
            }
            Connection::TakenOver(h) => {
                let fs = Arc::new(
                    restore(Restore {
                        state: Some(&h.state),
                        vault: vault.clone(),
                        connection,
                    })
                    .map_err(|e| refused_restore(e, refuse))?,
                );
                fs.recovery().check().map_err(refuse)?;
                let negotiated = h.negotiated.clone();
                (
                    Session::resume(fs.clone(), h.dev, h.negotiated, config)?,
                    fs,
                    Some(negotiated),
                )
            }
        };
        let handle = session.handle();
        // Said before the first request is read: once this daemon may have
        // changed anything, the keeper must know that it serves (it then
        // drops the state this daemon started from), even if the daemon
        // dies a moment later. (A fresh daemon says it from INIT.)
        if let Some(n) = taken_over
            && let Err(e) = report_serving(&self.sock, &n)
        {
            log::warn!("telling the keeper that this daemon serves: {e}");
        }
        let running = session.spawn()?;
        let watcher = self.watch(handle.clone());
        let result = running.join();
        let retired = handle.is_retiring();
        // Retired before INIT was answered: INIT waits in the kernel for
        // the successor, which gets a fresh connection; nothing to save.
        if retired && matches!(result, Err(SessionError::EndedBeforeInit)) {
            drop(watcher);
            return Ok(true);
        }
        if retired {
            let state = save(&resumed);
            if let Err(e) = write_blob(&self.sock, b'S', &state) {
                log::warn!("handing the state back to the keeper: {e}");
            }
        }
        drop(watcher);
        result.map(|_| retired)
    }

    /// A thread that retires the session when the keeper says so. If the
    /// keeper dies instead, this daemon serves on: it holds the connection
    /// now, and clients see nothing (but nobody will restart it).
    fn watch(&self, handle: SessionHandle) -> Option<std::thread::JoinHandle<()>> {
        let mut sock = self.sock.try_clone().ok()?;
        std::thread::Builder::new()
            .name("keeper-link".into())
            .spawn(move || {
                let mut b = [0u8; 1];
                loop {
                    match sock.read(&mut b) {
                        Ok(1) if b[0] == b'R' => handle.retire(),
                        Ok(1) if b[0] == b'C' => {
                            if handle.cancel_retire() {
                                log::warn!("the keeper called the retirement off: serving on");
                            } else {
                                log::info!("the keeper called the retirement off too late: retiring");
                            }
                        }
                        Ok(1) => {
                            log::warn!("unknown message {:#x} from the keeper; ignoring the link", b[0]);
                            return;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        _ => {
                            return log::warn!(
                                "the keeper is gone: serving on without it (if this daemon dies now, the mount goes)"
                            );
                        }
                    }
                }
            })
            .ok()
    }

    /// Exits the process with the status the keeper reads as "retired".
    pub fn exit_retired() -> ! {
        std::process::exit(RETIRED)
    }
}
