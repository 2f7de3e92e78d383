//! The transport seam: how a worker receives requests and sends replies.
//!
//! Two roles: a [`RequestSource`] gives a worker its requests, a
//! [`ReplySink`] takes the replies to them. A [`Channel`] is both, one queue
//! of the kernel connection: a `/dev/fuse` fd (the session fd or a clone
//! made with `FUSE_DEV_IOC_CLONE`) or an in-memory fake kernel for tests.
//! Workers own one channel each and answer every request on the channel it
//! came from. An io_uring ring entry ([`uring`]) is a reply sink only: its
//! requests come through its queue's threads.

use fuse_proto::{Opcode, Reply};
use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

pub mod dev_fuse;
pub mod fake;
pub mod uring;

/// Which transport a session should use for requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// `read(2)`/`writev(2)` on `/dev/fuse` only.
    #[default]
    DevFuse,
    /// FUSE over io_uring; falls back to `/dev/fuse`, with a warning that
    /// says why, when the kernel or the system does not allow it.
    Uring,
    /// io_uring when available, quietly `/dev/fuse` otherwise (the reason
    /// is logged at info level and reported all the same).
    Auto,
}

/// The transport a session ended up using.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransportInfo {
    /// Everything over `/dev/fuse`; `fallback` says why io_uring is not used
    /// when it was asked for.
    DevFuse {
        /// Why io_uring was not used (`None` if it was not asked for).
        fallback: Option<uring::Unavailable>,
    },
    /// Requests over io_uring rings (INIT, FORGET, INTERRUPT, NOTIFY_REPLY
    /// and notifications still use `/dev/fuse`).
    Uring {
        /// Number of queues (one per possible CPU).
        queues: usize,
        /// Ring entries per queue.
        depth: usize,
        /// Bytes of each entry's payload buffer.
        payload_size: usize,
    },
}

impl TransportInfo {
    /// Whether the rings are in use.
    pub fn is_uring(&self) -> bool {
        matches!(self, TransportInfo::Uring { .. })
    }

    /// Why io_uring was asked for but not used.
    pub fn fallback_reason(&self) -> Option<&uring::Unavailable> {
        match self {
            TransportInfo::DevFuse { fallback } => fallback.as_ref(),
            TransportInfo::Uring { .. } => None,
        }
    }
}

impl std::fmt::Display for TransportInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransportInfo::DevFuse { fallback: None } => f.write_str("/dev/fuse"),
            TransportInfo::DevFuse { fallback: Some(why) } => {
                write!(f, "/dev/fuse (io_uring not used: {why})")
            }
            TransportInfo::Uring {
                queues,
                depth,
                payload_size,
            } => write!(
                f,
                "io_uring: {queues} queues x {depth} entries, {payload_size}-byte payload buffers"
            ),
        }
    }
}

/// Where a worker's requests come from: one kernel queue of a FUSE
/// connection (a `/dev/fuse` fd, or the fake kernel's). Replies to what it
/// receives go to the [`ReplySink`] of the same queue; a type that is both
/// is a [`Channel`].
pub trait RequestSource: Send + Sync + 'static {
    /// Blocks until the next request is in `buf`; returns its length.
    ///
    /// Errors the session interprets: `ENODEV` (the filesystem was unmounted
    /// or the connection aborted: the worker ends), `EINTR`/`EAGAIN` (retry),
    /// `ECONNABORTED` (aborted: ends). Anything else is logged and ends the worker.
    fn receive(&self, buf: &mut [u8]) -> io::Result<usize>;

    /// Like [`RequestSource::receive`], but gives up with `ETIMEDOUT` when no
    /// request came within `timeout`. The worker pool uses it for workers
    /// above its floor, which end after an idle timeout. The default waits
    /// as long as `receive` does (such a channel's workers never time out).
    fn receive_timeout(&self, buf: &mut [u8], timeout: Duration) -> io::Result<usize> {
        let _ = timeout;
        self.receive(buf)
    }

    /// Whether [`RequestSource::receive_to_pipe`] can take requests: true
    /// only for `/dev/fuse`.
    fn supports_splice_receive(&self) -> bool {
        false
    }

    /// Like [`RequestSource::receive`] (and [`RequestSource::receive_timeout`] when
    /// `timeout` is given), but moves the request into the pipe whose write
    /// end is `pipe` with `splice(2)`, taking at most `len` bytes; returns
    /// its length. The pipe must be empty and have room for `len` bytes
    /// plus a page. Transports that cannot do this answer `EOPNOTSUPP`
    /// without taking a request.
    fn receive_to_pipe(
        &self,
        pipe: BorrowedFd<'_>,
        len: usize,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let _ = (pipe, len, timeout);
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }

    /// A new channel on the same connection with its own kernel queue
    /// (`FUSE_DEV_IOC_CLONE`), for one more worker.
    fn try_clone(&self) -> io::Result<Arc<dyn Channel>>;
}

/// Where the replies to one queue's requests go (and notifications, for
/// `/dev/fuse`): a `/dev/fuse` fd, the fake kernel, or an io_uring ring
/// entry, which is a reply sink only (its requests reach it through its
/// queue's threads, not through a [`RequestSource`]).
pub trait ReplySink: Send + Sync + 'static {
    /// Sends one complete message (reply or notification) in one write.
    ///
    /// `ENOENT` means the kernel no longer waits for that request (it was
    /// interrupted or aborted); callers treat it as delivered.
    fn send(&self, msg: &Reply<'_>) -> io::Result<()>;

    /// Whether [`ReplySink::send_spliced`] can deliver a message: true only
    /// for `/dev/fuse`, which accepts a message spliced from a pipe.
    fn supports_splice(&self) -> bool {
        false
    }

    /// Sends one complete message (header included) of `len` bytes that
    /// waits at the front of the pipe `pipe` (its read end), moving it into
    /// the kernel with one `splice(2)` so that the payload does not pass
    /// through user memory. Errors as for [`ReplySink::send`]; transports that
    /// cannot do this answer `EOPNOTSUPP` and leave the pipe untouched.
    fn send_spliced(&self, pipe: BorrowedFd<'_>, len: usize) -> io::Result<()> {
        let _ = (pipe, len);
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }

    /// The device fd, for ioctls (backing files) and diagnostics; `None`
    /// for transports without one.
    fn raw_fd(&self) -> Option<RawFd>;

    /// A short description for logs, e.g. `/dev/fuse fd 7 (clone)`.
    fn describe(&self) -> String;
}

/// Sends the reply to request `unique` (`opcode`) on `sink`, with the one
/// error policy every reply of the session follows ([`send_failed`]).
pub(crate) fn send_reply(sink: &dyn ReplySink, opcode: Opcode, unique: u64, msg: &Reply<'_>) {
    if let Err(e) = sink.send(msg) {
        send_failed(sink, opcode, unique, &e);
    }
}

/// What happens when a reply could not be delivered: `ENOENT` means the
/// kernel no longer waits for that request (it was interrupted or the
/// connection aborted), which is no error; anything else is logged as one,
/// naming the sink. Nothing is retried and the caller goes on: the kernel
/// has its own way to end a request it waits for (the connection ending).
pub(crate) fn send_failed(sink: &dyn ReplySink, opcode: Opcode, unique: u64, e: &io::Error) {
    match e.raw_os_error() {
        Some(libc::ENOENT) => log::debug!("{opcode} reply to {unique}: the kernel no longer waits for it"),
        _ => log::error!("{opcode} reply to {unique} on {}: {e}", sink.describe()),
    }
}

/// One receive/send queue of a FUSE connection: a [`RequestSource`] that
/// is also the [`ReplySink`] of the requests it receives (the kernel wants
/// a reply on the fd whose queue holds its request). Implemented for every
/// type that is both.
pub trait Channel: RequestSource + ReplySink {}

impl<T: RequestSource + ReplySink + ?Sized> Channel for T {}
