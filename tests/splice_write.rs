//! WRITE payloads left in the worker's pipe (`SessionConfig::splice_write`)
//! on a real mount: the bytes that reach the file are exactly the caller's,
//! for sizes from 1 byte to `max_write` at unaligned offsets, with and
//! without `O_DIRECT`, through the page cache and with `O_APPEND`; a
//! payload the handler leaves in the pipe does not leak into the next
//! request; and the spliced path is really taken (the session's
//! `spliced_writes` counter), or not where it cannot be (io_uring, a
//! `max_write` too large for the pipe). With a channel of its own that
//! fills the worker's pipe as the kernel's splice would: a WRITE read at
//! the cap is queued as bytes, and a panicking handler's payload is drained.
//!
//! Every test's I/O runs on a thread with a deadline: on timeout the test
//! aborts its own FUSE connection and fails saying what it waited for.

mod common;

use common::{TempMountpoint, require_mount_capability, wait_unmounted};
use fuse_wire::proto::abi::Attr;
use fuse_wire::proto::flags::FopenFlags;
use fuse_wire::session::ops::*;
use fuse_wire::session::reply::*;
use fuse_wire::session::*;
use std::ffi::CStr;
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long any one test's I/O may take before the test gives up.
const DEADLINE: Duration = Duration::from_secs(60);

/// The `max_write` the tests mount with (fits the 1 MiB pipe).
const MAX_WRITE: usize = 512 * 1024;

/// Runs `f` on a thread; if it does not finish within [`DEADLINE`], aborts
/// the FUSE connection at `mnt` (which fails the stuck I/O) and panics.
fn bounded<T: Send + 'static>(mnt: &Path, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(v) => {
            let _ = t.join();
            v
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            let _ = common::abort_fuse_connection(mnt);
            panic!("{what}: no answer within {DEADLINE:?}; connection aborted");
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match t.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => unreachable!("the thread sends before it ends"),
        },
    }
}

/// Bytes that differ from page to page and within a page; `seed` varies them.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes `data` at `off` into the model of a file's content.
fn model_write(model: &mut Vec<u8>, off: usize, data: &[u8]) {
    if model.len() < off + data.len() {
        model.resize(off + data.len(), 0);
    }
    model[off..off + data.len()].copy_from_slice(data);
}

/// A page-aligned buffer holding `data` (O_DIRECT needs aligned memory).
struct Aligned {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new(data: &[u8]) -> Self {
        let mut raw = vec![0u8; data.len() + 4096];
        let start = (4096 - raw.as_ptr() as usize % 4096) % 4096;
        raw[start..start + data.len()].copy_from_slice(data);
        Self {
            raw,
            start,
            len: data.len(),
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

const SIZES: [usize; 6] = [1, 4096, 65_536, 131_073, 300_001, MAX_WRITE];

// --- passthrough_ll as a program ---------------------------------------

/// passthrough_ll serving `tm.root()/src`; SIGTERM (then SIGKILL) on drop.
struct Daemon {
    child: Option<Child>,
    mnt: PathBuf,
    stats: PathBuf,
    src: PathBuf,
}

impl Daemon {
    fn start(tm: &TempMountpoint, opts: &str) -> Daemon {
        let src = tm.root().join("src");
        fs::create_dir_all(&src).unwrap();
        fs::set_permissions(&src, fs::Permissions::from_mode(0o777)).unwrap();
        let stats = tm.root().join("stats.json");
        let opts = if common::over_uring() {
            format!("{opts},uring")
        } else {
            opts.to_string()
        };
        let mut child = Command::new(common::example_binary("passthrough_ll"))
            .arg(&src)
            .arg(tm.path())
            .arg("-o")
            .arg(&opts)
            .arg("--stats")
            .arg(&stats)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start passthrough_ll");
        common::wait_for_mount(&mut child, tm.path(), "passthrough_ll");
        Daemon {
            child: Some(child),
            mnt: tm.path().to_path_buf(),
            stats,
            src,
        }
    }

    /// SIGTERM, wait (10 s at most); the `spliced_writes` and WRITE counts.
    fn stop(mut self) -> (u64, u64) {
        let status = self.terminate();
        assert!(
            status.is_some_and(|s| s.success()),
            "daemon ended with {status:?}"
        );
        let json = fs::read_to_string(&self.stats).expect("stats file");
        let writes = json
            .find("\"WRITE\": {")
            .and_then(|at| common::json_number(&json[at..], "count"))
            .unwrap_or(0);
        let spliced = common::json_number(&json, "spliced_writes").expect("spliced_writes in the statistics");
        if common::over_uring() {
            // The io_uring pass must really have used the rings.
            assert!(
                common::json_number(&json, "uring").is_some_and(|n| n > 0),
                "FUSE_WIRE_TEST_TRANSPORT=uring but no request went over io_uring: {json}"
            );
        }
        (spliced, writes)
    }

    fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        common::terminate_daemon(self.child.take()?, &self.mnt)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// Writes every size of [`SIZES`] at several offsets into `name` on the
/// mount (each write on its own), checking the source after each; returns
/// how many of the writes were at least `min` bytes.
fn write_sizes(mnt: &Path, src: &Path, name: &str, direct: bool, min: usize) -> u64 {
    let (mnt, src, name) = (mnt.to_path_buf(), src.to_path_buf(), name.to_string());
    let what = format!("writes to {name} (O_DIRECT {direct})");
    let m2 = mnt.clone();
    bounded(&m2, &what, move || {
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create(true).truncate(false);
        if direct {
            opts.custom_flags(libc::O_DIRECT);
        }
        let f = opts.open(mnt.join(&name)).unwrap();
        let mut model = Vec::new();
        let mut big = 0;
        let offsets: &[usize] = if direct {
            &[0, 4096, 1 << 20]
        } else {
            &[0, 1, 4095, 65_536 + 17]
        };
        for (i, &size) in SIZES.iter().enumerate() {
            for (j, &off) in offsets.iter().enumerate() {
                let data = pattern(size, (i * 10 + j) as u64);
                // O_DIRECT: aligned memory, and sizes the source can take.
                let buf = Aligned::new(&data);
                let n = f.write_at(buf.bytes(), off as u64).unwrap();
                assert_eq!(n, size, "write of {size} at {off}");
                model_write(&mut model, off, &data);
                big += u64::from(size >= min);
                let got = fs::read(src.join(&name)).unwrap();
                assert_eq!(got.len(), model.len(), "{name}: size after {size} at {off}");
                assert!(
                    got == model,
                    "{name}: wrong bytes after a write of {size} at {off}"
                );
            }
        }
        big
    })
}

fn expected_spliced(big: u64) -> u64 {
    // The rings deliver WRITE data in memory: nothing is spliced there.
    if common::over_uring() { 0 } else { big }
}

#[test]
fn passthrough_spliced_writes_reach_the_source_exactly() {
    if !require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("splice-write");
    let d = Daemon::start(&tm, "cache=never,splice_write");
    let src = d.src.clone();
    let mut big = write_sizes(tm.path(), &src, "plain", false, 65_536);
    big += write_sizes(tm.path(), &src, "direct", true, 65_536);
    let (spliced, writes) = d.stop();
    assert!(writes >= 2 * 6 * 3, "{writes} WRITEs");
    assert_eq!(
        spliced,
        expected_spliced(big),
        "WRITEs of 64 KiB and more spliced ({writes} in all)"
    );
}

#[test]
fn passthrough_page_cache_and_append_writes_with_splice() {
    if !require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("splice-write-cached");
    let d = Daemon::start(&tm, "cache=auto,splice_write,splice_write_min=4096");
    let (mnt, src) = (tm.path().to_path_buf(), d.src.clone());
    bounded(tm.path(), "page-cache and O_APPEND writes", move || {
        // Through the page cache (write-through): the kernel sends its pages.
        let data = pattern(3 * 1024 * 1024 + 123, 7);
        fs::write(mnt.join("cached"), &data).unwrap();
        assert!(
            fs::read(src.join("cached")).unwrap() == data,
            "page-cache writes: wrong bytes"
        );
        // O_APPEND: the source descriptor is O_APPEND and takes no splice;
        // the payload is written from memory and still appended.
        fs::write(src.join("log"), b"start").unwrap();
        let f = OpenOptions::new().append(true).open(mnt.join("log")).unwrap();
        let mut model = b"start".to_vec();
        for (i, size) in [70_000usize, 1, 200_000, 4096].into_iter().enumerate() {
            let chunk = pattern(size, 100 + i as u64);
            std::io::Write::write_all(&mut &f, &chunk).unwrap();
            model.extend_from_slice(&chunk);
            assert!(
                fs::read(src.join("log")).unwrap() == model,
                "append of {size}: wrong bytes"
            );
        }
    });
    let (spliced, _) = d.stop();
    if !common::over_uring() {
        assert!(spliced > 0, "no WRITE was spliced");
    }
}

#[test]
fn passthrough_without_splice_write_or_with_too_large_a_max_write_reads_payloads() {
    if !require_mount_capability() {
        return;
    }
    for opts in ["cache=never", "cache=never,splice_write,max_write=1048576"] {
        let tm = TempMountpoint::new("splice-write-off");
        let d = Daemon::start(&tm, opts);
        let src = d.src.clone();
        let big = write_sizes(tm.path(), &src, "f", false, 65_536);
        let (spliced, _) = d.stop();
        assert!(big > 0);
        assert_eq!(spliced, 0, "-o {opts}: nothing may be spliced");
    }
}

// --- a filesystem of our own, in this process --------------------------

const KEEP_INO: u64 = 2;
const IGNORE_INO: u64 = 3;
const FETCH_INO: u64 = 4;

/// Writes to `keep` are spliced into a file, to `fetch` fetched and
/// written; writes to `ignore` are answered without touching the payload.
struct SinkFs {
    keep: File,
    fetched: File,
    in_pipe: AtomicU64,
}

impl SinkFs {
    fn attr(&self, ino: u64) -> FileAttr {
        let (mode, nlink) = match ino {
            1 => (libc::S_IFDIR | 0o755, 2),
            _ => (libc::S_IFREG | 0o666, 1),
        };
        FileAttr::from_abi(&Attr {
            ino,
            mode,
            nlink,
            blksize: 4096,
            ..Default::default()
        })
        .expect("a valid mode")
    }
}

impl Filesystem for SinkFs {
    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        config.max_write = MAX_WRITE as u32;
        Ok(())
    }

    fn lookup(&self, _ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        let ino = match (parent, name.to_bytes()) {
            (Inode::ROOT, b"keep") => KEEP_INO,
            (Inode::ROOT, b"ignore") => IGNORE_INO,
            (Inode::ROOT, b"fetch") => FETCH_INO,
            _ => return reply.error(Errno::ENOENT),
        };
        reply.entry(&Entry {
            ino: Inode(ino),
            attr: self.attr(ino),
            ..Default::default()
        });
    }

    fn getattr(&self, _ctx: &RequestContext<'_>, ino: Inode, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino.0 {
            1 | KEEP_INO | IGNORE_INO | FETCH_INO => reply.attr(Duration::ZERO, &self.attr(ino.0)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _ctx: &RequestContext<'_>, ino: Inode, _flags: OpenFlags, reply: ReplyOpen) {
        match ino.0 {
            KEEP_INO | IGNORE_INO | FETCH_INO => reply.opened(FileHandle(0), FopenFlags::DIRECT_IO),
            _ => reply.error(Errno::EISDIR),
        }
    }

    fn write(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        if req.data.is_in_pipe() {
            self.in_pipe.fetch_add(1, Ordering::Relaxed);
        }
        let len = req.data.len() as u32;
        match ino.0 {
            KEEP_INO => match req.data.splice_to(self.keep.as_fd(), req.offset) {
                Ok(n) => reply.written(n as u32),
                Err(e) => reply.io_error(&e),
            },
            FETCH_INO => match req.data.fetch() {
                Ok(b) => match self.fetched.write_at(b, req.offset) {
                    Ok(n) => reply.written(n as u32),
                    Err(e) => reply.io_error(&e),
                },
                Err(e) => reply.io_error(&e),
            },
            // The payload stays where it is; the session must drain it.
            _ => reply.written(len),
        }
    }
}

#[test]
fn handlers_splice_fetch_or_leave_payloads_and_the_pipe_stays_in_step() {
    if !require_mount_capability() {
        return;
    }
    let mnt = TempMountpoint::new("splice-write-own");
    let keep_path = mnt.root().join("keep");
    let fetched_path = mnt.root().join("fetched");
    let open_rw = |p: &Path| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(p)
            .unwrap()
    };
    let fs = Arc::new(SinkFs {
        keep: open_rw(&keep_path),
        fetched: open_rw(&fetched_path),
        in_pipe: AtomicU64::new(0),
    });
    let opts = MountOptions {
        subtype: Some("fwsplicew".into()),
        ..Default::default()
    };
    let cfg = SessionConfig {
        workers: 1,
        max_workers: 1,
        // One thread reads everything: a payload left in the pipe would
        // reach the next request on it.
        grow_after: Duration::from_secs(3600),
        transport: common::test_transport(),
        splice_write: true,
        ..Default::default()
    };
    let running = Session::mount_arc(fs.clone(), mnt.path(), &opts, cfg)
        .expect("mount")
        .spawn()
        .expect("spawn");
    for _ in 0..500 {
        if running.handle().negotiated().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(running.handle().negotiated().is_some(), "INIT did not complete");

    let m = mnt.path().to_path_buf();
    let (kp, fp) = (keep_path.clone(), fetched_path.clone());
    let big = bounded(mnt.path(), "writes to the in-process filesystem", move || {
        let keep = OpenOptions::new().write(true).open(m.join("keep")).unwrap();
        let ignore = OpenOptions::new().write(true).open(m.join("ignore")).unwrap();
        let fetch = OpenOptions::new().write(true).open(m.join("fetch")).unwrap();
        let (mut kmodel, mut fmodel) = (Vec::new(), Vec::new());
        let mut big = 0u64;
        for (i, &size) in SIZES.iter().enumerate() {
            for (j, off) in [0usize, 3, 8192 + 5].into_iter().enumerate() {
                let seed = (i * 10 + j) as u64;
                // Ignored (left in the pipe), then kept: the kept bytes must
                // be this write's, not the ignored one's.
                let junk = pattern(size, seed + 1000);
                assert_eq!(ignore.write_at(&junk, off as u64).unwrap(), size);
                let data = pattern(size, seed);
                assert_eq!(keep.write_at(&data, off as u64).unwrap(), size);
                model_write(&mut kmodel, off, &data);
                assert!(
                    fs::read(&kp).unwrap() == kmodel,
                    "keep: wrong bytes after {size} at {off}"
                );
                let data = pattern(size, seed + 2000);
                assert_eq!(fetch.write_at(&data, off as u64).unwrap(), size);
                model_write(&mut fmodel, off, &data);
                assert!(
                    fs::read(&fp).unwrap() == fmodel,
                    "fetch: wrong bytes after {size} at {off}"
                );
                big += 3 * u64::from(size >= session::SPLICE_WRITE_MIN);
            }
        }
        big
    });
    let stats = running.handle().stats();
    if common::over_uring() {
        let t = running.handle().transport();
        assert!(
            t.as_ref().is_some_and(TransportInfo::is_uring),
            "FUSE_WIRE_TEST_TRANSPORT=uring but the session serves over {t:?}"
        );
    }
    assert_eq!(stats.get(fuse_wire::proto::Opcode::Write).errors, 0, "{stats:?}");
    let want = expected_spliced(big);
    assert_eq!(stats.transport.spliced_writes, want, "{stats:?}");
    assert_eq!(fs.in_pipe.load(Ordering::Relaxed), want);
    running.stop().expect("session report");
    assert!(
        wait_unmounted(mnt.path(), Duration::from_secs(5)),
        "stop() left the mount behind"
    );
}

// --- the reader beyond the cap, with a channel of our own --------------

mod common_fake;

use fuse_wire::proto::Reply;
use fuse_wire::session::transport::{Channel, ReplySink, RequestSource};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::{Condvar, Mutex};

/// Requests handed to the session as the kernel's splice would: written
/// into the worker's pipe. Replies are kept.
#[derive(Default)]
struct PipeChan {
    queue: Mutex<(VecDeque<Vec<u8>>, bool)>,
    /// Threads waiting in `take` for a request (changed under `queue`).
    waiting: std::sync::atomic::AtomicUsize,
    ready: Condvar,
    replies: Mutex<Vec<Vec<u8>>>,
    replied: Condvar,
}

impl PipeChan {
    fn push(&self, req: Vec<u8>) {
        self.queue.lock().unwrap().0.push_back(req);
        self.ready.notify_all();
    }

    fn close(&self) {
        self.queue.lock().unwrap().1 = true;
        self.ready.notify_all();
    }

    fn take(&self) -> io::Result<Vec<u8>> {
        let mut q = self.queue.lock().unwrap();
        loop {
            if let Some(r) = q.0.pop_front() {
                return Ok(r);
            }
            if q.1 {
                return Err(io::Error::from_raw_os_error(libc::ENODEV));
            }
            self.waiting.fetch_add(1, Ordering::SeqCst);
            q = self.ready.wait(q).unwrap();
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn wait_until(&self, what: &str, cond: impl Fn(&PipeChan) -> bool) {
        let deadline = Instant::now() + FAKE_DEADLINE;
        while !cond(self) {
            assert!(Instant::now() < deadline, "waited {FAKE_DEADLINE:?} for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

use std::io;

struct ChanRef(Arc<PipeChan>);

impl RequestSource for ChanRef {
    fn receive(&self, buf: &mut [u8]) -> io::Result<usize> {
        let r = self.0.take()?;
        buf[..r.len()].copy_from_slice(&r);
        Ok(r.len())
    }

    fn supports_splice_receive(&self) -> bool {
        true
    }

    fn receive_to_pipe(
        &self,
        pipe: BorrowedFd<'_>,
        len: usize,
        _timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let r = self.0.take()?;
        assert!(r.len() <= len);
        // SAFETY: write(2) from a live buffer of `r.len()` bytes into the
        // pipe descriptor borrowed for this call.
        let n = unsafe { libc::write(pipe.as_raw_fd(), r.as_ptr().cast(), r.len()) };
        assert_eq!(n, r.len() as isize, "the request fits the pipe");
        Ok(r.len())
    }

    fn try_clone(&self) -> io::Result<Arc<dyn Channel>> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

impl ReplySink for ChanRef {
    fn send(&self, msg: &Reply<'_>) -> io::Result<()> {
        let mut v = vec![0u8; msg.len()];
        msg.copy_to(&mut v).unwrap();
        self.0.replies.lock().unwrap().push(v);
        self.0.replied.notify_all();
        Ok(())
    }

    fn raw_fd(&self) -> Option<RawFd> {
        None
    }

    fn describe(&self) -> String {
        "splice-write test channel".into()
    }
}

/// Records each WRITE (offset, whether it came in the pipe, its bytes);
/// the WRITE at offset 0 waits for the gate; a WRITE at offset 1 panics.
#[derive(Default)]
struct GateFs {
    gate: Mutex<bool>,
    opened: Condvar,
    entered: std::sync::atomic::AtomicBool,
    seen: Mutex<Vec<(u64, bool, Vec<u8>)>>,
}

impl Filesystem for GateFs {
    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        config.max_write = MAX_WRITE as u32;
        Ok(())
    }

    fn write(
        &self,
        _ctx: &RequestContext<'_>,
        _ino: Inode,
        _fh: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        if req.offset == 1 {
            panic!("a handler that panics with its payload in the pipe");
        }
        if req.offset == 0 {
            self.entered.store(true, Ordering::SeqCst);
            let mut g = self.gate.lock().unwrap();
            let deadline = Instant::now() + FAKE_DEADLINE;
            while !*g && Instant::now() < deadline {
                g = self.opened.wait_timeout(g, Duration::from_millis(50)).unwrap().0;
            }
        }
        let in_pipe = req.data.is_in_pipe();
        match req.data.to_vec() {
            Ok(bytes) => {
                self.seen.lock().unwrap().push((req.offset, in_pipe, bytes));
                reply.written(req.data.len() as u32)
            }
            Err(e) => reply.io_error(&e),
        }
    }
}

fn write_request(unique: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    let body = common_fake::B::new()
        .u64(1)
        .u64(offset)
        .u32(data.len() as u32)
        .u32(0)
        .u64(0)
        .u32(0)
        .u32(0)
        .bytes(data)
        .done();
    common_fake::request(16, unique, 2, &body)
}

struct Close(Arc<PipeChan>);

impl Drop for Close {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// A session on a [`PipeChan`] with one handler slot, past INIT.
/// How long the fake-kernel tests wait for a step before failing: long,
/// because a full test run on two loaded cores can starve a thread for
/// seconds, and a deadline only matters when something is already wrong
/// (the gated handler would otherwise give up and run into the wrong path).
const FAKE_DEADLINE: Duration = Duration::from_secs(60);

fn start_gated(grow_after: Duration) -> (Arc<PipeChan>, Arc<GateFs>, RunningSession, Close) {
    let chan = Arc::new(PipeChan::default());
    let fs = Arc::new(GateFs::default());
    let cfg = SessionConfig {
        workers: 1,
        max_workers: 1,
        clone_fd: false,
        grow_after,
        splice_write: true,
        ..Default::default()
    };
    let running = Session::from_arc(fs.clone(), Arc::new(ChanRef(chan.clone())), cfg)
        .unwrap()
        .spawn()
        .unwrap();
    let close = Close(chan.clone());
    chan.push(common_fake::request(
        common_fake::OP_INIT,
        1,
        0,
        &common_fake::init_body(7, 45, 131_072, 0x7fff_ffff),
    ));
    chan.wait_until("the INIT reply", |c| c.replies.lock().unwrap().len() == 1);
    (chan, fs, running, close)
}

/// (error, unique) of each reply after INIT, by unique.
fn reply_headers(chan: &PipeChan) -> Vec<(i32, u64)> {
    let mut got: Vec<(i32, u64)> = chan.replies.lock().unwrap()[1..]
        .iter()
        .map(|r| {
            (
                i32::from_ne_bytes(r[4..8].try_into().unwrap()),
                u64::from_ne_bytes(r[8..16].try_into().unwrap()),
            )
        })
        .collect();
    got.sort_by_key(|&(_, u)| u);
    got
}

fn end_session(chan: &PipeChan, running: RunningSession) -> SessionReport {
    chan.close();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(running.join());
    });
    rx.recv_timeout(FAKE_DEADLINE)
        .expect("the session ends in time")
        .unwrap()
}

/// A large WRITE read while every handler slot is taken is queued for
/// another thread: its payload must be read out of the reader's pipe first
/// (the queue holds bytes, and that pipe is the reader's own).
#[test]
fn a_write_queued_at_the_cap_is_read_out_of_the_pipe_first() {
    let (chan, fs, running, _close) = start_gated(Duration::from_millis(10));
    let (a, b) = (pattern(128 * 1024, 1), pattern(128 * 1024 + 5, 2));
    chan.push(write_request(10, 0, &a));
    chan.wait_until("the first WRITE's handler", |_| fs.entered.load(Ordering::SeqCst));
    chan.push(write_request(12, 1 << 20, &b));
    // Taken while the only handler slot is held, by the reader beyond the
    // cap, which queues it and reads again: wait until it is back in `take`
    // (had it served the WRITE itself, which it must not while the slot is
    // held, the check below of where the bytes came from fails).
    chan.wait_until("the reader beyond the cap queueing the second WRITE", |c| {
        let q = c.queue.lock().unwrap();
        q.0.is_empty() && c.waiting.load(Ordering::SeqCst) > 0
    });
    *fs.gate.lock().unwrap() = true;
    fs.opened.notify_all();
    chan.wait_until("both WRITE replies", |c| c.replies.lock().unwrap().len() == 3);
    assert_eq!(reply_headers(&chan), [(0, 10), (0, 12)]);
    let seen = fs.seen.lock().unwrap().clone();
    let find = |off: u64| {
        seen.iter()
            .find(|s| s.0 == off)
            .cloned()
            .expect("a WRITE recorded")
    };
    let (_, a_in_pipe, a_bytes) = find(0);
    assert!(a_in_pipe, "the first WRITE was served from the pipe");
    assert!(a_bytes == a, "first WRITE: wrong bytes");
    let (_, b_in_pipe, b_bytes) = find(1 << 20);
    assert!(!b_in_pipe, "the queued WRITE came as bytes");
    assert!(b_bytes == b, "queued WRITE: wrong bytes");
    let report = end_session(&chan, running);
    assert_eq!(report.stats.transport.spliced_writes, 1, "{:?}", report.stats);
}

/// A handler that panics with the payload in the pipe gets EIO, the payload
/// is drained, and the next WRITE (on the same, only, thread) is intact.
#[test]
fn a_handler_that_panics_with_its_payload_in_the_pipe_leaves_it_clean() {
    // No thread beyond the one worker: the next WRITE comes through its pipe.
    let (chan, fs, running, _close) = start_gated(Duration::from_secs(3600));
    *fs.gate.lock().unwrap() = true;
    chan.push(write_request(14, 1, &pattern(200_000, 4)));
    chan.wait_until("the panicking handler's reply", |c| {
        c.replies.lock().unwrap().len() == 2
    });
    let c = pattern(100_000, 3);
    chan.push(write_request(16, 4096, &c));
    chan.wait_until("the next WRITE's reply", |c| c.replies.lock().unwrap().len() == 3);
    assert_eq!(reply_headers(&chan), [(-libc::EIO, 14), (0, 16)]);
    let seen = fs.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let (off, in_pipe, bytes) = seen[0].clone();
    assert_eq!(off, 4096);
    assert!(in_pipe, "the next WRITE came in the pipe");
    assert!(bytes == c, "the WRITE after the panic: wrong bytes");
    let report = end_session(&chan, running);
    assert_eq!(report.stats.transport.spliced_writes, 2, "{:?}", report.stats);
}
