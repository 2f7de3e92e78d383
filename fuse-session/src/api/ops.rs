//! Typed arguments of [`crate::Filesystem`] methods: open flags with their
//! access mode, rename flags, the changes of a SETATTR as one `Option` per
//! field, and one request value for each operation with more arguments
//! than fit a readable signature (READ, WRITE, RELEASE, CREATE, MKNOD,
//! RENAME, SETXATTR, locks, IOCTL, POLL, FALLOCATE, LSEEK,
//! COPY_FILE_RANGE, STATX).
//!
//! The values are built by the session from the kernel's structs; their
//! fields are public.

use crate::attr::{FileAttr, FileKind, time_from_wire};
pub use crate::payload::WriteData;
use crate::types::{FileHandle, Inode, Lock, LockOwner, PollHandle};
use fuse_proto::abi::SetattrIn;
use fuse_proto::flags::{IoctlFlags, SetattrValid, SetxattrFlags, WriteFlags};
use std::ffi::CStr;
use std::time::SystemTime;

/// How a file was opened: `O_RDONLY`, `O_WRONLY` or `O_RDWR`.
///
/// `ReadOnly` and `WriteOnly`, the old names of `Read` and `Write`, still
/// work (deprecated), in expressions and patterns:
///
/// ```
/// use fuse_session::{AccessMode, OpenFlags};
///
/// let mode = OpenFlags::from_bits(libc::O_RDONLY).access_mode();
/// assert_eq!(mode, AccessMode::Read);
/// #[allow(deprecated)]
/// let old = matches!(mode, AccessMode::ReadOnly) && AccessMode::WriteOnly == AccessMode::Write;
/// assert!(old);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessMode {
    /// `O_RDONLY`.
    Read,
    /// `O_WRONLY`.
    Write,
    /// `O_RDWR`.
    ReadWrite,
}

#[allow(non_upper_case_globals)]
impl AccessMode {
    /// The old name of [`AccessMode::Read`].
    #[deprecated(note = "renamed `AccessMode::Read`")]
    pub const ReadOnly: AccessMode = AccessMode::Read;
    /// The old name of [`AccessMode::Write`].
    #[deprecated(note = "renamed `AccessMode::Write`")]
    pub const WriteOnly: AccessMode = AccessMode::Write;

    /// Whether the mode allows reading.
    pub fn can_read(self) -> bool {
        self != AccessMode::Write
    }

    /// Whether the mode allows writing.
    pub fn can_write(self) -> bool {
        self != AccessMode::Read
    }
}

/// The `open(2)` flags of an OPEN, CREATE or READ/WRITE/RELEASE, as the kernel
/// passes them on.
///
/// The kernel strips `O_CREAT`, `O_EXCL` and `O_NOCTTY` from OPEN (it
/// handles them itself), and strips `O_TRUNC` too unless the filesystem
/// asked for `ATOMIC_O_TRUNC` (not wanted by default: the kernel then
/// follows the open with a SETATTR of size 0). With the writeback cache an `O_WRONLY` open
/// arrives as `O_RDWR` (the kernel may need to read pages it caches).
///
/// ```
/// use fuse_session::{AccessMode, OpenFlags};
///
/// let f = OpenFlags::from_bits(libc::O_WRONLY | libc::O_APPEND);
/// assert_eq!(f.access_mode(), AccessMode::Write);
/// assert!(f.append() && !f.truncate());
/// // 3: no reading or writing, but both permissions needed (ioctl opens).
/// assert_eq!(OpenFlags::from_bits(3).access_mode(), AccessMode::ReadWrite);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct OpenFlags(i32);

impl OpenFlags {
    /// From the raw flags.
    pub const fn from_bits(bits: i32) -> OpenFlags {
        OpenFlags(bits)
    }

    /// The raw flags.
    pub const fn bits(self) -> i32 {
        self.0
    }

    /// Read, write or both: what the open needs permission for.
    ///
    /// The fourth value, 3, opens for neither (ioctls only) but needs both
    /// read and write permission on Linux, so it reads as `ReadWrite`.
    pub const fn access_mode(self) -> AccessMode {
        match self.0 & libc::O_ACCMODE {
            libc::O_RDONLY => AccessMode::Read,
            libc::O_WRONLY => AccessMode::Write,
            _ => AccessMode::ReadWrite,
        }
    }

    /// Whether all of `flags` (`libc::O_*`) are set.
    pub const fn contains(self, flags: i32) -> bool {
        self.0 & flags == flags
    }

    /// `O_TRUNC` (only seen in OPEN when `ATOMIC_O_TRUNC` was granted, and in
    /// CREATE).
    pub const fn truncate(self) -> bool {
        self.contains(libc::O_TRUNC)
    }

    /// `O_APPEND`.
    pub const fn append(self) -> bool {
        self.contains(libc::O_APPEND)
    }

    /// `O_CREAT` (CREATE and atomic open only).
    pub const fn create(self) -> bool {
        self.contains(libc::O_CREAT)
    }

    /// `O_EXCL` (CREATE and atomic open only).
    pub const fn exclusive(self) -> bool {
        self.contains(libc::O_EXCL)
    }

    /// `O_DIRECT`.
    pub const fn direct(self) -> bool {
        self.contains(libc::O_DIRECT)
    }

    /// `O_SYNC` or `O_DSYNC`.
    pub const fn sync(self) -> bool {
        self.0 & (libc::O_SYNC | libc::O_DSYNC) != 0
    }

    /// `O_NONBLOCK`.
    pub const fn nonblock(self) -> bool {
        self.contains(libc::O_NONBLOCK)
    }
}

impl std::fmt::Debug for OpenFlags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "OpenFlags({:?}, {:#o})",
            self.access_mode(),
            self.0 & !libc::O_ACCMODE
        )
    }
}

impl From<i32> for OpenFlags {
    fn from(bits: i32) -> Self {
        OpenFlags(bits)
    }
}

bitflags::bitflags! {
    /// `renameat2(2)` flags.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct RenameFlags: u32 {
        /// `RENAME_NOREPLACE`: fail with EEXIST if the target exists.
        const NOREPLACE = 1 << 0;
        /// `RENAME_EXCHANGE`: swap the two names atomically.
        const EXCHANGE = 1 << 1;
        /// `RENAME_WHITEOUT`: leave a whiteout at the source (overlay filesystems).
        const WHITEOUT = 1 << 2;
    }
}

/// A READ.
#[derive(Clone, Copy, Debug)]
pub struct ReadRequest {
    /// Where to start.
    pub offset: u64,
    /// Most bytes to return.
    pub size: u32,
    /// The flags the file was opened with.
    pub flags: OpenFlags,
    /// The lock owner, when the kernel sent one (`FUSE_READ_LOCKOWNER`).
    pub lock_owner: Option<LockOwner>,
}

/// A WRITE.
#[derive(Clone, Copy, Debug)]
pub struct WriteRequest<'a> {
    /// Where to write (for a file opened with `O_APPEND`: the end of the
    /// file as the kernel's cached size says).
    pub offset: u64,
    /// The bytes: in memory, or (with
    /// [`SessionConfig::splice_write`](crate::SessionConfig), for large
    /// WRITEs) still in the worker's pipe. See [`WriteData`].
    pub data: WriteData<'a>,
    /// `FUSE_WRITE_CACHE` (from the page cache: the caller's identity is not
    /// the writer's), `FUSE_WRITE_KILL_SUIDGID`, …
    pub write_flags: WriteFlags,
    /// The flags the file was opened with.
    pub flags: OpenFlags,
    /// The lock owner, when the kernel sent one.
    pub lock_owner: Option<LockOwner>,
}

/// A RELEASE: the last reference to an open file is gone.
#[derive(Clone, Copy, Debug)]
pub struct ReleaseRequest {
    /// The flags the file was opened with.
    pub flags: OpenFlags,
    /// The lock owner whose locks are to be dropped.
    pub lock_owner: Option<LockOwner>,
    /// Flush as well (`FUSE_RELEASE_FLUSH`: no FLUSH was sent).
    pub flush: bool,
    /// Drop the `flock` of `lock_owner` (`FUSE_RELEASE_FLOCK_UNLOCK`).
    pub flock_release: bool,
}

/// What a CREATE, TMPFILE or atomic open asks for.
#[derive(Clone, Copy, Debug)]
pub struct CreateRequest {
    /// Mode of a new file: type bits and permissions, the caller's umask
    /// already applied (unless the filesystem asked for `DONT_MASK`; then
    /// [`crate::RequestContext::umask`] gives it). Create with exactly this
    /// mode: the thread serving the request has a umask of 0 of its own
    /// (see [`crate::umask`]), so the daemon's umask takes nothing off. The
    /// same holds for MKNOD, MKDIR and TMPFILE modes, in every layer.
    pub mode: u32,
    /// The open flags (`O_CREAT`, `O_EXCL`, `O_TRUNC` included).
    pub flags: OpenFlags,
}

impl CreateRequest {
    /// The permission bits of `mode`.
    pub fn perm(&self) -> u16 {
        (self.mode & 0o7777) as u16
    }
}

/// What a MKNOD asks for.
#[derive(Clone, Copy, Debug)]
pub struct MknodRequest {
    /// Type bits and permissions (umask as for [`CreateRequest::mode`]:
    /// create with exactly this mode).
    pub mode: u32,
    /// The device number of a device node.
    pub rdev: u32,
}

impl MknodRequest {
    /// The kind of node to make (`None`: type bits the kernel would not send).
    pub fn kind(&self) -> Option<FileKind> {
        FileKind::from_mode(self.mode)
    }

    /// The permission bits of `mode`.
    pub fn perm(&self) -> u16 {
        (self.mode & 0o7777) as u16
    }
}

/// A RENAME or RENAME2.
#[derive(Clone, Copy, Debug)]
pub struct RenameRequest<'a> {
    /// The directory holding the name.
    pub parent: Inode,
    /// The name.
    pub name: &'a CStr,
    /// The directory to move it to (may be `parent`).
    pub newparent: Inode,
    /// The new name.
    pub newname: &'a CStr,
    /// `renameat2` flags (empty for RENAME).
    pub flags: RenameFlags,
}

/// A SETXATTR.
#[derive(Clone, Copy, Debug)]
pub struct SetxattrRequest<'a> {
    /// The value.
    pub value: &'a [u8],
    /// `XATTR_CREATE`, `XATTR_REPLACE` or 0.
    pub flags: i32,
    /// `FUSE_SETXATTR_ACL_KILL_SGID` (with `SETXATTR_EXT`).
    pub setxattr_flags: SetxattrFlags,
}

/// A GETLK, SETLK or SETLKW.
#[derive(Clone, Copy, Debug)]
pub struct LockRequest {
    /// Who holds or asks for the lock.
    pub owner: LockOwner,
    /// The range and type.
    pub lock: Lock,
    /// SETLKW: wait until the lock can be taken.
    pub sleep: bool,
    /// A BSD `flock` rather than a POSIX record lock.
    pub flock: bool,
}

/// An IOCTL.
#[derive(Clone, Copy, Debug)]
pub struct IoctlRequest<'a> {
    /// `FUSE_IOCTL_*` flags.
    pub flags: IoctlFlags,
    /// The command.
    pub cmd: u32,
    /// The argument (a pointer in the caller's memory, or a value).
    pub arg: u64,
    /// The input data.
    pub in_data: &'a [u8],
    /// Room for output.
    pub out_size: u32,
}

/// A POLL.
#[derive(Clone, Copy, Debug)]
pub struct PollRequest {
    /// When present, notify it once the file is ready
    /// ([`crate::Notifier::poll_wakeup`]).
    pub kh: Option<PollHandle>,
    /// The `POLL*` events asked for.
    pub events: u32,
}

/// A FALLOCATE.
#[derive(Clone, Copy, Debug)]
pub struct FallocateRequest {
    /// Start of the range.
    pub offset: u64,
    /// Length of the range.
    pub length: u64,
    /// `fallocate(2)` mode (`FALLOC_FL_*`).
    pub mode: i32,
}

/// An LSEEK.
#[derive(Clone, Copy, Debug)]
pub struct LseekRequest {
    /// The offset to start from.
    pub offset: u64,
    /// `SEEK_DATA`, `SEEK_HOLE` (the kernel answers the others itself).
    pub whence: i32,
}

/// A COPY_FILE_RANGE or COPY_FILE_RANGE_64.
#[derive(Clone, Copy, Debug)]
pub struct CopyFileRangeRequest {
    /// The source.
    pub ino_in: Inode,
    /// Its open file.
    pub fh_in: FileHandle,
    /// Where to read.
    pub off_in: u64,
    /// The destination.
    pub ino_out: Inode,
    /// Its open file.
    pub fh_out: FileHandle,
    /// Where to write.
    pub off_out: u64,
    /// How many bytes.
    pub len: u64,
    /// `copy_file_range(2)` flags (0 today).
    pub flags: u64,
}

/// A STATX.
#[derive(Clone, Copy, Debug)]
pub struct StatxRequest {
    /// `AT_STATX_*` sync flags.
    pub flags: u32,
    /// The `STATX_*` fields wanted.
    pub mask: u32,
}

/// A time SETATTR asks for: a given one, or "now" (`utimensat` with
/// `UTIME_NOW`, `touch` without `-d`), which the filesystem reads from its
/// own clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimeOrNow {
    /// This time.
    SpecificTime(SystemTime),
    /// The filesystem's current time.
    Now,
}

impl TimeOrNow {
    /// The time, with `Now` read from the system clock.
    pub fn resolve(self) -> SystemTime {
        match self {
            TimeOrNow::SpecificTime(t) => t,
            TimeOrNow::Now => SystemTime::now(),
        }
    }
}

/// The changes a SETATTR asks for: each field that is `Some` is to be set.
///
/// The kernel sends SETATTR for `chmod`, `chown`, `truncate`/`ftruncate`
/// (and for `open(O_TRUNC)` unless the filesystem asked for
/// `ATOMIC_O_TRUNC`), `utimensat`/`touch`, and, with the writeback cache,
/// to store times it kept. Reply with the attributes after the change.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct SetattrRequest {
    /// New permission bits (set-ID and sticky included).
    pub perm: Option<u16>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend with zeros).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeOrNow>,
    /// New modification time.
    pub mtime: Option<TimeOrNow>,
    /// New change time (sent by the kernel only with the writeback cache).
    pub ctime: Option<SystemTime>,
    /// The open file the change comes through (`ftruncate`, `fchmod`…).
    pub fh: Option<FileHandle>,
    /// The lock owner of a truncation through an open file.
    pub lock_owner: Option<LockOwner>,
    /// Clear set-user-ID and set-group-ID (`FATTR_KILL_SUIDGID`; sent only
    /// when the filesystem asked for `HANDLE_KILLPRIV_V2`).
    pub kill_suidgid: bool,
    raw: SetattrIn,
}

impl SetattrRequest {
    /// The typed view of the kernel's `fuse_setattr_in`.
    pub fn from_raw(raw: &SetattrIn) -> SetattrRequest {
        let v = SetattrValid::from_bits_retain(raw.valid);
        // FATTR_ATIME_NOW/MTIME_NOW qualify FATTR_ATIME/MTIME, never come alone.
        let time = |set: SetattrValid, now: SetattrValid, secs: u64, nanos: u32| {
            if !v.contains(set) {
                None
            } else if v.contains(now) {
                Some(TimeOrNow::Now)
            } else {
                Some(TimeOrNow::SpecificTime(time_from_wire(secs, nanos)))
            }
        };
        SetattrRequest {
            perm: v
                .contains(SetattrValid::MODE)
                .then_some((raw.mode & 0o7777) as u16),
            uid: v.contains(SetattrValid::UID).then_some(raw.uid),
            gid: v.contains(SetattrValid::GID).then_some(raw.gid),
            size: v.contains(SetattrValid::SIZE).then_some(raw.size),
            atime: time(
                SetattrValid::ATIME,
                SetattrValid::ATIME_NOW,
                raw.atime,
                raw.atimensec,
            ),
            mtime: time(
                SetattrValid::MTIME,
                SetattrValid::MTIME_NOW,
                raw.mtime,
                raw.mtimensec,
            ),
            ctime: v
                .contains(SetattrValid::CTIME)
                .then(|| time_from_wire(raw.ctime, raw.ctimensec)),
            fh: v.contains(SetattrValid::FH).then_some(FileHandle(raw.fh)),
            lock_owner: v
                .contains(SetattrValid::LOCKOWNER)
                .then_some(LockOwner(raw.lock_owner)),
            kill_suidgid: v.contains(SetattrValid::KILL_SUIDGID),
            raw: *raw,
        }
    }

    /// The kernel's struct as it arrived (`valid` says which fields apply;
    /// see [`SetattrValid`]).
    pub fn raw(&self) -> &SetattrIn {
        &self.raw
    }

    /// Which fields the kernel marked valid.
    pub fn valid(&self) -> SetattrValid {
        SetattrValid::from_bits_retain(self.raw.valid)
    }

    /// Applies the ownership, permission, size and time changes to `attr`
    /// (`Now` read once from the system clock), and sets its ctime to the
    /// requested one, else to now. A new size also
    /// recomputes `blocks` (the 512-byte blocks the size takes, as
    /// [`FileAttr::with_size`] does) and sets mtime to now; without a new
    /// size `blocks` is left as it is. Checks nothing: the permission
    /// rules are the filesystem's to apply before.
    pub fn apply_to(&self, attr: &mut FileAttr) {
        let now = SystemTime::now();
        let at = |t: TimeOrNow| match t {
            TimeOrNow::SpecificTime(t) => t,
            TimeOrNow::Now => now,
        };
        if let Some(p) = self.perm {
            attr.perm = p & 0o7777;
        }
        if let Some(u) = self.uid {
            attr.uid = u;
        }
        if let Some(g) = self.gid {
            attr.gid = g;
        }
        if let Some(s) = self.size {
            *attr = attr.with_size(s);
            attr.mtime = now;
        }
        if let Some(t) = self.atime {
            attr.atime = at(t);
        }
        if let Some(t) = self.mtime {
            attr.mtime = at(t);
        }
        attr.ctime = self.ctime.unwrap_or(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn setattr_now_wins_over_a_given_time() {
        let raw = SetattrIn {
            valid: (SetattrValid::ATIME | SetattrValid::ATIME_NOW | SetattrValid::MTIME | SetattrValid::SIZE)
                .bits(),
            mtime: 10,
            size: 0,
            ..Default::default()
        };
        let r = SetattrRequest::from_raw(&raw);
        assert_eq!(r.atime, Some(TimeOrNow::Now));
        assert_eq!(
            r.mtime,
            Some(TimeOrNow::SpecificTime(UNIX_EPOCH + Duration::from_secs(10)))
        );
        assert_eq!((r.size, r.perm, r.fh), (Some(0), None, None));
    }
}
