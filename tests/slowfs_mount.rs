//! Real mounts of examples/slowfs served through the async trait
//! (`fuse_wire::asyncfs` on Tokio), on `/dev/fuse` or, with
//! `FUSE_WIRE_TEST_TRANSPORT=uring`, over io_uring:
//!
//! - SIGINT to a reader blocked in a 30 s READ: the kernel sends INTERRUPT,
//!   the daemon drops the READ's future and answers `EINTR`, and `read(2)`
//!   returns `EINTR` long before the READ would have ended; the daemon's
//!   `.stats` shows the operation cancelled and none running.
//! - 1,000 READs of 5 s each are all served at once, by a handful of daemon
//!   threads: the `/dev/fuse` pool is capped at four workers, and no
//!   thread is started per request.
//! - Thousands of slow READs of uid 65534 hold every handler slot and
//!   future in flight one uid may hold: root's lookup, open and read still
//!   complete before any of those READs ends, with both traits.

mod common;
#[allow(dead_code)]
#[path = "../examples/slowfs/tree.rs"]
mod tree;

use common::TempMountpoint;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The longest any step may take before the test fails.
const STEP: Duration = Duration::from_secs(30);

/// A slowfs daemon, stopped (and its mount freed) when dropped.
struct Slowfs {
    child: Option<Child>,
    mp: TempMountpoint,
}

impl Slowfs {
    fn start(tag: &str, opts: &str) -> Slowfs {
        Self::start_with(tag, opts, &[])
    }

    /// [`Slowfs::start`] with more arguments (`--stats FILE`).
    fn start_with(tag: &str, opts: &str, extra: &[&std::ffi::OsStr]) -> Slowfs {
        let mut opts = format!("api=async,{opts}");
        if common::over_uring() {
            // Room on each queue for every request of the tests at once.
            opts.push_str(",uring,queue_depth=1024");
        }
        let mp = TempMountpoint::new(tag);
        let mut child = Command::new(common::example_binary("slowfs"))
            .args(["-o", &opts])
            .args(extra)
            .arg(mp.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start slowfs");
        common::wait_for_mount(&mut child, mp.path(), "slowfs");
        if common::over_uring() {
            // The io_uring pass must really serve over the rings.
            let err = child.stderr.take().expect("stderr");
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                for l in BufReader::new(err).lines().map_while(Result::ok) {
                    let _ = tx.send(l);
                }
            });
            let deadline = Instant::now() + STEP;
            loop {
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(l) if l.contains("transport: io_uring") => break,
                    Ok(l) if l.contains("serving over /dev/fuse") => {
                        panic!("slowfs did not use io_uring: {l}")
                    }
                    _ if Instant::now() > deadline => {
                        panic!("slowfs never said which transport it serves on")
                    }
                    _ => {}
                }
            }
        }
        Slowfs {
            child: Some(child),
            mp,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.mp.path().join(rel)
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The counters of `.stats`, in one `read(2)`: the file is `DIRECT_IO`
    /// and made anew for each READ, so reads at later offsets could cut
    /// into a text whose numbers have since changed width.
    fn stats(&self) -> Vec<(String, u64)> {
        use std::io::Read;
        let mut buf = [0u8; 4096];
        let n = File::open(self.path(".stats"))
            .and_then(|mut f| f.read(&mut buf))
            .expect("read .stats");
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_string(), v.parse().expect("a number")))
            .collect()
    }

    fn stat(&self, key: &str) -> u64 {
        self.stats()
            .into_iter()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("no {key} in .stats"))
            .1
    }

    /// The names of the daemon's threads now.
    fn threads(&self) -> Vec<String> {
        let dir = format!("/proc/{}/task", self.pid());
        std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .filter_map(|t| {
                // A thread that ends meanwhile is not counted.
                std::fs::read_to_string(t.expect("a task").path().join("comm")).ok()
            })
            .map(|c| c.trim_end().to_string())
            .collect()
    }

    /// Waits (bounded) until `cond` holds of the daemon's counters.
    fn wait_for(&self, what: &str, cond: impl Fn(&Slowfs) -> bool) {
        let deadline = Instant::now() + STEP;
        while !cond(self) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {:?}",
                self.stats()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Slowfs {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let status = common::terminate_daemon(child, self.mp.path());
            if !std::thread::panicking() {
                assert!(
                    status.is_some_and(|s| s.success()),
                    "slowfs ended with {status:?}"
                );
            }
        }
    }
}

/// A SIGINT handler that does nothing: `read(2)` in the thread it is sent to
/// then returns `EINTR` (no `SA_RESTART`) instead of the process ending.
fn catch_sigint() {
    extern "C" fn nothing(_: libc::c_int) {}
    // SAFETY: an all-zero sigaction is a valid value to fill in.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = nothing as *const () as usize;
    sa.sa_flags = 0;
    // SAFETY: installs a handler that touches nothing, with a valid sigaction.
    let r = unsafe { libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut()) };
    assert_eq!(r, 0, "sigaction: {}", std::io::Error::last_os_error());
}

/// Runs `f` on a thread and waits at most `limit` for it; the mount is
/// aborted if it does not end (so that the thread is freed), and the test fails.
fn bounded<T: Send + 'static>(
    mnt: &Path,
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(_) => {
            let _ = common::abort_fuse_connection(mnt);
            panic!("{what} did not end within {limit:?}");
        }
    }
}

#[test]
fn sigint_to_a_reader_blocked_in_an_async_read_returns_eintr_and_drops_the_future() {
    if !common::require_mount_capability() {
        return;
    }
    // A READ far longer than the bound below, so that an answer sent when
    // the READ would have ended cannot pass for one sent on the INTERRUPT.
    let fs = Slowfs::start("slowfs-sigint", "latency_ms=0,read_latency_ms=30000");
    let file = File::open(fs.path("file-007")).expect("open file-007");
    catch_sigint();

    let (tid_tx, tid_rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        // SAFETY: pthread_self has no preconditions.
        tid_tx
            .send(unsafe { libc::pthread_self() })
            .expect("send the thread id");
        let mut buf = [0u8; 4096];
        let r = file.read_at(&mut buf, 0);
        (r.map_err(|e| e.raw_os_error()), Instant::now())
    });
    let tid = tid_rx.recv_timeout(STEP).expect("the reader's thread id");
    fs.wait_for("the READ to reach the daemon", |f| f.stat("running") == 1);

    let sent = Instant::now();
    // SAFETY: `tid` is the reader thread, which is alive until it has read.
    let r = unsafe { libc::pthread_kill(tid, libc::SIGINT) };
    assert_eq!(r, 0, "pthread_kill");
    let mnt = fs.mp.path().to_path_buf();
    let (result, returned) = bounded(&mnt, STEP, "the interrupted read", move || {
        reader.join().expect("the reader thread")
    });
    assert_eq!(result, Err(Some(libc::EINTR)), "read(2) after SIGINT");
    let took = returned - sent;
    assert!(
        took < Duration::from_secs(10),
        "read(2) returned EINTR only after {took:?}"
    );
    // Dropped before the answer went out.
    assert_eq!(
        fs.stat("running"),
        0,
        "the daemon still runs the READ: {:?}",
        fs.stats()
    );
    assert_eq!(fs.stat("cancelled"), 1, "{:?}", fs.stats());
}

#[test]
fn a_thousand_slow_reads_at_once_are_served_by_a_handful_of_threads() {
    if !common::require_mount_capability() {
        return;
    }
    const N: usize = 1000;
    const MAX_WORKERS: usize = 4;
    let stats_file = std::env::temp_dir().join(format!("slowfs-thousand-{}.json", std::process::id()));
    let fs = Slowfs::start_with(
        "slowfs-thousand",
        // Long enough that every reader is started before the first read
        // ends, even on a loaded machine.
        // The pool capped at `MAX_WORKERS`: were the wait to hold a worker,
        // no more than that many reads could run at once.
        &format!(
            "latency_ms=0,read_latency_ms=5000,files=1000,size=4096,threads=2,max_threads={MAX_WORKERS}"
        ),
        &["--stats".as_ref(), stats_file.as_os_str()],
    );
    let files: Vec<File> = (0..N)
        .map(|n| File::open(fs.path(&format!("file-{n:03}"))).expect("open"))
        .collect();
    let before = fs.stat("completed");
    let readers: Vec<_> = files
        .into_iter()
        .enumerate()
        .map(|(n, f)| {
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    let mut buf = vec![0u8; 4096];
                    let got = f.read_at(&mut buf, 0).map(|k| buf[..k].to_vec());
                    (n, got)
                })
                .expect("spawn a reader")
        })
        .collect();
    fs.wait_for("every READ to reach the daemon at once", |f| {
        f.stat("running") as usize == N
    });
    let threads = fs.threads();
    let mnt = fs.mp.path().to_path_buf();
    let results = bounded(&mnt, STEP, "the reads", move || {
        readers
            .into_iter()
            .map(|r| r.join().expect("a reader"))
            .collect::<Vec<_>>()
    });
    for (n, got) in results {
        let got = got.unwrap_or_else(|e| panic!("read of file-{n:03}: {e}"));
        assert!(
            got == tree::generated(n as u64, 0, 4096),
            "file-{n:03}: wrong content"
        );
    }
    assert_eq!(fs.stat("completed") - before, N as u64);
    assert!(fs.stat("peak") as usize >= N);
    // Nothing per request: the session's `/dev/fuse` workers (at most the
    // cap and the one reader beyond it), the io_uring queues' threads,
    // the runtime's two workers and a few of the process's own (main,
    // signals, the mount's watchdog).
    let workers = threads.iter().filter(|t| t.starts_with("fuse-worker")).count();
    assert!(
        workers <= MAX_WORKERS + 1,
        "{workers} /dev/fuse workers for a cap of {MAX_WORKERS}: {threads:?}"
    );
    // A queue's threads: a driver and a standby, and more only while
    // handlers run at once on it; an async handler returns as soon as it
    // has started its future, so a few, where a wait that held its thread
    // would take one per READ.
    let rings: Vec<&String> = threads.iter().filter(|t| t.starts_with("fuse-uring")).collect();
    let queues: std::collections::BTreeSet<&String> = rings.iter().copied().collect();
    // One queue per possible CPU.
    let possible = fuse_wire::session::transport::uring::possible_cpus().expect("possible CPUs");
    assert!(
        queues.len() <= possible,
        "{} io_uring queues for {possible} possible CPUs: {threads:?}",
        queues.len()
    );
    for q in &queues {
        let n = rings.iter().filter(|t| *t == q).count();
        assert!(n <= 16, "{n} threads on queue {q}: {threads:?}");
    }
    let others = threads.len() - workers - rings.len();
    assert!(
        others <= 8,
        "{others} threads besides the workers and the rings: {threads:?}"
    );
    eprintln!(
        "{N} READs at once served by {} daemon threads: {threads:?}",
        threads.len()
    );
    // The session's statistics saw the same N READs at once as `.stats`.
    drop(fs);
    let json = std::fs::read_to_string(&stats_file).expect("slowfs --stats");
    let _ = std::fs::remove_file(&stats_file);
    let read = &json[json.find("\"READ\": {").expect("READ in the statistics")..];
    let max: u64 = read["\"READ\": {".len()..]
        .split("\"max_inflight\": ")
        .nth(1)
        .and_then(|r| r.split('}').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("no READ max_inflight in {json}"));
    assert!(
        max as usize >= N,
        "READ max_inflight {max} for {N} READs at once: {json}"
    );
}

/// Runs `f` on a new thread whose credentials are `uid`'s (raw system
/// calls: they change this thread only, as FUSE sees its callers).
fn spawn_as<T: Send + 'static>(
    uid: u32,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || {
            // SAFETY: raw credential system calls, for this thread only.
            unsafe {
                assert_eq!(
                    libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
                    0
                );
                assert_eq!(libc::syscall(libc::SYS_setresgid, uid, uid, uid), 0);
                assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
            }
            f()
        })
        .expect("spawn a thread")
}

const NOBODY: u32 = 65534;

/// slowfs through `api` with `files` files of 4 KiB that other users may
/// use (`allow_other`), and the first eight of them open for reading.
fn slowfs_for_other_users(
    tag: &str,
    api: &str,
    files: usize,
    opts: &str,
) -> (Slowfs, Vec<std::sync::Arc<File>>) {
    let fs = Slowfs::start(
        tag,
        &format!("api={api},latency_ms=0,files={files},size=4096,threads=2,allow_other,{opts}"),
    );
    let open = (0..8)
        .map(|n| std::sync::Arc::new(File::open(fs.path(&format!("file-{n:03}"))).expect("open")))
        .collect();
    (fs, open)
}

/// More readers of one uid than the handlers, the futures in flight and
/// the 1024 requests the pool used to queue at its cap can hold: every one
/// waits its turn and gets its data, and root's requests meanwhile are
/// answered too; none is answered an error because of the load.
fn slow_readers_of_one_user_all_wait_their_turn(api: &str, opts: &str, readers: usize) {
    let (fs, files) = slowfs_for_other_users(&format!("slowfs-load-{api}"), api, 8, opts);
    let handles: Vec<_> = (0..readers)
        .map(|i| {
            let (n, file) = (i % files.len(), files[i % files.len()].clone());
            spawn_as(NOBODY, move || {
                let mut buf = vec![0u8; 4096];
                let got = file.read_at(&mut buf, 0).map(|k| buf[..k].to_vec());
                (n, got.map_err(|e| e.raw_os_error()))
            })
        })
        .collect();
    // Root's own requests while they wait: a lookup, an open and a read.
    fs.wait_for("the readers to fill the daemon", |f| f.stat("running") >= 32);
    let stat = std::fs::metadata(fs.path("file-005")).map(|m| m.len());
    assert_eq!(
        stat.map_err(|e| e.raw_os_error()),
        Ok(4096),
        "root's stat under load"
    );
    let mnt = fs.mp.path().to_path_buf();
    let results = bounded(&mnt, Duration::from_secs(110), "the readers", move || {
        handles
            .into_iter()
            .map(|h| h.join().expect("a reader"))
            .collect::<Vec<_>>()
    });
    let mut failed = std::collections::BTreeMap::new();
    for (n, got) in results {
        match got {
            Ok(data) => assert!(
                data == tree::generated(n as u64, 0, 4096),
                "file-{n:03}: wrong content"
            ),
            Err(e) => *failed.entry(e).or_insert(0) += 1,
        }
    }
    assert!(
        failed.is_empty(),
        "of {readers} readers, these failed (errno: count): {failed:?}"
    );
}

#[test]
fn async_readers_beyond_every_bound_wait_and_none_gets_eagain() {
    if !common::require_mount_capability() {
        return;
    }
    // 256 futures, 4 threads waiting at that bound and 1024 queued were
    // all the old pool held: 1,500 readers were more.
    slow_readers_of_one_user_all_wait_their_turn(
        "async",
        "read_latency_ms=2000,max_threads=4,max_in_flight=256",
        1500,
    );
}

#[test]
fn sync_readers_beyond_every_bound_wait_and_none_gets_eagain() {
    if !common::require_mount_capability() {
        return;
    }
    // 64 handlers and 1024 queued were all the old pool held.
    slow_readers_of_one_user_all_wait_their_turn("sync", "read_latency_ms=500,max_threads=64", 1500);
}

/// `n` readers blocked in 30 s READs at once, with at most `max_in_flight`
/// futures and one `/dev/fuse` worker (one io_uring table per queue), all
/// sent SIGINT: every one gets `EINTR`, none waits for its data, whether
/// its future runs, its request waits for room at the bound, or it is
/// parked. Returns the daemon.
fn interrupted_readers_all_get_eintr(tag: &str, n: usize, max_in_flight: usize) -> Slowfs {
    let fs = Slowfs::start(
        tag,
        &format!(
            "latency_ms=0,read_latency_ms=30000,files=8,size=4096,threads=1,max_threads=1,max_in_flight={max_in_flight}"
        ),
    );
    let file = std::sync::Arc::new(File::open(fs.path("file-001")).expect("open"));
    catch_sigint();
    let (tid_tx, tid_rx) = mpsc::channel();
    let readers: Vec<_> = (0..n)
        .map(|_| {
            let (file, tid_tx) = (file.clone(), tid_tx.clone());
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    // SAFETY: pthread_self and gettid have no preconditions.
                    let ids = unsafe { (libc::pthread_self(), libc::gettid()) };
                    tid_tx.send(ids).expect("send the thread ids");
                    let mut buf = [0u8; 4096];
                    file.read_at(&mut buf, 0).map_err(|e| e.raw_os_error())
                })
                .expect("spawn a reader")
        })
        .collect();
    let tids: Vec<(libc::pthread_t, libc::pid_t)> = (0..n)
        .map(|_| tid_rx.recv_timeout(STEP).expect("a thread id"))
        .collect();
    // Every reader in its pread64: a signal before it would be missed. The
    // daemon's `.stats` cannot tell beyond the bound: its own READ waits
    // for room behind the readers'.
    all_blocked_in_pread(&tids.iter().map(|t| t.1).collect::<Vec<_>>());
    if n <= max_in_flight {
        fs.wait_for("the READs to reach the daemon", |f| {
            f.stat("running") as usize == n
        });
    }
    for (tid, _) in tids {
        // SAFETY: each reader is alive until its read returns, which only the
        // signal (or the 30 s latency) ends.
        let r = unsafe { libc::pthread_kill(tid, libc::SIGINT) };
        assert_eq!(r, 0, "pthread_kill");
    }
    let mnt = fs.mp.path().to_path_buf();
    let results = bounded(
        &mnt,
        Duration::from_secs(90),
        "the interrupted readers",
        move || {
            readers
                .into_iter()
                .map(|r| r.join().expect("a reader"))
                .collect::<Vec<_>>()
        },
    );
    let eintr = results.iter().filter(|r| **r == Err(Some(libc::EINTR))).count();
    let others: Vec<_> = results
        .iter()
        .filter(|r| **r != Err(Some(libc::EINTR)))
        .take(5)
        .collect();
    assert_eq!(eintr, n, "readers that got EINTR (some others: {others:?})");
    fs.wait_for("the daemon to drop every READ", |f| f.stat("running") == 0);
    fs
}

/// 1,000 readers near the default bound of 1,024 futures: an in-flight
/// table used to register 256 requests; the others could not be
/// interrupted and read their data 30 s later.
#[test]
fn a_thousand_interrupted_readers_near_the_bound_all_get_eintr() {
    if !common::require_mount_capability() {
        return;
    }
    let fs = interrupted_readers_all_get_eintr("slowfs-interrupt-1000", 1000, 1024);
    assert_eq!(fs.stat("cancelled"), 1000, "{:?}", fs.stats());
}

/// 3,000 readers, ten times the bound on futures: most are parked or wait
/// for room, and are answered `EINTR` without ever starting.
#[test]
fn interrupted_readers_beyond_the_bound_all_get_eintr() {
    if !common::require_mount_capability() {
        return;
    }
    if common::over_uring() {
        // Known gap: over io_uring some of these readers are not
        // interrupted and read their data when the latency ends (see
        // issue 32); the test runs on /dev/fuse only until that is fixed.
        eprintln!("interrupted_readers_beyond_the_bound: not run over io_uring (known gap)");
        return;
    }
    let fs = interrupted_readers_all_get_eintr("slowfs-interrupt-parked", 3000, 300);
    // Cancelled if it started before its INTERRUPT came, else never started.
    assert!(fs.stat("cancelled") <= 3000, "{:?}", fs.stats());
}

/// Waits (bounded) until every reader (by thread id) is blocked in `pread64`.
fn all_blocked_in_pread(tids: &[libc::pid_t]) {
    let deadline = Instant::now() + STEP;
    let call = libc::SYS_pread64.to_string();
    for tid in tids {
        let path = format!("/proc/self/task/{tid}/syscall");
        while std::fs::read_to_string(&path).map_or(true, |s| s.split(' ').next() != Some(call.as_str())) {
            assert!(Instant::now() < deadline, "reader {tid} never blocked in pread64");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Thousands of slow READs of uid 65534 hold every handler slot and
/// future in flight that one uid may hold, and more wait parked; root's
/// lookup, open and read of other files are served meanwhile, within one
/// handler slot: they complete while every slow READ is still pending (the
/// READs take `read_latency_ms`, tens of seconds, so without a share root's
/// requests wait for one of them to end, and one has ended when they return). Then the
/// readers are interrupted, and none was answered an error because of
/// the load.
fn another_users_calls_start_while_one_user_holds_every_slot(api: &str, opts: &str, readers: usize) {
    let (fs, files) = slowfs_for_other_users(&format!("slowfs-share-{api}"), api, 16, opts);
    catch_sigint();
    let (tid_tx, tid_rx) = mpsc::channel();
    let handles: Vec<_> = (0..readers)
        .map(|i| {
            let (file, tid_tx) = (files[i % files.len()].clone(), tid_tx.clone());
            spawn_as(NOBODY, move || {
                // SAFETY: pthread_self and gettid have no preconditions.
                tid_tx
                    .send(unsafe { (libc::pthread_self(), libc::gettid()) })
                    .expect("send ids");
                let mut buf = [0u8; 4096];
                file.read_at(&mut buf, 0).map_err(|e| e.raw_os_error())
            })
        })
        .collect();
    let tids: Vec<(libc::pthread_t, libc::pid_t)> = (0..readers)
        .map(|_| tid_rx.recv_timeout(STEP).expect("a thread id"))
        .collect();
    all_blocked_in_pread(&tids.iter().map(|t| t.1).collect::<Vec<_>>());
    // Root's calls, on files no reader touched (a LOOKUP, an OPEN and a
    // READ each reach the daemon: nothing of them is cached).
    let mnt = fs.mp.path().to_path_buf();
    let (stat, open, stats) = bounded(&mnt, Duration::from_secs(120), "root's calls", {
        let (a, b, c) = (fs.path("file-012"), fs.path("file-013"), fs.path(".stats"));
        move || {
            let stat = std::fs::metadata(a)
                .map(|m| m.len())
                .map_err(|e| e.raw_os_error());
            let open = File::open(b).map(drop).map_err(|e| e.raw_os_error());
            let stats = std::fs::read_to_string(c).map_err(|e| e.raw_os_error());
            (stat, open, stats)
        }
    });
    let finished = handles.iter().filter(|h| h.is_finished()).count();
    assert_eq!(stat, Ok(4096), "root's stat under load");
    assert_eq!(open, Ok(()), "root's open under load");
    let stats = stats.expect("root's read of .stats under load");
    assert_eq!(finished, 0, "root's calls waited for slow READs to end: {stats}");
    for (tid, _) in tids {
        // SAFETY: each reader is alive until its read returns, which only
        // the signal (or the READ's latency) ends.
        let r = unsafe { libc::pthread_kill(tid, libc::SIGINT) };
        assert_eq!(r, 0, "pthread_kill");
    }
    let results = bounded(&mnt, Duration::from_secs(110), "the readers", move || {
        handles
            .into_iter()
            .map(|h| h.join().expect("a reader"))
            .collect::<Vec<_>>()
    });
    // A sync handler that runs is not interrupted: its READ ends with data.
    let mut failed = std::collections::BTreeMap::new();
    for r in results {
        match r {
            Ok(4096) | Err(Some(libc::EINTR)) => {}
            other => *failed.entry(format!("{other:?}")).or_insert(0) += 1,
        }
    }
    assert!(failed.is_empty(), "of {readers} readers: {failed:?}");
}

/// Readers over io_uring: fewer than one queue's entries, which the kernel
/// hands out in turn whoever asks (the shares are the daemon's handlers and
/// futures, not the ring's entries).
fn share_readers(readers: usize) -> usize {
    if common::over_uring() {
        readers.min(900)
    } else {
        readers
    }
}

#[test]
fn roots_calls_start_while_uid_nobody_holds_every_async_slot() {
    if !common::require_mount_capability() {
        return;
    }
    another_users_calls_start_while_one_user_holds_every_slot(
        "async",
        "read_latency_ms=30000,max_threads=8,max_in_flight=256",
        share_readers(4000),
    );
}

#[test]
fn roots_calls_start_while_uid_nobody_holds_every_sync_slot() {
    if !common::require_mount_capability() {
        return;
    }
    another_users_calls_start_while_one_user_holds_every_slot(
        "sync",
        "read_latency_ms=20000,max_threads=8",
        share_readers(4000),
    );
}
