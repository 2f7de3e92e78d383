//! The io_uring rings themselves: one per possible CPU, each with a few
//! entries that carry requests in and replies out. Transport level: this
//! module knows nothing of the dispatcher or the filesystem; the threads
//! that serve a queue are in `crate::ring_worker`.
//!
//! Each queue ([`Queue`]) has its own `io_uring` (built with 128-byte SQEs,
//! which the FUSE commands need) and `depth` ring entries. An entry
//! ([`RingEntry`]) owns a header buffer (`fuse_uring_req_header`: in-header
//! or out-header, the first argument, and `commit_id`/`payload_sz`) and a
//! payload buffer, both allocated once and registered with the kernel by a
//! REGISTER command. When the kernel has a request for the queue it fills
//! an entry's buffers and completes that entry's command; a queue thread
//! reads the request in place ([`RingEntry::with_request`]) and the entry
//! is the reply sink of that request. The reply is copied once into the
//! entry's buffers and a COMMIT_AND_FETCH command hands it back and
//! re-arms the entry.
//!
//! Here are the parts of the leader/followers scheme that touch the ring:
//! the role token (`Queue::driving`) whose holder alone makes views of the
//! completion queue and enters the kernel; the eventfd registered with the
//! ring that signals standby threads while nobody holds the token; the
//! nudge timer; the submission list under the queue's own lock and the
//! polled eventfd that wakes the driver; and, per entry, the thread whose
//! `io_uring_enter` submitted its pending command (the kernel cancels a
//! thread's commands when it exits). `docs/uring.md` tells the whole story.

use super::{Ring, Unavailable};
use crate::transport::ReplySink;
use fuse_proto::abi::{OutHeader, UringCmdReq, UringEntInOut, UringReqHeader};
use fuse_proto::consts::{URING_IN_OUT_HEADER_SZ, uring_cmd};
use fuse_proto::{Errno, Opcode, Reply};
use io_uring::{EnterFlags, cqueue, opcode, squeue, types};
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

/// Where a ring entry is in its cycle. Who may touch its buffers follows
/// from it: the kernel while `Armed`, the thread that serves its request
/// while `Serving` or `Stashed`, nobody while `Idle` or `Dead`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum EntryState {
    /// Not registered yet.
    Idle = 0,
    /// The kernel holds the entry (REGISTER or COMMIT_AND_FETCH pending).
    Armed = 1,
    /// A request is in the buffers, no reply yet.
    Serving = 2,
    /// A fixed-size reply waits in `stash` for the handler to return.
    Stashed = 3,
    /// The kernel will not complete anything for it again.
    Dead = 4,
}

impl EntryState {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => EntryState::Idle,
            1 => EntryState::Armed,
            2 => EntryState::Serving,
            3 => EntryState::Stashed,
            // Only values of this type are ever stored.
            _ => EntryState::Dead,
        }
    }
}

/// An [`EntryState`] changed atomically (one byte).
struct AtomicEntryState(AtomicU8);

impl AtomicEntryState {
    fn new(s: EntryState) -> Self {
        Self(AtomicU8::new(s as u8))
    }

    fn load(&self, order: Ordering) -> EntryState {
        EntryState::from_u8(self.0.load(order))
    }

    fn store(&self, s: EntryState, order: Ordering) {
        self.0.store(s as u8, order)
    }

    /// Moves from `from` to `to`; the state found otherwise.
    fn compare_exchange(
        &self,
        from: EntryState,
        to: EntryState,
        success: Ordering,
        failure: Ordering,
    ) -> Result<EntryState, EntryState> {
        self.0
            .compare_exchange(from as u8, to as u8, success, failure)
            .map(EntryState::from_u8)
            .map_err(EntryState::from_u8)
    }
}

// user_data: entry index in the low 32 bits, the command in the high ones.
pub(crate) const WAKE: u64 = u64::MAX;
pub(crate) const KIND_REGISTER: u64 = 1 << 32;
pub(crate) const KIND_COMMIT: u64 = 2 << 32;
/// Stands for the wake-up poll in a queue's list of SQEs not yet submitted.
const POLL_SLOT: u32 = u32::MAX;

/// How long a request that was already waiting when a handler started may
/// wait for that handler before a standby serves it.
const NUDGE_AFTER: Duration = Duration::from_millis(1);

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

/// Records this thread's number within its queue (see `SERIAL`).
pub(crate) fn set_thread_serial(serial: usize) {
    SERIAL.with(|s| s.set(serial));
}

/// This thread's number within its queue (0: not a ring thread).
pub(crate) fn thread_serial() -> usize {
    SERIAL.with(|s| s.get())
}

/// Whether this thread queued an SQE during its dispatch and told no
/// driver; clears the mark.
pub(crate) fn take_unkicked() -> bool {
    UNKICKED.with(|u| u.replace(false))
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
    pub(crate) qid: u16,
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
    pub(crate) standby_fd: OwnedFd,
    /// The role token.
    pub(crate) driving: AtomicBool,
    /// A timer (timerfd) the standbys also wait on: armed when a handler
    /// starts while completions are already waiting.
    pub(crate) nudge_fd: OwnedFd,
    /// When the nudge timer expires, in nanoseconds since `epoch` (it
    /// never expires earlier; 0: not armed).
    nudge_at: AtomicU64,
    epoch: Instant,
    cq_status: CqStatus,
    pub(crate) closed: AtomicBool,
    dev: Arc<OwnedFd>,
    pub(crate) served: AtomicUsize,
    /// Entries the kernel will not complete again.
    pub(crate) dead: AtomicUsize,
    /// Threads of this queue alive, and those waiting as standbys (or
    /// about to).
    pub(crate) live: AtomicUsize,
    pub(crate) standby: AtomicUsize,
    pub(crate) next_serial: AtomicUsize,
    /// The threads started after the first, joined when the rings end
    /// (finished ones are dropped when another starts).
    pub(crate) followers: Mutex<Vec<JoinHandle<()>>>,
    pub(crate) depth: usize,
}

impl Queue {
    /// Builds the ring of kernel queue `qid` for `depth` entries on the
    /// `/dev/fuse` fd `dev`, with its eventfds and timer. The token starts
    /// taken, for the queue's first thread ([`Queue::hold_token_from_start`]).
    pub(crate) fn new(qid: usize, dev: Arc<OwnedFd>, depth: usize) -> Result<Self, Unavailable> {
        let setup = |what: &str, e: io::Error| Unavailable::Setup {
            what: what.to_string(),
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        };
        let sq_size = (depth as u32 + 2).next_power_of_two();
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
        Ok(Queue {
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
            dev,
            served: AtomicUsize::new(0),
            dead: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            standby: AtomicUsize::new(0),
            next_serial: AtomicUsize::new(1),
            followers: Mutex::new(Vec::new()),
            depth,
        })
    }

    /// On the queue's first thread: it holds the token the queue was built with.
    pub(crate) fn hold_token_from_start(&self) {
        DRIVING.with(|d| d.set(self));
    }

    /// Wakes every thread of the queue: the driver through the polled
    /// eventfd, the standbys through theirs (they look at the flags).
    pub(crate) fn wake(&self) {
        self.kick_pending.store(true, Ordering::SeqCst);
        let _ = nix::unistd::write(&self.kick, &1u64.to_ne_bytes());
        self.wake_standbys();
    }

    /// Whether a completion is waiting in the ring (readable without the token).
    pub(crate) fn has_completions(&self) -> bool {
        !self.cq_status.0.is_empty()
    }

    /// The next completion. Only the token holder calls it.
    pub(crate) fn next_completion(&self) -> Option<cqueue::Entry> {
        // SAFETY: only the token holder makes views of the completion queue.
        let mut cq = unsafe { self.ring.completion_shared() };
        cq.next()
    }

    /// Puts one SQE in the submission queue; the next `io_uring_enter` of
    /// the thread holding the token submits it. `slot` is the entry it
    /// belongs to ([`POLL_SLOT`] for the wake-up poll).
    pub(crate) fn push(&self, sqe: &squeue::Entry128, slot: u32) -> io::Result<()> {
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
    pub(crate) fn pushed(&self) {
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
    pub(crate) fn kick(&self) {
        if !self.kick_pending.swap(true, Ordering::SeqCst) {
            let _ = nix::unistd::write(&self.kick, &1u64.to_ne_bytes());
        }
    }

    pub(crate) fn wake_standbys(&self) {
        let _ = nix::unistd::write(&self.standby_fd, &1u64.to_ne_bytes());
    }

    /// After the wake-up poll completed: takes the kick and polls again.
    pub(crate) fn rearm_kick(&self) -> io::Result<()> {
        // Read the counter before clearing the flag: a kick that comes
        // after the read writes again and fires the new poll.
        drain(&self.kick);
        self.kick_pending.store(false, Ordering::SeqCst);
        self.arm_kick()
    }

    pub(crate) fn arm_kick(&self) -> io::Result<()> {
        let sqe = opcode::PollAdd::new(types::Fd(self.kick.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(WAKE);
        self.push(&sqe.into(), POLL_SLOT)
    }

    pub(crate) fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    /// Makes sure the nudge timer expires in the future (at most
    /// [`NUDGE_AFTER`] from now): when it does, a standby looks for work
    /// nobody drives for. Re-armed at most about once per half period.
    pub(crate) fn arm_nudge(&self) {
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

    pub(crate) fn has_unsubmitted(&self) -> bool {
        self.queued.load(Ordering::SeqCst) != 0
    }

    /// Submits the queued SQEs and, with `wait`, waits for a completion.
    /// Only the token holder calls it. It records itself as the owner of
    /// each command it submitted; SQEs pushed after the count was taken
    /// are left to the next call.
    pub(crate) fn enter(&self, wait: bool) -> io::Result<()> {
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
    pub(crate) fn try_drive(&self) -> bool {
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
    pub(crate) fn release(&self) {
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
    pub(crate) fn describe(&self) -> String {
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
    pub(crate) fn owns_armed<'a>(&self, me: usize, mut entries: impl Iterator<Item = &'a RingEntry>) -> bool {
        entries.any(|e| {
            e.state.load(Ordering::Acquire) == EntryState::Armed
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

/// One ring entry: the [`ReplySink`] for the request in its buffers.
pub(crate) struct RingEntry {
    queue: Arc<Queue>,
    pub(crate) index: u32,
    header: Buf,
    payload: Buf,
    payload_len: usize,
    /// `struct iovec[2]` for REGISTER, kept at a stable address.
    iov: [libc::iovec; 2],
    state: AtomicEntryState,
    /// A fixed-size reply sent while its request was still being
    /// dispatched: written to the buffers once the handler has returned, so
    /// that the request bytes it borrows are not overwritten under it.
    stash: UnsafeCell<[u8; STASH]>,
    stash_len: Cell<usize>,
}

// SAFETY: the raw pointers in `iov` point into this entry's own buffers;
// `stash`/`stash_len` are only touched by the thread that holds the entry
// in state Serving/Stashed (the queue thread that dispatches its request,
// during and right after the dispatch).
unsafe impl Send for RingEntry {}
// SAFETY: as above.
unsafe impl Sync for RingEntry {}

impl RingEntry {
    pub(crate) fn new(queue: Arc<Queue>, index: u32, payload_len: usize) -> io::Result<Self> {
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
            state: AtomicEntryState::new(EntryState::Idle),
            stash: UnsafeCell::new([0; STASH]),
            stash_len: Cell::new(0),
        })
    }

    pub(crate) fn command(&self, op: u32, commit_id: u64, kind: u64) -> squeue::Entry128 {
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

    /// Its command completed with a request: the buffers are the serving
    /// thread's until it replies.
    pub(crate) fn took_request(&self) {
        self.state.store(EntryState::Serving, Ordering::Release);
    }

    /// The kernel will not complete anything for this entry again.
    pub(crate) fn mark_dead(&self) {
        self.state.store(EntryState::Dead, Ordering::Release);
    }

    pub(crate) fn register(&self) -> io::Result<()> {
        self.state.store(EntryState::Armed, Ordering::Release);
        self.queue
            .push(&self.command(uring_cmd::REGISTER, 0, KIND_REGISTER), self.index)
    }

    pub(crate) fn ent_in_out(&self) -> UringEntInOut {
        let off = offset_of!(UringReqHeader, ring_ent_in_out);
        // SAFETY: the header buffer holds at least a `fuse_uring_req_header`;
        // called only in state Serving/Stashed, when the kernel is not writing it.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.header.ptr.as_ptr().add(off), size_of::<UringEntInOut>())
        };
        zerocopy::FromBytes::read_from_bytes(bytes).unwrap_or_default()
    }

    /// Writes the out header and `payload_sz`, then queues COMMIT_AND_FETCH.
    pub(crate) fn commit(&self, out_header: &[u8], payload_sz: usize) -> io::Result<()> {
        let ent = self.ent_in_out();
        let h = self.header.ptr.as_ptr();
        // SAFETY: the caller moved the entry out of Serving/Stashed, so this
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
        self.state.store(EntryState::Armed, Ordering::Release);
        self.queue.push(
            &self.command(uring_cmd::COMMIT_AND_FETCH, ent.commit_id, KIND_COMMIT),
            self.index,
        )?;
        self.queue.pushed();
        Ok(())
    }

    /// Copies a reply into the buffers: out header to `in_out`, everything
    /// after it to the payload buffer. Returns the payload size.
    pub(crate) fn write_reply(&self, msg: &Reply<'_>) -> Option<usize> {
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
    pub(crate) fn flush_stash(&self) {
        if self.state.load(Ordering::Acquire) != EntryState::Stashed {
            return;
        }
        // SAFETY: state Stashed: the stash was written by this (queue) thread
        // during the dispatch that just returned; nobody else touches it.
        let stash = unsafe { &*self.stash.get() };
        let len = self.stash_len.get();
        let (out, fixed) = stash[..len].split_at(size_of::<OutHeader>());
        // SAFETY: exclusive access (state Stashed); `fixed` is at most
        // STASH bytes, and the payload buffer is at least 8 KiB.
        unsafe { std::ptr::copy_nonoverlapping(fixed.as_ptr(), self.payload.ptr.as_ptr(), fixed.len()) };
        if let Err(e) = self.commit(out, fixed.len()) {
            log::error!("io_uring queue {}: commit failed: {e}", self.queue.qid);
        }
    }
}

impl ReplySink for RingEntry {
    fn send(&self, msg: &Reply<'_>) -> io::Result<()> {
        if self.queue.closed.load(Ordering::Acquire) {
            // The queue is closed (session stopped or connection ended).
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        let inline = msg.payload().iter().all(|p| p.is_empty()) && msg.head().len() <= STASH;
        if inline && std::ptr::eq(DISPATCHING.with(|d| d.get()), self) {
            if self
                .state
                .compare_exchange(
                    EntryState::Serving,
                    EntryState::Stashed,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
            {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            // SAFETY: we are the queue thread inside this entry's dispatch and
            // just moved it to Stashed; only `flush_stash`, on this thread
            // after the dispatch, reads the stash.
            let stash = unsafe { &mut *self.stash.get() };
            stash[..msg.head().len()].copy_from_slice(msg.head());
            self.stash_len.set(msg.head().len());
            return Ok(());
        }
        if self
            .state
            .compare_exchange(
                EntryState::Serving,
                EntryState::Armed,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
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

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.queue.dev.as_raw_fd())
    }

    fn describe(&self) -> String {
        format!("io_uring queue {} entry {}", self.queue.qid, self.index)
    }
}

pub(crate) fn eventfd(what: &str) -> Result<OwnedFd, Unavailable> {
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

/// Waits until `a` or `b` is readable or `timeout` passes; false on timeout.
pub(crate) fn wait_readable(a: &OwnedFd, b: &OwnedFd, timeout: Option<Duration>) -> bool {
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

pub(crate) fn timerfd() -> Result<OwnedFd, Unavailable> {
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

pub(crate) fn drain(fd: &OwnedFd) {
    let mut b = [0u8; 8];
    let _ = nix::unistd::read(fd, &mut b);
}

impl RingEntry {
    /// Hands the request in this entry's buffers to `serve` as its three
    /// parts (`in_out`: the in header; `op_in`: the first argument;
    /// the payload), borrowed in place, and marks this thread as inside the
    /// entry's dispatch meanwhile: a fixed-size reply sent from inside
    /// `serve` is kept aside and written when it returns (the caller then
    /// commits it with [`RingEntry::flush_stash`]). The entry must be
    /// `Serving` (its completion was just taken).
    pub(crate) fn with_request(&self, serve: impl FnOnce(&[u8], &[u8], &[u8])) {
        let ent = self.ent_in_out();
        let payload_sz = (ent.payload_sz as usize).min(self.payload_len);
        let hdr = self.header.ptr.as_ptr();
        // SAFETY: the entry is `Serving`: the kernel wrote these buffers before it
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
                std::slice::from_raw_parts(self.payload.ptr.as_ptr(), payload_sz),
            )
        };
        DISPATCHING.with(|d| d.set(self as *const RingEntry));
        DISPATCH_QUEUE.with(|d| d.set(Arc::as_ptr(&self.queue)));
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
                serve(in_out, op_in, &side);
            });
        } else {
            serve(in_out, op_in, payload);
        }
        DISPATCH_QUEUE.with(|d| d.set(std::ptr::null()));
        DISPATCHING.with(|d| d.set(std::ptr::null()));
    }
}

thread_local! {
    /// Private copy of a request payload for [`RingEntry::with_request`]; grows once.
    static SIDE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::*;

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
