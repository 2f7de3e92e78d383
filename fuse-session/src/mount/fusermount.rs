//! `fusermount3`, the setuid helper that mounts for users without
//! `CAP_SYS_ADMIN`: finding it, running it with one end of a socket pair, and
//! receiving the `/dev/fuse` fd it sends back (`SCM_RIGHTS`); and
//! `fusermount3 -u` to unmount.

use super::error::{MountError, errno_io};
use super::options::MountOptions;
use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType};
use std::io::{self, IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Name of the setuid mount helper of libfuse 3.
pub const FUSERMOUNT: &str = "fusermount3";

/// Environment variable through which `fusermount3` learns the socket fd it
/// must send the `/dev/fuse` fd over.
const COMMFD_ENV: &str = "_FUSE_COMMFD";

/// Finds `fusermount3` in `PATH`, then `/usr/bin` and `/bin`.
pub fn find_fusermount() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .filter(|d| d.is_absolute())
        .map(|d| d.join(FUSERMOUNT))
        .find(|p| {
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Runs `program` (`fusermount3`) to mount `path` with `opts`; returns the
/// `/dev/fuse` fd it sends back. On error it mounted nothing.
pub(super) fn mount(program: &Path, path: &Path, opts: &MountOptions) -> Result<OwnedFd, MountError> {
    // Not fusermount3's own auto_unmount, which unmounts by path: our
    // watchdog does it (see MountOptions::auto_unmount).
    let o = MountOptions {
        auto_unmount: false,
        ..opts.clone()
    }
    .fusermount_opts()?;
    let io_err = |context| {
        move |e: Errno| MountError::Io {
            context,
            source: errno_io(e),
        }
    };
    // Both ends close-on-exec; only the helper's end is made inheritable, in
    // the child between fork and exec, so no other child can inherit it.
    let (ours, theirs) = nix::sys::socket::socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io_err("socketpair(AF_UNIX, SOCK_STREAM)"))?;
    let their_fd = theirs.as_raw_fd();

    log::debug!(
        "{} -o {o} -- {} ({COMMFD_ENV}={their_fd})",
        program.display(),
        path.display()
    );
    let mut cmd = Command::new(program);
    cmd.arg("-o")
        .arg(&o)
        .arg("--")
        .arg(path)
        .env(COMMFD_ENV, their_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and only calls
    // fcntl(2), which is async-signal-safe, on an fd number that is open in
    // the child (inherited from us, still held by `theirs` during spawn).
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(their_fd, libc::F_SETFD, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| MountError::FusermountSpawn {
        program: program.to_path_buf(),
        source,
    })?;
    // Only the helper holds its end now: when it exits, our recvmsg sees EOF.
    drop(theirs);

    let received = receive_fd(&ours);
    let mut stderr = child.stderr.take();
    let mut read_stderr = || {
        let mut s = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s.trim().to_string()
    };

    let fd = match received {
        Ok(fd) => fd,
        Err(reason) => {
            // No fd came: the helper failed (or broke protocol) and mounted nothing.
            let status = child.wait().map_err(|source| MountError::Io {
                context: "waiting for fusermount3",
                source,
            })?;
            let err = read_stderr();
            return Err(if !status.success() {
                MountError::FusermountFailed {
                    program: program.to_path_buf(),
                    status,
                    stderr: err,
                }
            } else {
                MountError::FusermountProtocol {
                    program: program.to_path_buf(),
                    reason: if err.is_empty() {
                        reason
                    } else {
                        format!("{reason}; stderr: {err}")
                    },
                }
            });
        }
    };

    drop(ours);
    match child.wait() {
        Ok(status) if status.success() => {
            let err = read_stderr();
            if !err.is_empty() {
                log::warn!("{FUSERMOUNT}: {err}");
            }
        }
        Ok(status) => log::warn!(
            "{FUSERMOUNT} sent the fd but exited with {status} (signal {:?}): {}",
            status.signal(),
            read_stderr()
        ),
        Err(e) => log::warn!("waiting for {FUSERMOUNT}: {e}"),
    }
    Ok(fd)
}

/// Receives one fd sent with `SCM_RIGHTS` (and a 1-byte payload).
fn receive_fd(sock: &OwnedFd) -> Result<OwnedFd, String> {
    let mut byte = [0u8; 1];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    loop {
        let mut iov = [IoSliceMut::new(&mut byte)];
        let msg = match nix::sys::socket::recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(format!("recvmsg: {e}")),
        };
        let mut fds: Vec<RawFd> = Vec::new();
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(v) = c {
                    fds.extend(v);
                }
            }
        }
        let bytes = msg.bytes;
        // SAFETY: every fd in an SCM_RIGHTS message was just installed in our
        // table by the kernel and is owned by nobody else.
        let mut owned: Vec<OwnedFd> = fds
            .into_iter()
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .collect();
        if owned.len() > 1 {
            owned.truncate(1);
        }
        return match owned.pop() {
            Some(fd) => Ok(fd),
            None if bytes == 0 => Err("the socket closed without a message".into()),
            None => Err("a message came without an fd".into()),
        };
    }
}

pub(super) fn fusermount_unmount(program: &Path, path: &Path, lazy: bool) -> Result<(), MountError> {
    let mut cmd = Command::new(program);
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    cmd.arg("--").arg(path).stdin(Stdio::null()).stdout(Stdio::null());
    let out = cmd.output().map_err(|source| MountError::FusermountSpawn {
        program: program.to_path_buf(),
        source,
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(MountError::FusermountFailed {
            program: program.to_path_buf(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}
