//! Descriptors of the `passthrough_ll` example with many live inodes, on
//! real mounts: in file-handle mode (the default where the source gives
//! handles) the daemon serves 30000 live inodes under a hard limit of 20000
//! open files with a bounded number of descriptors; with
//! `inode_file_handles=never` (one descriptor per inode, as before file
//! handles) the same walk fails with `EMFILE`. Also: identity of renamed,
//! linked and recreated files with a tiny descriptor cache, and the start
//! refused by `inode_file_handles=mandatory` on a source without handles.
//! Under a hard limit of 1024 open files the default cache fits it (a walk
//! of 6000 files gets no `EMFILE`) and a larger `fd_cache=` is refused at
//! start.
//!
//! Every test runs under a deadline: past it, the test's own connection is
//! aborted and its daemon killed, so the waiting calls fail and the test
//! fails saying what it was waiting for.

mod common;

use common::TempMountpoint;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Files in the big directory: more than the daemon may open.
const FILES: usize = 30000;
/// The daemon's open-file limit (soft and hard), below [`FILES`] (lower if
/// this process's hard limit is).
const NOFILE: u64 = 20000;
/// Descriptors beside the cache: stdio, `/dev/fuse` (one per worker with
/// clone_fd), the source root twice, open directories, requests in flight.
const SLACK: usize = 128;
/// How long one test may take.
const DEADLINE: Duration = Duration::from_secs(90);

/// What the test is waiting for now, for the deadline's message.
type Doing = Arc<Mutex<&'static str>>;

/// A running daemon with a deadline: past [`DEADLINE`] its connection is
/// aborted and it is killed; on drop (and on a failing test) the same.
struct Daemon {
    child: Option<Child>,
    /// The daemon's open-file limit.
    nofile: u64,
    mnt: PathBuf,
    done: Option<mpsc::Sender<()>>,
    doing: Doing,
}

/// `passthrough_ll SRC MOUNTPOINT -o timeout=1,OPTS[,uring]` with an
/// open-file limit (soft and hard) of `nofile`; and the `-o` list.
fn command(tm: &TempMountpoint, src: &Path, opts: &str, nofile: u64) -> (Command, String) {
    let mut o = String::from("timeout=1");
    for x in [opts, if common::over_uring() { "uring" } else { "" }] {
        if !x.is_empty() {
            o.push(',');
            o.push_str(x);
        }
    }
    let mut cmd = Command::new(common::example_binary("passthrough_ll"));
    cmd.arg(src)
        .arg(tm.path())
        .arg("-o")
        .arg(&o)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: the closure only calls setrlimit(2), which is
    // async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: nofile,
                rlim_max: nofile,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    (cmd, o)
}

impl Daemon {
    /// A daemon with an open-file limit of [`NOFILE`] (or this process's
    /// hard limit, if lower).
    fn start(tm: &TempMountpoint, src: &Path, opts: &str) -> Daemon {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is live and writable.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        let nofile = NOFILE.min(lim.rlim_max);
        assert!(
            nofile > 4096 + SLACK as u64 + 1000,
            "the open-file hard limit ({nofile}) leaves no room for the default cache"
        );
        Daemon::start_with_limit(tm, src, opts, nofile)
    }

    /// A daemon with an open-file limit (soft and hard) of `nofile`.
    fn start_with_limit(tm: &TempMountpoint, src: &Path, opts: &str, nofile: u64) -> Daemon {
        let (mut cmd, o) = command(tm, src, opts, nofile);
        let mut child = cmd.spawn().expect("start passthrough_ll");
        common::wait_for_mount(&mut child, tm.path(), &format!("passthrough_ll -o {o}"));
        let doing: Doing = Arc::new(Mutex::new("the first request"));
        let (tx, rx) = mpsc::channel::<()>();
        let (mnt, pid, what) = (tm.path().to_path_buf(), child.id(), doing.clone());
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(DEADLINE) {
                let what = *what.lock().unwrap_or_else(|e| e.into_inner());
                eprintln!(
                    "passthrough_fds: no progress within {DEADLINE:?} while waiting for {what}; \
                     aborting the connection of {} and killing the daemon",
                    mnt.display()
                );
                let _ = common::abort_fuse_connection(&mnt);
                // SAFETY: kill(2) of our own child (not reaped before the
                // test ends, which this deadline precedes).
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
        });
        Daemon {
            child: Some(child),
            nofile,
            mnt: tm.path().to_path_buf(),
            done: Some(tx),
            doing,
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    fn doing(&self, what: &'static str) {
        *self.doing.lock().unwrap_or_else(|e| e.into_inner()) = what;
    }

    /// Open descriptors of the daemon now.
    fn fds(&self) -> usize {
        let pid = self.child.as_ref().expect("running").id();
        fs::read_dir(format!("/proc/{pid}/fd"))
            .expect("the daemon's /proc/PID/fd")
            .count()
    }

    /// SIGTERM; the daemon must unmount and exit cleanly.
    fn stop(mut self) {
        self.doing("the daemon to exit after SIGTERM");
        let status = self.terminate();
        assert!(
            status.is_some_and(|s| s.success()),
            "daemon ended with {status:?}"
        );
        assert!(!common::fuse_mounted_at(&self.mnt), "still mounted after SIGTERM");
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
        // Ends the deadline thread.
        drop(self.done.take());
    }
}

/// A source directory with `big/` holding [`FILES`] empty files `f0`...
fn big_source(tm: &TempMountpoint) -> PathBuf {
    source_of(tm, FILES)
}

/// A source directory with `big/` holding `files` empty files `f0`...
fn source_of(tm: &TempMountpoint, files: usize) -> PathBuf {
    let src = tm.root().join("src");
    let big = src.join("big");
    fs::create_dir_all(&big).unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o755)).unwrap();
    for i in 0..files {
        fs::File::create(big.join(format!("f{i}"))).unwrap();
    }
    src
}

/// What a readdirplus + stat walk of a directory saw.
#[derive(Debug, Default)]
struct Walk {
    /// Entries stat'ed successfully.
    ok: usize,
    /// Failures with `EMFILE` (the daemon out of descriptors).
    emfile: usize,
    /// Other failures: (errno, how many).
    other: Vec<(i32, usize)>,
    /// Most descriptors the daemon held at the samples.
    max_fds: usize,
}

impl Walk {
    fn failed(&mut self, e: &std::io::Error) {
        match e.raw_os_error() {
            Some(libc::EMFILE) | Some(libc::ENFILE) => self.emfile += 1,
            Some(n) => match self.other.iter_mut().find(|(m, _)| *m == n) {
                Some((_, k)) => *k += 1,
                None => self.other.push((n, 1)),
            },
            None => self.other.push((0, 1)),
        }
    }
}

/// Lists `dir` (the kernel asks READDIRPLUS) and stats every entry, as
/// `ls -l` does, sampling the daemon's descriptors every 500 entries.
fn walk(d: &Daemon, dir: &Path) -> Walk {
    let mut w = Walk::default();
    let it = match fs::read_dir(dir) {
        Ok(it) => it,
        Err(e) => {
            w.failed(&e);
            return w;
        }
    };
    for (n, ent) in it.enumerate() {
        if n % 500 == 0 {
            w.max_fds = w.max_fds.max(d.fds());
        }
        let ent = match ent {
            Ok(e) => e,
            Err(e) => {
                // A failed getdents ends the listing.
                w.failed(&e);
                break;
            }
        };
        match fs::symlink_metadata(ent.path()) {
            Ok(_) => w.ok += 1,
            Err(e) => w.failed(&e),
        }
    }
    w.max_fds = w.max_fds.max(d.fds());
    w
}

#[test]
fn ls_l_of_30000_files_holds_a_bounded_number_of_descriptors() {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-fds-ls");
    let src = big_source(&tm);
    // The default mode: file handles where the source gives them.
    let d = Daemon::start(&tm, &src, "");
    let base = d.fds();
    d.doing("the readdirplus + stat walk of 30000 files");
    let w = walk(&d, &d.p("big"));
    assert_eq!(
        (w.ok, w.emfile),
        (FILES, 0),
        "walk of {FILES} files under a limit of {} descriptors: {w:?}",
        d.nofile
    );
    assert!(w.other.is_empty(), "{w:?}");
    let bound = base + 4096 + SLACK;
    assert!(
        w.max_fds <= bound,
        "the daemon held {} descriptors (at most {bound} expected: {base} at start + the 4096 of the \
         default cache + {SLACK}); is the source without file handles? {w:?}",
        w.max_fds
    );
    // Again, now that every inode is known and most are out of the cache.
    d.doing("the second walk of 30000 files");
    let w = walk(&d, &d.p("big"));
    assert_eq!((w.ok, w.emfile), (FILES, 0), "second walk: {w:?}");
    assert!(
        w.max_fds <= bound,
        "second walk held {} descriptors: {w:?}",
        w.max_fds
    );

    // A small cache holds less.
    d.stop();
    let d = Daemon::start(&tm, &src, "fd_cache=200");
    let base = d.fds();
    d.doing("the walk of 30000 files with fd_cache=200");
    let w = walk(&d, &d.p("big"));
    assert_eq!((w.ok, w.emfile), (FILES, 0), "fd_cache=200: {w:?}");
    assert!(
        w.max_fds <= base + 200 + SLACK,
        "fd_cache=200: {} descriptors (base {base}): {w:?}",
        w.max_fds
    );
    d.stop();
}

/// A common hard limit of open files.
const LOW_NOFILE: u64 = 1024;
/// Files listed under [`LOW_NOFILE`]: more than the daemon may open.
const LOW_FILES: usize = 6000;

#[test]
fn ls_l_of_6000_files_under_a_hard_limit_of_1024_descriptors() {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-fds-low");
    let src = source_of(&tm, LOW_FILES);
    // The default mode and the default cache, which must fit the limit.
    let d = Daemon::start_with_limit(&tm, &src, "", LOW_NOFILE);
    for pass in ["first", "second"] {
        d.doing("a walk of 6000 files under a limit of 1024 descriptors");
        let w = walk(&d, &d.p("big"));
        assert_eq!(
            (w.ok, w.emfile),
            (LOW_FILES, 0),
            "{pass} walk of {LOW_FILES} files under a limit of {LOW_NOFILE} descriptors: {w:?}"
        );
        assert!(w.other.is_empty(), "{pass} walk: {w:?}");
    }
    d.stop();
}

#[test]
fn an_fd_cache_beyond_the_open_file_limit_is_refused_at_start() {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-fds-refused");
    let src = source_of(&tm, 0);
    let (mut cmd, o) = command(&tm, &src, "fd_cache=100000", LOW_NOFILE);
    let mut child = cmd.spawn().expect("run passthrough_ll");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        match child.try_wait().expect("wait for passthrough_ll") {
            Some(s) => break s,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            None => {
                if common::fuse_mounted_at(tm.path()) {
                    let _ = common::abort_fuse_connection(tm.path());
                }
                let _ = child.kill();
                let _ = child.wait();
                panic!("passthrough_ll -o {o} under a limit of {LOW_NOFILE} files still runs after 10 s");
            }
        }
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "started with -o {o}: {err}");
    assert!(!common::fuse_mounted_at(tm.path()), "mounted anyway");
    // Says which option, and the limit it does not fit.
    assert!(
        err.contains("fd_cache=100000") && err.contains(&LOW_NOFILE.to_string()),
        "{err}"
    );

    // A cache that fits is taken, and the daemon serves (answered INIT:
    // stopped before, it would end "before INIT", not cleanly).
    let d = Daemon::start_with_limit(&tm, &src, "fd_cache=100", LOW_NOFILE);
    common::statfs_round_trip(tm.path());
    d.stop();
}

#[test]
fn one_descriptor_per_inode_runs_out_without_file_handles() {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-fds-never");
    let src = big_source(&tm);
    let d = Daemon::start(&tm, &src, "inode_file_handles=never");
    d.doing("the walk of 30000 files with inode_file_handles=never");
    let w = walk(&d, &d.p("big"));
    // Each live inode holds a descriptor: the daemon runs out before the
    // end, or (when the kernel forgot inodes during the walk, as a cache
    // drop elsewhere on the machine makes it do) it still held far more
    // than file-handle mode's cache ever does.
    assert!(
        w.emfile > 0 || w.max_fds >= FILES / 2,
        "expected EMFILE or about one descriptor per inode: {w:?}"
    );
    if w.emfile > 0 {
        assert!(w.max_fds + SLACK >= d.nofile as usize, "{w:?}");
    }
    d.stop();
}

#[test]
fn unlinks_racing_a_large_readdirplus_never_fail_with_emfile() {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-fds-race");
    let src = big_source(&tm);
    let d = Daemon::start(&tm, &src, "");
    d.doing("a walk of 30000 files racing unlinks of a tenth of them");
    let big = d.p("big");
    let unlinker = {
        let big = big.clone();
        std::thread::spawn(move || {
            // From the end while the walk goes from the start; every tenth
            // file, so that more inodes stay live than the daemon may open.
            let mut failed: Vec<(usize, std::io::Error)> = Vec::new();
            for i in (0..FILES).rev().step_by(10) {
                if let Err(e) = fs::remove_file(big.join(format!("f{i}"))) {
                    failed.push((i, e));
                }
            }
            failed
        })
    };
    let mut walks = Vec::new();
    for _ in 0..2 {
        walks.push(walk(&d, &big));
    }
    let failed = unlinker.join().expect("unlink thread");
    assert!(
        failed.is_empty(),
        "{} unlinks failed, first: {:?}",
        failed.len(),
        failed.first()
    );
    for w in &walks {
        assert_eq!(w.emfile, 0, "{w:?}");
        // Files unlinked between listing and stat are ENOENT; nothing else.
        assert!(w.other.iter().all(|(e, _)| *e == libc::ENOENT), "{w:?}");
    }
    d.doing("the walk after the unlinks");
    let w = walk(&d, &big);
    assert_eq!(
        (w.ok, w.emfile),
        (FILES - FILES / 10, 0),
        "after the unlinks: {w:?}"
    );
    d.stop();
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Looks up and stats `n` other files, pushing everything else out of a
/// small descriptor cache.
fn churn(d: &Daemon, n: usize) {
    for i in 0..n {
        let p = d.p(&format!("churn/c{i}"));
        if fs::symlink_metadata(&p).is_err() {
            fs::File::create(&p).unwrap();
        }
    }
}

#[test]
fn renamed_linked_and_recreated_files_keep_their_identity() {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-fds-ident");
    let src = tm.root().join("src");
    fs::create_dir_all(src.join("churn")).unwrap();
    fs::create_dir_all(src.join("sub")).unwrap();
    // A tiny cache: every step below reopens by handle.
    let d = Daemon::start(&tm, &src, "fd_cache=16");
    d.doing("the rename / link / recreate steps");
    churn(&d, 64);

    fs::write(d.p("a"), "one").unwrap();
    let ino = fs::metadata(d.p("a")).unwrap().ino();
    let mut open = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.p("a"))
        .unwrap();
    churn(&d, 64);

    // Rename: same inode, same data, writes through the old open file land.
    fs::rename(d.p("a"), d.p("sub/b")).unwrap();
    churn(&d, 64);
    assert_eq!(fs::metadata(d.p("sub/b")).unwrap().ino(), ino);
    assert_eq!(read(&d.p("sub/b")), "one");
    open.write_all(b"ONE").unwrap();
    churn(&d, 64);
    assert_eq!(read(&d.p("sub/b")), "ONE");

    // Hard link: both names one inode, a chmod through one shows on both.
    fs::hard_link(d.p("sub/b"), d.p("c")).unwrap();
    churn(&d, 64);
    fs::set_permissions(d.p("c"), fs::Permissions::from_mode(0o640)).unwrap();
    churn(&d, 64);
    let (mb, mc) = (
        fs::metadata(d.p("sub/b")).unwrap(),
        fs::metadata(d.p("c")).unwrap(),
    );
    assert_eq!((mb.ino(), mb.nlink(), mb.mode() & 0o777), (ino, 2, 0o640));
    assert_eq!((mc.ino(), mc.nlink(), mc.mode() & 0o777), (ino, 2, 0o640));

    // Deleted and recreated under the same name: a new file; the old one,
    // still open, keeps its data and takes attribute changes.
    fs::remove_file(d.p("sub/b")).unwrap();
    fs::remove_file(d.p("c")).unwrap();
    fs::write(d.p("sub/b"), "two").unwrap();
    churn(&d, 64);
    assert_eq!(read(&d.p("sub/b")), "two");
    let old = open.metadata().unwrap();
    assert_eq!((old.ino(), old.nlink()), (ino, 0));
    open.set_permissions(fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(open.metadata().unwrap().mode() & 0o777, 0o600);
    let mut back = String::new();
    let mut again = open.try_clone().unwrap();
    std::io::Seek::seek(&mut again, std::io::SeekFrom::Start(0)).unwrap();
    again.read_to_string(&mut back).unwrap();
    assert_eq!(back, "ONE");
    drop((open, again));

    // Removed and recreated on the source behind the mount's back, where
    // the new file may get the old inode number (a different handle): the
    // mount must show the new file, never the old one's node.
    let mut reused = 0;
    for i in 0..20 {
        let name = format!("r{i}");
        fs::write(src.join(&name), "old").unwrap();
        let before = fs::metadata(d.p(&name)).unwrap().ino();
        fs::remove_file(src.join(&name)).unwrap();
        let new = format!("n{i}");
        fs::write(src.join(&new), format!("new {i}")).unwrap();
        let m = fs::metadata(d.p(&new)).unwrap();
        if m.ino() == before {
            reused += 1;
        }
        churn(&d, 20);
        assert_eq!(read(&d.p(&new)), format!("new {i}"));
    }
    eprintln!("inode numbers reused by the source: {reused} of 20");
    d.stop();
}

#[test]
fn mandatory_file_handles_refuse_a_source_without_them() {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-fds-mandatory");
    // procfs gives no file handles.
    let mut child = Command::new(common::example_binary("passthrough_ll"))
        .arg("/proc/sys")
        .arg(tm.path())
        .args(["-o", "inode_file_handles=mandatory"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run passthrough_ll");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        match child.try_wait().expect("wait for passthrough_ll") {
            Some(s) => break s,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            None => {
                if common::fuse_mounted_at(tm.path()) {
                    let _ = common::abort_fuse_connection(tm.path());
                }
                let _ = child.kill();
                let _ = child.wait();
                panic!("passthrough_ll -o inode_file_handles=mandatory on /proc/sys still runs after 10 s");
            }
        }
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "started on /proc/sys: {err}");
    assert!(err.contains("inode_file_handles=mandatory"), "{err}");
    assert!(!common::fuse_mounted_at(tm.path()), "mounted anyway");

    // The default mode falls back to descriptors there and serves it.
    let d = Daemon::start(&tm, Path::new("/proc/sys"), "");
    d.doing("a listing of /proc/sys through the mount");
    let names = |p: &Path| {
        let mut v: Vec<_> = fs::read_dir(p).unwrap().map(|e| e.unwrap().file_name()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&d.p("kernel")), names(Path::new("/proc/sys/kernel")));
    d.stop();
}

/// Files uid 65534 keeps open under [`LOW_NOFILE`]: about twice what the
/// daemon could hold open at once.
const HELD: usize = 2000;
/// Of them, opened for appending (a reopen must keep `O_APPEND`).
const APPENDED: usize = 20;
/// Of them, opened with `O_TRUNC` and written (a reopen must not truncate).
const TRUNCATED: usize = 20;
/// Files of root's, listed and read while uid 65534 holds its files.
const ROOTS: usize = 300;
/// Directories uid 65534 tries to hold open (each keeps its descriptor):
/// more than one user's share.
const DIRS: usize = 200;
/// Of its held files, removed through the mount while held (and idle).
const REMOVED: std::ops::Range<usize> = 100..110;
const NOBODY: u32 = 65534;

/// Runs `f` on a new thread whose credentials (raw system calls: this
/// thread only) are nobody's, without supplementary groups.
fn as_nobody<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: raw credential system calls on this thread only, no
        // memory passed but a null list of zero groups.
        let ok = unsafe {
            libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) == 0
                && libc::syscall(libc::SYS_setresgid, NOBODY, NOBODY, NOBODY) == 0
                && libc::syscall(libc::SYS_setresuid, NOBODY, NOBODY, NOBODY) == 0
        };
        assert!(ok, "becoming nobody: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("the thread of uid 65534")
}

/// Raises this process's soft open-file limit to its hard one (the test
/// holds thousands of files open).
fn raise_own_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is live and writable, then readable.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    lim.rlim_cur
}

fn flock(f: &fs::File, op: i32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock(2) on a descriptor this File owns.
    if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A whole-file read lock (`F_SETLK`, process-associated).
fn posix_rdlock(f: &fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fl = libc::flock {
        l_type: libc::F_RDLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    // SAFETY: fcntl(2) F_SETLK on a descriptor this File owns, with a
    // live flock struct.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &fl) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn pread_all(f: &fs::File) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 256];
    let n = f.read_at(&mut buf, 0)?;
    buf.truncate(n);
    Ok(buf)
}

/// The bytes of uid 65534's file `i`.
fn own_bytes(i: usize) -> Vec<u8> {
    format!("file {i} of uid 65534\n").into_bytes()
}

/// What uid 65534's files did, counted by outcome.
#[derive(Debug, Default, PartialEq)]
struct Held {
    ok: usize,
    emfile: usize,
    /// Other failures and wrong contents, the first few.
    other: Vec<String>,
}

impl Held {
    fn fail(&mut self, what: String, e: &std::io::Error) {
        if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) {
            self.emfile += 1;
        } else if self.other.len() < 10 {
            self.other.push(format!("{what}: {e}"));
        }
    }
}

#[test]
fn one_users_open_files_leave_descriptors_for_everyone_under_a_limit_of_1024() {
    if !common::require_mount_capability() {
        return;
    }
    let own_limit = raise_own_nofile();
    assert!(
        own_limit > HELD as u64 + ROOTS as u64 + 200,
        "this test holds {HELD} files open: its hard limit ({own_limit}) is too low"
    );
    let tm = TempMountpoint::new("pt-fds-held");
    let src = tm.root().join("src");
    let own = src.join("own");
    let mine = src.join("root");
    fs::create_dir_all(&own).unwrap();
    fs::create_dir_all(&mine).unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&mine, fs::Permissions::from_mode(0o700)).unwrap();
    let give = |p: &Path| std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    give(&own);
    for i in 0..HELD {
        let p = own.join(format!("f{i}"));
        fs::write(&p, own_bytes(i)).unwrap();
        give(&p);
    }
    let lock = own.join("lock");
    fs::write(&lock, b"locked\n").unwrap();
    give(&lock);
    fs::set_permissions(&lock, fs::Permissions::from_mode(0o666)).unwrap();
    for i in 0..ROOTS {
        fs::write(mine.join(format!("r{i}")), format!("root's file {i}\n")).unwrap();
    }
    for i in 0..DIRS {
        let p = own.join(format!("d{i}"));
        fs::create_dir(&p).unwrap();
        give(&p);
    }

    // flock: the daemon holds the locks (on its open file descriptions).
    // posix_lock: each lock owner's descriptor is charged like a pin.
    let d = Daemon::start_with_limit(&tm, &src, "allow_other,flock,posix_lock", LOW_NOFILE);
    let mnt = d.mnt.clone();
    d.doing("uid 65534 opening and holding its files");
    let (held, locked, mut opened) = {
        let mnt = mnt.clone();
        as_nobody(move || {
            let mut h = Held::default();
            let locked = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(mnt.join("own/lock"))
                .expect("uid 65534 opens own/lock");
            flock(&locked, libc::LOCK_EX | libc::LOCK_NB).expect("uid 65534 locks own/lock");
            let mut files = Vec::new();
            for i in 0..HELD {
                let p = mnt.join(format!("own/f{i}"));
                let mut o = fs::OpenOptions::new();
                if i < APPENDED {
                    o.append(true);
                } else if i < APPENDED + TRUNCATED {
                    o.read(true).write(true).truncate(true);
                } else {
                    o.read(true);
                }
                match o.open(&p) {
                    Ok(f) => {
                        h.ok += 1;
                        files.push((i, f));
                    }
                    Err(e) => h.fail(format!("open {}", p.display()), &e),
                }
            }
            // The truncated ones get new bytes through their handle.
            for (i, f) in &mut files {
                if (APPENDED..APPENDED + TRUNCATED).contains(i) {
                    f.write_all(format!("new {i}\n").as_bytes()).unwrap();
                }
            }
            (h, locked, files)
        })
    };
    assert_eq!(
        (held.ok, held.emfile, &held.other),
        (HELD, 0, &Vec::<String>::new()),
        "uid 65534 opening {HELD} files under a daemon limit of {LOW_NOFILE} descriptors: {held:?}"
    );

    // Open directories keep their descriptors: uid 65534 gets EMFILE past
    // its share of them, and only uid 65534.
    d.doing("uid 65534 opening directories past its share");
    let (dirs, dirs_held) = {
        let mnt = mnt.clone();
        as_nobody(move || {
            let mut h = Held::default();
            let mut dirs = Vec::new();
            for i in 0..DIRS {
                match fs::File::open(mnt.join(format!("own/d{i}"))) {
                    Ok(f) => {
                        h.ok += 1;
                        dirs.push(f);
                    }
                    Err(e) => h.fail(format!("opendir d{i}"), &e),
                }
            }
            (h, dirs)
        })
    };
    assert!(
        dirs.ok > 0 && dirs.emfile > 0 && dirs.ok + dirs.emfile == DIRS && dirs.other.is_empty(),
        "uid 65534 opening {DIRS} directories: some within its share, EMFILE past it: {dirs:?}"
    );

    // Its share is full: its next POSIX lock (a lock owner's descriptor)
    // fails, root's does not.
    d.doing("POSIX locks of uid 65534 past its share, and of root");
    let e = as_nobody({
        let mnt = mnt.clone();
        move || {
            let f = fs::File::open(mnt.join("own/f1000")).unwrap();
            posix_rdlock(&f).expect_err("uid 65534 locked past its share")
        }
    });
    assert_eq!(e.raw_os_error(), Some(libc::ENOLCK), "{e}");
    let f = fs::File::open(d.p("root/r0")).unwrap();
    posix_rdlock(&f).expect("root's POSIX lock while uid 65534 holds its share");
    drop(f);

    // Files removed through the mount while held (and closed while idle)
    // still read.
    d.doing("uid 65534 removing some of its held files");
    {
        let mnt = mnt.clone();
        as_nobody(move || {
            for i in REMOVED {
                fs::remove_file(mnt.join(format!("own/f{i}"))).expect("uid 65534 removes its file");
            }
        });
    }

    // Root lists its directory (ls -l) and opens and reads every file of it.
    d.doing("root's ls -l and reads while uid 65534 holds its files");
    let w = walk(&d, &d.p("root"));
    assert_eq!((w.ok, w.emfile), (ROOTS, 0), "root's ls -l: {w:?}");
    assert!(w.other.is_empty(), "root's ls -l: {w:?}");
    for i in 0..ROOTS {
        let p = d.p(&format!("root/r{i}"));
        assert_eq!(
            read(&p),
            format!("root's file {i}\n"),
            "root reads {}",
            p.display()
        );
    }
    assert!(
        w.max_fds <= LOW_NOFILE as usize,
        "the daemon held {} descriptors",
        w.max_fds
    );

    // Every file of uid 65534 still reads (or takes) its own bytes.
    d.doing("uid 65534 reading and appending to its held files");
    let (after, opened) = as_nobody(move || {
        let mut h = Held::default();
        for (i, f) in &mut opened {
            let i = *i;
            let (r, want) = if i < APPENDED {
                let r = f.write_all(b"appended\n").map(|()| Vec::new());
                (r, Vec::new())
            } else if i < APPENDED + TRUNCATED {
                (pread_all(f), format!("new {i}\n").into_bytes())
            } else {
                (pread_all(f), own_bytes(i))
            };
            match r {
                Ok(got) if got == want => h.ok += 1,
                Ok(got) => {
                    if h.other.len() < 10 {
                        h.other
                            .push(format!("f{i} read {:?}", String::from_utf8_lossy(&got)));
                    }
                }
                Err(e) => h.fail(format!("f{i}"), &e),
            }
        }
        (h, opened)
    });
    assert_eq!(
        (after.ok, after.emfile, &after.other),
        (HELD, 0, &Vec::<String>::new()),
        "uid 65534's held files read after root's work: {after:?}"
    );
    drop((opened, dirs_held));
    for i in 0..APPENDED {
        let mut want = own_bytes(i);
        want.extend_from_slice(b"appended\n");
        assert_eq!(
            fs::read(own.join(format!("f{i}"))).unwrap(),
            want,
            "appended file f{i}"
        );
    }

    // The lock held across all that: root's attempt still conflicts.
    d.doing("root's flock of the file uid 65534 locked");
    let other = fs::File::open(d.p("own/lock")).unwrap();
    let e = flock(&other, libc::LOCK_EX | libc::LOCK_NB).expect_err("root took uid 65534's lock");
    assert_eq!(e.raw_os_error(), Some(libc::EWOULDBLOCK), "{e}");
    // Its release (which the kernel sends after close returns) frees it.
    d.doing("the lock of uid 65534 to go with its release");
    drop(locked);
    loop {
        match flock(&other, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => break,
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("root's flock once uid 65534 closed: {e}"),
        }
    }
    drop(other);
    d.stop();
}
