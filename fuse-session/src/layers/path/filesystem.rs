//! The trait a filesystem addressed by paths implements
//! ([`PathFilesystem`]), and the open file it returns ([`PathOpened`]).

use crate::attr::{FileAttr, Statfs};
use crate::backing::BackingFile;
use crate::context::RequestContext;
use crate::init::InitConfig;
use crate::layers::core::open_builders;
use crate::ops::*;
use crate::reply::*;
use crate::types::LockOwner;
use fuse_proto::Errno;
use fuse_proto::flags::FopenFlags;
use std::ffi::CStr;
use std::path::Path;

use super::dir_fill::PathDirFill;

/// A filesystem addressed by paths ("/" is the root; no trailing slash).
///
/// Only [`PathFilesystem::getattr`] is required. Defaults: `EROFS` for
/// changes, `EINVAL` for `readlink`, `open`, `read` and `write`,
/// `ENOTDIR` for `readdir`. Methods run on worker threads and may block;
/// a method must not wait for another request of the same filesystem.
pub trait PathFilesystem: Send + Sync + 'static {
    /// What [`PathFilesystem::open`] returns and reads and writes go to.
    type File: Send + Sync + 'static;

    /// Called once with the kernel's INIT offer (see [`Filesystem::init`](crate::Filesystem::init)).
    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        let _ = config;
        Ok(())
    }

    /// Attributes of `path`, or of the open `file` (`fstat`): at least one
    /// of the two is given; `path` is `None` for a file that lost its name.
    fn getattr(
        &self,
        ctx: &RequestContext<'_>,
        path: Option<&Path>,
        file: Option<&Self::File>,
    ) -> Result<FileAttr, Errno>;

    /// Changes attributes (`chmod`, `chown`, `truncate`, `utimensat`), by
    /// path or through an open file as for `getattr`; the new attributes.
    fn setattr(
        &self,
        ctx: &RequestContext<'_>,
        path: Option<&Path>,
        file: Option<&Self::File>,
        req: &SetattrRequest,
    ) -> Result<FileAttr, Errno> {
        let _ = (ctx, path, file, req);
        Err(Errno::EROFS)
    }

    /// The target of the symbolic link at `path`.
    fn readlink(&self, ctx: &RequestContext<'_>, path: &Path) -> Result<Vec<u8>, Errno> {
        let _ = (ctx, path);
        Err(Errno::EINVAL)
    }

    /// Creates a node (fifo, socket, device, regular file); its attributes.
    fn mknod(&self, ctx: &RequestContext<'_>, path: &Path, req: MknodRequest) -> Result<FileAttr, Errno> {
        let _ = (ctx, path, req);
        Err(Errno::EROFS)
    }

    /// Creates a directory (`mode`: permission bits, to create with
    /// exactly, see [`CreateRequest::mode`]); its attributes.
    fn mkdir(&self, ctx: &RequestContext<'_>, path: &Path, mode: u32) -> Result<FileAttr, Errno> {
        let _ = (ctx, path, mode);
        Err(Errno::EROFS)
    }

    /// Creates a symbolic link at `path` to `target`; its attributes.
    fn symlink(&self, ctx: &RequestContext<'_>, path: &Path, target: &CStr) -> Result<FileAttr, Errno> {
        let _ = (ctx, path, target);
        Err(Errno::EROFS)
    }

    /// Makes `to` a hard link of `from`; the attributes of the file. The
    /// default answers `EROFS`, as for every change (`link(2)` then fails
    /// with "Read-only file system").
    fn link(&self, ctx: &RequestContext<'_>, from: &Path, to: &Path) -> Result<FileAttr, Errno> {
        let _ = (ctx, from, to);
        Err(Errno::EROFS)
    }

    /// Removes a non-directory.
    fn unlink(&self, ctx: &RequestContext<'_>, path: &Path) -> Result<(), Errno> {
        let _ = (ctx, path);
        Err(Errno::EROFS)
    }

    /// Removes an empty directory.
    fn rmdir(&self, ctx: &RequestContext<'_>, path: &Path) -> Result<(), Errno> {
        let _ = (ctx, path);
        Err(Errno::EROFS)
    }

    /// Renames `from` to `to` (`renameat2` flags).
    fn rename(
        &self,
        ctx: &RequestContext<'_>,
        from: &Path,
        to: &Path,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let _ = (ctx, from, to, flags);
        Err(Errno::EROFS)
    }

    /// Opens the file at `path`.
    fn open(
        &self,
        ctx: &RequestContext<'_>,
        path: &Path,
        flags: OpenFlags,
    ) -> Result<PathOpened<Self::File>, Errno> {
        let _ = (ctx, path, flags);
        Err(Errno::EINVAL)
    }

    /// Creates (or, without `O_EXCL`, opens) the regular file at `path`;
    /// its attributes and the open file.
    fn create(
        &self,
        ctx: &RequestContext<'_>,
        path: &Path,
        req: CreateRequest,
    ) -> Result<(FileAttr, PathOpened<Self::File>), Errno> {
        let _ = (ctx, path, req);
        Err(Errno::EROFS)
    }

    /// READ from an open file: answer with `reply`.
    fn read(&self, ctx: &RequestContext<'_>, file: &Self::File, req: ReadRequest, reply: ReplyData) {
        let _ = (ctx, file, req);
        reply.error(Errno::EINVAL);
    }

    /// WRITE to an open file: the count written.
    fn write(
        &self,
        ctx: &RequestContext<'_>,
        file: &Self::File,
        req: WriteRequest<'_>,
    ) -> Result<u32, Errno> {
        let _ = (ctx, file, req);
        Err(Errno::EINVAL)
    }

    /// FLUSH (each `close(2)`): its error is what `close` returns. Sent
    /// only for files opened [`PathOpened::with_flush`] (and, with
    /// writeback caching, for every file); for the others the kernel skips
    /// the round trip. Several per open, the first possibly before any
    /// data (bash's `echo x > f`): commit only what was written since the
    /// last commit, as [`Filesystem::flush`](crate::Filesystem::flush) explains.
    fn flush(&self, ctx: &RequestContext<'_>, file: &Self::File, owner: LockOwner) -> Result<(), Errno> {
        let _ = (ctx, file, owner);
        Ok(())
    }

    /// FSYNC.
    fn fsync(&self, ctx: &RequestContext<'_>, file: &Self::File, datasync: bool) -> Result<(), Errno> {
        let _ = (ctx, file, datasync);
        Ok(())
    }

    /// FALLOCATE on an open file. `ENOSYS` (the default) makes the kernel
    /// answer later calls `EOPNOTSUPP` itself.
    fn fallocate(
        &self,
        ctx: &RequestContext<'_>,
        file: &Self::File,
        req: FallocateRequest,
    ) -> Result<(), Errno> {
        let _ = (ctx, file, req);
        Err(Errno::ENOSYS)
    }

    /// LSEEK with `SEEK_DATA` or `SEEK_HOLE` on an open file. `ENOSYS` (the
    /// default) makes the kernel answer such seeks itself (all data).
    fn lseek(&self, ctx: &RequestContext<'_>, file: &Self::File, req: LseekRequest) -> Result<u64, Errno> {
        let _ = (ctx, file, req);
        Err(Errno::ENOSYS)
    }

    /// COPY_FILE_RANGE from one open file to another: the count copied.
    /// `ENOSYS` (the default) makes the kernel copy through READ and WRITE.
    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        ctx: &RequestContext<'_>,
        from: &Self::File,
        off_in: u64,
        to: &Self::File,
        off_out: u64,
        len: u64,
    ) -> Result<u64, Errno> {
        let _ = (ctx, from, off_in, to, off_out, len);
        Err(Errno::ENOSYS)
    }

    /// RELEASE: the file is closed for good. (Should a request still be
    /// running with it, the file is dropped when that ends instead.) Not
    /// awaited by `close`, and possibly long after it: see
    /// [`Filesystem::release`](crate::Filesystem::release).
    fn release(&self, ctx: &RequestContext<'_>, file: Self::File) {
        let _ = (ctx, file);
    }

    /// Lists the directory at `path` after cookie `offset` (0: from the
    /// start), adding entries with [`PathDirFill::add`] until it returns
    /// [`DirAdd::Full`]. `offset` is a cookie this method gave an entry
    /// (the entry to continue after), or 0. The library adds "." and ".."
    /// itself (cookies 1 and 2 on the wire) and shifts this method's
    /// cookies past them.
    fn readdir(
        &self,
        ctx: &RequestContext<'_>,
        path: &Path,
        offset: u64,
        out: &mut PathDirFill<'_>,
    ) -> Result<(), Errno> {
        let _ = (ctx, path, offset, out);
        Err(Errno::ENOTDIR)
    }

    /// The value of extended attribute `name` of `path` (`ENODATA` if it
    /// has none). `ENOSYS` (the default) makes the kernel answer every
    /// xattr call `EOPNOTSUPP` from then on. The library answers the size
    /// probe and `ERANGE`.
    fn getxattr(&self, ctx: &RequestContext<'_>, path: &Path, name: &CStr) -> Result<Vec<u8>, Errno> {
        let _ = (ctx, path, name);
        Err(Errno::ENOSYS)
    }

    /// The names of the extended attributes of `path`, each followed by a NUL.
    fn listxattr(&self, ctx: &RequestContext<'_>, path: &Path) -> Result<Vec<u8>, Errno> {
        let _ = (ctx, path);
        Err(Errno::ENOSYS)
    }

    /// Sets extended attribute `name` of `path` (`flags`: `XATTR_CREATE`,
    /// `XATTR_REPLACE` or 0).
    fn setxattr(
        &self,
        ctx: &RequestContext<'_>,
        path: &Path,
        name: &CStr,
        value: &[u8],
        flags: i32,
    ) -> Result<(), Errno> {
        let _ = (ctx, path, name, value, flags);
        Err(Errno::ENOSYS)
    }

    /// Removes extended attribute `name` of `path`.
    fn removexattr(&self, ctx: &RequestContext<'_>, path: &Path, name: &CStr) -> Result<(), Errno> {
        let _ = (ctx, path, name);
        Err(Errno::ENOSYS)
    }

    /// Filesystem statistics. The default: an empty filesystem with
    /// 255-byte names, [`Statfs::new`].
    fn statfs(&self, ctx: &RequestContext<'_>, path: &Path) -> Result<Statfs, Errno> {
        let _ = (ctx, path);
        Ok(Statfs::new())
    }
}

/// An open file and how the kernel should treat it.
pub struct PathOpened<F> {
    /// The file.
    pub file: F,
    /// `DIRECT_IO`, `KEEP_CACHE`, … (the session may add `DIRECT_IO |
    /// PARALLEL_DIRECT_WRITES` for an `O_DIRECT` open: see
    /// [`SessionConfig::o_direct_parallel_writes`](crate::SessionConfig::o_direct_parallel_writes))
    pub flags: FopenFlags,
    /// A passthrough backing file (see [`RequestContext::open_backing`];
    /// the kernel must have granted `PASSTHROUGH`, asked for in
    /// [`PathFilesystem::init`] with a `max_stack_depth`); kept until
    /// RELEASE.
    ///
    /// The kernel wants one backing file for all open files of an inode
    /// and no mix of passthrough and other opens, so the library decides
    /// per node: the first passthrough open's backing file serves every
    /// later open of the node while one is open (open it for reading and
    /// writing), and while the node has opens served by their `File`, a
    /// new one is served by its `File` too. A `File` must therefore be able
    /// to serve reads and writes itself.
    pub backing: Option<BackingFile>,
}

impl<F> PathOpened<F> {
    /// `file`, no backing file, flags `NOFLUSH` only: closing it sends no
    /// FLUSH (see [`PathOpened::with_flush`]).
    pub fn new(file: F) -> Self {
        PathOpened {
            file,
            flags: FopenFlags::NOFLUSH,
            backing: None,
        }
    }

    open_builders!();
}
