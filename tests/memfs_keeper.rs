//! memfs under a keeper (`memfs -o keeper`), on real mounts.
//!
//! - Five graceful upgrades (SIGUSR2 to the keeper) while clients create,
//!   write, append, read back, rename and unlink files, and keep files open
//!   (one of them unlinked): no client error, and after each upgrade every
//!   client checks all its files against what it wrote.
//! - An upgrade with nothing moving changes nothing a client can see:
//!   inode numbers, attributes, contents, extended attributes, directory
//!   listings with their cookies (a listing half read goes on where it
//!   was), statfs, an unlinked open file, a lock held and a lock waited for.
//! - An upgrade to a daemon that refuses the state (its `size=` is below
//!   what the files take): it exits without serving, and the keeper goes
//!   back to the previous binary, which serves every file again.
//! - A crash (SIGKILL of the daemon) loses memfs's files: the successor
//!   starts empty, answers ESTALE for the node ids of the lost files (open
//!   files included), never another file's data, and never reuses them.
//!
//! Every step is bounded: a watchdog aborts the connection when a test
//! runs too long, so that a request nobody answers fails the test instead
//! of hanging it.

mod common;
mod keeper_support;

use common::*;
use keeper_support::*;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `memfs MNT -o keeper,...`.
fn start_memfs(mnt: &Path) -> Keeper {
    Keeper::start_with(
        Command::new(example_binary("memfs"))
            .arg(mnt)
            .args(["-o", "keeper,posix_lock,size=512m,fsname=memfs-keeper"]),
        mnt,
    )
}

/// Aborts the mount's connection if the test is still running at the
/// deadline, so that nothing blocks for ever; says whether it fired.
struct Watchdog {
    done: Arc<AtomicBool>,
    fired: Arc<AtomicBool>,
}

impl Watchdog {
    fn new(mnt: &Path, limit: Duration) -> Watchdog {
        let (done, fired) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (d, f, mnt) = (done.clone(), fired.clone(), mnt.to_path_buf());
        std::thread::spawn(move || {
            let deadline = Instant::now() + limit;
            while !d.load(Ordering::Relaxed) {
                if Instant::now() > deadline {
                    f.store(true, Ordering::Relaxed);
                    let _ = abort_fuse_connection(&mnt);
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Watchdog { done, fired }
    }

    fn fired(&self) -> bool {
        self.fired.load(Ordering::Relaxed)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// SIGUSR2 to the keeper, then waits (10 s at most) until the daemon
/// `old` is gone and another serves; returns the new one.
fn upgrade(keeper: &Keeper, old: u32, seen: &mut Vec<u32>) -> u32 {
    signal(keeper.pid(), libc::SIGUSR2);
    let deadline = Instant::now() + Duration::from_secs(10);
    while children(keeper.pid()).iter().any(|p| *p == old && alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "daemon {old} did not retire 10 s after SIGUSR2"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    seen.push(old);
    daemon_of(keeper.pid(), seen)
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Up to `max - 1` bytes, at least `min`.
    fn some(&mut self, min: u64, max: u64) -> Vec<u8> {
        let n = min + self.below(max);
        self.bytes(n as usize)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let seed = self.next();
        (0..n)
            .map(|i| (seed.wrapping_mul(i as u64 + 1) >> 24) as u8)
            .collect()
    }
}

/// A file kept open by a client throughout, with what it should hold.
struct Held {
    file: File,
    data: Vec<u8>,
    what: &'static str,
}

impl Held {
    fn write_some(&mut self, rng: &mut Rng) -> io::Result<()> {
        let off = rng.below(self.data.len() as u64 + 1) as usize;
        let chunk = rng.some(1, 9000);
        self.file.write_all_at(&chunk, off as u64)?;
        if self.data.len() < off + chunk.len() {
            self.data.resize(off + chunk.len(), 0);
        }
        self.data[off..off + chunk.len()].copy_from_slice(&chunk);
        Ok(())
    }

    fn check(&self) -> Result<(), String> {
        let mut got = vec![0u8; self.data.len() + 10];
        let n = read_all_at(&self.file, &mut got).map_err(|e| format!("{}: read: {e}", self.what))?;
        if got[..n] != self.data[..] {
            return Err(format!(
                "{}: {n} bytes read, {} expected, or they differ",
                self.what,
                self.data.len()
            ));
        }
        Ok(())
    }
}

fn read_all_at(f: &File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// One client: its own directory, the files it made with their contents,
/// and two files it keeps open (the second unlinked at once).
struct Client {
    dir: PathBuf,
    files: BTreeMap<String, Vec<u8>>,
    held: Vec<Held>,
    next: u64,
    rng: Rng,
}

impl Client {
    fn new(mnt: &Path, id: u64) -> io::Result<Client> {
        let dir = mnt.join(format!("client{id}"));
        fs::create_dir(&dir)?;
        let open = |name: &str| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(dir.join(name))
        };
        let kept = open("kept-open")?;
        let gone = open("unlinked-open")?;
        fs::remove_file(dir.join("unlinked-open"))?;
        let held = vec![
            Held {
                file: kept,
                data: Vec::new(),
                what: "the file kept open",
            },
            Held {
                file: gone,
                data: Vec::new(),
                what: "the unlinked open file",
            },
        ];
        Ok(Client {
            dir,
            files: BTreeMap::new(),
            held,
            next: 0,
            rng: Rng(0x9e37_79b9_7f4a_7c15 ^ (id + 1)),
        })
    }

    fn pick(&mut self) -> Option<String> {
        let n = self.files.len() as u64;
        (n > 0).then(|| {
            let i = self.rng.below(n) as usize;
            self.files.keys().nth(i).cloned().unwrap_or_default()
        })
    }

    fn new_name(&mut self) -> String {
        self.next += 1;
        format!("f{}", self.next)
    }

    /// One operation; an error names it.
    fn step(&mut self) -> Result<(), String> {
        let op = self.rng.below(9);
        fn ctx<'a>(what: &'a str, name: &'a str) -> impl Fn(io::Error) -> String + 'a {
            move |e| format!("{what} {name}: {e}")
        }
        match (op, self.pick()) {
            (0 | 1, _) | (_, None) => {
                let name = self.new_name();
                let data = self.rng.some(0, 20_000);
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(self.dir.join(&name))
                    .map_err(ctx("create", &name))?;
                f.write_all(&data).map_err(ctx("write", &name))?;
                f.sync_all().map_err(ctx("fsync", &name))?;
                drop(f);
                self.files.insert(name.clone(), data);
                self.verify(&name)
            }
            (2, Some(name)) => {
                let chunk = self.rng.some(1, 5000);
                let mut f = OpenOptions::new()
                    .append(true)
                    .open(self.dir.join(&name))
                    .map_err(ctx("open to append", &name))?;
                f.write_all(&chunk).map_err(ctx("append to", &name))?;
                self.files.entry(name).or_default().extend_from_slice(&chunk);
                Ok(())
            }
            (3, Some(name)) => {
                let data = self.files.get_mut(&name).ok_or("lost track")?;
                let off = self.rng.below(data.len() as u64 + 1) as usize;
                let chunk = self.rng.some(1, 5000);
                let f = OpenOptions::new()
                    .write(true)
                    .open(self.dir.join(&name))
                    .map_err(ctx("open to write", &name))?;
                f.write_all_at(&chunk, off as u64)
                    .map_err(ctx("pwrite to", &name))?;
                if data.len() < off + chunk.len() {
                    data.resize(off + chunk.len(), 0);
                }
                data[off..off + chunk.len()].copy_from_slice(&chunk);
                Ok(())
            }
            (4, Some(name)) => {
                let to = self.new_name();
                fs::rename(self.dir.join(&name), self.dir.join(&to)).map_err(ctx("rename", &name))?;
                let data = self.files.remove(&name).unwrap_or_default();
                self.files.insert(to, data);
                Ok(())
            }
            (5, Some(name)) if self.files.len() > 3 => {
                fs::remove_file(self.dir.join(&name)).map_err(ctx("unlink", &name))?;
                self.files.remove(&name);
                Ok(())
            }
            (6, Some(name)) => self.verify(&name),
            (_, _) => {
                let i = self.rng.below(2) as usize;
                let h = &mut self.held[i];
                let what = h.what;
                h.write_some(&mut self.rng)
                    .map_err(|e| format!("{what}: write: {e}"))?;
                self.held[i].check()
            }
        }
    }

    fn verify(&self, name: &str) -> Result<(), String> {
        let got = fs::read(self.dir.join(name)).map_err(|e| format!("read {name}: {e}"))?;
        if Some(&got) != self.files.get(name) {
            return Err(format!("{name}: wrong contents ({} bytes)", got.len()));
        }
        Ok(())
    }

    /// Everything: the directory holds the files made and no other, each
    /// with its contents; the open files hold theirs.
    fn verify_all(&self) -> Result<(), String> {
        let mut names: Vec<String> = fs::read_dir(&self.dir)
            .map_err(|e| format!("list {}: {e}", self.dir.display()))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<io::Result<_>>()
            .map_err(|e| format!("list {}: {e}", self.dir.display()))?;
        names.retain(|n| n != "kept-open");
        names.sort();
        let want: Vec<&String> = self.files.keys().collect();
        if names.iter().collect::<Vec<_>>() != want {
            return Err(format!("{}: lists {names:?}, made {want:?}", self.dir.display()));
        }
        for name in self.files.keys() {
            self.verify(name)?;
        }
        for h in &self.held {
            h.check()?;
        }
        let gone = self.held[1].file.metadata().map_err(|e| format!("fstat: {e}"))?;
        if gone.nlink() != 0 {
            return Err(format!("the unlinked open file has {} links", gone.nlink()));
        }
        Ok(())
    }
}

#[test]
fn upgrades_under_load_lose_nothing() {
    upgrades_under_load(5, 200, 1);
}

/// Upgrades back to back, each sent as soon as the last one's daemon is
/// there (while it may still be starting): a retire that reaches a daemon
/// before it serves must be kept, not lost and then answered with a kill
/// of the only holder of the files (which emptied the filesystem in 5 of 6
/// runs of 100). Every client checks all its files every tenth upgrade.
#[test]
fn a_hundred_back_to_back_upgrades_under_load_lose_nothing() {
    upgrades_under_load(100, 0, 10);
}

/// `rounds` upgrades under four clients, the clients doing `ops_between`
/// operations before each; every `check_every` upgrades (and at the end)
/// each client checks all its files.
fn upgrades_under_load(rounds: u64, ops_between: u64, check_every: u64) {
    if !require_mount_capability() {
        return;
    }
    let tmp = TempMountpoint::new("memfs-keeper-load");
    let keeper = start_memfs(tmp.path());
    let dog = Watchdog::new(tmp.path(), Duration::from_secs(60 + 3 * rounds));
    let stop = Arc::new(AtomicBool::new(false));
    // The main thread asks for a full check by raising `epoch`; each
    // client does it at its next step and reports in `checked`.
    let epoch = Arc::new(AtomicU64::new(0));
    let checked = Arc::new(AtomicU64::new(0));
    let ops = Arc::new(AtomicU64::new(0));
    const CLIENTS: u64 = 4;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let (stop, epoch, checked, ops) = (stop.clone(), epoch.clone(), checked.clone(), ops.clone());
            let mnt = tmp.path().to_path_buf();
            std::thread::spawn(move || {
                let mut errors = Vec::new();
                let mut c = match Client::new(&mnt, id) {
                    Ok(c) => c,
                    Err(e) => return vec![format!("client {id}: setting up: {e}")],
                };
                let mut seen = 0;
                while !stop.load(Ordering::Relaxed) && errors.len() < 10 {
                    let now = epoch.load(Ordering::Acquire);
                    if now != seen {
                        seen = now;
                        if let Err(e) = c.verify_all() {
                            errors.push(format!("client {id}, check {now}: {e}"));
                        }
                        checked.fetch_add(1, Ordering::AcqRel);
                    }
                    if let Err(e) = c.step() {
                        errors.push(format!("client {id}: {e}"));
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                }
                if let Err(e) = c.verify_all() {
                    errors.push(format!("client {id}, last check: {e}"));
                }
                errors
            })
        })
        .collect();
    let mut seen = Vec::new();
    let mut daemon = daemon_of(keeper.pid(), &seen);
    for round in 1..=rounds {
        // Let the clients work, and upgrade in the middle of it.
        let before = ops.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(20);
        while ops.load(Ordering::Relaxed) < before + ops_between.max(1)
            && clients.iter().all(|c| !c.is_finished())
            && Instant::now() < deadline
            && !dog.fired()
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        daemon = upgrade(&keeper, daemon, &mut seen);
        if round % check_every != 0 {
            continue;
        }
        // Every client checks all its files against the new daemon.
        let check = round / check_every;
        epoch.store(check, Ordering::Release);
        let deadline = Instant::now() + Duration::from_secs(30);
        while checked.load(Ordering::Acquire) < check * CLIENTS
            && clients.iter().all(|c| !c.is_finished())
            && Instant::now() < deadline
            && !dog.fired()
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut errors: Vec<String> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap_or_default())
        .collect();
    if dog.fired() {
        errors.push("the test ran past its limit: the connection was aborted".into());
    }
    drop(dog);
    let log = keeper.stop();
    assert!(
        errors.is_empty(),
        "clients saw errors across {rounds} upgrades: {errors:#?}\nkeeper log:\n{log}"
    );
    assert_eq!(
        checked.load(Ordering::Relaxed),
        rounds / check_every * CLIENTS,
        "not every client checked its files after every upgrade"
    );
    // The spaced upgrades leave the clients `ops_between` each; back to
    // back, the clients must still be at work through the upgrades.
    let ran = ops.load(Ordering::Relaxed);
    assert!(
        ran >= 1000.min(rounds * ops_between).max(rounds),
        "the clients hardly ran ({ran} operations over {rounds} upgrades)"
    );
    assert_eq!(
        log.matches("upgrade requested").count(),
        rounds as usize,
        "the keeper's log:\n{log}"
    );
    assert_eq!(
        log.matches("restored").count(),
        rounds as usize,
        "the keeper's log:\n{log}"
    );
    assert!(
        !log.contains("the retiring daemon") && !log.contains("refusing") && !log.contains("upgrade off"),
        "a daemon did not retire or restore cleanly; the keeper's log:\n{log}"
    );
}

/// `struct linux_dirent64` entries of one getdents64 call on `fd` into a
/// buffer of `len` bytes: (name, inode, offset cookie).
fn getdents(fd: i32, len: usize) -> io::Result<Vec<(String, u64, i64)>> {
    let mut buf = vec![0u8; len];
    // SAFETY: getdents64 into a live buffer of `len` bytes.
    let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), len) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 19 < n as usize {
        let ino = u64::from_ne_bytes(buf[at..at + 8].try_into().unwrap());
        let off = i64::from_ne_bytes(buf[at + 8..at + 16].try_into().unwrap());
        let reclen = u16::from_ne_bytes(buf[at + 16..at + 18].try_into().unwrap()) as usize;
        let name = &buf[at + 19..at + reclen];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        out.push((String::from_utf8_lossy(name).into_owned(), ino, off));
        at += reclen;
    }
    Ok(out)
}

/// A directory's whole listing, with cookies.
fn listing(dir: &Path) -> Vec<(String, u64, i64)> {
    let f = File::open(dir).unwrap_or_else(|e| panic!("open {}: {e}", dir.display()));
    let mut all = Vec::new();
    loop {
        let part =
            getdents(f.as_raw_fd(), 4096).unwrap_or_else(|e| panic!("getdents {}: {e}", dir.display()));
        if part.is_empty() {
            return all;
        }
        all.extend(part);
    }
}

fn xattrs(path: &Path) -> Vec<(String, Vec<u8>)> {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 65536];
    // SAFETY: llistxattr into a live buffer of its length.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(
        n >= 0,
        "listxattr {}: {}",
        path.display(),
        io::Error::last_os_error()
    );
    names.truncate(n as usize);
    names
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|name| {
            let cn = CString::new(name).unwrap();
            let mut v = vec![0u8; 65536];
            // SAFETY: lgetxattr into a live buffer of its length.
            let k = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
            assert!(
                k >= 0,
                "getxattr {}: {}",
                path.display(),
                io::Error::last_os_error()
            );
            v.truncate(k as usize);
            (String::from_utf8_lossy(name).into_owned(), v)
        })
        .collect()
}

/// Everything a client sees of the tree below `dir`, a line per name.
fn snapshot(dir: &Path, out: &mut Vec<String>) {
    for (name, ino, off) in listing(dir) {
        if name == "." || name == ".." {
            out.push(format!("{} {name} ino {ino} cookie {off}", dir.display()));
            continue;
        }
        let p = dir.join(&name);
        let m = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
        let what = if m.is_file() {
            let data = fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
            format!(
                "sum {}",
                data.iter()
                    .fold(0u64, |s, &b| s.wrapping_mul(31).wrapping_add(b as u64))
            )
        } else if m.file_type().is_symlink() {
            format!("-> {:?}", fs::read_link(&p).unwrap())
        } else {
            String::new()
        };
        out.push(format!(
            "{} cookie {off} ino {ino}/{} mode {:o} nlink {} uid {} gid {} size {} blocks {} rdev {} mtime {}.{} ctime {}.{} atime {}.{} {what} xattrs {:?}",
            p.display(),
            m.ino(),
            m.mode(),
            m.nlink(),
            m.uid(),
            m.gid(),
            m.size(),
            m.blocks(),
            m.rdev(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
            m.atime(),
            m.atime_nsec(),
            xattrs(&p)
        ));
        if m.is_dir() {
            snapshot(&p, out);
        }
    }
}

fn statfs(mnt: &Path) -> String {
    let c = CString::new(mnt.as_os_str().as_bytes()).unwrap();
    // SAFETY: an all-zero statfs is a valid value of the C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a live C string and a writable struct.
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut st) }, 0, "statfs");
    format!(
        "blocks {} bfree {} files {} ffree {}",
        st.f_blocks, st.f_bfree, st.f_files, st.f_ffree
    )
}

/// An open file description lock (`F_OFD_*`) on all of `f`.
fn ofd_lock(f: &File, cmd: libc::c_int, typ: libc::c_int) -> io::Result<libc::c_short> {
    // SAFETY: an all-zero flock is a valid value of the C struct.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: fcntl with a live flock.
    if unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut fl) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl.l_type)
}

#[test]
fn an_upgrade_changes_nothing_a_client_sees() {
    if !require_mount_capability() {
        return;
    }
    let tmp = TempMountpoint::new("memfs-keeper-still");
    let mnt = tmp.path();
    let keeper = start_memfs(mnt);
    let dog = Watchdog::new(mnt, Duration::from_secs(60));
    // A tree with a bit of everything.
    let d = mnt.join("dir");
    fs::create_dir(&d).unwrap();
    for i in 0..300 {
        fs::write(
            d.join(format!("entry-with-a-longish-name-{i:04}")),
            format!("{i}"),
        )
        .unwrap();
    }
    // Gaps in the cookies: a restore that numbers entries anew shows.
    for i in (0..300).step_by(3) {
        fs::remove_file(d.join(format!("entry-with-a-longish-name-{i:04}"))).unwrap();
    }
    fs::create_dir_all(mnt.join("a/b/c")).unwrap();
    let sparse = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(mnt.join("a/sparse"))
        .unwrap();
    sparse.write_all_at(b"far away", 5 << 20).unwrap();
    sparse.write_all_at(&[7u8; 10000], 4096).unwrap();
    drop(sparse);
    fs::write(mnt.join("a/b/linked"), b"two names").unwrap();
    fs::hard_link(mnt.join("a/b/linked"), mnt.join("a/other-name")).unwrap();
    std::os::unix::fs::symlink("b/c/nowhere", mnt.join("a/link")).unwrap();
    let fifo = CString::new(mnt.join("a/fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: mkfifo with a live C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    let x = CString::new(mnt.join("a/b/linked").as_os_str().as_bytes()).unwrap();
    for (k, v) in [
        ("user.one", &b"1"[..]),
        ("user.big", &[5u8; 3000][..]),
        ("trusted.t", b"t"),
    ] {
        let k = CString::new(k).unwrap();
        // SAFETY: setxattr with live strings and value.
        let r = unsafe { libc::setxattr(x.as_ptr(), k.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
        assert_eq!(r, 0, "setxattr: {}", io::Error::last_os_error());
    }
    fs::set_permissions(
        mnt.join("a/b"),
        std::os::unix::fs::PermissionsExt::from_mode(0o1750),
    )
    .unwrap();
    // An unlinked file kept open.
    let mut gone = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(mnt.join("gone"))
        .unwrap();
    gone.write_all(b"nobody can name me").unwrap();
    fs::remove_file(mnt.join("gone")).unwrap();
    let gone_ino = gone.metadata().unwrap().ino();
    // A lock held (an OFD lock: its owner is the open file), and another
    // open file waiting for it.
    let locked = mnt.join("locked");
    let holder = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&locked)
        .unwrap();
    ofd_lock(&holder, libc::F_OFD_SETLK, libc::F_WRLCK).unwrap();
    let waiter = OpenOptions::new().read(true).write(true).open(&locked).unwrap();
    let prober = OpenOptions::new().read(true).write(true).open(&locked).unwrap();
    let (tx, got_lock) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(ofd_lock(&waiter, libc::F_OFD_SETLKW, libc::F_WRLCK).map(|_| waiter));
    });
    // A listing half read.
    let half = File::open(&d).unwrap();
    let first = getdents(half.as_raw_fd(), 1024).unwrap();
    assert!(
        first.len() > 3 && first.len() < 150,
        "{} entries in the first part",
        first.len()
    );

    let mut before = Vec::new();
    snapshot(mnt, &mut before);
    let statfs_before = statfs(mnt);
    assert_eq!(
        ofd_lock(&prober, libc::F_OFD_GETLK, libc::F_WRLCK).unwrap(),
        libc::F_WRLCK as i16
    );
    // Time for the waiter to be waiting in the daemon (it is fine if not).
    std::thread::sleep(Duration::from_millis(200));

    let mut seen = Vec::new();
    let daemon = daemon_of(keeper.pid(), &seen);
    upgrade(&keeper, daemon, &mut seen);

    // Past the attribute cache (ttl 1 s): the new daemon answers.
    std::thread::sleep(Duration::from_millis(1200));
    let mut after = Vec::new();
    snapshot(mnt, &mut after);
    let statfs_after = statfs(mnt);
    // The listing goes on where it was: no entry twice, none missing.
    let mut rest = Vec::new();
    loop {
        let part = getdents(half.as_raw_fd(), 1024).unwrap();
        if part.is_empty() {
            break;
        }
        rest.extend(part);
    }
    let whole: Vec<_> = first.into_iter().chain(rest).collect();
    let fresh = listing(&d);
    // The unlinked open file, the locks.
    let mut from_start = vec![0u8; 64];
    let n = gone.read_at(&mut from_start, 0).unwrap();
    let gone_meta = gone.metadata().unwrap();
    gone.write_all_at(b"still", 0).unwrap();
    let probe = ofd_lock(&prober, libc::F_OFD_GETLK, libc::F_WRLCK).unwrap();
    let early = got_lock.try_recv().ok();
    ofd_lock(&holder, libc::F_OFD_SETLK, libc::F_UNLCK).unwrap();
    let granted = got_lock.recv_timeout(Duration::from_secs(20));
    let fired = dog.fired();
    drop(dog);
    let log = keeper.stop();

    assert!(!fired, "the test ran past its limit; the keeper's log:\n{log}");
    assert_eq!(
        before, after,
        "the tree changed across the upgrade; the keeper's log:\n{log}"
    );
    assert_eq!(
        whole, fresh,
        "a listing half read before the upgrade did not go on where it was"
    );
    assert_eq!(&from_start[..n], b"nobody can name me", "the unlinked open file");
    assert_eq!((gone_meta.ino(), gone_meta.nlink()), (gone_ino, 0));
    assert_eq!(
        probe,
        libc::F_WRLCK as i16,
        "the lock held before the upgrade is gone"
    );
    assert!(early.is_none(), "the lock waiter got the lock while it was held");
    assert!(
        matches!(granted, Ok(Ok(_))),
        "the lock waiter did not get the lock once released: {:?}",
        granted.map(|r| r.map(drop))
    );
    assert_eq!(statfs_before, statfs_after, "statfs changed across the upgrade");
}

#[test]
fn a_crash_loses_the_files_and_says_so() {
    if !require_mount_capability() {
        return;
    }
    let tmp = TempMountpoint::new("memfs-keeper-crash");
    let mnt = tmp.path();
    let keeper = start_memfs(mnt);
    let dog = Watchdog::new(mnt, Duration::from_secs(60));
    let mut seen = Vec::new();
    let daemon = daemon_of(keeper.pid(), &seen);
    fs::write(mnt.join("a"), b"before the upgrade").unwrap();
    fs::create_dir(mnt.join("d")).unwrap();
    fs::write(mnt.join("d/f"), b"in d").unwrap();
    let open = OpenOptions::new()
        .read(true)
        .write(true)
        .open(mnt.join("a"))
        .unwrap();
    // An upgrade first: the keeper has held a state since, which a daemon
    // started after a crash must not serve.
    let daemon = upgrade(&keeper, daemon, &mut seen);
    open.write_all_at(b"after  the upgrade", 0).unwrap();
    fs::write(mnt.join("b"), b"made after the upgrade").unwrap();
    let mut max_ino = 0;
    for p in ["a", "b", "d", "d/f"] {
        max_ino = max_ino.max(fs::metadata(mnt.join(p)).unwrap().ino());
    }

    signal(daemon, libc::SIGKILL);
    seen.push(daemon);
    daemon_of(keeper.pid(), &seen);

    // A new file first: were node ids given again, the open file's would
    // now be this one's.
    fs::write(mnt.join("new"), b"a new file").unwrap();
    let new_ino = fs::metadata(mnt.join("new")).unwrap().ino();
    let mut buf = vec![0u8; 64];
    let read = open.read_at(&mut buf, 0).map(|n| buf[..n].to_vec());
    let write = open.write_all_at(b"x", 0);
    let stat_a = fs::metadata(mnt.join("a"));
    let read_f = fs::read(mnt.join("d/f"));
    let mut names: Vec<String> = fs::read_dir(mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let new_back = fs::read(mnt.join("new"));
    statfs(mnt);
    let fired = dog.fired();
    drop(dog);
    let log = keeper.stop();

    assert!(!fired, "the test ran past its limit; the keeper's log:\n{log}");
    let errno = |e: Option<&io::Error>| e.and_then(io::Error::raw_os_error);
    let (estale, enoent) = (Some(libc::ESTALE), Some(libc::ENOENT));
    assert_eq!(
        errno(read.as_ref().err()),
        estale,
        "a read of a file open across the crash: {read:?}"
    );
    assert_eq!(
        errno(write.as_ref().err()),
        estale,
        "a write to a file open across the crash: {write:?}"
    );
    let stat_errno = errno(stat_a.as_ref().err());
    assert!(
        stat_errno == estale || stat_errno == enoent,
        "stat of a lost file: {stat_a:?}"
    );
    let read_errno = errno(read_f.as_ref().err());
    assert!(
        read_errno == estale || read_errno == enoent,
        "a lost file in a lost directory: {read_f:?}"
    );
    assert_eq!(names, ["new"], "the root after the crash");
    assert!(
        new_ino > max_ino,
        "node id {new_ino} given again (the lost ones went up to {max_ino})"
    );
    assert_eq!(new_back.unwrap(), b"a new file");
    assert!(
        log.contains("died with its files; starting empty"),
        "the keeper's log:\n{log}"
    );
    // The keeper dropped the state of the upgrade once the daemon served:
    // memfs did not have to notice that it was stale.
    assert!(
        !log.contains("taken by a daemon that died"),
        "the keeper handed a stale state after the crash; its log:\n{log}"
    );
}

/// An upgraded daemon that refuses the state (here: started with a
/// `size=` below what the files take, which memfs refuses as tmpfs refuses
/// such a remount) exits with an error instead of serving, and the keeper
/// goes back to the previous binary, which restores everything.
#[test]
fn a_refused_state_is_not_served_and_the_previous_binary_takes_it() {
    use std::os::unix::fs::PermissionsExt;
    if !require_mount_capability() {
        return;
    }
    let tmp = TempMountpoint::new("memfs-keeper-refused");
    let mnt = tmp.path();
    // The keeper runs a copy of memfs, which the test replaces on disk.
    let program = tmp.root().join("memfs-copy");
    fs::copy(example_binary("memfs"), &program).expect("copy memfs");
    let keeper = Keeper::start_with(
        Command::new(&program)
            .arg(mnt)
            .args(["-o", "keeper,size=512m,fsname=memfs-keeper"]),
        mnt,
    );
    let dog = Watchdog::new(mnt, Duration::from_secs(60));
    let data = Rng(42).bytes(300_000);
    fs::write(mnt.join("big"), &data).unwrap();
    let open = File::open(mnt.join("big")).unwrap();
    // The next build: memfs with room for 64 KiB only.
    let next = tmp.root().join("memfs-next");
    let script = format!(
        "#!/bin/sh\nexec {} \"$@\" -o size=64k\n",
        example_binary("memfs").display()
    );
    fs::write(&next, script).unwrap();
    fs::set_permissions(&next, fs::Permissions::from_mode(0o755)).unwrap();
    fs::rename(&next, &program).unwrap();
    let daemon = daemon_of(keeper.pid(), &[]);
    signal(keeper.pid(), libc::SIGUSR2);
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(daemon) {
        assert!(Instant::now() < deadline, "the daemon did not retire");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Served again (by whoever took over; the watchdog bounds the wait).
    let back = fs::read(mnt.join("big"));
    let mut buf = vec![0u8; data.len() + 1];
    let through_open = read_all_at(&open, &mut buf).map(|n| buf[..n].to_vec());
    let fired = dog.fired();
    drop(dog);
    let log = keeper.stop();
    assert!(!fired, "the test ran past its limit; the keeper's log:\n{log}");
    assert!(
        log.contains("refusing the state handed over at the upgrade: the tree takes"),
        "the new daemon did not refuse the state; the keeper's log:\n{log}"
    );
    assert!(
        log.contains("going back to the previous binary"),
        "the keeper's log:\n{log}"
    );
    assert!(
        back.as_ref().is_ok_and(|b| *b == data),
        "the file after the fallback: {:?} bytes",
        back.map(|b| b.len())
    );
    assert!(
        through_open.as_ref().is_ok_and(|b| *b == data),
        "the file open across the fallback: {:?}",
        through_open.map(|b| b.len())
    );
    assert!(
        !log.contains("died with its files"),
        "the files were lost; the keeper's log:\n{log}"
    );
}
