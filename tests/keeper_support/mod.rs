//! The keeper's test helpers: finding the serving daemon under a keeper,
//! signalling it, and a keeper process that is always ended and its mount
//! freed, whatever the test does.
#![allow(dead_code)]

pub mod workload;

use crate::common::*;
use std::fs;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What `hello` serves in its one file.
pub const CONTENT: &str = "Hello, world!\n";

/// The keeper's children (the serving daemons).
pub fn children(pid: u32) -> Vec<u32> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| fs::read_to_string(t.path().join("children")).ok())
                .flat_map(|s| {
                    s.split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .collect::<Vec<u32>>()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `pid` is alive (not a zombie the keeper has yet to reap).
pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|r| !r.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// The serving daemon's pid, other than those of `gone` (waits up to 10 s).
/// Only /proc is read: a read through the mount could block forever if the
/// keeper failed, where the readers' own failures are bounded.
pub fn daemon_of(keeper: u32, gone: &[u32]) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let live: Vec<u32> = children(keeper)
            .into_iter()
            .filter(|p| !gone.contains(p) && alive(*p))
            .collect();
        if let [pid] = live.as_slice() {
            return *pid;
        }
        assert!(
            Instant::now() < deadline,
            "no one daemon serving under keeper {keeper} after 10 s: live children {live:?} \
             (not counting {gone:?})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) of a process we started (or its child).
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// The keeper's log says `what` exactly `n` times.
pub fn assert_logged(log: &str, what: &str, n: usize) {
    assert_eq!(
        log.matches(what).count(),
        n,
        "{what:?} in the keeper's log:\n{log}"
    );
}

/// A keeper started on `mnt`, ended (and its mount freed) on drop.
pub struct Keeper {
    pub child: Option<Child>,
    mnt: PathBuf,
}

impl Keeper {
    /// `hello -o keeper` on `mnt` (`-o keeper,uring` in the io_uring pass,
    /// which the keeper must refuse: see [`assert_uring_refused`]).
    pub fn start(mnt: &Path) -> Self {
        let opts = if over_uring() { "keeper,uring" } else { "keeper" };
        Self::start_with(
            Command::new(example_binary("hello")).arg(mnt).args(["-o", opts]),
            mnt,
        )
    }

    /// The keeper `cmd` starts, which mounts `mnt`.
    pub fn start_with(cmd: &mut Command, mnt: &Path) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start hello -o keeper");
        wait_for_mount(&mut child, mnt, "a keeper");
        Keeper {
            child: Some(child),
            mnt: mnt.to_path_buf(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// SIGTERM; the keeper must exit 0 and unmount within 10 s. Its log.
    pub fn stop(self) -> String {
        let pid = self.pid();
        self.stop_via(pid)
    }

    /// [`Keeper::stop`] with the SIGTERM sent to `pid` (the keeper itself,
    /// where the process started is a wrapper that passes its exit on).
    pub fn stop_via(mut self, pid: u32) -> String {
        let mut child = self.child.take().expect("running");
        signal(pid, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => break None,
            }
        };
        let mut log = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut log);
        }
        if status.is_none() {
            let _ = abort_fuse_connection(&self.mnt);
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(
            status.is_some_and(|s| s.success()),
            "the keeper did not exit cleanly on SIGTERM ({status:?}); its log:\n{log}"
        );
        assert!(
            !fuse_mounted_at(&self.mnt),
            "the keeper left its mount behind; its log:\n{log}"
        );
        log
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = abort_fuse_connection(&self.mnt);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
/// Readers that open, read and close `hello` in a loop, counting reads and
/// recording every failure.
pub struct Readers {
    stop: Arc<AtomicBool>,
    reads: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<Vec<String>>>,
}

impl Readers {
    pub fn start(mnt: &Path, n: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let threads = (0..n)
            .map(|_| {
                let (stop, reads, file) = (stop.clone(), reads.clone(), mnt.join("hello"));
                std::thread::spawn(move || {
                    let mut errors = Vec::new();
                    while !stop.load(Ordering::Relaxed) && errors.len() < 10 {
                        let mut s = String::new();
                        // O_DIRECT: every read goes to the daemon, not to
                        // the page cache, so kills land mid-request.
                        let open = fs::OpenOptions::new()
                            .read(true)
                            .custom_flags(libc::O_DIRECT)
                            .open(&file);
                        match open.and_then(|mut f| f.read_to_string(&mut s)) {
                            Ok(_) if s == CONTENT => {}
                            Ok(_) => errors.push(format!("wrong content {s:?}")),
                            Err(e) => errors.push(e.to_string()),
                        }
                        // A stat each time too: GETATTR once the cache expires.
                        if let Err(e) = fs::metadata(&file) {
                            errors.push(format!("stat: {e}"));
                        }
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                    errors
                })
            })
            .collect();
        Readers { stop, reads, threads }
    }

    /// Stops the readers; their errors. A reader still blocked after 10 s
    /// (a request nobody answers) has the connection aborted under it, and
    /// that is reported.
    pub fn finish(self, mnt: &Path) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut errors = Vec::new();
        while self.threads.iter().any(|t| !t.is_finished()) {
            if Instant::now() > deadline {
                errors.push("a reader hung on an unanswered request; connection aborted".to_string());
                let _ = abort_fuse_connection(mnt);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        errors.extend(
            self.threads
                .into_iter()
                .flat_map(|t| t.join().unwrap_or_default()),
        );
        (self.reads.load(Ordering::Relaxed), errors)
    }
}

/// In the io_uring pass (`FUSE_WIRE_TEST_TRANSPORT=uring`): the daemons were
/// asked for io_uring, and `log` must show that they served over `/dev/fuse`
/// and said why (a daemon that ends fails the requests the kernel hands to
/// its ring entries meanwhile, `docs/recovery.md`), and that none served
/// over the rings.
pub fn assert_uring_refused(log: &str) {
    if !over_uring() {
        return;
    }
    assert!(
        log.contains("serving over /dev/fuse, not io_uring") && log.contains("ECANCELED"),
        "io_uring was asked for and the log does not say why it is not used:\n{log}"
    );
    assert!(
        !log.contains("transport: io_uring"),
        "a daemon served over io_uring:\n{log}"
    );
}
