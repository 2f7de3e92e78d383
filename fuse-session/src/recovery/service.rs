//! A daemon run as a systemd service that keeps its mount across its own
//! crashes and upgrades, with systemd's file-descriptor store as its keeper
//! ([`crate::fdstore`]) instead of a keeper process ([`crate::keeper`]).
//!
//! The first start mounts, and stores the connection's `/dev/fuse` file
//! (`fw-dev`) before serving; what INIT negotiated, the journal of requests
//! in flight ([`crate::journal`]) and the filesystem's deposits
//! ([`crate::vault`]) are stored too. A start that finds `fw-dev` among the
//! descriptors systemd passed takes the connection over
//! ([`crate::Session::resume`]): the requests the dead daemon left are sent
//! again, and the journal answers those it had answered.
//!
//! - crash: systemd restarts the service (`Restart=always`), which takes over;
//! - `SIGUSR2` (e.g. `ExecReload=kill -USR2 $MAINPID`): the daemon retires
//!   at a request boundary, stores the filesystem's state (`fw-state`) and
//!   exits with [`RETIRED`]; systemd starts the binary now on disk, which
//!   takes over with that state;
//! - `SIGTERM`, `SIGINT`, `SIGHUP`: the daemon unmounts, empties its part of
//!   the store and exits.
//!
//! A unit for it:
//!
//! ```ini
//! [Service]
//! Type=notify
//! ExecStart=/usr/local/bin/myfs /srv/data /mnt/myfs -o fdstore
//! ExecReload=/bin/kill -USR2 $MAINPID
//! Restart=always
//! RestartSec=0
//! FileDescriptorStoreMax=16384
//! ```

use crate::fdstore::FdStore;
use crate::filesystem::Filesystem;
use crate::handover::{check_fuse_device, check_mountpoint};
use crate::journal::Journal;
use crate::keeper::{Restore, dev_fuse_only, install_signals, take_signal};
use crate::mount::{Mount, MountOptions};
use crate::region::{SharedRegion, load_bytes, store_bytes};
use crate::session::{NegotiatedHook, Session, SessionConfig, SessionError};
use crate::vault::{RESERVED_KEYS, Vault, fdstore_name};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The exit status of a daemon that retired for an upgrade: systemd
/// restarts it (`Restart=always`).
pub const RETIRED: i32 = 75;

/// The store's name of the connection's `/dev/fuse` file.
const DEV_NAME: &str = "fw-dev";
/// The store's name of the state a retiring daemon hands on.
const STATE_NAME: &str = "fw-state";
/// Vault keys of the journal and of what INIT negotiated.
const JOURNAL_KEY: u64 = RESERVED_KEYS | 1;
const INIT_KEY: u64 = RESERVED_KEYS | 2;
const INIT_BYTES: usize = 4096;

/// How a service's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceEnd {
    /// Stopped by a signal: unmounted, the store emptied. Exit 0.
    Stopped,
    /// The mount went (unmounted from outside). Exit 0.
    Unmounted,
    /// Retired for an upgrade, its state stored. Exit with [`RETIRED`].
    Retired,
}

/// Serves a filesystem on `mountpoint` as a service keeping its connection
/// in systemd's store (see the module docs). `restore` builds the
/// filesystem from a [`Restore`] (the state a retiring predecessor stored,
/// and the vault); `save` gives the state to store when retiring.
pub fn serve_with_fdstore<F: Filesystem>(
    store: Arc<FdStore>,
    mountpoint: &Path,
    opts: &MountOptions,
    restore: impl FnOnce(Restore<'_>) -> io::Result<F>,
    save: impl FnOnce(&F) -> Vec<u8>,
    mut config: SessionConfig,
) -> Result<ServiceEnd, SessionError> {
    if opts.auto_unmount {
        return Err(SessionError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            "auto_unmount cannot go with the fd store: the mount must outlive the daemon",
        )));
    }
    // As under a keeper: one /dev/fuse file every worker reads (a clone
    // would die with the daemon, and the requests read through it with it),
    // and no io_uring.
    config.clone_fd = false;
    let wake = install_signals()?;
    let vault = Vault::in_fdstore(store.clone());
    let init = Arc::new(vault.region(INIT_KEY, INIT_BYTES)?);
    let taken = store.take(DEV_NAME);
    // What INIT negotiated on the stored connection, if a daemon got that
    // far: one that died before has left INIT to be sent again.
    let known = taken.as_ref().and_then(|_| read_init(&init));
    let fresh = known.is_none();
    dev_fuse_only(&mut config, fresh);
    let journal = vault.region(JOURNAL_KEY, Journal::bytes_needed())?;
    // The connection's number, when it is in the store (a new mount's is
    // not known yet: its journal records none).
    let connection = taken
        .as_ref()
        .and_then(|d| crate::handover::connection_of(d.as_fd()))
        .flatten();
    config.journal = Some(Arc::new(Journal::open(journal, fresh, connection)?));
    if fresh {
        // Recorded before the kernel has the answer, so that a daemon dying
        // in between leaves INIT to send again, never a connection its
        // successor cannot take over.
        init.clear();
        let init = init.clone();
        config.on_negotiated = Some(NegotiatedHook(Arc::new(move |n| {
            if !write_init(&init, &crate::handover::negotiated_bytes(n)) {
                log::error!("what INIT negotiated does not fit the fd store's record");
            }
        })));
    }
    let (session, fs, resumed_dev) = match (taken, known) {
        (Some(dev), Some(negotiated)) => {
            check_fuse_device(dev.as_fd()).map_err(io::Error::other)?;
            check_mountpoint(dev.as_fd(), mountpoint).map_err(io::Error::other)?;
            let state = take_state(&store)?;
            // A start that refuses the state (or is refused) puts it back
            // in the store, for a start that can take it.
            let restored = restore(Restore {
                state: Some(&state),
                vault: vault.clone(),
                connection: crate::handover::connection_of(dev.as_fd()).flatten(),
            })
            .map_err(|e| match crate::kept_tree::NotRecoverable::reason(&e) {
                Some(why) => SessionError::NotRecoverable(why),
                None => SessionError::Io(e),
            })
            .and_then(|fs| match fs.recovery().check() {
                Ok(()) => Ok(Arc::new(fs)),
                Err(why) => Err(SessionError::NotRecoverable(why)),
            });
            let fs = match restored {
                Ok(fs) => fs,
                Err(e) => {
                    if let Err(put) = store_state(&store, &state) {
                        log::error!("putting the handed-over state back in the fd store: {put}");
                    }
                    return Err(e);
                }
            };
            let keep = dev.try_clone()?;
            log::info!(
                "taking over the connection of {} from the fd store",
                mountpoint.display()
            );
            (
                Session::resume(fs.clone(), dev, negotiated, config)?,
                fs,
                Some(keep),
            )
        }
        (Some(dev), None) => {
            // The first daemon of this mount died before INIT was
            // answered: answer it now, on the stored connection.
            check_fuse_device(dev.as_fd()).map_err(io::Error::other)?;
            check_mountpoint(dev.as_fd(), mountpoint).map_err(io::Error::other)?;
            let fs = Arc::new(restore(Restore {
                state: None,
                vault: vault.clone(),
                connection: crate::handover::connection_of(dev.as_fd()).flatten(),
            })?);
            fs.recovery().check().map_err(SessionError::NotRecoverable)?;
            let keep = dev.try_clone()?;
            log::info!(
                "the connection of {} in the fd store was never initialised; answering INIT",
                mountpoint.display()
            );
            let chan = Arc::new(crate::transport::dev_fuse::DevFuse::from_fd(dev));
            let mut s = Session::from_arc(fs.clone(), chan, config)?;
            s.set_default_permissions(opts.default_permissions);
            s.resend_before_init();
            (s, fs, Some(keep))
        }
        (None, _) => {
            // Built and checked before mounting: a filesystem refused under
            // the store leaves nothing mounted and nothing stored.
            let fs = Arc::new(restore(Restore {
                state: None,
                vault: vault.clone(),
                connection: None,
            })?);
            fs.recovery().check().map_err(SessionError::NotRecoverable)?;
            let m = Mount::new(mountpoint, opts)?;
            // Stored before any request is read: from now on a crash
            // leaves the connection with systemd.
            store.store(DEV_NAME, m.dev().as_fd())?;
            (Session::from_mount(fs.clone(), m, opts, config)?, fs, None)
        }
    };
    let handle = session.handle();
    let running = session.spawn()?;
    if let Err(e) = store.notify("READY=1") {
        log::warn!("{e}");
    }
    let stopping = Arc::new(AtomicBool::new(false));
    {
        let (handle, stopping) = (handle.clone(), stopping.clone());
        std::thread::Builder::new()
            .name("service-signals".into())
            .spawn(move || {
                loop {
                    crate::keeper::wait_for_signal(&wake);
                    match take_signal() {
                        libc::SIGUSR2 => {
                            log::info!("SIGUSR2: retiring for an upgrade");
                            return handle.retire();
                        }
                        libc::SIGINT | libc::SIGTERM | libc::SIGHUP => {
                            log::info!("stopping: unmounting");
                            stopping.store(true, Ordering::Release);
                            return handle.stop();
                        }
                        _ => {}
                    }
                }
            })?;
    }
    let result = running.join();
    if handle.is_retiring() {
        result?;
        store_state(&store, &save(&fs))?;
        return Ok(ServiceEnd::Retired);
    }
    let _ = store.notify("STOPPING=1");
    // The connection is over for good: nothing to take over any more.
    for name in [
        DEV_NAME.to_string(),
        fdstore_name(JOURNAL_KEY),
        fdstore_name(INIT_KEY),
    ] {
        if let Err(e) = store.remove(&name) {
            log::warn!("{e}");
        }
    }
    // A connection stored without what INIT negotiated cannot be served:
    // it is ended (clients get ENOTCONN) rather than left mounted and dead.
    let refused = matches!(result, Err(SessionError::AlreadyInitialised(_)));
    if refused {
        log::error!(
            "the connection of {} in the fd store was initialised by a daemon whose INIT record is lost; unmounting it",
            mountpoint.display()
        );
    }
    if let Some(dev) = &resumed_dev
        && refused
        && check_mountpoint(dev.as_fd(), mountpoint).is_ok()
    {
        crate::mount::unmount(mountpoint, true)?;
    }
    let report = result?;
    if let Some(dev) = resumed_dev
        && stopping.load(Ordering::Acquire)
    {
        // A session that took over never unmounts by itself; the mount is
        // ours if the descriptor still belongs to it.
        match check_mountpoint(dev.as_fd(), mountpoint) {
            Ok(()) => crate::mount::unmount(mountpoint, true)?,
            Err(e) => log::info!("not unmounting {}: {e}", mountpoint.display()),
        }
    }
    Ok(
        if stopping.load(Ordering::Acquire) || report.mount_left.is_some() {
            ServiceEnd::Stopped
        } else {
            ServiceEnd::Unmounted
        },
    )
}

/// Records what INIT negotiated: its length, then its bytes.
fn write_init(r: &SharedRegion, b: &[u8]) -> bool {
    let w = r.words();
    if !store_bytes(&w[1..], b) {
        return false;
    }
    w[0].store(b.len() as u64, Ordering::Release);
    true
}

fn read_init(r: &SharedRegion) -> Option<crate::init::Negotiated> {
    let w = r.words();
    let len = w[0].load(Ordering::Acquire) as usize;
    if len == 0 || len > (w.len() - 1) * 8 {
        return None;
    }
    let mut b = vec![0u8; len];
    load_bytes(&w[1..], &mut b);
    crate::handover::decode_negotiated_bytes(&b).ok()
}

/// Stores `state` in a memory file named [`STATE_NAME`].
fn store_state(store: &FdStore, state: &[u8]) -> io::Result<()> {
    let mut f = std::fs::File::from(crate::region::memory_file(STATE_NAME)?);
    f.write_all(state)?;
    store.remove(STATE_NAME)?;
    store.store(STATE_NAME, f.as_fd())
}

/// The state a retiring predecessor stored (empty if none), removed from
/// the store so that a later crash does not bring it back.
fn take_state(store: &FdStore) -> io::Result<Vec<u8>> {
    let Some(fd) = store.take(STATE_NAME) else {
        return Ok(Vec::new());
    };
    store.remove(STATE_NAME)?;
    let mut f = std::fs::File::from(fd);
    f.rewind()?;
    let mut b = Vec::new();
    f.read_to_end(&mut b)?;
    Ok(b)
}
