//! Unmounting: the [`MountGuard`] that unmounts our own mount (and only
//! it, checked by identity just before), how a mount was made
//! ([`MountMethod`]), and [`unmount`] by path as a command-line tool does.

use super::error::{MountError, errno_io};
use super::fusermount::{FUSERMOUNT, find_fusermount, fusermount_unmount};
use super::identity::{self, MountIdentity, Whereabouts};
use super::watchdog::Watchdog;
use nix::errno::Errno;
use nix::mount::MntFlags;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// How a [`Mount`](super::Mount) came to be, which decides how it is unmounted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountMethod {
    /// `mount(2)` by this process; unmounted with `umount2(2)`.
    Privileged,
    /// Mounted by `fusermount3`; unmounted with `umount2(2)` when this
    /// process may, else with `fusermount3 -u -z`.
    Fusermount,
    /// The fd was handed over (`/dev/fd/N` or [`Mount::from_fd`](super::Mount::from_fd)); never unmounted by us.
    HandedOver,
}

/// The duty to unmount a FUSE mount, separated from its fd by
/// [`Mount::into_parts`](super::Mount::into_parts).
///
/// It unmounts only its own mount, identified when mounting (see
/// [`MountGuard::unmount`]). Dropping it unmounts and logs failures;
/// [`MountGuard::unmount`] reports them. For `auto_unmount` mounts it holds
/// the watchdog's socket: the watchdog acts only if this process dies first.
#[derive(Debug)]
pub struct MountGuard {
    mountpoint: Option<PathBuf>,
    method: MountMethod,
    pub(super) allow_root: bool,
    armed: bool,
    /// Our mount's identity, recorded right after mounting; `None` if it
    /// could not be (then nothing is unmounted by path).
    identity: Option<MountIdentity>,
    /// For `auto_unmount`: the watchdog process.
    watchdog: Option<Watchdog>,
}

impl MountGuard {
    pub(super) fn new(mountpoint: Option<PathBuf>, method: MountMethod) -> Self {
        Self {
            mountpoint,
            method,
            allow_root: false,
            armed: method != MountMethod::HandedOver,
            identity: None,
            watchdog: None,
        }
    }

    /// Records which mount is ours; called right after mounting, when the
    /// mountpoint shows our root. Without it nothing is unmounted later.
    pub(super) fn record_identity(&mut self) {
        let Some(path) = self.mountpoint.as_deref() else {
            return;
        };
        match identify_new_mount(path) {
            Ok(id) => {
                log::debug!("our mount on {}: {id}", path.display());
                self.identity = Some(id);
            }
            Err(why) => log::error!(
                "cannot tell which mount on {} is ours ({why}); it will not be unmounted by this \
                 process: unmount it by hand",
                path.display()
            ),
        }
    }

    /// Starts the `auto_unmount` watchdog (see [`MountOptions::auto_unmount`]).
    pub(super) fn start_watchdog(&mut self) -> Result<(), MountError> {
        let (Some(path), Some(ours)) = (self.mountpoint.clone(), self.identity) else {
            return Err(MountError::Unidentified {
                path: self.mountpoint.clone().unwrap_or_default(),
            });
        };
        // umount2 when permitted (root), else the helper that mounted it.
        let fusermount = match self.method {
            MountMethod::Fusermount => find_fusermount(),
            _ => None,
        };
        let w = Watchdog::spawn(&path, ours, fusermount.as_deref()).map_err(|source| MountError::Io {
            context: "starting the auto_unmount watchdog",
            source,
        })?;
        self.watchdog = Some(w);
        Ok(())
    }

    /// The same as [`MountGuard::unmount`], which also leaves alone a
    /// mountpoint where our mount no longer is.
    pub fn unmount_if_still_mounted(self) -> Result<(), MountError> {
        self.unmount()
    }

    /// The canonical mountpoint; `None` for handed-over fds.
    pub fn mountpoint(&self) -> Option<&Path> {
        self.mountpoint.as_deref()
    }

    /// How the filesystem was mounted.
    pub fn method(&self) -> MountMethod {
        self.method
    }

    /// Unmounts our mount now and reports errors. Only our own mount is
    /// touched, identified by the mount id recorded right after mounting;
    /// the topmost mount on the mountpoint is compared with it first:
    ///
    /// - **Ours is on top**: it is detached. When this process may call
    ///   `umount2(2)` (root), exactly that mount is detached, through
    ///   `/proc/self/fd/N` of an `O_PATH` fd that was checked to be ours, so
    ///   a mount made on the path meanwhile cannot be hit. Otherwise (a
    ///   `fusermount3` mount of a non-root user) `fusermount3 -u -z` runs
    ///   right after the check; it unmounts by path.
    /// - **Ours is gone** (unmounted from outside, maybe with a new mount on
    ///   the path since) or was moved elsewhere: nothing is unmounted; `Ok`.
    /// - **Ours is covered** by another mount: nothing is unmounted;
    ///   [`MountError::Covered`]. Detaching ours would detach the covering
    ///   mount (and all below it) too, and the kernel refuses a non-lazy
    ///   unmount of a mount something is mounted on. Ours stays below the
    ///   other one (dead once the session's fd is closed): unmount the
    ///   covering mount, then ours.
    /// - **Ours was never identified**: [`MountError::Unidentified`].
    ///
    /// The detach is lazy (`MNT_DETACH`): files still open in the filesystem
    /// keep it alive until closed, as with `umount -l`. For a `fuseblk` mount
    /// the kernel waits for the DESTROY reply when the last reference goes:
    /// keep serving, or close every fd of the connection first. Afterwards
    /// the `auto_unmount` watchdog is told to exit without acting. Handed-over
    /// fds: nothing to do.
    pub fn unmount(mut self) -> Result<(), MountError> {
        self.do_unmount()
    }

    fn do_unmount(&mut self) -> Result<(), MountError> {
        if !self.armed {
            return Ok(());
        }
        self.armed = false;
        let result = match self.mountpoint.clone() {
            Some(path) if self.method != MountMethod::HandedOver => self.unmount_ours(&path),
            _ => Ok(()),
        };
        if let Some(w) = self.watchdog.take() {
            w.disarm();
        }
        result
    }

    fn unmount_ours(&self, path: &Path) -> Result<(), MountError> {
        let Some(ours) = self.identity else {
            return Err(MountError::Unidentified {
                path: path.to_path_buf(),
            });
        };
        let unmount_err = |source| MountError::Unmount {
            path: path.to_path_buf(),
            source,
        };
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|e| unmount_err(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        let (top_fd, top) = match identity::top_at(&c_path) {
            Ok(t) => t,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                log::info!(
                    "{} no longer exists, so neither does our mount on it: nothing to unmount",
                    path.display()
                );
                return Ok(());
            }
            Err(e) => return Err(unmount_err(e)),
        };
        if !top.is(&ours) {
            return match identity::whereabouts(&ours, &top, path) {
                Whereabouts::Covered => Err(MountError::Covered {
                    path: path.to_path_buf(),
                    top: identity::describe(top.id),
                }),
                Whereabouts::Elsewhere(now) => {
                    log::warn!(
                        "our mount on {} was moved to {}: not unmounting it, and leaving {} on {} alone",
                        path.display(),
                        now.display(),
                        identity::describe(top.id),
                        path.display()
                    );
                    Ok(())
                }
                Whereabouts::Gone => {
                    log::info!(
                        "our mount on {} was unmounted from outside; {} there now is not ours and is \
                         left alone",
                        path.display(),
                        identity::describe(top.id)
                    );
                    Ok(())
                }
            };
        }
        match detach_exact(&top_fd, path) {
            Ok(()) => {
                log::info!("unmounted {} (our {ours})", path.display());
                Ok(())
            }
            Err(MountError::Unmount { source, .. })
                if self.method == MountMethod::Fusermount && source.raw_os_error() == Some(libc::EPERM) =>
            {
                let program = find_fusermount().ok_or(MountError::FusermountMissing {
                    why: "to unmount a mount made by it",
                })?;
                drop(top_fd);
                fusermount_unmount(&program, path, true)?;
                log::info!(
                    "unmounted {} with {FUSERMOUNT} -u -z (our {ours} was on top just before)",
                    path.display()
                );
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if let Err(e) = self.do_unmount() {
            log::error!("unmounting on drop: {e}");
        }
    }
}

/// The identity of the mount just made on `path`: its topmost mount, which
/// must be a FUSE mount.
fn identify_new_mount(path: &Path) -> Result<MountIdentity, String> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let (_fd, id) = identity::top_at(&c_path).map_err(|e| format!("statx of the mountpoint: {e}"))?;
    match identity::is_fuse(id.id) {
        Some(false) => Err(format!(
            "the topmost mount there is {}, not a FUSE mount",
            identity::describe(id.id)
        )),
        _ => Ok(id),
    }
}

/// Detaches exactly the mount whose root `fd` (`O_PATH`) is: the magic link
/// `/proc/self/fd/N` names that mount, not whatever `path` resolves to by the
/// time `umount2(2)` looks. Without `/proc`, `path` itself (checked just before).
///
/// Always `MNT_DETACH`: a non-lazy unmount would fail with `EBUSY`, since
/// `fd` itself holds a reference to the mount.
fn detach_exact(fd: &OwnedFd, path: &Path) -> Result<(), MountError> {
    let magic = format!("/proc/self/fd/{}", fd.as_raw_fd());
    match nix::mount::umount2(magic.as_str(), MntFlags::MNT_DETACH) {
        Ok(()) => Ok(()),
        Err(Errno::ENOENT) => {
            log::debug!(
                "no /proc: detaching {} by path right after checking it",
                path.display()
            );
            nix::mount::umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW).map_err(|e| {
                MountError::Unmount {
                    path: path.to_path_buf(),
                    source: errno_io(e),
                }
            })
        }
        Err(e) => Err(MountError::Unmount {
            path: path.to_path_buf(),
            source: errno_io(e),
        }),
    }
}

/// Unmounts the FUSE filesystem at `path`, like `fusermount3 -u [-z]`.
///
/// This is by path: it unmounts whatever is mounted on top of `path` now,
/// which is what a command-line tool asked to unmount a path does. A program
/// unmounting its own mount uses its [`MountGuard`], which checks first.
///
/// As root this calls `umount2(2)` (`MNT_DETACH` if `lazy`); when not root,
/// or when that says `EPERM`, it runs `fusermount3 -u [-z]`, which allows
/// users to unmount FUSE filesystems they mounted.
pub fn unmount(path: &Path, lazy: bool) -> Result<(), MountError> {
    if nix::unistd::geteuid().is_root() {
        match umount_sys(path, lazy) {
            Err(MountError::Unmount { source, .. }) if source.raw_os_error() == Some(libc::EPERM) => {}
            other => return other,
        }
    }
    let program = find_fusermount().ok_or(MountError::FusermountMissing {
        why: "to unmount without privileges",
    })?;
    fusermount_unmount(&program, path, lazy)
}

fn umount_sys(path: &Path, lazy: bool) -> Result<(), MountError> {
    let flags = if lazy {
        MntFlags::MNT_DETACH
    } else {
        MntFlags::empty()
    };
    nix::mount::umount2(path, flags).map_err(|e| MountError::Unmount {
        path: path.to_path_buf(),
        source: errno_io(e),
    })
}
