//! FUSE over io_uring (protocol 7.42+, Linux 6.14+): one ring per possible
//! CPU, each with a few entries that carry requests in and replies out.
//!
//! Each queue has its own `io_uring` (built with 128-byte SQEs, which the
//! FUSE commands need), its own thread pinned to the queue's CPU, and
//! `depth` ring entries. An entry owns a header buffer (`fuse_uring_req_header`:
//! in-header or out-header, the first argument, and `commit_id`/`payload_sz`)
//! and a payload buffer, both allocated once and registered with the kernel
//! by a REGISTER command. When the kernel has a request for the queue it
//! fills an entry's buffers and completes that entry's command; the queue
//! thread parses the request in place ([`Request::parse_split`]) and serves
//! it through the same dispatch as `/dev/fuse` workers, with the entry as
//! the reply [`Channel`]. The reply is copied once into the entry's buffers
//! and a COMMIT_AND_FETCH command hands it back and re-arms the entry.
//!
//! Only the queue thread enters the kernel for its ring: a reply sent from
//! another thread puts its SQE in the submission queue under the queue's
//! own lock and wakes the queue thread through an eventfd that the ring
//! polls. This keeps every command owned by the long-lived, pinned queue
//! thread (the kernel runs the request copy as task work of the task that
//! submitted the command, and cancels a task's commands when it exits).
//!
//! The queue thread runs handlers itself, which keeps a request on the CPU
//! that sent it with no hand-off between threads. A handler that has to
//! wait (a blocking lock, whatever the opcode) gives its reply handle to a
//! helper thread with [`crate::RequestContext::defer`] and returns: the
//! queue thread goes on serving its ring, and the reply is committed from
//! the helper thread later. A deferred request keeps its ring entry until
//! then, so only three quarters of a queue's entries may be held
//! by waits. A handler that blocks without deferring does stall its queue:
//! unlike `/dev/fuse`, a ring queue does not grow.
//!
//! INIT, FORGET, INTERRUPT and NOTIFY_REPLY keep arriving on `/dev/fuse`,
//! and notifications are still written there; the session keeps its
//! `/dev/fuse` worker pool for them.

use super::Channel;
use crate::conn::{Shared, WorkerCore};
use crate::deferred::EntryBudget;
use crate::filesystem::Filesystem;
use crate::init::Negotiated;
use fuse_proto::abi::{OutHeader, UringCmdReq, UringEntInOut, UringReqHeader};
use fuse_proto::consts::{URING_IN_OUT_HEADER_SZ, uring_cmd};
use fuse_proto::flags::InitFlags;
use fuse_proto::{Errno, Opcode, Reply, Request};
use io_uring::{IoUring, cqueue, opcode, squeue, types};
use std::cell::{Cell, UnsafeCell};
use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use zerocopy::IntoBytes;

/// Entries per queue unless configured otherwise.
pub const DEFAULT_QUEUE_DEPTH: usize = 8;

/// The fuse module's switch for io_uring.
pub const ENABLE_KNOB: &str = "/sys/module/fuse/parameters/enable_uring";
/// The sysctl that can forbid io_uring.
pub const DISABLED_SYSCTL: &str = "/proc/sys/kernel/io_uring_disabled";
const POSSIBLE_CPUS: &str = "/sys/devices/system/cpu/possible";
/// The first protocol minor with FUSE over io_uring.
pub const MIN_MINOR: u32 = 42;

/// Why the io_uring transport is not in use (the session then serves
/// everything over `/dev/fuse`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// `enable_uring` of the fuse module is `N`, so the kernel does not offer it.
    KnobOff,
    /// The kernel has no `enable_uring` parameter: built without `CONFIG_FUSE_IO_URING`.
    NotBuilt,
    /// The kernel's FUSE protocol predates 7.42.
    KernelTooOld {
        /// The kernel's minor.
        minor: u32,
    },
    /// Creating an io_uring failed and `kernel.io_uring_disabled` explains it.
    IoUringDisabled {
        /// The sysctl's value (1: only for a group, 2: for nobody).
        sysctl: u32,
        /// The errno `io_uring_setup` returned.
        errno: i32,
    },
    /// Setting up the rings failed.
    Setup {
        /// What was being done.
        what: String,
        /// The errno.
        errno: i32,
    },
    /// The kernel did not offer `FUSE_OVER_IO_URING` for a reason not seen here.
    NotOffered,
    /// The filesystem removed `OVER_IO_URING` from its wanted flags in `init`.
    RefusedByFilesystem,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::KnobOff => write!(
                f,
                "the kernel does not offer FUSE_OVER_IO_URING because {ENABLE_KNOB} is N \
                 (echo Y > {ENABLE_KNOB} before mounting)"
            ),
            Unavailable::NotBuilt => write!(
                f,
                "the kernel has no {ENABLE_KNOB}: it was built without CONFIG_FUSE_IO_URING"
            ),
            Unavailable::KernelTooOld { minor } => write!(
                f,
                "the kernel speaks FUSE 7.{minor}; io_uring needs 7.{MIN_MINOR} (Linux 6.14) or newer"
            ),
            Unavailable::IoUringDisabled { sysctl, errno } => write!(
                f,
                "io_uring_setup failed ({}) and sysctl kernel.io_uring_disabled = {sysctl}",
                io::Error::from_raw_os_error(*errno)
            ),
            Unavailable::Setup { what, errno } => {
                write!(f, "{what} failed: {}", io::Error::from_raw_os_error(*errno))
            }
            Unavailable::NotOffered => f.write_str("the kernel did not offer FUSE_OVER_IO_URING"),
            Unavailable::RefusedByFilesystem => {
                f.write_str("the filesystem removed OVER_IO_URING from its wanted flags")
            }
        }
    }
}

/// The fuse module's `enable_uring`: `Some(true)` for `Y`, `None` if absent.
pub fn knob() -> Option<bool> {
    let s = std::fs::read_to_string(ENABLE_KNOB).ok()?;
    Some(matches!(s.trim(), "Y" | "y" | "1"))
}

fn disabled_sysctl() -> Option<u32> {
    std::fs::read_to_string(DISABLED_SYSCTL).ok()?.trim().parse().ok()
}

/// The number of possible CPUs, which is the number of queues the kernel
/// makes (queue `q` serves requests submitted on CPU `q`).
pub fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string(POSSIBLE_CPUS)?;
    parse_cpu_list(s.trim())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("{POSSIBLE_CPUS}: {s:?}")))
}

fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in s.split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        n += b.checked_sub(a)? + 1;
    }
    (n > 0).then_some(n)
}

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// Checks before INIT that this process can create a ring of the kind the
/// transport needs; returns the number of queues to build.
pub(crate) fn probe() -> Result<usize, Unavailable> {
    if let Err(e) = Ring::builder().build(2) {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        return Err(match disabled_sysctl() {
            Some(v) if v != 0 => Unavailable::IoUringDisabled { sysctl: v, errno },
            _ => Unavailable::Setup {
                what: "io_uring_setup with IORING_SETUP_SQE128".into(),
                errno,
            },
        });
    }
    possible_cpus().map_err(|e| Unavailable::Setup {
        what: format!("reading {POSSIBLE_CPUS}"),
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    })
}

/// After INIT: why `OVER_IO_URING` was not granted.
pub(crate) fn why_not_granted(n: &Negotiated) -> Unavailable {
    if n.kernel_minor < MIN_MINOR {
        Unavailable::KernelTooOld {
            minor: n.kernel_minor,
        }
    } else if n.offered.contains(InitFlags::OVER_IO_URING) {
        Unavailable::RefusedByFilesystem
    } else {
        match knob() {
            Some(false) => Unavailable::KnobOff,
            None => Unavailable::NotBuilt,
            Some(true) => Unavailable::NotOffered,
        }
    }
}

/// Size of each entry's payload buffer, as the kernel computes its minimum:
/// `max(8192, max_write, max_pages * 4096)` (32 pages when `MAX_PAGES` is off).
pub(crate) fn payload_size(n: &Negotiated) -> usize {
    let pages = if n.max_pages == 0 {
        32
    } else {
        n.max_pages as usize
    };
    (fuse_proto::consts::MIN_READ_BUFFER)
        .max(n.max_write as usize)
        .max(pages * 4096)
}

const PAGE: usize = 4096;

/// A zeroed, page-aligned allocation whose address the kernel is given.
struct Buf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `Buf` is plain memory; who may touch it when is decided by the
// entry state machine of `RingEntry`, not by the thread that holds it.
unsafe impl Send for Buf {}
// SAFETY: as above; shared access is serialised by that state machine.
unsafe impl Sync for Buf {}

impl Buf {
    /// Anonymous, page-aligned memory. It is mapped, not allocated and
    /// zeroed, so that pages become resident only when the kernel or a reply
    /// first writes them: a ring sized for 1 MiB writes costs no memory while
    /// it serves small requests.
    fn new(len: usize) -> io::Result<Self> {
        let len = len.next_multiple_of(PAGE);
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // named, and the result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(Self { ptr, len })
    }

    fn contains(&self, s: &[u8]) -> bool {
        let (a, b) = (self.ptr.as_ptr() as usize, self.ptr.as_ptr() as usize + self.len);
        let (c, d) = (s.as_ptr() as usize, s.as_ptr() as usize + s.len());
        !s.is_empty() && c < b && a < d
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: mapped in `Buf::new` with this very length; nothing refers
        // to it any more (the entry that owned it is being dropped).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// The most a reply head (out header + fixed structs) can be.
const STASH: usize = 320;

// Entry states.
const IDLE: u8 = 0; // not registered yet
const ARMED: u8 = 1; // the kernel holds the entry (REGISTER or COMMIT_AND_FETCH pending)
const SERVING: u8 = 2; // a request is in the buffers, no reply yet
const STASHED: u8 = 3; // a fixed-size reply waits in `stash` for the handler to return
const DEAD: u8 = 4; // the kernel will not complete anything for it again

// user_data: entry index in the low 32 bits, the command in the high ones.
const WAKE: u64 = u64::MAX;
const KIND_REGISTER: u64 = 1 << 32;
const KIND_COMMIT: u64 = 2 << 32;

thread_local! {
    /// The entry whose request the current thread is dispatching, if it is a
    /// queue thread (replies sent from inside that dispatch are stashed).
    static DISPATCHING: Cell<*const RingEntry> = const { Cell::new(std::ptr::null()) };
    /// The queue the current thread runs, if it is a queue thread.
    static QUEUE_THREAD: Cell<*const Queue> = const { Cell::new(std::ptr::null()) };
}

/// One ring: the kernel queue `qid`.
pub(crate) struct Queue {
    qid: u16,
    ring: Ring,
    /// Serialises pushes to the submission queue (per queue, never global).
    sq_lock: Mutex<()>,
    wake: OwnedFd,
    wake_pending: AtomicBool,
    closed: AtomicBool,
    dev: Arc<OwnedFd>,
    served: AtomicUsize,
}

impl Queue {
    /// Puts one SQE in the submission queue; it is submitted by the queue
    /// thread's next `io_uring_enter`.
    fn push(&self, sqe: &squeue::Entry128) -> io::Result<()> {
        let _g = self.sq_lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: submission queues of this ring are only created here, under
        // `sq_lock`, so no other `SubmissionQueue` exists at the same time.
        let mut sq = unsafe { self.ring.submission_shared() };
        // SAFETY: every pointer in the SQEs we build (the iovec array and the
        // buffers it points to) belongs to a `RingEntry` that the queue thread
        // keeps alive until it exits, and the kernel completes or cancels the
        // thread's commands before that; the poll SQE has no pointer.
        unsafe { sq.push(sqe) }.map_err(|_| io::Error::from_raw_os_error(libc::EBUSY))
    }

    /// Makes the queue thread submit what was pushed from another thread.
    fn wake(&self) {
        if std::ptr::eq(QUEUE_THREAD.with(|q| q.get()), self) {
            return; // the loop submits after the current dispatch returns
        }
        if !self.wake_pending.swap(true, Ordering::SeqCst) {
            let _ = nix::unistd::write(&self.wake, &1u64.to_ne_bytes());
        }
    }

    fn arm_wake(&self) -> io::Result<()> {
        let sqe = opcode::PollAdd::new(types::Fd(self.wake.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(WAKE);
        self.push(&sqe.into())
    }
}

/// Sets `sqe->len`, which the crate's `UringCmd80` builder does not expose.
fn set_sqe_len(sqe: &mut squeue::Entry128, len: u32) {
    const LEN_OFFSET: usize = 24; // offsetof(struct io_uring_sqe, len), fixed by the ABI
    const { assert!(size_of::<squeue::Entry128>() == 128) };
    // SAFETY: `Entry128` is `#[repr(C)]` and starts with the kernel's 64-byte
    // `struct io_uring_sqe`, whose `__u32 len` is at byte 24; the write stays
    // inside the value we borrow mutably.
    unsafe {
        (sqe as *mut squeue::Entry128)
            .cast::<u8>()
            .add(LEN_OFFSET)
            .cast::<u32>()
            .write_unaligned(len)
    };
}

/// One ring entry: a reply [`Channel`] for the request in its buffers.
pub(crate) struct RingEntry {
    queue: Arc<Queue>,
    index: u32,
    header: Buf,
    payload: Buf,
    payload_len: usize,
    /// `struct iovec[2]` for REGISTER, kept at a stable address.
    iov: [libc::iovec; 2],
    state: AtomicU8,
    /// A fixed-size reply sent while its request was still being
    /// dispatched: written to the buffers once the handler has returned, so
    /// that the request bytes it borrows are not overwritten under it.
    stash: UnsafeCell<[u8; STASH]>,
    stash_len: Cell<usize>,
}

// SAFETY: the raw pointers in `iov` point into this entry's own buffers;
// `stash`/`stash_len` are only touched by the thread that holds the entry
// in state SERVING/STASHED (the queue thread, during a dispatch).
unsafe impl Send for RingEntry {}
// SAFETY: as above.
unsafe impl Sync for RingEntry {}

impl RingEntry {
    fn new(queue: Arc<Queue>, index: u32, payload_len: usize) -> io::Result<Self> {
        let header = Buf::new(size_of::<UringReqHeader>())?;
        let payload = Buf::new(payload_len)?;
        let iov = [
            libc::iovec {
                iov_base: header.ptr.as_ptr().cast(),
                iov_len: size_of::<UringReqHeader>(),
            },
            libc::iovec {
                iov_base: payload.ptr.as_ptr().cast(),
                iov_len: payload_len,
            },
        ];
        Ok(Self {
            queue,
            index,
            header,
            payload,
            payload_len,
            iov,
            state: AtomicU8::new(IDLE),
            stash: UnsafeCell::new([0; STASH]),
            stash_len: Cell::new(0),
        })
    }

    fn command(&self, op: u32, commit_id: u64, kind: u64) -> squeue::Entry128 {
        let req = UringCmdReq {
            flags: 0,
            commit_id,
            qid: self.queue.qid,
            padding: [0; 6],
        };
        let mut cmd = [0u8; 80];
        cmd[..size_of::<UringCmdReq>()].copy_from_slice(req.as_bytes());
        let mut sqe = opcode::UringCmd80::new(types::Fd(self.queue.dev.as_raw_fd()), op)
            .cmd(cmd)
            .addr((op == uring_cmd::REGISTER).then_some(self.iov.as_ptr() as u64))
            .build()
            .user_data(kind | u64::from(self.index));
        if op == uring_cmd::REGISTER {
            // REGISTER passes `struct iovec[2]` and wants `sqe->len == 2`.
            set_sqe_len(&mut sqe, 2);
        }
        sqe
    }

    fn register(&self) -> io::Result<()> {
        self.state.store(ARMED, Ordering::Release);
        self.queue
            .push(&self.command(uring_cmd::REGISTER, 0, KIND_REGISTER))
    }

    fn ent_in_out(&self) -> UringEntInOut {
        let off = offset_of!(UringReqHeader, ring_ent_in_out);
        // SAFETY: the header buffer holds at least a `fuse_uring_req_header`;
        // called only in state SERVING/STASHED, when the kernel is not writing it.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.header.ptr.as_ptr().add(off), size_of::<UringEntInOut>())
        };
        zerocopy::FromBytes::read_from_bytes(bytes).unwrap_or_default()
    }

    /// Writes the out header and `payload_sz`, then queues COMMIT_AND_FETCH.
    fn commit(&self, out_header: &[u8], payload_sz: usize) -> io::Result<()> {
        let ent = self.ent_in_out();
        let h = self.header.ptr.as_ptr();
        // SAFETY: the caller moved the entry out of SERVING/STASHED, so this
        // thread alone may write its buffers until the command is queued; the
        // offsets are those of `fuse_uring_req_header` inside the buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                out_header.as_ptr(),
                h,
                out_header.len().min(URING_IN_OUT_HEADER_SZ),
            );
            let sz =
                h.add(offset_of!(UringReqHeader, ring_ent_in_out) + offset_of!(UringEntInOut, payload_sz));
            sz.cast::<u32>().write_unaligned(payload_sz as u32);
        }
        self.state.store(ARMED, Ordering::Release);
        self.queue
            .push(&self.command(uring_cmd::COMMIT_AND_FETCH, ent.commit_id, KIND_COMMIT))?;
        self.queue.wake();
        Ok(())
    }

    /// Copies a reply into the buffers: out header to `in_out`, everything
    /// after it to the payload buffer. Returns the payload size.
    fn write_reply(&self, msg: &Reply<'_>) -> Option<usize> {
        let head = msg.head();
        let fixed = &head[size_of::<OutHeader>()..];
        let [p0, p1] = msg.payload();
        let total = fixed.len() + p0.len() + p1.len();
        if total > self.payload_len {
            return None;
        }
        let dst = self.payload.ptr.as_ptr();
        if [fixed, p0, p1].iter().any(|p| self.payload.contains(p)) {
            // The reply borrows bytes of this very buffer (a handler echoing
            // its request): assemble it elsewhere first. Rare; allocates.
            let v = msg.to_vec();
            // SAFETY: exclusive access as in `commit`; `total <= payload_len`.
            unsafe { std::ptr::copy_nonoverlapping(v[size_of::<OutHeader>()..].as_ptr(), dst, total) };
            return Some(total);
        }
        let mut at = 0;
        for p in [fixed, p0, p1] {
            // SAFETY: exclusive access as in `commit`; the sources do not
            // overlap the buffer (checked above) and `at + len <= total <=
            // payload_len`.
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), dst.add(at), p.len()) };
            at += p.len();
        }
        Some(total)
    }

    /// After the dispatch of this entry's request returned: commits a reply
    /// that was stashed during it.
    fn flush_stash(&self) {
        if self.state.load(Ordering::Acquire) != STASHED {
            return;
        }
        // SAFETY: state STASHED: the stash was written by this (queue) thread
        // during the dispatch that just returned; nobody else touches it.
        let stash = unsafe { &*self.stash.get() };
        let len = self.stash_len.get();
        let (out, fixed) = stash[..len].split_at(size_of::<OutHeader>());
        // SAFETY: exclusive access (state STASHED); `fixed` is at most
        // STASH bytes, and the payload buffer is at least 8 KiB.
        unsafe { std::ptr::copy_nonoverlapping(fixed.as_ptr(), self.payload.ptr.as_ptr(), fixed.len()) };
        if let Err(e) = self.commit(out, fixed.len()) {
            log::error!("io_uring queue {}: commit failed: {e}", self.queue.qid);
        }
    }
}

impl Channel for RingEntry {
    fn receive(&self, _buf: &mut [u8]) -> io::Result<usize> {
        // Requests reach ring entries through their queue thread.
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }

    fn send(&self, msg: &Reply<'_>) -> io::Result<()> {
        if self.queue.closed.load(Ordering::Acquire) {
            // The queue thread is gone (session stopped or connection ended).
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        let inline = msg.payload().iter().all(|p| p.is_empty()) && msg.head().len() <= STASH;
        if inline && std::ptr::eq(DISPATCHING.with(|d| d.get()), self) {
            if self
                .state
                .compare_exchange(SERVING, STASHED, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            // SAFETY: we are the queue thread inside this entry's dispatch and
            // just moved it to STASHED; only `flush_stash`, on this thread
            // after the dispatch, reads the stash.
            let stash = unsafe { &mut *self.stash.get() };
            stash[..msg.head().len()].copy_from_slice(msg.head());
            self.stash_len.set(msg.head().len());
            return Ok(());
        }
        if self
            .state
            .compare_exchange(SERVING, ARMED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no request is waiting for a reply on this io_uring entry",
            ));
        }
        let out_header = &msg.head()[..size_of::<OutHeader>()];
        match self.write_reply(msg) {
            Some(n) => self.commit(out_header, n),
            None => {
                let unique = msg.header().unique;
                log::error!(
                    "reply to {unique} ({} bytes) does not fit the {}-byte ring buffer; answering EIO",
                    msg.len(),
                    self.payload_len
                );
                let err = Reply::error(unique, Errno::EIO);
                self.commit(&err.head()[..size_of::<OutHeader>()], 0)
            }
        }
    }

    fn try_clone(&self) -> io::Result<Arc<dyn Channel>> {
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.queue.dev.as_raw_fd())
    }

    fn describe(&self) -> String {
        format!("io_uring queue {} entry {}", self.queue.qid, self.index)
    }
}

/// How a queue thread ended.
#[derive(Debug)]
pub(crate) enum QueueEnd {
    /// Every entry completed with ENOTCONN/ECANCELED: the connection ended.
    Disconnected,
    /// The session was stopped.
    Stopped,
    /// `io_uring_enter` failed.
    Failed(io::Error),
}

/// The running rings of a session.
pub(crate) struct Rings {
    queues: Vec<Arc<Queue>>,
    threads: Vec<JoinHandle<QueueEnd>>,
    /// Entries per queue.
    pub(crate) depth: usize,
}

impl Rings {
    /// Number of queues.
    pub(crate) fn len(&self) -> usize {
        self.queues.len()
    }

    /// Wakes every queue thread (they look at the shutdown flag).
    pub(crate) fn wake_all(&self) {
        wake_queues(&self.queues);
    }

    /// A function that wakes every queue thread, for the session's stop.
    pub(crate) fn waker(&self) -> impl Fn() + Send + 'static {
        let queues = self.queues.clone();
        move || wake_queues(&queues)
    }

    /// Waits for the queue threads; after `grace` they are told to stop
    /// (their commands are then cancelled as they exit).
    pub(crate) fn join(self, shared: &Shared, grace: Duration) {
        let deadline = Instant::now() + grace;
        while !self.threads.iter().all(|t| t.is_finished()) {
            if Instant::now() >= deadline && !shared.shutdown.swap(true, Ordering::AcqRel) {
                log::warn!(
                    "io_uring queues still running {grace:?} after the /dev/fuse workers; stopping them"
                );
            }
            if shared.shutdown.load(Ordering::Acquire) {
                self.wake_all();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for (qid, t) in self.threads.into_iter().enumerate() {
            match t.join() {
                Ok(QueueEnd::Failed(e)) => log::warn!("io_uring queue {qid} ended on an error: {e}"),
                Ok(end) => log::debug!("io_uring queue {qid} ended: {end:?}"),
                Err(_) => log::error!("io_uring queue {qid} thread panicked"),
            }
        }
    }
}

fn wake_queues(queues: &[Arc<Queue>]) {
    for q in queues {
        q.wake_pending.store(true, Ordering::SeqCst);
        let _ = nix::unistd::write(&q.wake, &1u64.to_ne_bytes());
    }
}

/// Builds one ring per queue with `depth` entries each and starts the queue
/// threads, which register the entries. `on_thread_start` runs first on
/// each queue thread (the session uses it to be able to wake them).
pub(crate) fn start<F: Filesystem>(
    fs: &Arc<F>,
    shared: &Arc<Shared>,
    dev: RawFd,
    nr_queues: usize,
    depth: usize,
    on_thread_start: Arc<dyn Fn() -> crate::signal::Registered + Send + Sync>,
) -> Result<Rings, Unavailable> {
    let setup = |what: &str, e: io::Error| Unavailable::Setup {
        what: what.to_string(),
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    };
    let depth = depth.clamp(1, 1 << 12);
    let dup = nix::unistd::dup(
        // SAFETY: `dev` is the session's /dev/fuse fd, open for the whole call.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(dev) },
    )
    .map_err(|e| setup("dup of the /dev/fuse fd", e.into()))?;
    let dev = Arc::new(dup);
    let payload_len = payload_size(&shared.negotiated);
    let sq_size = (depth as u32 + 2).next_power_of_two();

    // Phase 1: every ring and buffer, before anything is registered, so that
    // a failure leaves the kernel untouched and /dev/fuse serves everything.
    let mut built = Vec::with_capacity(nr_queues);
    for qid in 0..nr_queues {
        let ring = Ring::builder()
            .setup_cqsize(2 * sq_size)
            .build(sq_size)
            .map_err(|e| setup(&format!("io_uring_setup for queue {qid}"), e))?;
        // SAFETY: eventfd(2) with valid flags; the result is checked below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(setup("eventfd", io::Error::last_os_error()));
        }
        // SAFETY: `efd` was just returned by eventfd(2) and is owned by nobody else.
        let wake = unsafe { OwnedFd::from_raw_fd(efd) };
        let queue = Arc::new(Queue {
            qid: qid as u16,
            ring,
            sq_lock: Mutex::new(()),
            wake,
            wake_pending: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            dev: dev.clone(),
            served: AtomicUsize::new(0),
        });
        let mut entries = Vec::with_capacity(depth);
        let budget = EntryBudget::new(deferrable_entries(depth));
        for i in 0..depth {
            let e = RingEntry::new(queue.clone(), i as u32, payload_len)
                .map_err(|e| setup(&format!("allocating {payload_len}-byte ring buffers"), e))?;
            let e = Arc::new(e);
            let core = Arc::new(WorkerCore {
                index: shared.uring_base + qid,
                chan: e.clone(),
                shared: shared.clone(),
                defer_budget: Some(budget.clone()),
            });
            entries.push((e, core));
        }
        built.push((queue, entries));
    }

    // Phase 2: a pinned thread per queue registers its entries and serves.
    let (tx, rx) = crossbeam_channel::bounded::<(usize, Result<(), Unavailable>)>(nr_queues);
    let mut queues = Vec::with_capacity(nr_queues);
    let mut threads = Vec::with_capacity(nr_queues);
    for (queue, entries) in built {
        let qid = queue.qid as usize;
        queues.push(queue.clone());
        let fs = fs.clone();
        let shared = shared.clone();
        let tx = tx.clone();
        let on_start = on_thread_start.clone();
        let t = std::thread::Builder::new()
            .name(format!("fuse-uring-{qid}"))
            .spawn(move || {
                let _registered = on_start();
                queue_thread(&fs, &shared, &queue, &entries, tx)
            });
        match t {
            Ok(t) => threads.push(t),
            Err(e) => {
                stop_queues(Rings {
                    queues,
                    threads,
                    depth,
                });
                return Err(setup("starting a queue thread", e));
            }
        }
    }
    drop(tx);
    let rings = Rings {
        queues,
        threads,
        depth,
    };
    let mut failure = None;
    for _ in 0..nr_queues {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok((_, Ok(()))) => {}
            Ok((qid, Err(e))) => {
                log::error!("io_uring queue {qid}: {e}");
                failure.get_or_insert(e);
            }
            Err(_) => {
                failure.get_or_insert(Unavailable::Setup {
                    what: "waiting for the queue threads to register".into(),
                    errno: libc::ETIMEDOUT,
                });
                break;
            }
        }
    }
    match failure {
        None => Ok(rings),
        Some(e) => {
            // Without every queue registered the kernel keeps using
            // /dev/fuse; end the threads (their commands are cancelled).
            stop_queues(rings);
            Err(e)
        }
    }
}

fn stop_queues(rings: Rings) {
    for q in &rings.queues {
        q.closed.store(true, Ordering::Release);
    }
    rings.wake_all();
    for t in rings.threads {
        let _ = t.join();
    }
}

fn pin_to_cpu(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    let r = set
        .set(cpu)
        .and_then(|_| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set));
    if let Err(e) = r {
        log::warn!("io_uring queue {cpu}: cannot pin the thread to CPU {cpu}: {e}");
    }
}

/// The loop of one queue thread.
fn queue_thread<F: Filesystem>(
    fs: &Arc<F>,
    shared: &Shared,
    q: &Arc<Queue>,
    entries: &[(Arc<RingEntry>, Arc<WorkerCore>)],
    setup: crossbeam_channel::Sender<(usize, Result<(), Unavailable>)>,
) -> QueueEnd {
    let qid = q.qid as usize;
    QUEUE_THREAD.with(|c| c.set(Arc::as_ptr(q)));
    pin_to_cpu(qid);
    let fail = |what: &str, e: &io::Error| Unavailable::Setup {
        what: format!("{what} on queue {qid}"),
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    };
    let mut armed = q
        .arm_wake()
        .and_then(|_| entries.iter().try_for_each(|(e, _)| e.register()));
    if armed.is_ok() {
        armed = q.ring.submit().map(|_| ());
    }
    if let Err(e) = armed {
        let _ = setup.send((qid, Err(fail("submitting REGISTER", &e))));
        return QueueEnd::Failed(e);
    }
    let mut setup = Some(setup);
    let mut cqes: Vec<cqueue::Entry> = Vec::with_capacity(entries.len() + 2);
    let mut dead = 0usize;
    let end = loop {
        // Completions (REGISTER failures arrive at once, within the submit).
        cqes.clear();
        {
            // SAFETY: only this thread ever creates a completion queue of this ring.
            let cq = unsafe { q.ring.completion_shared() };
            cqes.extend(cq);
        }
        for cqe in &cqes {
            let ud = cqe.user_data();
            if ud == WAKE {
                q.wake_pending.store(false, Ordering::SeqCst);
                let mut b = [0u8; 8];
                let _ = nix::unistd::read(&q.wake, &mut b);
                if let Err(e) = q.arm_wake() {
                    log::error!("io_uring queue {qid}: re-arming the wake-up poll: {e}");
                }
                continue;
            }
            let Some((entry, core)) = entries.get((ud & 0xffff_ffff) as usize) else {
                log::error!("io_uring queue {qid}: completion for unknown entry {ud:#x}");
                continue;
            };
            let res = cqe.result();
            if res == 0 {
                entry.state.store(SERVING, Ordering::Release);
                q.served.fetch_add(1, Ordering::Relaxed);
                serve_entry(fs, entry, core);
                continue;
            }
            let errno = -res;
            match errno {
                libc::ENOTCONN | libc::ECANCELED | libc::ENODEV => {
                    entry.state.store(DEAD, Ordering::Release);
                    dead += 1;
                }
                _ if ud & KIND_COMMIT != 0 => {
                    // The kernel refused a commit (e.g. the request is gone);
                    // give the entry back to it with a fresh REGISTER.
                    log::warn!(
                        "io_uring queue {qid} entry {}: COMMIT_AND_FETCH failed: {}; registering it again",
                        entry.index,
                        io::Error::from_raw_os_error(errno)
                    );
                    if let Err(e) = entry.register() {
                        log::error!("io_uring queue {qid}: {e}");
                        entry.state.store(DEAD, Ordering::Release);
                        dead += 1;
                    }
                }
                _ => {
                    let e = io::Error::from_raw_os_error(errno);
                    log::error!("io_uring queue {qid} entry {}: REGISTER failed: {e}", entry.index);
                    entry.state.store(DEAD, Ordering::Release);
                    dead += 1;
                    if let Some(s) = setup.take() {
                        let _ = s.send((qid, Err(fail("REGISTER", &e))));
                    }
                }
            }
        }
        if let Some(s) = setup.take() {
            let _ = s.send((qid, Ok(())));
        }
        if dead == entries.len() {
            break QueueEnd::Disconnected;
        }
        if shared.shutdown.load(Ordering::Acquire) || q.closed.load(Ordering::Acquire) {
            break QueueEnd::Stopped;
        }
        // Submit what the dispatches queued (replies, re-arms) and wait.
        match q.ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR | libc::EAGAIN | libc::EBUSY) => {}
                _ => break QueueEnd::Failed(e),
            },
        }
    };
    q.closed.store(true, Ordering::Release);
    QUEUE_THREAD.with(|c| c.set(std::ptr::null()));
    end
}

/// Parses the request in `entry`'s buffers and dispatches it.
fn serve_entry<F: Filesystem>(fs: &Arc<F>, entry: &RingEntry, core: &Arc<WorkerCore>) {
    let ent = entry.ent_in_out();
    let payload_sz = (ent.payload_sz as usize).min(entry.payload_len);
    let hdr = entry.header.ptr.as_ptr();
    // SAFETY: the entry is SERVING: the kernel wrote these buffers before it
    // posted the completion and does not touch them until we commit. The
    // slices live for this dispatch; a reply sent during it that would
    // overwrite them is stashed (fixed-size replies) until it returns, and
    // requests whose data replies could overwrite borrowed arguments are
    // parsed from a private copy.
    let (in_out, op_in, payload) = unsafe {
        (
            std::slice::from_raw_parts(hdr, URING_IN_OUT_HEADER_SZ),
            std::slice::from_raw_parts(
                hdr.add(offset_of!(UringReqHeader, op_in)),
                fuse_proto::consts::URING_OP_IN_OUT_SZ,
            ),
            std::slice::from_raw_parts(entry.payload.ptr.as_ptr(), payload_sz),
        )
    };
    DISPATCHING.with(|d| d.set(entry as *const RingEntry));
    let opcode = fuse_proto::request::peek_opcode(in_out).and_then(|n| Opcode::from_u32(n).ok());
    if payload_sz > 0 && matches!(opcode, Some(Opcode::Getxattr | Opcode::Ioctl)) {
        // These requests borrow arguments from the payload buffer (the xattr
        // name, the ioctl input) and their replies carry data, which a
        // handler may send before it returns: the reply would overwrite what
        // the handler still borrows. Parse them from a private copy (small:
        // a name, or an ioctl's input), kept per queue thread.
        SIDE.with(|side| {
            let mut side = side.borrow_mut();
            side.clear();
            side.extend_from_slice(payload);
            parse_and_serve(fs, core, in_out, op_in, &side);
        });
    } else {
        parse_and_serve(fs, core, in_out, op_in, payload);
    }
    DISPATCHING.with(|d| d.set(std::ptr::null()));
    entry.flush_stash();
}

/// How many of a queue's `depth` entries deferred waits may hold: a
/// deferred request keeps its entry until it is answered, and the kernel
/// gives a CPU's requests to that CPU's queue only, so a quarter (at least
/// one) stays for requests that do not wait.
pub(crate) fn deferrable_entries(depth: usize) -> usize {
    depth - (depth / 4).max(1).min(depth)
}

thread_local! {
    /// Private copy of a request payload for [`serve_entry`]; grows once.
    static SIDE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn parse_and_serve<F: Filesystem>(
    fs: &Arc<F>,
    core: &Arc<WorkerCore>,
    in_out: &[u8],
    op_in: &[u8],
    payload: &[u8],
) {
    match Request::parse_split(in_out, op_in, payload, &core.shared.parse) {
        Ok(req) => crate::dispatch::serve(&**fs, core, req),
        Err(e) => crate::dispatch::malformed(
            core,
            fuse_proto::request::peek_opcode(in_out),
            fuse_proto::request::peek_unique(in_out),
            payload.len() + 40,
            e,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0-3,8-11"), Some(8));
        assert_eq!(parse_cpu_list("0,2,4"), Some(3));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
    }

    #[test]
    fn sqe_len_offset_matches_the_abi() {
        // Build a REGISTER-like SQE and check the bytes the kernel reads.
        let mut sqe = opcode::UringCmd80::new(types::Fd(5), uring_cmd::REGISTER)
            .addr(Some(0x1234))
            .build()
            .user_data(0x77);
        set_sqe_len(&mut sqe, 2);
        // SAFETY: reading the 128 bytes of a plain-data `#[repr(C)]` value.
        let bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(bytes[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(i32::from_ne_bytes(bytes[4..8].try_into().unwrap()), 5, "fd");
        assert_eq!(u32::from_ne_bytes(bytes[8..12].try_into().unwrap()), 1, "cmd_op");
        assert_eq!(
            u64::from_ne_bytes(bytes[16..24].try_into().unwrap()),
            0x1234,
            "addr"
        );
        assert_eq!(u32::from_ne_bytes(bytes[24..28].try_into().unwrap()), 2, "len");
        assert_eq!(
            u64::from_ne_bytes(bytes[32..40].try_into().unwrap()),
            0x77,
            "user_data"
        );
    }
}
