//! Helpers for the differential POSIX suite and the passthrough request
//! proofs (`passthrough_requests.rs`): spawning the
//! example daemons on fresh temporary directories (unmounted and reaped by a
//! guard, also when a test fails), a log of each operation's outcome that is
//! compared between a plain directory and a FUSE mount, running a closure
//! with another user's credentials, forking a child process for lock tests,
//! and a small JSON reader for the daemons' `--stats` files.
//!
//! Use with `mod common; mod posix_support;` from a test file.
#![allow(dead_code)]

use crate::common;
use std::collections::BTreeMap;
use std::ffi::{CString, OsString};
use std::fmt::Debug;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The unprivileged user the suite runs some operations as (`nobody`).
pub const NOBODY: u32 = 65534;
/// Its group (`nogroup`).
pub const NOGROUP: u32 = 65534;

/// How long one check may run on one target before the daemon is killed.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a daemon may take to appear in `/proc/self/mountinfo`.
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a daemon may take to exit after its filesystem is unmounted.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------
// errno, paths, small libc wrappers

/// The symbolic name of an errno value (or its number).
pub fn errno_name(e: i32) -> String {
    let known: &[(i32, &str)] = &[
        (libc::EPERM, "EPERM"),
        (libc::ENOENT, "ENOENT"),
        (libc::ESRCH, "ESRCH"),
        (libc::EINTR, "EINTR"),
        (libc::EIO, "EIO"),
        (libc::ENXIO, "ENXIO"),
        (libc::E2BIG, "E2BIG"),
        (libc::EBADF, "EBADF"),
        (libc::EAGAIN, "EAGAIN"),
        (libc::ENOMEM, "ENOMEM"),
        (libc::EACCES, "EACCES"),
        (libc::EFAULT, "EFAULT"),
        (libc::EBUSY, "EBUSY"),
        (libc::EEXIST, "EEXIST"),
        (libc::EXDEV, "EXDEV"),
        (libc::ENODEV, "ENODEV"),
        (libc::ENOTDIR, "ENOTDIR"),
        (libc::EISDIR, "EISDIR"),
        (libc::EINVAL, "EINVAL"),
        (libc::EMFILE, "EMFILE"),
        (libc::ETXTBSY, "ETXTBSY"),
        (libc::EFBIG, "EFBIG"),
        (libc::ENOSPC, "ENOSPC"),
        (libc::ESPIPE, "ESPIPE"),
        (libc::EROFS, "EROFS"),
        (libc::EMLINK, "EMLINK"),
        (libc::ERANGE, "ERANGE"),
        (libc::EDEADLK, "EDEADLK"),
        (libc::ENAMETOOLONG, "ENAMETOOLONG"),
        (libc::ENOLCK, "ENOLCK"),
        (libc::ENOSYS, "ENOSYS"),
        (libc::ENOTEMPTY, "ENOTEMPTY"),
        (libc::ELOOP, "ELOOP"),
        (libc::ENODATA, "ENODATA"),
        (libc::EOVERFLOW, "EOVERFLOW"),
        (libc::EOPNOTSUPP, "EOPNOTSUPP"),
        (libc::ENOTCONN, "ENOTCONN"),
        (libc::ESTALE, "ESTALE"),
        (libc::ENOTSUP, "ENOTSUP"),
    ];
    known
        .iter()
        .find(|(n, _)| *n == e)
        .map(|(_, s)| s.to_string())
        .unwrap_or_else(|| format!("errno {e}"))
}

/// The calling thread's errno.
pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A path as a C string.
pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

/// A libc return value as a result: negative means `errno`.
pub fn chk(r: i64) -> Result<i64, i32> {
    if r < 0 { Err(errno()) } else { Ok(r) }
}

/// An `io::Error` as an errno (`-1` if it has none).
pub fn io_errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// Converts an `io::Result` into a `Result<T, errno>`.
pub fn ioe<T>(r: io::Result<T>) -> Result<T, i32> {
    r.map_err(|e| io_errno(&e))
}

/// An open file descriptor closed on drop.
#[derive(Debug)]
pub struct Fd(pub i32);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: we own this descriptor and close it once.
        unsafe { libc::close(self.0) };
    }
}

/// `open(2)`.
pub fn open(p: &Path, flags: i32, mode: u32) -> Result<Fd, i32> {
    let c = cpath(p);
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    chk(fd as i64).map(|fd| Fd(fd as i32))
}

/// `pwrite(2)`.
pub fn pwrite(fd: &Fd, buf: &[u8], off: i64) -> Result<i64, i32> {
    // SAFETY: `buf` is valid for `buf.len()` bytes.
    chk(unsafe { libc::pwrite(fd.0, buf.as_ptr().cast(), buf.len(), off) } as i64)
}

/// `write(2)`.
pub fn write(fd: &Fd, buf: &[u8]) -> Result<i64, i32> {
    // SAFETY: `buf` is valid for `buf.len()` bytes.
    chk(unsafe { libc::write(fd.0, buf.as_ptr().cast(), buf.len()) } as i64)
}

/// `pread(2)` of up to `len` bytes, returning what was read.
pub fn pread(fd: &Fd, len: usize, off: i64) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; len];
    // SAFETY: `buf` is valid for `len` writable bytes.
    let n = chk(unsafe { libc::pread(fd.0, buf.as_mut_ptr().cast(), len, off) } as i64)?;
    buf.truncate(n as usize);
    Ok(buf)
}

/// `fstat(2)`.
pub fn fstat(fd: &Fd) -> Result<libc::stat, i32> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer.
    chk(unsafe { libc::fstat(fd.0, &mut st) } as i64).map(|_| st)
}

/// `lstat(2)` (`follow` = `stat(2)`).
pub fn stat(p: &Path, follow: bool) -> Result<libc::stat, i32> {
    let c = cpath(p);
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `c` and `st` are valid for the call.
    let r = unsafe {
        if follow {
            libc::stat(c.as_ptr(), &mut st)
        } else {
            libc::lstat(c.as_ptr(), &mut st)
        }
    };
    chk(r as i64).map(|_| st)
}

/// The parts of a `stat` that must agree between two filesystems holding
/// the same tree (no inode numbers, devices or times).
pub fn shape(st: &libc::stat) -> String {
    // A directory's size is the filesystem's own business (4096 on ext4, 0 on memfs).
    let size = if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        "(dir)".to_string()
    } else {
        st.st_size.to_string()
    };
    format!(
        "mode={:o} nlink={} uid={} gid={} size={size}",
        st.st_mode, st.st_nlink, st.st_uid, st.st_gid
    )
}

/// `shape` of a path (`lstat` when `follow` is false).
pub fn shape_of(p: &Path, follow: bool) -> Result<String, i32> {
    stat(p, follow).map(|s| shape(&s))
}

/// The whole content of a file, or an errno.
pub fn content(p: &Path) -> Result<Vec<u8>, i32> {
    ioe(fs::read(p))
}

/// Sets the mode of a path (no umask), panicking on failure: for test setup.
pub fn set_mode(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {:o} {}: {e}", mode, p.display()));
}

/// `chown(2)` for test setup, panicking on failure.
pub fn set_owner(p: &Path, uid: u32, gid: u32) {
    let c = cpath(p);
    // SAFETY: `c` is a valid C string.
    let r = unsafe { libc::lchown(c.as_ptr(), uid, gid) };
    assert_eq!(r, 0, "chown {uid}:{gid} {}: {}", p.display(), errno_name(errno()));
}

/// A deterministic byte pattern (`seed` distinguishes files).
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .rotate_left(seed as u32 % 32) as u8
                ^ seed
        })
        .collect()
}

/// A short description of a byte string for logs: length and a checksum.
pub fn digest(b: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h = (h ^ x as u64).wrapping_mul(0x100_0000_01b3);
    }
    format!("{} bytes #{h:016x}", b.len())
}

// ---------------------------------------------------------------------------
// the log compared between targets

const BACKING_SPECIFIC: &str = "[backing fs] ";

/// What happened at each step of a check, in order. Values must be
/// comparable between targets: no inode numbers, times or temp paths.
#[derive(Clone, Debug, Default)]
pub struct Log {
    steps: Vec<(String, String)>,
}

impl Log {
    /// Records a value.
    pub fn val(&mut self, step: &str, v: impl Debug) {
        self.steps.push((step.to_string(), format!("{v:?}")));
    }

    /// Records a result: `ok <value>` or the errno's name.
    pub fn res<T: Debug>(&mut self, step: &str, r: &Result<T, i32>) {
        let s = match r {
            Ok(v) => format!("ok {v:?}"),
            Err(e) => errno_name(*e),
        };
        self.steps.push((step.to_string(), s));
    }

    /// Records a result without its value (`ok` or the errno's name).
    pub fn done<T>(&mut self, step: &str, r: &Result<T, i32>) {
        let s = match r {
            Ok(_) => "ok".to_string(),
            Err(e) => errno_name(*e),
        };
        self.steps.push((step.to_string(), s));
    }

    /// Marks the last step as depending on the backing filesystem's own
    /// limits (ext4's maximum file size, …): not compared for memfs.
    pub fn backing_specific(&mut self) {
        if let Some(last) = self.steps.last_mut() {
            last.0.insert_str(0, BACKING_SPECIFIC);
        }
    }

    /// This log without the steps marked [`Log::backing_specific`].
    pub fn without_backing_specific(&self) -> Log {
        Log {
            steps: self
                .steps
                .iter()
                .filter(|(s, _)| !s.starts_with(BACKING_SPECIFIC))
                .cloned()
                .collect(),
        }
    }

    /// Appends another log's steps.
    pub fn extend(&mut self, other: Log) {
        self.steps.extend(other.steps);
    }

    /// Appends another log's steps, each name prefixed with `prefix` (who did it).
    pub fn extend_prefixed(&mut self, prefix: &str, other: Log) {
        self.steps
            .extend(other.steps.into_iter().map(|(s, v)| (format!("{prefix}{s}"), v)));
    }

    /// The steps.
    pub fn steps(&self) -> &[(String, String)] {
        &self.steps
    }

    /// Every step whose outcome differs from `reference`'s, as lines.
    pub fn diff(&self, reference: &Log) -> Vec<String> {
        let mut out = Vec::new();
        let n = self.steps.len().max(reference.steps.len());
        for i in 0..n {
            match (reference.steps.get(i), self.steps.get(i)) {
                (Some((rs, rv)), Some((s, v))) => {
                    if rs != s {
                        out.push(format!("step {i}: the logs diverge ({rs:?} vs {s:?})"));
                        break;
                    }
                    if rv != v {
                        out.push(format!("{s}: plain dir = {rv}, here = {v}"));
                    }
                }
                (Some((rs, rv)), None) => out.push(format!("{rs}: plain dir = {rv}, here = <missing>")),
                (None, Some((s, v))) => out.push(format!("{s}: plain dir = <missing>, here = {v}")),
                (None, None) => {}
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------
// temporary directories and daemons

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh directory `/tmp/fuse-wire-posix-<tag>-<pid>-<n>` (mode 0755,
/// removed on drop) holding whatever a target needs.
pub struct TempBase {
    path: PathBuf,
}

impl TempBase {
    /// Creates it.
    pub fn new(tag: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("fuse-wire-posix-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create temp dir");
        set_mode(&path, 0o755);
        let path = fs::canonicalize(&path).expect("canonicalize temp dir");
        Self { path }
    }

    /// Creates (mode 0755) and returns a subdirectory.
    pub fn subdir(&self, name: &str) -> PathBuf {
        let p = self.path.join(name);
        fs::create_dir_all(&p).expect("create temp subdir");
        set_mode(&p, 0o755);
        p
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempBase {
    fn drop(&mut self) {
        // Never remove through a mount that is still there.
        if let Ok(text) = fs::read_to_string("/proc/self/mountinfo") {
            let prefix = self.path.to_string_lossy().into_owned();
            if text
                .lines()
                .any(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&prefix)))
            {
                eprintln!(
                    "not removing {}: something is still mounted below it",
                    self.path.display()
                );
                return;
            }
        }
        let _ = fs::remove_dir_all(&self.path);
    }
}

pub use common::example_binary;

/// Which filesystem a check runs on besides the plain directory.
#[derive(Clone, Copy, Debug)]
pub enum Fs {
    /// `passthrough_ll` with these `-o` options (`source=` and `allow_other` are added).
    Passthrough(&'static str),
    /// `memfs` with these `-o` options (`allow_other` is added).
    Memfs(&'static str),
    /// `nodefs` (the node layer's in-memory example) with these `-o`
    /// options (`allow_other`, and `uring` when asked for, are added).
    Nodefs(&'static str),
    /// `pathfs` (the path layer's mirror of a source directory) with these
    /// `-o` options (`source=`, `allow_other` and `uring` are added).
    Pathfs(&'static str),
}

impl Fs {
    /// A short label for reports.
    pub fn label(&self) -> String {
        match self {
            Fs::Passthrough("") => "passthrough_ll".into(),
            Fs::Passthrough(o) => format!("passthrough_ll -o {o}"),
            Fs::Memfs("") => "memfs".into(),
            Fs::Memfs(o) => format!("memfs -o {o}"),
            Fs::Nodefs("") => "nodefs".into(),
            Fs::Nodefs(o) => format!("nodefs -o {o}"),
            Fs::Pathfs("") => "pathfs".into(),
            Fs::Pathfs(o) => format!("pathfs -o {o}"),
        }
    }
}

/// What a daemon left behind: its exit status, the tail of its output and
/// its `--stats` file (if it wrote one).
#[derive(Debug)]
pub struct DaemonExit {
    /// The exit status (`None` if it had to be killed).
    pub status: Option<ExitStatus>,
    /// The last lines of its stdout and stderr.
    pub output_tail: String,
    /// The parsed `--stats` file.
    pub stats: Option<Json>,
    /// Why the stats could not be read, if they could not.
    pub stats_error: Option<String>,
}

impl DaemonExit {
    /// The stats, or a panic saying why there are none.
    pub fn stats(&self) -> &Json {
        match &self.stats {
            Some(s) => s,
            None => panic!(
                "no stats from the daemon ({}); exit {:?}; output:\n{}",
                self.stats_error.as_deref().unwrap_or("?"),
                self.status,
                self.output_tail
            ),
        }
    }

    /// `ops.<OP>.<field>` of the stats (0 when the opcode never appeared).
    pub fn op(&self, op: &str, field: &str) -> u64 {
        self.stats()
            .get("ops")
            .and_then(|o| o.get(op))
            .and_then(|o| o.get(field))
            .and_then(Json::as_u64)
            .unwrap_or(0)
    }
}

/// A running example daemon serving a mount. Dropping it unmounts (lazily if
/// needed), reaps the process (killing it if it does not exit) and removes
/// the temporary directories.
pub struct Daemon {
    child: Option<Child>,
    /// Where operations go.
    pub mnt: PathBuf,
    /// The backing directory (passthrough) or `None` (memfs).
    pub source: Option<PathBuf>,
    /// A sibling of the mountpoint that is outside the filesystem.
    pub outside: PathBuf,
    stats_path: PathBuf,
    log_path: PathBuf,
    label: String,
    base: TempBase,
}

impl Daemon {
    /// Spawns `fs` on a fresh mountpoint and waits until it is mounted.
    pub fn start(fs: Fs) -> Daemon {
        Self::start_with(fs, &[])
    }

    /// Like [`Daemon::start`], with extra command-line arguments before the mountpoint.
    pub fn start_with(fs: Fs, extra: &[&str]) -> Daemon {
        let base = TempBase::new("fs");
        let mnt = base.subdir("mnt");
        let outside = base.subdir("outside");
        let stats_path = base.path().join("stats.json");
        let log_path = base.path().join("daemon.log");
        let (bin, opts, source) = match fs {
            Fs::Passthrough(o) => {
                let src = base.subdir("src");
                let mut opts = format!("source={},allow_other", src.display());
                // allow_other turns default_permissions on unless refused: the
                // daemon's own checks are what runs without it.
                if !o.split(',').any(|x| x == "default_permissions") {
                    opts.push_str(",no_default_permissions");
                }
                if over_uring() {
                    opts.push_str(",uring");
                }
                if !o.is_empty() {
                    opts.push(',');
                    opts.push_str(o);
                }
                (example_binary("passthrough_ll"), opts, Some(src))
            }
            Fs::Memfs(o) => {
                let mut opts = "allow_other".to_string();
                if !o.is_empty() {
                    opts.push(',');
                    opts.push_str(o);
                }
                (example_binary("memfs"), opts, None)
            }
            Fs::Nodefs(o) | Fs::Pathfs(o) => {
                let src = matches!(fs, Fs::Pathfs(_)).then(|| base.subdir("src"));
                let mut opts = "allow_other".to_string();
                if let Some(src) = &src {
                    opts.push_str(&format!(",source={}", src.display()));
                }
                if over_uring() {
                    opts.push_str(",uring");
                }
                if !o.is_empty() {
                    opts.push(',');
                    opts.push_str(o);
                }
                let bin = if src.is_some() { "pathfs" } else { "nodefs" };
                (example_binary(bin), opts, src)
            }
        };
        // memfs takes only `-o` (it prints its statistics on stderr instead).
        let mut args: Vec<OsString> = match fs {
            Fs::Passthrough(_) => vec!["-f".into(), "--stats".into(), stats_path.clone().into()],
            Fs::Memfs(_) => vec![],
            Fs::Nodefs(_) | Fs::Pathfs(_) => vec!["--stats".into(), stats_path.clone().into()],
        };
        args.push("-o".into());
        args.push(opts.into());
        args.extend(extra.iter().map(OsString::from));
        args.push(mnt.clone().into());
        let logf = fs::File::create(&log_path).expect("create daemon log");
        let mut cmd = Command::new(&bin);
        // SAFETY: umask is async-signal-safe and cannot fail. A daemon
        // started from a shell has a umask of 022: the creates it serves
        // must not lose those bits too (`umask_of_the_caller_only`).
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::umask(0o022);
                Ok(())
            })
        };
        let child = cmd
            .args(&args)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().expect("dup log"))
            .stderr(logf)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let mut d = Daemon {
            child: Some(child),
            mnt,
            source,
            outside,
            stats_path,
            log_path,
            label: fs.label(),
            base,
        };
        let deadline = Instant::now() + MOUNT_TIMEOUT;
        loop {
            if common::fuse_mounted_at(&d.mnt) {
                break;
            }
            if let Some(st) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                d.child = None;
                panic!(
                    "{} exited with {st} before mounting ({:?}); output:\n{}",
                    d.label,
                    args,
                    d.output_tail()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "{} did not mount within {MOUNT_TIMEOUT:?} ({:?}); output:\n{}",
                    d.label,
                    args,
                    d.output_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        d
    }

    /// The label of the filesystem.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The last 40 lines the daemon printed.
    pub fn output_tail(&self) -> String {
        let text = fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// The daemon's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Kills the daemon at once (the kernel then fails every pending and
    /// future request with `ENOTCONN`); the guard still unmounts.
    pub fn kill(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
        }
    }

    fn unmount(&self) {
        for i in 0..50 {
            if !common::fuse_mounted_at(&self.mnt) {
                return;
            }
            let lazy = i >= 20;
            if i == 19 {
                eprintln!(
                    "{} still busy; held by: {:?}",
                    self.mnt.display(),
                    holders(&self.mnt)
                );
            }
            match fuse_wire::session::mount::unmount(&self.mnt, lazy) {
                Ok(()) => {}
                Err(e) if i % 10 == 9 => eprintln!("unmounting {}: {e}", self.mnt.display()),
                Err(_) => {}
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn reap(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(st)) => return Some(st),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    eprintln!("{} did not exit after unmount; killing it", self.label);
                    let _ = child.kill();
                    let _ = child.wait();
                    return None;
                }
            }
        }
    }

    /// Unmounts, waits for the daemon to exit and reads its stats.
    pub fn finish(mut self) -> DaemonExit {
        self.unmount();
        let status = self.reap();
        let (stats, stats_error) = match fs::read_to_string(&self.stats_path) {
            Ok(text) => match Json::parse(&text) {
                Ok(j) => (Some(j), None),
                Err(e) => (None, Some(format!("bad JSON in the stats file: {e}: {text}"))),
            },
            Err(e) => (None, Some(format!("no stats file: {e}"))),
        };
        if over_uring()
            && let Some(j) = &stats
        {
            // The suite is meant to run over the rings: prove it did.
            let rings = j
                .get("transport")
                .and_then(|t| t.get("uring"))
                .and_then(Json::as_u64);
            assert!(
                rings.is_some_and(|n| n > 0),
                "FUSE_WIRE_TEST_TRANSPORT=uring but the daemon served no request over io_uring \
                 (is /sys/module/fuse/parameters/enable_uring Y?); stats: {j:?}"
            );
        }
        DaemonExit {
            status,
            output_tail: self.output_tail(),
            stats,
            stats_error,
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.unmount();
        if self.child.is_some() {
            self.reap();
        }
        if common::fuse_mounted_at(&self.mnt) {
            let _ = fuse_wire::session::mount::unmount(&self.mnt, true);
        }
    }
}

/// Processes with an open file, cwd or root below `mnt` (for diagnostics).
fn holders(mnt: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(procs) = fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.filter_map(|e| e.ok()) {
        let pid = p.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let mut links: Vec<PathBuf> = ["cwd", "root"].iter().map(|n| p.path().join(n)).collect();
        if let Ok(fds) = fs::read_dir(p.path().join("fd")) {
            links.extend(fds.filter_map(|e| e.ok()).map(|e| e.path()));
        }
        for l in links {
            if fs::read_link(&l).is_ok_and(|t| t.starts_with(mnt)) {
                let comm = fs::read_to_string(p.path().join("comm")).unwrap_or_default();
                out.push(format!("{pid} ({}) {}", comm.trim(), l.display()));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------
// credentials and child processes

/// Runs `f` on a new thread whose credentials (uid, gid, supplementary
/// groups; real, effective, saved and fs) are `uid`, `gid`, `groups`. The raw
/// system calls change only that thread, not the test process; the thread
/// ends when `f` returns.
pub fn as_user<T: Send>(uid: u32, gid: u32, groups: &[u32], f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: raw credential syscalls on this thread; `groups` outlives the call.
            unsafe {
                assert_eq!(
                    libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()),
                    0,
                    "setgroups"
                );
                assert_eq!(libc::syscall(libc::SYS_setresgid, gid, gid, gid), 0, "setresgid");
                assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0, "setresuid");
            }
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Number of values a forked child reports.
pub const CHILD_VALUES: usize = 8;

/// A forked child process that reports [`CHILD_VALUES`] integers through a pipe.
pub struct ForkedChild {
    pid: libc::pid_t,
    read_fd: Fd,
}

/// Forks a child process that runs `f` and reports its values. The child
/// must do only simple system calls (prepare paths before forking); it is
/// killed by `SIGALRM` after 20 s. Use for what needs a second *process*
/// (POSIX lock owners are processes).
pub fn fork_child(f: impl FnOnce() -> [i64; CHILD_VALUES]) -> ForkedChild {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two ints.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(r, 0, "pipe2");
    // SAFETY: the child only runs `f` (simple system calls), writes and `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", errno_name(errno()));
    if pid == 0 {
        // SAFETY: in the child: plain system calls, then `_exit` (no unwinding, no atexit).
        unsafe {
            // Drop every descriptor inherited from other tests' threads (they
            // would keep those tests' mounts busy), keeping the pipe's write end.
            let w = fds[1];
            libc::syscall(libc::SYS_close_range, 3u32, (w - 1) as u32, 0u32);
            libc::syscall(libc::SYS_close_range, (w + 1) as u32, u32::MAX, 0u32);
            libc::alarm(20);
            let vals = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                Ok(v) => v,
                Err(_) => libc::_exit(3),
            };
            let bytes = std::slice::from_raw_parts(vals.as_ptr().cast::<u8>(), std::mem::size_of_val(&vals));
            let ok = libc::write(fds[1], bytes.as_ptr().cast(), bytes.len()) == bytes.len() as isize;
            libc::_exit(if ok { 0 } else { 4 });
        }
    }
    // SAFETY: closing the parent's copy of the write end.
    unsafe { libc::close(fds[1]) };
    ForkedChild {
        pid,
        read_fd: Fd(fds[0]),
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds; async-signal-safe, so a forked child
/// may call it to say when something happened, comparable with the parent's.
pub fn monotonic_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

impl ForkedChild {
    /// Waits (at most `timeout`) until the kernel shows the child asleep in
    /// the system call `nr` (`/proc/PID/syscall`); false if it ended first
    /// or the deadline passed.
    pub fn wait_blocked_in(&self, nr: libc::c_long, timeout: Duration) -> bool {
        let syscall = format!("/proc/{}/syscall", self.pid);
        let stat = format!("/proc/{}/stat", self.pid);
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let ended = fs::read_to_string(&stat)
                .map(|s| s.rsplit_once(") ").is_none_or(|(_, r)| r.starts_with('Z')))
                .unwrap_or(true);
            if ended {
                return false;
            }
            if let Ok(s) = fs::read_to_string(&syscall)
                && s.split_whitespace().next() == Some(nr.to_string().as_str())
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// Waits (at most `timeout`) for the child's values; kills it on timeout.
    pub fn wait(self, timeout: Duration) -> Result<[i64; CHILD_VALUES], String> {
        let mut pfd = libc::pollfd {
            fd: self.read_fd.0,
            events: libc::POLLIN,
            revents: 0,
        };
        let deadline = Instant::now() + timeout;
        let mut ready = false;
        while Instant::now() < deadline {
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, 50) };
            if r > 0 {
                ready = true;
                break;
            }
        }
        let mut vals = [0i64; CHILD_VALUES];
        let mut got = 0isize;
        if ready {
            // SAFETY: `vals` is valid for its size in bytes.
            got = unsafe {
                libc::read(
                    self.read_fd.0,
                    vals.as_mut_ptr().cast(),
                    std::mem::size_of_val(&vals),
                )
            };
        } else {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(self.pid, &mut status, 0) };
        if !ready {
            return Err(format!("child timed out after {timeout:?}"));
        }
        if got as usize != std::mem::size_of_val(&vals) {
            return Err(format!("child reported {got} bytes; wait status {status:#x}"));
        }
        Ok(vals)
    }
}

// ---------------------------------------------------------------------------
// running checks

/// Where a check runs: `root` is the directory it may fill (empty at the
/// start, mode 0755, owned by root); `outside` is an empty sibling directory
/// outside the filesystem under test (so `../outside` from `root` reaches it).
#[derive(Clone, Debug)]
pub struct Ctx {
    /// The directory under test.
    pub root: PathBuf,
    /// A sibling directory that is not part of the filesystem under test.
    pub outside: PathBuf,
    /// `"plain"` or the filesystem's label.
    pub label: String,
    /// For passthrough mounts: the source directory behind `root`.
    pub source: Option<PathBuf>,
}

impl Ctx {
    /// `root/<name>`.
    pub fn p(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Whether this is an in-memory mount, memfs or nodefs (no backing
    /// filesystem, so no size limits of its own).
    pub fn is_memfs(&self) -> bool {
        self.label.starts_with("memfs") || self.label.starts_with("nodefs")
    }

    /// Whether this is the plain directory.
    pub fn is_plain(&self) -> bool {
        self.label == "plain"
    }
}

/// A check: records its steps in the log. It runs once per target.
pub type Check = fn(&Ctx, &mut Log);

/// Runs `check` on a new thread; after `timeout` calls `on_timeout` (which
/// should make the check's blocked system calls fail, e.g. by killing the
/// daemon) and reports the timeout.
fn run_bounded(
    ctx: &Ctx,
    check: Check,
    timeout: Duration,
    on_timeout: &mut dyn FnMut(),
) -> Result<Log, String> {
    let (tx, rx) = mpsc::channel();
    let c = ctx.clone();
    let h = std::thread::Builder::new()
        .name(format!("check on {}", ctx.label))
        .spawn(move || {
            let mut log = Log::default();
            check(&c, &mut log);
            let _ = tx.send(());
            log
        })
        .expect("spawn check thread");
    match rx.recv_timeout(timeout) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => {
            on_timeout();
            let _ = rx.recv_timeout(Duration::from_secs(30));
            if !h.is_finished() {
                return Err(format!(
                    "check on {} timed out after {timeout:?} and hangs",
                    ctx.label
                ));
            }
            let _ = h.join();
            return Err(format!("check on {} timed out after {timeout:?}", ctx.label));
        }
    }
    h.join().map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "?".into());
        format!("check on {} panicked: {msg}", ctx.label)
    })
}

/// Runs `check` on a plain directory on this machine, then on each of `on`,
/// and panics listing every step whose outcome differs from the plain
/// directory's (and any daemon that did not exit cleanly). Without the
/// ability to mount it skips loudly, or panics when `CI=true`.
pub fn differential(name: &str, check: Check, on: &[Fs]) {
    if !common::require_mount_capability() {
        return;
    }
    let plain_base = TempBase::new("plain");
    let ctx = Ctx {
        root: plain_base.subdir("root"),
        outside: plain_base.subdir("outside"),
        label: "plain".into(),
        source: None,
    };
    let reference = run_bounded(&ctx, check, CHECK_TIMEOUT, &mut || {})
        .unwrap_or_else(|e| panic!("{name}: the plain directory itself failed: {e}"));
    assert!(
        !reference.steps().is_empty(),
        "{name}: the check recorded nothing"
    );
    let mut failures = Vec::new();
    for fs in on {
        let mut d = Daemon::start(*fs);
        let ctx = Ctx {
            root: d.mnt.clone(),
            outside: d.outside.clone(),
            label: d.label().to_string(),
            source: d.source.clone(),
        };
        let pid = d.pid();
        let result = run_bounded(&ctx, check, CHECK_TIMEOUT, &mut || {
            if let Some(pid) = pid {
                // SAFETY: signalling the daemon we spawned.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        });
        if result.is_err() {
            d.kill();
        }
        let exit = d.finish();
        match result {
            Ok(log) => {
                let diff = match fs {
                    Fs::Memfs(_) | Fs::Nodefs(_) => log
                        .without_backing_specific()
                        .diff(&reference.without_backing_specific()),
                    Fs::Passthrough(_) | Fs::Pathfs(_) => log.diff(&reference),
                };
                if !diff.is_empty() {
                    failures.push(format!(
                        "{} differs from a plain directory:\n    {}",
                        fs.label(),
                        diff.join("\n    ")
                    ));
                }
                if matches!(fs, Fs::Pathfs(o) if o.contains("passthrough"))
                    && exit.op("READ", "count") + exit.op("WRITE", "count") > 0
                {
                    failures.push(format!(
                        "{}: reads or writes reached the daemon, not passed through: {} READ, {} WRITE",
                        fs.label(),
                        exit.op("READ", "count"),
                        exit.op("WRITE", "count")
                    ));
                }
                if !exit.status.is_some_and(|s| s.success()) {
                    failures.push(format!(
                        "{} did not exit cleanly after unmount: {:?}\n{}",
                        fs.label(),
                        exit.status,
                        exit.output_tail
                    ));
                }
            }
            Err(e) => failures.push(format!("{e}\ndaemon output:\n{}", exit.output_tail)),
        }
    }
    if !failures.is_empty() {
        panic!("{name}:\n  {}", failures.join("\n  "));
    }
}

// ---------------------------------------------------------------------------
// a small JSON reader (for the --stats files)

/// A JSON value.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    /// `null`
    Null,
    /// `true` / `false`
    Bool(bool),
    /// A number.
    Num(f64),
    /// A string.
    Str(String),
    /// An array.
    Arr(Vec<Json>),
    /// An object.
    Obj(BTreeMap<String, Json>),
}

pub use common::over_uring;

impl Json {
    /// Parses a whole document.
    pub fn parse(s: &str) -> Result<Json, String> {
        let b = s.as_bytes();
        let mut i = 0;
        let v = parse_value(b, &mut i)?;
        skip_ws(b, &mut i);
        if i != b.len() {
            return Err(format!("trailing characters at {i}"));
        }
        Ok(v)
    }

    /// A member of an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.get(key),
            _ => None,
        }
    }

    /// A non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Json::Num(n) if *n >= 0.0 && n.fract() == 0.0 => Some(*n as u64),
            _ => None,
        }
    }
}

fn skip_ws(b: &[u8], i: &mut usize) {
    while *i < b.len() && b[*i].is_ascii_whitespace() {
        *i += 1;
    }
}

fn parse_value(b: &[u8], i: &mut usize) -> Result<Json, String> {
    skip_ws(b, i);
    match b.get(*i) {
        None => Err("unexpected end".into()),
        Some(b'{') => {
            *i += 1;
            let mut m = BTreeMap::new();
            skip_ws(b, i);
            if b.get(*i) == Some(&b'}') {
                *i += 1;
                return Ok(Json::Obj(m));
            }
            loop {
                skip_ws(b, i);
                let k = match parse_value(b, i)? {
                    Json::Str(k) => k,
                    _ => return Err(format!("object key expected at {i}")),
                };
                skip_ws(b, i);
                if b.get(*i) != Some(&b':') {
                    return Err(format!("':' expected at {i}"));
                }
                *i += 1;
                let v = parse_value(b, i)?;
                m.insert(k, v);
                skip_ws(b, i);
                match b.get(*i) {
                    Some(b',') => *i += 1,
                    Some(b'}') => {
                        *i += 1;
                        return Ok(Json::Obj(m));
                    }
                    _ => return Err(format!("',' or '}}' expected at {i}")),
                }
            }
        }
        Some(b'[') => {
            *i += 1;
            let mut v = Vec::new();
            skip_ws(b, i);
            if b.get(*i) == Some(&b']') {
                *i += 1;
                return Ok(Json::Arr(v));
            }
            loop {
                v.push(parse_value(b, i)?);
                skip_ws(b, i);
                match b.get(*i) {
                    Some(b',') => *i += 1,
                    Some(b']') => {
                        *i += 1;
                        return Ok(Json::Arr(v));
                    }
                    _ => return Err(format!("',' or ']' expected at {i}")),
                }
            }
        }
        Some(b'"') => {
            *i += 1;
            let mut s = String::new();
            while let Some(&c) = b.get(*i) {
                *i += 1;
                match c {
                    b'"' => return Ok(Json::Str(s)),
                    b'\\' => {
                        let e = *b.get(*i).ok_or("bad escape")?;
                        *i += 1;
                        match e {
                            b'n' => s.push('\n'),
                            b't' => s.push('\t'),
                            b'r' => s.push('\r'),
                            b'b' => s.push('\u{8}'),
                            b'f' => s.push('\u{c}'),
                            b'u' => {
                                let hex = std::str::from_utf8(b.get(*i..*i + 4).ok_or("bad \\u")?)
                                    .map_err(|e| e.to_string())?;
                                let cp = u32::from_str_radix(hex, 16).map_err(|e| e.to_string())?;
                                s.push(char::from_u32(cp).unwrap_or('\u{fffd}'));
                                *i += 4;
                            }
                            other => s.push(other as char),
                        }
                    }
                    _ => {
                        // Re-decode multi-byte UTF-8 sequences as a whole.
                        let start = *i - 1;
                        let len = match c {
                            0x00..=0x7f => 1,
                            0xc0..=0xdf => 2,
                            0xe0..=0xef => 3,
                            _ => 4,
                        };
                        let end = (start + len).min(b.len());
                        s.push_str(&String::from_utf8_lossy(&b[start..end]));
                        *i = end;
                    }
                }
            }
            Err("unterminated string".into())
        }
        Some(b't') if b[*i..].starts_with(b"true") => {
            *i += 4;
            Ok(Json::Bool(true))
        }
        Some(b'f') if b[*i..].starts_with(b"false") => {
            *i += 5;
            Ok(Json::Bool(false))
        }
        Some(b'n') if b[*i..].starts_with(b"null") => {
            *i += 4;
            Ok(Json::Null)
        }
        Some(_) => {
            let start = *i;
            while *i < b.len() && matches!(b[*i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                *i += 1;
            }
            let t = std::str::from_utf8(&b[start..*i]).map_err(|e| e.to_string())?;
            t.parse::<f64>()
                .map(Json::Num)
                .map_err(|_| format!("bad token at {start}: {t:?}"))
        }
    }
}

// ---------------------------------------------------------------------------
// buffers for O_DIRECT

/// A zeroed buffer aligned to 4096 bytes (for `O_DIRECT`).
pub struct AlignedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is uniquely owned heap memory.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (`len` > 0).
    pub fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("layout");
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Self { ptr, layout }
    }

    /// A buffer holding `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut b = Self::new(data.len());
        b.copy_from_slice(data);
        b
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `layout.size()` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is valid for `layout.size()` bytes and uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// `pread(2)` into an aligned buffer (for `O_DIRECT`), returning the count.
pub fn pread_into(fd: &Fd, buf: &mut [u8], off: i64) -> Result<i64, i32> {
    // SAFETY: `buf` is valid for `buf.len()` writable bytes.
    chk(unsafe { libc::pread(fd.0, buf.as_mut_ptr().cast(), buf.len(), off) } as i64)
}

/// Drops clean dentries and inodes from the kernel's caches (whole machine).
pub fn drop_dentries_and_inodes() {
    fs::write("/proc/sys/vm/drop_caches", "2").expect("write /proc/sys/vm/drop_caches");
}
