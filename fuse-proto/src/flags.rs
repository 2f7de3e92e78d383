//! Bit flags of the protocol, one `bitflags` type per field that carries them.
//!
//! INIT flags are one `u64`: bits 0–31 travel in `flags`, bits 32–63 in
//! `flags2` shifted down by 32 ([`InitFlags::from_halves`], [`InitFlags::halves`]).
//! Values are those of `include/uapi/linux/fuse.h` at 7.45.

use bitflags::bitflags;

bitflags! {
    /// INIT capability flags (`FUSE_ASYNC_READ` … `FUSE_REQUEST_TIMEOUT`), both halves.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct InitFlags: u64 {
        /// `FUSE_ASYNC_READ`: asynchronous read requests.
        const ASYNC_READ = 1 << 0;
        /// `FUSE_POSIX_LOCKS`: remote POSIX file locking.
        const POSIX_LOCKS = 1 << 1;
        /// `FUSE_FILE_OPS`: file handle for fstat (never implemented by the kernel).
        const FILE_OPS = 1 << 2;
        /// `FUSE_ATOMIC_O_TRUNC`: the filesystem handles O_TRUNC in OPEN.
        const ATOMIC_O_TRUNC = 1 << 3;
        /// `FUSE_EXPORT_SUPPORT`: the filesystem handles lookups of "." and "..".
        const EXPORT_SUPPORT = 1 << 4;
        /// `FUSE_BIG_WRITES`: writes larger than 4 KiB.
        const BIG_WRITES = 1 << 5;
        /// `FUSE_DONT_MASK`: the kernel does not apply the umask on create.
        const DONT_MASK = 1 << 6;
        /// `FUSE_SPLICE_WRITE`: splice write on the device.
        const SPLICE_WRITE = 1 << 7;
        /// `FUSE_SPLICE_MOVE`: splice move on the device.
        const SPLICE_MOVE = 1 << 8;
        /// `FUSE_SPLICE_READ`: splice read on the device.
        const SPLICE_READ = 1 << 9;
        /// `FUSE_FLOCK_LOCKS`: BSD flock locks.
        const FLOCK_LOCKS = 1 << 10;
        /// `FUSE_HAS_IOCTL_DIR`: ioctl on directories.
        const HAS_IOCTL_DIR = 1 << 11;
        /// `FUSE_AUTO_INVAL_DATA`: invalidate cached pages when mtime or size change.
        const AUTO_INVAL_DATA = 1 << 12;
        /// `FUSE_DO_READDIRPLUS`: READDIRPLUS.
        const DO_READDIRPLUS = 1 << 13;
        /// `FUSE_READDIRPLUS_AUTO`: adaptive READDIRPLUS.
        const READDIRPLUS_AUTO = 1 << 14;
        /// `FUSE_ASYNC_DIO`: asynchronous direct I/O submission.
        const ASYNC_DIO = 1 << 15;
        /// `FUSE_WRITEBACK_CACHE`: writeback cache for buffered writes.
        const WRITEBACK_CACHE = 1 << 16;
        /// `FUSE_NO_OPEN_SUPPORT`: ENOSYS on OPEN means opens need no message.
        const NO_OPEN_SUPPORT = 1 << 17;
        /// `FUSE_PARALLEL_DIROPS`: parallel lookups and readdir in one directory.
        const PARALLEL_DIROPS = 1 << 18;
        /// `FUSE_HANDLE_KILLPRIV`: the filesystem clears suid/sgid/caps on write, chown, truncate.
        const HANDLE_KILLPRIV = 1 << 19;
        /// `FUSE_POSIX_ACL`: POSIX ACLs (implies default_permissions).
        const POSIX_ACL = 1 << 20;
        /// `FUSE_ABORT_ERROR`: reading an aborted connection returns ECONNABORTED.
        const ABORT_ERROR = 1 << 21;
        /// `FUSE_MAX_PAGES`: `max_pages` in the INIT reply is valid.
        const MAX_PAGES = 1 << 22;
        /// `FUSE_CACHE_SYMLINKS`: cache READLINK replies.
        const CACHE_SYMLINKS = 1 << 23;
        /// `FUSE_NO_OPENDIR_SUPPORT`: ENOSYS on OPENDIR means opendirs need no message.
        const NO_OPENDIR_SUPPORT = 1 << 24;
        /// `FUSE_EXPLICIT_INVAL_DATA`: invalidate cached pages only on request.
        const EXPLICIT_INVAL_DATA = 1 << 25;
        /// `FUSE_MAP_ALIGNMENT`: `map_alignment` in the INIT reply is valid (DAX).
        const MAP_ALIGNMENT = 1 << 26;
        /// `FUSE_SUBMOUNTS`: the kernel supports auto-mounting submounts.
        const SUBMOUNTS = 1 << 27;
        /// `FUSE_HANDLE_KILLPRIV_V2`: the filesystem clears suid/sgid like the VFS.
        const HANDLE_KILLPRIV_V2 = 1 << 28;
        /// `FUSE_SETXATTR_EXT`: extended `fuse_setxattr_in`.
        const SETXATTR_EXT = 1 << 29;
        /// `FUSE_INIT_EXT`: `flags2` is valid.
        const INIT_EXT = 1 << 30;
        /// `FUSE_INIT_RESERVED`: reserved, never set.
        const INIT_RESERVED = 1 << 31;
        /// `FUSE_SECURITY_CTX`: security context on create, mkdir, symlink, mknod.
        const SECURITY_CTX = 1 << 32;
        /// `FUSE_HAS_INODE_DAX`: per-inode DAX.
        const HAS_INODE_DAX = 1 << 33;
        /// `FUSE_CREATE_SUPP_GROUP`: supplementary-group extension on creation.
        const CREATE_SUPP_GROUP = 1 << 34;
        /// `FUSE_HAS_EXPIRE_ONLY`: the kernel supports expire-only entry invalidation.
        const HAS_EXPIRE_ONLY = 1 << 35;
        /// `FUSE_DIRECT_IO_ALLOW_MMAP` (once `FUSE_DIRECT_IO_RELAX`): shared mmap with FOPEN_DIRECT_IO.
        const DIRECT_IO_ALLOW_MMAP = 1 << 36;
        /// `FUSE_PASSTHROUGH`: kernel passthrough; `max_stack_depth` is valid.
        const PASSTHROUGH = 1 << 37;
        /// `FUSE_NO_EXPORT_SUPPORT`: explicitly no export support.
        const NO_EXPORT_SUPPORT = 1 << 38;
        /// `FUSE_HAS_RESEND`: the kernel supports NOTIFY_RESEND.
        const HAS_RESEND = 1 << 39;
        /// `FUSE_ALLOW_IDMAP`: idmapped mounts.
        const ALLOW_IDMAP = 1 << 40;
        /// `FUSE_OVER_IO_URING`: requests over io_uring.
        const OVER_IO_URING = 1 << 41;
        /// `FUSE_REQUEST_TIMEOUT`: `request_timeout` in the INIT reply is valid.
        const REQUEST_TIMEOUT = 1 << 42;
    }
}

/// Each INIT flag with the protocol minor that introduced it (the
/// changelog of `fuse.h`; flags older than 7.12, the oldest minor this
/// crate negotiates, with the minor their header first showed them in).
pub const INIT_FLAG_MINORS: &[(InitFlags, u32)] = &[
    (InitFlags::ASYNC_READ, 6),
    (InitFlags::POSIX_LOCKS, 7),
    (InitFlags::FILE_OPS, 9),
    (InitFlags::ATOMIC_O_TRUNC, 9),
    (InitFlags::EXPORT_SUPPORT, 10),
    (InitFlags::BIG_WRITES, 10),
    (InitFlags::DONT_MASK, 12),
    (InitFlags::SPLICE_WRITE, 14),
    (InitFlags::SPLICE_MOVE, 14),
    (InitFlags::SPLICE_READ, 14),
    (InitFlags::FLOCK_LOCKS, 17),
    (InitFlags::HAS_IOCTL_DIR, 18),
    (InitFlags::AUTO_INVAL_DATA, 20),
    (InitFlags::DO_READDIRPLUS, 21),
    (InitFlags::READDIRPLUS_AUTO, 21),
    (InitFlags::ASYNC_DIO, 22),
    (InitFlags::WRITEBACK_CACHE, 23),
    (InitFlags::NO_OPEN_SUPPORT, 23),
    (InitFlags::PARALLEL_DIROPS, 25),
    (InitFlags::HANDLE_KILLPRIV, 26),
    (InitFlags::POSIX_ACL, 26),
    (InitFlags::ABORT_ERROR, 27),
    (InitFlags::MAX_PAGES, 28),
    (InitFlags::CACHE_SYMLINKS, 28),
    (InitFlags::NO_OPENDIR_SUPPORT, 29),
    (InitFlags::EXPLICIT_INVAL_DATA, 30),
    (InitFlags::MAP_ALIGNMENT, 31),
    (InitFlags::SUBMOUNTS, 32),
    (InitFlags::HANDLE_KILLPRIV_V2, 33),
    (InitFlags::SETXATTR_EXT, 33),
    (InitFlags::INIT_EXT, 36),
    (InitFlags::SECURITY_CTX, 36),
    (InitFlags::HAS_INODE_DAX, 36),
    (InitFlags::CREATE_SUPP_GROUP, 38),
    (InitFlags::HAS_EXPIRE_ONLY, 38),
    (InitFlags::DIRECT_IO_ALLOW_MMAP, 39),
    (InitFlags::PASSTHROUGH, 40),
    (InitFlags::NO_EXPORT_SUPPORT, 40),
    (InitFlags::HAS_RESEND, 40),
    (InitFlags::ALLOW_IDMAP, 41),
    (InitFlags::OVER_IO_URING, 42),
    (InitFlags::REQUEST_TIMEOUT, 43),
];

impl InitFlags {
    /// The flags a kernel of protocol minor `minor` knows (and so may
    /// offer): those introduced at `minor` or before ([`INIT_FLAG_MINORS`]).
    pub fn known_at(minor: u32) -> InitFlags {
        INIT_FLAG_MINORS
            .iter()
            .filter(|&&(_, m)| m <= minor)
            .fold(InitFlags::empty(), |all, &(f, _)| all | f)
    }

    /// Joins `flags` and `flags2` (`flags | flags2 << 32`), keeping unknown bits.
    pub const fn from_halves(flags: u32, flags2: u32) -> Self {
        Self::from_bits_retain(flags as u64 | (flags2 as u64) << 32)
    }

    /// Splits into `(flags, flags2)`.
    pub const fn halves(self) -> (u32, u32) {
        (self.bits() as u32, (self.bits() >> 32) as u32)
    }
}

bitflags! {
    /// `fuse_open_out.open_flags`: how the kernel treats an open file.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct FopenFlags: u32 {
        /// `FOPEN_DIRECT_IO`: bypass the page cache.
        const DIRECT_IO = 1 << 0;
        /// `FOPEN_KEEP_CACHE`: keep cached data on open.
        const KEEP_CACHE = 1 << 1;
        /// `FOPEN_NONSEEKABLE`: the file is not seekable.
        const NONSEEKABLE = 1 << 2;
        /// `FOPEN_CACHE_DIR`: cache this directory's entries.
        const CACHE_DIR = 1 << 3;
        /// `FOPEN_STREAM`: a stream without file position.
        const STREAM = 1 << 4;
        /// `FOPEN_NOFLUSH`: no FLUSH on close.
        const NOFLUSH = 1 << 5;
        /// `FOPEN_PARALLEL_DIRECT_WRITES`: concurrent non-extending direct writes
        /// on one inode (the kernel drops it unless `DIRECT_IO` is set too).
        const PARALLEL_DIRECT_WRITES = 1 << 6;
        /// `FOPEN_PASSTHROUGH`: I/O goes to the backing file named by `backing_id`.
        const PASSTHROUGH = 1 << 7;
    }
}

impl FopenFlags {
    /// The only flags the kernel accepts together with `PASSTHROUGH`
    /// (`FOPEN_PASSTHROUGH_MASK`); any other makes the open fail.
    pub const PASSTHROUGH_MASK: Self = Self::from_bits_retain(
        Self::PASSTHROUGH.bits()
            | Self::DIRECT_IO.bits()
            | Self::PARALLEL_DIRECT_WRITES.bits()
            | Self::NOFLUSH.bits(),
    );
}

bitflags! {
    /// `fuse_setattr_in.valid`: which fields of a SETATTR apply.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct SetattrValid: u32 {
        /// `FATTR_MODE`.
        const MODE = 1 << 0;
        /// `FATTR_UID`.
        const UID = 1 << 1;
        /// `FATTR_GID`.
        const GID = 1 << 2;
        /// `FATTR_SIZE`.
        const SIZE = 1 << 3;
        /// `FATTR_ATIME`.
        const ATIME = 1 << 4;
        /// `FATTR_MTIME`.
        const MTIME = 1 << 5;
        /// `FATTR_FH`: `fh` is valid.
        const FH = 1 << 6;
        /// `FATTR_ATIME_NOW`: set atime to the current time.
        const ATIME_NOW = 1 << 7;
        /// `FATTR_MTIME_NOW`: set mtime to the current time.
        const MTIME_NOW = 1 << 8;
        /// `FATTR_LOCKOWNER`: `lock_owner` is valid.
        const LOCKOWNER = 1 << 9;
        /// `FATTR_CTIME`.
        const CTIME = 1 << 10;
        /// `FATTR_KILL_SUIDGID`: clear suid/sgid.
        const KILL_SUIDGID = 1 << 11;
    }
}

bitflags! {
    /// `fuse_getattr_in.getattr_flags` and `fuse_statx_in.getattr_flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct GetattrFlags: u32 {
        /// `FUSE_GETATTR_FH`: `fh` is valid.
        const FH = 1 << 0;
    }
}

bitflags! {
    /// `fuse_read_in.read_flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct ReadFlags: u32 {
        /// `FUSE_READ_LOCKOWNER`: `lock_owner` is valid.
        const LOCKOWNER = 1 << 1;
    }
}

bitflags! {
    /// `fuse_write_in.write_flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct WriteFlags: u32 {
        /// `FUSE_WRITE_CACHE`: delayed write from the page cache; `fh` is a guess.
        const CACHE = 1 << 0;
        /// `FUSE_WRITE_LOCKOWNER`: `lock_owner` is valid.
        const LOCKOWNER = 1 << 1;
        /// `FUSE_WRITE_KILL_SUIDGID` (alias `FUSE_WRITE_KILL_PRIV`): clear suid/sgid.
        const KILL_SUIDGID = 1 << 2;
    }
}

bitflags! {
    /// `fuse_open_in.open_flags` and `fuse_create_in.open_flags` (since 7.33).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct OpenInFlags: u32 {
        /// `FUSE_OPEN_KILL_SUIDGID`: clear suid/sgid on a truncating open.
        const KILL_SUIDGID = 1 << 0;
    }
}

bitflags! {
    /// `fuse_release_in.release_flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct ReleaseFlags: u32 {
        /// `FUSE_RELEASE_FLUSH`: flush as well.
        const FLUSH = 1 << 0;
        /// `FUSE_RELEASE_FLOCK_UNLOCK`: drop the flock of `lock_owner`.
        const FLOCK_UNLOCK = 1 << 1;
    }
}

bitflags! {
    /// `fuse_lk_in.lk_flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct LkFlags: u32 {
        /// `FUSE_LK_FLOCK`: a BSD flock, not a POSIX lock.
        const FLOCK = 1 << 0;
    }
}

bitflags! {
    /// `fuse_fsync_in.fsync_flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct FsyncFlags: u32 {
        /// `FUSE_FSYNC_FDATASYNC`: data only.
        const FDATASYNC = 1 << 0;
    }
}

bitflags! {
    /// `fuse_ioctl_in.flags` and `fuse_ioctl_out.flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct IoctlFlags: u32 {
        /// `FUSE_IOCTL_COMPAT`: 32-bit compat ioctl.
        const COMPAT = 1 << 0;
        /// `FUSE_IOCTL_UNRESTRICTED`: not restricted to well-formed ioctls.
        const UNRESTRICTED = 1 << 1;
        /// `FUSE_IOCTL_RETRY`: retry with the given iovecs.
        const RETRY = 1 << 2;
        /// `FUSE_IOCTL_32BIT`: 32-bit ioctl.
        const BIT32 = 1 << 3;
        /// `FUSE_IOCTL_DIR`: on a directory.
        const DIR = 1 << 4;
        /// `FUSE_IOCTL_COMPAT_X32`: x32 compat ioctl.
        const COMPAT_X32 = 1 << 5;
    }
}

bitflags! {
    /// `fuse_poll_in.flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct PollFlags: u32 {
        /// `FUSE_POLL_SCHEDULE_NOTIFY`: notify when ready.
        const SCHEDULE_NOTIFY = 1 << 0;
    }
}

bitflags! {
    /// `fuse_attr.flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct AttrFlags: u32 {
        /// `FUSE_ATTR_SUBMOUNT`: the inode is a submount root.
        const SUBMOUNT = 1 << 0;
        /// `FUSE_ATTR_DAX`: enable DAX for this file.
        const DAX = 1 << 1;
    }
}

bitflags! {
    /// `fuse_setxattr_in.setxattr_flags` (with SETXATTR_EXT).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct SetxattrFlags: u32 {
        /// `FUSE_SETXATTR_ACL_KILL_SGID`: clear sgid when setting a POSIX ACL.
        const ACL_KILL_SGID = 1 << 0;
    }
}

bitflags! {
    /// `fuse_notify_inval_entry_out.flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct InvalEntryFlags: u32 {
        /// `FUSE_EXPIRE_ONLY`: only expire the entry, do not drop it.
        const EXPIRE_ONLY = 1 << 0;
    }
}

bitflags! {
    /// `fuse_setupmapping_in.flags` (low 32 bits).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct SetupmappingFlags: u32 {
        /// `FUSE_SETUPMAPPING_FLAG_WRITE`.
        const WRITE = 1 << 0;
        /// `FUSE_SETUPMAPPING_FLAG_READ`.
        const READ = 1 << 1;
    }
}

bitflags! {
    /// `cuse_init_in.flags` and `cuse_init_out.flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct CuseInitFlags: u32 {
        /// `CUSE_UNRESTRICTED_IOCTL`.
        const UNRESTRICTED_IOCTL = 1 << 0;
    }
}

/// Notification codes, carried in `fuse_out_header.error` with `unique == 0`
/// (`enum fuse_notify_code`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum NotifyCode {
    /// `FUSE_NOTIFY_POLL`.
    Poll = 1,
    /// `FUSE_NOTIFY_INVAL_INODE`.
    InvalInode = 2,
    /// `FUSE_NOTIFY_INVAL_ENTRY`.
    InvalEntry = 3,
    /// `FUSE_NOTIFY_STORE`.
    Store = 4,
    /// `FUSE_NOTIFY_RETRIEVE`.
    Retrieve = 5,
    /// `FUSE_NOTIFY_DELETE`.
    Delete = 6,
    /// `FUSE_NOTIFY_RESEND` (since 7.40).
    Resend = 7,
    /// `FUSE_NOTIFY_INC_EPOCH` (since 7.44).
    IncEpoch = 8,
    /// `FUSE_NOTIFY_PRUNE` (since 7.45).
    Prune = 9,
}

impl NotifyCode {
    /// The minor that introduced the notification.
    pub const fn since_minor(self) -> u32 {
        match self {
            NotifyCode::Poll => 11,
            NotifyCode::InvalInode | NotifyCode::InvalEntry => 12,
            NotifyCode::Store | NotifyCode::Retrieve => 15,
            NotifyCode::Delete => 18,
            NotifyCode::Resend => 40,
            NotifyCode::IncEpoch => 44,
            NotifyCode::Prune => 45,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_init_flag_has_its_minor() {
        let listed = INIT_FLAG_MINORS
            .iter()
            .fold(InitFlags::empty(), |a, &(f, _)| a | f);
        assert_eq!(listed, InitFlags::all() - InitFlags::INIT_RESERVED);
        assert_eq!(INIT_FLAG_MINORS.len(), listed.iter().count(), "each flag once");
        assert!(!InitFlags::known_at(12).contains(InitFlags::DO_READDIRPLUS));
        assert!(InitFlags::known_at(21).contains(InitFlags::DO_READDIRPLUS));
        assert!(!InitFlags::known_at(35).contains(InitFlags::INIT_EXT));
        assert_eq!(InitFlags::known_at(45), listed);
    }

    use super::*;

    #[test]
    fn init_halves_round_trip() {
        let f = InitFlags::ASYNC_READ | InitFlags::INIT_EXT | InitFlags::PASSTHROUGH;
        assert_eq!(f.halves(), (1 | 1 << 30, 1 << 5));
        assert_eq!(InitFlags::from_halves(1 | 1 << 30, 1 << 5), f);
        assert_eq!(InitFlags::OVER_IO_URING.halves(), (0, 1 << 9));
    }
}
