//! Mounting and unmounting: this module owns everything between "a path and
//! some `-o` options" and "a `/dev/fuse` fd bound to a mounted connection".
//!
//! Three ways to get there:
//!
//! - **privileged**: open `/dev/fuse` and call `mount(2)` with filesystem type
//!   `fuse.<subtype>` (or `fuseblk.<subtype>`), source = fsname and the data
//!   string `fd=N,rootmode=…,user_id=…,group_id=…[,…]`. Needs `CAP_SYS_ADMIN`.
//! - **unprivileged**: run the setuid helper `fusermount3`, which mounts for us
//!   and passes the `/dev/fuse` fd back over a unix socket (`SCM_RIGHTS`). Used
//!   when the effective uid is not 0 or when `mount(2)` fails with `EPERM`.
//! - **handed over**: a privileged helper already mounted and passes the fd;
//!   by convention the "mountpoint" is then the string `/dev/fd/N`. Nothing is
//!   mounted or unmounted by us.
//!
//! The result is a [`Mount`]: the [`DevFuse`] session fd plus a [`MountGuard`]
//! that unmounts when asked or when dropped. [`Mount::into_parts`] separates
//! the two so a session can own the fd while the guard unmounts at the end.
//!
//! The guard unmounts only its own mount: right after mounting it records the
//! mount's identity (module `identity`), and before unmounting it checks that the
//! topmost mount on the mountpoint is still that one. A mount placed over
//! ours, or a new mount after ours was unmounted from outside, is left alone
//! (see [`MountGuard::unmount`]). With `auto_unmount` a small watchdog
//! process (module `watchdog`) does the same when this process dies.
//!
//! The kernel has no `allow_root`: it is mounted as `allow_other`, and the
//! session must refuse requests from uids other than the mount owner and root
//! (see [`MountOptions::allow_root`] and [`Mount::allow_root`]).
//!
//! The module's parts: `error` ([`MountError`]: why it failed), `options`
//! (the `-o` options and their parsing), `guard` (unmounting our own mount,
//! and unmount by path), `fusermount` (the setuid helper and `SCM_RIGHTS`),
//! `identity` (which mount is ours, from `statx` and
//! `/proc/self/mountinfo`) and `watchdog` (`auto_unmount`). This file puts
//! them together: the mountpoint checks, `mount(2)`, the handed-over fd, and
//! [`Mount`].

use crate::transport::dev_fuse::DevFuse;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

mod error;
mod fusermount;
mod guard;
mod identity;
mod options;
mod watchdog;

pub use error::MountError;
use error::errno_io;
pub use fusermount::{FUSERMOUNT, find_fusermount};
pub use guard::{MountGuard, MountMethod, unmount};
pub use options::{DEFAULT_FSNAME, MountOptions};

/// Major and minor number of `/dev/fuse` (misc device 229).
const DEV_FUSE_MAJOR: u64 = 10;
const DEV_FUSE_MINOR: u64 = 229;

/// A mounted FUSE filesystem: the session's `/dev/fuse` fd and the duty to
/// unmount.
///
/// Dropping it closes the fd, then unmounts our mount (see
/// [`MountGuard::unmount`]), logging failures; [`Mount::unmount`] does it
/// explicitly and reports errors. Handed-over fds are never unmounted.
#[derive(Debug)]
pub struct Mount {
    // Field order matters: the fd is closed before the guard unmounts, so a
    // fuseblk unmount (which waits for a DESTROY reply) cannot hang on it.
    dev: DevFuse,
    guard: MountGuard,
}

impl Mount {
    /// Mounts a FUSE filesystem on `mountpoint` with `opts`.
    ///
    /// If `mountpoint` is `/dev/fd/N`, fd N (an already mounted `/dev/fuse`
    /// fd from a privileged helper) becomes the session fd, ownership of it
    /// passes to the returned `Mount`, and nothing is mounted or unmounted;
    /// of `opts` only `allow_root` matters then (the helper chose the rest).
    ///
    /// Otherwise, as root this calls `mount(2)`; when not root or when
    /// `mount(2)` says `EPERM`, it runs `fusermount3`. Right after mounting it
    /// records which mount is ours, and with `auto_unmount` it starts the
    /// watchdog (see [`MountOptions::auto_unmount`]). On error nothing of
    /// ours is left mounted and no fd is kept.
    pub fn new(mountpoint: impl AsRef<Path>, opts: &MountOptions) -> Result<Mount, MountError> {
        let mountpoint = mountpoint.as_ref();
        if let Some(fd) = handover_fd_number(mountpoint) {
            let fd = take_handover_fd(fd)?;
            let mut m = Mount::from_fd(fd);
            m.guard.allow_root = opts.allow_root;
            return Ok(m);
        }
        opts.validate()?;
        let (path, rootmode) = check_mountpoint(mountpoint, opts)?;

        let use_fusermount = if !nix::unistd::geteuid().is_root() {
            Some("not running as root")
        } else {
            None
        };
        let mut m = match use_fusermount {
            Some(why) => {
                let program = find_fusermount().ok_or(MountError::FusermountMissing { why })?;
                mount_with_fusermount(&program, &path, opts)?
            }
            None => match mount_privileged(&path, rootmode, opts) {
                Err(MountError::Mount { source, .. }) if source.raw_os_error() == Some(libc::EPERM) => {
                    let program =
                        find_fusermount().ok_or(MountError::PermissionDenied { path: path.clone() })?;
                    log::info!(
                        "mount(2) of {} refused with EPERM; trying {}",
                        path.display(),
                        program.display()
                    );
                    mount_with_fusermount(&program, &path, opts)?
                }
                other => other?,
            },
        };
        m.guard.allow_root = opts.allow_root;
        if opts.auto_unmount {
            m.guard.start_watchdog()?;
        }
        Ok(m)
    }

    /// A mount just made on `path` by `method`, its identity recorded while
    /// the mountpoint shows our root.
    fn ours(dev: DevFuse, path: &Path, method: MountMethod) -> Mount {
        let mut guard = MountGuard::new(Some(path.to_path_buf()), method);
        guard.record_identity();
        Mount { dev, guard }
    }

    /// Wraps a `/dev/fuse` fd that someone else mounted; it will never be
    /// unmounted by this `Mount`.
    pub fn from_fd(fd: OwnedFd) -> Mount {
        Mount {
            dev: DevFuse::from_fd(fd),
            guard: MountGuard::new(None, MountMethod::HandedOver),
        }
    }

    /// The session fd.
    pub fn dev(&self) -> &DevFuse {
        &self.dev
    }

    /// The canonical mountpoint; `None` for handed-over fds.
    pub fn mountpoint(&self) -> Option<&Path> {
        self.guard.mountpoint()
    }

    /// How the filesystem was mounted.
    pub fn method(&self) -> MountMethod {
        self.guard.method()
    }

    /// Whether `allow_root` was requested: the session must then refuse
    /// requests whose uid is neither the mount owner's nor 0.
    pub fn allow_root(&self) -> bool {
        self.guard.allow_root
    }

    /// Separates the session fd from the duty to unmount.
    pub fn into_parts(self) -> (DevFuse, MountGuard) {
        (self.dev, self.guard)
    }

    /// Closes this fd and unmounts (see [`MountGuard::unmount`]). Duplicates
    /// or clones of the fd held elsewhere see `ENODEV` afterwards.
    pub fn unmount(self) -> Result<(), MountError> {
        let (dev, guard) = self.into_parts();
        drop(dev);
        guard.unmount()
    }
}

impl AsFd for Mount {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.dev.as_fd()
    }
}

/// `Some(N)` if the mountpoint is the string `/dev/fd/N`.
fn handover_fd_number(mountpoint: &Path) -> Option<RawFd> {
    let s = mountpoint.as_os_str().as_bytes().strip_prefix(b"/dev/fd/")?;
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// Takes ownership of fd `n` after checking it is an open `/dev/fuse`; on
/// error the fd is left open (it is still the caller's).
fn take_handover_fd(n: RawFd) -> Result<OwnedFd, MountError> {
    let bad = |reason: String| MountError::HandoverFd { fd: n, reason };
    if n < 0 {
        return Err(bad("negative fd".into()));
    }
    // SAFETY: F_GETFD only queries the descriptor-table entry for `n`; it
    // touches no memory and is harmless if `n` is not open (EBADF).
    if unsafe { libc::fcntl(n, libc::F_GETFD) } < 0 {
        return Err(bad(format!("not open: {}", io::Error::last_os_error())));
    }
    // SAFETY: `n` is open (checked above) and the /dev/fd/N convention
    // transfers it to us; on any error below we give it back with into_raw_fd.
    let fd = unsafe { OwnedFd::from_raw_fd(n) };
    let st = match nix::sys::stat::fstat(&fd) {
        Ok(st) => st,
        Err(e) => {
            let _ = fd.into_raw_fd();
            return Err(bad(format!("fstat failed: {e}")));
        }
    };
    let is_chr = (st.st_mode & libc::S_IFMT) == libc::S_IFCHR;
    let rdev = st.st_rdev;
    if !is_chr || libc::major(rdev) as u64 != DEV_FUSE_MAJOR || libc::minor(rdev) as u64 != DEV_FUSE_MINOR {
        let _ = fd.into_raw_fd();
        return Err(bad("not a /dev/fuse descriptor".into()));
    }
    if let Err(e) = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC)) {
        log::warn!("cannot set FD_CLOEXEC on handed-over fd {n}: {e}");
    }
    Ok(fd)
}

/// Checks the mountpoint; returns its canonical path and the root mode to
/// announce (`S_IFDIR | permission bits`).
fn check_mountpoint(mountpoint: &Path, opts: &MountOptions) -> Result<(PathBuf, u32), MountError> {
    let given = || mountpoint.to_path_buf();
    let meta = std::fs::metadata(mountpoint).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => MountError::MountpointMissing { path: given() },
        _ => MountError::Mountpoint {
            path: given(),
            source,
        },
    })?;
    if !meta.is_dir() {
        return Err(MountError::NotADirectory { path: given() });
    }
    if !opts.stack
        && let Some(id) = identity::mount_root_at(mountpoint)
    {
        return Err(MountError::AlreadyMounted {
            path: given(),
            mounted: identity::describe(id),
        });
    }
    let mut entries = std::fs::read_dir(mountpoint).map_err(|source| MountError::Mountpoint {
        path: given(),
        source,
    })?;
    if entries.next().is_some() {
        if opts.nonempty_check {
            return Err(MountError::NotEmpty { path: given() });
        }
        log::warn!(
            "{} is not empty: what it holds is hidden while mounted (-o nonempty_check refuses such a mountpoint)",
            mountpoint.display()
        );
    }
    let path = std::fs::canonicalize(mountpoint).map_err(|source| MountError::Mountpoint {
        path: given(),
        source,
    })?;
    Ok((path, libc::S_IFDIR | (meta.mode() & 0o7777)))
}

fn open_dev_fuse() -> Result<DevFuse, MountError> {
    DevFuse::open().map_err(|source| match source.raw_os_error() {
        Some(libc::ENOENT) => MountError::DevFuseMissing,
        Some(libc::EACCES | libc::EPERM) => MountError::DevFuseDenied { source },
        _ => MountError::DevFuseOpen { source },
    })
}

fn mount_privileged(path: &Path, rootmode: u32, opts: &MountOptions) -> Result<Mount, MountError> {
    let dev = open_dev_fuse()?;
    let data = opts.kernel_data(
        dev.as_raw_fd(),
        rootmode,
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    )?;
    let fstype = opts.fstype();
    log::debug!("mount -t {fstype} -o {data} {} {}", opts.source(), path.display());
    nix::mount::mount(
        Some(opts.source()),
        path,
        Some(fstype.as_str()),
        opts.ms_flags(),
        Some(data.as_str()),
    )
    .map_err(|e| MountError::Mount {
        path: path.to_path_buf(),
        fstype,
        source: errno_io(e),
    })?;
    Ok(Mount::ours(dev, path, MountMethod::Privileged))
}

fn mount_with_fusermount(program: &Path, path: &Path, opts: &MountOptions) -> Result<Mount, MountError> {
    let fd = fusermount::mount(program, path, opts)?;
    Ok(Mount::ours(DevFuse::from_fd(fd), path, MountMethod::Fusermount))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handover_paths() {
        assert_eq!(handover_fd_number(Path::new("/dev/fd/7")), Some(7));
        assert_eq!(handover_fd_number(Path::new("/dev/fd/")), None);
        assert_eq!(handover_fd_number(Path::new("/dev/fd/7x")), None);
        assert_eq!(handover_fd_number(Path::new("/dev/fd/-1")), None);
        assert_eq!(handover_fd_number(Path::new("/mnt/dev/fd/7")), None);
    }

    #[test]
    fn handover_of_a_non_fuse_fd_is_refused_and_left_open() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let n = f.as_raw_fd();
        let e = Mount::new(format!("/dev/fd/{n}"), &MountOptions::default()).unwrap_err();
        assert!(matches!(e, MountError::HandoverFd { fd, .. } if fd == n), "{e}");
        // Still open and still ours.
        assert!(f.metadata().is_ok());
        drop(f);
    }

    #[test]
    fn mountpoint_errors() {
        let e = Mount::new("/nonexistent/fuse-wire-test", &MountOptions::default()).unwrap_err();
        assert!(matches!(e, MountError::MountpointMissing { .. }), "{e}");
        let e = Mount::new("/proc/self/status", &MountOptions::default()).unwrap_err();
        assert!(matches!(e, MountError::NotADirectory { .. }), "{e}");
        let o = MountOptions {
            nonempty_check: true,
            ..Default::default()
        };
        let e = Mount::new("/proc/self", &o).unwrap_err();
        assert!(matches!(e, MountError::NotEmpty { .. }), "{e}");
    }
}
