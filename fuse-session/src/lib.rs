//! Mounting, the INIT handshake and a multi-threaded session loop over
//! `/dev/fuse`, dispatching to a pluggable [`Filesystem`].
//!
//! The path of one request: a worker's [`transport::Channel`] receives it
//! into the worker's buffer, `fuse_proto::Request::parse_with` reads it in
//! place, `dispatch` calls the [`Filesystem`] method with a typed reply
//! handle, and the handle's answer goes back in one `writev` on the channel
//! the request came from.
#![deny(missing_docs)]

pub mod backing;
mod buffer;
mod conn;
pub mod context;
pub mod credentials;
pub mod deferred;
mod dispatch;
pub mod filesystem;
pub mod init;
mod interrupt;
pub mod mount;
pub mod notify;
mod pool;
pub mod reply;
pub mod session;
mod signal;
mod splice;
pub mod stats;
pub mod transport;
pub mod types;
mod worker;

pub use backing::{BackingError, BackingFile};
pub use context::RequestContext;
pub use credentials::{ActingAs, Caller, ProcCredentials};
pub use deferred::{RefuseReason, Refused, Wait};
pub use filesystem::Filesystem;
pub use fuse_proto::Errno;
pub use init::{InitConfig, Negotiated};
pub use mount::{Mount, MountError, MountOptions};
pub use notify::Notifier;
pub use session::{RunningSession, Session, SessionConfig, SessionError, SessionHandle, SessionReport};
pub use stats::{OpStats, Stats, TransportStats};
pub use transport::{Transport, TransportInfo};
pub use types::{Entry, FileHandle, Inode, Lock, LockOwner, PollHandle};
