//! `mdtest`: the metadata workload of fuse-wire's benchmark suite (`bench/run`).
//!
//! T threads, each phase bounded in time (`--seconds`) and in count
//! (`--max-files` per thread), all threads released together by a barrier:
//!
//! - `create_private`, `stat_private`, `unlink_private`: empty files in one
//!   directory per thread;
//! - `create_shared`, `stat_shared`, `unlink_shared`: the same in one directory
//!   shared by all threads;
//! - `write_small`, `read_small`: create+write+close, then open+read+close of
//!   `--small-size` byte files in the per-thread directories;
//! - `ls_cold`, `ls_warm` (with `--ls DIR`): the wall time of `ls -l DIR`, once
//!   or (`--ls-runs 2`, the default) twice.
//!
//! With `--inode-phase NAME --target DIR` it runs only that one phase, on
//! files made beforehand (the many-inodes rows: what a daemon pays per live
//! inode):
//!
//! - `ls_big`: `ls -l DIR`;
//! - `stat_many`: `lstat` of `DIR/e000000` ... (`--count` names), no listing,
//!   so each is a LOOKUP;
//! - `tree_walk`: list every directory below DIR and `lstat` every entry.
//!
//! A phase's rate is its operations divided by the wall time from the first
//! thread's start to the last thread's end. Stat, unlink and read phases work on the files the
//! phase before made, so a faster create phase gives them more work, never
//! less time. The result is one JSON object on stdout; the exit status is 1
//! when any operation failed (the JSON says which phase and the first error).
//!
//! With `--step`, each timed phase is bracketed by a handshake, so that the
//! driver can measure the daemon over exactly that phase: mdtest writes
//! `mdtest-step before NAME` (then `after NAME`) as a line on stderr and
//! waits for a line on stdin before going on.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: mdtest --dir DIR [--threads T] [--seconds S] [--max-files N] \
[--small-size BYTES] [--ls DIR [--ls-runs 1|2]] [--step]
       mdtest --inode-phase ls_big|stat_many|tree_walk --target DIR [--count N]";

/// `--step`: hand-shake with the driver around every timed phase.
static STEP: AtomicBool = AtomicBool::new(false);

/// Tells the driver a phase is about to start (`before`) or has ended
/// (`after`) and waits for its go-ahead: one line on stdin. A closed stdin
/// (the driver went away) ends the handshakes, not the run.
fn step(when: &str, name: &str) {
    if !STEP.load(Ordering::Relaxed) {
        return;
    }
    eprintln!("mdtest-step {when} {name}");
    let mut line = String::new();
    if !matches!(std::io::stdin().read_line(&mut line), Ok(n) if n > 0) {
        STEP.store(false, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone)]
struct Config {
    dir: PathBuf,
    threads: usize,
    seconds: f64,
    max_files: usize,
    small_size: usize,
    ls: Option<PathBuf>,
    ls_runs: usize,
    step: bool,
    /// `--inode-phase`: run only this phase, on `target`.
    inode_phase: Option<String>,
    target: Option<PathBuf>,
    count: usize,
}

fn parse_args(args: &[String]) -> Result<Config, String> {
    let mut cfg = Config {
        dir: PathBuf::new(),
        threads: 1,
        seconds: 1.0,
        max_files: 100_000,
        small_size: 4096,
        ls: None,
        ls_runs: 2,
        step: false,
        inode_phase: None,
        target: None,
        count: 0,
    };
    let mut dir = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |name: &str| it.next().cloned().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--dir" => dir = Some(PathBuf::from(val("--dir")?)),
            "--threads" => cfg.threads = num(&val("--threads")?)?,
            "--seconds" => {
                let v = val("--seconds")?;
                cfg.seconds = v.parse().map_err(|_| format!("bad --seconds {v:?}"))?;
            }
            "--max-files" => cfg.max_files = num(&val("--max-files")?)?,
            "--small-size" => cfg.small_size = num(&val("--small-size")?)?,
            "--ls" => cfg.ls = Some(PathBuf::from(val("--ls")?)),
            "--ls-runs" => cfg.ls_runs = num(&val("--ls-runs")?)?,
            "--step" => cfg.step = true,
            "--inode-phase" => cfg.inode_phase = Some(val("--inode-phase")?),
            "--target" => cfg.target = Some(PathBuf::from(val("--target")?)),
            "--count" => cfg.count = num(&val("--count")?)?,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if let Some(p) = &cfg.inode_phase {
        if !["ls_big", "stat_many", "tree_walk"].contains(&p.as_str()) {
            return Err(format!("unknown --inode-phase {p:?}\n{USAGE}"));
        }
        if cfg.target.is_none() {
            return Err(format!("--inode-phase needs --target\n{USAGE}"));
        }
        cfg.dir = dir.unwrap_or_default();
        return Ok(cfg);
    }
    cfg.dir = dir.ok_or_else(|| format!("--dir is required\n{USAGE}"))?;
    if cfg.threads == 0 || cfg.max_files == 0 {
        return Err("--threads and --max-files must be at least 1".into());
    }
    if !(1..=2).contains(&cfg.ls_runs) {
        return Err("--ls-runs must be 1 or 2".into());
    }
    if !(cfg.seconds > 0.0 && cfg.seconds.is_finite()) {
        return Err("--seconds must be a positive number".into());
    }
    Ok(cfg)
}

fn num(s: &str) -> Result<usize, String> {
    s.parse().map_err(|_| format!("not a count: {s:?}"))
}

/// What one phase did.
#[derive(Debug, Default, Clone, PartialEq)]
struct PhaseResult {
    name: &'static str,
    ops: u64,
    bytes: u64,
    seconds: f64,
    errors: u64,
    first_error: Option<String>,
}

impl PhaseResult {
    fn ops_per_sec(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ops as f64 / self.seconds
        } else {
            0.0
        }
    }

    fn to_json(&self) -> String {
        let err = match &self.first_error {
            Some(e) => json_str(e),
            None => "null".into(),
        };
        format!(
            "{{\"name\":{},\"ops\":{},\"bytes\":{},\"seconds\":{:.6},\"ops_per_sec\":{:.1},\"errors\":{},\"first_error\":{}}}",
            json_str(self.name),
            self.ops,
            self.bytes,
            self.seconds,
            self.ops_per_sec(),
            self.errors,
            err
        )
    }
}

/// Per-thread tally inside a phase.
#[derive(Default)]
struct Tally {
    ops: u64,
    bytes: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn fail(&mut self, what: &str, path: &Path, e: std::io::Error) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{what} {}: {e}", path.display()));
        }
    }
}

/// Runs `work(thread_index, deadline, tally)` on `threads` threads released
/// together, and times the phase from the first thread's start to the last
/// thread's end (each thread reads the clock itself: the releasing thread may
/// well be scheduled out while the workers run).
fn phase<F>(name: &'static str, threads: usize, seconds: f64, work: F) -> PhaseResult
where
    F: Fn(usize, Instant, &mut Tally) + Sync,
{
    step("before", name);
    let barrier = Barrier::new(threads);
    let runs: Vec<(Tally, Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                let work = &work;
                s.spawn(move || {
                    let mut tally = Tally::default();
                    barrier.wait();
                    let start = Instant::now();
                    work(t, start + Duration::from_secs_f64(seconds), &mut tally);
                    (tally, start, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect()
    });
    step("after", name);
    let first = runs.iter().map(|r| r.1).min().expect("at least one thread");
    let last = runs.iter().map(|r| r.2).max().expect("at least one thread");
    let mut r = PhaseResult {
        name,
        seconds: (last - first).as_secs_f64(),
        ..Default::default()
    };
    for (t, _, _) in runs {
        r.ops += t.ops;
        r.bytes += t.bytes;
        r.errors += t.errors;
        if r.first_error.is_none() {
            r.first_error = t.first_error;
        }
    }
    r
}

/// File names of thread `t`: its own directory, or the shared one.
fn private_name(root: &Path, t: usize, i: usize) -> PathBuf {
    root.join(format!("t{t}")).join(format!("f{i}"))
}

fn shared_name(root: &Path, t: usize, i: usize) -> PathBuf {
    root.join("shared").join(format!("t{t}.f{i}"))
}

type Namer = fn(&Path, usize, usize) -> PathBuf;

/// `lstat(2)`, as mdtest and `ls -l` do. Not `std::fs::symlink_metadata`: that
/// calls `statx` asking for the birth time too, which the kernel does not hold
/// after a create or lookup, so against a daemon that implements `FUSE_STATX`
/// every call is a round trip whatever the cache mode, and against one that
/// does not, none is: a difference in what the benchmark asks, not in the
/// daemons.
fn lstat(p: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` is writable memory of the right size.
    if unsafe { libc::lstat(c.as_ptr(), st.as_mut_ptr()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// create, stat and unlink phases over files named by `namer`.
fn create_stat_unlink(cfg: &Config, root: &Path, label: &str, namer: Namer) -> Vec<PhaseResult> {
    let (create, stat, unlink): (&'static str, &'static str, &'static str) = match label {
        "private" => ("create_private", "stat_private", "unlink_private"),
        _ => ("create_shared", "stat_shared", "unlink_shared"),
    };
    // How many files each thread made, so the next phases visit exactly those.
    let made: Vec<std::sync::atomic::AtomicUsize> = (0..cfg.threads)
        .map(|_| std::sync::atomic::AtomicUsize::new(0))
        .collect();
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    let mut out = Vec::new();
    out.push(phase(create, cfg.threads, cfg.seconds, |t, deadline, tally| {
        let mut i = 0;
        while i < cfg.max_files && Instant::now() < deadline {
            let p = namer(root, t, i);
            match File::create_new(&p) {
                Ok(_) => tally.ops += 1,
                Err(e) => {
                    tally.fail("create", &p, e);
                    break;
                }
            }
            i += 1;
        }
        made[t].store(i, relaxed);
    }));
    out.push(phase(stat, cfg.threads, cfg.seconds, |t, deadline, tally| {
        for i in 0..made[t].load(relaxed) {
            if Instant::now() >= deadline {
                break;
            }
            let p = namer(root, t, i);
            match lstat(&p) {
                Ok(()) => tally.ops += 1,
                Err(e) => tally.fail("stat", &p, e),
            }
        }
    }));
    out.push(phase(unlink, cfg.threads, cfg.seconds, |t, deadline, tally| {
        for i in 0..made[t].load(relaxed) {
            if Instant::now() >= deadline {
                break;
            }
            let p = namer(root, t, i);
            match fs::remove_file(&p) {
                Ok(()) => tally.ops += 1,
                Err(e) => tally.fail("unlink", &p, e),
            }
        }
    }));
    out
}

/// write_small and read_small phases in the per-thread directories.
fn small_files(cfg: &Config, root: &Path) -> Vec<PhaseResult> {
    let made: Vec<std::sync::atomic::AtomicUsize> = (0..cfg.threads)
        .map(|_| std::sync::atomic::AtomicUsize::new(0))
        .collect();
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    let data: Vec<u8> = (0..cfg.small_size).map(|i| (i % 251) as u8).collect();
    let name = |t: usize, i: usize| root.join(format!("t{t}")).join(format!("s{i}"));
    let mut out = Vec::new();
    out.push(phase(
        "write_small",
        cfg.threads,
        cfg.seconds,
        |t, deadline, tally| {
            let mut i = 0;
            while i < cfg.max_files && Instant::now() < deadline {
                let p = name(t, i);
                match File::create_new(&p).and_then(|mut f| f.write_all(&data)) {
                    Ok(()) => {
                        tally.ops += 1;
                        tally.bytes += data.len() as u64;
                    }
                    Err(e) => {
                        tally.fail("write", &p, e);
                        break;
                    }
                }
                i += 1;
            }
            made[t].store(i, relaxed);
        },
    ));
    out.push(phase(
        "read_small",
        cfg.threads,
        cfg.seconds,
        |t, deadline, tally| {
            let mut buf = vec![0u8; cfg.small_size + 1];
            for i in 0..made[t].load(relaxed) {
                if Instant::now() >= deadline {
                    break;
                }
                let p = name(t, i);
                match File::open(&p).and_then(|mut f| read_all(&mut f, &mut buf)) {
                    Ok(n) if n == data.len() => {
                        tally.ops += 1;
                        tally.bytes += n as u64;
                    }
                    Ok(n) => tally.fail(
                        "read",
                        &p,
                        std::io::Error::other(format!("short read: {n} of {} bytes", data.len())),
                    ),
                    Err(e) => tally.fail("read", &p, e),
                }
            }
        },
    ));
    // Not timed: remove what the write phase made.
    for (t, n) in made.iter().enumerate() {
        for i in 0..n.load(relaxed) {
            let _ = fs::remove_file(name(t, i));
        }
    }
    out
}

/// Reads until end of file or a full `buf`, with plain `read(2)` calls (std's
/// `read_to_end` first asks `statx` for the size, an extra request to FUSE).
fn read_all(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// `ls -l DIR` once; ops are the entries it listed.
fn ls_phase(name: &'static str, dir: &Path) -> PhaseResult {
    step("before", name);
    let start = Instant::now();
    let out = Command::new("ls")
        .arg("-l")
        .arg(dir)
        .stderr(Stdio::piped())
        .output();
    let seconds = start.elapsed().as_secs_f64();
    step("after", name);
    let mut r = PhaseResult {
        name,
        seconds,
        ..Default::default()
    };
    match out {
        Ok(o) if o.status.success() => {
            // `ls -l` prints a "total" line, then one line per entry.
            r.ops = o
                .stdout
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .count()
                .saturating_sub(1) as u64;
            r.bytes = o.stdout.len() as u64;
        }
        Ok(o) => {
            r.errors = 1;
            r.first_error = Some(format!(
                "ls -l {}: {}",
                dir.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Err(e) => {
            r.errors = 1;
            r.first_error = Some(format!("ls -l {}: {e}", dir.display()));
        }
    }
    r
}

/// `lstat` of `dir/e000000` .. `dir/e{count-1}`: one LOOKUP each on a cold mount.
fn stat_many_phase(dir: &Path, count: usize) -> PhaseResult {
    let mut r = PhaseResult {
        name: "stat_many",
        ..Default::default()
    };
    let start = Instant::now();
    for i in 0..count {
        let p = dir.join(format!("e{i:06}"));
        match lstat(&p) {
            Ok(()) => r.ops += 1,
            Err(e) => {
                r.errors += 1;
                r.first_error
                    .get_or_insert_with(|| format!("lstat {}: {e}", p.display()));
            }
        }
    }
    r.seconds = start.elapsed().as_secs_f64();
    r
}

/// Lists every directory below `root` and `lstat`s every entry (depth
/// first, with a stack rather than recursion).
fn tree_walk_phase(root: &Path) -> PhaseResult {
    let mut r = PhaseResult {
        name: "tree_walk",
        ..Default::default()
    };
    let fail = |r: &mut PhaseResult, what: String| {
        r.errors += 1;
        r.first_error.get_or_insert(what);
    };
    let start = Instant::now();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) => {
                fail(&mut r, format!("read_dir {}: {e}", dir.display()));
                continue;
            }
        };
        for ent in entries {
            let ent = match ent {
                Ok(e) => e,
                Err(e) => {
                    fail(&mut r, format!("read_dir {}: {e}", dir.display()));
                    break;
                }
            };
            let p = ent.path();
            match lstat(&p) {
                Ok(()) => r.ops += 1,
                Err(e) => fail(&mut r, format!("lstat {}: {e}", p.display())),
            }
            if ent.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    r.seconds = start.elapsed().as_secs_f64();
    r
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn run(cfg: &Config) -> Result<Vec<PhaseResult>, String> {
    if let (Some(phase), Some(target)) = (&cfg.inode_phase, &cfg.target) {
        return Ok(vec![match phase.as_str() {
            "ls_big" => ls_phase("ls_big", target),
            "stat_many" => stat_many_phase(target, cfg.count),
            _ => tree_walk_phase(target),
        }]);
    }
    // A directory of its own, so runs with different thread counts never meet.
    let root = cfg
        .dir
        .join(format!("mdtest-{}-t{}", std::process::id(), cfg.threads));
    let mkdir = |p: &Path| fs::create_dir_all(p).map_err(|e| format!("mkdir {}: {e}", p.display()));
    mkdir(&root.join("shared"))?;
    for t in 0..cfg.threads {
        mkdir(&root.join(format!("t{t}")))?;
    }
    let mut results = create_stat_unlink(cfg, &root, "private", private_name);
    results.extend(create_stat_unlink(cfg, &root, "shared", shared_name));
    results.extend(small_files(cfg, &root));
    if let Some(dir) = &cfg.ls {
        results.push(ls_phase("ls_cold", dir));
        if cfg.ls_runs == 2 {
            results.push(ls_phase("ls_warm", dir));
        }
    }
    // Not timed; files left by a phase cut short by its deadline go here too.
    fs::remove_dir_all(&root).map_err(|e| format!("cleanup {}: {e}", root.display()))?;
    Ok(results)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = match parse_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    STEP.store(cfg.step, Ordering::Relaxed);
    let results = match run(&cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mdtest: {e}");
            return ExitCode::FAILURE;
        }
    };
    let phases: Vec<String> = results.iter().map(PhaseResult::to_json).collect();
    println!(
        "{{\"tool\":\"mdtest\",\"threads\":{},\"seconds_per_phase\":{},\"max_files_per_thread\":{},\"small_size\":{},\"phases\":[{}]}}",
        cfg.threads,
        cfg.seconds,
        cfg.max_files,
        cfg.small_size,
        phases.join(",")
    );
    if results.iter().any(|r| r.errors > 0) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_arguments() {
        let c = parse_args(&args("--dir /x --threads 4 --seconds 0.5 --max-files 10 --ls /y")).unwrap();
        assert_eq!(c.dir, PathBuf::from("/x"));
        assert_eq!((c.threads, c.max_files, c.small_size), (4, 10, 4096));
        assert_eq!(c.seconds, 0.5);
        assert_eq!(c.ls, Some(PathBuf::from("/y")));
        assert!(parse_args(&args("--threads 2")).is_err());
        assert!(parse_args(&args("--dir /x --threads 0")).is_err());
        assert!(parse_args(&args("--dir /x --seconds -1")).is_err());
        assert!(parse_args(&args("--dir /x --bogus")).is_err());
        assert!(parse_args(&args("--dir /x --ls-runs 3")).is_err());
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }

    /// Runs every phase in a temporary directory and checks the counts add up
    /// (counts only: nothing here looks at how fast it went).
    #[test]
    fn phases_do_what_they_say() {
        let dir = std::env::temp_dir().join(format!("mdtest-unit-{}", std::process::id()));
        let lsdir = dir.join("listing");
        fs::create_dir_all(&lsdir).unwrap();
        for i in 0..5 {
            File::create(lsdir.join(format!("e{i:06}"))).unwrap();
        }
        let cfg = Config {
            dir: dir.clone(),
            threads: 2,
            seconds: 30.0,
            max_files: 20,
            small_size: 100,
            ls: Some(lsdir.clone()),
            ls_runs: 2,
            step: false,
            inode_phase: None,
            target: None,
            count: 0,
        };
        // The many-inodes phases, each on its own.
        let sub = lsdir.join("sub");
        fs::create_dir_all(&sub).unwrap();
        File::create(sub.join("x")).unwrap();
        for (phase, count, ops) in [("ls_big", 0, 6), ("stat_many", 3, 3), ("tree_walk", 0, 7)] {
            let c = Config {
                inode_phase: Some(phase.into()),
                target: Some(lsdir.clone()),
                count,
                ..cfg.clone()
            };
            let r = run(&c).unwrap();
            assert_eq!(r.len(), 1, "{phase}");
            assert_eq!(
                (r[0].name, r[0].ops, r[0].errors),
                (phase, ops, 0),
                "{phase}: {:?}",
                r[0]
            );
        }
        fs::remove_dir_all(&sub).unwrap();
        let r = run(&cfg).unwrap();
        let names: Vec<_> = r.iter().map(|p| p.name).collect();
        assert_eq!(
            names,
            [
                "create_private",
                "stat_private",
                "unlink_private",
                "create_shared",
                "stat_shared",
                "unlink_shared",
                "write_small",
                "read_small",
                "ls_cold",
                "ls_warm"
            ]
        );
        for p in &r[..8] {
            assert_eq!((p.ops, p.errors), (40, 0), "{p:?}");
        }
        assert_eq!(r[7].bytes, 4000);
        assert_eq!(r[8].ops, 5);
        // Only the listing is left: the run's own directory was removed.
        let left: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["listing"]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
