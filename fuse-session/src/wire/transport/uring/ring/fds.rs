//! The descriptors a queue waits on besides its ring: eventfds, the nudge
//! timer, and waiting for either of two to be readable.

use super::super::Unavailable;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

pub(crate) fn eventfd(what: &str) -> Result<OwnedFd, Unavailable> {
    // SAFETY: eventfd(2) with valid flags; the result is checked below.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if efd < 0 {
        let e = io::Error::last_os_error();
        return Err(Unavailable::Setup {
            what: what.to_string(),
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        });
    }
    // SAFETY: `efd` was just returned by eventfd(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(efd) })
}

/// Waits until `a` or `b` is readable or `timeout` passes; false on timeout.
pub(crate) fn wait_readable(a: &OwnedFd, b: &OwnedFd, timeout: Option<Duration>) -> bool {
    let pfd = |fd: &OwnedFd| libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds = [pfd(a), pfd(b)];
    let ms = timeout.map_or(-1, |t| t.as_millis().clamp(1, i32::MAX as u128) as i32);
    // SAFETY: poll(2) on two pollfds that live on the stack for the call.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    r != 0 // a signal (r < 0) counts as a wake-up: the caller looks again
}

pub(crate) fn timerfd() -> Result<OwnedFd, Unavailable> {
    // SAFETY: timerfd_create(2) with valid flags; the result is checked below.
    let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(Unavailable::Setup {
            what: "timerfd_create".into(),
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        });
    }
    // SAFETY: `fd` was just returned by timerfd_create(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(crate) fn drain(fd: &OwnedFd) {
    let mut b = [0u8; 8];
    let _ = nix::unistd::read(fd, &mut b);
}
