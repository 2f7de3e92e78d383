//! Real mounts served over FUSE-over-io_uring, and the fallback to
//! `/dev/fuse` when the kernel's `enable_uring` switch is off.
//!
//! Needs root, `/dev/fuse` and a kernel with `CONFIG_FUSE_IO_URING`; without
//! them the tests say so and pass, except under `CI=true`, where they fail.
//! They flip `/sys/module/fuse/parameters/enable_uring` and always put back
//! the value they found (a guard restores it on drop, panics included); the
//! two tests hold a lock so that they never flip it at the same time.

use fuse_wire::proto::abi::Attr;
use fuse_wire::proto::flags::FopenFlags;
use fuse_wire::proto::{Errno, Opcode};
use fuse_wire::session::FileAttr;
use fuse_wire::session::mount::{Mount, MountGuard, MountOptions};
use fuse_wire::session::ops::*;
use fuse_wire::session::reply::{ReplyAttr, ReplyCreate, ReplyData, ReplyEntry, ReplyOpen, ReplyWrite};
use fuse_wire::session::transport::uring::{ENABLE_KNOB, Unavailable};
use fuse_wire::session::{
    Entry, FileHandle, Filesystem, Inode, LockOwner, RequestContext, Session, SessionConfig, Transport,
    TransportInfo,
};
use std::collections::{BTreeMap, HashMap};
use std::ffi::CStr;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

mod common;

// ---------------------------------------------------------------- helpers

/// Serialises the tests of this file: they share one kernel switch.
fn knob_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sets `enable_uring` and restores the previous value when dropped.
struct KnobGuard {
    previous: String,
}

impl KnobGuard {
    fn set(on: bool) -> KnobGuard {
        let previous = std::fs::read_to_string(ENABLE_KNOB).expect("read enable_uring");
        std::fs::write(ENABLE_KNOB, if on { "Y" } else { "N" }).expect("write enable_uring");
        KnobGuard {
            previous: previous.trim().to_string(),
        }
    }
}

impl Drop for KnobGuard {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(ENABLE_KNOB, &self.previous) {
            eprintln!("could not restore {ENABLE_KNOB} to {}: {e}", self.previous);
        }
    }
}

/// Whether this machine can run the tests; under CI it must.
fn require_uring_mount_capability() -> bool {
    let why = if effective_uid() != 0 {
        Some("not root".to_string())
    } else if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Some(format!("cannot open /dev/fuse: {e}"))
    } else if !Path::new(ENABLE_KNOB).exists() {
        Some(format!(
            "{ENABLE_KNOB} is missing (kernel without CONFIG_FUSE_IO_URING)"
        ))
    } else {
        None
    };
    match why {
        None => true,
        Some(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("CI=true but the io_uring mount tests cannot run: {why}")
        }
        Some(why) => {
            eprintln!("skipping: {why}");
            false
        }
    }
}

fn effective_uid() -> u32 {
    // /proc/self/status has "Uid: real effective saved fs".
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
        })
        .and_then(|u| u.parse().ok())
        .unwrap_or(u32::MAX)
}

fn mountpoint(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("fuse-wire-uring-{tag}-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&p);
    p
}

/// Collects log lines so that a test can check what the session said.
struct Capture;
static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let line = format!("{} {}", r.level(), r.args());
            eprintln!("{line}");
            LINES.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    }
    fn flush(&self) {}
}

/// Log lines captured from index `from` on that contain `needle`.
fn logged_since(from: usize, needle: &str) -> Vec<String> {
    LINES.lock().unwrap_or_else(|e| e.into_inner())[from..]
        .iter()
        .filter(|l| l.contains(needle))
        .cloned()
        .collect()
}

fn log_len() -> usize {
    LINES.lock().unwrap_or_else(|e| e.into_inner()).len()
}

fn capture_logs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = log::set_logger(&Capture);
        log::set_max_level(log::LevelFilter::Info);
    });
}

// ---------------------------------------------------------------- the filesystem

#[derive(Default)]
struct Files {
    names: HashMap<Vec<u8>, u64>,
    data: BTreeMap<u64, Vec<u8>>,
    next: u64,
}

/// A flat in-memory directory that also records which threads served which
/// opcodes, to tell ring queue threads from `/dev/fuse` workers. READ is
/// answered later from a thread of its own. A LOOKUP of a name starting
/// with [`GATE`] blocks its thread until the test opens the gate.
#[derive(Default)]
struct TinyFs {
    files: Mutex<Files>,
    served_by: Mutex<HashMap<(&'static str, String), u64>>,
    gate: Mutex<Gate>,
    gate_moved: Condvar,
}

/// LOOKUPs of names that start with this block.
const GATE: &str = "gate";

#[derive(Default)]
struct Gate {
    open: bool,
    /// LOOKUPs at the gate right now.
    blocked: usize,
}

const TTL: Duration = Duration::from_secs(1);

impl TinyFs {
    fn note(&self, op: &'static str) {
        let name = std::thread::current().name().unwrap_or("?").to_string();
        let kind = if name.starts_with("fuse-uring-") {
            "uring"
        } else if name.starts_with("fuse-worker-") || name == "fuse-session" {
            "dev"
        } else {
            "other"
        };
        *self
            .served_by
            .lock()
            .unwrap()
            .entry((op, kind.to_string()))
            .or_default() += 1;
    }

    /// Blocks the calling (handler) thread until the gate opens. Bounded, so
    /// that a test that forgets to open it cannot leave a thread behind.
    fn wait_at_gate(&self) {
        let mut g = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        g.blocked += 1;
        self.gate_moved.notify_all();
        let deadline = Instant::now() + Duration::from_secs(120);
        while !g.open && Instant::now() < deadline {
            g = self
                .gate_moved
                .wait_timeout(g, Duration::from_secs(1))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        g.blocked -= 1;
        self.gate_moved.notify_all();
    }

    fn open_gate(&self) {
        self.gate.lock().unwrap_or_else(|e| e.into_inner()).open = true;
        self.gate_moved.notify_all();
    }

    /// Waits (bounded) until `n` LOOKUPs are blocked at the gate.
    fn wait_blocked(&self, n: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut g = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        while g.blocked != n {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            g = self
                .gate_moved
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    fn served(&self, op: &'static str, kind: &str) -> u64 {
        self.served_by
            .lock()
            .unwrap()
            .get(&(op, kind.to_string()))
            .copied()
            .unwrap_or(0)
    }

    fn attr(ino: u64, size: usize) -> FileAttr {
        FileAttr::from_abi(&Self::attr_raw(ino, size)).expect("a valid mode")
    }

    fn attr_raw(ino: u64, size: usize) -> Attr {
        let dir = ino == 1;
        Attr {
            ino,
            size: size as u64,
            blocks: (size as u64).div_ceil(512),
            mode: if dir {
                libc::S_IFDIR | 0o755
            } else {
                libc::S_IFREG | 0o644
            },
            nlink: if dir { 2 } else { 1 },
            blksize: 4096,
            ..Default::default()
        }
    }

    fn entry(ino: u64, size: usize) -> Entry {
        Entry {
            ino: Inode(ino),
            generation: 1,
            attr: Self::attr(ino, size),
            entry_ttl: TTL,
            attr_ttl: TTL,
        }
    }
}

impl Filesystem for TinyFs {
    /// `open` truncates on `O_TRUNC` itself, so the kernel is to send
    /// O_TRUNC there instead of a SETATTR (which this filesystem lacks).
    fn init(&self, config: &mut fuse_wire::session::InitConfig) -> Result<(), Errno> {
        config.want(fuse_wire::proto::flags::InitFlags::ATOMIC_O_TRUNC);
        Ok(())
    }

    fn lookup(&self, _: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        self.note("lookup");
        if parent == Inode::ROOT && name.to_bytes().starts_with(GATE.as_bytes()) {
            self.wait_at_gate();
            return reply.error(Errno::ENOENT);
        }
        let f = self.files.lock().unwrap();
        match f.names.get(name.to_bytes()) {
            Some(&ino) if parent == Inode::ROOT => reply.entry(&Self::entry(ino, f.data[&ino].len())),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _: &RequestContext<'_>, ino: Inode, _: Option<FileHandle>, reply: ReplyAttr) {
        self.note("getattr");
        let f = self.files.lock().unwrap();
        if ino == Inode::ROOT {
            return reply.attr(TTL, &Self::attr(1, 0));
        }
        match f.data.get(&ino.0) {
            Some(d) => reply.attr(TTL, &Self::attr(ino.0, d.len())),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _: &RequestContext<'_>, ino: Inode, flags: OpenFlags, reply: ReplyOpen) {
        let flags = flags.bits();
        self.note("open");
        if flags & libc::O_TRUNC != 0
            && let Some(d) = self.files.lock().unwrap().data.get_mut(&ino.0)
        {
            d.clear();
        }
        reply.opened(FileHandle(ino.0), FopenFlags::empty());
    }

    fn create(
        &self,
        _: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        _req: CreateRequest,
        reply: ReplyCreate,
    ) {
        self.note("create");
        if parent != Inode::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let mut f = self.files.lock().unwrap();
        f.next += 1;
        let ino = f.next + 1;
        f.names.insert(name.to_bytes().to_vec(), ino);
        f.data.insert(ino, Vec::new());
        reply.created(&Self::entry(ino, 0), FileHandle(ino), FopenFlags::empty());
    }

    fn read(&self, _: &RequestContext<'_>, ino: Inode, _: FileHandle, req: ReadRequest, reply: ReplyData) {
        let offset = req.offset;
        let size = req.size;
        self.note("read");
        let f = self.files.lock().unwrap();
        let Some(d) = f.data.get(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let start = (offset as usize).min(d.len());
        let end = (start + size as usize).min(d.len());
        // Answer from another thread, later: the reply travels back to the
        // ring from outside its queue thread.
        let chunk = d[start..end].to_vec();
        let (done, handler_done) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            // Once this handler is done (its last act is to say so).
            let _ = handler_done.recv_timeout(Duration::from_secs(5));
            reply.data(&chunk)
        });
        let _ = done.send(());
    }

    fn write(
        &self,
        _: &RequestContext<'_>,
        ino: Inode,
        _: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        let offset = req.offset;
        // The rings deliver WRITE data in memory, never in a pipe.
        let Some(data) = req.data.bytes() else {
            return reply.error(Errno::EIO);
        };
        self.note("write");
        let mut f = self.files.lock().unwrap();
        let Some(d) = f.data.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let end = offset as usize + data.len();
        if d.len() < end {
            d.resize(end, 0);
        }
        d[offset as usize..end].copy_from_slice(data);
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _: &RequestContext<'_>,
        _: Inode,
        _: FileHandle,
        _: LockOwner,
        reply: fuse_wire::session::reply::ReplyEmpty,
    ) {
        reply.ok();
    }
}

fn wait_for_transport(handle: &fuse_wire::session::SessionHandle) -> TransportInfo {
    let t0 = Instant::now();
    loop {
        if let Some(t) = handle.transport() {
            return t;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the session never reported its transport"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `f` on `cpu` (so that its requests land on that CPU's queue).
fn on_cpu<T: Send>(cpu: usize, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: sched_setaffinity on the calling thread with a cpu_set_t
            // that lives on the stack for the duration of the call.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
            }
            f()
        })
        .join()
        .expect("file operations panicked")
    })
}

fn join_with_timeout(
    running: fuse_wire::session::RunningSession,
) -> Result<fuse_wire::session::SessionReport, fuse_wire::session::SessionError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(running.join());
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the session did not end within 30 s of the unmount")
}

/// Mounts a `TinyFs` at `mp` and runs a session on it with `config`.
fn serve(
    mp: &Path,
    config: SessionConfig,
) -> (
    std::sync::Arc<TinyFs>,
    MountGuard,
    fuse_wire::session::RunningSession,
) {
    let (dev, guard) = Mount::new(mp, &MountOptions::default())
        .expect("mount")
        .into_parts();
    let fs = std::sync::Arc::new(TinyFs::default());
    let session = Session::from_arc(fs.clone(), std::sync::Arc::new(dev), config).expect("session");
    (fs, guard, session.spawn().expect("spawn"))
}

/// A session with one worker on `transport`.
fn one_worker(transport: Transport) -> SessionConfig {
    SessionConfig {
        workers: 1,
        transport,
        ..Default::default()
    }
}

/// What a test holds while it runs: this file's lock, and `enable_uring`
/// set as it wants (restored on drop, before the lock is released).
struct Held {
    _knob: KnobGuard,
    _serial: MutexGuard<'static, ()>,
}

/// What [`start`] gives a test, in the order it binds them, so that they
/// drop as a test's own locals did: the session first, then the mount,
/// then what it [`Held`].
type Started = (
    Held,
    PathBuf,
    std::sync::Arc<TinyFs>,
    MountGuard,
    fuse_wire::session::RunningSession,
    TransportInfo,
);

/// Takes the lock, sets the knob to `knob`, captures logs and serves a
/// `TinyFs` at mountpoint `tag` with `config`, until the session reports
/// its transport; `None` when the machine cannot (outside CI, where that
/// fails).
fn start(tag: &str, knob: bool, config: SessionConfig) -> Option<Started> {
    let _serial = knob_lock();
    if !require_uring_mount_capability() {
        return None;
    }
    capture_logs();
    let _knob = KnobGuard::set(knob);
    let mp = mountpoint(tag);
    let (fs, guard, running) = serve(&mp, config);
    let info = wait_for_transport(running.handle());
    Some((Held { _knob, _serial }, mp, fs, guard, running, info))
}

/// Unmounts and waits for the session to end, failing if its io_uring
/// queue threads had to be stopped after the grace instead of ending by
/// themselves.
fn unmount_and_join(
    guard: MountGuard,
    running: fuse_wire::session::RunningSession,
) -> fuse_wire::session::SessionReport {
    let logs = log_len();
    guard.unmount().expect("unmount");
    let report = join_with_timeout(running).expect("session result");
    let stopped = logged_since(logs, "io_uring queues still running");
    assert!(
        stopped.is_empty(),
        "the queues did not end on unmount: {stopped:?}"
    );
    report
}

// ---------------------------------------------------------------- tests

#[test]
fn requests_are_served_over_the_rings() {
    let config = one_worker(Transport::Uring);
    let Some((_held, mp, fs, guard, running, info)) = start("on", true, config) else {
        return;
    };
    let TransportInfo::Uring {
        queues,
        depth,
        payload_size,
    } = info
    else {
        panic!("expected the io_uring transport, got {info}");
    };
    assert_eq!(
        queues,
        fuse_wire::session::transport::uring::possible_cpus().unwrap()
    );
    assert_eq!(depth, 8);
    assert!(payload_size >= 1 << 20, "payload buffers of {payload_size} bytes");

    // Real file operations, from every CPU so that every queue is used.
    let mut expected_bytes = 0;
    for cpu in 0..queues {
        let path = mp.join(format!("file-{cpu}"));
        let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + cpu as u32) as u8).collect();
        let back = on_cpu(cpu, || {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(&path)
                .expect("create");
            f.write_all(b"hello over io_uring\n").unwrap();
            f.write_all(&big).unwrap();
            f.sync_all().ok();
            drop(f);
            let meta = std::fs::metadata(&path).expect("stat");
            let mut f = std::fs::File::open(&path).expect("open");
            let mut s = Vec::new();
            f.read_to_end(&mut s).unwrap();
            f.seek(SeekFrom::Start(6)).unwrap();
            let mut word = [0u8; 4];
            f.read_exact(&mut word).unwrap();
            assert_eq!(&word, b"over");
            assert!(std::fs::metadata(mp.join("missing")).is_err());
            (meta.len(), s)
        });
        expected_bytes += 20 + big.len();
        assert_eq!(back.0 as usize, 20 + big.len());
        assert_eq!(&back.1[..20], b"hello over io_uring\n");
        assert_eq!(&back.1[20..], &big[..]);
    }

    let stats = running.handle().stats();
    eprintln!("stats while mounted: {}", stats.to_json());
    // Every request of these kinds went through a ring queue thread.
    for op in ["lookup", "create", "write", "read", "getattr"] {
        assert!(fs.served(op, "uring") > 0, "no {op} served over io_uring");
        assert_eq!(fs.served(op, "dev"), 0, "{op} served over /dev/fuse");
    }
    let t = &stats.transport;
    // INIT is answered by the session itself and not counted; FORGET or
    // INTERRUPT could still arrive on /dev/fuse, nothing else does.
    assert!(t.uring >= 10 && t.dev_fuse <= 2, "{t:?}");
    assert_eq!(t.queues.len(), queues);
    assert!(t.queues.iter().all(|&n| n > 0), "a queue served nothing: {t:?}");
    assert_eq!(stats.get(Opcode::Write).errors, 0);
    let written: usize = fs.files.lock().unwrap().data.values().map(Vec::len).sum();
    assert_eq!(written, expected_bytes);

    // Unmount: the parked ring commands complete with ENOTCONN, the queue
    // threads end by themselves (not stopped after the grace), the session ends.
    let report = unmount_and_join(guard, running);
    assert!(report.transport.is_uring());
    assert!(report.stats.transport.uring >= t.uring);
    let _ = std::fs::remove_dir(&mp);
}

#[test]
fn knob_off_falls_back_to_dev_fuse_and_says_why() {
    let config = one_worker(Transport::Uring);
    let Some((_held, mp, fs, guard, running, info)) = start("off", false, config) else {
        return;
    };
    assert_eq!(
        info,
        TransportInfo::DevFuse {
            fallback: Some(Unavailable::KnobOff)
        }
    );
    let why = info.fallback_reason().unwrap().to_string();
    assert!(why.contains("enable_uring is N"), "{why}");
    let logged = LINES
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.starts_with("WARN") && l.contains("enable_uring is N"));
    assert!(logged, "the fallback reason was not logged as a warning");

    std::fs::write(mp.join("plain"), b"over /dev/fuse").expect("write");
    assert_eq!(std::fs::read(mp.join("plain")).expect("read"), b"over /dev/fuse");
    assert!(fs.served("write", "dev") > 0);
    assert_eq!(fs.served("write", "uring"), 0);
    let stats = running.handle().stats();
    assert_eq!(stats.transport.uring, 0);
    assert!(stats.transport.queues.is_empty());

    guard.unmount().expect("unmount");
    let report = join_with_timeout(running).expect("session result");
    assert!(!report.transport.is_uring());
    let _ = std::fs::remove_dir(&mp);
}

#[test]
fn stop_ends_the_queue_threads_while_mounted() {
    let config = SessionConfig {
        uring_queue_depth: 2,
        ..one_worker(Transport::Auto)
    };
    let Some((_held, mp, fs, guard, running, info)) = start("stop", true, config) else {
        return;
    };
    assert!(matches!(info, TransportInfo::Uring { depth: 2, .. }), "{info}");
    std::fs::write(mp.join("x"), b"x").expect("write");
    assert!(fs.served("write", "uring") > 0);

    // Stop without unmounting: the queue threads leave their loops, their
    // parked commands are cancelled, the session ends.
    let handle = running.handle().clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(running.stop());
    });
    let report = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("stop() did not end the session within 30 s")
        .expect("session result");
    assert!(report.transport.is_uring());
    assert!(report.stats.transport.uring > 0);
    assert!(handle.transport().unwrap().is_uring());
    guard.unmount().expect("unmount after stop");
    let _ = std::fs::remove_dir(&mp);
}

/// Pins the calling thread to `cpu`, so that its requests go to that CPU's queue.
fn pin_to(cpu: usize) {
    // SAFETY: sched_setaffinity on the calling thread with a cpu_set_t that
    // lives on the stack for the duration of the call.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(
        r,
        0,
        "sched_setaffinity to CPU {cpu}: {}",
        std::io::Error::last_os_error()
    );
}

/// Opens the gate and, unless the test ended well, aborts the connection,
/// so that no thread of the test stays blocked on the mount.
struct Unblock<'a> {
    fs: &'a TinyFs,
    mp: &'a Path,
    done: bool,
}

impl Drop for Unblock<'_> {
    fn drop(&mut self) {
        if !self.done
            && let Err(e) = common::abort_fuse_connection(self.mp)
        {
            eprintln!("could not abort the connection of {}: {e}", self.mp.display());
        }
        self.fs.open_gate();
    }
}

#[test]
fn blocked_handlers_do_not_stall_their_queue() {
    let config = one_worker(Transport::Uring);
    let Some((_held, mp, fs, guard, running, info)) = start("blocked", true, config) else {
        return;
    };
    let TransportInfo::Uring { depth, .. } = info else {
        panic!("expected the io_uring transport, got {info}");
    };
    let mut unblock = Unblock {
        fs: &fs,
        mp: &mp,
        done: false,
    };
    const CPU: usize = 0;

    // The files the requests below use, made beforehand: a LOOKUP that
    // waits holds its directory's lock shared, so creating in that
    // directory (exclusive) would wait for it in the VFS, not in the queue.
    const WORKERS: usize = 4;
    const ROUNDS: usize = 10;
    let name = |w: usize, i: usize| format!("w{w}-{i}");
    on_cpu(CPU, || {
        for w in 0..WORKERS {
            for i in 0..ROUNDS {
                std::fs::write(mp.join(name(w, i)), b"").expect("create");
            }
        }
    });

    // LOOKUPs from CPU 0 that block in their handlers, as many as leave one
    // ring entry of the queue free. Their threads are not joined: if the
    // queue were stuck they would stay blocked until the abort.
    let blocked = depth - 1;
    let (gate_tx, gate_rx) = std::sync::mpsc::channel();
    for g in 0..blocked {
        let gate_path = mp.join(format!("{GATE}-{g}"));
        let gate_tx = gate_tx.clone();
        std::thread::spawn(move || {
            pin_to(CPU);
            let _ = gate_tx.send(std::fs::metadata(&gate_path).map(|_| ()));
        });
    }
    let all_blocked = fs.wait_blocked(blocked, Duration::from_secs(10));
    let at_gate = fs.gate.lock().unwrap_or_else(|e| e.into_inner()).blocked;
    assert!(
        all_blocked,
        "{blocked} LOOKUPs never all reached their handlers (the queue stalled after {at_gate})"
    );
    let ring_threads = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|c| c.trim() == format!("fuse-uring-{CPU}"))
            .count()
    };
    // The threads of the queue once those on their way out have gone: a
    // retiring thread leaves the queue's count before it has exited, so a
    // look at /proc can catch it beside the standby started after it.
    let settled_threads = || {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let n = ring_threads();
            if n <= depth + 1 || Instant::now() > deadline {
                return n;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };

    // While it is blocked, many requests from the same CPU, several at a
    // time: lookups of other names, opens, writes, reads, getattrs.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for w in 0..WORKERS {
        let dir = mp.clone();
        let done_tx = done_tx.clone();
        std::thread::spawn(move || {
            pin_to(CPU);
            let r = (|| -> std::io::Result<()> {
                for i in 0..ROUNDS {
                    let path = dir.join(name(w, i));
                    let data: Vec<u8> = (0..70_000u32).map(|b| (b as usize * 31 + w + i) as u8).collect();
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .truncate(true)
                        .open(&path)?;
                    f.write_all(&data)?;
                    drop(f);
                    let back = std::fs::read(&path)?;
                    if back != data {
                        return Err(std::io::Error::other(format!(
                            "{} read back wrong",
                            path.display()
                        )));
                    }
                    std::fs::metadata(&path)?;
                    if std::fs::metadata(dir.join(format!("missing-{w}-{i}"))).is_ok() {
                        return Err(std::io::Error::other("a missing name was found"));
                    }
                }
                Ok(())
            })();
            let _ = done_tx.send(r);
        });
    }
    drop(done_tx);
    let deadline = Instant::now() + Duration::from_secs(30);
    for _ in 0..WORKERS {
        let left = deadline.saturating_duration_since(Instant::now());
        match done_rx.recv_timeout(left) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("a file operation failed while a LOOKUP was blocked: {e}"),
            Err(_) => panic!(
                "requests from CPU {CPU} did not complete within 30 s while {blocked} \
                 LOOKUPs were blocked in their handlers: the ring queue stalled (depth {depth})"
            ),
        }
    }
    // The blocked LOOKUPs are still blocked: the others did not wait for them.
    let at_gate = fs.gate.lock().unwrap_or_else(|e| e.into_inner()).blocked;
    assert_eq!(at_gate, blocked);
    assert!(fs.served("write", "uring") >= (WORKERS * ROUNDS) as u64);
    // A thread per blocked handler and one more, within the queue's bound.
    let n = settled_threads();
    assert!(
        n > blocked && n <= depth + 1,
        "queue {CPU} has {n} threads with {blocked} handlers blocked (depth {depth})"
    );

    // Open the gate: the LOOKUPs answer (ENOENT).
    fs.open_gate();
    for _ in 0..blocked {
        match gate_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
            Ok(other) => panic!("a gated LOOKUP answered {other:?}, expected ENOENT"),
            Err(_) => panic!("a gated LOOKUP did not answer once the gate opened"),
        }
    }
    let n = settled_threads();
    assert!(
        n >= 2 && n <= depth + 1,
        "queue {CPU} has {n} threads (depth {depth})"
    );
    unblock.done = true;
    drop(unblock);

    // Every thread of the queue ends on unmount, standbys included.
    let report = unmount_and_join(guard, running);
    assert_eq!(ring_threads(), 0, "ring threads outlived the session");
    assert!(report.transport.is_uring());
    let _ = std::fs::remove_dir(&mp);
}
