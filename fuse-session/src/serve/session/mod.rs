//! The session: INIT negotiation, then N workers serving the filesystem
//! until it is unmounted or stopped.
//!
//! `Session::run` blocks; `Session::spawn` runs in the background and returns
//! a [`RunningSession`]. Both expose a [`SessionHandle`] for statistics, the
//! negotiated capabilities, the notifier and stopping. Workers start at two
//! per CPU (configurable), each on its own cloned `/dev/fuse` fd where the
//! kernel allows; the pool grows while every worker is busy, shrinks back
//! after an idle timeout, and always keeps a thread reading `/dev/fuse`
//! (see `docs/architecture.md`). The thread that runs the session sleeps until the
//! pool needs it: an idle session makes no periodic wake-ups.
//!
//! With [`Transport::Uring`](crate::transport::Transport::Uring) (or `Auto`) the session also asks for
//! `FUSE_OVER_IO_URING` and, once INIT granted it, starts one io_uring queue
//! per possible CPU ([`crate::transport::uring`]); the `/dev/fuse` workers
//! keep serving what the kernel still sends there. When io_uring cannot be
//! used the session says why and serves everything over `/dev/fuse`.
//!
//! # The folder
//!
//! This module holds the [`Session`] with what it is bound to, and what
//! it answers with ([`SessionError`], [`SessionReport`]); one file a
//! concern beside it: how a session runs and the options it takes
//! (`config.rs`: [`SessionConfig`], its defaults and hooks), the handle
//! usable from any thread (`handle.rs`: [`SessionHandle`]), binding a
//! connection and INIT (`start.rs`: the constructors, the handshake, the
//! state shared once INIT is done), and serving until the end
//! (`serving.rs`: the run loop, the workers and io_uring queues started
//! and managed, shutdown and unmount, [`RunningSession`]). It uses the
//! serving core beside it (`conn`, `pool`, `worker`, `ring_worker`,
//! `interrupt`, `deferred`, `stats`), what a filesystem implements
//! (`api/`), mounting (`mount/`) and the transports (`wire/`).

mod config;
mod handle;
mod serving;
mod start;

pub use config::{
    DEFAULT_WORKERS_PER_CPU, NegotiatedHook, SPLICE_WRITE_MIN, SessionConfig, StartHook, StartStep,
    WorkerChannels,
};
pub use handle::SessionHandle;
pub use serving::RunningSession;

use crate::filesystem::Filesystem;
use crate::init::Negotiated;
use crate::mount::{MountError, MountGuard};
use crate::stats::Stats;
use crate::transport::{Channel, TransportInfo};
use fuse_proto::{Errno, Opcode};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Why a session failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The connection ended before INIT.
    #[error("the connection ended before INIT completed")]
    EndedBeforeInit,
    /// The kernel's protocol cannot be served.
    #[error("unsupported kernel protocol: {0}")]
    Unsupported(String),
    /// The filesystem's `init` refused.
    #[error("the filesystem refused INIT: {0}")]
    FilesystemRefused(Errno),
    /// An I/O error on the device.
    #[error("FUSE device error: {0}")]
    Io(#[from] std::io::Error),
    /// A worker thread could not be started.
    #[error("could not start a worker thread: {0}")]
    Spawn(std::io::Error),
    /// Mounting failed.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// A request other than INIT came first: the connection was
    /// initialised already, by another process (a descriptor handed over
    /// without what INIT negotiated). Nothing was answered: its holder may
    /// still serve it, or it ends (`ENOTCONN`) when the last holder closes
    /// it.
    #[error(
        "the connection was initialised already ({0} came before INIT): it was handed over without \
         what INIT negotiated, and cannot be served"
    )]
    AlreadyInitialised(Opcode),
    /// The filesystem may not run under a keeper or the fd store
    /// ([`crate::Filesystem::recovery`]).
    #[error("refused under a keeper: {0}")]
    NotRecoverable(String),
}

/// What a finished session reports.
#[derive(Clone, Debug)]
pub struct SessionReport {
    /// What INIT negotiated.
    pub negotiated: Negotiated,
    /// Final statistics.
    pub stats: Stats,
    /// Workers that ran (including those started on demand).
    pub workers_started: usize,
    /// Channels that were cloned fds (the rest shared the session fd).
    pub cloned_channels: usize,
    /// The transport that served requests, and why io_uring was not used
    /// if it was asked for and is not.
    pub transport: TransportInfo,
    /// `Some(why)` when the session owned its mount and left it in place:
    /// covered by another mount (a stacked mount over it), or an unmount
    /// that failed. `None` when it unmounted it, found it unmounted already,
    /// or never owned one (a handed-over descriptor, a resumed or retired
    /// session).
    pub mount_left: Option<String>,
}

/// A filesystem bound to a FUSE connection, ready to run.
pub struct Session<F: Filesystem> {
    fs: Arc<F>,
    chan: Arc<dyn Channel>,
    config: SessionConfig,
    handle: SessionHandle,
    notify_thread: Option<JoinHandle<()>>,
    uring: bool,
    mount: Option<Arc<Mutex<Option<MountGuard>>>>,
    /// The fd came from someone else (its pid namespace is unknown).
    handed_over: bool,
    /// A connection taken over: INIT happened already, with this outcome.
    resumed: Option<Negotiated>,
    /// Why our mount was left in place, once an unmount was tried
    /// ([`SessionReport::mount_left`]).
    mount_left: Arc<Mutex<Option<String>>>,
    /// The mount options said `default_permissions`.
    mount_default_permissions: bool,
    /// Ask the kernel to send INIT again before waiting for it (a
    /// predecessor may have read it and died).
    resend_before_init: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{Transport, uring};
    use fuse_proto::flags::InitFlags;

    #[test]
    fn the_default_pool_starts_two_workers_per_cpu_and_explicit_counts_win() {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let pool = SessionConfig::default().resolved();
        assert_eq!(pool.floor, 2 * cpus);
        assert_eq!(pool.max, (8 * cpus).max(16));
        let three = SessionConfig {
            workers: 3,
            max_workers: 2,
            ..SessionConfig::default()
        }
        .resolved();
        assert_eq!((three.floor, three.max), (3, 3));
    }

    #[test]
    fn a_connection_on_io_uring_is_not_taken_over() {
        struct Nothing;
        impl Filesystem for Nothing {}
        let negotiated = |flags| Negotiated {
            minor: 45,
            kernel_minor: 45,
            offered: InitFlags::OVER_IO_URING | InitFlags::HAS_RESEND,
            flags,
            refused: Vec::new(),
            max_write: 1 << 20,
            max_pages: 256,
            max_readahead: 1 << 17,
            max_background: 12,
            congestion_threshold: 9,
            time_gran: 1,
            max_stack_depth: 0,
            request_timeout: 0,
            default_permissions: false,
        };
        let dev = || std::os::fd::OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let refused = Session::resume(
            Arc::new(Nothing),
            dev(),
            negotiated(InitFlags::OVER_IO_URING),
            SessionConfig::default(),
        );
        let e = refused.err().expect("an io_uring connection is refused");
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("ECANCELED"), "{e}");
        // The same connection on /dev/fuse is taken (not served: dropped).
        assert!(
            Session::resume(
                Arc::new(Nothing),
                dev(),
                negotiated(InitFlags::ASYNC_READ),
                SessionConfig::default()
            )
            .is_ok()
        );
    }

    #[test]
    fn the_descriptor_bound_counts_each_worker_thread_and_each_ring() {
        let dev = SessionConfig {
            workers: 2,
            max_workers: 4,
            ..SessionConfig::default()
        };
        // Five threads: each a clone of the fd and two pipes.
        assert_eq!(dev.max_descriptors(), 8 + 5 * 5);
        let spliced = SessionConfig {
            splice_write: true,
            clone_fd: false,
            ..dev.clone()
        };
        assert_eq!(spliced.max_descriptors(), 8 + 5 * 6);
        let queues = uring::possible_cpus().unwrap();
        let ring = SessionConfig {
            transport: Transport::Uring,
            ..dev.clone()
        };
        assert_eq!(ring.max_descriptors(), dev.max_descriptors() + 1 + 4 * queues);
    }
}
