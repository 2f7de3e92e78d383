//! The new user's trial, on real mounts: the `notes` example program
//! (three generated files, one writable) behaves as a user expects from the
//! shell and leaves no mount behind on SIGINT, SIGTERM or SIGHUP; a
//! READDIRPLUS that skips a name keeps the lookup counts balanced, served
//! through `fuse_wire::spawn`, whose handle unmounts when dropped.
//!
//! Every wait is bounded; a watchdog aborts the FUSE connection of a test
//! that hangs and then the whole process, saying what it waited for.

mod common;

use common::TempMountpoint;
use fuse_wire::reply::{ReplyAttr, ReplyDirectoryPlus, ReplyEntry};
use fuse_wire::{
    DirPlusAdd, Entry, Errno, FileAttr, FileHandle, FileKind, Filesystem, InitConfig, InitFlags, Inode,
    MountOptions, RequestContext, SessionConfig,
};
use std::ffi::CStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

/// Longest a test may run before the watchdog steps in.
const TEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Aborts the mount's connection and the process if `done` is not set in
/// time (a hung FUSE request would otherwise hang the test run).
fn watchdog(mountpoint: PathBuf, what: &'static str) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < TEST_TIMEOUT {
            if d.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "{what}: timed out after {TEST_TIMEOUT:?} on {}; aborting its connection",
            mountpoint.display()
        );
        let _ = common::abort_fuse_connection(&mountpoint);
        std::process::abort();
    });
    done
}

fn config() -> SessionConfig {
    SessionConfig {
        workers: 2,
        transport: common::test_transport(),
        ..SessionConfig::default()
    }
}

fn sh(cmd: &str, dir: &Path) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run sh")
}

/// The `notes` program serving a temporary mountpoint.
struct Notes {
    child: Child,
    mp: TempMountpoint,
}

impl Notes {
    /// Starts it and waits (at most 10 s) until it is mounted.
    fn start(bin: &Path, tag: &str) -> Notes {
        let mp = TempMountpoint::new(tag);
        let child = Command::new(bin)
            .arg(mp.path())
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start notes");
        let mut n = Notes { child, mp };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !common::fuse_mounted_at(n.mp.path()) {
            if Instant::now() > deadline || n.child.try_wait().unwrap().is_some() {
                n.kill();
                panic!(
                    "waiting for notes to mount on {}: not within 10 s",
                    n.mp.path().display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        n
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mp.path().join(name)
    }

    /// Sends `sig` and waits (at most 10 s) for the program to exit.
    fn signal_and_wait(&mut self, sig: libc::c_int) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid, not yet reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                self.kill();
                panic!("waiting for notes to exit after signal {sig}: still running after 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ends the program and frees its mount, whatever state they are in.
    fn kill(&mut self) {
        let _ = common::abort_fuse_connection(self.mp.path());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Notes {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.kill();
        }
    }
}

#[test]
fn notes_behaves_as_the_shell_expects() {
    if !common::require_mount_capability() {
        return;
    }
    let bin = common::example_binary("notes");
    let mut notes = Notes::start(&bin, "trial-notes");
    let done = watchdog(
        notes.mp.path().to_path_buf(),
        "notes_behaves_as_the_shell_expects",
    );
    let dir = notes.mp.path().to_path_buf();

    fs::write(notes.path("notes"), "a long first line\n").unwrap();
    assert_eq!(fs::read(notes.path("notes")).unwrap(), b"a long first line\n");

    // `echo > f`: O_TRUNC reaches the filesystem (as a SETATTR of size 0).
    let out = sh("echo > notes", &dir);
    assert!(out.status.success(), "echo > notes: {out:?}");
    assert_eq!(
        fs::read(notes.path("notes")).unwrap(),
        b"\n",
        "echo > notes must truncate"
    );
    let out = sh("printf abc > notes", &dir);
    assert!(out.status.success(), "printf abc > notes: {out:?}");
    assert_eq!(
        fs::read(notes.path("notes")).unwrap(),
        b"abc",
        "printf abc > notes"
    );
    let out = sh("echo def >> notes", &dir);
    assert!(out.status.success(), "echo def >> notes: {out:?}");
    assert_eq!(fs::read(notes.path("notes")).unwrap(), b"abcdef\n");

    // Generated content (size 0 in its attributes) reads with `cat`.
    let out = sh("cat uptime hostname reads", &dir);
    assert!(out.status.success(), "cat: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "three generated lines: {text:?}");
    assert!(lines[0].parse::<u64>().is_ok(), "uptime: {text:?}");
    let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(lines[1], host.trim_end(), "hostname");
    assert!(lines[2].parse::<u64>().unwrap() > 0, "reads: {text:?}");

    // Creating is not supported: a clear error, not "Function not implemented".
    let err = fs::File::create(notes.path("new")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "touch new: {err}");
    let err = fs::write(notes.path("uptime"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EACCES), "write to uptime: {err}");

    let status = notes.signal_and_wait(libc::SIGTERM);
    assert!(status.success(), "notes exited with {status}");
    assert!(!common::fuse_mounted_at(&dir), "still mounted after SIGTERM");
    done.store(true, Ordering::Release);
}

#[test]
fn signals_leave_no_mount_behind() {
    if !common::require_mount_capability() {
        return;
    }
    let bin = common::example_binary("notes");
    let signals = [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGHUP,
        libc::SIGTERM,
    ];
    for (round, sig) in signals.into_iter().enumerate() {
        let mut notes = Notes::start(&bin, "trial-signals");
        let done = watchdog(notes.mp.path().to_path_buf(), "signals_leave_no_mount_behind");
        let uptime = fs::read_to_string(notes.path("uptime"));
        let status = notes.signal_and_wait(sig);
        assert!(
            uptime.is_ok_and(|u| u.trim().parse::<u64>().is_ok()),
            "round {round}: uptime"
        );
        assert!(
            status.success(),
            "round {round}: notes exited with {status} after signal {sig}"
        );
        assert!(
            !common::fuse_mounted_at(notes.mp.path()),
            "round {round}: still mounted after signal {sig}"
        );
        done.store(true, Ordering::Release);
    }
}

/// A root directory listing three names, one of which (`bad/name`) the
/// kernel would refuse; counts the lookup references it hands out.
#[derive(Default)]
struct PlusCounts {
    /// Per node 2, 3, 4: references given minus references forgotten.
    refs: [AtomicI64; 3],
    /// A count went below zero (a FORGET for a reference never counted).
    negative: AtomicBool,
}

struct PlusFs(Arc<PlusCounts>);

const PLUS_NAMES: [(&str, u64); 3] = [("one", 2), ("bad/name", 3), ("two", 4)];

impl PlusFs {
    fn attr(ino: u64) -> FileAttr {
        let kind = if ino == 1 {
            FileKind::Directory
        } else {
            FileKind::RegularFile
        };
        FileAttr::fixed(ino, kind, 0o755)
    }

    fn refs(&self, ino: u64) -> Option<&AtomicI64> {
        self.0.refs.get(usize::try_from(ino).ok()?.checked_sub(2)?)
    }
}

impl Filesystem for PlusFs {
    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        config.want(InitFlags::DO_READDIRPLUS);
        Ok(())
    }

    fn lookup(&self, _: &RequestContext<'_>, _: Inode, name: &CStr, reply: ReplyEntry) {
        match PLUS_NAMES.iter().find(|(n, _)| n.as_bytes() == name.to_bytes()) {
            Some(&(_, ino)) => {
                self.refs(ino).unwrap().fetch_add(1, Ordering::SeqCst);
                reply.entry(&Entry::new(
                    Inode(ino),
                    PlusFs::attr(ino),
                    Duration::from_secs(60),
                ))
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn forget(&self, _: &RequestContext<'_>, ino: Inode, nlookup: u64) {
        if let Some(r) = self.refs(ino.0)
            && r.fetch_sub(nlookup as i64, Ordering::SeqCst) < nlookup as i64
        {
            self.0.negative.store(true, Ordering::SeqCst);
        }
    }

    fn getattr(&self, _: &RequestContext<'_>, ino: Inode, _: Option<FileHandle>, reply: ReplyAttr) {
        reply.attr(Duration::from_secs(60), &PlusFs::attr(ino.0))
    }

    fn readdirplus(
        &self,
        _: &RequestContext<'_>,
        _: Inode,
        _: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        for (i, &(name, ino)) in PLUS_NAMES.iter().enumerate().skip(offset as usize) {
            let entry = Entry::new(Inode(ino), PlusFs::attr(ino), Duration::from_secs(60));
            match reply.add(&entry, i as u64 + 1, name) {
                DirPlusAdd::Full => break,
                r if r.counts_lookup() => {
                    self.refs(ino).unwrap().fetch_add(1, Ordering::SeqCst);
                }
                _ => {}
            }
        }
        reply.ok()
    }
}

#[test]
fn readdirplus_lookup_counts_stay_balanced_when_a_name_is_skipped() {
    if !common::require_mount_capability() {
        return;
    }
    let mp = TempMountpoint::new("trial-plus");
    let done = watchdog(
        mp.path().to_path_buf(),
        "readdirplus_lookup_counts_stay_balanced_when_a_name_is_skipped",
    );
    let plus = Arc::new(PlusCounts::default());
    let running = fuse_wire::spawn(
        PlusFs(plus.clone()),
        mp.path(),
        &MountOptions::default(),
        config(),
    )
    .expect("mount");
    let mut names: Vec<String> = fs::read_dir(mp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["one", "two"], "the invalid name is left out");
    let given = |i: usize| plus.refs[i].load(Ordering::SeqCst);
    assert_eq!(
        (given(0), given(1), given(2)),
        (1, 0, 1),
        "references handed out by READDIRPLUS"
    );

    // Make the kernel drop its unused dentries and inodes: it sends FORGET
    // for every reference it holds.
    fs::write("/proc/sys/vm/drop_caches", "2").expect("drop caches (needs root)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while (given(0), given(2)) != (0, 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        (given(0), given(1), given(2)),
        (0, 0, 0),
        "waiting for FORGETs to return every reference (10 s)"
    );
    assert!(
        !plus.negative.load(Ordering::SeqCst),
        "a FORGET for a reference never counted"
    );
    // The background handle unmounts when dropped.
    drop(running);
    assert!(
        !common::fuse_mounted_at(mp.path()),
        "still mounted after the handle was dropped"
    );
    done.store(true, Ordering::Release);
}
