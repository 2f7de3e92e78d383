//! Unmounting touches only our own mount, on real mounts.
//!
//! Two ways the mountpoint's path can name someone else's mount by the time
//! we unmount: a mount placed *over* ours (here a tmpfs), and a *new* mount on
//! the path after ours was unmounted from outside with `umount -l`. In both,
//! stopping the session (library), SIGTERM (the memfs example) and the
//! `auto_unmount` watchdog (SIGKILL of the memfs example) must leave the
//! other mount alone; the ordinary case must still unmount.
//!
//! Every test cleans up through guards, also when an assertion fails: the
//! tmpfs or foreign mount is detached first, then the session is stopped or
//! the daemon killed, then [`TempMountpoint`] detaches what is left. A daemon
//! that is killed closes its `/dev/fuse` fd, which aborts the connection, so
//! no cleanup step can block on a stuck server.

mod common;

use common::*;
use fuse_wire::session::mount::{self, Mount, MountError, MountOptions};
use fuse_wire::session::reply::ReplyAttr;
use fuse_wire::session::{
    Errno, FileAttr, FileHandle, FileKind, Filesystem, Inode, RequestContext, RunningSession, Session,
    SessionConfig,
};
use std::ffi::CString;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

const STEP: Duration = Duration::from_secs(20);

fn init_log() {
    let _ = env_logger::builder().is_test(true).try_init();
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

// ---------------------------------------------------------------------------
// /proc/self/mountinfo, with mount ids.

/// One mount of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    id: u64,
    parent: u64,
    mountpoint: PathBuf,
    fstype: String,
    source: String,
}

fn entries() -> Vec<Entry> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap();
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let lf: Vec<&str> = left.split(' ').collect();
            let rf: Vec<&str> = right.split(' ').collect();
            Some(Entry {
                id: lf.first()?.parse().ok()?,
                parent: lf.get(1)?.parse().ok()?,
                mountpoint: PathBuf::from(lf.get(4)?.replace("\\040", " ")),
                fstype: rf.first()?.to_string(),
                source: rf.get(1)?.to_string(),
            })
        })
        .collect()
}

/// The topmost mount on `path`: the one no other mount on `path` sits on.
fn top_at(path: &Path) -> Option<Entry> {
    let here: Vec<Entry> = entries().into_iter().filter(|e| e.mountpoint == path).collect();
    here.iter()
        .find(|e| !here.iter().any(|o| o.parent == e.id))
        .cloned()
}

/// Whether `mount` is still in the mount table. Mount ids are reused (and
/// other tests mount concurrently), so all its fields must match.
fn listed(mount: &Entry) -> bool {
    entries().contains(mount)
}

/// Detaches the topmost mount on `path` if it is mount `id`.
fn detach_if_top(path: &Path, id: u64) {
    if top_at(path).is_some_and(|t| t.id == id) {
        // SAFETY: umount2 with a NUL-terminated path; no other memory.
        let rc = unsafe { libc::umount2(cstr(path).as_ptr(), libc::MNT_DETACH) };
        if rc != 0 {
            eprintln!(
                "cleanup: umount -l {} (mount {id}): {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Our FUSE mount on `path` (the topmost mount there, which must be FUSE).
fn our_fuse_mount(path: &Path) -> Entry {
    let top = top_at(path).unwrap_or_else(|| panic!("nothing mounted on {}", path.display()));
    assert!(
        top.fstype.starts_with("fuse"),
        "topmost mount is not FUSE: {top:?}"
    );
    top
}

// ---------------------------------------------------------------------------
// Other mounts on the mountpoint, each detached on drop if still on top.

static SERIAL: AtomicU32 = AtomicU32::new(0);

/// A mount made by the test on a mountpoint: a tmpfs, or a dead FUSE mount.
struct Foreign {
    path: PathBuf,
    entry: Entry,
}

impl Foreign {
    /// Mounts a tmpfs with a unique source name on `path` (over whatever is there).
    fn tmpfs_over(path: &Path) -> Foreign {
        let source = format!(
            "fw-foreign-{}-{}",
            std::process::id(),
            SERIAL.fetch_add(1, Ordering::Relaxed)
        );
        let (src, target) = (CString::new(source.clone()).unwrap(), cstr(path));
        // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"size=1m,mode=0755".as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
        Foreign::found(path, &source)
    }

    /// Mounts a FUSE filesystem of type `fstype` on `path` and closes its
    /// `/dev/fuse` fd at once: a dead mount, whose root says `ENOTCONN`.
    fn dead_fuse_over(path: &Path, fstype: &str) -> Foreign {
        let source = format!(
            "fw-deadfuse-{}-{}",
            std::process::id(),
            SERIAL.fetch_add(1, Ordering::Relaxed)
        );
        let dev = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .unwrap();
        let data = CString::new(format!(
            "fd={},rootmode=40755,user_id=0,group_id=0",
            dev.as_raw_fd()
        ))
        .unwrap();
        let (src, target, ty) = (
            CString::new(source.clone()).unwrap(),
            cstr(path),
            CString::new(fstype).unwrap(),
        );
        // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                ty.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount {fstype}: {}", std::io::Error::last_os_error());
        drop(dev);
        let f = Foreign::found(path, &source);
        let err = fs::metadata(path).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");
        f
    }

    fn found(path: &Path, source: &str) -> Foreign {
        let entry = top_at(path).expect("the new mount is listed");
        assert_eq!(entry.source, source, "the new mount is on top");
        Foreign {
            path: path.to_path_buf(),
            entry,
        }
    }

    fn is_on_top(&self) -> bool {
        top_at(&self.path).is_some_and(|t| t == self.entry)
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        detach_if_top(&self.path, self.entry.id);
    }
}

/// An `O_PATH` fd of our mount's root: keeps our mount (and so the
/// connection) alive after `umount -l`, as a process with a file open in it
/// would.
fn pin(path: &Path) -> OwnedFd {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
        .unwrap()
        .into()
}

/// `umount -l` from outside.
fn lazy_unmount(path: &Path) {
    // SAFETY: umount2 with a NUL-terminated path; no other memory.
    let rc = unsafe { libc::umount2(cstr(path).as_ptr(), libc::MNT_DETACH) };
    assert_eq!(rc, 0, "umount -l: {}", std::io::Error::last_os_error());
}

// ---------------------------------------------------------------------------
// The library: Session::mount, then stop().

/// The smallest filesystem a mount can be checked with: an empty root.
struct EmptyRoot;

impl Filesystem for EmptyRoot {
    fn getattr(&self, _ctx: &RequestContext<'_>, ino: Inode, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino != Inode::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let attr = FileAttr::fixed(ino.0, FileKind::Directory, 0o755);
        reply.attr(Duration::from_secs(1), &attr);
    }
}

/// An empty root served by a session on `tm`; stopped on drop.
fn serve_root_dir(tm: &TempMountpoint) -> RunningSession {
    let opts = MountOptions {
        subtype: Some("fwown".into()),
        ..MountOptions::default()
    };
    let config = SessionConfig {
        workers: 1,
        transport: test_transport(),
        ..SessionConfig::default()
    };
    let s = Session::mount(EmptyRoot, tm.path(), &opts, config).expect("mount");
    let running = s.spawn().expect("spawn");
    // Served: INIT done and the root answered.
    assert!(fs::metadata(tm.path()).expect("stat the root").is_dir());
    running
}

#[test]
fn stop_unmounts_our_own_mount() {
    if !require_mount_capability() {
        return;
    }
    init_log();
    let tm = TempMountpoint::new("own-plain");
    let session = serve_root_dir(&tm);
    let ours = our_fuse_mount(tm.path());
    session.stop().expect("stop");
    assert!(!listed(&ours), "our mount is still there after stop");
}

#[test]
fn stop_leaves_a_mount_placed_over_ours() {
    if !require_mount_capability() {
        return;
    }
    init_log();
    let tm = TempMountpoint::new("own-covered");
    let mut session = Some(serve_root_dir(&tm));
    let ours = our_fuse_mount(tm.path());
    let cover = Foreign::tmpfs_over(tm.path());

    session.take().unwrap().stop().expect("stop");
    assert!(
        cover.is_on_top(),
        "stop unmounted the tmpfs placed over our mount"
    );
    assert!(listed(&ours), "our mount below the tmpfs was detached with it");

    // Clean up: the tmpfs, then our mount (dead: the session closed its fd).
    drop(cover);
    assert_eq!(top_at(tm.path()).map(|t| t.id), Some(ours.id));
    detach_if_top(tm.path(), ours.id);
    assert!(!listed(&ours));
}

#[test]
fn stop_leaves_a_new_mount_after_ours_was_unmounted() {
    if !require_mount_capability() {
        return;
    }
    init_log();
    let tm = TempMountpoint::new("own-replaced");
    let mut session = Some(serve_root_dir(&tm));
    let ours = our_fuse_mount(tm.path());
    let pinned = pin(tm.path());
    lazy_unmount(tm.path());
    assert!(!listed(&ours));
    let newer = Foreign::tmpfs_over(tm.path());

    // The session still runs (the pin keeps our detached mount alive).
    session.take().unwrap().stop().expect("stop");
    assert!(newer.is_on_top(), "stop unmounted the mount made after ours");
    drop(pinned);
}

#[test]
fn unmount_reports_a_covered_mount_and_leaves_both() {
    if !require_mount_capability() {
        return;
    }
    init_log();
    let tm = TempMountpoint::new("own-guard");
    let (dev, guard) = Mount::new(tm.path(), &MountOptions::default())
        .expect("mount")
        .into_parts();
    let server = serve_root(dev, 0, 0);
    fs::metadata(tm.path()).expect("root served");
    let ours = our_fuse_mount(tm.path());
    let cover = Foreign::tmpfs_over(tm.path());

    match guard.unmount() {
        Err(MountError::Covered { path, top }) => {
            assert_eq!(path, tm.path());
            assert!(top.contains("tmpfs"), "{top}");
        }
        other => panic!("expected MountError::Covered, got {other:?}"),
    }
    assert!(cover.is_on_top(), "the covering tmpfs was unmounted");
    assert!(listed(&ours), "our covered mount was detached");

    drop(cover);
    // Ours is on top again and still served: unmount it by path.
    mount::unmount(tm.path(), true).expect("unmount ours");
    join_server(server).expect("server ends with ENODEV");
}

// ---------------------------------------------------------------------------
// The memfs example: SIGTERM, and SIGKILL with auto_unmount.

/// The memfs example serving a mountpoint; killed on drop.
struct Daemon {
    child: Child,
    /// Its stderr, line by line; disconnected once every process holding
    /// the pipe (the daemon, and the `auto_unmount` watchdog it forked) is gone.
    stderr: Receiver<String>,
    seen: Vec<String>,
}

impl Daemon {
    fn start(tm: &TempMountpoint, opts: &str) -> Daemon {
        let mut cmd = Command::new(example_binary("memfs"));
        cmd.arg(tm.path())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if !opts.is_empty() {
            cmd.arg("-o").arg(opts);
        }
        let mut child = cmd.spawn().expect("start memfs");
        let (tx, stderr) = std::sync::mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let mut d = Daemon {
            child,
            stderr,
            seen: Vec::new(),
        };
        let deadline = Instant::now() + STEP;
        while !fuse_mounted_at(tm.path()) {
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!(
                    "memfs exited with {status} before mounting: {}",
                    d.drain().join("\n")
                );
            }
            assert!(Instant::now() < deadline, "memfs did not mount within {STEP:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        fs::metadata(tm.path()).expect("memfs serves its root");
        d
    }

    fn signal(&mut self, sig: libc::c_int) {
        // SAFETY: kill(2) on the pid of a child we have not reaped yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }

    /// Waits (bounded) for the daemon to exit; its exit status.
    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("memfs did not exit: {}", self.drain().join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Reads stderr until every writer has closed it (bounded); all lines.
    fn drain(&mut self) -> Vec<String> {
        let deadline = Instant::now() + STEP;
        loop {
            match self
                .stderr
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(l) => self.seen.push(l),
                Err(RecvTimeoutError::Disconnected) => return self.seen.clone(),
                Err(RecvTimeoutError::Timeout) => {
                    panic!("stderr still open after {STEP:?}: {}", self.seen.join("\n"))
                }
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn assert_logged(lines: &[String], needle: &str) {
    assert!(
        lines.iter().any(|l| l.contains(needle)),
        "no line with {needle:?} in:\n{}",
        lines.join("\n")
    );
}

#[test]
fn sigterm_unmounts_our_own_mount() {
    if !require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("own-sigterm");
    let mut d = Daemon::start(&tm, "");
    let ours = our_fuse_mount(tm.path());
    d.signal(libc::SIGTERM);
    assert!(d.wait().success());
    assert!(!listed(&ours), "our mount is still there after SIGTERM");
}

#[test]
fn sigterm_leaves_a_mount_placed_over_ours() {
    if !require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("own-sigterm-covered");
    let mut d = Daemon::start(&tm, "");
    let ours = our_fuse_mount(tm.path());
    let cover = Foreign::tmpfs_over(tm.path());

    d.signal(libc::SIGTERM);
    let status = d.wait();
    let lines = d.drain();
    assert!(
        status.success(),
        "memfs ended with {status}: {}",
        lines.join("\n")
    );
    assert!(
        cover.is_on_top(),
        "SIGTERM unmounted the tmpfs placed over our mount"
    );
    assert!(listed(&ours), "our mount below the tmpfs was detached with it");
    assert_logged(&lines, "is covered by another mount");

    drop(cover);
    detach_if_top(tm.path(), ours.id);
    assert!(!listed(&ours));
}

#[test]
fn sigterm_leaves_a_new_mount_after_ours_was_unmounted() {
    if !require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("own-sigterm-replaced");
    let mut d = Daemon::start(&tm, "");
    let ours = our_fuse_mount(tm.path());
    let pinned = pin(tm.path());
    lazy_unmount(tm.path());
    let newer = Foreign::tmpfs_over(tm.path());

    d.signal(libc::SIGTERM);
    let status = d.wait();
    let lines = d.drain();
    assert!(
        status.success(),
        "memfs ended with {status}: {}",
        lines.join("\n")
    );
    assert!(newer.is_on_top(), "SIGTERM unmounted the mount made after ours");
    assert!(!listed(&ours));
    assert_logged(&lines, "was unmounted from outside");
    drop(pinned);
}

#[test]
fn auto_unmount_watchdog_unmounts_after_sigkill() {
    if !require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("own-auto");
    let mut d = Daemon::start(&tm, "auto_unmount");
    let ours = our_fuse_mount(tm.path());
    d.signal(libc::SIGKILL);
    d.wait();
    let lines = d.drain();
    assert!(
        !listed(&ours),
        "the watchdog did not unmount: {}",
        lines.join("\n")
    );
    assert_logged(&lines, "auto_unmount watchdog");
}

#[test]
fn auto_unmount_watchdog_leaves_a_mount_placed_over_ours() {
    if !require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("own-auto-covered");
    let mut d = Daemon::start(&tm, "auto_unmount");
    let ours = our_fuse_mount(tm.path());
    let cover = Foreign::tmpfs_over(tm.path());

    d.signal(libc::SIGKILL);
    d.wait();
    // Disconnected once the watchdog, which inherited stderr, has decided.
    let lines = d.drain();
    assert!(
        cover.is_on_top(),
        "the watchdog unmounted the tmpfs over our mount"
    );
    assert!(listed(&ours), "our mount below the tmpfs was detached with it");
    assert_logged(&lines, "is not ours");

    drop(cover);
    detach_if_top(tm.path(), ours.id);
    assert!(!listed(&ours));
}

#[test]
fn auto_unmount_watchdog_leaves_a_dead_fuse_mount_made_after_ours() {
    if !require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("own-auto-replaced");
    let mut d = Daemon::start(&tm, "auto_unmount");
    let ours = our_fuse_mount(tm.path());
    let pinned = pin(tm.path());
    lazy_unmount(tm.path());
    // Same type as ours and dead: fusermount3's auto_unmount would take it
    // for ours, since it checks only the type and ENOTCONN.
    let newer = Foreign::dead_fuse_over(tm.path(), &ours.fstype);

    d.signal(libc::SIGKILL);
    d.wait();
    drop(pinned);
    let lines = d.drain();
    assert!(
        newer.is_on_top(),
        "the watchdog unmounted the mount made after ours"
    );
    assert_logged(&lines, "is not ours");
}
