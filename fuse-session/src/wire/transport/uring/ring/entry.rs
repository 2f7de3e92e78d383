//! One ring entry ([`RingEntry`]): its header and payload buffers, its
//! state, the commands that register it and commit its reply, the reply
//! kept aside while its request is still being dispatched, and the
//! request handed to the dispatcher in place.

use super::{DISPATCH_QUEUE, DISPATCHING, KIND_COMMIT, KIND_REGISTER, Queue};
use crate::transport::ReplySink;
use fuse_proto::abi::{OutHeader, UringCmdReq, UringEntInOut, UringReqHeader};
use fuse_proto::consts::{URING_IN_OUT_HEADER_SZ, uring_cmd};
use fuse_proto::{Errno, Opcode, Reply};
use io_uring::{opcode, squeue, types};
use std::cell::{Cell, UnsafeCell};
use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
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
    /// Whether the kernel holds this entry's command (state `Armed`).
    pub(super) fn is_armed(&self) -> bool {
        self.state.load(Ordering::Acquire) == EntryState::Armed
    }

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
