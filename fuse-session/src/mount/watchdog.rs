//! The `auto_unmount` watchdog: a small process forked at mount time that
//! unmounts our mount when this process dies without doing so, and only if
//! the mount on the mountpoint is still ours.
//!
//! It holds one end of a socket pair; this process holds the other (close on
//! exec, so helpers it runs do not keep it open). When the mount guard has
//! dealt with the mount it writes one byte and the watchdog exits without
//! acting. End of file without that byte means this process is gone: the
//! watchdog opens the mountpoint `O_PATH`, compares the topmost mount's
//! identity with ours ([`super::identity`]) and only then detaches exactly
//! that mount with `umount2("/proc/self/fd/N", MNT_DETACH)`, or, when it may
//! not (`EPERM`: an unprivileged user), runs `fusermount3 -u -z`, which
//! unmounts by path (see docs/security.md for that limit). Anything else on
//! the mountpoint (a mount placed over ours, or a new mount after ours was
//! unmounted) is left alone.
//!
//! The child of `fork(2)` in a multi-threaded process may only make
//! async-signal-safe calls: everything it needs (paths, argv, messages) is
//! prepared before the fork, and it only makes system calls and `_exit`s.
//! It starts its own session, blocks all signals (so the terminal's Ctrl-C
//! for our process group does not end it first), moves to `/`, and closes
//! every inherited fd but stderr and its socket, in particular the
//! `/dev/fuse` fd, which would otherwise keep the connection alive.

use super::identity::{self, MountIdentity};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The fd number of the watchdog's socket in the child.
const SOCK_FD: RawFd = 3;
/// The fd number of the mountpoint's `O_PATH` fd in the child.
const TOP_FD: RawFd = 4;
/// `/proc/self/fd/` + [`TOP_FD`].
const TOP_FD_PATH: &std::ffi::CStr = c"/proc/self/fd/4";

/// A running watchdog, owned by the mount guard.
#[derive(Debug)]
pub(crate) struct Watchdog {
    pid: libc::pid_t,
    /// Our end of the socket; closed without a byte = "we died".
    comm: Option<OwnedFd>,
}

/// Everything the child needs, prepared before `fork(2)`.
struct Plan {
    path: CString,
    ours: MountIdentity,
    /// `fusermount3 -u -z -- PATH`, for when `umount2` is not permitted.
    fusermount: Option<Exec>,
    /// `[fuse-wire] auto_unmount watchdog for PATH: `
    prefix: Vec<u8>,
    /// This process's argument area (`arg_start`, `arg_end` of
    /// `/proc/self/stat`), which the child overwrites with its name.
    args: Option<(usize, usize)>,
}

/// `arg_start` and `arg_end` of this process (fields 48 and 49 of
/// `/proc/self/stat`, counted after the command name's closing parenthesis).
fn arg_area() -> Option<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let mut f = rest.split(' ').skip(45);
    let start: usize = f.next()?.parse().ok()?;
    let end: usize = f.next()?.parse().ok()?;
    (start > 0 && end > start).then_some((start, end))
}

/// A prepared `execve(2)`: the strings and the NULL-terminated pointer arrays.
struct Exec {
    program: CString,
    _args: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: [*const libc::c_char; 1],
}

impl Watchdog {
    /// Forks the watchdog for our mount `ours` at `path`. `fusermount` is the
    /// helper to fall back to when `umount2(2)` is not permitted.
    pub(crate) fn spawn(path: &Path, ours: MountIdentity, fusermount: Option<&Path>) -> io::Result<Watchdog> {
        let cstring = |b: &[u8]| CString::new(b).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e));
        let c_path = cstring(path.as_os_str().as_bytes())?;
        let fusermount = match fusermount {
            Some(p) => {
                let program = cstring(p.as_os_str().as_bytes())?;
                let args = vec![
                    program.clone(),
                    cstring(b"-u")?,
                    cstring(b"-z")?,
                    cstring(b"--")?,
                    c_path.clone(),
                ];
                let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
                argv.push(std::ptr::null());
                Some(Exec {
                    program,
                    _args: args,
                    argv,
                    envp: [std::ptr::null()],
                })
            }
            None => None,
        };
        let plan = Plan {
            path: c_path,
            ours,
            fusermount,
            prefix: format!("[fuse-wire] auto_unmount watchdog for {}: ", path.display()).into_bytes(),
            args: arg_area(),
        };
        let (ours_end, theirs) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::Stream,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        // SAFETY: the child runs only `watch`, which makes async-signal-safe
        // system calls on memory prepared above and never returns (it
        // `_exit`s), so no lock or allocator state of other threads matters.
        let pid = unsafe { libc::fork() };
        match pid {
            -1 => Err(io::Error::last_os_error()),
            0 => watch(&plan, theirs.as_raw_fd(), ours_end.as_raw_fd()),
            pid => {
                drop(theirs);
                log::debug!("auto_unmount watchdog for {} is pid {pid}", path.display());
                Ok(Watchdog {
                    pid,
                    comm: Some(ours_end),
                })
            }
        }
    }

    /// Tells the watchdog that the mount has been dealt with (it exits
    /// without acting) and reaps it.
    pub(crate) fn disarm(mut self) {
        if let Some(c) = self.comm.take() {
            // SAFETY: writes one byte from a local to an fd we own.
            let n = unsafe { libc::write(c.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
            if n != 1 {
                log::warn!(
                    "cannot disarm the auto_unmount watchdog (pid {}): {}",
                    self.pid,
                    io::Error::last_os_error()
                );
            }
        }
        self.reap();
    }

    /// Waits (bounded) for the watchdog to exit.
    fn reap(&mut self) {
        drop(self.comm.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut status = 0;
            // SAFETY: waitpid on our own child's pid with a valid out pointer.
            let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if r == self.pid {
                if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
                    log::warn!(
                        "auto_unmount watchdog (pid {}) ended with status {status:#x}",
                        self.pid
                    );
                }
                return;
            }
            if r < 0 {
                // ECHILD: someone else (a SIGCHLD handler) reaped it.
                return;
            }
            if Instant::now() >= deadline {
                log::warn!("auto_unmount watchdog (pid {}) still running", self.pid);
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Watchdog {
    /// Without [`Watchdog::disarm`], closing the socket is what our death
    /// would do: the watchdog unmounts if our mount is still on top.
    fn drop(&mut self) {
        if self.comm.is_some() {
            self.reap();
        }
    }
}

/// The watchdog's command line, as `/proc/PID/cmdline` shows it.
static CMDLINE: [u8; 16] = *b"fuse-wire-unmnt\0";

/// The watchdog itself, in the forked child, with its end of the socket
/// `sock` and a copy of the parent's end `parent_end` (which must not stay
/// open here, or the end of file would never come). Never returns.
fn watch(plan: &Plan, sock: RawFd, parent_end: RawFd) -> ! {
    // SAFETY: (the whole function) only async-signal-safe system calls, on
    // memory prepared before the fork or on the stack; no allocation, no
    // locks, no panics (no indexing, no unwrap).
    unsafe {
        libc::setsid();
        libc::chdir(c"/".as_ptr());
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
        libc::prctl(
            libc::PR_SET_NAME,
            c"fuse-wire-unmnt".as_ptr() as libc::c_ulong,
            0,
            0,
            0,
        );
        // Its command line too (what `ps` shows), or it looks like a second
        // copy of the daemon: our name over the argument area, the rest
        // zeroed, in this child's own copy of that memory (the parent's is
        // untouched), as setproctitle does.
        if let Some((start, end)) = plan.args {
            let len = end - start;
            let n = CMDLINE.len().min(len);
            std::ptr::copy_nonoverlapping(CMDLINE.as_ptr(), start as *mut u8, n);
            std::ptr::write_bytes((start + n) as *mut u8, 0, len - n);
            if n < CMDLINE.len() && n > 0 {
                *((start + n - 1) as *mut u8) = 0;
            }
        }

        // Our socket to fd 3, /dev/null on 0 and 1 (and on 2 if a socket
        // sat there), everything else closed, the parent's end included.
        if sock == SOCK_FD {
            libc::fcntl(SOCK_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        } else if libc::dup3(sock, SOCK_FD, libc::O_CLOEXEC) < 0 {
            libc::_exit(1);
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            if sock == 2 || parent_end == 2 {
                libc::dup2(null, 2);
            }
        }
        if libc::syscall(
            libc::SYS_close_range,
            SOCK_FD as libc::c_uint + 1,
            libc::c_uint::MAX,
            0,
        ) != 0
        {
            let mut max = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut max);
            let max = max.rlim_cur.min(1 << 20) as RawFd;
            for fd in SOCK_FD + 1..max {
                libc::close(fd);
            }
        }

        // Wait for a byte (disarmed) or end of file (the mounting process died).
        loop {
            let mut b = 0u8;
            let n = libc::read(SOCK_FD, (&mut b as *mut u8).cast(), 1);
            if n == 1 {
                libc::_exit(0);
            }
            if n < 0 && identity::errno() == libc::EINTR {
                continue;
            }
            break;
        }

        let top = match identity::open_top(&plan.path) {
            Ok(fd) => fd,
            Err(e) => {
                say(plan, b"cannot open the mountpoint; nothing unmounted", Some(e));
                libc::_exit(1);
            }
        };
        // Usually open() already gave the lowest free number, TOP_FD.
        if top.as_raw_fd() != TOP_FD && libc::dup3(top.as_raw_fd(), TOP_FD, libc::O_CLOEXEC) < 0 {
            say(plan, b"dup3 failed; nothing unmounted", Some(identity::errno()));
            libc::_exit(1);
        }
        match identity::of_fd(BorrowedFd::borrow_raw(TOP_FD)) {
            Ok(t) if t.is(&plan.ours) => {}
            Ok(_) => {
                say(
                    plan,
                    b"the topmost mount there is not ours (ours was unmounted, replaced or is covered \
                      by another mount): left alone",
                    None,
                );
                libc::_exit(0);
            }
            Err(e) => {
                say(
                    plan,
                    b"cannot identify the mount there; nothing unmounted",
                    Some(e),
                );
                libc::_exit(1);
            }
        }

        // Exactly our mount: the magic link names it, not whatever the path
        // resolves to by the time umount2 looks.
        let mut rc = libc::umount2(TOP_FD_PATH.as_ptr(), libc::MNT_DETACH);
        if rc != 0 && identity::errno() == libc::ENOENT {
            // No /proc: by path, right after the check.
            rc = libc::umount2(plan.path.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW);
        }
        if rc == 0 {
            say(plan, b"unmounted our mount (the process serving it ended)", None);
            libc::_exit(0);
        }
        let e = identity::errno();
        let Some(exec) = plan.fusermount.as_ref().filter(|_| e == libc::EPERM) else {
            say(plan, b"umount2 failed; our mount is left in place", Some(e));
            libc::_exit(1);
        };
        let pid = libc::fork();
        if pid == 0 {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            libc::execve(exec.program.as_ptr(), exec.argv.as_ptr(), exec.envp.as_ptr());
            libc::_exit(127);
        }
        if pid < 0 {
            say(
                plan,
                b"cannot fork fusermount3; our mount is left in place",
                Some(identity::errno()),
            );
            libc::_exit(1);
        }
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0 && identity::errno() == libc::EINTR {}
        if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
            say(
                plan,
                b"unmounted our mount with fusermount3 -u -z (the process serving it ended)",
                None,
            );
            libc::_exit(0);
        }
        say(
            plan,
            b"fusermount3 -u -z failed; its exit status",
            Some(libc::WEXITSTATUS(status)),
        );
        libc::_exit(1)
    }
}

/// One line on stderr: prefix, message, an optional ` (N)`, newline, in
/// one `writev(2)`. Async-signal-safe.
fn say(plan: &Plan, msg: &[u8], num: Option<i32>) {
    let mut digits = [0u8; 24];
    let mut start = digits.len();
    let mut put = |b: u8| {
        if start > 0 {
            start -= 1;
            if let Some(d) = digits.get_mut(start) {
                *d = b;
            }
        }
    };
    if let Some(n) = num {
        put(b')');
        let mut v = n.unsigned_abs();
        loop {
            put(b'0' + (v % 10) as u8);
            v /= 10;
            if v == 0 {
                break;
            }
        }
        if n < 0 {
            put(b'-');
        }
        put(b'(');
        put(b' ');
    }
    let tail = digits.get(start..).unwrap_or(&[]);
    let iov = [
        libc::iovec {
            iov_base: plan.prefix.as_ptr() as *mut libc::c_void,
            iov_len: plan.prefix.len(),
        },
        libc::iovec {
            iov_base: msg.as_ptr() as *mut libc::c_void,
            iov_len: msg.len(),
        },
        libc::iovec {
            iov_base: tail.as_ptr() as *mut libc::c_void,
            iov_len: tail.len(),
        },
        libc::iovec {
            iov_base: b"\n".as_ptr() as *mut libc::c_void,
            iov_len: 1,
        },
    ];
    // SAFETY: writev reads the four buffers above, all alive for the call.
    unsafe {
        libc::writev(2, iov.as_ptr(), iov.len() as libc::c_int);
    }
}
