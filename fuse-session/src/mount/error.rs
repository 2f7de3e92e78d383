//! Why mounting or unmounting failed: [`MountError`], one variant a cause,
//! each message saying what to do about it.

use nix::errno::Errno;
use std::io;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::process::ExitStatus;

/// Why mounting or unmounting failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// `/dev/fuse` does not exist.
    #[error(
        "/dev/fuse does not exist: the kernel has no FUSE support loaded (modprobe fuse, or a kernel \
         with CONFIG_FUSE_FS), or the device node is missing in this container"
    )]
    DevFuseMissing,
    /// `/dev/fuse` exists but this user may not open it.
    #[error(
        "permission denied opening /dev/fuse ({source}): the device is often mode 0600 (root only); \
         make it 0666 or give this user a group that may open it, or mount through fusermount3"
    )]
    DevFuseDenied {
        /// The error from `open(2)`.
        #[source]
        source: io::Error,
    },
    /// Opening `/dev/fuse` failed for another reason.
    #[error("cannot open /dev/fuse: {source}")]
    DevFuseOpen {
        /// The error from `open(2)`.
        #[source]
        source: io::Error,
    },
    /// The mountpoint does not exist.
    #[error("mountpoint {} does not exist", .path.display())]
    MountpointMissing {
        /// The mountpoint as given.
        path: PathBuf,
    },
    /// The mountpoint is not a directory.
    #[error("mountpoint {} is not a directory", .path.display())]
    NotADirectory {
        /// The mountpoint as given.
        path: PathBuf,
    },
    /// The mountpoint is not empty and [`MountOptions::nonempty_check`](super::MountOptions::nonempty_check) was set.
    #[error("mountpoint {} is not empty (nonempty_check is set)", .path.display())]
    NotEmpty {
        /// The mountpoint as given.
        path: PathBuf,
    },
    /// Something is mounted on the mountpoint already, and
    /// [`MountOptions::stack`](super::MountOptions::stack) was not set:
    /// mounting would hide it (and a second instance of a daemon would
    /// hide the first).
    #[error(
        "{} is a mount point already ({mounted}): mounting over it would hide it; \
         unmount it first, or ask for a stacked mount (-o stack)",
        .path.display()
    )]
    AlreadyMounted {
        /// The mountpoint as given.
        path: PathBuf,
        /// What is mounted there (type, source, mount id).
        mounted: String,
    },
    /// The mountpoint cannot be examined (e.g. `ENOTCONN`: a dead FUSE mount is still there).
    #[error("cannot use mountpoint {}: {source}", .path.display())]
    Mountpoint {
        /// The mountpoint as given.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// An option in an `-o` list is not one this module knows.
    #[error("unknown mount option `{0}`")]
    UnknownOption(String),
    /// An option is known but its value or combination is not acceptable.
    #[error("invalid mount option `{option}`: {reason}")]
    InvalidOption {
        /// The option (or field) at fault.
        option: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `mount(2)` was refused with `EPERM` and `fusermount3` is not available.
    #[error(
        "mount(2) of {} was refused (EPERM: needs CAP_SYS_ADMIN) and fusermount3 was not found \
         in PATH, /usr/bin or /bin to mount unprivileged (Debian/Ubuntu: install the fuse3 package)",
        .path.display()
    )]
    PermissionDenied {
        /// The mountpoint.
        path: PathBuf,
    },
    /// `mount(2)` failed.
    #[error("mount(2) of {fstype} on {} failed: {source}", .path.display())]
    Mount {
        /// The mountpoint.
        path: PathBuf,
        /// The filesystem type that was passed (`fuse.<subtype>`, …).
        fstype: String,
        /// The error from `mount(2)`.
        #[source]
        source: io::Error,
    },
    /// `fusermount3` is needed but could not be found.
    #[error(
        "fusermount3 is needed ({why}) but was not found in PATH, /usr/bin or /bin \
         (Debian/Ubuntu: install the fuse3 package)"
    )]
    FusermountMissing {
        /// Why the helper is needed.
        why: &'static str,
    },
    /// `fusermount3` could not be started.
    #[error("cannot run {}: {source}", .program.display())]
    FusermountSpawn {
        /// The helper's path.
        program: PathBuf,
        /// The error from spawning it.
        #[source]
        source: io::Error,
    },
    /// `fusermount3` ran and failed.
    #[error("{} failed ({status}): {}", .program.display(), stderr_or_placeholder(.stderr))]
    FusermountFailed {
        /// The helper's path.
        program: PathBuf,
        /// Its exit status.
        status: ExitStatus,
        /// What it printed on stderr (trimmed).
        stderr: String,
    },
    /// `fusermount3` exited successfully but did not send a `/dev/fuse` fd.
    #[error("{} did not pass back a /dev/fuse fd: {reason}", .program.display())]
    FusermountProtocol {
        /// The helper's path.
        program: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The fd named by a `/dev/fd/N` mountpoint cannot be used.
    #[error("handed-over fd {fd} (from /dev/fd/{fd}) cannot be used: {reason}")]
    HandoverFd {
        /// The fd number.
        fd: RawFd,
        /// What is wrong with it.
        reason: String,
    },
    /// `umount2(2)` failed.
    #[error("unmounting {} failed: {source}", .path.display())]
    Unmount {
        /// The mountpoint.
        path: PathBuf,
        /// The error from `umount2(2)`.
        #[source]
        source: io::Error,
    },
    /// Our mount is still on the mountpoint, but another mount sits on top
    /// of it. Neither was unmounted: detaching ours would take the covering
    /// mount away with it.
    #[error(
        "our FUSE mount on {} is covered by another mount ({top}); left both in place: unmount \
         the covering mount, then ours",
        .path.display()
    )]
    Covered {
        /// The mountpoint.
        path: PathBuf,
        /// The covering mount (type, source, mount id).
        top: String,
    },
    /// Which mount is ours could not be recorded when mounting, so it is not
    /// unmounted: a path alone does not say whose mount it names.
    #[error(
        "not unmounting {}: which mount there is ours was not recorded when mounting; unmount it \
         by hand",
        .path.display()
    )]
    Unidentified {
        /// The mountpoint.
        path: PathBuf,
    },
    /// A system call needed on the way failed (socketpair, recvmsg, …).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

fn stderr_or_placeholder(s: &str) -> &str {
    if s.is_empty() { "(no message on stderr)" } else { s }
}

pub(super) fn errno_io(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}
