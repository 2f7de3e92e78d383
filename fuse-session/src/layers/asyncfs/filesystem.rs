//! The [`AsyncFilesystem`] trait: the operations of
//! [`Filesystem`](crate::Filesystem), as `async` methods that return their
//! answer.
//!
//! Methods are declared `fn … -> impl Future<Output = …> + Send` so that
//! the adapter, generic over the filesystem, can hand the futures to a
//! multi-threaded executor; implement them with plain `async fn` (Rust
//! checks that each future is `Send`). The declared form, rather than
//! `async fn` in the trait, is what lets a trait state that bound for every
//! implementation; no boxing and no macro is involved.
//!
//! The documentation of each operation (what the kernel sends when, what
//! the answer means, which errors it remembers) is that of the sync
//! trait's method of the same name; only the differences are said here.

use crate::attr::{FileAttr, Statfs};
use crate::init::InitConfig;
use crate::layers::asyncfs::context::AsyncContext;
use crate::layers::values::{Created, Data, DirEntry, DirEntryPlus, Ioctl, Open};
use crate::ops::*;
use crate::types::{Entry, FileHandle, Inode, Lock, LockOwner};
use fuse_proto::Errno;
use fuse_proto::abi::Statx;
use std::ffi::CStr;
use std::future::Future;
use std::time::Duration;

/// A filesystem whose operations are `async`, served by
/// [`AsyncFs`](crate::layers::asyncfs::AsyncFs). See the
/// [module documentation](crate::asyncfs).
///
/// Defaults answer as the sync trait's do (`ENOSYS` for most, success for
/// OPEN, OPENDIR, RELEASE, RELEASEDIR, an empty STATFS, `EROFS` for a
/// CREATE without `create` or `atomic_open`).
pub trait AsyncFilesystem: Send + Sync + 'static {
    /// INIT, as [`Filesystem::init`](crate::Filesystem::init): called once,
    /// on a worker, before any request.
    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        let _ = config;
        Ok(())
    }

    /// The session ends (after the adapter has cancelled every future
    /// still running).
    fn destroy(&self) {}

    /// The recovery contract, as [`Filesystem::recovery`](crate::Filesystem::recovery).
    /// Under a keeper the adapter serves only
    /// [`Recovery::Durable`](crate::Recovery::Durable) async filesystems:
    /// futures still running when a session retires could change a state
    /// handed over ([`Recovery::HandedOver`](crate::Recovery::HandedOver))
    /// after it was saved, so that is refused; a request whose future a
    /// retirement or a crash cut short is sent again to the successor, as
    /// after a crash.
    fn recovery(&self) -> crate::Recovery {
        crate::Recovery::Unstated
    }

    /// FORGET: drop `nlookup` lookup references of `ino`. Not `async`: it
    /// has no answer and runs on the thread that reads requests, which must
    /// not wait; update a counter and return (spawn a task of your own for
    /// slow clean-up).
    fn forget(&self, ino: Inode, nlookup: u64) {
        let _ = (ino, nlookup);
    }

    /// BATCH_FORGET: calls [`AsyncFilesystem::forget`] for each node.
    fn batch_forget(&self, nodes: &mut dyn Iterator<Item = (Inode, u64)>) {
        for (ino, n) in nodes {
            self.forget(ino, n);
        }
    }

    /// LOOKUP: the entry of `name` in `parent` (one lookup reference), an
    /// entry with node id 0 to let the kernel cache the absence for its
    /// `entry_ttl`, or `ENOENT`.
    fn lookup(
        &self,
        ctx: &AsyncContext,
        parent: Inode,
        name: &CStr,
    ) -> impl Future<Output = Result<Entry, Errno>> + Send {
        let _ = (ctx, parent, name);
        async { Err(Errno::ENOSYS) }
    }

    /// GETATTR: the attributes and how long the kernel may cache them.
    fn getattr(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: Option<FileHandle>,
    ) -> impl Future<Output = Result<(Duration, FileAttr), Errno>> + Send {
        let _ = (ctx, ino, fh);
        async { Err(Errno::ENOSYS) }
    }

    /// SETATTR: apply the fields that are `Some`; the new attributes.
    fn setattr(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        req: &SetattrRequest,
    ) -> impl Future<Output = Result<(Duration, FileAttr), Errno>> + Send {
        let _ = (ctx, ino, req);
        async { Err(Errno::ENOSYS) }
    }

    /// READLINK: the link's target.
    fn readlink(&self, ctx: &AsyncContext, ino: Inode) -> impl Future<Output = Result<Data, Errno>> + Send {
        let _ = (ctx, ino);
        async { Err(Errno::ENOSYS) }
    }

    /// SYMLINK: the new link's entry.
    fn symlink(
        &self,
        ctx: &AsyncContext,
        parent: Inode,
        name: &CStr,
        target: &CStr,
    ) -> impl Future<Output = Result<Entry, Errno>> + Send {
        let _ = (ctx, parent, name, target);
        async { Err(Errno::ENOSYS) }
    }

    /// MKNOD: the new node's entry. Modes of MKNOD, MKDIR and CREATE are
    /// as [`CreateRequest::mode`](crate::CreateRequest::mode) says; code
    /// that creates after an `await` runs on the runtime's threads, which
    /// keep the daemon's umask unless they start with
    /// [`crate::umask::clear_for_this_thread`] (Tokio's `on_thread_start`).
    fn mknod(
        &self,
        ctx: &AsyncContext,
        parent: Inode,
        name: &CStr,
        req: MknodRequest,
    ) -> impl Future<Output = Result<Entry, Errno>> + Send {
        let _ = (ctx, parent, name, req);
        async { Err(Errno::ENOSYS) }
    }

    /// MKDIR: the new directory's entry.
    fn mkdir(
        &self,
        ctx: &AsyncContext,
        parent: Inode,
        name: &CStr,
        mode: u32,
    ) -> impl Future<Output = Result<Entry, Errno>> + Send {
        let _ = (ctx, parent, name, mode);
        async { Err(Errno::ENOSYS) }
    }

    /// UNLINK.
    fn unlink(
        &self,
        ctx: &AsyncContext,
        parent: Inode,
        name: &CStr,
    ) -> impl Future<Output = Result<(), Errno>> + Send {
        let _ = (ctx, parent, name);
        async { Err(Errno::ENOSYS) }
    }

    /// RMDIR.
    fn rmdir(
        &self,
        ctx: &AsyncContext,
        parent: Inode,
        name: &CStr,
    ) -> impl Future<Output = Result<(), Errno>> + Send {
        let _ = (ctx, parent, name);
        async { Err(Errno::ENOSYS) }
    }

    /// RENAME and RENAME2.
    fn rename(
        &self,
        ctx: &AsyncContext,
        req: &RenameRequest<'_>,
    ) -> impl Future<Output = Result<(), Errno>> + Send {
        let _ = (ctx, req);
        async { Err(Errno::ENOSYS) }
    }

    /// LINK: the entry of `ino` (one more lookup reference).
    fn link(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        newparent: Inode,
        newname: &CStr,
    ) -> impl Future<Output = Result<Entry, Errno>> + Send {
        let _ = (ctx, ino, newparent, newname);
        async { Err(Errno::ENOSYS) }
    }

    /// OPEN: the default opens with handle 0 and no flags.
    fn open(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        flags: OpenFlags,
    ) -> impl Future<Output = Result<Open, Errno>> + Send {
        let _ = (ctx, ino, flags);
        async { Ok(Open::new(FileHandle(0))) }
    }

    /// READ: up to `req.size` bytes at `req.offset` (fewer: end of file).
    fn read(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        req: ReadRequest,
    ) -> impl Future<Output = Result<Data, Errno>> + Send {
        let _ = (ctx, ino, fh, req);
        async { Err(Errno::ENOSYS) }
    }

    /// WRITE: the count written. `req.data` is always in memory here (the
    /// adapter copies it out of the worker's buffer, or pipe, before the
    /// worker reads the next request).
    fn write(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        req: WriteRequest<'_>,
    ) -> impl Future<Output = Result<u32, Errno>> + Send {
        let _ = (ctx, ino, fh, req);
        async { Err(Errno::ENOSYS) }
    }

    /// FLUSH: each `close(2)` of a descriptor of the open file (several
    /// per open, the first possibly before any data; commit only what was
    /// written since the last commit): as the sync trait's
    /// [`flush`](crate::Filesystem::flush) says. Cancelled by an INTERRUPT
    /// unless it runs in an [`AsyncContext::must_finish`] section.
    fn flush(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        lock_owner: LockOwner,
    ) -> impl Future<Output = Result<(), Errno>> + Send {
        let _ = (ctx, ino, fh, lock_owner);
        async { Err(Errno::ENOSYS) }
    }

    /// RELEASE: never cancelled (an INTERRUPT does not reach it). The
    /// default succeeds. Once per open, after every FLUSH, but not awaited
    /// by `close`: see the sync trait's
    /// [`release`](crate::Filesystem::release).
    fn release(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        req: ReleaseRequest,
    ) -> impl Future<Output = Result<(), Errno>> + Send {
        let _ = (ctx, ino, fh, req);
        async { Ok(()) }
    }

    /// FSYNC.
    fn fsync(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        datasync: bool,
    ) -> impl Future<Output = Result<(), Errno>> + Send {
        let _ = (ctx, ino, fh, datasync);
        async { Err(Errno::ENOSYS) }
    }

    /// OPENDIR: the default opens with handle 0.
    fn opendir(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        flags: OpenFlags,
    ) -> impl Future<Output = Result<Open, Errno>> + Send {
        let _ = (ctx, ino, flags);
        async { Ok(Open::new(FileHandle(0))) }
    }

    /// READDIR: the entries after cookie `offset`, in order. The adapter
    /// sends as many as fit in the kernel's buffer (a page or a few: about
    /// a hundred names) and drops the rest; the kernel asks again from the
    /// last cookie it got. An empty list is the end of the directory.
    fn readdir(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        offset: u64,
    ) -> impl Future<Output = Result<Vec<DirEntry>, Errno>> + Send {
        let _ = (ctx, ino, fh, offset);
        async { Err(Errno::ENOSYS) }
    }

    /// READDIRPLUS: as READDIR, with entries; see [`DirEntryPlus`] for
    /// lookup counts.
    fn readdirplus(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        offset: u64,
    ) -> impl Future<Output = Result<Vec<DirEntryPlus>, Errno>> + Send {
        let _ = (ctx, ino, fh, offset);
        async { Err(Errno::ENOSYS) }
    }

    /// RELEASEDIR: never cancelled. The default succeeds. `req` is what
    /// [`AsyncFilesystem::release`] gets (`req.flags`: the flags this
    /// method took before).
    fn releasedir(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        req: ReleaseRequest,
    ) -> impl Future<Output = Result<(), Errno>> + Send {
        let _ = (ctx, ino, fh, req);
        async { Ok(()) }
    }

    /// FSYNCDIR.
    fn fsyncdir(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        datasync: bool,
    ) -> impl Future<Output = Result<(), Errno>> + Send {
        let _ = (ctx, ino, fh, datasync);
        async { Err(Errno::ENOSYS) }
    }

    /// STATFS: the default reports an empty filesystem.
    fn statfs(&self, ctx: &AsyncContext, ino: Inode) -> impl Future<Output = Result<Statfs, Errno>> + Send {
        let _ = (ctx, ino);
        async { Ok(Statfs::new()) }
    }

    /// SETXATTR.
    fn setxattr(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        name: &CStr,
        req: SetxattrRequest<'_>,
    ) -> impl Future<Output = Result<(), Errno>> + Send {
        let _ = (ctx, ino, name, req);
        async { Err(Errno::ENOSYS) }
    }

    /// GETXATTR: the whole value (`ENODATA` if none). The adapter answers
    /// the kernel's size probe and `ERANGE` from it.
    fn getxattr(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        name: &CStr,
    ) -> impl Future<Output = Result<Data, Errno>> + Send {
        let _ = (ctx, ino, name);
        async { Err(Errno::ENOSYS) }
    }

    /// LISTXATTR: the names, each followed by a NUL (sized as GETXATTR).
    fn listxattr(&self, ctx: &AsyncContext, ino: Inode) -> impl Future<Output = Result<Data, Errno>> + Send {
        let _ = (ctx, ino);
        async { Err(Errno::ENOSYS) }
    }

    /// REMOVEXATTR.
    fn removexattr(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        name: &CStr,
    ) -> impl Future<Output = Result<(), Errno>> + Send {
        let _ = (ctx, ino, name);
        async { Err(Errno::ENOSYS) }
    }

    /// ACCESS.
    fn access(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        mask: i32,
    ) -> impl Future<Output = Result<(), Errno>> + Send {
        let _ = (ctx, ino, mask);
        async { Err(Errno::ENOSYS) }
    }

    /// CREATE: the default calls [`AsyncFilesystem::atomic_open`] with
    /// `O_CREAT` and turns its `ENOSYS` into `EROFS`, as the sync trait's
    /// does.
    fn create(
        &self,
        ctx: &AsyncContext,
        parent: Inode,
        name: &CStr,
        req: CreateRequest,
    ) -> impl Future<Output = Result<Created, Errno>> + Send {
        let req = CreateRequest {
            flags: OpenFlags::from_bits(req.flags.bits() | libc::O_CREAT),
            ..req
        };
        async move {
            match self.atomic_open(ctx, parent, name, req).await {
                Err(Errno::ENOSYS) => Err(Errno::EROFS),
                r => r,
            }
        }
    }

    /// Atomic open (and the default CREATE): set [`Created::created`] only
    /// when this call created the file.
    fn atomic_open(
        &self,
        ctx: &AsyncContext,
        parent: Inode,
        name: &CStr,
        req: CreateRequest,
    ) -> impl Future<Output = Result<Created, Errno>> + Send {
        let _ = (ctx, parent, name, req);
        async { Err(Errno::ENOSYS) }
    }

    /// GETLK: the conflicting lock, or one of type `F_UNLCK`.
    fn getlk(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        req: LockRequest,
    ) -> impl Future<Output = Result<Lock, Errno>> + Send {
        let _ = (ctx, ino, fh, req);
        async { Err(Errno::ENOSYS) }
    }

    /// SETLK/SETLKW: for SETLKW (`req.sleep`) just await the lock: an
    /// INTERRUPT (the caller's signal) drops the future.
    fn setlk(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        req: LockRequest,
    ) -> impl Future<Output = Result<(), Errno>> + Send {
        let _ = (ctx, ino, fh, req);
        async { Err(Errno::ENOSYS) }
    }

    /// BMAP: the device block.
    fn bmap(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        blocksize: u32,
        block: u64,
    ) -> impl Future<Output = Result<u64, Errno>> + Send {
        let _ = (ctx, ino, blocksize, block);
        async { Err(Errno::ENOSYS) }
    }

    /// IOCTL.
    fn ioctl(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        req: IoctlRequest<'_>,
    ) -> impl Future<Output = Result<Ioctl, Errno>> + Send {
        let _ = (ctx, ino, fh, req);
        async { Err(Errno::ENOSYS) }
    }

    /// POLL: the ready events.
    fn poll(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        req: PollRequest,
    ) -> impl Future<Output = Result<u32, Errno>> + Send {
        let _ = (ctx, ino, fh, req);
        async { Err(Errno::ENOSYS) }
    }

    /// FALLOCATE.
    fn fallocate(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        req: FallocateRequest,
    ) -> impl Future<Output = Result<(), Errno>> + Send {
        let _ = (ctx, ino, fh, req);
        async { Err(Errno::ENOSYS) }
    }

    /// LSEEK: the offset found.
    fn lseek(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        req: LseekRequest,
    ) -> impl Future<Output = Result<u64, Errno>> + Send {
        let _ = (ctx, ino, fh, req);
        async { Err(Errno::ENOSYS) }
    }

    /// COPY_FILE_RANGE: the count copied.
    fn copy_file_range(
        &self,
        ctx: &AsyncContext,
        req: &CopyFileRangeRequest,
    ) -> impl Future<Output = Result<u64, Errno>> + Send {
        let _ = (ctx, req);
        async { Err(Errno::ENOSYS) }
    }

    /// STATX: the attributes and how long the kernel may cache them.
    fn statx(
        &self,
        ctx: &AsyncContext,
        ino: Inode,
        fh: Option<FileHandle>,
        req: StatxRequest,
    ) -> impl Future<Output = Result<(Duration, Statx), Errno>> + Send {
        let _ = (ctx, ino, fh, req);
        async { Err(Errno::ENOSYS) }
    }

    /// TMPFILE: as CREATE.
    fn tmpfile(
        &self,
        ctx: &AsyncContext,
        parent: Inode,
        req: CreateRequest,
    ) -> impl Future<Output = Result<Created, Errno>> + Send {
        let _ = (ctx, parent, req);
        async { Err(Errno::ENOSYS) }
    }

    /// SYNCFS.
    fn syncfs(&self, ctx: &AsyncContext, ino: Inode) -> impl Future<Output = Result<(), Errno>> + Send {
        let _ = (ctx, ino);
        async { Err(Errno::ENOSYS) }
    }
}
