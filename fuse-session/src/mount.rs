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

use crate::transport::dev_fuse::DevFuse;
use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::socket::{AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType};
use std::ffi::CString;
use std::io::{self, IoSliceMut, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

mod identity;
mod watchdog;

use identity::{MountIdentity, Whereabouts};
use watchdog::Watchdog;

/// Name of the setuid mount helper of libfuse 3.
pub const FUSERMOUNT: &str = "fusermount3";

/// Environment variable through which `fusermount3` learns the socket fd it
/// must send the `/dev/fuse` fd over.
const COMMFD_ENV: &str = "_FUSE_COMMFD";

/// Default fsname (mount source) when neither `fsname` nor `subtype` is set.
pub const DEFAULT_FSNAME: &str = "fuse-wire";

/// Major and minor number of `/dev/fuse` (misc device 229).
const DEV_FUSE_MAJOR: u64 = 10;
const DEV_FUSE_MINOR: u64 = 229;

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
    /// The mountpoint is not empty and [`MountOptions::nonempty_check`] was set.
    #[error("mountpoint {} is not empty (nonempty_check is set)", .path.display())]
    NotEmpty {
        /// The mountpoint as given.
        path: PathBuf,
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
        "mount(2) of {} was refused (EPERM: needs CAP_SYS_ADMIN) and {FUSERMOUNT} was not found \
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
        "{FUSERMOUNT} is needed ({why}) but was not found in PATH, /usr/bin or /bin \
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

fn errno_io(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Mount options: the standard libfuse `-o` options this library understands.
///
/// Build one with [`MountOptions::default`] and set fields, or parse a
/// comma-separated `-o` list with [`MountOptions::parse_opts`] /
/// [`MountOptions::parse_known`].
///
/// Like libfuse and `fusermount3`, the default is `nosuid,nodev`; the options
/// `suid` and `dev` clear them (`fusermount3` forces both for non-root users).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountOptions {
    /// Mount source shown in `/proc/mounts` (`fsname=`); default: the subtype, or `fuse-wire`.
    pub fsname: Option<String>,
    /// Filesystem subtype (`subtype=`): the type becomes `fuse.<subtype>`.
    pub subtype: Option<String>,
    /// Let users other than the mounting one access the filesystem (`allow_other`).
    /// For `fusermount3`, needs `user_allow_other` in `/etc/fuse.conf`.
    pub allow_other: bool,
    /// Let the mounting user and root access the filesystem (`allow_root`).
    ///
    /// The kernel has no such option: the mount is made with `allow_other` and
    /// the session must refuse requests from other uids. Exclusive with `allow_other`.
    pub allow_root: bool,
    /// Let the kernel check permissions from the file modes (`default_permissions`).
    pub default_permissions: bool,
    /// Mount read-only (`ro`; `rw` clears it).
    pub read_only: bool,
    /// Ignore set-user/group-id bits (`nosuid`; `suid` clears it). Default: on.
    pub nosuid: bool,
    /// Do not interpret device files (`nodev`; `dev` clears it). Default: on.
    pub nodev: bool,
    /// Do not allow executing files (`noexec`; `exec` clears it).
    pub noexec: bool,
    /// Do not update access times (`noatime`; `atime` clears it).
    pub noatime: bool,
    /// Do not update directory access times (`nodiratime`; `diratime` clears it).
    pub nodiratime: bool,
    /// Synchronous writes (`sync`; `async` clears it).
    pub sync: bool,
    /// Synchronous directory changes (`dirsync`).
    pub dirsync: bool,
    /// Largest READ request the kernel sends (`max_read=`).
    pub max_read: Option<u32>,
    /// Block size of a `fuseblk` filesystem (`blksize=`); only valid with [`blkdev`](Self::blkdev).
    pub blksize: Option<u32>,
    /// Mount as `fuseblk`: the fsname must then be a block device (`blkdev`).
    pub blkdev: bool,
    /// Unmount when this process dies without unmounting (`auto_unmount`).
    ///
    /// [`Mount::new`] forks a small watchdog process that waits on a socket
    /// the [`MountGuard`] holds. When the guard has dealt with the mount it
    /// tells the watchdog, which exits. When the socket closes without that,
    /// this process died: the watchdog then unmounts **only if the topmost
    /// mount on the mountpoint is still ours** (same mount id as recorded
    /// right after mounting); a mount placed over ours, or a new mount after
    /// ours was unmounted, is left alone.
    ///
    /// As root the watchdog detaches exactly our mount
    /// (`umount2("/proc/self/fd/N", MNT_DETACH)` on an `O_PATH` fd of it),
    /// whatever the path resolves to meanwhile. A non-root user may not call
    /// `umount2`; the watchdog then runs `fusermount3 -u -z`, which
    /// unmounts whatever is topmost on the path, so between the watchdog's
    /// check and `fusermount3`'s own lookup (a fork and exec apart) a mount
    /// placed over ours would be detached in its place. That window cannot be
    /// closed without privileges: `fusermount3` takes only a path. (The
    /// `auto_unmount` of `fusermount3` itself is not used: it unmounts the
    /// path's topmost mount if it is any dead FUSE mount of our type.)
    ///
    /// The watchdog is a child process: it shows in `ps` as
    /// `fuse-wire-unmnt`, blocks all signals and runs in its own session.
    /// It writes one line to stderr when it acts. Unlike `fusermount3`'s
    /// helper it also works for non-root users without `allow_other` on
    /// libfuse before 3.15. See docs/security.md, "Unmounting only our own
    /// mount".
    pub auto_unmount: bool,
    /// Refuse to mount over a non-empty directory. Off by default (FUSE and
    /// libfuse 3 allow it); not an `-o` option.
    pub nonempty_check: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            fsname: None,
            subtype: None,
            allow_other: false,
            allow_root: false,
            default_permissions: false,
            read_only: false,
            nosuid: true,
            nodev: true,
            noexec: false,
            noatime: false,
            nodiratime: false,
            sync: false,
            dirsync: false,
            max_read: None,
            blksize: None,
            blkdev: false,
            auto_unmount: false,
            nonempty_check: false,
        }
    }
}

/// Options the library computes itself; given in an `-o` list they are refused.
const RESERVED: &[&str] = &["fd", "rootmode", "user_id", "group_id"];

impl MountOptions {
    /// Parses a libfuse-style `-o` list (`"ro,allow_other,fsname=x"`) on top
    /// of the defaults. Any option not listed in [`MountOptions::apply`] is an
    /// error naming it.
    pub fn parse_opts(opts: &str) -> Result<Self, MountError> {
        let mut o = Self::default();
        o.apply(opts)?;
        Ok(o)
    }

    /// Like [`MountOptions::parse_opts`], but returns the options it does not
    /// know instead of failing on them, in their order, for the caller to
    /// interpret. Known options with bad values are still errors.
    pub fn parse_known(opts: &str) -> Result<(Self, Vec<String>), MountError> {
        let mut o = Self::default();
        let rest = o.apply_known(opts)?;
        Ok((o, rest))
    }

    /// Applies a comma-separated `-o` list to `self`; later options win.
    ///
    /// Known: `fsname=`, `subtype=`, `allow_other`, `allow_root`,
    /// `default_permissions`, `ro`, `rw`, `nosuid`, `suid`, `nodev`, `dev`,
    /// `noexec`, `exec`, `noatime`, `atime`, `nodiratime`, `diratime`, `sync`,
    /// `async`, `dirsync`, `max_read=`, `blksize=`, `blkdev`, `auto_unmount`.
    /// Empty items are ignored.
    pub fn apply(&mut self, opts: &str) -> Result<(), MountError> {
        match self.apply_known(opts)?.into_iter().next() {
            Some(unknown) => Err(MountError::UnknownOption(unknown)),
            None => Ok(()),
        }
    }

    fn apply_known(&mut self, opts: &str) -> Result<Vec<String>, MountError> {
        let mut unknown = Vec::new();
        for item in opts.split(',').filter(|s| !s.is_empty()) {
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            let flag = |v: Option<&str>| match v {
                None => Ok(true),
                Some(_) => Err(invalid(key, "takes no value")),
            };
            match key {
                "fsname" => self.fsname = Some(string_value(key, value)?),
                "subtype" => self.subtype = Some(string_value(key, value)?),
                "max_read" => self.max_read = Some(u32_value(key, value)?),
                "blksize" => self.blksize = Some(u32_value(key, value)?),
                "allow_other" => self.allow_other = flag(value)?,
                "allow_root" => self.allow_root = flag(value)?,
                "default_permissions" => self.default_permissions = flag(value)?,
                "ro" => self.read_only = flag(value)?,
                "rw" => self.read_only = !flag(value)?,
                "nosuid" => self.nosuid = flag(value)?,
                "suid" => self.nosuid = !flag(value)?,
                "nodev" => self.nodev = flag(value)?,
                "dev" => self.nodev = !flag(value)?,
                "noexec" => self.noexec = flag(value)?,
                "exec" => self.noexec = !flag(value)?,
                "noatime" => self.noatime = flag(value)?,
                "atime" => self.noatime = !flag(value)?,
                "nodiratime" => self.nodiratime = flag(value)?,
                "diratime" => self.nodiratime = !flag(value)?,
                "sync" => self.sync = flag(value)?,
                "async" => self.sync = !flag(value)?,
                "dirsync" => self.dirsync = flag(value)?,
                "blkdev" => self.blkdev = flag(value)?,
                "auto_unmount" => self.auto_unmount = flag(value)?,
                k if RESERVED.contains(&k) => {
                    return Err(invalid(k, "is computed by the library and cannot be given"));
                }
                _ => unknown.push(item.to_string()),
            }
        }
        Ok(unknown)
    }

    /// Checks values and combinations: no commas or NUL in values, a
    /// non-empty subtype without `.`, `allow_other`/`allow_root` exclusive,
    /// `blksize` only with `blkdev`, non-zero sizes.
    pub fn validate(&self) -> Result<(), MountError> {
        for (name, v) in [("fsname", &self.fsname), ("subtype", &self.subtype)] {
            if let Some(v) = v {
                check_value(name, v)?;
            }
        }
        if let Some(st) = &self.subtype
            && st.contains(['.', '/', ' '])
        {
            return Err(invalid("subtype", "must not contain '.', '/' or spaces"));
        }
        if self.allow_other && self.allow_root {
            return Err(invalid(
                "allow_root",
                "allow_other and allow_root are mutually exclusive",
            ));
        }
        if self.blksize.is_some() && !self.blkdev {
            return Err(invalid(
                "blksize",
                "only valid for block-device (fuseblk) mounts: set blkdev as well",
            ));
        }
        if let Some(b) = self.blksize
            && (b < 512 || !b.is_power_of_two())
        {
            return Err(invalid("blksize", "must be a power of two of at least 512"));
        }
        if self.max_read == Some(0) {
            return Err(invalid("max_read", "must be greater than 0"));
        }
        if self.blkdev && self.fsname.is_none() {
            return Err(invalid("blkdev", "needs fsname= naming the block device"));
        }
        Ok(())
    }

    /// The mount source: `fsname`, else the subtype, else [`DEFAULT_FSNAME`].
    pub fn source(&self) -> &str {
        self.fsname
            .as_deref()
            .or(self.subtype.as_deref())
            .unwrap_or(DEFAULT_FSNAME)
    }

    /// The filesystem type for `mount(2)`: `fuse`, `fuse.<subtype>`, `fuseblk`
    /// or `fuseblk.<subtype>`.
    pub fn fstype(&self) -> String {
        let base = if self.blkdev { "fuseblk" } else { "fuse" };
        match &self.subtype {
            Some(st) => format!("{base}.{st}"),
            None => base.to_string(),
        }
    }

    /// The `mount(2)` data string for a privileged mount:
    /// `fd=N,rootmode=<octal>,user_id=U,group_id=G` then, when set,
    /// `allow_other` (also for `allow_root`), `default_permissions`,
    /// `max_read=N`, `blksize=N`.
    pub fn kernel_data(&self, fd: RawFd, rootmode: u32, uid: u32, gid: u32) -> Result<String, MountError> {
        self.validate()?;
        let mut s = format!("fd={fd},rootmode={rootmode:o},user_id={uid},group_id={gid}");
        if self.allow_other || self.allow_root {
            s.push_str(",allow_other");
        }
        if self.default_permissions {
            s.push_str(",default_permissions");
        }
        if let Some(n) = self.max_read {
            s.push_str(&format!(",max_read={n}"));
        }
        if let Some(n) = self.blksize {
            s.push_str(&format!(",blksize={n}"));
        }
        Ok(s)
    }

    /// The `MS_*` flags for `mount(2)`.
    fn ms_flags(&self) -> MsFlags {
        let mut f = MsFlags::empty();
        for (on, flag) in [
            (self.read_only, MsFlags::MS_RDONLY),
            (self.nosuid, MsFlags::MS_NOSUID),
            (self.nodev, MsFlags::MS_NODEV),
            (self.noexec, MsFlags::MS_NOEXEC),
            (self.noatime, MsFlags::MS_NOATIME),
            (self.nodiratime, MsFlags::MS_NODIRATIME),
            (self.sync, MsFlags::MS_SYNCHRONOUS),
            (self.dirsync, MsFlags::MS_DIRSYNC),
        ] {
            if on {
                f |= flag;
            }
        }
        f
    }

    /// The `-o` argument for `fusermount3` (which computes `fd`, `rootmode`,
    /// `user_id` and `group_id` itself): `rw` or `ro`, the set flags,
    /// `fsname=`, `subtype=`, `allow_other` (also for `allow_root`),
    /// `default_permissions`, `max_read=`, `blkdev`, `blksize=`, `auto_unmount`.
    pub fn fusermount_opts(&self) -> Result<String, MountError> {
        self.validate()?;
        let mut v: Vec<String> = vec![if self.read_only { "ro" } else { "rw" }.into()];
        for (on, name) in [
            (self.nosuid, "nosuid"),
            (self.nodev, "nodev"),
            (self.noexec, "noexec"),
            (self.noatime, "noatime"),
            (self.nodiratime, "nodiratime"),
            (self.sync, "sync"),
            (self.dirsync, "dirsync"),
        ] {
            if on {
                v.push(name.into());
            }
        }
        v.push(format!("fsname={}", self.source()));
        if let Some(st) = &self.subtype {
            v.push(format!("subtype={st}"));
        }
        if self.allow_other || self.allow_root {
            v.push("allow_other".into());
        }
        if self.default_permissions {
            v.push("default_permissions".into());
        }
        if let Some(n) = self.max_read {
            v.push(format!("max_read={n}"));
        }
        if self.blkdev {
            v.push("blkdev".into());
        }
        if let Some(n) = self.blksize {
            v.push(format!("blksize={n}"));
        }
        if self.auto_unmount {
            v.push("auto_unmount".into());
        }
        Ok(v.join(","))
    }
}

fn invalid(option: &str, reason: &str) -> MountError {
    MountError::InvalidOption {
        option: option.to_string(),
        reason: reason.to_string(),
    }
}

fn check_value(name: &str, v: &str) -> Result<(), MountError> {
    if v.is_empty() {
        return Err(invalid(name, "value must not be empty"));
    }
    if v.contains(',') {
        return Err(invalid(name, "value must not contain a comma"));
    }
    if v.contains('\0') {
        return Err(invalid(name, "value must not contain NUL"));
    }
    Ok(())
}

fn string_value(key: &str, value: Option<&str>) -> Result<String, MountError> {
    let v = value.ok_or_else(|| invalid(key, "needs a value (key=value)"))?;
    check_value(key, v)?;
    Ok(v.to_string())
}

fn u32_value(key: &str, value: Option<&str>) -> Result<u32, MountError> {
    let v = value.ok_or_else(|| invalid(key, "needs a value (key=value)"))?;
    v.parse()
        .map_err(|_| invalid(key, "value must be an unsigned 32-bit integer"))
}

/// How a [`Mount`] came to be, which decides how it is unmounted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountMethod {
    /// `mount(2)` by this process; unmounted with `umount2(2)`.
    Privileged,
    /// Mounted by `fusermount3`; unmounted with `umount2(2)` when this
    /// process may, else with `fusermount3 -u -z`.
    Fusermount,
    /// The fd was handed over (`/dev/fd/N` or [`Mount::from_fd`]); never unmounted by us.
    HandedOver,
}

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

/// The duty to unmount a FUSE mount, separated from its fd by
/// [`Mount::into_parts`].
///
/// It unmounts only its own mount, identified when mounting (see
/// [`MountGuard::unmount`]). Dropping it unmounts and logs failures;
/// [`MountGuard::unmount`] reports them. For `auto_unmount` mounts it holds
/// the watchdog's socket: the watchdog acts only if this process dies first.
#[derive(Debug)]
pub struct MountGuard {
    mountpoint: Option<PathBuf>,
    method: MountMethod,
    allow_root: bool,
    armed: bool,
    /// Our mount's identity, recorded right after mounting; `None` if it
    /// could not be (then nothing is unmounted by path).
    identity: Option<MountIdentity>,
    /// For `auto_unmount`: the watchdog process.
    watchdog: Option<Watchdog>,
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
                mount_fusermount(&program, &path, opts)?
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
                    mount_fusermount(&program, &path, opts)?
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
        self.guard.method
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

impl MountGuard {
    fn new(mountpoint: Option<PathBuf>, method: MountMethod) -> Self {
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
    fn record_identity(&mut self) {
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
    fn start_watchdog(&mut self) -> Result<(), MountError> {
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

fn fusermount_unmount(program: &Path, path: &Path, lazy: bool) -> Result<(), MountError> {
    let mut cmd = Command::new(program);
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    cmd.arg("--").arg(path).stdin(Stdio::null()).stdout(Stdio::null());
    let out = cmd.output().map_err(|source| MountError::FusermountSpawn {
        program: program.to_path_buf(),
        source,
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(MountError::FusermountFailed {
            program: program.to_path_buf(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
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
    if opts.nonempty_check {
        let mut entries = std::fs::read_dir(mountpoint).map_err(|source| MountError::Mountpoint {
            path: given(),
            source,
        })?;
        if entries.next().is_some() {
            return Err(MountError::NotEmpty { path: given() });
        }
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
    let mut guard = MountGuard::new(Some(path.to_path_buf()), MountMethod::Privileged);
    guard.record_identity();
    Ok(Mount { dev, guard })
}

/// Finds `fusermount3` in `PATH`, then `/usr/bin` and `/bin`.
pub fn find_fusermount() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .filter(|d| d.is_absolute())
        .map(|d| d.join(FUSERMOUNT))
        .find(|p| {
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

fn mount_fusermount(program: &Path, path: &Path, opts: &MountOptions) -> Result<Mount, MountError> {
    // Not fusermount3's own auto_unmount, which unmounts by path: our
    // watchdog does it (see MountOptions::auto_unmount).
    let o = MountOptions {
        auto_unmount: false,
        ..opts.clone()
    }
    .fusermount_opts()?;
    let io_err = |context| {
        move |e: Errno| MountError::Io {
            context,
            source: errno_io(e),
        }
    };
    // Both ends close-on-exec; only the helper's end is made inheritable, in
    // the child between fork and exec, so no other child can inherit it.
    let (ours, theirs) = nix::sys::socket::socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io_err("socketpair(AF_UNIX, SOCK_STREAM)"))?;
    let their_fd = theirs.as_raw_fd();

    log::debug!(
        "{} -o {o} -- {} ({COMMFD_ENV}={their_fd})",
        program.display(),
        path.display()
    );
    let mut cmd = Command::new(program);
    cmd.arg("-o")
        .arg(&o)
        .arg("--")
        .arg(path)
        .env(COMMFD_ENV, their_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and only calls
    // fcntl(2), which is async-signal-safe, on an fd number that is open in
    // the child (inherited from us, still held by `theirs` during spawn).
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(their_fd, libc::F_SETFD, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| MountError::FusermountSpawn {
        program: program.to_path_buf(),
        source,
    })?;
    // Only the helper holds its end now: when it exits, our recvmsg sees EOF.
    drop(theirs);

    let received = receive_fd(&ours);
    let mut stderr = child.stderr.take();
    let mut read_stderr = || {
        let mut s = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s.trim().to_string()
    };

    let fd = match received {
        Ok(fd) => fd,
        Err(reason) => {
            // No fd came: the helper failed (or broke protocol) and mounted nothing.
            let status = child.wait().map_err(|source| MountError::Io {
                context: "waiting for fusermount3",
                source,
            })?;
            let err = read_stderr();
            return Err(if !status.success() {
                MountError::FusermountFailed {
                    program: program.to_path_buf(),
                    status,
                    stderr: err,
                }
            } else {
                MountError::FusermountProtocol {
                    program: program.to_path_buf(),
                    reason: if err.is_empty() {
                        reason
                    } else {
                        format!("{reason}; stderr: {err}")
                    },
                }
            });
        }
    };

    drop(ours);
    match child.wait() {
        Ok(status) if status.success() => {
            let err = read_stderr();
            if !err.is_empty() {
                log::warn!("{FUSERMOUNT}: {err}");
            }
        }
        Ok(status) => log::warn!(
            "{FUSERMOUNT} sent the fd but exited with {status} (signal {:?}): {}",
            status.signal(),
            read_stderr()
        ),
        Err(e) => log::warn!("waiting for {FUSERMOUNT}: {e}"),
    }
    let mut guard = MountGuard::new(Some(path.to_path_buf()), MountMethod::Fusermount);
    guard.record_identity();
    Ok(Mount {
        dev: DevFuse::from_fd(fd),
        guard,
    })
}

/// Receives one fd sent with `SCM_RIGHTS` (and a 1-byte payload).
fn receive_fd(sock: &OwnedFd) -> Result<OwnedFd, String> {
    let mut byte = [0u8; 1];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    loop {
        let mut iov = [IoSliceMut::new(&mut byte)];
        let msg = match nix::sys::socket::recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(format!("recvmsg: {e}")),
        };
        let mut fds: Vec<RawFd> = Vec::new();
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(v) = c {
                    fds.extend(v);
                }
            }
        }
        let bytes = msg.bytes;
        // SAFETY: every fd in an SCM_RIGHTS message was just installed in our
        // table by the kernel and is owned by nobody else.
        let mut owned: Vec<OwnedFd> = fds
            .into_iter()
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .collect();
        if owned.len() > 1 {
            owned.truncate(1);
        }
        return match owned.pop() {
            Some(fd) => Ok(fd),
            None if bytes == 0 => Err("the socket closed without a message".into()),
            None => Err("a message came without an fd".into()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let o = MountOptions::default();
        assert!(o.nosuid && o.nodev);
        assert_eq!(o.source(), "fuse-wire");
        assert_eq!(o.fstype(), "fuse");
        assert_eq!(
            o.kernel_data(5, 0o40755, 0, 0).unwrap(),
            "fd=5,rootmode=40755,user_id=0,group_id=0"
        );
        assert_eq!(o.fusermount_opts().unwrap(), "rw,nosuid,nodev,fsname=fuse-wire");
        assert_eq!(o.ms_flags(), MsFlags::MS_NOSUID | MsFlags::MS_NODEV);
    }

    #[test]
    fn parse_full_list() {
        let o = MountOptions::parse_opts(
            "ro,fsname=myfs,subtype=hello,allow_other,default_permissions,max_read=65536,noexec,\
             noatime,nodiratime,sync,dirsync,suid,dev,auto_unmount",
        )
        .unwrap();
        assert_eq!(o.fsname.as_deref(), Some("myfs"));
        assert_eq!(o.subtype.as_deref(), Some("hello"));
        assert!(o.read_only && o.allow_other && o.default_permissions && o.auto_unmount);
        assert!(!o.nosuid && !o.nodev);
        assert_eq!(o.max_read, Some(65536));
        assert_eq!(o.fstype(), "fuse.hello");
        assert_eq!(o.source(), "myfs");
        assert_eq!(
            o.kernel_data(7, 0o40700, 1000, 100).unwrap(),
            "fd=7,rootmode=40700,user_id=1000,group_id=100,allow_other,default_permissions,max_read=65536"
        );
        assert_eq!(
            o.fusermount_opts().unwrap(),
            "ro,noexec,noatime,nodiratime,sync,dirsync,fsname=myfs,subtype=hello,allow_other,\
             default_permissions,max_read=65536,auto_unmount"
        );
        assert_eq!(
            o.ms_flags(),
            MsFlags::MS_RDONLY
                | MsFlags::MS_NOEXEC
                | MsFlags::MS_NOATIME
                | MsFlags::MS_NODIRATIME
                | MsFlags::MS_SYNCHRONOUS
                | MsFlags::MS_DIRSYNC
        );
    }

    #[test]
    fn later_options_win_and_empty_items_are_skipped() {
        let o = MountOptions::parse_opts(",ro,,rw,noexec,exec,").unwrap();
        assert!(!o.read_only && !o.noexec);
        assert_eq!(MountOptions::parse_opts("").unwrap(), MountOptions::default());
    }

    #[test]
    fn subtype_is_default_fsname() {
        let o = MountOptions::parse_opts("subtype=memfs").unwrap();
        assert_eq!(o.source(), "memfs");
        assert_eq!(
            o.fusermount_opts().unwrap(),
            "rw,nosuid,nodev,fsname=memfs,subtype=memfs"
        );
    }

    #[test]
    fn allow_root_mounts_allow_other() {
        let o = MountOptions::parse_opts("allow_root").unwrap();
        assert!(o.allow_root && !o.allow_other);
        assert_eq!(
            o.kernel_data(3, 0o40755, 0, 0).unwrap(),
            "fd=3,rootmode=40755,user_id=0,group_id=0,allow_other"
        );
        let both = MountOptions::parse_opts("allow_root,allow_other").unwrap();
        assert!(
            matches!(both.validate(), Err(MountError::InvalidOption { option, .. }) if option == "allow_root")
        );
    }

    #[test]
    fn unknown_option_is_named() {
        let e = MountOptions::parse_opts("ro,source=/x,frobnicate").unwrap_err();
        assert!(
            matches!(&e, MountError::UnknownOption(o) if o == "source=/x"),
            "{e}"
        );
        assert_eq!(e.to_string(), "unknown mount option `source=/x`");
    }

    #[test]
    fn parse_known_returns_the_rest_in_order() {
        let (o, rest) =
            MountOptions::parse_known("source=/srv,ro,timeout=1.5,fsname=pt,cache,subtype=passthrough")
                .unwrap();
        assert_eq!(rest, vec!["source=/srv", "timeout=1.5", "cache"]);
        assert!(o.read_only);
        assert_eq!(o.fsname.as_deref(), Some("pt"));
        assert_eq!(o.fstype(), "fuse.passthrough");
        // Known options with bad values are still errors.
        assert!(MountOptions::parse_known("max_read=lots,foo").is_err());
    }

    #[test]
    fn bad_values() {
        for (opts, option) in [
            ("max_read=abc", "max_read"),
            ("max_read=-1", "max_read"),
            ("max_read=0", "max_read"),
            ("fsname", "fsname"),
            ("fsname=", "fsname"),
            ("ro=1", "ro"),
            ("subtype=a.b", "subtype"),
            ("fd=3", "fd"),
            ("rootmode=40000", "rootmode"),
            ("user_id=0", "user_id"),
            ("group_id=0", "group_id"),
            ("blksize=4096", "blksize"),
        ] {
            let r = MountOptions::parse_opts(opts).and_then(|o| o.validate().map(|_| o));
            match r {
                Err(MountError::InvalidOption { option: o, .. }) => assert_eq!(o, option, "{opts}"),
                other => panic!("{opts}: expected InvalidOption({option}), got {other:?}"),
            }
        }
    }

    #[test]
    fn commas_and_nul_in_fields_are_refused() {
        let mut o = MountOptions {
            fsname: Some("a,allow_other".into()),
            ..Default::default()
        };
        assert!(matches!(
            o.kernel_data(3, 0o40755, 0, 0),
            Err(MountError::InvalidOption { .. })
        ));
        assert!(matches!(
            o.fusermount_opts(),
            Err(MountError::InvalidOption { .. })
        ));
        o.fsname = Some("a\0b".into());
        assert!(matches!(o.validate(), Err(MountError::InvalidOption { .. })));
        o.fsname = None;
        o.subtype = Some("x,y".into());
        assert!(matches!(o.validate(), Err(MountError::InvalidOption { .. })));
    }

    #[test]
    fn blksize_needs_blkdev() {
        let e = MountOptions::parse_opts("blksize=4096")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("fuseblk"), "{e}");
        let o = MountOptions::parse_opts("blkdev,fsname=/dev/loop0,blksize=4096,subtype=ext").unwrap();
        assert_eq!(o.fstype(), "fuseblk.ext");
        assert_eq!(
            o.kernel_data(4, 0o40755, 0, 0).unwrap(),
            "fd=4,rootmode=40755,user_id=0,group_id=0,blksize=4096"
        );
        assert_eq!(
            o.fusermount_opts().unwrap(),
            "rw,nosuid,nodev,fsname=/dev/loop0,subtype=ext,blkdev,blksize=4096"
        );
        let bad = MountOptions::parse_opts("blkdev,fsname=/dev/loop0,blksize=1000").unwrap();
        assert!(bad.validate().is_err());
    }

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
