//! The worker pool on real mounts, with the passthrough_ll daemon (over
//! io_uring too, with `FUSE_WIRE_TEST_TRANSPORT=uring`):
//!
//! - one unprivileged process holds a lock and a hundred others of the same
//!   uid wait for it (`F_SETLKW`, and `flock` without `LOCK_NB`) on a mount
//!   with `allow_other` and daemon-served locks: another user's `stat` and
//!   root's still answer, a waiter interrupted by SIGINT gets `EINTR`, after
//!   SIGKILL to all of them every process ends and the mount answers, and
//!   the daemon's thread count goes back to what it was once the idle
//!   timeout has passed (over io_uring, the ring threads to within their
//!   bound of `depth + 1` per queue);
//! - one user's blocking waiters, as many as it may start, leave another
//!   user's blocking lock request on another file room to wait (over
//!   io_uring too, with every process on one CPU, so on one queue): it gets
//!   its lock once the file is released, not `ENOLCK`;
//! - an idle mount makes (almost) no wake-ups in the daemon.
//!
//! The lock processes are forked from the test, switch to an unprivileged
//! uid and report over a pipe. Every wait has a deadline; a mount that hangs
//! is aborted through fusectl so that no test (and no process it forked)
//! ever hangs.

mod common;

use common::TempMountpoint;
use std::ffi::{CStr, CString};
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The uid (and gid) of the lock holder and its waiters.
const LOCKER: u32 = 41_001;
/// Another unprivileged user, who only looks.
const OTHER: u32 = 41_002;
const WAITERS: usize = 100;
const DEADLINE: Duration = Duration::from_secs(20);

/// The daemons under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Example {
    /// `passthrough_ll SOURCE MOUNTPOINT -o OPTS --stats FILE`
    Passthrough,
    /// `memfs -o OPTS MOUNTPOINT` (statistics on stderr at the end)
    Memfs,
}

impl Example {
    fn name(self) -> &'static str {
        match self {
            Example::Passthrough => "passthrough_ll",
            Example::Memfs => "memfs",
        }
    }
}

/// A passthrough_ll daemon; on drop, a mount left hanging is aborted and
/// the daemon ended.
struct Daemon {
    child: Option<Child>,
    mnt: PathBuf,
    stats: PathBuf,
    example: Example,
}

impl Daemon {
    fn start(example: Example, tm: &TempMountpoint, opts: &str) -> Daemon {
        let src = tm.root().join("src");
        fs::create_dir_all(&src).unwrap();
        fs::set_permissions(&src, fs::Permissions::from_mode(0o777)).unwrap();
        let opts = if common::over_uring() {
            format!("{opts},uring")
        } else {
            opts.to_string()
        };
        let stats = tm.root().join("stats.json");
        let mut cmd = Command::new(common::example_binary(example.name()));
        match example {
            Example::Passthrough => cmd
                .arg(&src)
                .arg(tm.path())
                .arg("-o")
                .arg(&opts)
                .arg("--stats")
                .arg(&stats),
            Example::Memfs => cmd.arg("-o").arg(&opts).arg(tm.path()),
        };
        // memfs writes its statistics on stderr: keep them in the file.
        let err = fs::File::create(tm.root().join("stderr")).expect("stderr file");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("start the daemon");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !common::fuse_mounted_at(tm.path()) {
            if let Ok(Some(status)) = child.try_wait() {
                let err = fs::read_to_string(tm.root().join("stderr")).unwrap_or_default();
                panic!("{} exited with {status} before mounting: {err}", example.name());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{} did not mount within 10 s", example.name());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Daemon {
            child: Some(child),
            mnt: tm.path().to_path_buf(),
            stats: match example {
                Example::Passthrough => stats,
                Example::Memfs => tm.root().join("stderr"),
            },
            example,
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The daemon's threads, by name.
    fn threads(&self) -> Vec<String> {
        let dir = format!("/proc/{}/task", self.pid());
        fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| fs::read_to_string(e.ok()?.path().join("comm")).ok())
                    .map(|c| c.trim().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Voluntary context switches of all the daemon's threads: each time a
    /// thread wakes up and goes back to sleep counts one.
    fn wakeups(&self) -> u64 {
        let dir = format!("/proc/{}/task", self.pid());
        let mut sum = 0;
        for e in fs::read_dir(dir).expect("the daemon's tasks").flatten() {
            if let Ok(s) = fs::read_to_string(e.path().join("status")) {
                sum += s
                    .lines()
                    .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        sum
    }

    /// SIGTERM; the daemon must unmount and exit cleanly within 10 s.
    fn stop(mut self) {
        let status = self.terminate();
        assert!(
            status.is_some_and(|s| s.success()),
            "daemon ended with {status:?}"
        );
        assert!(!common::fuse_mounted_at(&self.mnt), "still mounted after SIGTERM");
        if common::over_uring() {
            // The io_uring pass must really have used the rings.
            let json = fs::read_to_string(&self.stats).expect("statistics");
            assert!(
                !json.contains("\"uring\": 0,") && json.contains("\"uring\": "),
                "FUSE_WIRE_TEST_TRANSPORT=uring but no request of {} went over io_uring: {json}",
                self.example.name()
            );
        }
    }

    fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        common::terminate_daemon(self.child.take()?, &self.mnt)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() && std::thread::panicking() {
            // The test failed, maybe on a hanging mount: release whoever waits on it.
            let _ = common::abort_fuse_connection(&self.mnt);
        }
        self.terminate();
    }
}

// ------------------------------------------------------------ forked users

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lock {
    Posix,
    Flock,
}

#[derive(Clone, Copy, Debug)]
enum Role {
    /// Takes the lock without waiting, says `H`, and holds it until killed.
    Hold(Lock),
    /// Says `S`, waits for the lock; then `L` (got it, holds it until
    /// killed), `I` (EINTR), `N` (ENOLCK) or `E` and the errno.
    Wait(Lock),
    /// `stat`s the file: `K`, or `E` and the errno.
    Stat,
}

/// A forked process running a [`Role`] as another user.
struct Kid {
    pid: libc::pid_t,
    pipe: OwnedFd,
    reaped: bool,
}

extern "C" fn ignore(_: libc::c_int) {}

/// Writes `b` to `fd` (in the child: async-signal-safe calls only).
fn say(fd: libc::c_int, b: &[u8]) {
    // SAFETY: write(2) from a live buffer.
    unsafe {
        libc::write(fd, b.as_ptr().cast(), b.len());
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The body of a forked child. Only async-signal-safe calls: the test
/// process has other threads.
fn child(out: libc::c_int, uid: u32, path: &CStr, role: Role, cpu: Option<&libc::cpu_set_t>) -> ! {
    // SAFETY: plain system calls on values prepared before fork; a zeroed
    // sigaction with a handler that does nothing and no SA_RESTART (so that
    // SIGINT interrupts the wait instead of ending the process).
    unsafe {
        if let Some(set) = cpu
            && libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), set) != 0
        {
            say(out, &[b'E', errno() as u8]);
            libc::_exit(2);
        }
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ignore as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
            say(out, &[b'E', errno() as u8]);
            libc::_exit(2);
        }
        if let Role::Stat = role {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::stat(path.as_ptr(), &mut st) == 0 {
                say(out, b"K");
            } else {
                say(out, &[b'E', errno() as u8]);
            }
            libc::_exit(0);
        }
        let fd = libc::open(path.as_ptr(), libc::O_RDWR);
        if fd < 0 {
            say(out, &[b'E', errno() as u8]);
            libc::_exit(2);
        }
        let lock = |kind: Lock, wait: bool| -> libc::c_int {
            match kind {
                Lock::Posix => {
                    let mut fl: libc::flock = std::mem::zeroed();
                    fl.l_type = libc::F_WRLCK as libc::c_short;
                    fl.l_whence = libc::SEEK_SET as libc::c_short;
                    let cmd = if wait { libc::F_SETLKW } else { libc::F_SETLK };
                    libc::fcntl(fd, cmd, &mut fl as *mut libc::flock)
                }
                Lock::Flock => libc::flock(fd, libc::LOCK_EX | if wait { 0 } else { libc::LOCK_NB }),
            }
        };
        match role {
            Role::Hold(kind) => {
                if lock(kind, false) != 0 {
                    say(out, &[b'E', errno() as u8]);
                    libc::_exit(2);
                }
                say(out, b"H");
            }
            Role::Wait(kind) => {
                say(out, b"S");
                if lock(kind, true) == 0 {
                    say(out, b"L");
                } else {
                    match errno() {
                        libc::EINTR => say(out, b"I"),
                        libc::ENOLCK => say(out, b"N"),
                        e => say(out, &[b'E', e as u8]),
                    }
                    libc::_exit(0);
                }
            }
            Role::Stat => {}
        }
        loop {
            libc::pause();
        }
    }
}

impl Kid {
    fn spawn(uid: u32, path: &CStr, role: Role) -> Kid {
        Kid::spawn_on(uid, path, role, None)
    }

    /// [`Kid::spawn`], the child pinned to `cpu` (over io_uring its
    /// requests then go to that CPU's queue).
    fn spawn_on(uid: u32, path: &CStr, role: Role, cpu: Option<usize>) -> Kid {
        let set = cpu.map(|cpu| {
            // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET sets
            // one bit of it (`cpu` comes from sched_getaffinity).
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                set
            }
        });
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two-element array.
        let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(r, 0, "pipe2");
        // SAFETY: the child runs only async-signal-safe calls, then _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            child(fds[1], uid, path, role, set.as_ref());
        }
        // SAFETY: both fds are ours, from pipe2 above.
        let (pipe, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(w);
        Kid {
            pid,
            pipe,
            reaped: false,
        }
    }

    /// The next byte the child says, waiting until `deadline`.
    fn hear(&self, deadline: Instant) -> Option<u8> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut p = libc::pollfd {
                fd: self.pipe.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, left.as_millis() as libc::c_int) };
            if r == 0 {
                return None;
            }
            if r < 0 {
                continue;
            }
            let mut b = [0u8; 1];
            // SAFETY: read(2) into a live one-byte buffer.
            let n = unsafe { libc::read(self.pipe.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
            return (n == 1).then_some(b[0]);
        }
    }

    /// What the child has said, without waiting.
    fn hear_now(&self) -> Option<u8> {
        self.hear(Instant::now())
    }

    /// Whether the child sleeps in `fcntl` or `flock`.
    fn blocked_in_lock(&self) -> bool {
        fs::read_to_string(format!("/proc/{}/syscall", self.pid))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<libc::c_long>().ok())
            .is_some_and(|n| n == libc::SYS_fcntl || n == libc::SYS_flock)
    }

    fn signal(&self, sig: libc::c_int) {
        if !self.reaped {
            // SAFETY: kill(2) on our unreaped child.
            unsafe {
                libc::kill(self.pid, sig);
            }
        }
    }

    /// Reaps the child if it has ended.
    fn try_reap(&mut self) -> bool {
        if !self.reaped {
            let mut status = 0;
            // SAFETY: waitpid(2) on our own child.
            self.reaped = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) } == self.pid;
        }
        self.reaped
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
        if std::thread::panicking() {
            // Maybe stuck on a hanging mount until the daemon's drop aborts
            // it; the test process reaps nothing more then.
            self.try_reap();
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.try_reap() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Root's `stat` of `p`, given `d` to answer; `None` if it hangs.
fn stat_within(p: &Path, d: Duration) -> Option<std::io::Result<fs::Metadata>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let p = p.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(fs::metadata(&p));
    });
    rx.recv_timeout(d).ok()
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

/// Polls `cond` until it holds or `DEADLINE` passes.
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn count(threads: &[String], prefix: &str) -> usize {
    threads.iter().filter(|t| t.starts_with(prefix)).count()
}

const FLOOR: usize = 2;

fn lock_waiters_do_not_stop_the_mount(example: Example, kind: Lock) {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pool-locks");
    let lock_opt = match kind {
        Lock::Posix => "posix_lock",
        Lock::Flock => "flock",
    };
    let pool = format!("threads={FLOOR},idle_timeout=0.3,max_waits_per_uid=40");
    let opts = match example {
        Example::Passthrough => format!("allow_other,{lock_opt},{pool},max_threads=8"),
        Example::Memfs => format!("allow_other,{lock_opt},{pool}"),
    };
    let d = Daemon::start(example, &tm, &opts);
    let file = tm.path().join("f");
    fs::write(&file, b"locked").unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o666)).unwrap();
    let path = cstr(&file);

    // The daemon at rest: its floor of workers, no helper threads.
    assert!(
        eventually(|| {
            let t = d.threads();
            count(&t, "fuse-worker") == FLOOR && count(&t, "fuse-deferred") == 0
        }),
        "the daemon never settled at {FLOOR} workers: {:?}",
        d.threads()
    );
    let resting = d.threads().len();
    // Over io_uring, each queue has at least its driver and a standby, and
    // at most `depth + 1` threads. Ring threads that ran handlers during a
    // burst end after the idle timeout unless the kernel still holds a
    // command they submitted (a thread's exit cancels its commands), which
    // a later request frees; so their number is checked against that bound
    // and the other threads against the count at rest.
    let ring_at_rest = count(&d.threads(), "fuse-uring");
    let ring_queues = {
        let mut names: Vec<String> = d
            .threads()
            .into_iter()
            .filter(|t| t.starts_with("fuse-uring"))
            .collect();
        names.sort();
        names.dedup();
        names.len()
    };
    let ring_cap = ring_queues * (fuse_wire::session::transport::uring::DEFAULT_QUEUE_DEPTH + 1);
    let rested = |t: &[String]| {
        let ring = count(t, "fuse-uring");
        t.len() - ring == resting - ring_at_rest && ring >= 2 * ring_queues && ring <= ring_cap
    };

    let deadline = Instant::now() + DEADLINE;
    let holder = Kid::spawn(LOCKER, &path, Role::Hold(kind));
    assert_eq!(
        holder.hear(deadline),
        Some(b'H'),
        "the holder did not get the lock"
    );

    // The first waiter, alone, so that the daemon has read its request.
    let first = Kid::spawn(LOCKER, &path, Role::Wait(kind));
    assert_eq!(first.hear(deadline), Some(b'S'));
    assert!(
        eventually(|| first.blocked_in_lock()),
        "the first waiter never blocked"
    );
    let mut waiters = vec![first];
    for _ in 1..WAITERS {
        let w = Kid::spawn(LOCKER, &path, Role::Wait(kind));
        assert_eq!(w.hear(deadline), Some(b'S'), "a waiter did not start");
        waiters.push(w);
    }
    // Each waiter now waits, or was told ENOLCK (beyond its uid's share).
    let mut refused = [false; WAITERS];
    let settled = eventually(|| {
        let mut all = true;
        for (i, w) in waiters.iter().enumerate().skip(1) {
            if refused[i] {
                continue;
            }
            match w.hear_now() {
                Some(b'N') => refused[i] = true,
                Some(other) => panic!("waiter {i} said {:?} while the lock is held", other as char),
                None => all &= w.blocked_in_lock(),
            }
        }
        all
    });
    assert!(settled, "not every waiter got to wait or was refused");
    let nrefused = refused.iter().filter(|&&r| r).count();
    eprintln!(
        "{} {kind:?}: {} waiting, {nrefused} refused with ENOLCK",
        example.name(),
        WAITERS - nrefused
    );
    assert!(nrefused < WAITERS - 1, "every waiter but the first was refused");

    // Another user's stat, and root's, still answer.
    let looker = Kid::spawn(OTHER, &path, Role::Stat);
    let said = looker.hear(Instant::now() + Duration::from_secs(10));
    assert_eq!(
        said,
        Some(b'K'),
        "another user's stat did not answer while {WAITERS} processes wait for a lock"
    );
    match stat_within(&file, Duration::from_secs(10)) {
        Some(Ok(_)) => {}
        Some(Err(e)) => panic!("root's stat failed: {e}"),
        None => panic!("root's stat hung while {WAITERS} processes wait for a lock"),
    }

    // SIGINT to a waiter whose request the daemon holds: EINTR.
    waiters[0].signal(libc::SIGINT);
    assert_eq!(
        waiters[0].hear(Instant::now() + Duration::from_secs(10)),
        Some(b'I'),
        "the interrupted waiter did not get EINTR"
    );

    // SIGKILL to everyone: every process ends (none stays in D state).
    holder.signal(libc::SIGKILL);
    for w in &waiters {
        w.signal(libc::SIGKILL);
    }
    let mut kids: Vec<Kid> = waiters;
    kids.push(holder);
    kids.push(looker);
    let gone = eventually(|| kids.iter_mut().all(Kid::try_reap));
    if !gone {
        let left = kids.iter().filter(|k| !k.reaped).count();
        let _ = common::abort_fuse_connection(tm.path());
        panic!("{left} killed lock processes did not end");
    }
    match stat_within(&file, Duration::from_secs(10)) {
        Some(Ok(_)) => {}
        Some(Err(e)) => panic!("stat after the kill failed: {e}"),
        None => panic!("the mount does not answer after the lock processes were killed"),
    }

    // Back to the threads it had at rest once the idle timeout has passed.
    assert!(
        eventually(|| rested(&d.threads())),
        "the daemon kept {} threads (it had {resting} at rest, {ring_at_rest} of them io_uring \
         threads of {ring_queues} queues, at most {ring_cap}): {:?}",
        d.threads().len(),
        d.threads()
    );
    d.stop();
}

#[test]
fn posix_lock_waiters_do_not_stop_the_mount() {
    lock_waiters_do_not_stop_the_mount(Example::Passthrough, Lock::Posix);
}

#[test]
fn flock_waiters_do_not_stop_the_mount() {
    lock_waiters_do_not_stop_the_mount(Example::Passthrough, Lock::Flock);
}

#[test]
fn memfs_posix_lock_waiters_do_not_stop_the_mount() {
    lock_waiters_do_not_stop_the_mount(Example::Memfs, Lock::Posix);
}

#[test]
fn memfs_flock_waiters_do_not_stop_the_mount() {
    lock_waiters_do_not_stop_the_mount(Example::Memfs, Lock::Flock);
}

/// The user whose waiters take every wait they are allowed.
const GREEDY: u32 = 41_003;
/// Another user, who needs one lock.
const NEEDY: u32 = 41_004;
/// The greedy user's waiters: more than its share of waits anywhere.
const GREEDY_WAITERS: usize = 40;

/// The first CPU this process may run on.
fn first_cpu() -> usize {
    // SAFETY: an all-zero cpu_set_t is valid storage; sched_getaffinity
    // fills it, CPU_ISSET reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let r = libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set);
        assert_eq!(r, 0, "sched_getaffinity: {}", std::io::Error::last_os_error());
        (0..libc::CPU_SETSIZE as usize)
            .find(|&c| libc::CPU_ISSET(c, &set))
            .expect("a CPU to run on")
    }
}

/// One user's blocking waiters, as many as it may start, must leave
/// another user's blocking lock request room to wait: the other user's
/// request on another (briefly held) file waits and gets its lock, not
/// `ENOLCK`. Every process runs on one CPU, so that over io_uring all the
/// requests go to the same queue, whose entries are the scarcer pool.
fn one_users_waiters_leave_room_for_another_users_lock(example: Example, kind: Lock) {
    greedy_users_leave_room_for_another_users_lock(example, kind, 1, GREEDY_WAITERS, "")
}

/// [`one_users_waiters_leave_room_for_another_users_lock`] with `users`
/// greedy users (uids from [`GREEDY`] on), `each` waiters of each.
fn greedy_users_leave_room_for_another_users_lock(
    example: Example,
    kind: Lock,
    users: u32,
    each: usize,
    opts: &str,
) {
    if !common::require_mount_capability() {
        return;
    }
    let total = users as usize * each;
    let tm = TempMountpoint::new("pool-share");
    let lock_opt = match kind {
        Lock::Posix => "posix_lock",
        Lock::Flock => "flock",
    };
    let d = Daemon::start(example, &tm, &format!("allow_other,{lock_opt}{opts}"));
    let (a, b) = (tm.path().join("a"), tm.path().join("b"));
    for f in [&a, &b] {
        fs::write(f, b"locked").unwrap();
        fs::set_permissions(f, fs::Permissions::from_mode(0o666)).unwrap();
    }
    let (a, b) = (cstr(&a), cstr(&b));
    let cpu = Some(first_cpu());

    // A third user holds both files.
    let deadline = Instant::now() + DEADLINE;
    let hold_a = Kid::spawn(LOCKER, &a, Role::Hold(kind));
    let hold_b = Kid::spawn(LOCKER, &b, Role::Hold(kind));
    assert_eq!(hold_a.hear(deadline), Some(b'H'), "the holder of a");
    assert_eq!(hold_b.hear(deadline), Some(b'H'), "the holder of b");

    // The greedy user's waiters on a: each waits or is refused.
    let greedy: Vec<Kid> = (0..total)
        .map(|i| {
            Kid::spawn_on(
                GREEDY + 10 * (i % users as usize) as u32,
                &a,
                Role::Wait(kind),
                cpu,
            )
        })
        .collect();
    for (i, w) in greedy.iter().enumerate() {
        assert_eq!(w.hear(deadline), Some(b'S'), "greedy waiter {i} did not start");
    }
    // Settled once each waiter is refused or blocked, and each of those
    // blocked has a helper thread of its own waiting for a (no helper
    // thread is idle: a wait that got one is still waiting).
    let helpers = |d: &Daemon| count(&d.threads(), "fuse-deferred");
    let mut refused = vec![false; total];
    let mut waiting = 0;
    let settled = eventually(|| {
        let mut all = true;
        for (i, w) in greedy.iter().enumerate() {
            if refused[i] {
                continue;
            }
            match w.hear_now() {
                Some(b'N') => refused[i] = true,
                Some(other) => panic!("greedy waiter {i} said {:?} while a is held", other as char),
                None => all &= w.blocked_in_lock(),
            }
        }
        waiting = total - refused.iter().filter(|&&r| r).count();
        all && helpers(&d) == waiting
    });
    assert!(
        settled,
        "the greedy waiters did not settle: {waiting} not refused, {} helper threads",
        helpers(&d)
    );
    eprintln!(
        "{} {kind:?}: {waiting} of the {users} greedy users' {total} waiters wait, the others were \
         refused with ENOLCK",
        example.name()
    );
    assert!(waiting > 0, "none of the greedy user's waiters was let wait");
    assert!(
        waiting <= users as usize * fuse_wire::session::deferred::DEFAULT_MAX_DEFERRED_PER_UID,
        "{waiting} waits of {users} users: more than their shares"
    );

    // The other user's request on b: the daemon lets it wait (a helper
    // thread more) or refuses it at once.
    let needy = Kid::spawn_on(NEEDY, &b, Role::Wait(kind), cpu);
    assert_eq!(
        needy.hear(deadline),
        Some(b'S'),
        "the other user's waiter did not start"
    );
    let mut said = None;
    let decided = eventually(|| {
        said = needy.hear_now();
        said.is_some() || helpers(&d) > waiting
    });
    assert!(
        decided,
        "the other user's lock request was neither let wait nor answered"
    );
    assert_eq!(
        said.map(char::from),
        None,
        "the other user's lock request on another file was answered while that file was held \
         (N: ENOLCK) as the greedy user's {waiting} waiters wait"
    );
    // b is released: the waiting request gets it.
    hold_b.signal(libc::SIGKILL);
    assert_eq!(
        needy.hear(Instant::now() + DEADLINE).map(char::from),
        Some('L'),
        "the other user did not get the lock on b once it was released"
    );

    // Everyone goes: every process ends and the mount answers.
    let mut kids = greedy;
    kids.extend([hold_a, hold_b, needy]);
    for k in &kids {
        k.signal(libc::SIGKILL);
    }
    let gone = eventually(|| kids.iter_mut().all(Kid::try_reap));
    if !gone {
        let _ = common::abort_fuse_connection(tm.path());
        panic!("killed lock processes did not end");
    }
    d.stop();
}

#[test]
fn one_users_posix_lock_waiters_leave_room_for_another_user() {
    one_users_waiters_leave_room_for_another_users_lock(Example::Passthrough, Lock::Posix);
}

#[test]
fn one_users_flock_waiters_leave_room_for_another_user() {
    one_users_waiters_leave_room_for_another_users_lock(Example::Passthrough, Lock::Flock);
}

#[test]
fn memfs_one_users_posix_lock_waiters_leave_room_for_another_user() {
    one_users_waiters_leave_room_for_another_users_lock(Example::Memfs, Lock::Posix);
}

/// Eight users with 100 waiters each take every place of the session's
/// waits their shares allow (8 × 32 = `max_deferred`); a ninth user's lock
/// request must still wait, not get `ENOLCK`: every uid gets one place,
/// whatever the others hold. Over io_uring every wait holds an entry of
/// the one queue all processes use, so the queue has 64: two users fill
/// the three quarters waits may hold, and the others' first waits go
/// beyond them, short of the eighth kept for requests that never wait.
#[test]
fn a_ninth_users_lock_waits_while_eight_users_hold_every_share() {
    let opts = if common::over_uring() {
        ",queue_depth=64"
    } else {
        ""
    };
    greedy_users_leave_room_for_another_users_lock(Example::Passthrough, Lock::Posix, 8, 100, opts);
}

#[test]
fn an_idle_mount_makes_no_periodic_wakeups() {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pool-idle");
    let d = Daemon::start(Example::Passthrough, &tm, "threads=2");
    // Let whatever mounting started finish.
    assert!(stat_within(tm.path(), Duration::from_secs(10)).is_some_and(|r| r.is_ok()));
    let before = d.wakeups();
    // The point is idleness over an interval: let time pass.
    std::thread::sleep(Duration::from_secs(2));
    let woke = d.wakeups() - before;
    eprintln!("the idle daemon woke {woke} times in 2 s");
    assert!(
        woke <= 10,
        "an idle daemon woke {woke} times in 2 s: something polls"
    );
    d.stop();
}
