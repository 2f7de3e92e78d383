//! The one opcode table of the FUSE protocol (`enum fuse_opcode`, 7.45).
//!
//! Each row gives the Rust name, the number, the kernel's name without its
//! `FUSE_` prefix (as logs and statistics spell it), the minor that introduced
//! it, whether the kernel waits for a reply, and whether carrying it out
//! changes state (what a recovering daemon must not do twice). Everything
//! else that needs to know about opcodes (parsing, statistics, dispatch, the
//! recovery journal) reads this table.
//! Numbers that are not in the table decode to [`UnknownOpcode`], never a panic.
//! The out-of-tree atomic-open opcode is not here: it lives, opt-in only, in
//! [`crate::ext::atomic_open`].

/// An opcode number that the table does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnknownOpcode(pub u32);

impl core::fmt::Display for UnknownOpcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "unknown opcode {}", self.0)
    }
}

macro_rules! opcode_table {
    ($( $(#[$m:meta])* $name:ident = $num:literal, $kname:literal, since $minor:literal, $reply:ident, $effect:ident; )*) => {
        /// A request opcode (`enum fuse_opcode`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u32)]
        #[non_exhaustive]
        pub enum Opcode {
            $( $(#[$m])* $name = $num, )*
        }

        impl Opcode {
            /// Every opcode, in table order; [`Opcode::index`] is the position here.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$name),*];

            /// The number of opcodes in the table.
            pub const COUNT: usize = Self::ALL.len();

            /// Looks a number up in the table.
            pub const fn from_u32(n: u32) -> Result<Self, UnknownOpcode> {
                match n {
                    $( $num => Ok(Opcode::$name), )*
                    other => Err(UnknownOpcode(other)),
                }
            }

            /// The kernel's name without the `FUSE_` prefix, e.g. `"WRITE"`, `"CUSE_INIT"`.
            pub const fn name(self) -> &'static str {
                match self { $( Opcode::$name => $kname, )* }
            }

            /// The protocol minor (of major 7) that introduced the opcode.
            pub const fn since_minor(self) -> u32 {
                match self { $( Opcode::$name => $minor, )* }
            }

            /// Whether the kernel expects a reply (FORGET, BATCH_FORGET and
            /// NOTIFY_REPLY get none; INTERRUPT is answered only to ask for a retry).
            pub const fn expects_reply(self) -> bool {
                match self { $( Opcode::$name => opcode_table!(@reply $reply), )* }
            }

            /// Whether carrying the request out changes what the filesystem
            /// holds or what the kernel holds of it (a name, data, an
            /// attribute, a lookup count, a file handle), so that carrying
            /// it out a second time, for a request sent again, would change
            /// it again. Reads of data, attributes and directories, and lock
            /// requests (which the kernel's own waits repeat), do not.
            pub const fn changes_state(self) -> bool {
                match self { $( Opcode::$name => opcode_table!(@effect $effect), )* }
            }

            /// A dense index `0..COUNT`, for per-opcode counters in arrays.
            pub const fn index(self) -> usize {
                let mut i = 0;
                while i < Self::ALL.len() {
                    if Self::ALL[i] as u32 == self as u32 {
                        return i;
                    }
                    i += 1;
                }
                unreachable!()
            }
        }
    };
    (@reply reply) => { true };
    (@reply noreply) => { false };
    (@effect changes) => { true };
    (@effect reads) => { false };
}

opcode_table! {
    /// Look a name up in a directory (`nodeid` is the parent).
    Lookup = 1, "LOOKUP", since 1, reply, changes;
    /// Drop lookup references to an inode.
    Forget = 2, "FORGET", since 1, noreply, reads;
    /// Read an inode's attributes.
    Getattr = 3, "GETATTR", since 1, reply, reads;
    /// Change an inode's attributes.
    Setattr = 4, "SETATTR", since 1, reply, changes;
    /// Read a symbolic link's target.
    Readlink = 5, "READLINK", since 1, reply, reads;
    /// Create a symbolic link.
    Symlink = 6, "SYMLINK", since 1, reply, changes;
    /// Create a file node.
    Mknod = 8, "MKNOD", since 1, reply, changes;
    /// Create a directory.
    Mkdir = 9, "MKDIR", since 1, reply, changes;
    /// Remove a name.
    Unlink = 10, "UNLINK", since 1, reply, changes;
    /// Remove a directory.
    Rmdir = 11, "RMDIR", since 1, reply, changes;
    /// Rename an entry.
    Rename = 12, "RENAME", since 1, reply, changes;
    /// Create a hard link.
    Link = 13, "LINK", since 1, reply, changes;
    /// Open a file.
    Open = 14, "OPEN", since 1, reply, changes;
    /// Read data.
    Read = 15, "READ", since 1, reply, reads;
    /// Write data.
    Write = 16, "WRITE", since 1, reply, changes;
    /// Filesystem statistics.
    Statfs = 17, "STATFS", since 1, reply, reads;
    /// Release an open file.
    Release = 18, "RELEASE", since 1, reply, changes;
    /// Synchronise file contents.
    Fsync = 20, "FSYNC", since 1, reply, reads;
    /// Set an extended attribute.
    Setxattr = 21, "SETXATTR", since 1, reply, changes;
    /// Get an extended attribute.
    Getxattr = 22, "GETXATTR", since 1, reply, reads;
    /// List extended attributes.
    Listxattr = 23, "LISTXATTR", since 1, reply, reads;
    /// Remove an extended attribute.
    Removexattr = 24, "REMOVEXATTR", since 1, reply, changes;
    /// A file descriptor of an open file is closed.
    Flush = 25, "FLUSH", since 1, reply, reads;
    /// The protocol handshake.
    Init = 26, "INIT", since 1, reply, reads;
    /// Open a directory.
    Opendir = 27, "OPENDIR", since 1, reply, changes;
    /// Read directory entries.
    Readdir = 28, "READDIR", since 1, reply, reads;
    /// Release an open directory.
    Releasedir = 29, "RELEASEDIR", since 1, reply, changes;
    /// Synchronise directory contents.
    Fsyncdir = 30, "FSYNCDIR", since 2, reply, reads;
    /// Test for a POSIX lock.
    Getlk = 31, "GETLK", since 7, reply, reads;
    /// Take or release a lock without waiting.
    Setlk = 32, "SETLK", since 7, reply, reads;
    /// Take a lock, waiting for it.
    Setlkw = 33, "SETLKW", since 7, reply, reads;
    /// Check access permissions.
    Access = 34, "ACCESS", since 3, reply, reads;
    /// Create and open a file.
    Create = 35, "CREATE", since 3, reply, changes;
    /// Interrupt a request in flight.
    Interrupt = 36, "INTERRUPT", since 7, noreply, reads;
    /// Map a file block to a device block.
    Bmap = 37, "BMAP", since 8, reply, reads;
    /// The filesystem is being unmounted.
    Destroy = 38, "DESTROY", since 8, reply, reads;
    /// An ioctl on an open file.
    Ioctl = 39, "IOCTL", since 11, reply, reads;
    /// Poll an open file for events.
    Poll = 40, "POLL", since 11, reply, reads;
    /// The kernel's answer to a RETRIEVE notification.
    NotifyReply = 41, "NOTIFY_REPLY", since 15, noreply, reads;
    /// Drop lookup references to several inodes.
    BatchForget = 42, "BATCH_FORGET", since 16, noreply, reads;
    /// Allocate or punch file space.
    Fallocate = 43, "FALLOCATE", since 19, reply, changes;
    /// Read directory entries with their attributes.
    Readdirplus = 44, "READDIRPLUS", since 21, reply, reads;
    /// Rename with flags.
    Rename2 = 45, "RENAME2", since 23, reply, changes;
    /// Find data or holes.
    Lseek = 46, "LSEEK", since 24, reply, reads;
    /// Copy a range between files (32-bit result).
    CopyFileRange = 47, "COPY_FILE_RANGE", since 28, reply, changes;
    /// Map a file range into the DAX window (virtio-fs).
    Setupmapping = 48, "SETUPMAPPING", since 31, reply, reads;
    /// Remove DAX mappings (virtio-fs).
    Removemapping = 49, "REMOVEMAPPING", since 31, reply, reads;
    /// Synchronise the whole filesystem.
    Syncfs = 50, "SYNCFS", since 34, reply, reads;
    /// Create an unnamed temporary file.
    Tmpfile = 51, "TMPFILE", since 37, reply, changes;
    /// Extended attributes in statx layout.
    Statx = 52, "STATX", since 39, reply, reads;
    /// Copy a range between files (64-bit result).
    CopyFileRange64 = 53, "COPY_FILE_RANGE_64", since 45, reply, reads;
    /// The CUSE handshake.
    CuseInit = 4096, "CUSE_INIT", since 11, reply, reads;
}

impl TryFrom<u32> for Opcode {
    type Error = UnknownOpcode;
    fn try_from(n: u32) -> Result<Self, UnknownOpcode> {
        Opcode::from_u32(n)
    }
}

impl core::fmt::Display for Opcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// `CUSE_INIT << 8`: reserved so that a byte-swapped CUSE_INIT is recognisable.
pub const CUSE_INIT_BSWAP_RESERVED: u32 = 1_048_576;
/// `FUSE_INIT << 24`: reserved so that a byte-swapped INIT is recognisable.
pub const FUSE_INIT_BSWAP_RESERVED: u32 = 436_207_616;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_is_dense_and_round_trips() {
        for (i, op) in Opcode::ALL.iter().enumerate() {
            assert_eq!(op.index(), i);
            assert_eq!(Opcode::from_u32(*op as u32), Ok(*op));
        }
        assert_eq!(Opcode::COUNT, 52);
        assert_eq!(Opcode::from_u32(7), Err(UnknownOpcode(7)));
        assert_eq!(Opcode::from_u32(19), Err(UnknownOpcode(19)));
        assert_eq!(Opcode::from_u32(54), Err(UnknownOpcode(54)));
    }

    #[test]
    fn what_changes_state() {
        let changing = Opcode::ALL
            .iter()
            .filter(|op| op.changes_state())
            .map(|op| op.name());
        assert!(changing.eq([
            "LOOKUP",
            "SETATTR",
            "SYMLINK",
            "MKNOD",
            "MKDIR",
            "UNLINK",
            "RMDIR",
            "RENAME",
            "LINK",
            "OPEN",
            "WRITE",
            "RELEASE",
            "SETXATTR",
            "REMOVEXATTR",
            "OPENDIR",
            "RELEASEDIR",
            "CREATE",
            "FALLOCATE",
            "RENAME2",
            "COPY_FILE_RANGE",
            "TMPFILE",
        ]));
    }
}
