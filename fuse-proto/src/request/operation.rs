//! What a request asks: [`Operation`], one variant per opcode with its
//! arguments borrowed from the receive buffer, and the lists FORGET and
//! REMOVEMAPPING carry, read lazily.

use crate::abi::*;
use crate::opcode::Opcode;
use core::ffi::CStr;
use core::mem::size_of;
use zerocopy::FromBytes;

/// A list of `fuse_forget_one` read lazily from the buffer (no alignment needed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForgetList<'a>(pub(super) &'a [u8]);

impl<'a> ForgetList<'a> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len() / size_of::<ForgetOne>()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The entries.
    pub fn iter(&self) -> impl Iterator<Item = ForgetOne> + use<'a> {
        self.0
            .chunks_exact(size_of::<ForgetOne>())
            .filter_map(|c| ForgetOne::read_from_bytes(c).ok())
    }
}

/// A list of `fuse_removemapping_one` read lazily from the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemovemappingList<'a>(pub(super) &'a [u8]);

impl<'a> RemovemappingList<'a> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len() / size_of::<RemovemappingOne>()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The entries.
    pub fn iter(&self) -> impl Iterator<Item = RemovemappingOne> + use<'a> {
        self.0
            .chunks_exact(size_of::<RemovemappingOne>())
            .filter_map(|c| RemovemappingOne::read_from_bytes(c).ok())
    }
}

/// The operation of a request, one variant per opcode, arguments borrowed
/// from the receive buffer.
///
/// Field conventions: `arg` is the opcode's fixed argument struct (copied out
/// of the buffer, zero-extended where an old minor sent a shorter one); `name`,
/// `newname` and `target` are NUL-checked names borrowed from the buffer;
/// `data` and `value` are payloads borrowed from the buffer.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operation<'a> {
    /// LOOKUP `name` in directory `nodeid`.
    Lookup { name: &'a CStr },
    /// FORGET.
    Forget { arg: ForgetIn },
    /// GETATTR; before 7.9 the kernel sent no body and `arg` is zeroed.
    Getattr { arg: GetattrIn },
    /// SETATTR.
    Setattr { arg: SetattrIn },
    /// READLINK.
    Readlink,
    /// SYMLINK: create `name` pointing at `target`.
    Symlink { name: &'a CStr, target: &'a CStr },
    /// MKNOD (before 7.12 `umask` is zero).
    Mknod { arg: MknodIn, name: &'a CStr },
    /// MKDIR.
    Mkdir { arg: MkdirIn, name: &'a CStr },
    /// UNLINK.
    Unlink { name: &'a CStr },
    /// RMDIR.
    Rmdir { name: &'a CStr },
    /// RENAME `name` to `newname` in `arg.newdir`.
    Rename {
        arg: RenameIn,
        name: &'a CStr,
        newname: &'a CStr,
    },
    /// LINK `arg.oldnodeid` as `name` in directory `nodeid`.
    Link { arg: LinkIn, name: &'a CStr },
    /// OPEN.
    Open { arg: OpenIn },
    /// READ.
    Read { arg: ReadIn },
    /// WRITE of `data` (borrowed, `arg.size` bytes).
    Write { arg: WriteIn, data: &'a [u8] },
    /// STATFS.
    Statfs,
    /// RELEASE.
    Release { arg: ReleaseIn },
    /// FSYNC.
    Fsync { arg: FsyncIn },
    /// SETXATTR (without SETXATTR_EXT the last two words of `arg` are zero).
    Setxattr {
        arg: SetxattrIn,
        name: &'a CStr,
        value: &'a [u8],
    },
    /// GETXATTR.
    Getxattr { arg: GetxattrIn, name: &'a CStr },
    /// LISTXATTR.
    Listxattr { arg: GetxattrIn },
    /// REMOVEXATTR.
    Removexattr { name: &'a CStr },
    /// FLUSH.
    Flush { arg: FlushIn },
    /// INIT (before 7.36 only the first 16 bytes of `arg` were sent).
    Init { arg: InitIn },
    /// OPENDIR.
    Opendir { arg: OpenIn },
    /// READDIR.
    Readdir { arg: ReadIn },
    /// RELEASEDIR.
    Releasedir { arg: ReleaseIn },
    /// FSYNCDIR.
    Fsyncdir { arg: FsyncIn },
    /// GETLK.
    Getlk { arg: LkIn },
    /// SETLK.
    Setlk { arg: LkIn },
    /// SETLKW.
    Setlkw { arg: LkIn },
    /// ACCESS.
    Access { arg: AccessIn },
    /// CREATE (before 7.12 `mode` and `umask` are zero).
    Create { arg: CreateIn, name: &'a CStr },
    /// INTERRUPT of request `arg.unique`.
    Interrupt { arg: InterruptIn },
    /// BMAP.
    Bmap { arg: BmapIn },
    /// DESTROY.
    Destroy,
    /// IOCTL with `data` (`arg.in_size` bytes).
    Ioctl { arg: IoctlIn, data: &'a [u8] },
    /// POLL.
    Poll { arg: PollIn },
    /// NOTIFY_REPLY: the cached `data` a RETRIEVE asked for.
    NotifyReply { arg: NotifyRetrieveIn, data: &'a [u8] },
    /// BATCH_FORGET.
    BatchForget {
        arg: BatchForgetIn,
        forgets: ForgetList<'a>,
    },
    /// FALLOCATE.
    Fallocate { arg: FallocateIn },
    /// READDIRPLUS.
    Readdirplus { arg: ReadIn },
    /// RENAME2.
    Rename2 {
        arg: Rename2In,
        name: &'a CStr,
        newname: &'a CStr,
    },
    /// LSEEK.
    Lseek { arg: LseekIn },
    /// COPY_FILE_RANGE.
    CopyFileRange { arg: CopyFileRangeIn },
    /// SETUPMAPPING.
    Setupmapping { arg: SetupmappingIn },
    /// REMOVEMAPPING.
    Removemapping {
        arg: RemovemappingIn,
        mappings: RemovemappingList<'a>,
    },
    /// SYNCFS.
    Syncfs { arg: SyncfsIn },
    /// TMPFILE.
    Tmpfile { arg: CreateIn, name: &'a CStr },
    /// STATX.
    Statx { arg: StatxIn },
    /// COPY_FILE_RANGE_64.
    CopyFileRange64 { arg: CopyFileRangeIn },
    /// CUSE_INIT.
    CuseInit { arg: CuseInitIn },
    /// The out-of-tree atomic lookup+open (v10 wire), only when opted in;
    /// see [`crate::ext::atomic_open`].
    AtomicOpen { arg: CreateIn, name: &'a CStr },
}

impl Operation<'_> {
    /// The opcode of this operation (atomic open reports [`Opcode::Create`],
    /// whose reply it shares; see [`Operation::is_atomic_open`]).
    pub fn opcode(&self) -> Opcode {
        use Operation as O;
        match self {
            O::Lookup { .. } => Opcode::Lookup,
            O::Forget { .. } => Opcode::Forget,
            O::Getattr { .. } => Opcode::Getattr,
            O::Setattr { .. } => Opcode::Setattr,
            O::Readlink => Opcode::Readlink,
            O::Symlink { .. } => Opcode::Symlink,
            O::Mknod { .. } => Opcode::Mknod,
            O::Mkdir { .. } => Opcode::Mkdir,
            O::Unlink { .. } => Opcode::Unlink,
            O::Rmdir { .. } => Opcode::Rmdir,
            O::Rename { .. } => Opcode::Rename,
            O::Link { .. } => Opcode::Link,
            O::Open { .. } => Opcode::Open,
            O::Read { .. } => Opcode::Read,
            O::Write { .. } => Opcode::Write,
            O::Statfs => Opcode::Statfs,
            O::Release { .. } => Opcode::Release,
            O::Fsync { .. } => Opcode::Fsync,
            O::Setxattr { .. } => Opcode::Setxattr,
            O::Getxattr { .. } => Opcode::Getxattr,
            O::Listxattr { .. } => Opcode::Listxattr,
            O::Removexattr { .. } => Opcode::Removexattr,
            O::Flush { .. } => Opcode::Flush,
            O::Init { .. } => Opcode::Init,
            O::Opendir { .. } => Opcode::Opendir,
            O::Readdir { .. } => Opcode::Readdir,
            O::Releasedir { .. } => Opcode::Releasedir,
            O::Fsyncdir { .. } => Opcode::Fsyncdir,
            O::Getlk { .. } => Opcode::Getlk,
            O::Setlk { .. } => Opcode::Setlk,
            O::Setlkw { .. } => Opcode::Setlkw,
            O::Access { .. } => Opcode::Access,
            O::Create { .. } | O::AtomicOpen { .. } => Opcode::Create,
            O::Interrupt { .. } => Opcode::Interrupt,
            O::Bmap { .. } => Opcode::Bmap,
            O::Destroy => Opcode::Destroy,
            O::Ioctl { .. } => Opcode::Ioctl,
            O::Poll { .. } => Opcode::Poll,
            O::NotifyReply { .. } => Opcode::NotifyReply,
            O::BatchForget { .. } => Opcode::BatchForget,
            O::Fallocate { .. } => Opcode::Fallocate,
            O::Readdirplus { .. } => Opcode::Readdirplus,
            O::Rename2 { .. } => Opcode::Rename2,
            O::Lseek { .. } => Opcode::Lseek,
            O::CopyFileRange { .. } => Opcode::CopyFileRange,
            O::Setupmapping { .. } => Opcode::Setupmapping,
            O::Removemapping { .. } => Opcode::Removemapping,
            O::Syncfs { .. } => Opcode::Syncfs,
            O::Tmpfile { .. } => Opcode::Tmpfile,
            O::Statx { .. } => Opcode::Statx,
            O::CopyFileRange64 { .. } => Opcode::CopyFileRange64,
            O::CuseInit { .. } => Opcode::CuseInit,
        }
    }

    /// Whether this is the out-of-tree atomic-open request.
    pub fn is_atomic_open(&self) -> bool {
        matches!(self, Operation::AtomicOpen { .. })
    }
}
