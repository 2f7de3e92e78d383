//! Must-finish sections (`must_finish`), on real mounts: a caller signalled
//! while its close(2) waits for a slow FLUSH.
//!
//! - objfs, whose upload at FLUSH is a must-finish section, with every PUT
//!   made slow: close returns 0 and the object is whole; the same objfs with
//!   `cancellable_uploads` answers that close `EINTR`, which shows that the
//!   signal really reaches the daemon as an INTERRUPT mid-upload.
//! - An async filesystem and a sync one served in this process (on the
//!   transport of the pass, io_uring included) whose FLUSH waits inside a
//!   section, or not: 0 with it, `EINTR` without.
//!
//! The client thread is sent SIGUSR1 (a handler installed without
//! `SA_RESTART`) again and again while its close runs, so that the signal
//! lands mid-FLUSH however the threads are scheduled; every wait is
//! bounded.

mod common;

use common::*;
use fuse_wire::asyncfs::{AsyncContext, AsyncFilesystem, AsyncFs, Open, TokioSpawner};
use fuse_wire::reply::{ReplyAttr, ReplyEmpty, ReplyEntry};
use fuse_wire::session::LockOwner;
use fuse_wire::{Entry, Errno, FileAttr, FileHandle, FileKind, Inode, OpenFlags, RequestContext};
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// How long a FLUSH (an objfs PUT) takes: long enough for signals sent
/// every [`SIGNAL_EVERY`] to land in it.
const SLOW: Duration = Duration::from_millis(1500);
const SIGNAL_EVERY: Duration = Duration::from_millis(50);

extern "C" fn on_signal(_: libc::c_int) {}

/// SIGUSR1 runs a handler that does nothing, without `SA_RESTART`: a
/// system call it interrupts returns `EINTR` unless the filesystem says
/// otherwise.
fn install_handler() {
    // SAFETY: an all-zero `sigaction` is a valid value of this C struct.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_signal as *const () as usize;
    sa.sa_flags = 0;
    // SAFETY: sigaction(2) with a valid struct; the handler is async-signal-safe.
    let r = unsafe { libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()) };
    assert_eq!(r, 0, "sigaction: {}", std::io::Error::last_os_error());
}

/// Opens `path` for writing, writes `data` if any, and closes it while
/// the closing thread is sent SIGUSR1 every [`SIGNAL_EVERY`]: what close(2)
/// returned (`Ok` or its errno).
fn close_while_signalled(path: &Path, data: &[u8]) -> Result<(), i32> {
    install_handler();
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let data = data.to_vec();
    let closing = Arc::new(AtomicBool::new(false));
    let tid = Arc::new(AtomicU64::new(0));
    let (c2, t2) = (closing.clone(), tid.clone());
    let client = std::thread::spawn(move || {
        // SAFETY: open(2) on a live C string.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY) };
        assert!(fd >= 0, "open: {}", std::io::Error::last_os_error());
        if !data.is_empty() {
            // SAFETY: write(2) from a live buffer of its length.
            let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
            assert_eq!(
                n,
                data.len() as isize,
                "write: {}",
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: pthread_self(3) has no preconditions.
        t2.store(unsafe { libc::pthread_self() } as u64, SeqCst);
        c2.store(true, SeqCst);
        // SAFETY: close(2) of the descriptor opened above, once.
        let r = unsafe { libc::close(fd) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while !client.is_finished() {
        assert!(Instant::now() < deadline, "close did not return within 30 s");
        if closing.load(SeqCst) {
            // SAFETY: the client thread is alive (not finished, and only
            // joined below), so its pthread_t is valid.
            unsafe { libc::pthread_kill(tid.load(SeqCst) as libc::pthread_t, libc::SIGUSR1) };
        }
        std::thread::sleep(SIGNAL_EVERY);
    }
    client.join().expect("client thread")
}

/// objfs with every PUT made [`SLOW`], on a new bucket; `extra` options.
fn objfs(tag: &str, extra: &str) -> Option<(TempMountpoint, std::process::Child, std::path::PathBuf)> {
    if !require_mount_capability() {
        return None;
    }
    let tmp = TempMountpoint::new(tag);
    let bucket = tmp.root().join("bucket");
    std::fs::create_dir(&bucket).unwrap();
    let opts = format!(
        "bucket={},put_delay_ms={}{extra}",
        bucket.display(),
        SLOW.as_millis()
    );
    let mut child = Command::new(example_binary("objfs"))
        .args(["-o", &opts])
        .arg(tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start objfs");
    wait_for_mount(&mut child, tmp.path(), "objfs");
    Some((tmp, child, bucket))
}

fn content() -> Vec<u8> {
    (0..200_000u32).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn objfs_close_interrupted_mid_upload_returns_0_and_the_object_is_whole() {
    let Some((tmp, child, bucket)) = objfs("must-finish-objfs", "") else {
        return;
    };
    let file = tmp.path().join("object");
    std::fs::File::create(&file).expect("create the object");
    let data = content();
    let closed = close_while_signalled(&file, &data);
    let object = std::fs::read(bucket.join("object")).expect("read the object in the bucket");
    terminate_daemon(child, tmp.path());
    assert_eq!(closed, Ok(()), "close(2) of a file whose upload was done");
    assert!(
        object == data,
        "the object: {} bytes, want {}",
        object.len(),
        data.len()
    );
}

#[test]
fn objfs_with_cancellable_uploads_answers_that_close_eintr() {
    let Some((tmp, child, _)) = objfs("must-finish-objfs-eintr", ",cancellable_uploads") else {
        return;
    };
    let file = tmp.path().join("object");
    std::fs::File::create(&file).expect("create the object");
    let closed = close_while_signalled(&file, &content());
    terminate_daemon(child, tmp.path());
    assert_eq!(closed, Err(libc::EINTR), "the interrupt must reach the FLUSH");
}

const FILE: Inode = Inode(2);

fn attr(ino: Inode) -> Result<FileAttr, Errno> {
    match ino {
        Inode::ROOT => Ok(FileAttr::fixed(1, FileKind::Directory, 0o755)),
        FILE => Ok(FileAttr::fixed(2, FileKind::RegularFile, 0o666)),
        _ => Err(Errno::ENOENT),
    }
}

/// One file, `f`, whose FLUSH takes [`SLOW`], in a must-finish section if
/// `must_finish`; `flushed` counts the FLUSHes that ran to their end.
struct SlowFlush {
    must_finish: bool,
    flushed: Arc<AtomicU64>,
}

impl AsyncFilesystem for SlowFlush {
    async fn lookup(&self, _: &AsyncContext, parent: Inode, name: &CStr) -> Result<Entry, Errno> {
        match (parent, name.to_bytes()) {
            (Inode::ROOT, b"f") => Ok(Entry::new(FILE, attr(FILE)?, Duration::from_secs(60))),
            _ => Err(Errno::ENOENT),
        }
    }
    async fn getattr(
        &self,
        _: &AsyncContext,
        ino: Inode,
        _: Option<FileHandle>,
    ) -> Result<(Duration, FileAttr), Errno> {
        Ok((Duration::from_secs(60), attr(ino)?))
    }
    async fn open(&self, _: &AsyncContext, _: Inode, _: OpenFlags) -> Result<Open, Errno> {
        Ok(Open::new(FileHandle(1)))
    }
    async fn flush(&self, ctx: &AsyncContext, _: Inode, _: FileHandle, _: LockOwner) -> Result<(), Errno> {
        let _section = match self.must_finish {
            true => Some(ctx.must_finish()?),
            false => None,
        };
        tokio::time::sleep(SLOW).await;
        self.flushed.fetch_add(1, SeqCst);
        Ok(())
    }
}

/// The same, on the sync trait: its FLUSH gives up with `EINTR` as soon as
/// it sees the request interrupted, as a sync handler that honours
/// interrupts does.
struct SyncSlowFlush {
    must_finish: bool,
    flushed: Arc<AtomicU64>,
}

impl fuse_wire::Filesystem for SyncSlowFlush {
    fn lookup(&self, _: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        match (parent, name.to_bytes()) {
            (Inode::ROOT, b"f") => {
                reply.result(attr(FILE).map(|a| Entry::new(FILE, a, Duration::from_secs(60))))
            }
            _ => reply.error(Errno::ENOENT),
        }
    }
    fn getattr(&self, _: &RequestContext<'_>, ino: Inode, _: Option<FileHandle>, reply: ReplyAttr) {
        reply.result(attr(ino).map(|a| (Duration::from_secs(60), a)));
    }
    fn flush(&self, ctx: &RequestContext<'_>, _: Inode, _: FileHandle, _: LockOwner, reply: ReplyEmpty) {
        let _section = match self.must_finish {
            true => match ctx.must_finish() {
                Ok(s) => Some(s),
                Err(e) => return reply.error(e),
            },
            false => None,
        };
        let end = Instant::now() + SLOW;
        while Instant::now() < end {
            if ctx.is_interrupted() {
                return reply.error(Errno::EINTR);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.flushed.fetch_add(1, SeqCst);
        reply.ok();
    }
}

/// Serves `fs` in this process on the pass's transport, closes `f` while
/// signalled: what close returned, and how many FLUSHes ran to their end.
fn served<F: fuse_wire::Filesystem>(tag: &str, fs: F, flushed: &AtomicU64) -> Option<(Result<(), i32>, u64)> {
    if !require_mount_capability() {
        return None;
    }
    let mp = TempMountpoint::new(tag);
    let config = fuse_wire::SessionConfig {
        transport: test_transport(),
        ..fuse_wire::SessionConfig::default()
    };
    let running =
        fuse_wire::spawn(fs, mp.path(), &fuse_wire::MountOptions::default(), config).expect("mount");
    let closed = close_while_signalled(&mp.path().join("f"), b"");
    drop(running);
    Some((closed, flushed.load(SeqCst)))
}

fn async_case(tag: &str, must_finish: bool) -> Option<(Result<(), i32>, u64)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let flushed = Arc::new(AtomicU64::new(0));
    let fs = SlowFlush {
        must_finish,
        flushed: flushed.clone(),
    };
    served(
        tag,
        AsyncFs::new(fs, TokioSpawner::new(rt.handle().clone())),
        &flushed,
    )
}

fn sync_case(tag: &str, must_finish: bool) -> Option<(Result<(), i32>, u64)> {
    let flushed = Arc::new(AtomicU64::new(0));
    let fs = SyncSlowFlush {
        must_finish,
        flushed: flushed.clone(),
    };
    served(tag, fs, &flushed)
}

#[test]
fn an_async_flush_in_a_section_answers_its_result_to_a_signalled_close() {
    let Some((closed, flushed)) = async_case("must-finish-async", true) else {
        return;
    };
    assert_eq!((closed, flushed), (Ok(()), 1));
}

#[test]
fn an_async_flush_without_a_section_is_cancelled_by_a_signalled_close() {
    let Some((closed, flushed)) = async_case("must-finish-async-eintr", false) else {
        return;
    };
    assert_eq!((closed, flushed), (Err(libc::EINTR), 0));
}

#[test]
fn a_sync_flush_in_a_section_does_not_see_the_interrupt() {
    let Some((closed, flushed)) = sync_case("must-finish-sync", true) else {
        return;
    };
    assert_eq!((closed, flushed), (Ok(()), 1));
}

#[test]
fn a_sync_flush_without_a_section_sees_the_interrupt() {
    let Some((closed, flushed)) = sync_case("must-finish-sync-eintr", false) else {
        return;
    };
    assert_eq!((closed, flushed), (Err(libc::EINTR), 0));
}
