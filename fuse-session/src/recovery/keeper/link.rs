//! The daemon's side of the keeper: [`KeeperLink`] finds the keeper,
//! takes the connection and the vault it hands over, and serves under it
//! (journaled, over `/dev/fuse` only) from a [`Restore`].

use super::messages::{report_serving, write_blob};
use super::run::CLONE_KEYS;
use super::{KEEPER_FD_ENV, RETIRED};
use crate::filesystem::Filesystem;
use crate::handover::{Handover, HandoverError, recv_fds};
use crate::journal::Journal;
use crate::session::{NegotiatedHook, Session, SessionConfig, SessionError, SessionHandle};
use crate::transport::dev_fuse::DevFuse;
use crate::vault::{RESERVED_KEYS, Vault};
use std::io::{self, Read};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// The vault key of the journal's shared region.
const JOURNAL_KEY: u64 = RESERVED_KEYS | 1;

/// Why a daemon under a keeper (or systemd's store, [`crate::service`])
/// serves over `/dev/fuse` even when io_uring was asked for. The kernel
/// routes a connection's requests to the ring entries of the daemon that
/// registered them; when that daemon ends, crashed or retired, the requests
/// routed to its idle entries while its rings go away are failed with
/// `ECANCELED`, and no successor can prevent it (`docs/recovery.md`).
pub const URING_REFUSED: &str = "when a daemon ends (crash or upgrade), the kernel fails with ECANCELED \
     the requests it hands to that daemon's io_uring entries meanwhile, which no successor can prevent \
     (see docs/recovery.md)";

/// Under a keeper, `/dev/fuse` only. When the configuration asked for
/// io_uring, says why it is not used: as a warning for a new connection
/// (once per mount), at debug level for each successor.
pub(crate) fn dev_fuse_only(config: &mut SessionConfig, fresh: bool) {
    use crate::transport::Transport;
    if config.transport != Transport::DevFuse {
        if fresh {
            log::warn!("serving over /dev/fuse, not io_uring: {URING_REFUSED}");
        } else {
            log::debug!("serving over /dev/fuse, not io_uring: {URING_REFUSED}");
        }
    }
    config.transport = Transport::DevFuse;
}

/// What a daemon under a keeper starts from.
#[derive(Debug)]
#[non_exhaustive]
pub struct Restore<'a> {
    /// `None` for a new mount; else the state the predecessor handed back
    /// at a graceful upgrade, empty after a crash (then what the
    /// filesystem keeps in the vault is all there is). The keeper drops a
    /// state once a daemon started with it serves; until then (a daemon
    /// that dies first, an upgrade that falls back to the previous binary)
    /// the next daemon gets the same state. A daemon that may die after
    /// reading it but before the keeper hears that it serves must mark it
    /// as taken where the keeper holds it (a vault withdrawal, say).
    pub state: Option<&'a [u8]>,
    /// Where to deposit descriptors that must outlive this daemon, and
    /// where the predecessors' are ([`Vault::take_deposits`],
    /// [`Vault::region`]).
    pub vault: Vault,
    /// The connection's number (its `fuse_connection` in fdinfo), when
    /// known: what the filesystem records in the memory it keeps, to refuse
    /// memory kept for another connection.
    pub connection: Option<u32>,
}

/// What a child under a keeper serves: a fresh connection (INIT to come) or
/// one taken over.
#[derive(Debug)]
pub enum Connection {
    /// A new mount (made with `default_permissions` when the flag is set):
    /// the session answers INIT.
    Fresh(OwnedFd, bool),
    /// A connection a predecessor served.
    TakenOver(Handover),
}

/// Names this process after its program (`argv[0]`'s last part). The
/// keeper runs each daemon through the binary it holds open
/// (`/proc/self/fd/N`), so the kernel names the process "N"; `ps`, `top`
/// and `pgrep` look for the program's name.
fn name_after_program() {
    let Some(arg0) = std::env::args_os().next() else {
        return;
    };
    let Some(base) = std::path::Path::new(&arg0).file_name() else {
        return;
    };
    // The kernel keeps 15 bytes of it.
    let mut name: Vec<u8> = std::os::unix::ffi::OsStrExt::as_bytes(base).to_vec();
    name.truncate(15);
    if let Ok(c) = std::ffi::CString::new(name)
        && let Err(e) = nix::sys::prctl::set_name(&c)
    {
        log::debug!("naming the daemon after its program: {e}");
    }
}

/// A `restore` that failed because the memory it keeps cannot be taken
/// over ([`crate::kept_tree::NotRecoverable`]) is a refusal (the keeper
/// ends the mount rather than start daemons refused the same way); any
/// other failure is the daemon's.
fn refused_restore(e: io::Error, refuse: impl FnOnce(String) -> SessionError) -> SessionError {
    match crate::kept_tree::NotRecoverable::reason(&e) {
        Some(why) => refuse(why),
        None => SessionError::Io(e),
    }
}

/// A daemon's link to its keeper.
#[derive(Debug)]
pub struct KeeperLink {
    sock: UnixStream,
}

impl KeeperLink {
    /// The link, when this process was started by a keeper
    /// ([`KEEPER_FD_ENV`] is set); the variable is removed so that the
    /// daemon's own children do not inherit it.
    pub fn from_env() -> Option<KeeperLink> {
        let v = std::env::var_os(KEEPER_FD_ENV)?;
        // SAFETY: called at start, before other threads read the environment.
        unsafe { std::env::remove_var(KEEPER_FD_ENV) };
        let fd: i32 = v.to_str()?.parse().ok()?;
        name_after_program();
        // SAFETY: the keeper left this descriptor open for us and nothing
        // else in this process owns it. Checked to be a socket below.
        let sock = unsafe { UnixStream::from_raw_fd(fd) };
        if sock.peer_addr().is_err() {
            return None;
        }
        let flags = nix::fcntl::fcntl(sock.as_fd(), nix::fcntl::FcntlArg::F_GETFD).unwrap_or(0);
        let _ = nix::fcntl::fcntl(
            sock.as_fd(),
            nix::fcntl::FcntlArg::F_SETFD(
                nix::fcntl::FdFlag::from_bits_retain(flags) | nix::fcntl::FdFlag::FD_CLOEXEC,
            ),
        );
        Some(KeeperLink { sock })
    }

    /// The connection the keeper hands this daemon.
    pub fn connection(&self) -> Result<Connection, HandoverError> {
        let mut tag = [0u8; 1];
        let (fds, _) = recv_fds(&self.sock, &mut tag, 1)?;
        match tag[0] {
            b'F' => {
                let mut perms = [0u8; 1];
                crate::handover::read_exact(&self.sock, &mut perms)?;
                let fd = fds.into_iter().next().ok_or(HandoverError::NoDescriptor)?;
                Ok(Connection::Fresh(fd, perms[0] != 0))
            }
            b'H' => Ok(Connection::TakenOver(Handover::receive(&self.sock)?)),
            _ => Err(HandoverError::Invalid("keeper message")),
        }
    }

    /// The vault the keeper sends after the connection.
    fn vault(&self) -> Result<Vault, HandoverError> {
        let mut tag = [0u8; 1];
        let (fds, _) = recv_fds(&self.sock, &mut tag, 1)?;
        match (tag[0], fds.into_iter().next()) {
            (b'V', Some(fd)) => Vault::open(fd),
            _ => Err(HandoverError::Invalid("keeper message (no vault)")),
        }
    }

    /// Serves a filesystem on the connection from the keeper. `restore`
    /// builds it, from a [`Restore`]: the state its predecessor handed back
    /// at a graceful upgrade, and the vault with what predecessors
    /// deposited. `save` is called after a retirement, and its bytes go to
    /// the successor. Requests are journaled ([`crate::journal`]) so that
    /// one a dead predecessor answered is answered again from the journal,
    /// and one it started reaches the filesystem as
    /// [`crate::journal::Replay::MaybeDone`]. Under a keeper the workers read
    /// the files the keeper holds (its clones, then the connection's; they
    /// clone none of their own, see the module docs), and io_uring is not
    /// used: a [`SessionConfig::transport`]
    /// asking for it is overridden, and the log says why ([`URING_REFUSED`]).
    ///
    /// The filesystem must state how the node ids and file handles the
    /// kernel holds stay valid in a successor ([`Filesystem::recovery`]):
    /// one that states nothing, or a layer that cannot (the node layer, a
    /// path layer not built with [`crate::path::PathFs::kept`]), is refused
    /// with [`SessionError::NotRecoverable`] before it serves, and so is a
    /// `restore` failing with [`crate::kept_tree::NotRecoverable`] (a kept
    /// table blank on a takeover, or another connection's), and the keeper,
    /// told why, ends the mount ([`KeeperError::Refused`]). A retirement
    /// the keeper calls off (its deadline passed) leaves the session
    /// serving ([`SessionHandle::cancel_retire`]).
    ///
    /// Returns `Ok(true)` when the daemon retired (exit with
    /// [`KeeperLink::exit_retired`]), `Ok(false)` when the mount went.
    ///
    /// [`KeeperError::Refused`]: super::KeeperError::Refused
    pub fn serve<F: Filesystem>(
        self,
        restore: impl FnOnce(Restore<'_>) -> io::Result<F>,
        save: impl FnOnce(&F) -> Vec<u8>,
        mut config: SessionConfig,
    ) -> Result<bool, SessionError> {
        config.clone_fd = false;
        let link_err = |e: HandoverError| SessionError::Io(io::Error::other(e));
        let conn = self.connection().map_err(link_err)?;
        let vault = self.vault().map_err(link_err)?;
        let fresh = matches!(conn, Connection::Fresh(..));
        config.worker_channels = crate::session::WorkerChannels(
            vault
                .take_keys(CLONE_KEYS)
                .into_iter()
                .map(|(_, fd)| Arc::new(DevFuse::from_fd(fd)) as Arc<dyn crate::transport::Channel>)
                .collect(),
        );
        dev_fuse_only(&mut config, fresh);
        let region = vault.region(JOURNAL_KEY, Journal::bytes_needed())?;
        let connection = match &conn {
            Connection::Fresh(dev, _) => crate::handover::connection_of(dev.as_fd()),
            Connection::TakenOver(h) => crate::handover::connection_of(h.dev.as_fd()),
        }
        .flatten();
        config.journal = Some(Arc::new(Journal::open(region, fresh, connection)?));
        let refuse = |why: String| {
            if let Err(e) = write_blob(&self.sock, b'X', why.as_bytes()) {
                log::warn!("telling the keeper why this daemon refuses to serve: {e}");
            }
            SessionError::NotRecoverable(why)
        };
        let (session, resumed, taken_over) = match conn {
            Connection::Fresh(dev, default_permissions) => {
                let fs = Arc::new(
                    restore(Restore {
                        state: None,
                        vault: vault.clone(),
                        connection,
                    })
                    .map_err(|e| refused_restore(e, refuse))?,
                );
                fs.recovery().check().map_err(refuse)?;
                // The keeper learns what INIT negotiated before the kernel
                // has the answer: a daemon dying in between leaves it INIT
                // to send again, never a connection it cannot hand over.
                let sock = self.sock.try_clone()?;
                config.on_negotiated = Some(NegotiatedHook(Arc::new(move |n| {
                    if let Err(e) = report_serving(&sock, n) {
                        log::warn!("telling the keeper what INIT negotiated: {e}");
                    }
                })));
                let chan = Arc::new(DevFuse::from_fd(dev));
                let mut s = Session::from_arc(fs.clone(), chan, config)?;
                s.set_default_permissions(default_permissions);
                // A predecessor may have read INIT and died.
                s.resend_before_init();
                (s, fs, None)
            }
            Connection::TakenOver(h) => {
                let fs = Arc::new(
                    restore(Restore {
                        state: Some(&h.state),
                        vault: vault.clone(),
                        connection,
                    })
                    .map_err(|e| refused_restore(e, refuse))?,
                );
                fs.recovery().check().map_err(refuse)?;
                let negotiated = h.negotiated.clone();
                (
                    Session::resume(fs.clone(), h.dev, h.negotiated, config)?,
                    fs,
                    Some(negotiated),
                )
            }
        };
        let handle = session.handle();
        // Said before the first request is read: once this daemon may have
        // changed anything, the keeper must know that it serves (it then
        // drops the state this daemon started from), even if the daemon
        // dies a moment later. (A fresh daemon says it from INIT.)
        if let Some(n) = taken_over
            && let Err(e) = report_serving(&self.sock, &n)
        {
            log::warn!("telling the keeper that this daemon serves: {e}");
        }
        let running = session.spawn()?;
        let watcher = self.watch(handle.clone());
        let result = running.join();
        let retired = handle.is_retiring();
        // Retired before INIT was answered: INIT waits in the kernel for
        // the successor, which gets a fresh connection; nothing to save.
        if retired && matches!(result, Err(SessionError::EndedBeforeInit)) {
            drop(watcher);
            return Ok(true);
        }
        if retired {
            let state = save(&resumed);
            if let Err(e) = write_blob(&self.sock, b'S', &state) {
                log::warn!("handing the state back to the keeper: {e}");
            }
        }
        drop(watcher);
        result.map(|_| retired)
    }

    /// A thread that retires the session when the keeper says so. If the
    /// keeper dies instead, this daemon serves on: it holds the connection
    /// now, and clients see nothing (but nobody will restart it).
    fn watch(&self, handle: SessionHandle) -> Option<std::thread::JoinHandle<()>> {
        let mut sock = self.sock.try_clone().ok()?;
        std::thread::Builder::new()
            .name("keeper-link".into())
            .spawn(move || {
                let mut b = [0u8; 1];
                loop {
                    match sock.read(&mut b) {
                        Ok(1) if b[0] == b'R' => handle.retire(),
                        Ok(1) if b[0] == b'C' => {
                            if handle.cancel_retire() {
                                log::warn!("the keeper called the retirement off: serving on");
                            } else {
                                log::info!("the keeper called the retirement off too late: retiring");
                            }
                        }
                        Ok(1) => {
                            log::warn!("unknown message {:#x} from the keeper; ignoring the link", b[0]);
                            return;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        _ => {
                            return log::warn!(
                                "the keeper is gone: serving on without it (if this daemon dies now, the mount goes)"
                            );
                        }
                    }
                }
            })
            .ok()
    }

    /// Exits the process with the status the keeper reads as "retired".
    pub fn exit_retired() -> ! {
        std::process::exit(RETIRED)
    }
}
