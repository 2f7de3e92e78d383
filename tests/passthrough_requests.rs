//! Which requests the kernel sends `passthrough_ll`, and how many at once,
//! under its options, on real mounts (its `--stats FILE` reports
//! per-opcode counts, errors and the most requests in flight at once, plus
//! the inodes the kernel still held at exit):
//!
//! - `O_DIRECT` writes to one file reach passthrough_ll concurrently
//!   when it serves them (`no_passthrough`; the session answers `O_DIRECT` opens `DIRECT_IO |
//!   PARALLEL_DIRECT_WRITES`) and with `-o parallel_direct_writes`, and
//!   one at a time with
//!   `-o serial_o_direct`; the data is right in every case, read back
//!   through a new buffered descriptor and through one that had the old
//!   content in the page cache before the writes, and through a shared
//!   mapping of an `O_DIRECT` descriptor;
//! - creates in several directories and in one shared directory proceed
//!   concurrently and lose nothing (the inode table's own concurrency is
//!   proved in `examples/passthrough_ll/inode_table_tests.rs`);
//! - `-o atomic_open` on this kernel (no atomic-open extension upstream)
//!   falls back to LOOKUP + OPEN/CREATE and behaves like a plain directory;
//! - after dropping the kernel's caches, every lookup was forgotten and no
//!   `O_PATH` descriptor is left open;
//! - `-o passthrough`, and the default where the kernel allows it, serve
//!   reads without a single READ request; `-o no_passthrough` serves them.
//!
//! Needs root and `/dev/fuse` (skips loudly without, fails under `CI=true`).

mod common;
mod posix_support;

use posix_support::*;
use std::collections::HashSet;
use std::fs;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

const MIB: usize = 1 << 20;

/// Runs `f` on a thread and waits at most `timeout` for it; on timeout calls
/// `on_timeout` (which kills the daemon so blocked calls return) and panics.
fn bounded<T: Send + 'static>(
    what: &str,
    timeout: Duration,
    on_timeout: impl FnOnce(),
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(timeout) {
        on_timeout();
        panic!("{what} did not finish within {timeout:?}");
    }
    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

fn killer(d: &Daemon) -> impl FnOnce() + use<> {
    let pid = d.pid();
    move || {
        if let Some(pid) = pid {
            // SAFETY: signalling the daemon this test spawned.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

// ---------------------------------------------------------------------------
// parallel direct writes

const WRITERS: usize = 4;
const WRITE_ROUNDS: usize = 16;

/// The pattern writer `t` writes in `round` of pass `pass`.
fn round_pattern(pass: usize, t: usize, round: usize) -> Vec<u8> {
    pattern(MIB, (pass * 97 + t * 31 + round) as u8)
}

/// Whether `data` holds every writer's last round of `pass` in its range;
/// the ranges that do not, named after `what`.
fn last_rounds(what: &str, pass: usize, data: &[u8], problems: &mut Vec<String>) {
    if data.len() != WRITERS * MIB {
        problems.push(format!("{what}: {} bytes, not {}", data.len(), WRITERS * MIB));
        return;
    }
    for t in 0..WRITERS {
        if data[t * MIB..(t + 1) * MIB] != round_pattern(pass, t, WRITE_ROUNDS - 1)[..] {
            problems.push(format!("{what}: range {t} does not hold writer {t}'s last round"));
        }
    }
}

/// [`WRITERS`] threads, each writing its own 1 MiB range of `path` with
/// `O_DIRECT`, [`WRITE_ROUNDS`] times; what went wrong.
fn o_direct_writers(path: &Path, pass: usize) -> Vec<String> {
    let handles: Vec<_> = (0..WRITERS)
        .map(|t| {
            let path = path.to_path_buf();
            std::thread::spawn(move || -> Result<(), String> {
                let fd = open(&path, libc::O_RDWR | libc::O_DIRECT, 0)
                    .map_err(|e| format!("writer {t}: open O_DIRECT: {}", errno_name(e)))?;
                for round in 0..WRITE_ROUNDS {
                    let buf = AlignedBuf::from_slice(&round_pattern(pass, t, round));
                    match pwrite(&fd, &buf, (t * MIB) as i64) {
                        Ok(n) if n as usize == MIB => {}
                        Ok(n) => return Err(format!("writer {t} round {round}: short write {n}")),
                        Err(e) => return Err(format!("writer {t} round {round}: {}", errno_name(e))),
                    }
                }
                Ok(())
            })
        })
        .collect();
    handles
        .into_iter()
        .filter_map(|h| h.join().expect("writer panicked").err())
        .collect()
}

/// An `O_DIRECT` descriptor of `path` mapped `MAP_SHARED` (as it could be
/// before the session answered such opens `DIRECT_IO`, which needs
/// `DIRECT_IO_ALLOW_MMAP`), read through the mapping: writer 0's last
/// round of pass 1.
fn mapped_shared(path: &Path) -> Result<(), String> {
    let fd = open(path, libc::O_RDWR | libc::O_DIRECT, 0)
        .map_err(|e| format!("open O_DIRECT: {}", errno_name(e)))?;
    // SAFETY: a fresh shared mapping of MIB bytes of an open descriptor;
    // nothing else refers to that address range.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            MIB,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.0,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(format!(
            "mmap MAP_SHARED of an O_DIRECT descriptor: {}",
            errno_name(errno())
        ));
    }
    // SAFETY: `at` is a readable mapping of MIB bytes until the munmap below.
    let same = unsafe { std::slice::from_raw_parts(at as *const u8, MIB) }
        == &round_pattern(1, 0, WRITE_ROUNDS - 1)[..];
    // SAFETY: unmaps the mapping made above, no longer referred to.
    unsafe { libc::munmap(at, MIB) };
    if same {
        Ok(())
    } else {
        Err("mmap MAP_SHARED of an O_DIRECT descriptor: not the last data written".into())
    }
}

/// Two passes of [`o_direct_writers`] over a preallocated 4 MiB file: the
/// first alone (where the writes may overlap), the second while a buffered
/// descriptor holds the first pass's content in the page cache (the kernel
/// then writes one at a time); after each, the data is read back without
/// `O_DIRECT`, after the second through that descriptor too. Returns the
/// daemon's exit and a list of problems with the data or the writes.
fn direct_writes(which: Fs) -> (DaemonExit, Vec<String>) {
    let d = Daemon::start(which);
    let f = d.mnt.join("big");
    fs::write(&f, vec![0u8; WRITERS * MIB]).expect("preallocate 4 MiB");
    let path = f.clone();
    let problems = bounded("direct writes", Duration::from_secs(120), killer(&d), move || {
        let mut problems = o_direct_writers(&path, 0);
        match fs::read(&path) {
            Ok(data) => last_rounds("pass 0, new buffered descriptor", 0, &data, &mut problems),
            Err(e) => problems.push(format!("pass 0: read back: {e}")),
        }
        // Opened and read before the second pass: its pages are cached.
        let cached = open(&path, libc::O_RDONLY, 0).expect("buffered open");
        match pread(&cached, WRITERS * MIB, 0) {
            Ok(data) => last_rounds("pass 1, buffered read before", 0, &data, &mut problems),
            Err(e) => problems.push(format!("pass 1: buffered read before: {}", errno_name(e))),
        }
        problems.extend(o_direct_writers(&path, 1));
        match pread(&cached, WRITERS * MIB, 0) {
            Ok(data) => last_rounds(
                "pass 1, buffered descriptor opened before",
                1,
                &data,
                &mut problems,
            ),
            Err(e) => problems.push(format!("pass 1: buffered read after: {}", errno_name(e))),
        }
        match fs::read(&path) {
            Ok(data) => last_rounds("pass 1, new buffered descriptor", 1, &data, &mut problems),
            Err(e) => problems.push(format!("pass 1: read back: {e}")),
        }
        if let Err(e) = mapped_shared(&path) {
            problems.push(e);
        }
        problems
    });
    let mut problems = problems;
    // And in the source directory itself.
    if let Some(src) = &d.source {
        match fs::read(src.join("big")) {
            Ok(data) => last_rounds("source file", 1, &data, &mut problems),
            Err(e) => problems.push(format!("source file: {e}")),
        }
    }
    (d.finish(), problems)
}

/// [`direct_writes`] until a run shows two WRITEs in the daemon at once (or
/// a problem), three runs at most: on a loaded two-core machine one run can
/// happen not to show it. Returns the last run and how many there were.
fn direct_writes_overlapping(which: Fs) -> (DaemonExit, Vec<String>, usize) {
    let mut runs = 0;
    loop {
        runs += 1;
        let (exit, problems) = direct_writes(which);
        if exit.op("WRITE", "max_inflight") > 1 || !problems.is_empty() || runs == 3 {
            return (exit, problems, runs);
        }
    }
}

#[test]
fn parallel_direct_writes_reach_the_daemon_concurrently() {
    if !common::require_mount_capability() {
        return;
    }
    // Two workers inside WRITE at once in some run, for the default and the
    // option; never without the flag (serial_o_direct).
    let cases = [
        (
            "passthrough_ll served by the daemon (the default but for passthrough)",
            Fs::Passthrough("threads=8,no_passthrough"),
        ),
        (
            "passthrough_ll -o parallel_direct_writes",
            Fs::Passthrough("threads=8,parallel_direct_writes"),
        ),
    ];
    let mut report = String::new();
    let mut failures = Vec::new();
    for (what, which) in cases {
        let (exit, problems, runs) = direct_writes_overlapping(which);
        let max = exit.op("WRITE", "max_inflight");
        let line = format!(
            "{what} ({runs} runs): WRITE count {} errors {} max_inflight {max}; problems {problems:?}\n",
            exit.op("WRITE", "count"),
            exit.op("WRITE", "errors"),
        );
        report.push_str(&line);
        if max < 2
            || !problems.is_empty()
            || exit.op("WRITE", "errors") != 0
            || exit.op("WRITE", "count") < (2 * WRITERS * WRITE_ROUNDS) as u64
        {
            failures.push(what);
        }
    }
    let (serial, serial_problems) =
        direct_writes(Fs::Passthrough("threads=8,no_passthrough,serial_o_direct"));
    let serial_max = serial.op("WRITE", "max_inflight");
    report.push_str(&format!(
        "passthrough_ll -o serial_o_direct: WRITE count {} errors {} max_inflight {serial_max}; problems {serial_problems:?}\n",
        serial.op("WRITE", "count"),
        serial.op("WRITE", "errors"),
    ));
    eprint!("{report}");
    assert!(
        failures.is_empty(),
        "no overlap, or wrong data, for {failures:?}\n{report}"
    );
    assert_eq!(serial_max, 1, "serial_o_direct: the kernel serialises\n{report}");
    assert!(
        serial_problems.is_empty() && serial.op("WRITE", "errors") == 0,
        "{report}"
    );
}

// ---------------------------------------------------------------------------
// creates without a global lock

const CREATORS: usize = 4;
const FILES_PER_CREATOR: usize = 400;

#[test]
fn concurrent_creates_in_private_and_shared_directories() {
    if !common::require_mount_capability() {
        return;
    }
    let d = Daemon::start(Fs::Passthrough("threads=8"));
    let mnt = d.mnt.clone();
    for t in 0..CREATORS {
        fs::create_dir(mnt.join(format!("d{t}"))).expect("mkdir");
    }
    fs::create_dir(mnt.join("shared")).expect("mkdir shared");
    let root = mnt.clone();
    let errors = bounded(
        "concurrent creates",
        Duration::from_secs(120),
        killer(&d),
        move || {
            let handles: Vec<_> = (0..CREATORS)
                .map(|t| {
                    let root = root.clone();
                    std::thread::spawn(move || -> Vec<String> {
                        let mut errs = Vec::new();
                        for i in 0..FILES_PER_CREATOR {
                            for p in [
                                root.join(format!("d{t}/f{i}")),
                                root.join(format!("shared/t{t}-f{i}")),
                            ] {
                                if let Err(e) = open(&p, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644)
                                    .and_then(|fd| write(&fd, p.to_string_lossy().as_bytes()))
                                {
                                    errs.push(format!("{}: {}", p.display(), errno_name(e)));
                                }
                            }
                        }
                        errs
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("creator panicked"))
                .collect::<Vec<_>>()
        },
    );
    assert!(
        errors.is_empty(),
        "creates failed: {:?}",
        &errors[..errors.len().min(10)]
    );
    let names = |dir: &Path| -> HashSet<String> {
        fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    };
    for t in 0..CREATORS {
        let want: HashSet<String> = (0..FILES_PER_CREATOR).map(|i| format!("f{i}")).collect();
        assert_eq!(names(&mnt.join(format!("d{t}"))), want, "directory d{t}");
    }
    let want: HashSet<String> = (0..CREATORS)
        .flat_map(|t| (0..FILES_PER_CREATOR).map(move |i| format!("t{t}-f{i}")))
        .collect();
    assert_eq!(names(&mnt.join("shared")), want, "the shared directory");
    let sample = mnt.join("shared/t3-f7");
    assert_eq!(
        fs::read(&sample).expect("read"),
        sample.to_string_lossy().as_bytes()
    );
    let exit = d.finish();
    let creates = exit.op("CREATE", "count");
    let inflight = exit.op("CREATE", "max_inflight");
    eprintln!("CREATE count {creates}, max_inflight {inflight}");
    assert_eq!(creates, (2 * CREATORS * FILES_PER_CREATOR) as u64);
    assert_eq!(exit.op("CREATE", "errors"), 0);
    // Creates in different directories run at once in the daemon: nothing serialised them.
    assert!(
        inflight > 1,
        "CREATE max_inflight {inflight}: creates never overlapped"
    );
}

// ---------------------------------------------------------------------------
// atomic open falls back on this kernel

fn check_create_open(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    let rw = libc::O_RDWR;
    log.done(
        "O_CREAT|O_EXCL new",
        &open(&f, libc::O_CREAT | libc::O_EXCL | rw, 0o640),
    );
    log.res("shape", &shape_of(&f, false));
    log.done(
        "O_CREAT|O_EXCL existing",
        &open(&f, libc::O_CREAT | libc::O_EXCL | rw, 0o640),
    );
    fs::write(&f, b"0123456789").expect("write");
    log.done("O_CREAT existing", &open(&f, libc::O_CREAT | rw, 0o600));
    log.res("content kept", &content(&f));
    log.done(
        "O_CREAT|O_TRUNC existing",
        &open(&f, libc::O_CREAT | libc::O_TRUNC | rw, 0o600),
    );
    log.res("content truncated", &content(&f));
    fs::write(&f, b"abc").expect("write");
    log.done(
        "O_TRUNC without O_CREAT",
        &open(&f, libc::O_TRUNC | libc::O_WRONLY, 0),
    );
    log.res("content truncated", &content(&f));
    log.done("open missing", &open(&ctx.p("missing"), rw, 0));
    log.done(
        "O_CREAT|O_TRUNC new",
        &open(&ctx.p("g"), libc::O_CREAT | libc::O_TRUNC | rw, 0o600),
    );
    log.res("shape", &shape_of(&ctx.p("g"), false));
    log.done(
        "O_CREAT on a directory",
        &open(&ctx.root, libc::O_CREAT | libc::O_RDONLY, 0o644),
    );
    log.done(
        "O_CREAT in a missing directory",
        &open(&ctx.p("no/x"), libc::O_CREAT | rw, 0o644),
    );
    // The same name created again right after an unlink (negative dentry).
    fs::remove_file(ctx.p("g")).expect("unlink");
    log.done(
        "O_CREAT|O_EXCL after unlink",
        &open(&ctx.p("g"), libc::O_CREAT | libc::O_EXCL | rw, 0o600),
    );
    // Many creates racing for one name: exactly one O_EXCL wins.
    let racer = ctx.p("race");
    let wins: usize = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| open(&racer, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644).is_ok()))
            .collect();
        hs.into_iter().map(|h| h.join().expect("racer") as usize).sum()
    });
    log.val("O_EXCL winners among 4 racers", wins);
    let mut names: Vec<String> = fs::read_dir(&ctx.root)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    log.val("listing", names);
}

#[test]
fn atomic_open_requested_falls_back_to_lookup_and_create() {
    if !common::require_mount_capability() {
        return;
    }
    let plain = TempBase::new("plain");
    let pctx = Ctx {
        root: plain.subdir("root"),
        outside: plain.subdir("outside"),
        label: "plain".into(),
        source: None,
    };
    let mut reference = Log::default();
    check_create_open(&pctx, &mut reference);

    let d = Daemon::start(Fs::Passthrough("atomic_open"));
    let ctx = Ctx {
        root: d.mnt.clone(),
        outside: d.outside.clone(),
        label: d.label().to_string(),
        source: d.source.clone(),
    };
    let log = bounded(
        "atomic open checks",
        Duration::from_secs(60),
        killer(&d),
        move || {
            let mut log = Log::default();
            check_create_open(&ctx, &mut log);
            log
        },
    );
    let exit = d.finish();
    let diff = log.diff(&reference);
    assert!(
        diff.is_empty(),
        "-o atomic_open differs from a plain directory:\n  {}",
        diff.join("\n  ")
    );
    assert!(
        exit.status.is_some_and(|s| s.success()),
        "daemon exit: {:?}\n{}",
        exit.status,
        exit.output_tail
    );
    // This kernel has no atomic-open request: the kernel fell back to LOOKUP and CREATE/OPEN.
    assert!(exit.op("LOOKUP", "count") > 0, "no LOOKUP: {:?}", exit.stats());
    assert!(exit.op("CREATE", "count") >= 4, "no CREATE: {:?}", exit.stats());
    assert!(exit.op("OPEN", "count") > 0, "no OPEN: {:?}", exit.stats());
    if let Some(Json::Obj(ops)) = exit.stats().get("ops") {
        let unexpected: Vec<&String> = ops.keys().filter(|k| k.contains("ATOMIC")).collect();
        assert!(unexpected.is_empty(), "this kernel sent {unexpected:?}");
    }
}

// ---------------------------------------------------------------------------
// lookup counts return to zero

fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[test]
fn lookup_counts_return_to_zero_after_dropping_caches() {
    if !common::require_mount_capability() {
        return;
    }
    let d = Daemon::start(Fs::Passthrough("threads=4"));
    let pid = d.pid().expect("daemon pid");
    // The floor: what the daemon holds once the kernel has forgotten what
    // it looked up while mounting.
    let paths_at_start = common::evict_until_path_fds(pid, 0, Duration::from_millis(300));
    let fds_at_start = open_fds(pid);
    let mnt = d.mnt.clone();
    bounded(
        "building and walking a tree",
        Duration::from_secs(120),
        killer(&d),
        move || {
            for i in 0..8 {
                let dir = mnt.join(format!("d{i}"));
                fs::create_dir(&dir).expect("mkdir");
                for j in 0..50 {
                    fs::write(dir.join(format!("f{j}")), b"x").expect("create");
                }
                std::os::unix::fs::symlink("f0", dir.join("link")).expect("symlink");
                fs::hard_link(dir.join("f1"), dir.join("hard")).expect("link");
                fs::rename(dir.join("f2"), dir.join("renamed")).expect("rename");
                fs::remove_file(dir.join("f3")).expect("unlink");
            }
            // Walk everything (LOOKUPs and READDIRPLUS entries).
            for e in fs::read_dir(&mnt).expect("read_dir") {
                let p = e.expect("entry").path();
                for e in fs::read_dir(&p).expect("read_dir") {
                    let q = e.expect("entry").path();
                    let _ = fs::symlink_metadata(&q).expect("lstat");
                }
            }
            // A file unlinked while open, then closed.
            let f = mnt.join("d0/f10");
            let fd = open(&f, libc::O_RDONLY, 0).expect("open");
            fs::remove_file(&f).expect("unlink open file");
            drop(fd);
        },
    );
    let paths_busy = common::open_path_fds(pid);
    // Evict every unused dentry and inode: the kernel sends FORGET for each,
    // and the daemon closes the O_PATH descriptor of each inode forgotten.
    common::evict_until_path_fds(pid, paths_at_start, Duration::from_secs(20));
    // FORGETs still queued in the kernel are dropped by the unmount: a few
    // STATFS round trips (never cached) make the daemon read them first.
    for _ in 0..5 {
        common::statfs_round_trip(&d.mnt);
    }
    let (fds_after, paths_after) = (open_fds(pid), common::open_path_fds(pid));
    let exit = d.finish();
    let inodes = exit.stats().get("inodes").and_then(Json::as_u64);
    eprintln!(
        "daemon fds: {fds_at_start} at start ({paths_at_start} O_PATH), {paths_busy} O_PATH while busy, \
         {fds_after} after dropping caches ({paths_after} O_PATH); inodes at exit: {inodes:?}; FORGET {} \
         BATCH_FORGET {}",
        exit.op("FORGET", "count"),
        exit.op("BATCH_FORGET", "count")
    );
    assert!(
        paths_busy > paths_at_start,
        "the walk should have made the daemon hold O_PATH fds"
    );
    // passthrough_ll counts the inodes the kernel holds lookups on, the root (node 1) not included.
    assert_eq!(inodes, Some(0), "lookups left at exit: {:?}", exit.stats());
    // At start the daemon may still hold an inode the kernel looked up while
    // mounting; after the caches are dropped, no more than at start is left.
    assert!(
        paths_after <= paths_at_start,
        "O_PATH descriptors leaked: {paths_after} after, {paths_at_start} at start ({fds_after} fds in all)"
    );
    assert!(
        exit.status.is_some_and(|s| s.success()),
        "daemon exit {:?}",
        exit.status
    );
}

// ---------------------------------------------------------------------------
// kernel passthrough

const BIG_FILE: usize = 64 * MIB;

fn read_big(opts: &'static str) -> (DaemonExit, bool) {
    let d = Daemon::start(Fs::Passthrough(opts));
    let src = d.source.clone().expect("source");
    let data = pattern(BIG_FILE, 11);
    fs::write(src.join("big"), &data).expect("write the big file in the source");
    let f = d.mnt.join("big");
    let ok = bounded(
        "reading 64 MiB",
        Duration::from_secs(120),
        killer(&d),
        move || {
            let fd = open(&f, libc::O_RDONLY, 0).expect("open");
            let mut got = Vec::with_capacity(BIG_FILE);
            loop {
                let chunk = pread(&fd, MIB, got.len() as i64).expect("read");
                if chunk.is_empty() {
                    break;
                }
                got.extend_from_slice(&chunk);
            }
            got == data
        },
    );
    (d.finish(), ok)
}

#[test]
fn kernel_passthrough_reads_send_no_read_requests() {
    if !common::require_mount_capability() {
        return;
    }
    let (pt, pt_ok) = read_big("passthrough");
    let (default, default_ok) = read_big("");
    let (plain, plain_ok) = read_big("no_passthrough");
    let report = format!(
        "passthrough: READ count {}, OPEN {}; by default: READ count {}; no_passthrough: READ count {}\n{}",
        pt.op("READ", "count"),
        pt.op("OPEN", "count"),
        default.op("READ", "count"),
        plain.op("READ", "count"),
        pt.output_tail
    );
    eprintln!("{report}");
    assert!(pt_ok, "wrong data through the passthrough mount\n{report}");
    assert!(default_ok, "wrong data through the default mount\n{report}");
    assert!(plain_ok, "wrong data through the no_passthrough mount\n{report}");
    assert_eq!(
        default.op("READ", "count"),
        0,
        "reads reached the daemon in the default mode\n{report}"
    );
    assert!(pt.op("OPEN", "count") > 0, "{report}");
    assert_eq!(
        pt.op("READ", "count"),
        0,
        "reads reached the daemon despite passthrough\n{report}"
    );
    assert!(plain.op("READ", "count") > 0, "{report}");
}
