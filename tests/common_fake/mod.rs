//! Helpers for the fake-kernel tests: byte builders for requests and the
//! replies we expect (written field by field, independently of the encoder
//! in fuse-proto), and a harness that runs a session on the fake kernel with
//! every wait bounded.
#![allow(dead_code)]

use fuse_wire::proto::abi::Attr;
use fuse_wire::session::FileAttr;
use fuse_wire::session::transport::fake::FakeKernel;
use fuse_wire::session::types::Entry;
use fuse_wire::session::{Filesystem, Inode, RunningSession, Session, SessionConfig, SessionError};
use fuse_wire::session::{SessionHandle, SessionReport};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a test waits for something that should happen.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// How long a test waits to be sure that something does not happen.
pub const SILENCE: Duration = Duration::from_millis(150);

pub const UID: u32 = 1000;
pub const GID: u32 = 1001;
pub const PID: u32 = 4242;

/// A byte buffer built field by field, in host byte order (as the kernel
/// writes and reads the protocol): the protocol tests' builder.
pub use proto_support::W as B;

#[path = "../proto_support/mod.rs"]
mod proto_support;

/// A request: `fuse_in_header` + body (+ extensions, counted in `total_extlen`).
pub fn request_ext(opcode: u32, unique: u64, nodeid: u64, body: &[u8], ext: &[u8]) -> Vec<u8> {
    assert!(ext.len().is_multiple_of(8), "extensions are 8-byte units");
    let len = 40 + body.len() + ext.len();
    B::new()
        .u32(len as u32)
        .u32(opcode)
        .u64(unique)
        .u64(nodeid)
        .u32(UID)
        .u32(GID)
        .u32(PID)
        .u16((ext.len() / 8) as u16)
        .u16(0)
        .bytes(body)
        .bytes(ext)
        .done()
}

pub fn request(opcode: u32, unique: u64, nodeid: u64, body: &[u8]) -> Vec<u8> {
    request_ext(opcode, unique, nodeid, body, &[])
}

/// A reply: `fuse_out_header` + body.
pub fn reply(unique: u64, error: i32, body: &[u8]) -> Vec<u8> {
    B::new()
        .u32((16 + body.len()) as u32)
        .i32(error)
        .u64(unique)
        .bytes(body)
        .done()
}

pub fn ok_reply(unique: u64, body: &[u8]) -> Vec<u8> {
    reply(unique, 0, body)
}

/// A header-only error reply (`error = -errno`).
pub fn err_reply(unique: u64, errno: i32) -> Vec<u8> {
    reply(unique, -errno, &[])
}

/// A notification: `unique` 0, the code in `error`.
pub fn notification(code: i32, body: &[u8]) -> Vec<u8> {
    reply(0, code, body)
}

pub const OP_INIT: u32 = 26;

/// `fuse_init_in` as a kernel of `7.minor` sends it: 16 bytes before 7.36,
/// 64 since (then `flags2` carries bits 32..63 of `flags`).
pub fn init_body(major: u32, minor: u32, max_readahead: u32, flags: u64) -> Vec<u8> {
    let b = B::new()
        .u32(major)
        .u32(minor)
        .u32(max_readahead)
        .u32(flags as u32);
    if minor >= 36 {
        b.u32((flags >> 32) as u32).zeros(44).done()
    } else {
        b.done()
    }
}

/// The fields of `fuse_init_out` we expect.
#[derive(Clone, Copy, Debug, Default)]
pub struct InitOutFields {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    pub map_alignment: u16,
    pub flags2: u32,
    pub max_stack_depth: u32,
    pub request_timeout: u16,
}

impl InitOutFields {
    /// The first `size` bytes of the 64-byte struct.
    pub fn bytes(&self, size: usize) -> Vec<u8> {
        let full = B::new()
            .u32(self.major)
            .u32(self.minor)
            .u32(self.max_readahead)
            .u32(self.flags)
            .u16(self.max_background)
            .u16(self.congestion_threshold)
            .u32(self.max_write)
            .u32(self.time_gran)
            .u16(self.max_pages)
            .u16(self.map_alignment)
            .u32(self.flags2)
            .u32(self.max_stack_depth)
            .u16(self.request_timeout)
            .zeros(22)
            .done();
        assert_eq!(full.len(), 64);
        full[..size].to_vec()
    }
}

// ---- attributes and entries the test filesystems answer with ----

/// [`attr`] in the typed form handlers reply with (it converts back to the
/// same bytes).
pub fn file_attr(ino: u64) -> FileAttr {
    FileAttr::from_abi(&attr(ino)).expect("a valid mode")
}

pub fn attr(ino: u64) -> Attr {
    Attr {
        ino,
        size: 1000 + ino,
        blocks: 8,
        atime: 1_700_000_000,
        mtime: 1_700_000_001,
        ctime: 1_700_000_002,
        atimensec: 11,
        mtimensec: 22,
        ctimensec: 33,
        mode: 0o100644,
        nlink: 1,
        uid: UID,
        gid: GID,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// `fuse_attr` of [`attr`], field by field.
pub fn attr_bytes(ino: u64) -> Vec<u8> {
    B::new()
        .u64(ino)
        .u64(1000 + ino)
        .u64(8)
        .u64(1_700_000_000)
        .u64(1_700_000_001)
        .u64(1_700_000_002)
        .u32(11)
        .u32(22)
        .u32(33)
        .u32(0o100644)
        .u32(1)
        .u32(UID)
        .u32(GID)
        .u32(0)
        .u32(4096)
        .u32(0)
        .done()
}

pub const ENTRY_TTL: Duration = Duration::from_millis(1500);
pub const ATTR_TTL: Duration = Duration::from_millis(2250);

pub fn entry(ino: u64) -> Entry {
    Entry {
        ino: Inode(ino),
        generation: 7,
        attr: file_attr(ino),
        entry_ttl: ENTRY_TTL,
        attr_ttl: ATTR_TTL,
    }
}

/// `fuse_entry_out` of [`entry`] (128 bytes).
pub fn entry_bytes(ino: u64) -> Vec<u8> {
    B::new()
        .u64(ino)
        .u64(7)
        .u64(1)
        .u64(2)
        .u32(500_000_000)
        .u32(250_000_000)
        .bytes(&attr_bytes(ino))
        .done()
}

/// `fuse_attr_out` for [`attr`] with a validity of [`ATTR_TTL`] (104 bytes).
pub fn attr_out_bytes(ino: u64) -> Vec<u8> {
    B::new()
        .u64(2)
        .u32(250_000_000)
        .u32(0)
        .bytes(&attr_bytes(ino))
        .done()
}

/// `fuse_open_out`.
pub fn open_out_bytes(fh: u64, open_flags: u32) -> Vec<u8> {
    B::new().u64(fh).u32(open_flags).u32(0).done()
}

// ---- the harness ----

/// A session running on the fake kernel.
pub struct Fake<F: Filesystem> {
    pub kernel: FakeKernel,
    pub fs: Arc<F>,
    pub handle: SessionHandle,
    running: Option<RunningSession>,
}

impl<F: Filesystem> Fake<F> {
    /// Spawns a session for `fs`; nothing is sent yet.
    pub fn start(fs: Arc<F>, config: SessionConfig) -> Self {
        let (kernel, chan) = FakeKernel::new();
        let session = Session::from_arc(fs.clone(), chan, config).expect("session");
        let running = session.spawn().expect("spawn");
        let handle = running.handle().clone();
        Self {
            kernel,
            fs,
            handle,
            running: Some(running),
        }
    }

    /// Sends INIT (unique 1) as a kernel of `7.minor` offering `flags` and
    /// returns the reply bytes.
    pub fn init(&self, minor: u32, flags: u64) -> Vec<u8> {
        self.send(request(OP_INIT, 1, 0, &init_body(7, minor, 131072, flags)));
        self.recv()
    }

    /// Sends INIT and waits until the session has published what it negotiated.
    pub fn init_ready(&self, minor: u32, flags: u64) -> Vec<u8> {
        let r = self.init(minor, flags);
        let start = Instant::now();
        while self.handle.negotiated().is_none() {
            assert!(
                start.elapsed() < TIMEOUT,
                "INIT was answered but never took effect"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        r
    }

    pub fn send(&self, bytes: Vec<u8>) {
        self.kernel.send(bytes);
    }

    /// The next message the session wrote (fails the test after [`TIMEOUT`]).
    pub fn recv(&self) -> Vec<u8> {
        match self.kernel.recv(TIMEOUT) {
            Some(w) => w.bytes,
            None => panic!("the session wrote nothing within {TIMEOUT:?}"),
        }
    }

    pub fn recv_within(&self, d: Duration) -> Option<Vec<u8>> {
        self.kernel.recv(d).map(|w| w.bytes)
    }

    /// Asserts that nothing is written for [`SILENCE`].
    pub fn expect_silence(&self, what: &str) {
        if let Some(w) = self.kernel.recv(SILENCE) {
            panic!("{what}: expected no message, got {}", hex(&w.bytes));
        }
    }

    pub fn roundtrip(&self, req: Vec<u8>) -> Vec<u8> {
        self.send(req);
        self.recv()
    }

    /// Waits (bounded) for the session thread to end without unmounting.
    pub fn join_within(&mut self, d: Duration) -> Option<Result<SessionReport, SessionError>> {
        let running = self.running.take().expect("already joined");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(running.join());
        });
        rx.recv_timeout(d).ok()
    }

    /// Unmounts and waits (bounded) for the session to end.
    pub fn unmount_and_join(mut self) -> Result<SessionReport, SessionError> {
        self.kernel.unmount();
        match self.join_within(TIMEOUT) {
            Some(r) => r,
            None => panic!("the session did not end within {TIMEOUT:?} of the unmount"),
        }
    }
}

impl<F: Filesystem> Drop for Fake<F> {
    fn drop(&mut self) {
        self.kernel.unmount();
        if let Some(running) = self.running.take() {
            // Join on a helper thread so that a stuck session cannot hang the
            // test binary; give up after a while.
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                drop(running);
                let _ = tx.send(());
            });
            let _ = rx.recv_timeout(TIMEOUT);
        }
    }
}

/// Polls `cond` until it holds (fails the test after [`TIMEOUT`]).
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < TIMEOUT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub fn hex(b: &[u8]) -> String {
    let mut s = String::new();
    for (i, x) in b.iter().enumerate() {
        if i > 0 && i % 8 == 0 {
            s.push(' ');
        }
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// Compares message bytes, printing both in hex on a mismatch.
#[track_caller]
pub fn assert_bytes(what: &str, got: &[u8], want: &[u8]) {
    if got != want {
        panic!(
            "{what}: bytes differ\n got  ({} B): {}\n want ({} B): {}",
            got.len(),
            hex(got),
            want.len(),
            hex(want)
        );
    }
}
