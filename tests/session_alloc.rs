//! The request path does not allocate: after a warm-up, READ, WRITE, GETATTR,
//! LOOKUP and CREATE requests are served by the session's workers without a single
//! heap allocation on the worker threads.
//!
//! A counting global allocator (this binary only) counts allocations on
//! threads marked as session workers while the measured phase runs. The
//! fake kernel of fuse-session copies every reply into a new `Vec`, which
//! would be counted on the worker, so this test brings its own [`Channel`]
//! that copies requests out of and replies into buffers allocated up front.
//!
//! With `splice_write` the channel also "splices" each request into the
//! worker's pipe (a `write(2)` into it, as the kernel's splice would fill
//! it), so that large WRITEs are served with their payload in the pipe and
//! spliced by the handler into a file.

mod common_fake;

use common_fake::*;
use fuse_wire::proto::Reply;
use fuse_wire::proto::flags::FopenFlags;
use fuse_wire::session::context::RequestContext;
use fuse_wire::session::ops::*;
use fuse_wire::session::reply::{ReplyAttr, ReplyCreate, ReplyData, ReplyEntry, ReplyWrite};
use fuse_wire::session::transport::{Channel, ReplySink, RequestSource};
use fuse_wire::session::types::FileHandle;
use fuse_wire::session::{Filesystem, Inode, Session, SessionConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::Cell;
use std::collections::VecDeque;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

// ---- the counting allocator ----

struct Counting;

static MEASURING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
static FIRST: Mutex<Option<Backtrace>> = Mutex::new(None);

thread_local! {
    /// Set by the filesystem on the threads it is called on (the workers).
    static WORKER: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread records a backtrace (which allocates itself).
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if !MEASURING.load(Ordering::Relaxed) {
        return;
    }
    let counted =
        WORKER.try_with(|w| w.get()).unwrap_or(false) && !IN_HOOK.try_with(|h| h.get()).unwrap_or(true);
    if !counted {
        return;
    }
    if ALLOCATIONS.fetch_add(1, Ordering::Relaxed) == 0 {
        // Remember where the first one came from (not counted itself).
        IN_HOOK.with(|h| h.set(true));
        let bt = Backtrace::force_capture();
        if let Ok(mut f) = FIRST.try_lock() {
            *f = Some(bt);
        }
        IN_HOOK.with(|h| h.set(false));
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// bookkeeping only touches atomics and const-initialised thread locals.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ---- a channel that does not allocate per message ----

#[derive(Default)]
struct Queue {
    requests: VecDeque<Vec<u8>>,
    closed: bool,
}

struct Replies {
    /// The last reply, copied into a buffer allocated up front.
    last: Vec<u8>,
    count: usize,
    errors: usize,
    bytes: usize,
}

struct TestChannel {
    queue: Mutex<Queue>,
    ready: Condvar,
    replies: Mutex<Replies>,
    replied: Condvar,
}

impl TestChannel {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(Queue {
                requests: VecDeque::with_capacity(8192),
                closed: false,
            }),
            ready: Condvar::new(),
            replies: Mutex::new(Replies {
                last: vec![0; 1 << 21],
                count: 0,
                errors: 0,
                bytes: 0,
            }),
            replied: Condvar::new(),
        })
    }

    fn push(&self, reqs: impl IntoIterator<Item = Vec<u8>>) {
        let mut q = self.queue.lock().unwrap();
        q.requests.extend(reqs);
        self.ready.notify_all();
    }

    fn close(&self) {
        self.queue.lock().unwrap().closed = true;
        self.ready.notify_all();
    }

    /// Waits until `n` replies were sent in total; returns (count, errors).
    fn wait_replies(&self, n: usize) -> (usize, usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut r = self.replies.lock().unwrap();
        while r.count < n {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "only {} of {n} replies arrived", r.count);
            r = self.replied.wait_timeout(r, left).unwrap().0;
        }
        (r.count, r.errors)
    }

    fn reply_bytes(&self) -> usize {
        self.replies.lock().unwrap().bytes
    }
}

/// Ends the session's receive loops even if the test fails half-way.
struct CloseOnDrop(Arc<TestChannel>);
impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

struct Shared(Arc<TestChannel>);

impl RequestSource for Shared {
    fn receive(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut q = self.0.queue.lock().unwrap();
        loop {
            if let Some(req) = q.requests.pop_front() {
                drop(q);
                if req.len() > buf.len() {
                    return Err(io::Error::from_raw_os_error(libc::EINVAL));
                }
                buf[..req.len()].copy_from_slice(&req);
                return Ok(req.len());
            }
            if q.closed {
                return Err(io::Error::from_raw_os_error(libc::ENODEV));
            }
            q = self.0.ready.wait(q).unwrap();
        }
    }

    fn try_clone(&self) -> io::Result<Arc<dyn Channel>> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

impl ReplySink for Shared {
    fn send(&self, msg: &Reply<'_>) -> io::Result<()> {
        let mut r = self.0.replies.lock().unwrap();
        let n = msg
            .copy_to(&mut r.last)
            .expect("reply larger than the test's buffer");
        r.count += 1;
        r.bytes += n;
        if msg.header().error != 0 {
            r.errors += 1;
        }
        self.0.replied.notify_all();
        Ok(())
    }

    fn raw_fd(&self) -> Option<RawFd> {
        None
    }

    fn describe(&self) -> String {
        "allocation-test channel".into()
    }
}

/// [`Shared`], plus requests delivered into the worker's pipe.
struct Piped(Arc<TestChannel>);

impl RequestSource for Piped {
    fn receive(&self, buf: &mut [u8]) -> io::Result<usize> {
        Shared(self.0.clone()).receive(buf)
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
        let mut q = self.0.queue.lock().unwrap();
        loop {
            if let Some(req) = q.requests.pop_front() {
                drop(q);
                if req.len() > len {
                    return Err(io::Error::from_raw_os_error(libc::EINVAL));
                }
                use std::os::fd::AsRawFd;
                // SAFETY: write(2) from a live buffer of `req.len()` bytes
                // into the pipe descriptor borrowed for this call.
                let n = unsafe { libc::write(pipe.as_raw_fd(), req.as_ptr().cast(), req.len()) };
                if n < 0 {
                    return Err(io::Error::last_os_error());
                }
                assert_eq!(n as usize, req.len(), "the whole request fits the pipe");
                return Ok(req.len());
            }
            if q.closed {
                return Err(io::Error::from_raw_os_error(libc::ENODEV));
            }
            q = self.0.ready.wait(q).unwrap();
        }
    }

    fn try_clone(&self) -> io::Result<Arc<dyn Channel>> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

impl ReplySink for Piped {
    fn send(&self, msg: &Reply<'_>) -> io::Result<()> {
        Shared(self.0.clone()).send(msg)
    }

    fn raw_fd(&self) -> Option<RawFd> {
        None
    }

    fn describe(&self) -> String {
        "allocation-test channel with a pipe".into()
    }
}

// ---- a filesystem that answers without allocating ----

static DATA: [u8; 4096] = [0x5a; 4096];

struct QuietFs {
    workers_marked: AtomicUsize,
    not_a_worker: AtomicBool,
    /// Where payloads left in the pipe are spliced to (`splice_write` only).
    sink: Option<std::fs::File>,
    spliced: AtomicUsize,
}

impl QuietFs {
    fn new(sink: Option<std::fs::File>) -> Self {
        Self {
            workers_marked: AtomicUsize::new(0),
            not_a_worker: AtomicBool::new(false),
            sink,
            spliced: AtomicUsize::new(0),
        }
    }
}

impl QuietFs {
    fn mark(&self) {
        WORKER.with(|w| {
            if !w.get() {
                w.set(true);
                let t = std::thread::current();
                if !t.name().is_some_and(|n| n.starts_with("fuse-worker")) {
                    self.not_a_worker.store(true, Ordering::Relaxed);
                }
                self.workers_marked.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}

impl Filesystem for QuietFs {
    fn init(&self, config: &mut fuse_wire::session::InitConfig) -> Result<(), fuse_wire::session::Errno> {
        if self.sink.is_some() {
            // A whole request must fit the 1 MiB pipe.
            config.max_write = 512 * 1024;
        }
        Ok(())
    }

    fn lookup(&self, _ctx: &RequestContext<'_>, _parent: Inode, _name: &CStr, reply: ReplyEntry) {
        self.mark();
        reply.entry(&entry(10))
    }

    fn getattr(&self, _ctx: &RequestContext<'_>, ino: Inode, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.mark();
        reply.attr(ATTR_TTL, &file_attr(ino.0))
    }

    fn read(
        &self,
        _ctx: &RequestContext<'_>,
        _ino: Inode,
        _fh: FileHandle,
        req: ReadRequest,
        reply: ReplyData,
    ) {
        let offset = req.offset;
        let size = req.size;
        self.mark();
        let start = (offset as usize).min(DATA.len());
        let end = (start + size as usize).min(DATA.len());
        reply.data(&DATA[start..end])
    }

    fn create(
        &self,
        _ctx: &RequestContext<'_>,
        _parent: Inode,
        _name: &CStr,
        _req: CreateRequest,
        reply: ReplyCreate,
    ) {
        self.mark();
        reply.created(&entry(11), FileHandle(3), FopenFlags::empty())
    }

    fn write(
        &self,
        _ctx: &RequestContext<'_>,
        _ino: Inode,
        _fh: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        let data = req.data;
        self.mark();
        if let (true, Some(sink)) = (data.is_in_pipe(), &self.sink) {
            self.spliced.fetch_add(1, Ordering::Relaxed);
            return match data.splice_to(sink.as_fd(), 0) {
                Ok(n) => reply.written(n as u32),
                Err(_) => reply.error(fuse_wire::session::Errno::EIO),
            };
        }
        reply.written(data.len() as u32)
    }
}

fn requests(first_unique: u64, rounds: usize) -> Vec<Vec<u8>> {
    let mut u = first_unique;
    let mut next = || {
        u += 2;
        u
    };
    let mut v = Vec::with_capacity(rounds * PER_ROUND);
    for _ in 0..rounds {
        let read = B::new()
            .u64(1)
            .u64(0)
            .u32(4096)
            .u32(0)
            .u64(0)
            .u32(0)
            .u32(0)
            .done();
        v.push(request(15, next(), 2, &read));
        let write = B::new()
            .u64(1)
            .u64(0)
            .u32(4096)
            .u32(0)
            .u64(0)
            .u32(0)
            .u32(0)
            .bytes(&[7; 4096])
            .done();
        v.push(request(16, next(), 2, &write));
        v.push(request(3, next(), 2, &[0; 16]));
        v.push(request(1, next(), 1, &B::new().cstr("file").done()));
        // fuse_create_in: flags, mode, umask, open_flags; then the name.
        let create = B::new()
            .u32(libc::O_WRONLY as u32)
            .u32(0o100644)
            .u32(0o022)
            .u32(0)
            .cstr("new")
            .done();
        v.push(request(35, next(), 1, &create));
    }
    v
}

/// Requests in one round of [`requests`].
const PER_ROUND: usize = 5;

const N: usize = 1000;
const WARMUP: usize = 100;

#[test]
fn workers_do_not_allocate_per_request() {
    let chan = TestChannel::new();
    let fs = Arc::new(QuietFs::new(None));
    let config = SessionConfig {
        workers: 2,
        max_workers: 2,
        clone_fd: false,
        // This test measures the workers' own path. On a loaded machine a
        // handler can run past the default 20 ms, and the pool would start
        // its reader beyond the cap, which copies what it reads at the cap
        // into a queued job (an allocation on that saturated path only).
        grow_after: Duration::from_secs(3600),
        ..Default::default()
    };
    let session = Session::from_arc(fs.clone(), Arc::new(Shared(chan.clone())), config).unwrap();
    let running = session.spawn().unwrap();
    let _close = CloseOnDrop(chan.clone());

    chan.push([request(OP_INIT, 1, 0, &init_body(7, 45, 131072, 0x7fff_ffff))]);
    assert_eq!(chan.wait_replies(1), (1, 0), "INIT answered");

    // Warm up until both workers have served requests (their thread locals,
    // buffers and first-use paths are set up).
    let mut sent = 1;
    let mut unique = 10;
    let start = Instant::now();
    loop {
        let batch = requests(unique, WARMUP);
        unique += 2 * (PER_ROUND * WARMUP) as u64;
        sent += batch.len();
        chan.push(batch);
        chan.wait_replies(sent);
        if fs.workers_marked.load(Ordering::Relaxed) == 2 {
            break;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "the second worker never served a request"
        );
    }
    assert!(
        !fs.not_a_worker.load(Ordering::Relaxed),
        "handlers ran on non-worker threads"
    );

    // The measured phase.
    let batch = requests(unique, N);
    let measured = batch.len();
    let bytes_before = chan.reply_bytes();
    MEASURING.store(true, Ordering::SeqCst);
    chan.push(batch);
    let (count, errors) = chan.wait_replies(sent + measured);
    MEASURING.store(false, Ordering::SeqCst);
    assert_eq!(count, sent + measured);
    assert_eq!(errors, 0, "every request succeeded");
    // READ 4096 bytes, WRITE write_out, GETATTR attr_out, LOOKUP entry_out,
    // CREATE entry_out + open_out.
    let per_round = (16 + 4096) + (16 + 8) + (16 + 104) + (16 + 128) + (16 + 128 + 16);
    assert_eq!(chan.reply_bytes() - bytes_before, N * per_round);

    let allocations = ALLOCATIONS.load(Ordering::SeqCst);
    if allocations != 0 {
        let bt = FIRST.lock().unwrap().take();
        panic!(
            "the workers made {allocations} heap allocations for {measured} requests; the first:\n{}",
            bt.map(|b| b.to_string()).unwrap_or_default()
        );
    }

    chan.close();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(running.join());
    });
    let report = rx.recv_timeout(TIMEOUT).expect("the session ends").unwrap();
    assert_eq!(
        report.stats.get(fuse_wire::proto::Opcode::Read).count as usize,
        N + count_warmup(sent)
    );
}

/// READ requests served during INIT and warm-up (one per round after INIT).
fn count_warmup(sent: usize) -> usize {
    (sent - 1) / PER_ROUND
}

/// WRITEs of 128 KiB (left in the worker's pipe and spliced into a file by
/// the handler) and of 4 KiB (read from the pipe), GETATTR and LOOKUP
/// through the pipe: no allocation either.
#[test]
fn spliced_writes_do_not_allocate() {
    let chan = TestChannel::new();
    let sink = tempfile_sink();
    let fs = Arc::new(QuietFs::new(Some(sink)));
    let config = SessionConfig {
        workers: 1,
        max_workers: 1,
        clone_fd: false,
        // No reader beyond the cap: on a loaded machine it would take WRITEs
        // while the worker is busy and queue them as bytes (a copy, not the
        // path measured here).
        grow_after: Duration::from_secs(3600),
        splice_write: true,
        ..Default::default()
    };
    let session = Session::from_arc(fs.clone(), Arc::new(Piped(chan.clone())), config).unwrap();
    let running = session.spawn().unwrap();
    let _close = CloseOnDrop(chan.clone());

    chan.push([request(OP_INIT, 1, 0, &init_body(7, 45, 131072, 0x7fff_ffff))]);
    assert_eq!(chan.wait_replies(1), (1, 0), "INIT answered");

    let big = vec![9u8; 128 * 1024];
    let small = [7u8; 4096];
    let batch = |first: u64, rounds: usize| {
        let mut u = first;
        let mut v = Vec::with_capacity(rounds * 4);
        for _ in 0..rounds {
            for payload in [&big[..], &small[..]] {
                let body = B::new()
                    .u64(1)
                    .u64(0)
                    .u32(payload.len() as u32)
                    .u32(0)
                    .u64(0)
                    .u32(0)
                    .u32(0)
                    .bytes(payload)
                    .done();
                u += 2;
                v.push(request(16, u, 2, &body));
            }
            u += 2;
            v.push(request(3, u, 2, &[0; 16]));
            u += 2;
            v.push(request(1, u, 1, &B::new().cstr("file").done()));
        }
        v
    };
    let warm = batch(10, WARMUP);
    let mut sent = 1 + warm.len();
    chan.push(warm);
    assert_eq!(chan.wait_replies(sent).1, 0, "warm-up requests succeeded");
    assert_eq!(
        fs.spliced.load(Ordering::Relaxed),
        WARMUP,
        "128 KiB WRITEs came in the pipe"
    );

    let measured = batch(10 + 8 * WARMUP as u64 + 8, N);
    let n = measured.len();
    MEASURING.store(true, Ordering::SeqCst);
    chan.push(measured);
    let (count, errors) = chan.wait_replies(sent + n);
    MEASURING.store(false, Ordering::SeqCst);
    sent += n;
    assert_eq!((count, errors), (sent, 0), "every request succeeded");
    assert_eq!(fs.spliced.load(Ordering::Relaxed), WARMUP + N);
    let allocations = ALLOCATIONS.load(Ordering::SeqCst);
    if allocations != 0 {
        let bt = FIRST.lock().unwrap().take();
        panic!(
            "the worker made {allocations} heap allocations for {n} requests through its pipe; the first:\n{}",
            bt.map(|b| b.to_string()).unwrap_or_default()
        );
    }

    chan.close();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(running.join());
    });
    let report = rx.recv_timeout(TIMEOUT).expect("the session ends").unwrap();
    assert_eq!(report.stats.transport.spliced_writes as usize, WARMUP + N);
}

/// An unnamed file to splice payloads into.
fn tempfile_sink() -> std::fs::File {
    let path = std::env::temp_dir().join(format!("fw-alloc-sink-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f
}
