//! The keeper's loop: mounting, the clones held for the workers, one
//! daemon running at a time and replaced when it dies, upgrades on
//! `SIGUSR2`, the end on the mount's going or a signal.

use super::messages::pump_messages;
use super::retire::{Retired, retire};
use super::signals::{drain_wake, install_signals, take_signal};
use super::start::{MAX_FAILED_STARTS, backoff, start_child, start_retrying, startable};
use super::{KeeperError, KeeperReport, Running, Source, describe};
use crate::init::Negotiated;
use crate::mount::{Mount, MountOptions};
use crate::transport::dev_fuse::DevFuse;
use crate::vault::{RESERVED_KEYS, VaultStore};
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

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

/// The longest a deposit waits in the socket before the keeper reads it.
const DEPOSIT_BATCH: Duration = Duration::from_millis(10);

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
///
/// [`KEEPER_FD_ENV`]: super::KEEPER_FD_ENV
/// [`Filesystem::recovery`]: crate::Filesystem::recovery
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
pub(super) const CLONE_KEYS: std::ops::Range<u64> = (RESERVED_KEYS | 0x1000)..(RESERVED_KEYS | 0x2000);

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
