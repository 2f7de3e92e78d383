//! Moving bytes between the kernel and a worker: the transports
//! (`/dev/fuse`, io_uring, the fake kernel of the test kit), the receive
//! buffers, the pipe a WRITE's payload can wait in, `splice(2)` in and out,
//! a WRITE's data as a handler sees it, and the wake-up signal that ends a
//! blocking read.
//!
//! May use: `fuse_proto` and the system only. Nothing here knows about
//! sessions, filesystems or recovery; every other folder may use this one.

pub(crate) mod buffer;
pub(crate) mod payload;
pub(crate) mod recv_pipe;
pub(crate) mod signal;
pub(crate) mod splice;
pub mod transport;
