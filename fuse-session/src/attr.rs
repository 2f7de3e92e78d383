//! Attributes as a filesystem thinks of them: [`FileAttr`] with
//! [`SystemTime`] times and a [`FileKind`], and [`SetattrRequest`], the
//! changes a SETATTR asks for as one `Option` per field.
//!
//! Both convert to and from the kernel's structs (`fuse_attr`,
//! `fuse_setattr_in` in [`fuse_proto::abi`]) for code that wants the raw
//! form; the conversions keep every bit (times before 1970 included).

use crate::types::{FileHandle, LockOwner};
use fuse_proto::abi::{Attr, SetattrIn};
use fuse_proto::flags::SetattrValid;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The type of a node, as the `S_IFMT` bits of its mode say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// A regular file (`S_IFREG`).
    RegularFile,
    /// A directory (`S_IFDIR`).
    Directory,
    /// A symbolic link (`S_IFLNK`).
    Symlink,
    /// A character device (`S_IFCHR`).
    CharDevice,
    /// A block device (`S_IFBLK`).
    BlockDevice,
    /// A named pipe (`S_IFIFO`).
    NamedPipe,
    /// A Unix-domain socket (`S_IFSOCK`).
    Socket,
}

impl FileKind {
    /// The kind of a `st_mode`-style mode, `None` if its type bits name none.
    pub const fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::RegularFile,
            libc::S_IFDIR => FileKind::Directory,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            libc::S_IFIFO => FileKind::NamedPipe,
            libc::S_IFSOCK => FileKind::Socket,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits of this kind (`S_IFREG`, `S_IFDIR`, …).
    pub const fn mode_bits(self) -> u32 {
        match self {
            FileKind::RegularFile => libc::S_IFREG,
            FileKind::Directory => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::CharDevice => libc::S_IFCHR,
            FileKind::BlockDevice => libc::S_IFBLK,
            FileKind::NamedPipe => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
        }
    }

    /// The `d_type` of a directory record (`DT_REG`, `DT_DIR`, …).
    pub const fn dirent_type(self) -> u32 {
        self.mode_bits() >> 12
    }
}

impl From<std::fs::FileType> for FileKind {
    fn from(t: std::fs::FileType) -> Self {
        use std::os::unix::fs::FileTypeExt;
        if t.is_dir() {
            FileKind::Directory
        } else if t.is_symlink() {
            FileKind::Symlink
        } else if t.is_char_device() {
            FileKind::CharDevice
        } else if t.is_block_device() {
            FileKind::BlockDevice
        } else if t.is_fifo() {
            FileKind::NamedPipe
        } else if t.is_socket() {
            FileKind::Socket
        } else {
            FileKind::RegularFile
        }
    }
}

/// The attributes of a node: what `stat(2)` will show.
///
/// `ino` is the number `stat` reports (`st_ino`); it may differ from the
/// node id the kernel uses in requests (the [`crate::Inode`] of an
/// [`crate::Entry`]), though most filesystems make them equal.
///
/// ```
/// use fuse_session::{FileAttr, FileKind};
///
/// let attr = FileAttr::new(2, FileKind::RegularFile, 0o644).with_size(5000);
/// assert_eq!((attr.nlink, attr.blocks), (1, 10));
/// assert_eq!(attr.to_abi().mode, libc::S_IFREG | 0o644);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileAttr {
    /// The inode number `stat` reports.
    pub ino: u64,
    /// Size in bytes. For a regular file the kernel reads no further than
    /// this unless the file is opened with `FopenFlags::DIRECT_IO`: content
    /// whose size is not known in advance needs that flag (or a size that is
    /// at least as large as the content).
    pub size: u64,
    /// Blocks of 512 bytes allocated.
    pub blocks: u64,
    /// Last access.
    pub atime: SystemTime,
    /// Last modification of the content.
    pub mtime: SystemTime,
    /// Last change of the attributes.
    pub ctime: SystemTime,
    /// The type.
    pub kind: FileKind,
    /// Permission bits, set-ID and sticky bits included (`0o7777` at most).
    pub perm: u16,
    /// Hard links (directories: 2 plus their subdirectories).
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number of a character or block device.
    pub rdev: u32,
    /// Preferred I/O size (`st_blksize`; 0 lets the kernel choose).
    pub blksize: u32,
    /// `fuse_attr.flags` (`FUSE_ATTR_SUBMOUNT`, `FUSE_ATTR_DAX`); 0 normally.
    pub flags: u32,
}

/// All zero: a regular file with no permissions, owned by root, times at
/// 1970. Prefer [`FileAttr::new`]; this is for struct-update syntax.
impl Default for FileAttr {
    fn default() -> Self {
        FileAttr {
            ino: 0,
            size: 0,
            blocks: 0,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            kind: FileKind::RegularFile,
            perm: 0,
            nlink: 0,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 0,
            flags: 0,
        }
    }
}

/// The time [`FileAttr::new`] stamps: fixed for the life of the process.
fn creation_time() -> SystemTime {
    static T: OnceLock<SystemTime> = OnceLock::new();
    *T.get_or_init(SystemTime::now)
}

impl FileAttr {
    /// Attributes of a node of `kind` with permissions `perm`: size 0,
    /// owned by this process's effective user and group, one link (two
    /// for a directory), `blksize` 4096, and all three times set to the
    /// moment the first `FileAttr::new` of this process ran (a fixed value,
    /// so that attributes the kernel cached stay equal to fresh ones).
    pub fn new(ino: u64, kind: FileKind, perm: u16) -> FileAttr {
        let t = creation_time();
        // SAFETY: geteuid and getegid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        FileAttr {
            ino,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            kind,
            perm: perm & 0o7777,
            nlink: if kind == FileKind::Directory { 2 } else { 1 },
            uid,
            gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// The same attributes with `size` bytes (and the 512-byte blocks they
    /// take).
    pub fn with_size(mut self, size: u64) -> FileAttr {
        self.size = size;
        self.blocks = size.div_ceil(512);
        self
    }

    /// The full `st_mode`: type bits and permissions.
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | u32::from(self.perm & 0o7777)
    }

    /// The kernel's form, `fuse_attr`.
    pub fn to_abi(&self) -> Attr {
        let (atime, atimensec) = time_to_wire(self.atime);
        let (mtime, mtimensec) = time_to_wire(self.mtime);
        let (ctime, ctimensec) = time_to_wire(self.ctime);
        Attr {
            ino: self.ino,
            size: self.size,
            blocks: self.blocks,
            atime,
            mtime,
            ctime,
            atimensec,
            mtimensec,
            ctimensec,
            mode: self.mode(),
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            blksize: self.blksize,
            flags: self.flags,
        }
    }

    /// From the kernel's form; `None` if its mode has no valid type bits.
    pub fn from_abi(a: &Attr) -> Option<FileAttr> {
        Some(FileAttr {
            ino: a.ino,
            size: a.size,
            blocks: a.blocks,
            atime: time_from_wire(a.atime, a.atimensec),
            mtime: time_from_wire(a.mtime, a.mtimensec),
            ctime: time_from_wire(a.ctime, a.ctimensec),
            kind: FileKind::from_mode(a.mode)?,
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            blksize: a.blksize,
            flags: a.flags,
        })
    }

    /// From a `stat` result (a file of unknown type reads as a regular file).
    pub fn from_stat(st: &libc::stat) -> FileAttr {
        FileAttr {
            ino: st.st_ino,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: time_from_wire(st.st_atime as u64, st.st_atime_nsec as u32),
            mtime: time_from_wire(st.st_mtime as u64, st.st_mtime_nsec as u32),
            ctime: time_from_wire(st.st_ctime as u64, st.st_ctime_nsec as u32),
            kind: FileKind::from_mode(st.st_mode).unwrap_or(FileKind::RegularFile),
            perm: (st.st_mode & 0o7777) as u16,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev as u32,
            blksize: st.st_blksize as u32,
            flags: 0,
        }
    }
}

impl From<&std::fs::Metadata> for FileAttr {
    fn from(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        FileAttr {
            ino: m.ino(),
            size: m.size(),
            blocks: m.blocks(),
            atime: time_from_wire(m.atime() as u64, m.atime_nsec() as u32),
            mtime: time_from_wire(m.mtime() as u64, m.mtime_nsec() as u32),
            ctime: time_from_wire(m.ctime() as u64, m.ctime_nsec() as u32),
            kind: m.file_type().into(),
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            blksize: m.blksize() as u32,
            flags: 0,
        }
    }
}

impl From<FileAttr> for Attr {
    fn from(a: FileAttr) -> Attr {
        a.to_abi()
    }
}

/// A time as the kernel carries it: seconds since 1970 as a signed 64-bit
/// number (in a `u64` field) and nanoseconds `0..1e9` added to them.
pub fn time_to_wire(t: SystemTime) -> (u64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs(), d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            let mut secs = -(d.as_secs() as i64);
            let mut nanos = d.subsec_nanos();
            if nanos > 0 {
                secs -= 1;
                nanos = 1_000_000_000 - nanos;
            }
            (secs as u64, nanos)
        }
    }
}

/// The inverse of [`time_to_wire`] (nanoseconds beyond a second are clamped;
/// a time the platform cannot represent becomes 1970).
pub fn time_from_wire(secs: u64, nanos: u32) -> SystemTime {
    let secs = secs as i64;
    let nanos = Duration::from_nanos(u64::from(nanos.min(999_999_999)));
    let base = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(secs as u64))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    };
    base.and_then(|b| b.checked_add(nanos)).unwrap_or(UNIX_EPOCH)
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
    /// requested one or, if anything changed, to now. Checks nothing: the
    /// permission rules are the filesystem's to apply before.
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

    #[test]
    fn times_round_trip_before_and_after_1970() {
        for (s, n) in [
            (0i64, 0u32),
            (1, 5),
            (-1, 0),
            (-1, 999_999_999),
            (-12345, 1),
            (1 << 40, 7),
        ] {
            let t = time_from_wire(s as u64, n);
            assert_eq!(time_to_wire(t), (s as u64, n), "{s}.{n}");
        }
    }

    #[test]
    fn attr_round_trips_through_the_abi() {
        let mut a = FileAttr::new(7, FileKind::Symlink, 0o4755).with_size(3);
        a.atime = UNIX_EPOCH - Duration::from_nanos(1);
        let raw = a.to_abi();
        assert_eq!(raw.mode, libc::S_IFLNK | 0o4755);
        assert_eq!(FileAttr::from_abi(&raw), Some(a));
        assert_eq!(FileAttr::from_abi(&Attr { mode: 0o644, ..raw }), None);
    }

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
