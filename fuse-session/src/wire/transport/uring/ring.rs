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

mod entry;
mod fds;

use super::{Ring, Unavailable};
pub(crate) use entry::RingEntry;
pub(crate) use fds::{drain, eventfd, timerfd, wait_readable};
use io_uring::{EnterFlags, cqueue, opcode, squeue, types};
use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
        entries.any(|e| e.is_armed() && self.owners[e.index as usize].load(Ordering::Acquire) == me)
    }
}
