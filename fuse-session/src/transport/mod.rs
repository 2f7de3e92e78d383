//! The transport seam: how a worker receives requests and sends replies.
//!
//! A [`Channel`] is one queue of the kernel connection: a `/dev/fuse` fd (the
//! session fd or a clone made with `FUSE_DEV_IOC_CLONE`), an in-memory fake
//! kernel for tests, or (its own issue) an io_uring ring entry. Workers own
//! one channel each and answer every request on the channel it came from.

use fuse_proto::Reply;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

pub mod dev_fuse;
pub mod fake;

/// One receive/send queue of a FUSE connection.
pub trait Channel: Send + Sync + 'static {
    /// Blocks until the next request is in `buf`; returns its length.
    ///
    /// Errors the session interprets: `ENODEV` (the filesystem was unmounted
    /// or the connection aborted: the worker ends), `EINTR`/`EAGAIN` (retry),
    /// `ECONNABORTED` (aborted: ends). Anything else is logged and ends the worker.
    fn receive(&self, buf: &mut [u8]) -> io::Result<usize>;

    /// Sends one complete message (reply or notification) in one write.
    ///
    /// `ENOENT` means the kernel no longer waits for that request (it was
    /// interrupted or aborted); callers treat it as delivered.
    fn send(&self, msg: &Reply<'_>) -> io::Result<()>;

    /// A new channel on the same connection with its own kernel queue
    /// (`FUSE_DEV_IOC_CLONE`), for one more worker.
    fn try_clone(&self) -> io::Result<Arc<dyn Channel>>;

    /// The device fd, for ioctls (backing files) and diagnostics; `None`
    /// for transports without one.
    fn raw_fd(&self) -> Option<RawFd>;

    /// A short description for logs, e.g. `/dev/fuse fd 7 (clone)`.
    fn describe(&self) -> String;
}
