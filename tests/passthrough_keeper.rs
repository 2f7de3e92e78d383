//! passthrough_ll under a keeper on real mounts (`-o keeper`): clients run a
//! metadata and data workload (exclusive creates, writes, fsync, reads that
//! verify, exclusive setxattr and removexattr, appends, renames, links,
//! unlinks, mkdir/rmdir, symlinks, listings) while the serving daemon is killed with SIGKILL at random
//! moments, kills itself between carrying out a non-idempotent request
//! and answering it (`FUSE_WIRE_FAULT`), or is upgraded (`SIGUSR2`). No client may see an error (no
//! EEXIST or ENOENT from a request carried out twice), and files opened
//! before the first kill, an unlinked one among them, must still read and
//! write, and a `flock` lock taken before must still hold. An fsx-style
//! exerciser (random writes, truncations, reads and fsyncs on one file
//! kept open throughout, every read checked against a model) runs beside
//! the clients.
//!
//! Every step is bounded: clients still blocked 30 s after the end have the
//! connection aborted under them (and that fails the test), and the keeper
//! is killed and its mount freed on drop.

mod common;
mod keeper_support;

use common::*;
use keeper_support::*;
use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A keeper serving `src` on `tm`'s mountpoint, its daemons killing
/// themselves as `fault` says (`FUSE_WIRE_FAULT`, none if empty).
fn keeper(tm: &TempMountpoint, src: &Path, fault: &str) -> Keeper {
    let mut cmd = Command::new(example_binary("passthrough_ll"));
    cmd.arg(src)
        .arg(tm.path())
        .args(["-o", "keeper,flock,xattr"])
        // A line per daemon (counted below), no more: the log goes into a
        // pipe nobody reads until the end.
        .env("RUST_LOG", "error,passthrough_ll=info");
    if !fault.is_empty() {
        cmd.env("FUSE_WIRE_FAULT", fault);
    }
    let k = Keeper::start_with(&mut cmd, tm.path());
    // The first daemon tells the keeper what INIT negotiated from a thread
    // that looks every 2 ms; one that dies before that leaves a keeper that
    // takes the connection for a fresh one, and the requests the daemon
    // held are never sent again. Give it the time, before the first kill.
    fs::metadata(tm.path()).expect("stat the mount");
    std::thread::sleep(Duration::from_millis(200));
    k
}

/// What one client writes in iteration `k`.
fn pattern(client: usize, k: usize) -> Vec<u8> {
    (0..6000).map(|i| (i * 7 + client * 31 + k * 13) as u8).collect()
}

/// One client's loop in its own directory `dir`, until `stop` or
/// `iterations`; each failure recorded (the first few).
fn client(
    dir: PathBuf,
    id: usize,
    iterations: usize,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> Vec<String> {
    let mut errors = Vec::new();
    let mut k = 0;
    while k < iterations && !stop.load(Ordering::Relaxed) && errors.len() < 5 {
        if let Err(e) = iteration(&dir, id, k) {
            errors.push(format!("client {id}, iteration {k}: {e}"));
        }
        done.fetch_add(1, Ordering::Relaxed);
        k += 1;
    }
    errors
}

fn iteration(dir: &Path, id: usize, k: usize) -> Result<(), String> {
    let step = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let data = pattern(id, k);
    let (f, g, h, d, s) = (
        dir.join("f"),
        dir.join("g"),
        dir.join("h"),
        dir.join("d"),
        dir.join("s"),
    );
    // Create exclusively, write, fsync, read back.
    let mut file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&f)
        .map_err(|e| step("create O_EXCL", e))?;
    file.write_all(&data).map_err(|e| step("write", e))?;
    file.sync_all().map_err(|e| step("fsync", e))?;
    let mut back = Vec::new();
    file.seek(SeekFrom::Start(0)).map_err(|e| step("seek", e))?;
    file.read_to_end(&mut back).map_err(|e| step("read", e))?;
    if back != data {
        return Err(format!("read back {} bytes, not what was written", back.len()));
    }
    drop(file);
    // Extended attributes: one made exclusively and removed, one kept.
    set_xattr(&f, "user.once", b"made once", libc::XATTR_CREATE).map_err(|e| step("setxattr create", e))?;
    remove_xattr(&f, "user.once").map_err(|e| step("removexattr", e))?;
    set_xattr(&f, "user.kept", &data[..32], libc::XATTR_CREATE).map_err(|e| step("setxattr create", e))?;
    // Append twice.
    let mut app = fs::OpenOptions::new()
        .append(true)
        .open(&f)
        .map_err(|e| step("open O_APPEND", e))?;
    app.write_all(b"tail1").map_err(|e| step("append", e))?;
    app.write_all(b"tail2").map_err(|e| step("append", e))?;
    drop(app);
    // Rename, link, unlink the old name.
    fs::rename(&f, &g).map_err(|e| step("rename", e))?;
    fs::hard_link(&g, &h).map_err(|e| step("link", e))?;
    fs::remove_file(&g).map_err(|e| step("unlink", e))?;
    // A directory with a file in it, and a symbolic link.
    fs::create_dir(&d).map_err(|e| step("mkdir", e))?;
    fs::write(d.join("x"), b"x").map_err(|e| step("create in mkdir'd dir", e))?;
    std::os::unix::fs::symlink("h", &s).map_err(|e| step("symlink", e))?;
    let names: BTreeSet<String> = fs::read_dir(dir)
        .map_err(|e| step("readdir", e))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()
        .map_err(|e| step("readdir", e))?;
    let want: BTreeSet<String> = ["d", "h", "s"].iter().map(|s| s.to_string()).collect();
    if names != want {
        return Err(format!("listing {names:?}, expected {want:?}"));
    }
    if fs::read_link(&s).map_err(|e| step("readlink", e))? != Path::new("h") {
        return Err("the symbolic link's target changed".into());
    }
    let mut all = data.clone();
    all.extend_from_slice(b"tail1tail2");
    let mut value = [0u8; 64];
    let n = get_xattr(&h, "user.kept", &mut value).map_err(|e| step("getxattr", e))?;
    if value[..n] != data[..32] {
        return Err(format!("user.kept holds {n} bytes, not what was set"));
    }
    let got = fs::read(&s).map_err(|e| step("read through the link", e))?;
    if got != all {
        return Err(format!(
            "{} bytes after the appends, not the {} expected",
            got.len(),
            all.len()
        ));
    }
    fs::remove_file(d.join("x")).map_err(|e| step("unlink in dir", e))?;
    fs::remove_dir(&d).map_err(|e| step("rmdir", e))?;
    fs::remove_file(&s).map_err(|e| step("unlink symlink", e))?;
    fs::remove_file(&h).map_err(|e| step("unlink last name", e))?;
    Ok(())
}

/// `mnt/name`, created (or emptied) for reading and writing, holding `text`.
fn written(mnt: &Path, name: &str, text: &[u8]) -> fs::File {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mnt.join(name))
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
    f.write_all_at(text, 0)
        .unwrap_or_else(|e| panic!("write {name}: {e}"));
    f
}

fn c_path(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("a path without NUL")
}

fn c_name(name: &str) -> std::ffi::CString {
    std::ffi::CString::new(name).expect("a name without NUL")
}

fn set_xattr(p: &Path, name: &str, value: &[u8], flags: libc::c_int) -> std::io::Result<()> {
    let (p, name) = (c_path(p), c_name(name));
    // SAFETY: NUL-terminated strings and a live buffer of the length given.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn get_xattr(p: &Path, name: &str, buf: &mut [u8]) -> std::io::Result<usize> {
    let (p, name) = (c_path(p), c_name(name));
    // SAFETY: NUL-terminated strings and a live buffer of the length given.
    let r = unsafe { libc::getxattr(p.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    usize::try_from(r).map_err(|_| std::io::Error::last_os_error())
}

fn remove_xattr(p: &Path, name: &str) -> std::io::Result<()> {
    let (p, name) = (c_path(p), c_name(name));
    // SAFETY: NUL-terminated strings.
    let r = unsafe { libc::removexattr(p.as_ptr(), name.as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Files opened before the first kill: one kept, one unlinked at once, one
/// holding a `flock` lock, and one whose name is removed in the source
/// directory itself, not through the mount.
struct Early {
    kept: fs::File,
    unlinked: fs::File,
    locked: fs::File,
    outside: fs::File,
}

impl Early {
    fn open(mnt: &Path, src: &Path) -> Early {
        let kept = written(mnt, "kept", b"before the kills");
        let unlinked = written(mnt, "unlinked", b"no name any more");
        fs::remove_file(mnt.join("unlinked")).expect("unlink unlinked");
        let locked = fs::File::create(mnt.join("locked")).expect("create locked");
        // SAFETY: flock on a descriptor the File owns.
        let r = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&locked), libc::LOCK_EX) };
        assert_eq!(r, 0, "flock: {}", std::io::Error::last_os_error());
        let outside = written(mnt, "outside", b"removed at the source");
        fs::remove_file(src.join("outside")).expect("unlink outside, in the source");
        Early {
            kept,
            unlinked,
            locked,
            outside,
        }
    }

    /// The files still read what was written and take new writes, and the
    /// lock still holds against another open file. `outside`: whether the
    /// file removed in the source is checked too (it survives upgrades; a
    /// crash loses it, see docs/recovery.md).
    fn check(&self, mnt: &Path, outside: bool) {
        let other = fs::File::open(mnt.join("locked")).expect("open locked again");
        // SAFETY: flock on a descriptor the File owns.
        let r = unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&other),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        };
        let e = std::io::Error::last_os_error();
        assert!(
            r == -1 && e.raw_os_error() == Some(libc::EWOULDBLOCK),
            "the flock lock taken before the kills no longer holds ({r}, {e})"
        );
        let _ = &self.locked;
        let mut files = vec![
            (&self.kept, "kept", &b"before the kills"[..]),
            (&self.unlinked, "unlinked", &b"no name any more"[..]),
        ];
        if outside {
            files.push((&self.outside, "outside", &b"removed at the source"[..]));
        }
        for (f, what, text) in files {
            let mut buf = vec![0u8; text.len()];
            f.read_exact_at(&mut buf, 0)
                .unwrap_or_else(|e| panic!("reading the {what} file opened before the kills: {e}"));
            assert_eq!(buf, text, "the {what} file's content");
            f.write_all_at(b"after", 100)
                .unwrap_or_else(|e| panic!("writing the {what} file opened before the kills: {e}"));
            let mut tail = [0u8; 5];
            f.read_exact_at(&mut tail, 100).unwrap();
            assert_eq!(&tail, b"after");
        }
    }
}

/// The fsx-style exerciser: a thread doing random operations on
/// `fsx.dat`, opened once before the kills and kept open throughout.
struct Fsx {
    mnt: PathBuf,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<u64, String>>,
}

/// Offsets and sizes stay below this.
const FSX_SPAN: u64 = 256 * 1024;

impl Fsx {
    fn start(mnt: &Path) -> Fsx {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(mnt.join("fsx.dat"))
            .expect("create fsx.dat");
        let stop = Arc::new(AtomicBool::new(false));
        let seed = 0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id());
        let s = stop.clone();
        let thread = std::thread::spawn(move || fsx(&file, seed, &s));
        Fsx {
            mnt: mnt.to_path_buf(),
            stop,
            thread,
        }
    }

    /// Stops it: it must end within 60 s (else the connection is aborted
    /// under it and the test fails), have done some work and seen nothing
    /// wrong.
    fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.thread.is_finished() {
            if Instant::now() > deadline {
                let _ = abort_fuse_connection(&self.mnt);
                panic!("fsx still in a request 60 s after it was told to stop; connection aborted");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        match self.thread.join().expect("the fsx thread") {
            Ok(ops) => assert!(ops >= 100, "fsx did only {ops} operations"),
            Err(e) => panic!("fsx: {e}"),
        }
    }
}

/// Random writes, truncations, fsyncs and reads on `file` until `stop`,
/// each read compared with `model`, what the file must hold; every 64
/// operations the whole file is. The operations done, or what went wrong.
fn fsx(file: &fs::File, seed: u64, stop: &AtomicBool) -> Result<u64, String> {
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut model: Vec<u8> = Vec::new();
    let mut ops = 0u64;
    let compare = |model: &[u8], off: usize, len: usize, what: &str| -> Result<(), String> {
        let mut buf = vec![0u8; len];
        let mut got = 0;
        while got < len {
            match file.read_at(&mut buf[got..], (off + got) as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => return Err(format!("{what}: read of {len} at {off}: {e}")),
            }
        }
        let want = &model[off.min(model.len())..(off + len).min(model.len())];
        if &buf[..got] != want {
            let at = buf[..got].iter().zip(want).position(|(a, b)| a != b);
            return Err(format!(
                "{what}: read {got} bytes at {off}, expected {} (first difference at {at:?})",
                want.len()
            ));
        }
        Ok(())
    };
    while !stop.load(Ordering::Relaxed) {
        let r = next();
        let off = (next() % FSX_SPAN) as usize;
        match r % 8 {
            0..=2 => {
                let len = 1 + (next() % 16384) as usize;
                let data: Vec<u8> = (0..len).map(|i| (i as u64 ^ r >> 8 ^ ops) as u8).collect();
                file.write_all_at(&data, off as u64)
                    .map_err(|e| format!("write of {len} at {off}: {e}"))?;
                if model.len() < off + len {
                    model.resize(off + len, 0);
                }
                model[off..off + len].copy_from_slice(&data);
            }
            3 => {
                file.set_len(off as u64)
                    .map_err(|e| format!("truncate to {off}: {e}"))?;
                model.resize(off, 0);
            }
            4 => file.sync_data().map_err(|e| format!("fsync: {e}"))?,
            _ => compare(&model, off, 1 + (next() % 32768) as usize, "read")
                .map_err(|e| format!("{e} after {ops} operations"))?,
        }
        ops += 1;
        if ops.is_multiple_of(64) {
            let len = file.metadata().map_err(|e| format!("fstat: {e}"))?.len();
            if len != model.len() as u64 {
                return Err(format!(
                    "size {len}, expected {} after {ops} operations",
                    model.len()
                ));
            }
            compare(&model, 0, model.len(), "whole file")
                .map_err(|e| format!("{e} after {ops} operations"))?;
        }
    }
    Ok(ops)
}

/// Runs `clients` clients of `iterations` each on `mnt` while `kill` runs
/// (it returns when it has done its part); every client error, and a
/// client blocked 30 s past the end, fails.
fn workload(mnt: &Path, clients: usize, iterations: usize, kill: impl FnOnce(&AtomicU64)) -> u64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let dir = mnt.join(format!("w{c}"));
            fs::create_dir(&dir).expect("a client's directory");
            let (stop, done) = (stop.clone(), done.clone());
            std::thread::spawn(move || client(dir, c, iterations, stop, done))
        })
        .collect();
    kill(&done);
    let deadline = Instant::now() + Duration::from_secs(120);
    while threads.iter().any(|t| !t.is_finished()) {
        if Instant::now() > deadline {
            stop.store(true, Ordering::Relaxed);
            let _ = abort_fuse_connection(mnt);
            panic!("clients still running 120 s after the kills (a request nobody answers?); aborted");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let errors: Vec<String> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    assert!(errors.is_empty(), "client errors: {errors:#?}");
    done.load(Ordering::Relaxed)
}

fn setup(tag: &str) -> Option<(TempMountpoint, PathBuf)> {
    if !require_mount_capability() {
        return None;
    }
    let tm = TempMountpoint::new(tag);
    let src = tm.root().join("src");
    fs::create_dir(&src).unwrap();
    Some((tm, src))
}

/// `fio --verify` on `mnt/fio.dat` for `secs` seconds: random 4 KiB
/// O_DIRECT writes on a file it keeps open, each checked as it goes. `None`
/// (said loudly) where fio is not installed, outside CI.
fn start_fio(mnt: &Path, secs: u32) -> Option<std::process::Child> {
    let spawned = Command::new("fio")
        .args([
            "--name=verify",
            "--size=4M",
            "--bs=4k",
            "--rw=randwrite",
            "--direct=1",
            "--ioengine=psync",
            "--verify=crc32c",
            "--verify_backlog=16",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--time_based",
        ])
        .arg(format!("--runtime={secs}"))
        .arg(format!("--filename={}", mnt.join("fio.dat").display()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    match spawned {
        Ok(c) => Some(c),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            skip("fio is not installed: the workload runs without fio --verify");
            None
        }
        Err(e) => panic!("starting fio: {e}"),
    }
}

/// fio's end: it must exit 0 with no error, within 60 s.
fn finish_fio(mut fio: std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = fio.try_wait().expect("wait for fio") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = fio.kill();
            let _ = fio.wait();
            panic!("fio still running 60 s after its end");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let _ = fio.stdout.take().map(|mut o| o.read_to_string(&mut out));
    let _ = fio.stderr.take().map(|mut o| o.read_to_string(&mut out));
    assert!(
        status.success() && out.contains("err= 0"),
        "fio --verify: {status}\n{out}"
    );
}

/// SIGKILL of the daemon at random moments, 20 times, under four clients
/// and fio --verify.
#[test]
fn repeated_kills_under_a_workload_lose_nothing() {
    let Some((tm, src)) = setup("pt-keeper-kill") else {
        return;
    };
    let k = keeper(&tm, &src, "");
    let early = Early::open(tm.path(), &src);
    let fsx = Fsx::start(tm.path());
    let fio = start_fio(tm.path(), 4);
    let mut seed = 0x2545_f491_4f6c_dd1d_u64 ^ u64::from(std::process::id());
    let mut gone = Vec::new();
    let done = workload(tm.path(), 4, 1000, |done| {
        for _ in 0..20 {
            // xorshift: a pause of 5 to 100 ms before each kill.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let pid = serving_daemon(k.pid(), &gone);
            std::thread::sleep(Duration::from_millis(5 + seed % 96));
            signal(pid, libc::SIGKILL);
            gone.push(pid);
        }
        // Some work by the last daemon too.
        let at = done.load(Ordering::Relaxed);
        let t = Instant::now();
        while done.load(Ordering::Relaxed) < at + 8 && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    assert!(done >= 20, "only {done} iterations done in all");
    if let Some(fio) = fio {
        finish_fio(fio);
    }
    fsx.finish();
    early.check(tm.path(), false);
    drop(early);
    let log = k.stop();
    assert_eq!(crashes(&log), Some(20), "{log}");
}

/// The keeper's daemon once it serves (its workers run), so that each kill
/// lands on a daemon at work.
fn serving_daemon(keeper: u32, gone: &[u32]) -> u32 {
    let pid = daemon_of(keeper, gone);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let workers = fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks
                    .flatten()
                    .filter_map(|t| fs::read_to_string(t.path().join("comm")).ok())
                    .any(|c| c.starts_with("fuse-worker"))
            })
            .unwrap_or(false);
        if workers {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "daemon {pid} did not start serving within 10 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// How many daemons the keeper replaced, from its last line.
fn crashes(log: &str) -> Option<u64> {
    let at = log.find("daemons started, ")? + "daemons started, ".len();
    log[at..].split(' ').next()?.parse().ok()
}

/// Each daemon kills itself after carrying out a non-idempotent request and
/// before the journal records its answer: every such request is sent again
/// to a successor, which must find it done and answer as the first would.
#[test]
fn kills_between_effect_and_answer_lose_nothing() {
    let Some((tm, src)) = setup("pt-keeper-fault") else {
        return;
    };
    let fault = [
        "CREATE",
        "MKDIR",
        "SYMLINK",
        "LINK",
        "UNLINK",
        "RMDIR",
        "RENAME",
        "RENAME2",
        "WRITE",
        "SETATTR",
        "SETXATTR",
        "REMOVEXATTR",
    ]
    .iter()
    .map(|op| format!("effect:{op}"))
    .collect::<Vec<_>>()
    .join(",");
    let k = keeper(&tm, &src, &fault);
    // The early files' own requests already go through killed daemons.
    let early = Early::open(tm.path(), &src);
    let done = workload(tm.path(), 2, 3, |_| {});
    assert_eq!(done, 6);
    early.check(tm.path(), false);
    drop(early);
    let log = k.stop();
    // A kill at each fault point the workload reaches, at least.
    assert!(crashes(&log).is_some_and(|n| n > 10), "{log}");
}

/// Five graceful upgrades (`SIGUSR2`) under two clients.
#[test]
fn upgrades_under_a_workload_lose_nothing() {
    let Some((tm, src)) = setup("pt-keeper-upgrade") else {
        return;
    };
    let k = keeper(&tm, &src, "");
    let early = Early::open(tm.path(), &src);
    let fsx = Fsx::start(tm.path());
    let mut gone = Vec::new();
    workload(tm.path(), 2, 1000, |done| {
        for _ in 0..5 {
            let pid = serving_daemon(k.pid(), &gone);
            let at = done.load(Ordering::Relaxed);
            let t = Instant::now();
            // Some work by each daemon.
            while done.load(Ordering::Relaxed) < at + 3 && t.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(5));
            }
            signal(k.pid(), libc::SIGUSR2);
            gone.push(pid);
        }
        serving_daemon(k.pid(), &gone);
    });
    fsx.finish();
    early.check(tm.path(), true);
    drop(early);
    let log = k.stop();
    assert!(log.contains("5 upgrades"), "{log}");
}
