//! Real mounts of the node layer (nodefs) and the path layer (pathfs):
//! rename storms from several processes, with concurrent `ls -lR`, end in
//! the same tree as on a plain directory (the model); afterwards, with the
//! kernel's caches dropped (`echo 2 > /proc/sys/vm/drop_caches`), the daemon
//! holds no node but the root when it is unmounted, and no open file.
//! pathfs serves a chain of directories far deeper than one path can name
//! as a plain directory does (every operation at its bottom, renames above
//! it, removal), and takes passthrough_ll's command-line conventions.
//!
//! Over io_uring with `FUSE_WIRE_TEST_TRANSPORT=uring`. Every wait is
//! bounded: the storm processes are killed after [`STORM_TIMEOUT`], the
//! daemons by `posix_support::Daemon`. Needs root and `/dev/fuse` (skips
//! loudly without, fails under `CI=true`) and the examples built.

mod common;
mod posix_support;

use posix_support::*;
use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Processes renaming at once, and the steps each takes.
const PROCS: usize = 4;
const STEPS: usize = 40;
const STORM_TIMEOUT: Duration = Duration::from_secs(120);
/// Everything done through the mount (setup, storm, listing, forgets).
const MOUNT_WORK_TIMEOUT: Duration = Duration::from_secs(300);
/// Files in the directory listed in several replies.
const MANY: usize = 8000;

/// The shell script of process `p`: its own subtree moves between the
/// shared directories A and B at every step (a directory rename carrying
/// files and a subdirectory), and its files and subdirectory are renamed
/// inside it. The names are the process's own, so the end state does not
/// depend on how the processes interleave.
fn script(p: usize) -> String {
    let mut s = String::from("set -e\n");
    let mut cur = format!("A/p{p}");
    let mut files: Vec<String> = (0..4).map(|i| format!("x{i}")).collect();
    let mut sub = "s".to_string();
    for k in 0..STEPS {
        let next = format!("{}/p{p}_{k}", if k % 2 == 0 { "B" } else { "A" });
        writeln!(s, "mv {cur} {next}").unwrap();
        cur = next;
        let i = k % files.len();
        let renamed = format!("x{i}_{k}");
        writeln!(s, "mv {cur}/{} {cur}/{renamed}", files[i]).unwrap();
        files[i] = renamed;
        if k % 3 == 0 {
            let renamed = format!("s_{k}");
            writeln!(s, "mv {cur}/{sub} {cur}/{renamed}").unwrap();
            sub = renamed;
            writeln!(
                s,
                "mv {cur}/{sub}/y {cur}/{sub}/y{k} && mv {cur}/{sub}/y{k} {cur}/{sub}/y"
            )
            .unwrap();
        }
    }
    s
}

fn setup(root: &Path) {
    for d in ["A", "B", "many"] {
        fs::create_dir(root.join(d)).expect("mkdir");
    }
    // A directory whose listing takes several READDIRPLUS replies even of
    // 1 MiB (MAX_PAGES) each (entries
    // that do not fit one are added to the next: counted only there).
    for i in 0..MANY {
        fs::write(
            root.join(format!("many/file-with-a-longish-name-for-listing-{i:05}")),
            b"",
        )
        .expect("write");
    }
    for p in 0..PROCS {
        let dir = root.join(format!("A/p{p}"));
        fs::create_dir_all(dir.join("s")).expect("mkdir");
        for i in 0..4 {
            fs::write(dir.join(format!("x{i}")), format!("p{p} file {i}\n")).expect("write");
        }
        fs::write(dir.join("s/y"), format!("p{p} y\n")).expect("write");
    }
}

/// Runs the storm in `root` (the scripts, plus one process listing the
/// tree over and over) and waits, bounded, for all of them.
fn storm(root: &Path) {
    let mut kids: Vec<(String, Child)> = (0..PROCS)
        .map(|p| {
            let c = Command::new("sh")
                .arg("-c")
                .arg(script(p))
                .current_dir(root)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn sh");
            (format!("renamer {p}"), c)
        })
        .collect();
    let lister = Command::new("sh")
        .arg("-c")
        .arg("for i in 1 2 3 4 5 6 7 8 9 10; do ls -lR . >/dev/null 2>&1 || true; done")
        .current_dir(root)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn ls");
    kids.push(("lister".into(), lister));
    let deadline = Instant::now() + STORM_TIMEOUT;
    let mut failures = Vec::new();
    for (name, mut c) in kids {
        let status = loop {
            match c.try_wait().expect("wait") {
                Some(st) => break Some(st),
                None if Instant::now() >= deadline => {
                    let _ = c.kill();
                    let _ = c.wait();
                    break None;
                }
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        let mut err = String::new();
        if let Some(mut e) = c.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        match status {
            Some(st) if st.success() => {}
            Some(st) => failures.push(format!("{name} in {}: {st}: {err}", root.display())),
            None => failures.push(format!(
                "{name} in {} did not finish within {STORM_TIMEOUT:?} (killed)",
                root.display()
            )),
        }
    }
    assert!(failures.is_empty(), "the storm failed:\n{}", failures.join("\n"));
}

/// The tree as `ls -lR` shows it, without times, owners' names or inode
/// numbers: path, type, permissions, links, size, and file contents.
fn listing(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
            .map(|e| e.expect("entry").path())
            .collect();
        entries.sort();
        for p in entries {
            let m = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("stat {}: {e}", p.display()));
            let rel = p.strip_prefix(root).expect("below root").display().to_string();
            let size = if m.is_dir() { 0 } else { m.size() };
            let mut line = format!("{rel} {:o} nlink={} size={size}", m.mode(), m.nlink());
            if m.is_file() {
                line.push_str(&format!(" {:?}", fs::read_to_string(&p).unwrap_or_default()));
            }
            out.push(line);
            if m.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out
}

/// `statvfs(2)`: one STATFS round trip to the daemon.
fn statvfs(p: &Path) {
    let c = cpath(p);
    // SAFETY: all-zero is a valid statvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a statvfs to fill.
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    assert_eq!(
        r,
        0,
        "statvfs {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

fn drop_caches() {
    let _ = Command::new("sync").status();
    fs::write("/proc/sys/vm/drop_caches", "2").expect("write /proc/sys/vm/drop_caches");
}

fn storm_on(fs_kind: Fs) {
    if !common::require_mount_capability() {
        return;
    }
    let plain = TempBase::new("layers-plain");
    let model = plain.subdir("root");
    setup(&model);
    storm(&model);
    let want = listing(&model);
    assert_eq!(
        want.len(),
        3 + MANY + PROCS * 7,
        "the model has every file: {want:#?}"
    );

    let mut d = Daemon::start(fs_kind);
    let (mnt, label) = (d.mnt.clone(), d.label().to_string());
    // Everything that goes through the mount runs on a thread of its own:
    // should the daemon hang, it is killed (its requests then fail) and
    // the test fails saying so, instead of hanging.
    let (tx, rx) = std::sync::mpsc::channel();
    let work = std::thread::spawn(move || {
        setup(&mnt);
        storm(&mnt);
        let ls = Command::new("ls")
            .arg("-lR")
            .arg(&mnt)
            .stdout(Stdio::null())
            .status()
            .expect("ls");
        assert!(ls.success(), "ls -lR on {} failed", mnt.display());
        let got = listing(&mnt);
        // Let the kernel forget everything it can, then make sure the
        // FORGETs it queued were read before unmounting (an unmount drops
        // unread ones): the kernel hands queued forgets out before other
        // requests, and STATFS is never answered from a cache, so each
        // statvfs round trip below comes after forgets were read.
        drop_caches();
        for _ in 0..10 {
            statvfs(&mnt);
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = tx.send(());
        got
    });
    if rx.recv_timeout(MOUNT_WORK_TIMEOUT).is_err() && !work.is_finished() {
        d.kill();
        let _ = rx.recv_timeout(Duration::from_secs(30));
        panic!(
            "{label}: the storm, the listing or the FORGETs did not finish within {MOUNT_WORK_TIMEOUT:?} (daemon killed)"
        );
    }
    let got = match work.join() {
        Ok(got) => got,
        Err(p) => std::panic::resume_unwind(p),
    };
    assert_eq!(got, want, "{label} after the storm differs from the model");
    let exit = d.finish();
    assert!(
        exit.status.is_some_and(|s| s.success()),
        "{label} did not exit cleanly: {:?}\n{}",
        exit.status,
        exit.output_tail
    );
    let stats = exit.stats();
    let live = stats.get("live_nodes").and_then(Json::as_u64);
    let open = stats.get("open_files").and_then(Json::as_u64);
    assert_eq!(
        (live, open),
        (Some(1), Some(0)),
        "{label}: after drop_caches and unmount the daemon still held nodes or files \
         (live_nodes counts the root); stats: {stats:?}"
    );
    assert!(exit.op("FORGET", "count") + exit.op("BATCH_FORGET", "count") > 0);
}

#[test]
fn rename_storm_then_every_node_forgotten_nodefs() {
    storm_on(Fs::Nodefs(""));
}

#[test]
fn rename_storm_then_every_node_forgotten_pathfs() {
    storm_on(Fs::Pathfs(""));
}

// ---- the node layer with passthrough files ----

mod passthrough_node {
    use fuse_wire::node::{DirFill, Node, NodeFs, NodeOptions, NodeRef, OpenFile, Opened};
    use fuse_wire::{Errno, FileAttr, FileKind, OpenFlags, RequestContext};
    use std::ffi::CStr;
    use std::fs::File;
    use std::os::fd::AsFd;
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::Duration;

    /// A file whose content is a file of this machine, opened in
    /// passthrough mode.
    pub struct Backed(pub PathBuf);
    struct Unused;
    impl OpenFile for Unused {}

    impl Node for Backed {
        fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
            let m = std::fs::metadata(&self.0)?;
            Ok(FileAttr::fixed(0, FileKind::RegularFile, 0o666).with_size(m.len()))
        }
        fn open(&self, ctx: &RequestContext<'_>, _: OpenFlags) -> Result<Opened, Errno> {
            // Every open offers a backing file of its own; the layer keeps
            // the first for all opens of the node while one is open.
            let f = File::options().read(true).write(true).open(&self.0)?;
            let b = ctx.open_backing(f.as_fd()).map_err(|e| {
                eprintln!("open_backing: {e}");
                Errno::EIO
            })?;
            Ok(Opened::new(Unused).passthrough(b))
        }
    }

    pub struct Root(pub NodeRef);
    impl Node for Root {
        fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
            Ok(FileAttr::fixed(0, FileKind::Directory, 0o755))
        }
        fn lookup(&self, _: &RequestContext<'_>, name: &CStr) -> Result<NodeRef, Errno> {
            match name.to_bytes() {
                b"data" => Ok(self.0.clone()),
                _ => Err(Errno::ENOENT),
            }
        }
        fn readdir(
            &self,
            _: &RequestContext<'_>,
            offset: u64,
            out: &mut DirFill<'_, '_>,
        ) -> Result<(), Errno> {
            if offset == 0 {
                // The only entry: if it does not fit, the kernel asks
                // again from 0, so there is nothing to stop.
                let _ = out.add(b"data", 1, &self.0);
            }
            Ok(())
        }
    }

    pub fn fs(backing: PathBuf) -> NodeFs {
        let opts = NodeOptions {
            passthrough: true,
            attr_ttl: Duration::ZERO,
            ..NodeOptions::default()
        };
        NodeFs::with_options(Arc::new(Root(Arc::new(Backed(backing)))), opts)
    }
}

#[test]
fn node_layer_files_in_passthrough_mode() {
    use std::io::{Read, Seek, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    if !common::require_mount_capability() {
        return;
    }
    let mp = common::TempMountpoint::new("layers-pt");
    let backing = mp.root().join("backing");
    fs::write(&backing, b"0123456789").expect("backing file");
    // Bounded: abort our own connection (and fail loudly) if anything hangs.
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let (d, m) = (done.clone(), mp.path().to_path_buf());
    std::thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(120) {
            if d.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("node_layer_files_in_passthrough_mode: timed out; aborting its connection");
        let _ = common::abort_fuse_connection(&m);
        std::process::abort();
    });
    let config = fuse_wire::SessionConfig {
        workers: 2,
        transport: common::test_transport(),
        ..fuse_wire::SessionConfig::default()
    };
    let running = fuse_wire::spawn(
        passthrough_node::fs(backing.clone()),
        mp.path(),
        &fuse_wire::MountOptions::default(),
        config,
    )
    .expect("mount");
    // INIT is answered by the session's thread: wait (bounded) for it.
    let start = Instant::now();
    while running.handle().negotiated().is_none() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let granted = running
        .handle()
        .negotiated()
        .is_some_and(|n| n.flags.contains(fuse_wire::InitFlags::PASSTHROUGH));
    assert!(granted, "the kernel did not grant PASSTHROUGH");
    let data = mp.path().join("data");
    // Two opens at once, one read-write and one read-only: the kernel
    // refuses a second backing file for the inode, so the layer must give
    // both the first one.
    let mut rw = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&data)
        .expect("open rw");
    let mut ro = fs::File::open(&data).expect("open ro while rw is open");
    rw.write_all(b"abc").expect("write");
    rw.flush().expect("flush");
    let mut s = String::new();
    ro.read_to_string(&mut s).expect("read");
    assert_eq!(s, "abc3456789");
    rw.seek(std::io::SeekFrom::Start(8)).expect("seek");
    rw.write_all(b"XYZ").expect("write past the end");
    drop((rw, ro));
    assert_eq!(fs::read(&backing).expect("backing"), b"abc34567XYZ");
    assert_eq!(fs::read(&data).expect("reopen"), b"abc34567XYZ");
    let stats = running.handle().stats();
    let count = |op: &str| stats.ops.get(op).map_or(0, |o| o.count);
    assert_eq!(
        (count("READ"), count("WRITE")),
        (0, 0),
        "reads and writes reached the daemon instead of the backing file"
    );
    assert!(count("OPEN") >= 3);
    drop(running);
    done.store(true, Ordering::Release);
}

// ---- a chain of directories deeper than one path can name ----

/// Levels of the chain. Its path from the top (names of one or two bytes and
/// their slashes) is some 6,700 bytes, over one and a half times
/// `PATH_MAX`: no single system call can name its bottom, in the test
/// process nor in the daemon, and a path the daemon builds in pieces of
/// `PATH_MAX` needs two. (Each step costs time in proportion to its depth,
/// so the whole chain costs the square of it: this depth keeps the test
/// within a minute or so on a busy 2-CPU machine.)
const DEPTH: usize = 2500;
/// The level renamed while the chain stands.
const MID: usize = DEPTH / 2;
/// Everything done through the mount in the deep-chain test.
const DEEP_TIMEOUT: Duration = Duration::from_secs(480);

/// The name of level `i`: one or two bytes.
fn level_name(i: usize) -> String {
    let c = (b'a' + (i % 26) as u8) as char;
    if i.is_multiple_of(3) {
        c.to_string()
    } else {
        format!("{c}{}", i % 10)
    }
}

/// The outcome of each step, to compare between a plain directory and a
/// mount; `FAILED` marks a step expected to succeed that did not.
#[derive(Default)]
struct Steps(Vec<String>);

impl Steps {
    /// A step that must succeed; its value logged with `show`.
    fn ok<T>(&mut self, what: &str, r: Result<T, i32>, show: impl FnOnce(&T) -> String) -> Option<T> {
        match r {
            Ok(v) => {
                self.0.push(format!("{what}: {}", show(&v)));
                Some(v)
            }
            Err(e) => {
                self.0.push(format!("{what}: FAILED {}", errno_name(e)));
                None
            }
        }
    }

    /// A step whose value is not compared, only its success.
    fn done<T>(&mut self, what: &str, r: Result<T, i32>) -> Option<T> {
        self.ok(what, r, |_| "ok".into())
    }
}

fn cname(s: &str) -> std::ffi::CString {
    std::ffi::CString::new(s).expect("name without NUL")
}

/// `openat(2)` relative to `dir`.
fn open_at(dir: &Fd, name: &str, flags: i32, mode: u32) -> Result<Fd, i32> {
    let c = cname(name);
    // SAFETY: a descriptor we hold and a valid C string.
    let fd = unsafe { libc::openat(dir.0, c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    chk(fd as i64).map(|fd| Fd(fd as i32))
}

/// A directory below `dir`, opened `O_PATH`.
fn dir_at(dir: &Fd, name: &str) -> Result<Fd, i32> {
    open_at(dir, name, libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)
}

/// `fstatat(2)` without following a symbolic link, as [`shape`], with the
/// modification time when `mtime` (for a time the test set).
fn shape_at(dir: &Fd, name: &str, mtime: bool) -> Result<String, i32> {
    let c = cname(name);
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor we hold, a valid C string and a stat to fill.
    chk(unsafe { libc::fstatat(dir.0, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } as i64)?;
    Ok(match mtime {
        true => format!("{} mtime={}", shape(&st), st.st_mtime),
        false => shape(&st),
    })
}

fn mkdir_at(dir: &Fd, name: &str) -> Result<i64, i32> {
    let c = cname(name);
    // SAFETY: a descriptor we hold and a valid C string.
    chk(unsafe { libc::mkdirat(dir.0, c.as_ptr(), 0o755) } as i64)
}

fn unlink_at(dir: &Fd, name: &str, flags: i32) -> Result<i64, i32> {
    let c = cname(name);
    // SAFETY: a descriptor we hold and a valid C string.
    chk(unsafe { libc::unlinkat(dir.0, c.as_ptr(), flags) } as i64)
}

fn rename_at(from: &Fd, a: &str, to: &Fd, b: &str) -> Result<i64, i32> {
    let (a, b) = (cname(a), cname(b));
    // SAFETY: descriptors we hold and valid C strings.
    chk(unsafe { libc::renameat(from.0, a.as_ptr(), to.0, b.as_ptr()) } as i64)
}

/// The names in the directory `dir` (without the dots), sorted.
fn list_at(dir: &Fd) -> Result<Vec<String>, i32> {
    let fd = open_at(dir, ".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    // SAFETY: a descriptor we own, handed to the stream (closed by closedir).
    let stream = unsafe { libc::fdopendir(fd.0) };
    if stream.is_null() {
        return Err(errno());
    }
    std::mem::forget(fd);
    let mut names = Vec::new();
    loop {
        // SAFETY: an open stream; the entry is read before the next call.
        let e = unsafe { libc::readdir(stream) };
        if e.is_null() {
            break;
        }
        // SAFETY: readdir returned an entry with a NUL-terminated name.
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
        let name = name.to_string_lossy().into_owned();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    // SAFETY: closing the stream opened above.
    unsafe { libc::closedir(stream) };
    names.sort();
    Ok(names)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What the bottom of the chain (`bottom`, its parent `up`) must serve:
/// create, write, open, read, getattr, setattr by name (mode, times, size),
/// xattrs, symlink and readlink, link, mknod, rename in and across
/// directories, readdir, statfs; then renames of a middle level and of the
/// top (`mid_parent` holds the middle level's name, `top` level 0's) with
/// the bottom served at its new path, and everything at the bottom removed.
fn deep_bottom(log: &mut Steps, top: &Fd, mid_parent: &Fd, names: &mut [String], bottom: &Fd) {
    let Some(f) = log.done(
        "create f",
        open_at(bottom, "f", libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644),
    ) else {
        return;
    };
    log.ok("write f", pwrite(&f, b"at the bottom\n", 0), |n| n.to_string());
    drop(f);
    if let Some(f) = log.done("open f", open_at(bottom, "f", libc::O_RDONLY, 0)) {
        log.ok("read f", pread(&f, 100, 0), |b| text(b));
        let x = cname("user.deep");
        // SAFETY: a descriptor we hold, valid C strings and a value of the length given.
        let r = unsafe { libc::fsetxattr(f.0, x.as_ptr(), b"v1".as_ptr().cast(), 2, 0) };
        log.done("setxattr", chk(r as i64));
        let mut buf = [0u8; 64];
        // SAFETY: a descriptor we hold, a valid C string and a buffer of the length given.
        let r = unsafe { libc::fgetxattr(f.0, x.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        log.ok("getxattr", chk(r as i64), |n| text(&buf[..*n as usize]));
        let mut list = [0u8; 256];
        // SAFETY: a descriptor we hold and a buffer of the length given.
        let r = unsafe { libc::flistxattr(f.0, list.as_mut_ptr().cast(), list.len()) };
        let listed = chk(r as i64).map(|n| {
            let mut v: Vec<String> = list[..n as usize]
                .split(|&b| b == 0)
                .filter(|s| s.starts_with(b"user."))
                .map(text)
                .collect();
            v.sort();
            v
        });
        log.ok("listxattr", listed, |v| format!("{v:?}"));
        // SAFETY: a descriptor we hold and a valid C string.
        let r = unsafe { libc::fremovexattr(f.0, x.as_ptr()) };
        log.done("removexattr", chk(r as i64));
    }
    log.ok("stat f", shape_at(bottom, "f", false), String::clone);
    let c = cname("f");
    // SAFETY: a descriptor we hold and a valid C string.
    let r = unsafe { libc::fchmodat(bottom.0, c.as_ptr(), 0o640, 0) };
    log.done("chmod f", chk(r as i64));
    if let Some(p) = log.done("open f O_PATH", open_at(bottom, "f", libc::O_PATH, 0)) {
        // truncate(2) by name (SETATTR without a file handle), naming the
        // node through its descriptor: no path could reach it.
        let proc = cname(&format!("/proc/self/fd/{}", p.0));
        // SAFETY: a valid C string.
        let r = unsafe { libc::truncate(proc.as_ptr(), 6) };
        log.done("truncate f", chk(r as i64));
    }
    let t = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 1_200_000_000,
            tv_nsec: 0,
        },
    ];
    // SAFETY: a descriptor we hold, a valid C string and two timespecs.
    let r = unsafe { libc::utimensat(bottom.0, c.as_ptr(), t.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
    log.done("utimensat f", chk(r as i64));
    log.ok("stat f", shape_at(bottom, "f", true), String::clone);

    let (target, l) = (cname("some/target"), cname("l"));
    // SAFETY: a descriptor we hold and valid C strings.
    let r = unsafe { libc::symlinkat(target.as_ptr(), bottom.0, l.as_ptr()) };
    log.done("symlink l", chk(r as i64));
    let mut buf = [0u8; 64];
    // SAFETY: a descriptor we hold, a valid C string and a buffer of the length given.
    let r = unsafe { libc::readlinkat(bottom.0, l.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    log.ok("readlink l", chk(r as i64), |n| text(&buf[..*n as usize]));
    let h = cname("h");
    // SAFETY: a descriptor we hold and valid C strings.
    let r = unsafe { libc::linkat(bottom.0, c.as_ptr(), bottom.0, h.as_ptr(), 0) };
    log.done("link f h", chk(r as i64));
    log.ok("stat h", shape_at(bottom, "h", true), String::clone);
    log.done("unlink h", unlink_at(bottom, "h", 0));
    let p = cname("p");
    // SAFETY: a descriptor we hold and a valid C string.
    let r = unsafe { libc::mknodat(bottom.0, p.as_ptr(), libc::S_IFIFO | 0o600, 0) };
    log.done("mknod p", chk(r as i64));
    log.ok("stat p", shape_at(bottom, "p", false), String::clone);

    log.done("mkdir s", mkdir_at(bottom, "s"));
    log.done("rename f g", rename_at(bottom, "f", bottom, "g"));
    if let Some(s) = log.done("open s", dir_at(bottom, "s")) {
        log.done("rename g s/g", rename_at(bottom, "g", &s, "g"));
        log.ok("list s", list_at(&s), |v| format!("{v:?}"));
        log.done("rename s/g g", rename_at(&s, "g", bottom, "g"));
    }
    if let Some(up) = log.done("open ..", dir_at(bottom, "..")) {
        log.done("rename g ../g", rename_at(bottom, "g", &up, "g"));
        log.ok("stat ../g", shape_at(&up, "g", true), String::clone);
        log.done("rename ../g g", rename_at(&up, "g", bottom, "g"));
    }
    log.ok("list bottom", list_at(bottom), |v| format!("{v:?}"));
    // SAFETY: all-zero is a valid statvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor we hold and a statvfs to fill.
    let r = unsafe { libc::fstatvfs(bottom.0, &mut st) };
    log.done("statfs bottom", chk(r as i64));

    // Renames above: the bottom keeps working at its new path.
    log.done(
        "rename the middle level",
        rename_at(mid_parent, &names[MID], mid_parent, "zz"),
    );
    names[MID] = "zz".into();
    log.done("rename the top level", rename_at(top, &names[0], top, "t"));
    names[0] = "t".into();
    log.ok(
        "stat g after the renames",
        shape_at(bottom, "g", true),
        String::clone,
    );
    if let Some(g) = log.done(
        "open g after the renames",
        open_at(bottom, "g", libc::O_RDONLY, 0),
    ) {
        log.ok("read g", pread(&g, 100, 0), |b| text(b));
    }
    for (name, flags) in [("g", 0), ("l", 0), ("p", 0), ("s", libc::AT_REMOVEDIR)] {
        log.done(&format!("remove {name}"), unlink_at(bottom, name, flags));
    }
    log.ok("list bottom", list_at(bottom), |v| format!("{v:?}"));
}

/// Builds the chain below `top` one level at a time (each `mkdirat` and
/// `openat` relative to the level above), works at its bottom
/// ([`deep_bottom`]), and removes it from the bottom up (through `..`).
fn deep_chain(top: &Path) -> Vec<String> {
    let mut log = Steps::default();
    let top = open(top, libc::O_PATH | libc::O_DIRECTORY, 0).expect("open the top");
    let mut names: Vec<String> = (0..DEPTH).map(level_name).collect();
    let mut cur = dir_at(&top, ".").expect("open the top again");
    let mut mid_parent = None;
    let mut built = 0;
    for (i, name) in names.iter().enumerate() {
        if i == MID {
            mid_parent = dir_at(&cur, ".").ok();
        }
        match mkdir_at(&cur, name).and_then(|_| dir_at(&cur, name)) {
            Ok(fd) => {
                cur = fd;
                built += 1;
            }
            Err(e) => {
                log.0.push(format!("mkdir level {i}: FAILED {}", errno_name(e)));
                break;
            }
        }
    }
    log.0.push(format!("levels built: {built}"));
    match (&mid_parent, built == DEPTH) {
        (Some(mid), true) => deep_bottom(&mut log, &top, mid, &mut names, &cur),
        _ => log.0.push("the bottom was not reached: FAILED".into()),
    }
    let mut removed = 0;
    for i in (0..built).rev() {
        let up = match dir_at(&cur, "..") {
            Ok(up) => up,
            Err(e) => {
                log.0
                    .push(format!("open .. of level {i}: FAILED {}", errno_name(e)));
                break;
            }
        };
        if let Err(e) = unlink_at(&up, &names[i], libc::AT_REMOVEDIR) {
            log.0.push(format!("rmdir level {i}: FAILED {}", errno_name(e)));
            break;
        }
        cur = up;
        removed += 1;
    }
    log.0.push(format!("levels removed: {removed}"));
    log.ok("list the top", list_at(&top), |v| format!("{v:?}"));
    let same = fstat(&cur).and_then(|a| fstat(&top).map(|b| (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)));
    log.ok("back at the top", same, |s| s.to_string());
    log.0
}

/// pathfs serves a chain of directories as deep as the source holds, far
/// past what one path can name (`PATH_MAX`): every operation at its
/// bottom gives what it gives on a plain directory.
#[test]
fn chain_deeper_than_path_max_pathfs() {
    if !common::require_mount_capability() {
        return;
    }
    let plain = TempBase::new("layers-deep-plain");
    let want = deep_chain(&plain.subdir("root"));
    let failed: Vec<&String> = want.iter().filter(|l| l.contains("FAILED")).collect();
    assert!(failed.is_empty(), "the plain directory failed: {failed:#?}");

    let mut d = Daemon::start(Fs::Pathfs(""));
    let (mnt, label) = (d.mnt.clone(), d.label().to_string());
    let (tx, rx) = std::sync::mpsc::channel();
    let work = std::thread::spawn(move || {
        let got = deep_chain(&mnt);
        let _ = tx.send(());
        got
    });
    if rx.recv_timeout(DEEP_TIMEOUT).is_err() && !work.is_finished() {
        d.kill();
        let _ = rx.recv_timeout(Duration::from_secs(30));
        panic!("{label}: the deep chain did not finish within {DEEP_TIMEOUT:?} (daemon killed)");
    }
    let got = match work.join() {
        Ok(got) => got,
        Err(p) => std::panic::resume_unwind(p),
    };
    let diff: Vec<String> = want
        .iter()
        .zip(&got)
        .filter(|(w, g)| w != g)
        .take(10)
        .map(|(w, g)| format!("plain: {w}\n{label}: {g}"))
        .collect();
    assert!(
        diff.is_empty() && want.len() == got.len(),
        "{label} differs from a plain directory:\n{}\n(plain: {} steps, {label}: {})",
        diff.join("\n"),
        want.len(),
        got.len()
    );
    let exit = d.finish();
    assert!(
        exit.status.is_some_and(|s| s.success()),
        "{label} did not exit cleanly: {:?}\n{}",
        exit.status,
        exit.output_tail
    );
}

/// pathfs takes passthrough_ll's command-line conventions: `-f` (it always
/// runs in the foreground), `-d` (debug logging), `--help`.
#[test]
fn pathfs_takes_the_common_command_line() {
    if !common::require_mount_capability() {
        return;
    }
    let help = Command::new(example_binary("pathfs"))
        .arg("--help")
        .output()
        .expect("run pathfs --help");
    let usage = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.status.success() && usage.starts_with("usage: pathfs [-f] [-d]"),
        "pathfs --help: {:?}\n{usage}",
        help.status
    );
    for (extra, debug) in [(&["-f", "-d"][..], true), (&["-f"][..], false)] {
        let d = Daemon::start_with(Fs::Pathfs(""), extra);
        fs::write(d.mnt.join("f"), b"x").expect("write through the mount");
        assert_eq!(
            fs::read(d.source.as_ref().expect("source").join("f")).expect("read the source"),
            b"x"
        );
        let exit = d.finish();
        assert!(
            exit.status.is_some_and(|s| s.success()),
            "pathfs {extra:?} did not exit cleanly: {:?}\n{}",
            exit.status,
            exit.output_tail
        );
        assert_eq!(
            exit.output_tail.contains("[DEBUG "),
            debug,
            "pathfs {extra:?}: debug lines in its output are expected {debug}:\n{}",
            exit.output_tail
        );
    }
}

/// pathfs leaves set-ID bits to the kernel, which clears them with a
/// SETATTR of the mode after it let a caller who does not own the file
/// write, truncate, fallocate or copy into it. That SETATTR (only set-ID
/// bits dropped) is allowed to a caller who may write the file; the change
/// itself succeeds and the bits go, as on a plain directory. A chmod by a
/// non-owner that only drops set-ID bits is still refused.
#[test]
fn pathfs_non_owner_writes_clear_set_id_bits() {
    if !common::require_mount_capability() {
        return;
    }
    let plain = TempBase::new("layers-setid-plain");
    let want = setid_steps(&plain.subdir("root"), None);
    let d = Daemon::start(Fs::Pathfs(""));
    let got = setid_steps(&d.mnt, d.source.as_deref());
    let label = d.label().to_string();
    let exit = d.finish();
    assert_eq!(want, got, "{label} against a plain directory");
    assert!(
        want.iter().any(|l| l.contains("ok") && l.contains("mode 777")),
        "the plain directory cleared nothing: {want:#?}"
    );
    assert!(
        exit.status.is_some_and(|s| s.success()),
        "{label}: {}",
        exit.output_tail
    );
}

/// One step of [`setid_steps`] on a file.
type SetidOp = fn(&Path) -> std::io::Result<()>;

fn setid_steps(root: &Path, source: Option<&Path>) -> Vec<String> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut log = Vec::new();
    let mk = |name: &str, mode: u32| {
        let p = root.join(name);
        fs::write(&p, vec![b'x'; 8192]).expect("create");
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).expect("chmod");
        p
    };
    let ops: [(&str, u32, SetidOp); 6] = [
        ("append", 0o6777, |p| {
            use std::io::Write;
            fs::OpenOptions::new().append(true).open(p)?.write_all(b"more")
        }),
        ("O_DIRECT write", 0o4777, |p| {
            use std::os::unix::fs::FileExt;
            let f = fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(p)?;
            // An aligned block: 8 KiB in a Vec, written from its first
            // 4 KiB boundary.
            let buf = vec![0u8; 8192];
            let skip = buf.as_ptr().align_offset(4096);
            f.write_all_at(&buf[skip..skip + 4096], 0)
        }),
        ("truncate", 0o2777, |p| {
            fs::OpenOptions::new().write(true).open(p)?.set_len(10)
        }),
        ("fallocate", 0o6777, |p| {
            use std::os::fd::AsRawFd;
            let f = fs::OpenOptions::new().write(true).open(p)?;
            // SAFETY: plain system call on a descriptor we hold.
            match unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 65536) } {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        }),
        ("copy_file_range into", 0o6777, |p| {
            let from = fs::File::open(p.with_file_name("from"))?;
            let to = fs::OpenOptions::new().write(true).open(p)?;
            std::io::copy(&mut &from, &mut &to).map(drop)
        }),
        ("chmod dropping S_ISUID of root's file", 0o4755, |p| {
            fs::set_permissions(p, fs::Permissions::from_mode(0o755))
        }),
    ];
    fs::write(root.join("from"), b"copied").expect("create");
    let files: Vec<_> = ops.iter().map(|(n, m, _)| mk(&n.replace(' ', "_"), *m)).collect();
    for ((what, _, op), p) in ops.iter().zip(&files) {
        let r = as_user(65534, 65534, &[], || op(p));
        let mode = fs::metadata(p).map(|m| format!("{:o}", m.mode() & 0o7777));
        let mode = mode.unwrap_or_else(|e| e.to_string());
        // The source must agree with what the mount shows.
        let backing = source.map(|s| {
            fs::metadata(s.join(p.file_name().expect("name")))
                .map_or_else(|e| e.to_string(), |m| format!("{:o}", m.mode() & 0o7777))
        });
        let differs = backing.filter(|b| *b != mode).map(|b| format!(" (source {b})"));
        log.push(format!(
            "{what}: {}, mode {mode}{}",
            r.map_or_else(|e| format!("error {:?}", e.raw_os_error()), |()| "ok".into()),
            differs.unwrap_or_default()
        ));
    }
    log
}
