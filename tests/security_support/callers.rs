//! Callers with unusual credentials: root without capabilities (a thread of
//! the test process), and a "pid twin": a process inside the daemon's pid
//! namespace whose pid there equals the pid, in the test's namespace, of
//! another process with other supplementary groups. A daemon that reads
//! `/proc/<pid>/status` from the wrong namespace takes the twin's groups.
//!
//! The forked processes run only plain system calls (paths are prepared as
//! C strings before forking) and are killed by `SIGALRM` if they hang.

use crate::posix_support::{Fd, Log, cpath, errno, errno_name};
use std::path::Path;
use std::time::{Duration, Instant};

/// Runs `f` on a new thread that keeps uid 0 but has no capabilities at all
/// (effective, permitted and inheritable sets empty): root by number only.
pub fn as_root_without_caps<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut h = Header {
                version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
                pid: 0,
            };
            let d = [Data {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            }; 2];
            // SAFETY: capset reads one header and two data structs, both live;
            // it changes only this thread's credentials.
            let r = unsafe { libc::syscall(libc::SYS_capset, &mut h as *mut Header, d.as_ptr()) };
            assert_eq!(r, 0, "capset: {}", errno_name(errno()));
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Number of values a pid-twin caller reports.
pub const TWIN_VALUES: usize = 8;

/// `clone_args` of `clone3(2)` (version 2, with `set_tid` and `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Closes every descriptor from 3 up except those in `keep`.
///
/// # Safety
/// Only for a freshly forked child, which owns every descriptor it has.
unsafe fn close_all_but(keep: &[i32]) {
    let mut next = 3u32;
    let mut sorted = [i32::MAX; 4];
    for (i, k) in keep.iter().take(4).enumerate() {
        sorted[i] = *k;
    }
    sorted.sort_unstable();
    for &k in sorted.iter().filter(|&&k| k != i32::MAX && k >= 3) {
        if (k as u32) > next {
            // SAFETY: per the function's contract.
            unsafe { libc::syscall(libc::SYS_close_range, next, k as u32 - 1, 0u32) };
        }
        next = k as u32 + 1;
    }
    // SAFETY: per the function's contract.
    unsafe { libc::syscall(libc::SYS_close_range, next, u32::MAX, 0u32) };
}

fn pipe() -> (Fd, Fd) {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two ints.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(r, 0, "pipe2");
    (Fd(fds[0]), Fd(fds[1]))
}

/// Reads exactly `buf.len()` bytes from `fd` within `timeout`.
fn read_exact_until(fd: &Fd, buf: &mut [u8], timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("timed out after {timeout:?} with {got} bytes"));
        }
        let mut pfd = libc::pollfd {
            fd: fd.0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(1000) as i32) };
        if r <= 0 {
            continue;
        }
        // SAFETY: the rest of `buf` is valid for writing.
        let n = unsafe { libc::read(fd.0, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if n <= 0 {
            return Err(format!("pipe closed after {got} bytes"));
        }
        got += n as usize;
    }
    Ok(())
}

fn reap(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
}

/// The result of one system call for a pid-twin report: 0 or the errno.
pub fn rc(r: i64) -> i64 {
    if r < 0 { errno() as i64 } else { 0 }
}

/// Runs `ops` in a process inside the pid namespace `pid_ns` (a
/// `/proc/<pid>/ns/pid` path) with credentials `uid`, `gid`, `groups`, and a
/// pid there equal to the pid (here) of another live process, the twin,
/// whose supplementary groups are `twin_groups`.
///
/// `ops` runs in a forked process: plain system calls only, on paths
/// prepared before. Its values are returned, except the last one, which is
/// replaced by 1 if the caller had the twin's number as its pid (0 if not).
pub fn as_pid_twin(
    pid_ns: &Path,
    twin_groups: &[u32],
    uid: u32,
    gid: u32,
    groups: &[u32],
    ops: &dyn Fn() -> [i64; TWIN_VALUES],
) -> Result<[i64; TWIN_VALUES], String> {
    let ns_path = cpath(pid_ns);
    // SAFETY: a valid C string.
    let ns = unsafe { libc::open(ns_path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if ns < 0 {
        return Err(format!("open {}: {}", pid_ns.display(), errno_name(errno())));
    }
    let ns = Fd(ns);

    // The twin: takes the groups, says so, then waits to be killed.
    let (twin_ready_r, twin_ready_w) = pipe();
    // SAFETY: the child runs plain system calls only and `_exit`s.
    let twin = unsafe { libc::fork() };
    assert!(twin >= 0, "fork: {}", errno_name(errno()));
    if twin == 0 {
        // SAFETY: in the child: plain system calls, then `_exit`.
        unsafe {
            close_all_but(&[twin_ready_w.0]);
            libc::alarm(60);
            let ok = libc::syscall(libc::SYS_setgroups, twin_groups.len(), twin_groups.as_ptr()) == 0;
            let b = [ok as u8];
            libc::write(twin_ready_w.0, b.as_ptr().cast(), 1);
            libc::pause();
            libc::_exit(0);
        }
    }
    drop(twin_ready_w);
    let kill_twin = || {
        // SAFETY: signalling and reaping the twin this function forked.
        unsafe { libc::kill(twin, libc::SIGKILL) };
        reap(twin);
    };
    let mut ready = [0u8; 1];
    if let Err(e) = read_exact_until(&twin_ready_r, &mut ready, Duration::from_secs(20)) {
        kill_twin();
        return Err(format!("the twin process did not start: {e}"));
    }
    if ready[0] != 1 {
        kill_twin();
        return Err("the twin process could not set its groups".into());
    }
    let twin_pid = twin as u64;

    // The caller: enters the namespace for its children, then clones one
    // with the twin's number as its pid there.
    let (res_r, res_w) = pipe();
    // SAFETY: the child runs plain system calls only and `_exit`s.
    let caller = unsafe { libc::fork() };
    assert!(caller >= 0, "fork: {}", errno_name(errno()));
    if caller == 0 {
        // SAFETY: in the child: plain system calls on live buffers, then `_exit`.
        unsafe {
            close_all_but(&[res_w.0, ns.0]);
            libc::alarm(30);
            let mut vals = [0i64; TWIN_VALUES];
            let report = |vals: &[i64; TWIN_VALUES]| {
                let b = std::slice::from_raw_parts(vals.as_ptr().cast::<u8>(), std::mem::size_of_val(vals));
                libc::write(res_w.0, b.as_ptr().cast(), b.len());
            };
            if libc::setns(ns.0, libc::CLONE_NEWPID) != 0 {
                vals[0] = -1000 - errno() as i64;
                report(&vals);
                libc::_exit(1);
            }
            let mut gp = [0i32; 2];
            if libc::pipe2(gp.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                vals[0] = -2000 - errno() as i64;
                report(&vals);
                libc::_exit(1);
            }
            let tid = [twin_pid as libc::pid_t];
            let args = CloneArgs {
                exit_signal: libc::SIGCHLD as u64,
                set_tid: tid.as_ptr() as u64,
                set_tid_size: 1,
                ..Default::default()
            };
            let g = libc::syscall(
                libc::SYS_clone3,
                &args as *const CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            );
            if g < 0 {
                vals[0] = -3000 - errno() as i64;
                report(&vals);
                libc::_exit(1);
            }
            if g == 0 {
                // Inside the namespace, with the twin's number as pid.
                libc::close(gp[0]);
                libc::alarm(20);
                let mut v = [0i64; TWIN_VALUES];
                let creds_ok = libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) == 0
                    && libc::syscall(libc::SYS_setresgid, gid, gid, gid) == 0
                    && libc::syscall(libc::SYS_setresuid, uid, uid, uid) == 0;
                if creds_ok {
                    v = ops();
                    v[TWIN_VALUES - 1] = (libc::syscall(libc::SYS_getpid) as u64 == twin_pid) as i64;
                } else {
                    v[0] = -4000 - errno() as i64;
                }
                let b = std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(&v));
                libc::write(gp[1], b.as_ptr().cast(), b.len());
                libc::_exit(0);
            }
            libc::close(gp[1]);
            let want = std::mem::size_of_val(&vals);
            let mut got = 0usize;
            while got < want {
                let n = libc::read(gp[0], vals.as_mut_ptr().cast::<u8>().add(got).cast(), want - got);
                if n <= 0 {
                    break;
                }
                got += n as usize;
            }
            let mut st = 0;
            libc::waitpid(g as libc::pid_t, &mut st, 0);
            if got != want {
                vals = [0; TWIN_VALUES];
                vals[0] = -5000 - st as i64;
            }
            report(&vals);
            libc::_exit(0);
        }
    }
    drop(res_w);
    let mut buf = [0u8; TWIN_VALUES * 8];
    let r = read_exact_until(&res_r, &mut buf, Duration::from_secs(40));
    if r.is_err() {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(caller, libc::SIGKILL) };
    }
    reap(caller);
    kill_twin();
    r.map_err(|e| format!("the pid-twin caller did not report: {e}"))?;
    let mut vals = [0i64; TWIN_VALUES];
    for (i, v) in vals.iter_mut().enumerate() {
        *v = i64::from_ne_bytes(buf[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    }
    match vals[0] {
        v if v <= -1000 => Err(format!(
            "the pid-twin caller failed to set itself up (stage {}, {})",
            -v / 1000,
            errno_name((-v % 1000) as i32)
        )),
        _ => Ok(vals),
    }
}

/// The users checks run as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    /// uid 65534, gid 65534, no supplementary groups.
    Nobody,
    /// uid 1000, gid 1000, no supplementary groups.
    User,
    /// uid 1000, gid 1000, supplementary group [`EXTRA_GROUP`].
    Member,
}

/// The primary group of [`Who::User`].
pub const USER: u32 = 1000;
/// The primary group of [`Who::User`] (and of files it owns).
pub const USER_GROUP: u32 = 1000;
/// A group only [`Who::Member`] is in.
pub const EXTRA_GROUP: u32 = 2000;

impl Who {
    /// `(uid, gid, supplementary groups)`.
    pub fn creds(self) -> (u32, u32, &'static [u32]) {
        use crate::posix_support::{NOBODY, NOGROUP};
        match self {
            Who::Nobody => (NOBODY, NOGROUP, &[]),
            Who::User => (USER, USER_GROUP, &[]),
            Who::Member => (USER, USER_GROUP, &[EXTRA_GROUP]),
        }
    }

    /// How the log names it.
    pub fn label(self) -> &'static str {
        match self {
            Who::Nobody => "uid 65534",
            Who::User => "uid 1000",
            Who::Member => "uid 1000 (in group 2000)",
        }
    }
}

/// Runs `f` as `who` (a thread with those credentials), its steps logged
/// under the user's label.
pub fn by(log: &mut Log, who: Who, f: impl FnOnce(&mut Log) + Send) {
    let (uid, gid, groups) = who.creds();
    let l = crate::posix_support::as_user(uid, gid, groups, || {
        let mut l = Log::default();
        f(&mut l);
        l
    });
    log.extend_prefixed(&format!("{}: ", who.label()), l);
}

/// Runs `f` as uid 0 without capabilities, its steps logged as such.
pub fn by_root_without_caps(log: &mut Log, f: impl FnOnce(&mut Log) + Send) {
    let l = as_root_without_caps(|| {
        let mut l = Log::default();
        f(&mut l);
        l
    });
    log.extend_prefixed("uid 0 without capabilities: ", l);
}
