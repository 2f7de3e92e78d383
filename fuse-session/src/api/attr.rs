//! Attributes as a filesystem thinks of them: [`FileAttr`] with
//! [`SystemTime`] times and a [`FileKind`], the time conversions to and
//! from the kernel's seconds + nanoseconds, and the whole filesystem's
//! statistics, [`Statfs`].
//!
//! A `FileAttr` converts to and from the kernel's `fuse_attr` (in
//! [`fuse_proto::abi`]) for code that wants the raw form; the conversion
//! keeps every bit (times before 1970 included). A `Statfs` converts to
//! and from `fuse_kstatfs` the same way. The changes a SETATTR asks for
//! are [`crate::ops::SetattrRequest`].

use fuse_proto::abi::{Attr, Kstatfs};
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
/// 1970. Prefer [`FileAttr::new`] or [`FileAttr::fixed`]; this is for
/// struct-update syntax.
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

/// The time [`FileAttr::fixed`] stamps: the moment of its first call in
/// the process.
fn fixed_time() -> SystemTime {
    static T: OnceLock<SystemTime> = OnceLock::new();
    *T.get_or_init(SystemTime::now)
}

impl FileAttr {
    /// Attributes of a file created now: a node of `kind` with permissions
    /// `perm`, size 0, owned by this process's effective user and group,
    /// one link (two for a directory), `blksize` 4096, and all three times
    /// now (one read of the system clock, a vDSO call).
    ///
    /// Make them once, when the file is created, and keep them (change
    /// them as the file changes, e.g. with
    /// [`SetattrRequest::apply_to`](crate::SetattrRequest::apply_to)). A
    /// `getattr` that builds attributes afresh at every call wants
    /// [`FileAttr::fixed`] instead: with `new` its times would move at
    /// every `stat`, and programs such as `tar` take that for a file
    /// changing under them.
    ///
    /// ```
    /// use fuse_session::{FileAttr, FileKind};
    /// use std::time::{Duration, SystemTime};
    ///
    /// let root = FileAttr::new(1, FileKind::Directory, 0o755);
    /// std::thread::sleep(Duration::from_millis(2));
    /// // Later, a file is created: its times are its creation's, not the root's.
    /// let before = SystemTime::now();
    /// let file = FileAttr::new(2, FileKind::RegularFile, 0o644);
    /// let after = SystemTime::now();
    /// assert!(before <= file.mtime && file.mtime <= after);
    /// assert!(file.mtime > root.mtime);
    /// assert_eq!((file.atime, file.ctime), (file.mtime, file.mtime));
    /// ```
    pub fn new(ino: u64, kind: FileKind, perm: u16) -> FileAttr {
        Self::at(ino, kind, perm, SystemTime::now())
    }

    /// Attributes for a `getattr` that builds them afresh at every call,
    /// of something that does not change (a constant file, a generated
    /// directory): as [`FileAttr::new`], but all three times are the
    /// moment the first `FileAttr::fixed` of this process ran, so that
    /// every call gives the same attributes (and attributes the kernel
    /// cached stay equal to fresh ones).
    ///
    /// ```
    /// use fuse_session::{FileAttr, FileKind};
    /// use std::time::Duration;
    ///
    /// let first = FileAttr::fixed(2, FileKind::RegularFile, 0o444);
    /// std::thread::sleep(Duration::from_millis(2));
    /// assert_eq!(FileAttr::fixed(2, FileKind::RegularFile, 0o444), first);
    /// ```
    pub fn fixed(ino: u64, kind: FileKind, perm: u16) -> FileAttr {
        Self::at(ino, kind, perm, fixed_time())
    }

    /// As [`FileAttr::new`], with all three times `time` (an archive
    /// member's recorded mtime, say).
    pub fn at(ino: u64, kind: FileKind, perm: u16, time: SystemTime) -> FileAttr {
        // SAFETY: geteuid and getegid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        FileAttr {
            ino,
            size: 0,
            blocks: 0,
            atime: time,
            mtime: time,
            ctime: time,
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

/// Filesystem statistics: what `statfs(2)` and `df` show of the whole
/// filesystem (the kernel's `fuse_kstatfs`, whose fields these are). The
/// three block counts are in units of `frsize` bytes (of `bsize` when
/// `frsize` is 0, as the kernel reads it), so `df` shows `blocks ×
/// frsize` as the size.
///
/// ```
/// use fuse_session::Statfs;
///
/// // 1 GiB in 4 KiB blocks, a quarter of them used; 10,000 inodes, 9,000 free.
/// let st = Statfs::new()
///     .with_block_size(4096)
///     .with_blocks(262_144, 196_608, 196_608)
///     .with_files(10_000, 9_000);
/// assert_eq!(st.blocks * u64::from(st.frsize), 1 << 30);
/// assert_eq!((st.bsize, st.namelen), (4096, 255));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Statfs {
    /// Size of the filesystem, in blocks (`f_blocks`).
    pub blocks: u64,
    /// Free blocks (`f_bfree`).
    pub bfree: u64,
    /// Free blocks that unprivileged users may use (`f_bavail`, `df`'s
    /// "Avail"); at most `bfree`.
    pub bavail: u64,
    /// Inodes the filesystem can hold (`f_files`).
    pub files: u64,
    /// Free inodes (`f_ffree`).
    pub ffree: u64,
    /// Preferred I/O size in bytes (`f_bsize`), and the unit of the block
    /// counts when `frsize` is 0.
    pub bsize: u32,
    /// Longest name in bytes (`f_namelen`; 255 on most filesystems).
    pub namelen: u32,
    /// Unit of `blocks`, `bfree` and `bavail` in bytes (`f_frsize`);
    /// 0 means `bsize`.
    pub frsize: u32,
}

/// [`Statfs::new`].
impl Default for Statfs {
    fn default() -> Self {
        Statfs::new()
    }
}

impl Statfs {
    /// An empty filesystem: no blocks, no inodes, 512-byte blocks, names
    /// up to 255 bytes (what the default STATFS answer reports).
    pub const fn new() -> Statfs {
        Statfs {
            blocks: 0,
            bfree: 0,
            bavail: 0,
            files: 0,
            ffree: 0,
            bsize: 512,
            namelen: 255,
            frsize: 0,
        }
    }

    /// With blocks of `size` bytes: `bsize` and `frsize` both `size`.
    pub const fn with_block_size(mut self, size: u32) -> Statfs {
        self.bsize = size;
        self.frsize = size;
        self
    }

    /// With `total` blocks, of which `free` are free and `available` of
    /// those may be used by unprivileged users.
    pub const fn with_blocks(mut self, total: u64, free: u64, available: u64) -> Statfs {
        self.blocks = total;
        self.bfree = free;
        self.bavail = available;
        self
    }

    /// With room for `total` inodes, `free` of them free.
    pub const fn with_files(mut self, total: u64, free: u64) -> Statfs {
        self.files = total;
        self.ffree = free;
        self
    }

    /// With names up to `namelen` bytes.
    pub const fn with_namelen(mut self, namelen: u32) -> Statfs {
        self.namelen = namelen;
        self
    }

    /// The kernel's form, `fuse_kstatfs`.
    pub const fn to_abi(&self) -> Kstatfs {
        Kstatfs {
            blocks: self.blocks,
            bfree: self.bfree,
            bavail: self.bavail,
            files: self.files,
            ffree: self.ffree,
            bsize: self.bsize,
            namelen: self.namelen,
            frsize: self.frsize,
            padding: 0,
            spare: [0; 6],
        }
    }

    /// From the kernel's form (its padding and spare fields, which carry
    /// nothing, are dropped).
    pub const fn from_abi(st: &Kstatfs) -> Statfs {
        Statfs {
            blocks: st.blocks,
            bfree: st.bfree,
            bavail: st.bavail,
            files: st.files,
            ffree: st.ffree,
            bsize: st.bsize,
            namelen: st.namelen,
            frsize: st.frsize,
        }
    }
}

impl From<Statfs> for Kstatfs {
    fn from(st: Statfs) -> Kstatfs {
        st.to_abi()
    }
}

impl From<Kstatfs> for Statfs {
    fn from(st: Kstatfs) -> Statfs {
        Statfs::from_abi(&st)
    }
}

impl From<&Kstatfs> for Statfs {
    fn from(st: &Kstatfs) -> Statfs {
        Statfs::from_abi(st)
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
}
