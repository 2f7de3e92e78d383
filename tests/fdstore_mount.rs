//! `hello -o fdstore` under a stand-in for systemd's service manager: the
//! test plays systemd's side of the protocol (a notification socket that
//! keeps the descriptors sent with `FDSTORE=1`, drops those named in
//! `FDSTOREREMOVE=1`, and passes the kept ones to the next start with
//! `LISTEN_FDS`, `LISTEN_FDNAMES` and `LISTEN_PID`), restarting the daemon
//! whenever it exits with a failure, as `Restart=always` does. The daemon
//! is killed with SIGKILL and upgraded with SIGUSR2 while readers read
//! through the mount: no reader may see an error, and SIGTERM unmounts.

mod common;
mod keeper_support;

use common::*;
use keeper_support::*;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The stand-in service manager: its notification socket and its store.
struct Manager {
    path: PathBuf,
    store: Arc<Mutex<Vec<(String, OwnedFd)>>>,
    ready: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Manager {
    fn new(dir: &Path) -> Manager {
        let path = dir.join("notify");
        let sock = std::os::unix::net::UnixDatagram::bind(&path).expect("bind the notification socket");
        sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let store = Arc::new(Mutex::new(Vec::new()));
        let ready = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (store, ready, stop) = (store.clone(), ready.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some((text, fds)) = receive(&sock) {
                        handle(&text, fds, &store, &ready);
                    }
                }
            })
        };
        Manager {
            path,
            store,
            ready,
            stop,
            thread: Some(thread),
        }
    }

    /// Waits (5 s at most) for `name` in the store: the daemon stores it
    /// right after mounting, and this manager's thread takes it in a
    /// moment later.
    fn wait_for(&self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.names().iter().any(|n| n == name) {
            assert!(
                Instant::now() < deadline,
                "no {name} in the store after 5 s: {:?}",
                self.names()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn names(&self) -> Vec<String> {
        self.store
            .lock()
            .unwrap()
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Starts `hello MNT -o fdstore` with what the store holds.
    fn start(&self, mnt: &Path) -> Child {
        // Copies above the range they go to, so that placing one at 3+i
        // cannot overwrite another not placed yet.
        let kept: Vec<(String, RawFd)> = self
            .store
            .lock()
            .unwrap()
            .iter()
            .map(|(n, fd)| (n.clone(), dup_high(fd)))
            .collect();
        assert!(
            kept.iter().all(|(_, fd)| *fd >= 1000),
            "dup of a stored descriptor failed"
        );
        let mut cmd = Command::new("sh");
        // The shell's pid is the daemon's: it execs.
        cmd.args(["-c", "LISTEN_PID=$$ exec \"$0\" \"$@\""])
            .arg(example_binary("hello"))
            .arg(mnt)
            .args(["-o", if over_uring() { "fdstore,uring" } else { "fdstore" }, "-d"])
            .env("NOTIFY_SOCKET", &self.path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if !kept.is_empty() {
            cmd.env("LISTEN_FDS", kept.len().to_string()).env(
                "LISTEN_FDNAMES",
                kept.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(":"),
            );
            let raw: Vec<RawFd> = kept.iter().map(|(_, fd)| *fd).collect();
            // SAFETY: only dup2 between fork and exec (async-signal-safe).
            unsafe {
                cmd.pre_exec(move || {
                    for (i, fd) in raw.iter().enumerate() {
                        if libc::dup2(*fd, 3 + i as RawFd) < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().expect("start hello -o fdstore");
        for (_, fd) in kept {
            // SAFETY: our own dup, closed once.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        child
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A close-on-exec copy of `fd` numbered 1000 or above (-1 on failure).
fn dup_high(fd: &OwnedFd) -> RawFd {
    // SAFETY: F_DUPFD_CLOEXEC of a descriptor we own.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 1000) }
}

/// One notification and its descriptors (None after the read timeout).
fn receive(sock: &std::os::unix::net::UnixDatagram) -> Option<(String, Vec<OwnedFd>)> {
    let mut buf = [0u8; 4096];
    let (fds, n) = fuse_wire::session::handover::recv_fds(sock, &mut buf, 16).ok()?;
    Some((String::from_utf8_lossy(&buf[..n]).into_owned(), fds))
}

/// What systemd does with a notification, for the parts used here.
fn handle(text: &str, fds: Vec<OwnedFd>, store: &Mutex<Vec<(String, OwnedFd)>>, ready: &AtomicUsize) {
    let lines: Vec<&str> = text.lines().collect();
    let name = lines
        .iter()
        .find_map(|l| l.strip_prefix("FDNAME="))
        .unwrap_or("stored")
        .to_string();
    if lines.contains(&"READY=1") {
        ready.fetch_add(1, Ordering::Relaxed);
    }
    if lines.contains(&"FDSTOREREMOVE=1") {
        store.lock().unwrap().retain(|(n, _)| *n != name);
    }
    if lines.contains(&"FDSTORE=1") {
        store
            .lock()
            .unwrap()
            .extend(fds.into_iter().map(|fd| (name.clone(), fd)));
    }
}

/// Waits for `child` to end (10 s at most); its status and log.
fn reap(child: &mut Child, mnt: &Path) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut log = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut log);
            }
            return (status, log);
        }
        if Instant::now() > deadline {
            let _ = abort_fuse_connection(mnt);
            let _ = child.kill();
            let _ = child.wait();
            let mut log = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut log);
            }
            panic!("the daemon did not end within 10 s; its log:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A daemon being served by the manager, always ended on drop.
struct Daemon<'a> {
    child: Option<Child>,
    mnt: &'a Path,
}

impl Drop for Daemon<'_> {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = abort_fuse_connection(self.mnt);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn crashes_and_upgrades_under_systemds_store_lose_no_request() {
    if !require_mount_capability() {
        return;
    }
    let tmp = TempMountpoint::new("fdstore");
    let mnt = tmp.path();
    let manager = Manager::new(tmp.root());
    let mut d = Daemon {
        child: Some(manager.start(mnt)),
        mnt,
    };
    wait_for_mount(d.child.as_mut().unwrap(), mnt, "hello -o fdstore");
    manager.wait_for("fw-dev");
    let readers = Readers::start(mnt, 4);
    let mut logs = String::new();
    // Five crashes, then two upgrades; after each, "systemd" starts the
    // daemon again with what its store holds.
    for round in 0..7u64 {
        std::thread::sleep(Duration::from_millis(80 + round * 41 % 100));
        let mut child = d.child.take().unwrap();
        let upgrade = round >= 5;
        signal(child.id(), if upgrade { libc::SIGUSR2 } else { libc::SIGKILL });
        let (status, log) = reap(&mut child, mnt);
        logs.push_str(&log);
        if upgrade {
            assert_eq!(status.code(), Some(75), "an upgrade exits 75; log:\n{log}");
            assert!(
                manager.names().contains(&"fw-state".to_string()) || log.contains("retiring"),
                "{log}"
            );
        } else {
            assert_eq!(status.signal(), Some(libc::SIGKILL));
        }
        d.child = Some(manager.start(mnt));
    }
    // The last daemon serves a while.
    std::thread::sleep(Duration::from_millis(300));
    let (reads, errors) = readers.finish(mnt);
    let mut child = d.child.take().unwrap();
    signal(child.id(), libc::SIGTERM);
    let (status, log) = reap(&mut child, mnt);
    logs.push_str(&log);
    assert!(reads > 7, "the readers hardly ran ({reads} reads)");
    assert!(
        errors.is_empty(),
        "readers saw errors across crashes and upgrades: {errors:?}\nlogs:\n{logs}"
    );
    assert!(status.success(), "SIGTERM: {status:?}\n{log}");
    assert!(!fuse_mounted_at(mnt), "SIGTERM left the mount\n{log}");
    assert!(
        !manager.names().contains(&"fw-dev".to_string()),
        "the stopped daemon left its connection in the store"
    );
    assert_eq!(
        logs.matches("taking over the connection").count(),
        7,
        "logs:\n{logs}"
    );
    assert_uring_refused(&logs);
    assert!(
        manager.ready.load(Ordering::Relaxed) >= 8,
        "READY=1 from every start"
    );
}

/// The store's name of a vault key of the service (`fw-k` and the key in
/// hex): what INIT negotiated is key 2 of the reserved ones, the journal 1.
fn reserved_record(key: u64) -> String {
    format!("fw-k{:x}", fuse_wire::session::vault::RESERVED_KEYS | key)
}

/// Starts `hello -o fdstore`, waits for its mount, kills it, and drops the
/// record `name` from the store, as a store that lost it would.
fn crash_and_lose(manager: &Manager, mnt: &Path, name: &str) {
    let mut child = manager.start(mnt);
    wait_for_mount(&mut child, mnt, "hello -o fdstore");
    // Served: INIT is answered, and what it negotiated recorded.
    assert_eq!(std::fs::read_to_string(mnt.join("hello")).unwrap(), CONTENT);
    manager.wait_for("fw-dev");
    manager.wait_for(name);
    signal(child.id(), libc::SIGKILL);
    let _ = reap(&mut child, mnt);
    manager.store.lock().unwrap().retain(|(n, _)| n != name);
}

/// A start handed the connection without what INIT negotiated on it sees
/// a request where INIT should come first: it answers nothing (before, it
/// answered EIO to every request for good), says why, and ends the mount,
/// so the client gets an error at once instead of EIO forever.
#[test]
fn a_start_without_the_init_record_ends_the_mount_instead_of_failing_every_request() {
    if !require_mount_capability() {
        return;
    }
    let tmp = TempMountpoint::new("fdstore-no-init");
    let mnt = tmp.path();
    let manager = Manager::new(tmp.root());
    crash_and_lose(&manager, mnt, &reserved_record(2));
    let mut d = Daemon {
        child: Some(manager.start(mnt)),
        mnt,
    };
    std::thread::sleep(Duration::from_millis(300));
    // A request for the daemon to find first.
    let file = mnt.join("hello");
    let client = std::thread::spawn(move || std::fs::read_to_string(file));
    let mut child = d.child.take().unwrap();
    let (status, log) = reap(&mut child, mnt);
    assert!(!status.success(), "the daemon served on: {status:?}\n{log}");
    assert!(
        log.contains("came before INIT") && log.contains("unmounting it"),
        "the daemon does not say why:\n{log}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !client.is_finished() {
        assert!(Instant::now() < deadline, "the client still waits\n{log}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let got = client.join().unwrap();
    assert!(
        got.is_err(),
        "the client read {got:?} from a connection nobody serves"
    );
    assert!(
        !fuse_mounted_at(mnt),
        "the refused connection is still mounted\n{log}"
    );
    assert!(
        !manager.names().contains(&"fw-dev".to_string()),
        "the refused connection is still in the store"
    );
    assert!(
        !log.contains("answering EIO"),
        "the daemon answered requests it cannot serve:\n{log}"
    );
}

/// A start that finds the connection and what INIT negotiated, but not the
/// journal, is refused before it serves: a blank journal taken for a new
/// one would carry out again what the dead daemon had done. The mount
/// stays with the store, for a start that has everything.
#[test]
fn a_start_without_the_journal_is_refused_and_the_connection_stays_stored() {
    if !require_mount_capability() {
        return;
    }
    let tmp = TempMountpoint::new("fdstore-no-journal");
    let mnt = tmp.path();
    let manager = Manager::new(tmp.root());
    crash_and_lose(&manager, mnt, &reserved_record(1));
    let mut d = Daemon {
        child: Some(manager.start(mnt)),
        mnt,
    };
    let mut child = d.child.take().unwrap();
    let (status, log) = reap(&mut child, mnt);
    assert!(
        !status.success(),
        "the daemon served with a blank journal: {status:?}\n{log}"
    );
    assert!(
        log.contains("the kept journal is blank"),
        "the daemon does not say why:\n{log}"
    );
    assert!(
        manager.names().contains(&"fw-dev".to_string()),
        "the connection left the store"
    );
    // The connection is still there for a start with everything: none
    // here, so it is ended by hand.
    let _ = abort_fuse_connection(mnt);
}
