//! FUSE over io_uring (protocol 7.42+, Linux 6.14+): one ring per possible
//! CPU, each with a few entries that carry requests in and replies out.
//!
//! Each queue has its own `io_uring` (built with 128-byte SQEs, which the
//! FUSE commands need), two to `depth + 1` threads pinned to the queue's
//! CPU, and `depth` ring entries. An entry owns a header buffer (`fuse_uring_req_header`:
//! in-header or out-header, the first argument, and `commit_id`/`payload_sz`)
//! and a payload buffer, both allocated once and registered with the kernel
//! by a REGISTER command. When the kernel has a request for the queue it
//! fills an entry's buffers and completes that entry's command; a queue
//! thread parses the request in place ([`Request::parse_split`]) and serves
//! it through the same dispatch as `/dev/fuse` workers, with the entry as
//! the reply [`Channel`]. The reply is copied once into the entry's buffers
//! and a COMMIT_AND_FETCH command hands it back and re-arms the entry.
//!
//! Leader and followers: of a queue's threads, only the one holding the
//! role token (`Queue::driving`) waits on the ring, takes completions
//! and submits. It runs each request's handler itself (no hand-off between
//! threads per request), but gives the token up for the handler's duration
//! and takes it back afterwards if it is still free. While nobody holds it,
//! the kernel signals the standby threads through an eventfd registered
//! with the ring (disabled while a thread drives, so the common path costs
//! no system call), and a short timer covers completions that were already
//! waiting; a standby then takes the token, so a handler that blocks holds
//! its thread and its entry, never the queue. A reply sent from a thread
//! that does not drive puts its SQE in the submission queue under the
//! queue's own lock and wakes the driver through an eventfd that the ring
//! polls. The queue records which thread submitted each entry's command:
//! the kernel copies the next request in as task work of that thread, and
//! cancels a thread's commands when it exits, so a thread ends only when
//! the kernel holds none of its commands.
//!
//! A handler that waits for something other users control (a blocking
//! lock, whatever the opcode) should still give its reply handle to a
//! helper thread with [`crate::RequestContext::defer`] and return, holding
//! no thread. A deferred request keeps its ring entry until it is answered,
//! so only three quarters of a queue's entries may be held by waits.
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
use io_uring::{EnterFlags, IoUring, cqueue, opcode, squeue, types};
use std::cell::{Cell, UnsafeCell};
use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
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
/// Stands for the wake-up poll in a queue's list of SQEs not yet submitted.
const POLL_SLOT: u32 = u32::MAX;

/// How long a request that was already waiting when a handler started may
/// wait for that handler before a standby serves it.
const NUDGE_AFTER: Duration = Duration::from_millis(1);

/// Threads a queue keeps however idle it is: the driver and one standby.
const THREAD_FLOOR: usize = 2;

thread_local! {
    /// The entry whose request the current thread is dispatching, if any
    /// (replies sent from inside that dispatch are stashed).
    static DISPATCHING: Cell<*const RingEntry> = const { Cell::new(std::ptr::null()) };
    /// The queue whose role token (`Queue::driving`) this thread holds.
    static DRIVING: Cell<*const Queue> = const { Cell::new(std::ptr::null()) };
    /// The queue whose request this thread is dispatching, after giving up
    /// the token for it.
    static DISPATCH_QUEUE: Cell<*const Queue> = const { Cell::new(std::ptr::null()) };
    /// This thread queued an SQE during its dispatch and told no driver.
    static UNKICKED: Cell<bool> = const { Cell::new(false) };
    /// This thread's number within its queue, recorded as the owner of the
    /// commands it submits (0: not a ring thread).
    static SERIAL: Cell<usize> = const { Cell::new(0) };
}

fn is_current(cell: &'static std::thread::LocalKey<Cell<*const Queue>>, q: &Queue) -> bool {
    std::ptr::eq(cell.with(|c| c.get()), q)
}

/// Where the kernel's completion queue head and tail are, to ask "is there
/// a completion?" from a thread that does not hold the token.
struct CqStatus(cqueue::CompletionStatus);

// SAFETY: two pointers into the ring's mapping, only read; the `Queue` that
// holds this also owns the ring, so the mapping outlives it.
unsafe impl Send for CqStatus {}
// SAFETY: as above.
unsafe impl Sync for CqStatus {}

/// One ring: the kernel queue `qid`, and the threads that serve it.
///
/// Of the queue's threads, the one holding the role token (`driving`)
/// waits on the ring, reads completions and submits; it gives the token up
/// while it runs a handler and tries to take it back afterwards. The others
/// run handlers or wait as standbys on `standby_fd`, which the kernel
/// signals when it posts a completion while nobody holds the token.
pub(crate) struct Queue {
    qid: u16,
    ring: Ring,
    /// SQEs pushed and not submitted yet, in submission-queue order: the
    /// entry index of each ([`POLL_SLOT`] for the wake-up poll). Its lock
    /// serialises pushes (per queue, never global).
    unsubmitted: Mutex<Vec<u32>>,
    /// The length of `unsubmitted`, to look at without the lock.
    queued: AtomicUsize,
    /// Which thread ([`SERIAL`]) submitted each entry's pending command: the
    /// kernel cancels a thread's commands when it exits.
    owners: Box<[AtomicUsize]>,
    /// Polled by the ring: written to wake the driver out of its wait.
    kick: OwnedFd,
    kick_pending: AtomicBool,
    /// Registered with the ring (`IORING_REGISTER_EVENTFD`) and enabled only
    /// while the token is free; standby threads wait on it.
    standby_fd: OwnedFd,
    /// The role token.
    driving: AtomicBool,
    /// A timer (timerfd) the standbys also wait on: armed when a handler
    /// starts while completions are already waiting.
    nudge_fd: OwnedFd,
    /// When the nudge timer expires, in nanoseconds since `epoch` (it
    /// never expires earlier; 0: not armed).
    nudge_at: AtomicU64,
    epoch: Instant,
    cq_status: CqStatus,
    closed: AtomicBool,
    dev: Arc<OwnedFd>,
    served: AtomicUsize,
    /// Entries the kernel will not complete again.
    dead: AtomicUsize,
    /// Threads of this queue alive, and those waiting as standbys (or
    /// about to).
    live: AtomicUsize,
    standby: AtomicUsize,
    next_serial: AtomicUsize,
    /// The threads started after the first, joined when the rings end
    /// (finished ones are dropped when another starts).
    followers: Mutex<Vec<JoinHandle<()>>>,
    depth: usize,
}

impl Queue {
    /// Puts one SQE in the submission queue; the next `io_uring_enter` of
    /// the thread holding the token submits it. `slot` is the entry it
    /// belongs to ([`POLL_SLOT`] for the wake-up poll).
    fn push(&self, sqe: &squeue::Entry128, slot: u32) -> io::Result<()> {
        let mut list = self.unsubmitted.lock().unwrap_or_else(|e| e.into_inner());
        {
            // SAFETY: submission queues of this ring are only created here, under
            // the `unsubmitted` lock, so no other `SubmissionQueue` exists at the
            // same time.
            let mut sq = unsafe { self.ring.submission_shared() };
            // SAFETY: every pointer in the SQEs we build (the iovec array and the
            // buffers it points to) belongs to a `RingEntry` that the queue's
            // threads keep alive until they exit, and the kernel completes or
            // cancels the threads' commands before that; the poll SQE has no pointer.
            unsafe { sq.push(sqe) }.map_err(|_| io::Error::from_raw_os_error(libc::EBUSY))?;
        }
        // Within capacity (reserved for the submission queue's size): no allocation.
        list.push(slot);
        self.queued.store(list.len(), Ordering::SeqCst);
        Ok(())
    }

    /// After a push: makes sure a thread holding the token will submit it.
    fn pushed(&self) {
        if is_current(&DRIVING, self) {
            return; // we submit it at our next io_uring_enter
        }
        if is_current(&DISPATCH_QUEUE, self) && !self.driving.load(Ordering::SeqCst) {
            // Inside a handler of this queue while nobody drives: this thread
            // takes the token back when the handler returns, and submits then
            // (or kicks, if someone else took it).
            UNKICKED.with(|u| u.set(true));
            return;
        }
        self.kick();
    }

    /// Wakes the driver out of its wait (through the polled eventfd; with
    /// no driver, the poll's completion signals the standbys).
    fn kick(&self) {
        if !self.kick_pending.swap(true, Ordering::SeqCst) {
            let _ = nix::unistd::write(&self.kick, &1u64.to_ne_bytes());
        }
    }

    fn wake_standbys(&self) {
        let _ = nix::unistd::write(&self.standby_fd, &1u64.to_ne_bytes());
    }

    fn arm_kick(&self) -> io::Result<()> {
        let sqe = opcode::PollAdd::new(types::Fd(self.kick.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(WAKE);
        self.push(&sqe.into(), POLL_SLOT)
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    /// Makes sure the nudge timer expires in the future (at most
    /// [`NUDGE_AFTER`] from now): when it does, a standby looks for work
    /// nobody drives for. Re-armed at most about once per half period.
    fn arm_nudge(&self) {
        let now = self.now();
        if self.nudge_at.load(Ordering::SeqCst) > now + NUDGE_AFTER.as_nanos() as u64 / 2 {
            return;
        }
        let at = now + NUDGE_AFTER.as_nanos() as u64;
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: 0,
                tv_nsec: NUDGE_AFTER.as_nanos() as libc::c_long,
            },
        };
        // Published before the timer is set, so that the timer never
        // expires before the time recorded.
        self.nudge_at.store(at, Ordering::SeqCst);
        // SAFETY: timerfd_settime on our own timerfd with a valid itimerspec
        // on the stack; no old value is asked for.
        let r = unsafe { libc::timerfd_settime(self.nudge_fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if r != 0 {
            self.nudge_at.store(0, Ordering::SeqCst);
        }
    }

    fn has_unsubmitted(&self) -> bool {
        self.queued.load(Ordering::SeqCst) != 0
    }

    /// Submits the queued SQEs and, with `wait`, waits for a completion.
    /// Only the token holder calls it. It records itself as the owner of
    /// each command it submitted; SQEs pushed after the count was taken
    /// are left to the next call.
    fn enter(&self, wait: bool) -> io::Result<()> {
        let n = self.unsubmitted.lock().unwrap_or_else(|e| e.into_inner()).len();
        if n == 0 && !wait {
            return Ok(());
        }
        let flags = if wait { EnterFlags::GETEVENTS.bits() } else { 0 };
        // SAFETY: io_uring_enter on our own ring with no argument; the SQEs it
        // submits were checked in `push`.
        let r = unsafe {
            self.ring
                .submitter()
                .enter::<libc::sigset_t>(n as u32, u32::from(wait), flags, None)
        };
        let submitted = match &r {
            Ok(k) => (*k).min(n),
            Err(_) => 0,
        };
        if submitted > 0 {
            let me = SERIAL.with(|s| s.get());
            let mut list = self.unsubmitted.lock().unwrap_or_else(|e| e.into_inner());
            for slot in list.drain(..submitted) {
                if let Some(o) = self.owners.get(slot as usize) {
                    o.store(me, Ordering::Release);
                }
            }
            self.queued.store(list.len(), Ordering::SeqCst);
        }
        r.map(|_| ())
    }

    /// Takes the role token if it is free.
    fn try_drive(&self) -> bool {
        if self
            .driving
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return false;
        }
        // SAFETY: only the token holder makes views of the completion queue.
        unsafe { self.ring.completion_shared() }.disable_eventfd();
        DRIVING.with(|d| d.set(self));
        true
    }

    /// Gives the token up (to run a handler, or to end). From here on the
    /// kernel signals the standbys when it posts a completion. One that it
    /// posted before is looked for here: the standbys are woken at once,
    /// unless the nudge timer, which expires after this point, will do it.
    fn release(&self) {
        // SAFETY: we hold the token, so no other view of the completion queue exists.
        unsafe { self.ring.completion_shared() }.enable_eventfd();
        DRIVING.with(|d| d.set(std::ptr::null()));
        self.driving.store(false, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        let idle = self.cq_status.0.is_empty() && !self.has_unsubmitted();
        if idle || self.nudge_at.load(Ordering::SeqCst) > self.now() {
            return;
        }
        self.wake_standbys();
    }

    /// The queue's state, for a log line.
    fn describe(&self) -> String {
        format!(
            "queue {}: {} threads ({} standby), token {}, {} of {} entries ended, {} SQEs not submitted, \
             completions {}",
            self.qid,
            self.live.load(Ordering::SeqCst),
            self.standby.load(Ordering::SeqCst),
            if self.driving.load(Ordering::SeqCst) {
                "held"
            } else {
                "free"
            },
            self.dead.load(Ordering::SeqCst),
            self.depth,
            self.queued.load(Ordering::SeqCst),
            if self.cq_status.0.is_empty() {
                "none waiting"
            } else {
                "waiting"
            },
        )
    }

    /// Whether the kernel holds a command that thread `me` submitted.
    fn owns_armed(&self, me: usize, entries: &[(Arc<RingEntry>, Arc<WorkerCore>)]) -> bool {
        entries.iter().any(|(e, _)| {
            e.state.load(Ordering::Acquire) == ARMED
                && self.owners[e.index as usize].load(Ordering::Acquire) == me
        })
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
// in state SERVING/STASHED (the queue thread that dispatches its request,
// during and right after the dispatch).
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
            .push(&self.command(uring_cmd::REGISTER, 0, KIND_REGISTER), self.index)
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
        self.queue.push(
            &self.command(uring_cmd::COMMIT_AND_FETCH, ent.commit_id, KIND_COMMIT),
            self.index,
        )?;
        self.queue.pushed();
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
            // The queue is closed (session stopped or connection ended).
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
    /// It waited as a standby for the idle timeout, above the floor.
    Retired,
    /// `io_uring_enter` failed.
    Failed(io::Error),
}

/// The running rings of a session.
pub(crate) struct Rings {
    queues: Vec<Arc<Queue>>,
    /// The first thread of each queue (the others are not joined: the
    /// queue's `live` count says when they are gone).
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

    fn all_ended(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
            && self.queues.iter().all(|q| q.live.load(Ordering::SeqCst) == 0)
    }

    /// Waits for the queue threads; after `grace` they are told to stop
    /// (their commands are then cancelled as they exit).
    pub(crate) fn join(self, shared: &Shared, grace: Duration) {
        let deadline = Instant::now() + grace;
        while !self.all_ended() {
            if Instant::now() >= deadline && !shared.shutdown.swap(true, Ordering::AcqRel) {
                let state: Vec<String> = self
                    .queues
                    .iter()
                    .filter(|q| q.live.load(Ordering::SeqCst) > 0)
                    .map(|q| q.describe())
                    .collect();
                log::warn!(
                    "io_uring queues still running {grace:?} after the /dev/fuse workers; stopping them: {}",
                    state.join("; ")
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
        // Every thread has left its loop (`live` is 0); wait until they are
        // gone, so that none outlives the session.
        join_followers(&self.queues);
    }
}

fn join_followers(queues: &[Arc<Queue>]) {
    for q in queues {
        let threads = std::mem::take(&mut *q.followers.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            if t.join().is_err() {
                log::error!("io_uring queue {} thread panicked", q.qid);
            }
        }
    }
}

fn wake_queues(queues: &[Arc<Queue>]) {
    for q in queues {
        q.kick_pending.store(true, Ordering::SeqCst);
        let _ = nix::unistd::write(&q.kick, &1u64.to_ne_bytes());
        q.wake_standbys();
    }
}

fn eventfd(what: &str) -> Result<OwnedFd, Unavailable> {
    // SAFETY: eventfd(2) with valid flags; the result is checked below.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if efd < 0 {
        let e = io::Error::last_os_error();
        return Err(Unavailable::Setup {
            what: what.to_string(),
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        });
    }
    // SAFETY: `efd` was just returned by eventfd(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(efd) })
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
        let mut ring = Ring::builder()
            .setup_cqsize(2 * sq_size)
            .build(sq_size)
            .map_err(|e| setup(&format!("io_uring_setup for queue {qid}"), e))?;
        let kick = eventfd("eventfd")?;
        let standby_fd = eventfd("eventfd")?;
        let nudge_fd = timerfd()?;
        ring.submitter()
            .register_eventfd(standby_fd.as_raw_fd())
            .map_err(|e| setup(&format!("IORING_REGISTER_EVENTFD for queue {qid}"), e))?;
        // The first thread starts with the token: no signal until it gives it up.
        ring.completion().disable_eventfd();
        // SAFETY: the status only reads the ring's mapping, which the queue
        // that keeps it also owns (see `CqStatus`).
        let cq_status = CqStatus(unsafe { ring.completion_shared().status() });
        let queue = Arc::new(Queue {
            qid: qid as u16,
            ring,
            unsubmitted: Mutex::new(Vec::with_capacity(sq_size as usize)),
            queued: AtomicUsize::new(0),
            owners: (0..depth).map(|_| AtomicUsize::new(0)).collect(),
            kick,
            kick_pending: AtomicBool::new(false),
            standby_fd,
            driving: AtomicBool::new(true),
            nudge_fd,
            nudge_at: AtomicU64::new(0),
            epoch: Instant::now(),
            cq_status,
            closed: AtomicBool::new(false),
            dev: dev.clone(),
            served: AtomicUsize::new(0),
            dead: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            standby: AtomicUsize::new(0),
            next_serial: AtomicUsize::new(1),
            followers: Mutex::new(Vec::new()),
            depth,
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
        built.push(Arc::new(QueueCtx {
            fs: fs.clone(),
            shared: shared.clone(),
            q: queue,
            entries,
            on_start: on_thread_start.clone(),
        }));
    }

    // Phase 2: a pinned thread per queue registers its entries and serves.
    let (tx, rx) = crossbeam_channel::bounded::<(usize, Result<(), Unavailable>)>(nr_queues);
    let mut queues = Vec::with_capacity(nr_queues);
    let mut threads = Vec::with_capacity(nr_queues);
    for ctx in built {
        let qid = ctx.q.qid as usize;
        queues.push(ctx.q.clone());
        let tx = tx.clone();
        ctx.q.live.fetch_add(1, Ordering::SeqCst);
        let serial = ctx.q.next_serial.fetch_add(1, Ordering::Relaxed);
        let mine = ctx.clone();
        let t = std::thread::Builder::new()
            .name(format!("fuse-uring-{qid}"))
            .spawn(move || mine.first_thread(serial, tx));
        match t {
            Ok(t) => threads.push(t),
            Err(e) => {
                ctx.q.live.fetch_sub(1, Ordering::SeqCst);
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
    let deadline = Instant::now() + Duration::from_secs(5);
    while !rings.all_ended() && Instant::now() < deadline {
        rings.wake_all();
        std::thread::sleep(Duration::from_millis(5));
    }
    if !rings.all_ended() {
        log::warn!("io_uring queue threads still running after they were told to stop");
        return;
    }
    for t in rings.threads {
        let _ = t.join();
    }
    join_followers(&rings.queues);
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

/// Waits until `a` or `b` is readable or `timeout` passes; false on timeout.
fn wait_readable(a: &OwnedFd, b: &OwnedFd, timeout: Option<Duration>) -> bool {
    let pfd = |fd: &OwnedFd| libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds = [pfd(a), pfd(b)];
    let ms = timeout.map_or(-1, |t| t.as_millis().clamp(1, i32::MAX as u128) as i32);
    // SAFETY: poll(2) on two pollfds that live on the stack for the call.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    r != 0 // a signal (r < 0) counts as a wake-up: the caller looks again
}

fn timerfd() -> Result<OwnedFd, Unavailable> {
    // SAFETY: timerfd_create(2) with valid flags; the result is checked below.
    let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(Unavailable::Setup {
            what: "timerfd_create".into(),
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        });
    }
    // SAFETY: `fd` was just returned by timerfd_create(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn drain(fd: &OwnedFd) {
    let mut b = [0u8; 8];
    let _ = nix::unistd::read(fd, &mut b);
}

/// What the threads of one queue share.
struct QueueCtx<F> {
    fs: Arc<F>,
    shared: Arc<Shared>,
    q: Arc<Queue>,
    entries: Vec<(Arc<RingEntry>, Arc<WorkerCore>)>,
    on_start: Arc<dyn Fn() -> crate::signal::Registered + Send + Sync>,
}

type SetupTx = crossbeam_channel::Sender<(usize, Result<(), Unavailable>)>;

impl<F: Filesystem> QueueCtx<F> {
    fn stopping(&self) -> bool {
        self.shared.shutdown.load(Ordering::Acquire) || self.q.closed.load(Ordering::Acquire)
    }

    fn enter_thread(&self, serial: usize) -> crate::signal::Registered {
        SERIAL.with(|s| s.set(serial));
        pin_to_cpu(self.q.qid as usize);
        (self.on_start)()
    }

    /// The queue's first thread: registers the entries, starts the first
    /// standby and serves.
    fn first_thread(self: Arc<Self>, serial: usize, setup: SetupTx) -> QueueEnd {
        let _registered = self.enter_thread(serial);
        let q = &self.q;
        let qid = q.qid as usize;
        // The queue was built with the token taken for this thread.
        DRIVING.with(|d| d.set(Arc::as_ptr(q)));
        let mut armed = q
            .arm_kick()
            .and_then(|_| self.entries.iter().try_for_each(|(e, _)| e.register()));
        if armed.is_ok() {
            armed = q.enter(false);
        }
        if let Err(e) = armed {
            let _ = setup.send((
                qid,
                Err(Unavailable::Setup {
                    what: format!("submitting REGISTER on queue {qid}"),
                    errno: e.raw_os_error().unwrap_or(libc::EIO),
                }),
            ));
            let end = self.leave_driving(QueueEnd::Failed(e));
            q.live.fetch_sub(1, Ordering::SeqCst);
            return end;
        }
        if !self.spawn_follower() {
            log::warn!("io_uring queue {qid}: no standby thread; a blocking handler will stall the queue");
        }
        self.run(true, &mut Some(setup))
    }

    /// A thread started to wait as a standby.
    fn follower(self: Arc<Self>, serial: usize) {
        let _registered = self.enter_thread(serial);
        let end = self.run(false, &mut None);
        log::debug!("io_uring queue {} thread {serial} ended: {end:?}", self.q.qid);
    }

    /// Starts one more thread, as a standby; false at the cap of `depth + 1`
    /// threads or if it could not start.
    fn spawn_follower(self: &Arc<Self>) -> bool {
        let q = &self.q;
        let cap = q.depth + 1;
        if q.live
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| (l < cap).then_some(l + 1))
            .is_err()
        {
            return false;
        }
        q.standby.fetch_add(1, Ordering::SeqCst);
        let serial = q.next_serial.fetch_add(1, Ordering::Relaxed);
        let ctx = self.clone();
        let t = std::thread::Builder::new()
            .name(format!("fuse-uring-{}", q.qid))
            .spawn(move || ctx.follower(serial));
        match t {
            Ok(t) => {
                let mut f = q.followers.lock().unwrap_or_else(|e| e.into_inner());
                f.retain(|t| !t.is_finished());
                f.push(t);
                true
            }
            Err(e) => {
                q.standby.fetch_sub(1, Ordering::SeqCst);
                q.live.fetch_sub(1, Ordering::SeqCst);
                log::warn!("io_uring queue {}: cannot start a thread: {e}", q.qid);
                false
            }
        }
    }

    /// Drives, or waits as a standby, until the thread ends. A thread that
    /// starts as a standby is counted in `standby` already.
    fn run(self: &Arc<Self>, mut driving: bool, setup: &mut Option<SetupTx>) -> QueueEnd {
        let end = loop {
            if !driving && let Err(end) = self.standby() {
                break end;
            }
            driving = false;
            if let Some(end) = self.drive(setup) {
                break end;
            }
        };
        if !matches!(end, QueueEnd::Retired) {
            self.q.live.fetch_sub(1, Ordering::SeqCst);
        }
        end
    }

    /// Gives the token up for good: the queue is closed, and every other
    /// thread of it is told so.
    fn leave_driving(&self, end: QueueEnd) -> QueueEnd {
        self.q.closed.store(true, Ordering::Release);
        self.q.release();
        self.q.wake_standbys();
        end
    }

    /// Waits until this thread takes the token (`Ok`) or ends. Leaves the
    /// `standby` count either way.
    fn standby(&self) -> Result<(), QueueEnd> {
        let q = &self.q;
        let floor = THREAD_FLOOR.min(q.depth + 1);
        let mut backoff = 1u32;
        let leave = |r: Result<(), QueueEnd>| {
            q.standby.fetch_sub(1, Ordering::SeqCst);
            r
        };
        loop {
            if self.stopping() {
                return leave(Err(QueueEnd::Stopped));
            }
            // Work nobody drives for (it came before this thread was waiting).
            if !q.driving.load(Ordering::SeqCst)
                && (!q.cq_status.0.is_empty() || q.has_unsubmitted())
                && q.try_drive()
            {
                return leave(Ok(()));
            }
            let above_floor = q.live.load(Ordering::SeqCst) > floor;
            let timeout = above_floor.then(|| self.shared.pool.cfg.idle_timeout * backoff);
            if wait_readable(&q.standby_fd, &q.nudge_fd, timeout) {
                if self.stopping() {
                    // Leave the eventfd readable: every other standby must
                    // see it too (the one write that closed the queue wakes
                    // them all, but a drained eventfd puts them back to sleep).
                    return leave(Err(QueueEnd::Stopped));
                }
                // Read the counters before looking (at the top of the loop):
                // what comes after writes them again.
                drain(&q.standby_fd);
                drain(&q.nudge_fd);
                continue;
            }
            if !above_floor {
                continue;
            }
            // Idle for the timeout above the floor: end, unless the kernel
            // holds a command this thread submitted (exiting would cancel it:
            // wait until a request has used it).
            if q.owns_armed(SERIAL.with(|s| s.get()), &self.entries) {
                backoff = (backoff * 2).min(64);
                continue;
            }
            if q.live
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| {
                    (l > floor).then_some(l - 1)
                })
                .is_ok()
            {
                return leave(Err(QueueEnd::Retired));
            }
        }
    }

    /// Serves the ring while holding the token. `None`: the thread gave the
    /// token up for a handler and another thread took it; it goes to wait as
    /// a standby (and is counted as one).
    fn drive(self: &Arc<Self>, setup: &mut Option<SetupTx>) -> Option<QueueEnd> {
        let q = &self.q;
        let qid = q.qid as usize;
        let fail = |what: &str, e: &io::Error| Unavailable::Setup {
            what: format!("{what} on queue {qid}"),
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        };
        loop {
            if q.dead.load(Ordering::SeqCst) >= self.entries.len() {
                return Some(self.leave_driving(QueueEnd::Disconnected));
            }
            if self.stopping() {
                return Some(self.leave_driving(QueueEnd::Stopped));
            }
            // One completion at a time: those not taken yet stay in the ring
            // for whoever drives next, should this thread's handler block.
            let cqe = {
                // SAFETY: only the token holder makes views of the completion queue.
                let mut cq = unsafe { q.ring.completion_shared() };
                cq.next()
            };
            let Some(cqe) = cqe else {
                if let Some(s) = setup.take() {
                    let _ = s.send((qid, Ok(())));
                }
                // Submit what was queued (replies, re-arms) and wait.
                if let Err(e) = q.enter(true) {
                    match e.raw_os_error() {
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY) => {}
                        _ => return Some(self.leave_driving(QueueEnd::Failed(e))),
                    }
                }
                continue;
            };
            let ud = cqe.user_data();
            if ud == WAKE {
                // Read the counter before clearing the flag: a kick that comes
                // after the read writes again and fires the new poll.
                drain(&q.kick);
                q.kick_pending.store(false, Ordering::SeqCst);
                if let Err(e) = q.arm_kick() {
                    log::error!("io_uring queue {qid}: re-arming the wake-up poll: {e}");
                }
                continue;
            }
            let Some((entry, core)) = self.entries.get((ud & 0xffff_ffff) as usize) else {
                log::error!("io_uring queue {qid}: completion for unknown entry {ud:#x}");
                continue;
            };
            let res = cqe.result();
            if res == 0 {
                entry.state.store(SERVING, Ordering::Release);
                q.served.fetch_add(1, Ordering::Relaxed);
                if let Some(s) = setup.take() {
                    let _ = s.send((qid, Ok(())));
                }
                self.release_for_handler();
                serve_entry(&self.fs, entry, core);
                // Counted as a standby before looking at the token, so that a
                // driver that sees neither this thread driving nor waiting
                // does not start another thread for nothing.
                q.standby.fetch_add(1, Ordering::SeqCst);
                if q.try_drive() {
                    q.standby.fetch_sub(1, Ordering::SeqCst);
                    UNKICKED.with(|u| u.set(false));
                    entry.flush_stash();
                    continue;
                }
                // Another thread drives: hand it what this one queued.
                entry.flush_stash();
                if UNKICKED.with(|u| u.replace(false)) {
                    q.kick();
                }
                return None;
            }
            let errno = -res;
            match errno {
                libc::ENOTCONN | libc::ECANCELED | libc::ENODEV => {
                    entry.state.store(DEAD, Ordering::Release);
                    q.dead.fetch_add(1, Ordering::SeqCst);
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
                        q.dead.fetch_add(1, Ordering::SeqCst);
                    }
                }
                _ => {
                    let e = io::Error::from_raw_os_error(errno);
                    log::error!("io_uring queue {qid} entry {}: REGISTER failed: {e}", entry.index);
                    entry.state.store(DEAD, Ordering::Release);
                    q.dead.fetch_add(1, Ordering::SeqCst);
                    if let Some(s) = setup.take() {
                        let _ = s.send((qid, Err(fail("REGISTER", &e))));
                    }
                }
            }
        }
    }

    /// Before running a handler on the driving thread: makes sure a standby
    /// exists and gives the token up, so that a handler that blocks holds
    /// its entry and its thread, never the queue. Costs no system call when
    /// no other request is waiting and a standby exists.
    ///
    /// Completions already waiting, and replies queued but not submitted
    /// (those of the handlers run before in this batch), do not signal the
    /// standbys. Rather than waking one at once, or submitting at once (a
    /// system call for each request of a burst, though the handler most
    /// likely returns in microseconds), the nudge timer is set: when it
    /// expires a standby looks, and takes the token if nobody holds it.
    fn release_for_handler(self: &Arc<Self>) {
        let q = &self.q;
        if !q.cq_status.0.is_empty() || q.has_unsubmitted() {
            q.arm_nudge();
        }
        if q.standby.load(Ordering::SeqCst) == 0 {
            self.spawn_follower();
        }
        q.release();
    }
}

/// Parses the request in `entry`'s buffers and dispatches it. The caller
/// commits a reply stashed during the dispatch ([`RingEntry::flush_stash`]).
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
    DISPATCH_QUEUE.with(|d| d.set(Arc::as_ptr(&entry.queue)));
    let opcode = fuse_proto::request::peek_opcode(in_out).and_then(|n| Opcode::from_u32(n).ok());
    if payload_sz > 0 && matches!(opcode, Some(Opcode::Getxattr | Opcode::Ioctl)) {
        // These requests borrow arguments from the payload buffer (the xattr
        // name, the ioctl input) and their replies carry data, which a
        // handler may send before it returns: the reply would overwrite what
        // the handler still borrows. Parse them from a private copy (small:
        // a name, or an ioctl's input), kept per thread.
        SIDE.with(|side| {
            let mut side = side.borrow_mut();
            side.clear();
            side.extend_from_slice(payload);
            parse_and_serve(fs, core, in_out, op_in, &side);
        });
    } else {
        parse_and_serve(fs, core, in_out, op_in, payload);
    }
    DISPATCH_QUEUE.with(|d| d.set(std::ptr::null()));
    DISPATCHING.with(|d| d.set(std::ptr::null()));
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
