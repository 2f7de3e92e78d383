//! Helpers for tests that mount for real: deciding whether mounting is
//! possible (never skipping silently under `CI=true`), temporary mountpoints
//! that unmount on drop, `/proc/self/mountinfo` lookups, a tiny server that
//! answers INIT and GETATTR of the root, a guard that opens `/dev/fuse`
//! to other users for a test's duration, and where the example programs
//! are ([`example_binary`]).
//!
//! Use with `mod common;` from a test file; not every file uses every helper.
#![allow(dead_code)]

use fuse_wire::proto::abi::{Attr, AttrOut, InitOut};
use fuse_wire::proto::{Errno, Operation, Reply, Request};
use fuse_wire::session::transport::dev_fuse::DevFuse;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Whether the real-mount suites run over FUSE-over-io_uring
/// (`FUSE_WIRE_TEST_TRANSPORT=uring`, set by `.ci/run` for its second pass,
/// with the kernel's `enable_uring` knob turned on).
pub fn over_uring() -> bool {
    std::env::var("FUSE_WIRE_TEST_TRANSPORT").is_ok_and(|v| v == "uring")
}

/// The session transport the suites use: io_uring in the second CI pass.
pub fn test_transport() -> fuse_wire::session::Transport {
    if over_uring() {
        fuse_wire::session::Transport::Uring
    } else {
        fuse_wire::session::Transport::DevFuse
    }
}

/// Whether the test run must not skip (`CI=true`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Skips loudly, or panics under `CI=true`. Always returns `false`.
pub fn skip(reason: &str) -> bool {
    if in_ci() {
        panic!("CI=true but this test cannot run: {reason}");
    }
    // Written to the real stderr, past libtest's capture, so it shows in every run.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {reason}");
    false
}

/// A field of `/proc/self/status` (`Uid:`, `CapEff:`, …).
fn proc_status(key: &str) -> Option<String> {
    let s = fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
}

/// The effective uid of this process.
pub fn euid() -> u32 {
    proc_status("Uid:")
        .and_then(|v| v.split_whitespace().nth(1).and_then(|s| s.parse().ok()))
        .unwrap_or(u32::MAX)
}

fn has_cap_sys_admin() -> bool {
    proc_status("CapEff:")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .is_some_and(|caps| caps & (1 << 21) != 0)
}

/// Why privileged mounting is impossible here, if it is.
pub fn mount_capability() -> Result<(), String> {
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse does not exist (no FUSE in this kernel or container)".into());
    }
    if euid() != 0 || !has_cap_sys_admin() {
        return Err("privileged mount tests need root with CAP_SYS_ADMIN".into());
    }
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| format!("cannot open /dev/fuse: {e}"))?;
    Ok(())
}

/// Whether real mounts can be made (as root). Panics under `CI=true` if not;
/// otherwise prints `SKIPPED: reason` and returns `false`.
pub fn require_mount_capability() -> bool {
    match mount_capability() {
        Ok(()) => true,
        Err(reason) => skip(&reason),
    }
}

/// Like [`require_mount_capability`], and also needs a setuid-root
/// `fusermount3` (to test the unprivileged path from a root test process).
pub fn require_fusermount_capability() -> bool {
    if !require_mount_capability() {
        return false;
    }
    match fuse_wire::session::mount::find_fusermount() {
        None => skip("fusermount3 is not installed (Debian: apt-get install fuse3; scripts/test does it)"),
        Some(p) => match fs::metadata(&p) {
            Ok(m) if m.permissions().mode() & 0o4000 != 0 => true,
            _ => skip(&format!("{} is not setuid", p.display())),
        },
    }
}

/// One line of `/proc/self/mountinfo`.
#[derive(Clone, Debug)]
pub struct MountInfo {
    /// Mountpoint (unescaped).
    pub mountpoint: PathBuf,
    /// Per-mount options (`rw,nosuid,nodev,…`).
    pub mount_opts: String,
    /// Filesystem type (`fuse.<subtype>`).
    pub fstype: String,
    /// Mount source.
    pub source: String,
    /// Superblock options (`rw,user_id=0,group_id=0,…`).
    pub super_opts: String,
    /// The device number `major:minor`.
    pub dev: (u32, u32),
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The topmost mount at `path` in this mount namespace, if any.
pub fn mountinfo(path: &Path) -> Option<MountInfo> {
    let text = fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let lf: Vec<&str> = left.split(' ').collect();
            let rf: Vec<&str> = right.split(' ').collect();
            Some(MountInfo {
                mountpoint: PathBuf::from(unescape(lf.get(4)?)),
                mount_opts: lf.get(5)?.to_string(),
                fstype: rf.first()?.to_string(),
                source: unescape(rf.get(1)?),
                super_opts: rf.get(2).unwrap_or(&"").to_string(),
                dev: lf.get(2).and_then(|d| {
                    let (a, b) = d.split_once(':')?;
                    Some((a.parse().ok()?, b.parse().ok()?))
                })?,
            })
        })
        .rfind(|m| m.mountpoint == path)
}

/// Whether a FUSE filesystem is mounted at `path`.
pub fn fuse_mounted_at(path: &Path) -> bool {
    mountinfo(path).is_some_and(|m| m.fstype == "fuse" || m.fstype.starts_with("fuse."))
}

/// Aborts the FUSE connection of the mount at `path` through fusectl, which
/// ends every request of it (processes waiting on the mount are released)
/// and makes its daemon's reads fail: for tests that must never hang on a
/// stuck mount. Touches nothing of the mount itself (no `stat`), and mounts
/// fusectl on a private temporary directory for the call, so that the
/// machine's own mounts are left as they are.
pub fn abort_fuse_connection(path: &Path) -> io::Result<()> {
    let info =
        mountinfo(path).ok_or_else(|| io::Error::other(format!("nothing mounted at {}", path.display())))?;
    // The kernel names a connection after its superblock's dev_t.
    let (major, minor) = info.dev;
    let conn = (major << 20) | minor;
    let dir = std::env::temp_dir().join(format!(
        "fuse-wire-fusectl-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir)?;
    let c =
        |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL in a temp path");
    let target = c(&dir);
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::mount(
            c"fusectl".as_ptr(),
            target.as_ptr(),
            c"fusectl".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        let _ = fs::remove_dir(&dir);
        return Err(e);
    }
    let res = fs::write(dir.join(conn.to_string()).join("abort"), "1");
    // SAFETY: umount2(2) of the directory mounted just above.
    unsafe {
        libc::umount2(target.as_ptr(), libc::MNT_DETACH);
    }
    let _ = fs::remove_dir(&dir);
    res
}

/// Polls until no FUSE mount is at `path`; `false` on timeout.
pub fn wait_unmounted(path: &Path, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while fuse_mounted_at(path) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh temporary directory holding an empty `mnt` directory. On drop, any
/// FUSE mount left at `mnt` is detached and the directory tree removed.
pub struct TempMountpoint {
    root: PathBuf,
    mnt: PathBuf,
}

impl TempMountpoint {
    /// Creates `/tmp/fuse-wire-<tag>-<pid>-<n>/mnt` (mode 0755).
    pub fn new(tag: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("fuse-wire-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("mnt")).expect("create temp mountpoint");
        for p in [&root, &root.join("mnt")] {
            fs::set_permissions(p, fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
        }
        let root = fs::canonicalize(&root).expect("canonicalize temp dir");
        let mnt = root.join("mnt");
        Self { root, mnt }
    }

    /// The mountpoint (canonical).
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// The temporary directory containing the mountpoint.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for TempMountpoint {
    fn drop(&mut self) {
        for _ in 0..10 {
            if !fuse_mounted_at(&self.mnt) {
                break;
            }
            eprintln!(
                "test cleanup: detaching a leftover mount at {}",
                self.mnt.display()
            );
            if let Err(e) = fuse_wire::session::mount::unmount(&self.mnt, true) {
                eprintln!("test cleanup: {e}");
                break;
            }
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// How the [`serve_root`] thread ended.
pub type ServeResult = Result<Vec<u32>, String>;

/// How long a [`serve_root`] thread serves at most.
pub const SERVE_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves a minimal filesystem on `dev` in a new thread: answers INIT (7.45,
/// max_write 128 KiB), GETATTR of the root with a 0755 directory owned by
/// `uid:gid`, nothing for FORGET/INTERRUPT, ENOSYS for anything else.
///
/// Ends with `Ok(opcodes seen)` when the device says `ENODEV` (unmounted), or
/// `Err` on any other error or after [`SERVE_TIMEOUT`].
pub fn serve_root(dev: DevFuse, uid: u32, gid: u32) -> JoinHandle<ServeResult> {
    std::thread::Builder::new()
        .name("fuse-test-server".into())
        .spawn(move || serve_loop(&dev, uid, gid))
        .expect("spawn server thread")
}

/// Waits up to `timeout` for `poll(2)` to report `fd` readable (or in error).
fn wait_readable(fd: i32, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is a valid pollfd for the duration of the call and nfds is 1.
    let r = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
    match r {
        r if r < 0 => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
        0 => Ok(false),
        _ => Ok(true),
    }
}

fn serve_loop(dev: &DevFuse, uid: u32, gid: u32) -> ServeResult {
    let deadline = Instant::now() + SERVE_TIMEOUT;
    let mut buf = vec![0u8; 256 * 1024];
    let mut minor = 0u32;
    let mut seen = Vec::new();
    loop {
        if Instant::now() >= deadline {
            return Err(format!(
                "server timed out after {SERVE_TIMEOUT:?}; saw opcodes {seen:?}"
            ));
        }
        match wait_readable(dev.as_raw_fd(), Duration::from_millis(100)) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(e) => return Err(format!("poll: {e}")),
        }
        let n = match dev.read(&mut buf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                Some(libc::ENODEV) => return Ok(seen),
                Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
                _ => return Err(format!("read /dev/fuse: {e}")),
            },
        };
        let req = match Request::parse(&buf[..n], minor) {
            Ok(r) => r,
            Err(e) => return Err(format!("parse error: {e:?}")),
        };
        let unique = req.header.unique;
        seen.push(req.header.opcode);
        let reply = match req.op {
            Operation::Init { arg } => {
                minor = arg.minor.min(45);
                let out = InitOut {
                    major: 7,
                    minor: 45,
                    max_readahead: arg.max_readahead,
                    max_write: 131072,
                    ..Default::default()
                };
                Reply::init(unique, &out, arg.minor)
            }
            Operation::Getattr { .. } if req.header.nodeid == 1 => {
                let out = AttrOut {
                    attr_valid: 1,
                    attr: Attr {
                        ino: 1,
                        mode: libc::S_IFDIR | 0o755,
                        nlink: 2,
                        uid,
                        gid,
                        blksize: 4096,
                        ..Default::default()
                    },
                    ..Default::default()
                };
                Reply::attr(unique, &out, minor)
            }
            Operation::Forget { .. } | Operation::BatchForget { .. } | Operation::Interrupt { .. } => {
                continue;
            }
            _ => Reply::error(unique, Errno::ENOSYS),
        };
        if let Err(e) = dev.write(&reply) {
            match e.raw_os_error() {
                Some(libc::ENOENT) => {}
                Some(libc::ENODEV) => return Ok(seen),
                _ => return Err(format!("write /dev/fuse: {e}")),
            }
        }
    }
}

/// Joins a [`serve_root`] thread, waiting at most `timeout` beyond its own limit.
pub fn join_server(h: JoinHandle<ServeResult>) -> ServeResult {
    let deadline = Instant::now() + SERVE_TIMEOUT + Duration::from_secs(5);
    while !h.is_finished() {
        if Instant::now() >= deadline {
            return Err("server thread did not finish".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    h.join().unwrap_or_else(|_| Err("server thread panicked".into()))
}

/// Grants what a distro grants, for the guard's lifetime: `/dev/fuse` open to
/// all users (mode 0666), and on request `user_allow_other` in
/// `/etc/fuse.conf`. Everything is restored on drop, also when the test fails.
/// Holders are serialised with an exclusive `flock` on a lock file, so
/// concurrent tests (threads or processes) never restore under each other.
pub struct DevFuseOpenToAll {
    original_mode: u32,
    /// The original `/etc/fuse.conf` (`None`: it did not exist), once changed.
    original_conf: Option<Option<Vec<u8>>>,
    _lock: fs::File,
}

const FUSE_CONF: &str = "/etc/fuse.conf";

impl DevFuseOpenToAll {
    /// Takes the lock and chmods `/dev/fuse` to 0666.
    pub fn new() -> io::Result<Self> {
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(std::env::temp_dir().join("fuse-wire-dev-fuse-mode.lock"))?;
        // SAFETY: flock on an fd we own; no memory is passed.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let original_mode = fs::metadata("/dev/fuse")?.permissions().mode() & 0o7777;
        fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666))?;
        Ok(Self {
            original_mode,
            original_conf: None,
            _lock: lock,
        })
    }

    /// Adds `user_allow_other` to `/etc/fuse.conf` (so users may mount with
    /// `allow_other`/`allow_root` through fusermount3) until drop.
    pub fn allow_other_for_users(&mut self) -> io::Result<()> {
        let original = match fs::read(FUSE_CONF) {
            Ok(c) => Some(c),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let mut conf = original.clone().unwrap_or_default();
        if !conf.is_empty() && !conf.ends_with(b"\n") {
            conf.push(b'\n');
        }
        conf.extend_from_slice(b"user_allow_other\n");
        self.original_conf.get_or_insert(original);
        fs::write(FUSE_CONF, conf)
    }
}

impl Drop for DevFuseOpenToAll {
    fn drop(&mut self) {
        if let Err(e) = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(self.original_mode)) {
            eprintln!(
                "could not restore /dev/fuse to mode {:o}: {e}",
                self.original_mode
            );
        }
        match self.original_conf.take() {
            None => {}
            Some(Some(c)) => {
                if let Err(e) = fs::write(FUSE_CONF, c) {
                    eprintln!("could not restore {FUSE_CONF}: {e}");
                }
            }
            Some(None) => {
                if let Err(e) = fs::remove_file(FUSE_CONF) {
                    eprintln!("could not remove {FUSE_CONF}: {e}");
                }
            }
        }
        // The lock is released when the file closes, after the restores.
    }
}

/// The example program `name` (`hello`, `notes`, `memfs`, `passthrough_ll`):
/// `target/<profile>/examples/<name>`, found from this test binary's path
/// (`target/<profile>/deps/<test>-<hash>`). Tests use the examples only as
/// programs, through this.
///
/// `cargo test --all-targets` builds examples only as test harnesses, and
/// an older plain build may be stale: the first call (re)builds every
/// example with the cargo that runs this test (a no-op when they are fresh;
/// the build lock is free by the time tests run).
pub fn example_binary(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test binary lives in target/<profile>/deps");
        if let Ok(cargo) = std::env::var("CARGO") {
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "--quiet", "--examples"]);
            if profile_dir.file_name().is_some_and(|n| n == "release") {
                cmd.arg("--release");
            }
            let status = cmd
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("run cargo build --examples");
            assert!(status.success(), "building the examples failed");
        }
        profile_dir.join("examples")
    });
    let bin = dir.join(name);
    assert!(
        bin.is_file(),
        "{} is missing: build the examples first (cargo build --workspace --examples)",
        bin.display()
    );
    bin
}

/// The `O_PATH` descriptors process `pid` holds (`flags` in
/// `/proc/PID/fdinfo`); 0 if it cannot be read.
pub fn open_path_fds(pid: u32) -> usize {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            fs::read_to_string(e.path()).is_ok_and(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("flags:"))
                    .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
                    .is_some_and(|f| f & libc::O_PATH as u32 != 0)
            })
        })
        .count()
}

/// Makes the kernel evict unused dentries and inodes (it sends FORGET for
/// each) until the daemon `pid`, which holds one `O_PATH` descriptor per
/// inode the kernel knows, holds at most `want` of them, or `timeout`
/// passes. Returns how many it holds at the end.
pub fn evict_until_path_fds(pid: u32, want: usize, timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        fs::write("/proc/sys/vm/drop_caches", "2").expect("write /proc/sys/vm/drop_caches");
        for _ in 0..50 {
            let now = open_path_fds(pid);
            if now <= want || Instant::now() >= deadline {
                return now;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Waits until the daemon `child` (started as `what`) has mounted at `mnt`;
/// panics with its standard error if it exits first, and kills it if it has
/// not mounted within 10 s.
pub fn wait_for_mount(child: &mut std::process::Child, mnt: &Path, what: &str) {
    use std::io::Read;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fuse_mounted_at(mnt) {
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("{what} exited with {status} before mounting: {err}");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not mount within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One STATFS round trip to the filesystem mounted at `mnt` (the kernel
/// never caches it), so that the daemon has read the FORGETs the kernel
/// queued before it: an unmount drops the unread ones.
pub fn statfs_round_trip(mnt: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mnt.as_os_str().as_bytes()).expect("a path without NUL");
    // SAFETY: an all-zero `statfs` is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a live C string and `st` is writable.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    assert_eq!(r, 0, "statfs {}: {}", mnt.display(), io::Error::last_os_error());
}

/// Stops a daemon mounted at `mnt`: SIGTERM, then (after 10 s) its FUSE
/// connection aborted and SIGKILL. Its exit status, or `None` if it had
/// to be killed.
pub fn terminate_daemon(mut child: std::process::Child, mnt: &Path) -> Option<std::process::ExitStatus> {
    // SAFETY: kill(2) on the pid of a child we have not reaped yet.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = abort_fuse_connection(mnt);
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// The number after `"key": ` in the statistics JSON `json` (a flat search
/// is enough for the daemons' output).
pub fn json_number(json: &str, key: &str) -> Option<u64> {
    let at = json.find(&format!("\"{key}\": "))? + key.len() + 4;
    json[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}
