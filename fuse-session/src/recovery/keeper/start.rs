//! Starting a daemon: from the program on disk or the binary held, with
//! the connection, the vault and the held descriptors handed to it, again
//! after a backoff when it cannot start, up to [`MAX_FAILED_STARTS`].

use super::{KEEPER_FD_ENV, KeeperError, Running, Source};
use crate::handover::{Handover, send_with_fd};
use crate::init::Negotiated;
use crate::transport::dev_fuse::DevFuse;
use crate::vault::VaultStore;
use std::ffi::OsString;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[allow(clippy::too_many_arguments)]
pub(super) fn start_child(
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
pub(super) const MAX_FAILED_STARTS: u32 = 5;

/// The pause before starting a daemon again after `failed_starts` in a
/// row died before serving.
pub(super) fn backoff(failed_starts: u32) -> Duration {
    Duration::from_millis(100 << failed_starts.min(4))
}

/// Starts a daemon from `from`; one that cannot start now (out of
/// processes, say) counts as a daemon dead before serving and is tried
/// again after the same backoff, until [`MAX_FAILED_STARTS`] in a row have
/// failed.
pub(super) fn start_retrying(
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
pub(super) fn startable(program: &std::path::Path) -> io::Result<()> {
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
