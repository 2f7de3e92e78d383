//! systemd's file-descriptor store: the service manager as a keeper.
//!
//! A service may hand descriptors to systemd (`FDSTORE=1` notifications,
//! each with a name); systemd keeps them while the service restarts (after
//! a crash, or an exit with `Restart=`) and passes them to the next start
//! (`LISTEN_FDS`, from descriptor 3, named in `LISTEN_FDNAMES`). Holding a
//! connection's `/dev/fuse` file there keeps the mount and the requests in
//! flight alive across the daemon's death, as a keeper process does
//! ([`crate::keeper`]). The unit needs `FileDescriptorStoreMax=` (non-zero)
//! and `NotifyAccess=main` (or `Type=notify`).
//!
//! This speaks the notification protocol itself (a datagram to
//! `$NOTIFY_SOCKET` with `SCM_RIGHTS`); no libsystemd.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: RawFd = 3;

/// This process's link to systemd's store.
#[derive(Debug)]
pub struct FdStore {
    sock: OwnedFd,
    addr: nix::sys::socket::UnixAddr,
    passed: Mutex<Vec<(String, OwnedFd)>>,
}

impl FdStore {
    /// The store, when this process runs as a systemd service
    /// (`$NOTIFY_SOCKET` is set), with the descriptors systemd passed it
    /// (`LISTEN_FDS` and `LISTEN_FDNAMES`, for this process's pid). The
    /// variables are removed, so that children do not inherit them.
    pub fn from_env() -> io::Result<Option<FdStore>> {
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(None);
        };
        let passed = take_listen_fds();
        // SAFETY: at start, before other threads read the environment.
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        let addr = notify_addr(path.as_encoded_bytes())?;
        let sock = nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::Datagram,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(io::Error::from)?;
        Ok(Some(FdStore {
            sock,
            addr,
            passed: Mutex::new(passed),
        }))
    }

    /// Sends a notification (`READY=1`, `STATUS=...`).
    pub fn notify(&self, state: &str) -> io::Result<()> {
        self.send(state, &[])
    }

    /// Has systemd keep `fd` under `name` (printable ASCII, no `:`).
    pub fn store(&self, name: &str, fd: BorrowedFd<'_>) -> io::Result<()> {
        check_name(name)?;
        self.send(&format!("FDSTORE=1\nFDNAME={name}"), &[fd.as_raw_fd()])
    }

    /// Has systemd close what it keeps under `name`.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        check_name(name)?;
        self.send(&format!("FDSTOREREMOVE=1\nFDNAME={name}"), &[])
    }

    /// The descriptor systemd passed under `name`, once.
    pub fn take(&self, name: &str) -> Option<OwnedFd> {
        let mut passed = self.passed.lock().unwrap_or_else(|e| e.into_inner());
        let i = passed.iter().position(|(n, _)| n == name)?;
        Some(passed.swap_remove(i).1)
    }

    /// Every descriptor systemd passed under a name starting with `prefix`,
    /// once.
    pub fn take_prefixed(&self, prefix: &str) -> Vec<(String, OwnedFd)> {
        let mut passed = self.passed.lock().unwrap_or_else(|e| e.into_inner());
        let (mine, rest) = std::mem::take(&mut *passed)
            .into_iter()
            .partition(|(n, _)| n.starts_with(prefix));
        *passed = rest;
        mine
    }

    fn send(&self, text: &str, fds: &[RawFd]) -> io::Result<()> {
        use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
        let iov = [io::IoSlice::new(text.as_bytes())];
        let cmsg = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
        sendmsg(
            self.sock.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            Some(&self.addr),
        )
        .map_err(|e| {
            io::Error::new(
                io::Error::from(e).kind(),
                format!("notifying systemd ({text:?}): {e}"),
            )
        })?;
        Ok(())
    }
}

fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty() || name.len() > 255 || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a valid file-descriptor store name"),
        ));
    }
    Ok(())
}

/// `$NOTIFY_SOCKET`: a path, or `@name` for an abstract socket.
fn notify_addr(path: &[u8]) -> io::Result<nix::sys::socket::UnixAddr> {
    use std::os::unix::ffi::OsStrExt;
    match path {
        [b'@', rest @ ..] => nix::sys::socket::UnixAddr::new_abstract(rest),
        [b'/', ..] => nix::sys::socket::UnixAddr::new(std::ffi::OsStr::from_bytes(path)),
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "NOTIFY_SOCKET is neither a path nor an abstract socket",
            ));
        }
    }
    .map_err(io::Error::from)
}

/// The descriptors passed to this process, with their names, marked
/// close-on-exec; the variables are removed.
fn take_listen_fds() -> Vec<(String, OwnedFd)> {
    let var = |n: &str| std::env::var(n).ok();
    let (pid, count, names) = (var("LISTEN_PID"), var("LISTEN_FDS"), var("LISTEN_FDNAMES"));
    for v in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        // SAFETY: at start, before other threads read the environment.
        unsafe { std::env::remove_var(v) };
    }
    let Some(count) = count.and_then(|c| c.parse::<RawFd>().ok()) else {
        return Vec::new();
    };
    if pid.and_then(|p| p.parse::<u32>().ok()) != Some(std::process::id()) {
        // For another process (one that exec'd us without clearing them).
        return Vec::new();
    }
    let names: Vec<String> = names
        .map(|n| n.split(':').map(str::to_owned).collect())
        .unwrap_or_default();
    (0..count.clamp(0, 65536))
        .filter_map(|i| {
            let raw = LISTEN_FDS_START + i;
            // SAFETY: F_GETFD only asks whether the descriptor exists.
            if unsafe { libc::fcntl(raw, libc::F_GETFD) } < 0 {
                return None;
            }
            // SAFETY: systemd passed this descriptor to this process (the
            // pid matched); nothing else in the process owns it.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            let _ = nix::fcntl::fcntl(
                fd.as_fd(),
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            );
            let name = names.get(i as usize).cloned().unwrap_or_else(|| "unknown".into());
            Some((name, fd))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_systemd_would_refuse_are_refused_here() {
        assert!(check_name("fw-dev").is_ok());
        assert!(check_name("a:b").is_err());
        assert!(check_name("").is_err());
        assert!(check_name("with space").is_err());
        assert!(check_name(&"x".repeat(256)).is_err());
    }

    #[test]
    fn the_socket_address_is_read_as_systemd_writes_it() {
        assert!(notify_addr(b"/run/systemd/notify").is_ok());
        assert!(notify_addr(b"@abstract").is_ok());
        assert!(notify_addr(b"relative").is_err());
    }
}
