//! The transport seam: how a worker receives requests and sends replies.
//!
//! A [`Channel`] is one queue of the kernel connection: a `/dev/fuse` fd (the
//! session fd or a clone made with `FUSE_DEV_IOC_CLONE`), an in-memory fake
//! kernel for tests, or an io_uring ring entry ([`uring`]). Workers own
//! one channel each and answer every request on the channel it came from.

use fuse_proto::Reply;
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

/// One receive/send queue of a FUSE connection.
pub trait Channel: Send + Sync + 'static {
    /// Blocks until the next request is in `buf`; returns its length.
    ///
    /// Errors the session interprets: `ENODEV` (the filesystem was unmounted
    /// or the connection aborted: the worker ends), `EINTR`/`EAGAIN` (retry),
    /// `ECONNABORTED` (aborted: ends). Anything else is logged and ends the worker.
    fn receive(&self, buf: &mut [u8]) -> io::Result<usize>;

    /// Like [`Channel::receive`], but gives up with `ETIMEDOUT` when no
    /// request came within `timeout`. The worker pool uses it for workers
    /// above its floor, which end after an idle timeout. The default waits
    /// as long as `receive` does (such a channel's workers never time out).
    fn receive_timeout(&self, buf: &mut [u8], timeout: Duration) -> io::Result<usize> {
        let _ = timeout;
        self.receive(buf)
    }

    /// Like [`Channel::receive`] (and [`Channel::receive_timeout`] when
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

    /// Sends one complete message (reply or notification) in one write.
    ///
    /// `ENOENT` means the kernel no longer waits for that request (it was
    /// interrupted or aborted); callers treat it as delivered.
    fn send(&self, msg: &Reply<'_>) -> io::Result<()>;

    /// Whether [`Channel::send_spliced`] can deliver a message: true only
    /// for `/dev/fuse`, which accepts a message spliced from a pipe.
    fn supports_splice(&self) -> bool {
        false
    }

    /// Sends one complete message (header included) of `len` bytes that
    /// waits at the front of the pipe `pipe` (its read end), moving it into
    /// the kernel with one `splice(2)` so that the payload does not pass
    /// through user memory. Errors as for [`Channel::send`]; transports that
    /// cannot do this answer `EOPNOTSUPP` and leave the pipe untouched.
    fn send_spliced(&self, pipe: BorrowedFd<'_>, len: usize) -> io::Result<()> {
        let _ = (pipe, len);
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }

    /// A new channel on the same connection with its own kernel queue
    /// (`FUSE_DEV_IOC_CLONE`), for one more worker.
    fn try_clone(&self) -> io::Result<Arc<dyn Channel>>;

    /// The device fd, for ioctls (backing files) and diagnostics; `None`
    /// for transports without one.
    fn raw_fd(&self) -> Option<RawFd>;

    /// A short description for logs, e.g. `/dev/fuse fd 7 (clone)`.
    fn describe(&self) -> String;
}
