//! The workload the recovery tests run on a mount under a keeper, whatever
//! serves it (passthrough_ll, pathfs): clients in their own directories
//! doing exclusive creates, writes, fsync, verified reads, exclusive setxattr
//! and removexattr, appends, truncations, renames, links, unlinks, mkdir and
//! rmdir, symlinks and listings, each iteration checked against what it
//! made (its directory's listing, every file's bytes) and leaving the
//! directory empty; and finding the daemon at work to kill it.

use crate::common::*;
use crate::keeper_support::{Keeper, daemon_of};
use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What one client writes in iteration `k`.
pub fn pattern(client: usize, k: usize) -> Vec<u8> {
    (0..6000).map(|i| (i * 7 + client * 31 + k * 13) as u8).collect()
}

/// One client's loop in its own directory `dir`, until `stop` or
/// `iterations`; each failure recorded (the first few).
pub fn client(
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

pub fn iteration(dir: &Path, id: usize, k: usize) -> Result<(), String> {
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
    // Truncate up, by path: two zero bytes after the appends.
    let len = (data.len() + 12) as u64;
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .and_then(|t| t.set_len(len))
        .map_err(|e| step("truncate", e))?;
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
    all.extend_from_slice(b"tail1tail2\0\0");
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

pub fn c_path(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("a path without NUL")
}

pub fn c_name(name: &str) -> std::ffi::CString {
    std::ffi::CString::new(name).expect("a name without NUL")
}

pub fn set_xattr(p: &Path, name: &str, value: &[u8], flags: libc::c_int) -> std::io::Result<()> {
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

pub fn get_xattr(p: &Path, name: &str, buf: &mut [u8]) -> std::io::Result<usize> {
    let (p, name) = (c_path(p), c_name(name));
    // SAFETY: NUL-terminated strings and a live buffer of the length given.
    let r = unsafe { libc::getxattr(p.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    usize::try_from(r).map_err(|_| std::io::Error::last_os_error())
}

pub fn remove_xattr(p: &Path, name: &str) -> std::io::Result<()> {
    let (p, name) = (c_path(p), c_name(name));
    // SAFETY: NUL-terminated strings.
    let r = unsafe { libc::removexattr(p.as_ptr(), name.as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Runs `clients` clients of `iterations` each on `mnt` while `kill` runs
/// (it returns when it has done its part); every client error, and a
/// client blocked 30 s past the end, fails.
pub fn workload(mnt: &Path, clients: usize, iterations: usize, kill: impl FnOnce(&AtomicU64)) -> u64 {
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

/// The keeper's daemon once it serves (its workers run), so that each kill
/// lands on a daemon at work.
pub fn serving_daemon(keeper: u32, gone: &[u32]) -> u32 {
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
pub fn crashes(log: &str) -> Option<u64> {
    let at = log.find("daemons started, ")? + "daemons started, ".len();
    log[at..].split(' ').next()?.parse().ok()
}

/// The requests that are not idempotent, each a fault point of the tests
/// that kill a daemon between carrying one out and answering it
/// (`FUSE_WIRE_FAULT=effect:<op>`).
pub const FAULT_OPCODES: [&str; 12] = [
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
];

/// A mountpoint and the source directory `src` beside it that a
/// passthrough daemon serves; `None` where mounting is impossible outside CI.
pub fn setup(tag: &str) -> Option<(TempMountpoint, PathBuf)> {
    if !require_mount_capability() {
        return None;
    }
    let tm = TempMountpoint::new(tag);
    let src = tm.root().join("src");
    fs::create_dir(&src).unwrap();
    Some((tm, src))
}

/// A keeper running example `program` over `src` on `tm`'s mountpoint with
/// `-o keeper,<opts>` and `RUST_LOG=<log>`, its daemons killing themselves
/// as `fault` says (`FUSE_WIRE_FAULT`, none if empty).
pub fn passthrough_keeper(
    program: &str,
    opts: &str,
    log: &str,
    tm: &TempMountpoint,
    src: &Path,
    fault: &str,
) -> Keeper {
    let mut cmd = std::process::Command::new(example_binary(program));
    let opts = if opts.is_empty() {
        "keeper".to_string()
    } else {
        format!("keeper,{opts}")
    };
    cmd.arg(src)
        .arg(tm.path())
        .args(["-o", &opts])
        .env("RUST_LOG", log);
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
