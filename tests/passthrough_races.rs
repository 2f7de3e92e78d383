//! Names that change in the source directory behind `passthrough_ll`'s
//! back, on real mounts: the kernel holds a negative entry for a name
//! (`-o negative_timeout=`), something else appears under that name in the
//! source, and a caller opens the name with `O_CREAT` through the mount, so
//! the kernel sends CREATE for a name that now exists. The daemon must
//! never open what it finds unless it is a regular file:
//!
//! - a FIFO: the caller gets the FIFO, opened by the kernel (a blocking
//!   writer waits for a reader in the kernel, not in a daemon worker, and
//!   the daemon keeps answering meanwhile);
//! - a character device (1:3, as `/dev/null`): opened by the kernel, on a
//!   mount with `dev`;
//! - a symbolic link: followed by the kernel, as on any filesystem;
//! - a regular file: opened (not created) by the daemon, as the caller (a
//!   caller the file's mode refuses gets `EACCES`).
//!
//! Without a negative entry the same happens when the name appears
//! between the kernel's LOOKUP and its CREATE: a race, run many times
//! against `passthrough_ll` and `pathfs` (the path layer's mirror), in
//! which no open may fail with `EIO` (the kernel refusing a CREATE answered
//! with a FIFO's attributes) or `ELOOP`.
//!
//! In none of these cases does the daemon hold a descriptor of the node
//! other than an `O_PATH` one. The daemon runs with one worker
//! (`threads=1,max_threads=1`), so a worker stuck in an open stops it.
//! Every step has a deadline; on timeout the test releases the FIFO, aborts
//! its FUSE connection, kills its daemon and fails saying what it waited for.
//!
//! pathfs, run as root, also acts by name after the kernel's checks: the
//! `*_swapped_pathfs` cases have a caller (nobody) create nodes and change
//! a file through the mount while the names are swapped in the source for
//! symbolic or hard links to a root-owned canary outside the source (or a
//! directory for a link to outside), and check the canary is untouched.
//!
//! Needs root and `/dev/fuse` (skips loudly without, fails under `CI=true`).

mod common;
mod posix_support;

use posix_support::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long one step may take before the test gives up on it.
const STEP: Duration = Duration::from_secs(10);

const OPTS: &str = "negative_timeout=60,threads=1,max_threads=1,dev";

/// Frees whatever a stuck step waits for: opens each of `fifos` for
/// reading and writing (on threads of their own, which keep them open for
/// a while), which releases every opener waiting on that FIFO (a FIFO
/// reached through the mount is the kernel's own, apart from the source's
/// one), then aborts the mount's FUSE connection and kills the daemon.
fn release(d: &mut Daemon, fifos: &[&Path]) {
    let (tx, rx) = mpsc::channel();
    for f in fifos {
        let (f, tx) = (f.to_path_buf(), tx.clone());
        std::thread::spawn(move || {
            let held = open(&f, libc::O_RDWR | libc::O_NONBLOCK, 0);
            let _ = tx.send(());
            std::thread::sleep(STEP);
            drop(held);
        });
    }
    for _ in fifos {
        let _ = rx.recv_timeout(Duration::from_secs(2));
    }
    if let Err(e) = common::abort_fuse_connection(&d.mnt) {
        eprintln!("aborting the FUSE connection of {}: {e}", d.mnt.display());
    }
    d.kill();
}

/// Runs `f` on a thread and waits at most [`STEP`] for it; on timeout
/// releases everything (see [`release`]) and panics with `what`.
fn bounded<T: Send + 'static>(
    d: &mut Daemon,
    fifos: &[&Path],
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    bounded_for(STEP, d, fifos, what, f)
}

/// [`bounded`] with a deadline of `limit`.
fn bounded_for<T: Send + 'static>(
    limit: Duration,
    d: &mut Daemon,
    fifos: &[&Path],
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
        let wchans = daemon_wchans(d);
        release(d, fifos);
        let _ = rx.recv_timeout(STEP);
        panic!(
            "{what}: no answer within {limit:?}; the daemon's threads were waiting in {wchans:?}; \
             output:\n{}",
            d.output_tail()
        );
    }
    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// Where each thread of the daemon sleeps in the kernel (`/proc/PID/task/*/wchan`).
fn daemon_wchans(d: &Daemon) -> Vec<String> {
    let Some(pid) = d.pid() else {
        return Vec::new();
    };
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| fs::read_to_string(e.path().join("wchan")).ok())
        .collect()
}

/// The descriptors the daemon holds on `path` that are not `O_PATH` ones
/// (`/proc/PID/fd` targets and `fdinfo` flags), as `fd flags` strings.
/// `open(mnt, O_CREAT | flags, 0644)` through the mount, then `then` on the
/// descriptor, under the step deadline (releasing `fifos` and aborting the
/// connection on expiry); panics naming the open when it fails.
fn create_through<T: Send + 'static>(
    d: &mut Daemon,
    fifos: &[&Path],
    mnt: &Path,
    flags: (i32, &str),
    then: impl FnOnce(&Fd) -> Result<T, i32> + Send + 'static,
) -> T {
    let (bits, name) = flags;
    let m = mnt.to_path_buf();
    let what = format!("open(O_CREAT | {name}) of {}", mnt.display());
    bounded(d, fifos, &what, move || {
        let fd = open(&m, libc::O_CREAT | bits, 0o644)?;
        then(&fd)
    })
    .unwrap_or_else(|e| panic!("{what}: {}", errno_name(e)))
}

/// Stops the daemon; it must exit cleanly.
fn finish_cleanly(d: Daemon) {
    let exit = d.finish();
    assert!(exit.status.is_some_and(|s| s.success()), "daemon exit: {exit:?}");
}

/// The daemon must hold no descriptor of `src` but `O_PATH` ones.
fn assert_daemon_did_not_open(d: &Daemon, src: &Path, what: &str) {
    let opens = daemon_opens_of(d, src);
    assert!(
        opens.is_empty(),
        "{}: the daemon opened {what} itself: {opens:?}",
        d.label()
    );
}

fn daemon_opens_of(d: &Daemon, path: &Path) -> Vec<String> {
    let Some(pid) = d.pid() else {
        return Vec::new();
    };
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| fs::read_link(e.path()).is_ok_and(|t| t == path))
        .filter_map(|e| {
            let fd = e.file_name().to_string_lossy().into_owned();
            let info = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
            let flags = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())?;
            (flags & libc::O_PATH as u32 == 0).then(|| format!("fd {fd} flags {flags:o}"))
        })
        .collect()
}

/// A running daemon with the kernel holding a negative entry for `name`,
/// which then appears in the source made by `make(source path)`.
fn mount_with_negative_entry(name: &str, make: impl FnOnce(&Path)) -> Option<(Daemon, PathBuf, PathBuf)> {
    if !common::require_mount_capability() {
        return None;
    }
    let mut d = Daemon::start(Fs::Passthrough(OPTS));
    let src = d.source.clone().expect("passthrough has a source").join(name);
    let mnt = d.mnt.join(name);
    let m = mnt.clone();
    let missing = bounded(&mut d, &[], "the first lookup", move || stat(&m, false));
    assert_eq!(
        missing.err(),
        Some(libc::ENOENT),
        "{} exists before the test made it",
        mnt.display()
    );
    make(&src);
    Some((d, src, mnt))
}

fn mkfifo(p: &Path) {
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let r = unsafe { libc::mkfifo(cpath(p).as_ptr(), 0o666) };
    assert_eq!(r, 0, "mkfifo {}: {}", p.display(), errno_name(errno()));
}

fn kind(st: &libc::stat) -> u32 {
    st.st_mode & libc::S_IFMT
}

/// `open(O_CREAT | O_RDWR)` of a name that is a FIFO in the source (an
/// `O_RDWR` open of a FIFO never waits): the kernel opens the FIFO. An
/// unfixed daemon opened it itself and answered with its attributes, which
/// the kernel refuses for a CREATE (`EIO`).
#[test]
fn create_over_fifo_opens_the_fifo() {
    let Some((mut d, src, mnt)) = mount_with_negative_entry("fifo", mkfifo) else {
        return;
    };
    let st = create_through(&mut d, &[&src, &mnt], &mnt, (libc::O_RDWR, "O_RDWR"), fstat);
    assert_eq!(kind(&st), libc::S_IFIFO, "opened something else than the FIFO");
    assert_daemon_did_not_open(&d, &src, "the FIFO");
    finish_cleanly(d);
}

/// A blocking `open(O_CREAT | O_WRONLY)` of a name that is a FIFO in the
/// source waits for a reader in the kernel's FIFO open, while the daemon
/// (one worker) keeps answering; a reader then completes it. An unfixed
/// daemon's only worker waited in the FIFO open itself, so the STATFS
/// below found no one to answer it.
#[test]
fn create_over_fifo_leaves_the_daemon_responsive() {
    let Some((mut d, src, mnt)) = mount_with_negative_entry("fifo", mkfifo) else {
        return;
    };
    let (tid_tx, tid_rx) = mpsc::channel();
    let m = mnt.clone();
    let writer = std::thread::spawn(move || {
        // SAFETY: gettid(2) has no preconditions.
        let _ = tid_tx.send(unsafe { libc::gettid() });
        let fd = open(&m, libc::O_CREAT | libc::O_WRONLY, 0o644)?;
        fstat(&fd)
    });
    let tid = tid_rx.recv_timeout(STEP).expect("the writer thread starts");
    // Until someone waits for a partner on the FIFO: the writer in the
    // kernel (fixed), or the daemon's worker (unfixed). Without wchan
    // support the deadline passes and the STATFS below still tells.
    let wchan = format!("/proc/self/task/{tid}/wchan");
    let deadline = Instant::now() + STEP;
    while Instant::now() < deadline {
        let writer_waits = fs::read_to_string(&wchan).is_ok_and(|w| w.contains("wait_for_partner"));
        if writer_waits || daemon_wchans(&d).iter().any(|w| w.contains("wait_for_partner")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let m = d.mnt.clone();
    bounded(
        &mut d,
        &[&src, &mnt],
        "STATFS while a caller waits on the FIFO (the daemon is stuck opening it?)",
        move || common::statfs_round_trip(&m),
    );
    // The reader that lets the writer's open complete: through the mount,
    // the FIFO the writer waits on (the kernel's, not the source's).
    let m = mnt.clone();
    let reader = bounded(
        &mut d,
        &[&src, &mnt],
        "open(O_RDONLY | O_NONBLOCK) of the FIFO",
        move || open(&m, libc::O_RDONLY | libc::O_NONBLOCK, 0),
    )
    .unwrap_or_else(|e| panic!("open {} for reading: {}", mnt.display(), errno_name(e)));
    let (done_tx, done_rx) = mpsc::channel();
    let joiner = std::thread::spawn(move || {
        let r = writer.join();
        let _ = done_tx.send(());
        r
    });
    if done_rx.recv_timeout(STEP).is_err() {
        release(&mut d, &[&src, &mnt]);
        let _ = done_rx.recv_timeout(STEP);
        panic!("the writer's open did not complete within {STEP:?} of a reader opening the FIFO");
    }
    let r = joiner.join().expect("joiner").expect("writer thread");
    let st = r.unwrap_or_else(|e| panic!("open(O_CREAT | O_WRONLY) of {}: {}", mnt.display(), errno_name(e)));
    assert_eq!(kind(&st), libc::S_IFIFO, "opened something else than the FIFO");
    drop(reader);
    assert_daemon_did_not_open(&d, &src, "the FIFO");
    finish_cleanly(d);
}

/// A character device node (1:3, as `/dev/null`) under the name: opened by
/// the kernel (the mount has `dev`), never by the daemon.
#[test]
fn create_over_device_node_opens_the_device() {
    let Some((mut d, src, mnt)) = mount_with_negative_entry("null", |p| {
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        let r = unsafe { libc::mknod(cpath(p).as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
        assert_eq!(r, 0, "mknod {}: {}", p.display(), errno_name(errno()));
    }) else {
        return;
    };
    let (st, n) = create_through(&mut d, &[], &mnt, (libc::O_WRONLY, "O_WRONLY"), |fd| {
        Ok((fstat(fd)?, write(fd, b"x")?))
    });
    assert_eq!(kind(&st), libc::S_IFCHR, "opened something else than the device");
    assert_eq!(st.st_rdev, libc::makedev(1, 3));
    assert_eq!(n, 1, "a write to the null device");
    assert_daemon_did_not_open(&d, &src, "the device");
    finish_cleanly(d);
}

/// A symbolic link to a regular file under the name: followed, as
/// `open(O_CREAT)` without `O_NOFOLLOW` does on any filesystem (an unfixed
/// daemon answered `ELOOP`).
#[test]
fn create_over_symlink_follows_it() {
    let Some((mut d, src, mnt)) = mount_with_negative_entry("link", |p| {
        fs::write(p.with_file_name("target"), b"").expect("write the link's target");
        std::os::unix::fs::symlink("target", p).expect("symlink");
    }) else {
        return;
    };
    create_through(&mut d, &[], &mnt, (libc::O_WRONLY, "O_WRONLY"), |fd| {
        write(fd, b"through the link")
    });
    let target = src.with_file_name("target");
    assert_eq!(fs::read(&target).expect("read the target"), b"through the link");
    finish_cleanly(d);
}

/// A regular file under the name: opened, not created (its content stays
/// until the caller writes), reached through the one inode the daemon
/// checked.
#[test]
fn create_over_regular_file_opens_it() {
    let Some((mut d, src, mnt)) = mount_with_negative_entry("file", |p| {
        fs::write(p, b"already here").expect("write the file");
    }) else {
        return;
    };
    let (st, data) = create_through(&mut d, &[], &mnt, (libc::O_RDWR, "O_RDWR"), |fd| {
        Ok((fstat(fd)?, pread(fd, 64, 0)?))
    });
    assert_eq!(kind(&st), libc::S_IFREG);
    assert_eq!(data, b"already here");
    let m = mnt.clone();
    let excl = bounded(
        &mut d,
        &[],
        "open(O_CREAT | O_EXCL) of an existing file",
        move || open(&m, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644).map(drop),
    );
    assert_eq!(excl.err(), Some(libc::EEXIST));
    assert_eq!(fs::read(&src).expect("read the file"), b"already here");

    // A file of root's, mode 0600, appears under a name the kernel holds
    // negative; another user's open(O_CREAT) of it is refused by the mode.
    let secret_mnt = d.mnt.join("secret");
    let secret_src = src.with_file_name("secret");
    let m = secret_mnt.clone();
    let missing = bounded(&mut d, &[], "the lookup of a missing name", move || {
        stat(&m, false)
    });
    assert_eq!(missing.err(), Some(libc::ENOENT));
    fs::write(&secret_src, b"root's").expect("write the secret file");
    set_mode(&secret_src, 0o600);
    let m = secret_mnt.clone();
    let other = bounded(
        &mut d,
        &[],
        "another user's open(O_CREAT) of root's file",
        move || {
            as_user(NOBODY, NOGROUP, &[], || {
                open(&m, libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC, 0o666).map(drop)
            })
        },
    );
    assert_eq!(other.err(), Some(libc::EACCES), "nobody opened root's 0600 file");
    assert_eq!(fs::read(&secret_src).expect("read the secret file"), b"root's");
    finish_cleanly(d);
}

/// How many opens [`race_fifo_with_create`] makes.
const RACE_OPENS: usize = 20_000;

/// Opens through the mount (`O_CREAT | O_RDWR | O_NONBLOCK`) a name that a
/// thread of the test keeps making and removing as a FIFO in the source,
/// and removes through the mount whatever the open found (so that the next
/// open asks LOOKUP and CREATE again), [`RACE_OPENS`] times. Each open
/// gives the FIFO, a new regular file, `ENOENT` or `ESTALE` (the kernel's
/// second walk lost the race too); an unfixed daemon gave `EIO` thousands
/// of times.
fn race_fifo_with_create(fs: Fs) {
    if !common::require_mount_capability() {
        return;
    }
    let mut d = Daemon::start(fs);
    let src = d.source.clone().expect("a mirror has a source").join("x");
    let mnt = d.mnt.join("x");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s, flag) = (src.clone(), stop.clone());
    let racer = std::thread::spawn(move || {
        let c = cpath(&s);
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: `c` is a NUL-terminated path that outlives the calls.
            unsafe {
                libc::mkfifo(c.as_ptr(), 0o666);
                libc::unlink(c.as_ptr());
            }
        }
    });
    let m = mnt.clone();
    let counts = bounded_for(
        Duration::from_secs(120),
        &mut d,
        &[&src, &mnt],
        "opens raced with a FIFO appearing in the source",
        move || {
            let mut counts = std::collections::BTreeMap::<String, usize>::new();
            for _ in 0..RACE_OPENS {
                let outcome = match open(&m, libc::O_CREAT | libc::O_RDWR | libc::O_NONBLOCK, 0o644) {
                    Ok(fd) => match fstat(&fd).map(|st| kind(&st)) {
                        Ok(libc::S_IFIFO) => "fifo".to_string(),
                        Ok(libc::S_IFREG) => "regular".to_string(),
                        Ok(k) => format!("mode {k:o}"),
                        Err(e) => format!("fstat {}", errno_name(e)),
                    },
                    Err(e) => errno_name(e),
                };
                // SAFETY: `c` is a NUL-terminated path that outlives the call.
                unsafe { libc::unlink(cpath(&m).as_ptr()) };
                *counts.entry(outcome).or_default() += 1;
            }
            counts
        },
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    racer.join().expect("racer thread");
    let bad: Vec<_> = counts
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "fifo" | "regular" | "ENOENT" | "ESTALE"))
        .collect();
    assert!(
        bad.is_empty(),
        "{}: unexpected outcomes {bad:?} (all: {counts:?})",
        d.label()
    );
    assert_daemon_did_not_open(&d, &src, "the FIFO");
    eprintln!("{}: {counts:?}", d.label());
    finish_cleanly(d);
}

#[test]
fn race_fifo_with_create_passthrough() {
    race_fifo_with_create(Fs::Passthrough(""));
}

#[test]
fn race_fifo_with_create_pathfs() {
    race_fifo_with_create(Fs::Pathfs(""));
}

/// How many times a caller repeats each operation against a racer that
/// swaps the name in the source.
const SWAP_ROUNDS: usize = 3_000;

const NOBODY: u32 = 65534;

/// What [`race_as_nobody`] counts when a LINK gave the canary a new name.
const LINKED_CANARY: &str = "link made a canary link";
const NOGROUP: u32 = 65534;

/// Makes the current *thread* (raw system calls: the C library's would
/// change every thread) act as nobody:nogroup without supplementary groups.
fn thread_becomes_nobody() {
    // SAFETY: raw credential system calls on this thread only, no memory
    // passed but a null list of zero groups.
    let ok = unsafe {
        libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) == 0
            && libc::syscall(libc::SYS_setresgid, NOGROUP, NOGROUP, NOGROUP) == 0
            && libc::syscall(libc::SYS_setresuid, NOBODY, NOBODY, NOBODY) == 0
    };
    assert!(ok, "becoming nobody: {}", errno_name(errno()));
}

/// A root-owned file (mode 0600) outside the source, which no request
/// through the mount may change, and what it was.
struct Canary {
    path: PathBuf,
    was: String,
    content: Vec<u8>,
}

impl Canary {
    fn new(dir: &Path) -> Canary {
        let path = dir.join("canary");
        let content = b"root's own canary\n".repeat(64);
        fs::write(&path, &content).expect("write canary");
        set_owner(&path, 0, 0);
        set_mode(&path, 0o600);
        let was = Self::shape(&path);
        Canary { path, was, content }
    }

    fn shape(p: &Path) -> String {
        let st = stat(p, false).expect("stat canary");
        format!(
            "mode {:o} uid {} gid {} size {}",
            st.st_mode, st.st_uid, st.st_gid, st.st_size
        )
    }

    /// What changed, if anything.
    fn changes(&self) -> Vec<String> {
        let mut out = Vec::new();
        let now = Self::shape(&self.path);
        if now != self.was {
            out.push(format!("canary was {}, now {now}", self.was));
        }
        if content(&self.path).ok().as_deref() != Some(&self.content[..]) {
            out.push("canary's content changed".into());
        }
        out
    }
}

/// Replaces `name` in the source, over and over until `stop`: by a symbolic
/// link to the canary, by a hard link to it, by a regular file of nobody's
/// (when `regular`), or by nothing.
fn swapper(
    src: PathBuf,
    name: &'static str,
    canary: PathBuf,
    regular: bool,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let target = src.join(name);
        let (s, h, f) = (
            src.join(format!(".{name}-s")),
            src.join(format!(".{name}-h")),
            src.join(format!(".{name}-f")),
        );
        let (ct, cs, ch, cf, cc) = (cpath(&target), cpath(&s), cpath(&h), cpath(&f), cpath(&canary));
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: NUL-terminated paths that outlive the calls.
            unsafe {
                libc::rmdir(ct.as_ptr());
                libc::symlink(cc.as_ptr(), cs.as_ptr());
                libc::rename(cs.as_ptr(), ct.as_ptr());
                libc::rmdir(ct.as_ptr());
                libc::link(cc.as_ptr(), ch.as_ptr());
                libc::rename(ch.as_ptr(), ct.as_ptr());
                if regular {
                    let fd = libc::open(
                        cf.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o666,
                    );
                    if fd >= 0 {
                        libc::write(fd, b"nobody's\n".as_ptr().cast(), 9);
                        libc::fchown(fd, NOBODY, NOGROUP);
                        libc::fchmod(fd, 0o666);
                        libc::close(fd);
                    }
                    libc::rename(cf.as_ptr(), ct.as_ptr());
                    std::thread::yield_now();
                } else {
                    libc::unlink(ct.as_ptr());
                }
            }
        }
    })
}

/// Which names a [`race_as_nobody`] run swaps and what its caller does.
#[derive(Clone, Copy, Debug)]
enum Swap {
    /// `mknod n` (regular, mode 06755) and `mkdir d` (mode 03777), each
    /// removed again; `n` and `d` become symbolic and hard links to the
    /// canary.
    Created,
    /// `lchown`, `truncate`, `chmod 06777`, `utimensat(now)` and `link` of
    /// `f`, a file of nobody's (mode 0666) that becomes a symbolic or hard
    /// link to the canary.
    Setattr,
    /// `mknod x` through a descriptor of the directory `a`, which the
    /// caller itself (no race: `a` is its own) has just replaced in the
    /// source by a symbolic link to the directory outside the source that
    /// holds the canary; the kernel still knows `a` as a directory.
    Parent,
}

/// A caller (nobody) works through the mount, [`SWAP_ROUNDS`] times, while
/// a racer swaps the names it uses in the source (world-writable, as a
/// shared directory would be), as `swap` says, for links to a root-owned
/// canary outside the source, or a directory for a link to outside. The
/// daemon runs as root: the canary and the outside directory must be
/// unchanged afterwards (mode, owner, size, content; no new entry). Outcomes
/// of the caller's calls are counted and printed, not checked: any errno
/// is fine, the canary is what matters.
fn race_as_nobody(fs: Fs, swap: Swap) {
    if !common::require_mount_capability() {
        return;
    }
    let mut d = Daemon::start(fs);
    let src = d.source.clone().expect("a mirror has a source");
    set_mode(&src, 0o777);
    let outside = d.outside.clone();
    let canary = Canary::new(&outside);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racers = match swap {
        Swap::Created => vec![
            swapper(src.clone(), "n", canary.path.clone(), false, stop.clone()),
            swapper(src.clone(), "d", canary.path.clone(), false, stop.clone()),
        ],
        Swap::Setattr => vec![swapper(src.clone(), "f", canary.path.clone(), true, stop.clone())],
        Swap::Parent => Vec::new(),
    };
    let (mnt, s, o) = (d.mnt.clone(), src.clone(), outside.clone());
    let canary_ino = stat(&canary.path, false).expect("stat canary").st_ino;
    let counts = bounded_for(
        Duration::from_secs(180),
        &mut d,
        &[],
        &format!("a caller's requests raced with names swapped in the source ({swap:?})"),
        move || {
            thread_becomes_nobody();
            let mut counts = std::collections::BTreeMap::<String, usize>::new();
            let mut count = |what: &str, r: libc::c_int| {
                let k = if r == 0 { "ok".into() } else { errno_name(errno()) };
                *counts.entry(format!("{what} {k}")).or_default() += 1;
            };
            let c = |name: &str| cpath(&mnt.join(name));
            let (n, dd, f, f2, a) = (c("n"), c("d"), c("f"), c("f2"), c("a"));
            let (src_a, away, outside) = (cpath(&s.join("a")), cpath(&s.join(".a-away")), cpath(&o));
            let src_f2 = cpath(&s.join("f2"));
            // No race in `Parent`: a few rounds show it.
            let rounds = if matches!(swap, Swap::Parent) {
                100
            } else {
                SWAP_ROUNDS
            };
            for _ in 0..rounds {
                // SAFETY: NUL-terminated paths that outlive the calls; a
                // null times pointer means now.
                unsafe {
                    match swap {
                        Swap::Created => {
                            count("mknod", libc::mknod(n.as_ptr(), libc::S_IFREG | 0o6755, 0));
                            libc::unlink(n.as_ptr());
                            count("mkdir", libc::mkdir(dd.as_ptr(), 0o3777));
                            libc::rmdir(dd.as_ptr());
                        }
                        Swap::Setattr => {
                            count("lchown", libc::lchown(f.as_ptr(), NOBODY, NOGROUP));
                            count("truncate", libc::truncate(f.as_ptr(), 0));
                            count("chmod", libc::chmod(f.as_ptr(), 0o6777));
                            count(
                                "utimes",
                                libc::utimensat(libc::AT_FDCWD, f.as_ptr(), std::ptr::null(), 0),
                            );
                            count("link", libc::link(f.as_ptr(), f2.as_ptr()));
                            // A new name for the canary is a link root made
                            // to a file the caller could not link.
                            let mut st: libc::stat = std::mem::zeroed();
                            if libc::lstat(src_f2.as_ptr(), &mut st) == 0 && st.st_ino == canary_ino {
                                count(LINKED_CANARY, 0);
                            }
                            libc::unlink(f2.as_ptr());
                        }
                        Swap::Parent => {
                            libc::mkdir(src_a.as_ptr(), 0o777);
                            let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
                            let dir = libc::open(a.as_ptr(), flags);
                            if dir < 0 {
                                count("open a", dir);
                                continue;
                            }
                            // Fresh attributes: the kernel asks nothing
                            // about `a` for a while (the path layer's ttl).
                            let mut st: libc::stat = std::mem::zeroed();
                            libc::fstat(dir, &mut st);
                            libc::rename(src_a.as_ptr(), away.as_ptr());
                            libc::symlink(outside.as_ptr(), src_a.as_ptr());
                            count(
                                "mknod a/x",
                                libc::mknodat(dir, c"x".as_ptr(), libc::S_IFREG | 0o644, 0),
                            );
                            libc::unlink(src_a.as_ptr());
                            libc::rename(away.as_ptr(), src_a.as_ptr());
                            libc::close(dir);
                        }
                    }
                }
            }
            counts
        },
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in racers {
        r.join().expect("racer thread");
    }
    eprintln!("{} {swap:?}: {counts:?}", d.label());
    let mut bad = canary.changes();
    let strays: Vec<_> = fs::read_dir(&outside)
        .expect("read outside")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|n| n != "canary")
        .collect();
    if !strays.is_empty() {
        bad.push(format!("created outside the source: {strays:?}"));
    }
    if let Some(n) = counts.get(&format!("{LINKED_CANARY} ok")) {
        bad.push(format!("LINK made a name for the canary in the source {n} times"));
    }
    assert!(
        bad.is_empty(),
        "{} {swap:?}: {bad:?} (outcomes: {counts:?})",
        d.label()
    );
    finish_cleanly(d);
}

/// An unfixed pathfs gave the new node to its caller by name (`lchown`,
/// then a `chmod` that follows symbolic links): the canary became nobody's,
/// mode 06755.
#[test]
fn created_node_swapped_pathfs() {
    race_as_nobody(Fs::Pathfs(""), Swap::Created);
}

/// An unfixed pathfs truncated through a symbolic link, and chowned and
/// chmodded a hard link by name: the canary became nobody's, mode 06777,
/// empty; and it linked the canary's hard link as `f2`.
#[test]
fn setattr_by_name_swapped_pathfs() {
    race_as_nobody(Fs::Pathfs(""), Swap::Setattr);
}

/// An unfixed pathfs followed a directory swapped for a symbolic link in
/// the middle of a path: `x` was created outside the source.
#[test]
fn parent_swapped_for_symlink_pathfs() {
    race_as_nobody(Fs::Pathfs(""), Swap::Parent);
}
