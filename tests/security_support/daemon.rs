//! The scratch tmpfs and the `passthrough_ll` daemon under test: started
//! directly or as `unshare --pid --fork` (then the daemon is the launcher's
//! child, pid 1 of a new pid namespace), unmounted and reaped at the end,
//! and, when a request hangs, its connection aborted through fusectl so that
//! nothing waits forever.

use crate::common;
use crate::posix_support::{Json, TempBase, cpath, errno, errno_name, example_binary, over_uring, set_mode};
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long the daemon may take to appear in `/proc/self/mountinfo`.
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long an unmount may take before the connection is aborted.
pub const UNMOUNT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the daemon may take to exit after its filesystem is gone.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(15);

fn mount_raw(source: &str, target: &Path, fstype: &str, data: Option<&str>) -> Result<(), i32> {
    let (s, t, f) = (
        std::ffi::CString::new(source).expect("no NUL"),
        cpath(target),
        std::ffi::CString::new(fstype).expect("no NUL"),
    );
    let d = data.map(|d| std::ffi::CString::new(d).expect("no NUL"));
    let dp = d.as_ref().map_or(std::ptr::null(), |d| d.as_ptr().cast());
    // SAFETY: every pointer is a valid C string (or null for no data) for the call.
    let r = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), 0, dp) };
    if r < 0 { Err(errno()) } else { Ok(()) }
}

fn umount(target: &Path, flags: i32) -> Result<(), i32> {
    let t = cpath(target);
    // SAFETY: `t` is a valid C string.
    let r = unsafe { libc::umount2(t.as_ptr(), flags) };
    if r < 0 { Err(errno()) } else { Ok(()) }
}

/// Runs `f` on its own thread and waits at most `timeout` for it.
fn bounded<T: Send + 'static>(timeout: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("bounded".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .expect("spawn thread");
    rx.recv_timeout(timeout).ok()
}

/// A tmpfs mounted on a fresh temporary directory, unmounted (and the
/// directory removed) on drop: the plain directory and the daemon's source
/// live on the same kind of filesystem.
pub struct Scratch {
    tmpfs: PathBuf,
    base: TempBase,
}

impl Scratch {
    /// Mounts the tmpfs (mode 0755, owned by root).
    pub fn new(tag: &str) -> Scratch {
        let base = TempBase::new(tag);
        let tmpfs = base.subdir("tmpfs");
        mount_raw("fuse-wire-security", &tmpfs, "tmpfs", Some("mode=0755,size=256m"))
            .unwrap_or_else(|e| panic!("mount tmpfs on {}: {}", tmpfs.display(), errno_name(e)));
        Scratch { tmpfs, base }
    }

    /// Creates `name` (mode 0755, root's) on the tmpfs.
    pub fn dir(&self, name: &str) -> PathBuf {
        let p = self.tmpfs.join(name);
        fs::create_dir(&p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
        set_mode(&p, 0o755);
        p
    }

    /// A directory outside the tmpfs for the test's own files (logs, stats).
    pub fn outside(&self) -> &Path {
        self.base.path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if umount(&self.tmpfs, 0).is_err() {
            let _ = umount(&self.tmpfs, libc::MNT_DETACH);
        }
    }
}

/// Where the fusectl filesystem is mounted, mounting it on `spare` if it is
/// nowhere (then `true`: the caller unmounts it).
fn fusectl_dir(spare: &Path) -> Result<(PathBuf, bool), String> {
    let text = fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
    for l in text.lines() {
        let Some((left, right)) = l.split_once(" - ") else {
            continue;
        };
        if right.split(' ').next() == Some("fusectl")
            && let Some(m) = left.split(' ').nth(4)
        {
            return Ok((PathBuf::from(m), false));
        }
    }
    let _ = fs::create_dir_all(spare);
    mount_raw("fusectl", spare, "fusectl", None)
        .map_err(|e| format!("mount fusectl on {}: {}", spare.display(), errno_name(e)))?;
    Ok((spare.to_path_buf(), true))
}

/// The fusectl connection number of the FUSE mount at `mnt` (its device
/// number as the kernel encodes it), from mountinfo: no `stat` that could hang.
fn connection_of(mnt: &Path) -> Option<u32> {
    let text = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let m = mnt.to_str()?;
    text.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        if f.get(4) != Some(&m) {
            return None;
        }
        let (maj, min) = f.get(2)?.split_once(':')?;
        Some((maj.parse::<u32>().ok()? << 20) | min.parse::<u32>().ok()?)
    })
}

/// What the daemon left behind.
#[derive(Debug)]
pub struct DaemonExit {
    /// The launcher's exit status (`None`: it had to be killed).
    pub status: Option<ExitStatus>,
    /// Problems while stopping (unmount failed, connection aborted, …).
    pub problems: Vec<String>,
    /// The last lines of its output.
    pub output_tail: String,
}

/// A running `passthrough_ll` serving `source` at `mnt`.
pub struct Daemon {
    launcher: Option<Child>,
    /// The daemon's pid in this (the test's) pid namespace.
    pub pid: u32,
    /// Whether it runs in a pid namespace of its own.
    pub own_pid_ns: bool,
    /// The mountpoint.
    pub mnt: PathBuf,
    /// The source directory.
    pub source: PathBuf,
    conn: Option<u32>,
    log_path: PathBuf,
    stats_path: PathBuf,
    work: PathBuf,
    label: String,
}

impl Daemon {
    /// Starts `passthrough_ll -f -o source=SOURCE,allow_other[,uring],OPTS MNT`
    /// (under `unshare --pid --fork --kill-child` with `own_pid_ns`) and
    /// waits until the mount is there. `work` takes the log and stats files.
    pub fn start(
        opts: &str,
        own_pid_ns: bool,
        source: &Path,
        mnt: &Path,
        work: &Path,
        label: &str,
    ) -> Daemon {
        let log_path = work.join("daemon.log");
        let stats_path = work.join("stats.json");
        let mut o = format!("source={},allow_other", source.display());
        if over_uring() {
            o.push_str(",uring");
        }
        if !opts.is_empty() {
            o.push(',');
            o.push_str(opts);
        }
        let bin = example_binary("passthrough_ll");
        let mut argv: Vec<OsString> = Vec::new();
        if own_pid_ns {
            // No --mount-proc: the mount must be visible here, in the test's
            // mount namespace; so the daemon sees this namespace's /proc.
            argv.extend(["--pid", "--fork", "--kill-child", "--"].map(OsString::from));
            argv.push(bin.clone().into());
        }
        argv.extend(["-f", "--stats"].map(OsString::from));
        argv.push(stats_path.clone().into());
        argv.push("-o".into());
        argv.push(o.into());
        argv.push(mnt.into());
        let program: OsString = if own_pid_ns { "unshare".into() } else { bin.into() };
        let logf = fs::File::create(&log_path).expect("create daemon log");
        let child = Command::new(&program)
            .args(&argv)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().expect("dup log"))
            .stderr(logf)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {program:?}: {e}"));
        let mut d = Daemon {
            pid: child.id(),
            launcher: Some(child),
            own_pid_ns,
            mnt: mnt.to_path_buf(),
            source: source.to_path_buf(),
            conn: None,
            log_path,
            stats_path,
            work: work.to_path_buf(),
            label: label.to_string(),
        };
        let deadline = Instant::now() + MOUNT_TIMEOUT;
        while !common::fuse_mounted_at(&d.mnt) {
            if let Some(st) = d.launcher.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                d.launcher = None;
                panic!(
                    "{label}: {program:?} exited with {st} before mounting ({argv:?}); output:\n{}",
                    d.output_tail()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "{label}: no mount within {MOUNT_TIMEOUT:?} ({program:?} {argv:?}); output:\n{}",
                    d.output_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        d.conn = connection_of(&d.mnt);
        if own_pid_ns {
            // The daemon is unshare's only child.
            let launcher = d.pid;
            let children =
                fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children")).unwrap_or_default();
            d.pid = children
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("{label}: unshare ({launcher}) has no child process"));
        }
        d
    }

    /// `/proc/<daemon>/ns/pid`: the pid namespace requests are numbered in.
    pub fn pid_ns_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/pid", self.pid))
    }

    /// The last 40 lines the daemon printed.
    pub fn output_tail(&self) -> String {
        let text = fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Aborts the connection through fusectl: every pending and later
    /// request fails at once (`ECONNABORTED`/`ENOTCONN`), so nothing hangs.
    pub fn abort(&self) -> Result<(), String> {
        let conn = self.conn.ok_or("the mount's connection number is unknown")?;
        let (dir, ours) = fusectl_dir(&self.work.join("fusectl"))?;
        let r = fs::write(dir.join(conn.to_string()).join("abort"), "1")
            .map_err(|e| format!("abort connection {conn}: {e}"));
        if ours {
            let _ = umount(&dir, libc::MNT_DETACH);
        }
        r
    }

    /// Unmounts (aborting the connection if the unmount hangs or keeps
    /// failing), waits for the daemon to exit (killing it if it does not)
    /// and reports how it went.
    pub fn finish(mut self) -> DaemonExit {
        let mut problems = Vec::new();
        let mnt = self.mnt.clone();
        let unmounted = bounded(UNMOUNT_TIMEOUT, move || {
            let deadline = Instant::now() + Duration::from_secs(3);
            loop {
                match umount(&mnt, 0) {
                    Ok(()) => return Ok(()),
                    Err(e) if e == libc::EBUSY && Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Err(e) => return Err(errno_name(e)),
                }
            }
        });
        match unmounted {
            Some(Ok(())) => {}
            other => {
                problems.push(format!(
                    "unmount of {} {}; aborting the connection",
                    self.mnt.display(),
                    match other {
                        Some(Err(e)) => format!("failed: {e}"),
                        _ => format!("hung for {UNMOUNT_TIMEOUT:?}"),
                    }
                ));
                if let Err(e) = self.abort() {
                    problems.push(e);
                }
                if common::fuse_mounted_at(&self.mnt)
                    && let Err(e) = umount(&self.mnt, libc::MNT_DETACH)
                {
                    problems.push(format!("lazy unmount: {}", errno_name(e)));
                }
            }
        }
        let status = self.reap(&mut problems);
        if over_uring() {
            // The suite is meant to run over the rings: prove it did.
            let stats = fs::read_to_string(&self.stats_path).unwrap_or_default();
            let rings = Json::parse(&stats).ok().and_then(|j| {
                j.get("transport")
                    .and_then(|t| t.get("uring"))
                    .and_then(Json::as_u64)
            });
            if rings.is_none_or(|n| n == 0) {
                problems.push(format!(
                    "FUSE_WIRE_TEST_TRANSPORT=uring but the daemon served nothing over io_uring \
                     (is /sys/module/fuse/parameters/enable_uring Y?); stats: {stats}"
                ));
            }
        }
        DaemonExit {
            status,
            problems,
            output_tail: self.output_tail(),
        }
    }

    fn kill_all(&mut self) {
        let launcher = self.launcher.as_ref().map(Child::id);
        // Only while it is still the launcher's child (not a recycled pid).
        let parent = fs::read_to_string(format!("/proc/{}/status", self.pid))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("PPid:"))
                    .and_then(|v| v.trim().parse::<u32>().ok())
            });
        if self.own_pid_ns && parent.is_some() && parent == launcher {
            // SAFETY: signalling the daemon this test started (pid 1 of its
            // own pid namespace: its death ends that namespace).
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        }
        if let Some(c) = self.launcher.as_mut() {
            let _ = c.kill();
        }
    }

    fn reap(&mut self, problems: &mut Vec<String>) -> Option<ExitStatus> {
        let mut child = self.launcher.take()?;
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(st)) => return Some(st),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    problems.push(format!("{} did not exit after unmount; killed", self.label));
                    self.launcher = Some(child);
                    self.kill_all();
                    let mut child = self.launcher.take()?;
                    let _ = child.wait();
                    return None;
                }
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Only reached without finish() (a panic): never leave a mount or a
        // process behind, and never wait on a stuck connection.
        if self.launcher.is_some() {
            if common::fuse_mounted_at(&self.mnt) {
                let _ = self.abort();
                let _ = umount(&self.mnt, libc::MNT_DETACH);
            }
            self.kill_all();
            if let Some(mut c) = self.launcher.take() {
                let _ = c.wait();
            }
        }
    }
}
