//! The node layer's traits: what a file or directory of the tree
//! implements ([`Node`]), what an open file implements ([`OpenFile`]), and
//! how an open is answered ([`Opened`]).

use crate::attr::{FileAttr, Statfs};
use crate::backing::BackingFile;
use crate::context::RequestContext;
use crate::layers::core::open_builders;
use crate::ops::*;
use crate::reply::*;
use crate::types::LockOwner;
use fuse_proto::Errno;
use fuse_proto::flags::FopenFlags;
use std::any::Any;
use std::ffi::CStr;

use super::NodeRef;
use super::dir_fill::DirFill;

/// A file or directory of a node-layer filesystem.
///
/// Only [`Node::getattr`] is required. The directory methods are called on
/// the directory (`lookup`, `create`, `unlink`… get the name in it), the
/// file methods on the file. Defaults: `ENOTDIR` for looking up in or
/// listing a non-directory, `EROFS` for changes, `EINVAL` for `readlink`
/// and `open`. A method runs on a worker thread and may block; it must not
/// wait for another request of the same filesystem.
///
/// A node is `Any`, so that a method receiving another node (`rename`'s
/// target directory, `link`'s node) can downcast it to its own type:
/// `(&**node as &dyn Any).downcast_ref::<MyDir>()`.
pub trait Node: Any + Send + Sync {
    /// The node's attributes. `ino` 0 leaves `st_ino` to the library: 1
    /// for the root; for any other node a keyed hash of its identity,
    /// stable while the node lives, never 0 or 1 and never its address
    /// (the hash's key is random per [`NodeFs`](super::NodeFs); two live nodes share a
    /// number with odds of about n²/2⁶⁵ for n nodes). Report your own
    /// number where it must survive the process (an archive's member
    /// index, a source file's `st_ino`).
    fn getattr(&self, ctx: &RequestContext<'_>) -> Result<FileAttr, Errno>;

    /// Changes attributes (`chmod`, `chown`, `truncate`, `utimensat`);
    /// `file` is the open file it came through, if any. Returns the new
    /// attributes.
    fn setattr(
        &self,
        ctx: &RequestContext<'_>,
        req: &SetattrRequest,
        file: Option<&dyn OpenFile>,
    ) -> Result<FileAttr, Errno> {
        let _ = (ctx, req, file);
        Err(Errno::EROFS)
    }

    /// The target of a symbolic link.
    fn readlink(&self, ctx: &RequestContext<'_>) -> Result<Vec<u8>, Errno> {
        let _ = ctx;
        Err(Errno::EINVAL)
    }

    /// Opens the file (`flags` as [`crate::Filesystem::open`] gets them).
    fn open(&self, ctx: &RequestContext<'_>, flags: OpenFlags) -> Result<Opened, Errno> {
        let _ = (ctx, flags);
        Err(Errno::EINVAL)
    }

    /// Directory: the child called `name` (`ENOENT` if none).
    fn lookup(&self, ctx: &RequestContext<'_>, name: &CStr) -> Result<NodeRef, Errno> {
        let _ = (ctx, name);
        Err(Errno::ENOTDIR)
    }

    /// Directory: lists the children after cookie `offset` (0: from the
    /// start), adding each with [`DirFill::add`] until it returns
    /// [`DirAdd::Full`]. `offset` is a cookie this method gave an entry
    /// (the entry to continue after), or 0. The library adds "." and ".."
    /// itself (cookies 1 and 2 on the wire) and shifts this method's
    /// cookies past them, so the cookies here start wherever you like
    /// above 0.
    fn readdir(&self, ctx: &RequestContext<'_>, offset: u64, out: &mut DirFill<'_, '_>) -> Result<(), Errno> {
        let _ = (ctx, offset, out);
        Err(Errno::ENOTDIR)
    }

    /// Directory: creates and opens the regular file `name`.
    fn create(
        &self,
        ctx: &RequestContext<'_>,
        name: &CStr,
        req: CreateRequest,
    ) -> Result<(NodeRef, Opened), Errno> {
        let _ = (ctx, name, req);
        Err(Errno::EROFS)
    }

    /// Directory: creates the node `name` (fifo, socket, device, file).
    fn mknod(&self, ctx: &RequestContext<'_>, name: &CStr, req: MknodRequest) -> Result<NodeRef, Errno> {
        let _ = (ctx, name, req);
        Err(Errno::EROFS)
    }

    /// Directory: creates the directory `name` (`mode`: permission bits).
    fn mkdir(&self, ctx: &RequestContext<'_>, name: &CStr, mode: u32) -> Result<NodeRef, Errno> {
        let _ = (ctx, name, mode);
        Err(Errno::EROFS)
    }

    /// Directory: creates the symbolic link `name` to `target`.
    fn symlink(&self, ctx: &RequestContext<'_>, name: &CStr, target: &CStr) -> Result<NodeRef, Errno> {
        let _ = (ctx, name, target);
        Err(Errno::EROFS)
    }

    /// Directory: adds `node` under `name` (a hard link). The default
    /// answers `EROFS`, as for every change (`link(2)` then fails with
    /// "Read-only file system").
    fn link(&self, ctx: &RequestContext<'_>, name: &CStr, node: &NodeRef) -> Result<(), Errno> {
        let _ = (ctx, name, node);
        Err(Errno::EROFS)
    }

    /// Directory: removes the non-directory `name`.
    fn unlink(&self, ctx: &RequestContext<'_>, name: &CStr) -> Result<(), Errno> {
        let _ = (ctx, name);
        Err(Errno::EROFS)
    }

    /// Directory: removes the empty directory `name`.
    fn rmdir(&self, ctx: &RequestContext<'_>, name: &CStr) -> Result<(), Errno> {
        let _ = (ctx, name);
        Err(Errno::EROFS)
    }

    /// Directory: moves `name` to `newname` in `newdir` (which may be this
    /// directory itself).
    fn rename(
        &self,
        ctx: &RequestContext<'_>,
        name: &CStr,
        newdir: &NodeRef,
        newname: &CStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let _ = (ctx, name, newdir, newname, flags);
        Err(Errno::EROFS)
    }

    /// Filesystem statistics (asked of the root, or of any node). The
    /// default: an empty filesystem with 255-byte names,
    /// [`Statfs::new`].
    fn statfs(&self, ctx: &RequestContext<'_>) -> Result<Statfs, Errno> {
        let _ = ctx;
        Ok(Statfs::new())
    }

    /// The value of extended attribute `name` (`ENODATA` if it has none).
    /// `ENOSYS` (the default) makes the kernel answer every xattr call
    /// `EOPNOTSUPP` from then on. The library answers the size probe and
    /// `ERANGE`.
    fn getxattr(&self, ctx: &RequestContext<'_>, name: &CStr) -> Result<Vec<u8>, Errno> {
        let _ = (ctx, name);
        Err(Errno::ENOSYS)
    }

    /// The names of its extended attributes, each followed by a NUL.
    fn listxattr(&self, ctx: &RequestContext<'_>) -> Result<Vec<u8>, Errno> {
        let _ = ctx;
        Err(Errno::ENOSYS)
    }

    /// Sets extended attribute `name` (`flags`: `XATTR_CREATE`,
    /// `XATTR_REPLACE` or 0).
    fn setxattr(&self, ctx: &RequestContext<'_>, name: &CStr, value: &[u8], flags: i32) -> Result<(), Errno> {
        let _ = (ctx, name, value, flags);
        Err(Errno::ENOSYS)
    }

    /// Removes extended attribute `name`.
    fn removexattr(&self, ctx: &RequestContext<'_>, name: &CStr) -> Result<(), Errno> {
        let _ = (ctx, name);
        Err(Errno::ENOSYS)
    }

    /// The kernel dropped its last reference to this node (FORGET). The
    /// library no longer holds it; nothing to answer.
    fn forgotten(&self) {}
}

/// An open file: what [`Node::open`] and [`Node::create`] return, kept by
/// the library until RELEASE.
pub trait OpenFile: Any + Send + Sync {
    /// READ: answer with `reply` (e.g. [`ReplyData::data`], or
    /// [`ReplyData::splice_from`] a file descriptor).
    fn read(&self, ctx: &RequestContext<'_>, req: ReadRequest, reply: ReplyData) {
        let _ = (ctx, req);
        reply.error(Errno::EINVAL);
    }

    /// WRITE: returns the count written.
    fn write(&self, ctx: &RequestContext<'_>, req: WriteRequest<'_>) -> Result<u32, Errno> {
        let _ = (ctx, req);
        Err(Errno::EINVAL)
    }

    /// FLUSH (each `close(2)`): its error is what `close` returns. Sent
    /// only for files opened [`Opened::with_flush`] (and, with writeback
    /// caching, for every file: the kernel then writes dirty pages back on
    /// close); for the others the kernel skips the round trip. Several per
    /// open, the first possibly before any data (bash's `echo x > f`):
    /// commit only what was written since the last commit, as
    /// [`Filesystem::flush`](crate::Filesystem::flush) explains.
    fn flush(&self, ctx: &RequestContext<'_>, lock_owner: LockOwner) -> Result<(), Errno> {
        let _ = (ctx, lock_owner);
        Ok(())
    }

    /// FSYNC.
    fn fsync(&self, ctx: &RequestContext<'_>, datasync: bool) -> Result<(), Errno> {
        let _ = (ctx, datasync);
        Ok(())
    }

    /// FALLOCATE (`fallocate(2)`). `ENOSYS` (the default) makes the
    /// kernel answer later calls `EOPNOTSUPP` itself.
    fn fallocate(&self, ctx: &RequestContext<'_>, req: FallocateRequest) -> Result<(), Errno> {
        let _ = (ctx, req);
        Err(Errno::ENOSYS)
    }

    /// LSEEK with `SEEK_DATA` or `SEEK_HOLE`: the offset found. `ENOSYS`
    /// (the default) makes the kernel answer such seeks itself (all data).
    fn lseek(&self, ctx: &RequestContext<'_>, req: LseekRequest) -> Result<u64, Errno> {
        let _ = (ctx, req);
        Err(Errno::ENOSYS)
    }

    /// RELEASE: the last reference is gone; the library drops the file
    /// after this returns. Not awaited by `close`, and possibly long after
    /// it: see [`Filesystem::release`](crate::Filesystem::release).
    fn release(&self, ctx: &RequestContext<'_>) {
        let _ = ctx;
    }
}

/// An open file and how the kernel should treat it.
pub struct Opened {
    /// The file.
    pub file: Box<dyn OpenFile>,
    /// `DIRECT_IO`, `KEEP_CACHE`, … (the session may add `DIRECT_IO |
    /// PARALLEL_DIRECT_WRITES` for an `O_DIRECT` open: see
    /// [`SessionConfig::o_direct_parallel_writes`](crate::SessionConfig::o_direct_parallel_writes))
    pub flags: FopenFlags,
    /// A passthrough backing file: the kernel reads and writes it directly
    /// (see [`RequestContext::open_backing`]); the library keeps it until
    /// RELEASE.
    ///
    /// The kernel wants one backing file for all open files of an inode
    /// and no mix of passthrough and other opens, so the library decides
    /// per node: the first passthrough open's backing file serves every
    /// later open of the node while one is open (open it for reading and
    /// writing), and while the node has opens served by their
    /// [`OpenFile`], a new one is served by its `OpenFile` too (which must
    /// therefore be able to serve reads and writes itself).
    pub backing: Option<BackingFile>,
}

impl Opened {
    /// `file`, no backing file, flags `NOFLUSH` only: closing it sends no
    /// FLUSH (see [`Opened::with_flush`]).
    pub fn new(file: impl OpenFile) -> Opened {
        Opened {
            file: Box::new(file),
            flags: FopenFlags::NOFLUSH,
            backing: None,
        }
    }

    open_builders!();
}
