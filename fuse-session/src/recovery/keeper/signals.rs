//! The keeper's signals and wake-ups: handlers that note the last signal
//! and write to a pipe, so that the keeper sleeps until a signal (a child's
//! death included) comes, with no timer.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};

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
pub(super) fn drain_wake(wake: &OwnedFd) {
    let mut buf = [0u8; 64];
    // SAFETY: reads into a live buffer from our non-blocking pipe.
    while unsafe { libc::read(wake.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}
