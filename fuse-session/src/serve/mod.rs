//! Running a session: the session and its start, run and stop, the worker
//! pool and its loops (`/dev/fuse` readers and io_uring queues), dispatch of
//! one request to the filesystem, what the workers of a connection share,
//! INTERRUPT, deferred replies, statistics, the serving threads' umask, and
//! serving the way a program wants to (until unmounted or signalled).
//!
//! May use: `api/`, `mount/` and `wire/`. The dispatch path also records
//! requests in the journal of `recovery/` (named in `scripts/layers.rules`);
//! the keeper and the systemd service, above this folder, run sessions.

pub(crate) mod conn;
pub mod deferred;
pub(crate) mod dispatch;
pub(crate) mod interrupt;
pub(crate) mod pool;
pub(crate) mod ring_worker;
pub(crate) mod run;
pub mod session;
pub(crate) mod share;
pub mod stats;
pub mod umask;
pub(crate) mod worker;
