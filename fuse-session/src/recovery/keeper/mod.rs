//! The keeper: a small process that mounts, holds the connection, and runs
//! the serving daemon as its child, so that the daemon can die or be
//! upgraded without the mount going away.
//!
//! The kernel keeps a FUSE connection alive while any process holds one of
//! its `/dev/fuse` files; it ends the requests read through a file only
//! when that file's last reference closes (`fuse_dev_release`). The keeper
//! holds every file a daemon reads from: the connection's, and the clones
//! it makes for the workers (a daemon under a keeper makes none of its
//! own), so a request a daemon read before it died stays with the kernel,
//! and the successor has it sent again ([`crate::Session::resume`]).
//!
//! - A child that dies (signal, or exit other than "unmounted") is
//!   replaced at once by a new one from the same program path, which takes
//!   the connection over.
//! - `SIGUSR2` to the keeper is a graceful upgrade: the running child is
//!   asked to retire at a request boundary and hand its state back, then a
//!   new child (from the program on disk now) takes over with that state.
//! - A child that does not retire by the deadline (a request it serves
//!   does not end) is not killed for an upgrade: the retirement is called
//!   off and it serves on.
//! - `SIGINT`, `SIGTERM` or `SIGHUP` to the keeper: the child retires, the
//!   keeper unmounts and exits.
//! - A child that exits with status 0 saw the mount go (unmounted from
//!   outside): the keeper exits too.
//! - A keeper that dies leaves its child serving: the child's copy of the
//!   file keeps the connection, so clients see nothing, but nobody
//!   restarts the daemon any more.
//!
//! The child finds its keeper with [`KeeperLink::from_env`] and serves with
//! [`KeeperLink::serve`]. Messages on the socket between them: keeper to
//! child, the connection (fresh, or a [`Handover`]), then `R` (retire) and
//! `C` (call a retirement off: it passed its deadline, and the child serves
//! on); child to keeper, `N` with what INIT negotiated, `S` with its state
//! when it retires, and `X` with why it refuses to serve (a filesystem
//! without a recovery contract, [`crate::Filesystem::recovery`]).
//!
//! [`Handover`]: crate::handover::Handover
//!
//! # The folder
//!
//! This module holds what the keeper answers with ([`KeeperError`],
//! [`KeeperReport`]), the variable a daemon finds its keeper by, and one
//! running child with the binary it came from; one file a concern beside
//! it: the keeper's signals and wake-ups (`signals.rs`), the loop
//! (`run.rs`: [`run_keeper`], the clones held for the workers, waiting
//! for an event), starting a daemon with its backoff (`start.rs`),
//! retiring one (`retire.rs`), the messages on the socket between keeper
//! and daemon (`messages.rs`), and the daemon's side (`link.rs`:
//! [`KeeperLink`], [`Restore`], [`Connection`]). It uses the rest of
//! `recovery/` (the handover, the vault, the journal, kept trees), the
//! session (`serve/`), what a filesystem implements (`api/`), mounting
//! (`mount/`) and `/dev/fuse` (`wire/`).

mod link;
mod messages;
mod retire;
mod run;
mod signals;
mod start;

pub(crate) use link::dev_fuse_only;
pub use link::{Connection, KeeperLink, Restore, URING_REFUSED};
pub use retire::RETIRE_DEADLINE_ENV;
pub use run::run_keeper;
pub(crate) use signals::{install_signals, take_signal, wait_for_signal};

use crate::mount::MountError;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::Arc;
use std::time::Instant;

/// The environment variable naming the child's end of the keeper socket.
pub const KEEPER_FD_ENV: &str = "FUSE_WIRE_KEEPER_FD";

/// Exit status of a child that retired at the keeper's request.
const RETIRED: i32 = 75;

/// Why the keeper stopped.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// Mounting failed.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// Starting a daemon failed.
    #[error("starting the daemon {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A socket or signal set-up failed.
    #[error("keeper: {0}")]
    Io(#[from] io::Error),
    /// The daemon refused to serve under a keeper, and said why (a
    /// filesystem that states no recovery contract,
    /// [`crate::Filesystem::recovery`]). The mount is ended.
    #[error("the daemon refused to serve under a keeper: {0} (the mount is ended)")]
    Refused(String),
    /// Daemons keep dying before they serve.
    #[error("the daemon died {0} times in a row before serving; giving up (the mount is ended)")]
    CrashLoop(u32),
}

/// What the keeper saw, when it ends.
#[derive(Debug, Default)]
pub struct KeeperReport {
    /// Daemons started, the first included.
    pub started: u32,
    /// Daemons that died and were replaced.
    pub crashes: u32,
    /// Graceful upgrades done.
    pub upgrades: u32,
    /// Upgrades that did not go through: refused (the program could not be
    /// started; the running daemon served on) or undone (the upgraded
    /// daemon failed to take over; the previous binary served again) or
    /// called off (the daemon did not retire by the deadline, a request it
    /// served not ending, and served on).
    pub failed_upgrades: u32,
}

/// One running child, the keeper's end of its socket and of its vault.
struct Running {
    child: Child,
    sock: UnixStream,
    vault: OwnedFd,
    drained: std::cell::Cell<Instant>,
    /// The binary it runs.
    source: Source,
    /// It reported what INIT negotiated: it serves.
    serving: bool,
    /// It refused to serve, and said why (`X`): starting another from the
    /// same binary would be refused the same way.
    refused: Option<String>,
}

/// Where a daemon's program comes from.
#[derive(Clone, Debug)]
enum Source {
    /// The program's path, looked up now.
    Disk,
    /// The binary an earlier daemon was started from, held open.
    Held(Arc<std::fs::File>),
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (_, Some(s)) => format!("was killed by signal {s}"),
        _ => "ended".into(),
    }
}
