//! fuse-wire: the Linux FUSE wire protocol, spoken on `/dev/fuse` directly.
//!
//! This facade only re-exports the two crates of the workspace:
//! [`proto`] (the kernel ABI, no I/O) and [`session`] (mounting and the
//! multi-threaded session loop).
#![forbid(unsafe_code)]

pub use fuse_proto as proto;
pub use fuse_session as session;
