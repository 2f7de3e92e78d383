//! The [`Filesystem`] trait: one method per operation of protocol 7.45.
//!
//! Methods take `&self` (the session calls them from many threads at once;
//! keep shared state sharded or per object), a [`RequestContext`] with the
//! caller's identity, the operation's arguments, and a typed reply handle.
//! Every method defaults to `ENOSYS` (or the kernel's documented fallback).
//! A handler may answer at once or move the handle to another thread and
//! answer later; a handle dropped unanswered answers `EIO`.

#![allow(clippy::too_many_arguments)]

use crate::context::RequestContext;
use crate::init::InitConfig;
use crate::reply::*;
use crate::types::{FileHandle, Inode, Lock, LockOwner, PollHandle};
use fuse_proto::Errno;
use fuse_proto::abi::SetattrIn;
use fuse_proto::flags::{SetxattrFlags, WriteFlags};
use std::ffi::CStr;

/// A filesystem served by a [`crate::Session`].
pub trait Filesystem: Send + Sync + 'static {
    /// Called once with the kernel's INIT offer; state the capabilities and
    /// limits you want in `config`. Returning an error fails the mount.
    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        let _ = config;
        Ok(())
    }

    /// Called when the session ends (DESTROY, unmount or shutdown).
    fn destroy(&self) {}

    /// Look `name` up in `parent`; each successful reply adds one lookup
    /// reference that FORGET later drops.
    fn lookup(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        let _ = (ctx, parent, name);
        reply.error(Errno::ENOSYS);
    }

    /// Drop `nlookup` lookup references of `ino`. No reply.
    fn forget(&self, ctx: &RequestContext<'_>, ino: Inode, nlookup: u64) {
        let _ = (ctx, ino, nlookup);
    }

    /// BATCH_FORGET: by default calls [`Filesystem::forget`] for each node.
    fn batch_forget(&self, ctx: &RequestContext<'_>, nodes: &mut dyn Iterator<Item = (Inode, u64)>) {
        for (ino, n) in nodes {
            self.forget(ctx, ino, n);
        }
    }

    /// Attributes of `ino` (`fh` when the kernel asks through an open file).
    fn getattr(&self, ctx: &RequestContext<'_>, ino: Inode, fh: Option<FileHandle>, reply: ReplyAttr) {
        let _ = (ctx, ino, fh);
        reply.error(Errno::ENOSYS);
    }

    /// Change attributes; `attr.valid` (see [`fuse_proto::flags::SetattrValid`])
    /// says which fields apply.
    fn setattr(&self, ctx: &RequestContext<'_>, ino: Inode, attr: &SetattrIn, reply: ReplyAttr) {
        let _ = (ctx, ino, attr);
        reply.error(Errno::ENOSYS);
    }

    /// The target of symbolic link `ino`.
    fn readlink(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyData) {
        let _ = (ctx, ino);
        reply.error(Errno::ENOSYS);
    }

    /// Create symbolic link `name` in `parent` pointing at `target`.
    fn symlink(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        target: &CStr,
        reply: ReplyEntry,
    ) {
        let _ = (ctx, parent, name, target);
        reply.error(Errno::ENOSYS);
    }

    /// Create a node (`mode` includes the type bits; the umask is in `ctx`).
    fn mknod(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        mode: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _ = (ctx, parent, name, mode, rdev);
        reply.error(Errno::ENOSYS);
    }

    /// Create a directory.
    fn mkdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, mode: u32, reply: ReplyEntry) {
        let _ = (ctx, parent, name, mode);
        reply.error(Errno::ENOSYS);
    }

    /// Remove `name` from `parent`.
    fn unlink(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        let _ = (ctx, parent, name);
        reply.error(Errno::ENOSYS);
    }

    /// Remove directory `name` from `parent`.
    fn rmdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        let _ = (ctx, parent, name);
        reply.error(Errno::ENOSYS);
    }

    /// Rename (RENAME and RENAME2); `flags` are `RENAME_NOREPLACE`,
    /// `RENAME_EXCHANGE`, `RENAME_WHITEOUT`.
    fn rename(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        newparent: Inode,
        newname: &CStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        let _ = (ctx, parent, name, newparent, newname, flags);
        reply.error(Errno::ENOSYS);
    }

    /// Hard-link `ino` as `newname` in `newparent`.
    fn link(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        newparent: Inode,
        newname: &CStr,
        reply: ReplyEntry,
    ) {
        let _ = (ctx, ino, newparent, newname);
        reply.error(Errno::ENOSYS);
    }

    /// Open `ino` with `open(2)` `flags`. The default opens with handle 0 and
    /// no flags, so a filesystem without state per open file need not care.
    fn open(&self, ctx: &RequestContext<'_>, ino: Inode, flags: i32, reply: ReplyOpen) {
        let _ = (ctx, ino, flags);
        reply.opened(FileHandle(0), fuse_proto::flags::FopenFlags::empty());
    }

    /// Read up to `size` bytes at `offset`. A short reply means end of file
    /// (unless the file was opened with `DIRECT_IO`).
    fn read(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: i32,
        lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _ = (ctx, ino, fh, offset, size, flags, lock_owner);
        reply.error(Errno::ENOSYS);
    }

    /// Write `data` at `offset`; reply with the number of bytes written.
    fn write(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: i32,
        lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _ = (ctx, ino, fh, offset, data, write_flags, flags, lock_owner);
        reply.error(Errno::ENOSYS);
    }

    /// A file descriptor of an open file is being closed.
    fn flush(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _ = (ctx, ino, fh, lock_owner);
        reply.error(Errno::ENOSYS);
    }

    /// The last reference to an open file is gone. `flush` asks for a flush
    /// as well; `flock_release` for the flock of `lock_owner` to be dropped.
    fn release(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        flags: i32,
        lock_owner: Option<LockOwner>,
        flush: bool,
        flock_release: bool,
        reply: ReplyEmpty,
    ) {
        let _ = (ctx, ino, fh, flags, lock_owner, flush, flock_release);
        reply.ok();
    }

    /// Synchronise file contents (`datasync`: data only).
    fn fsync(&self, ctx: &RequestContext<'_>, ino: Inode, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let _ = (ctx, ino, fh, datasync);
        reply.error(Errno::ENOSYS);
    }

    /// Open directory `ino`. Defaults to handle 0.
    fn opendir(&self, ctx: &RequestContext<'_>, ino: Inode, flags: i32, reply: ReplyOpen) {
        let _ = (ctx, ino, flags);
        reply.opened(FileHandle(0), fuse_proto::flags::FopenFlags::empty());
    }

    /// Directory entries after cookie `offset` (0: from the start).
    fn readdir(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let _ = (ctx, ino, fh, offset);
        reply.error(Errno::ENOSYS);
    }

    /// Directory entries with attributes; each entry but "." and ".." counts
    /// as a lookup.
    fn readdirplus(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let _ = (ctx, ino, fh, offset);
        reply.error(Errno::ENOSYS);
    }

    /// Release an open directory.
    fn releasedir(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        flags: i32,
        reply: ReplyEmpty,
    ) {
        let _ = (ctx, ino, fh, flags);
        reply.ok();
    }

    /// Synchronise directory contents.
    fn fsyncdir(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _ = (ctx, ino, fh, datasync);
        reply.error(Errno::ENOSYS);
    }

    /// Filesystem statistics. The default reports an empty filesystem with
    /// 255-byte names, as the kernel would without the call.
    fn statfs(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyStatfs) {
        let _ = (ctx, ino);
        reply.statfs(&fuse_proto::abi::Kstatfs {
            bsize: 512,
            namelen: 255,
            ..Default::default()
        });
    }

    /// Set extended attribute `name` to `value` (`flags`: `XATTR_CREATE`,
    /// `XATTR_REPLACE`).
    fn setxattr(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        name: &CStr,
        value: &[u8],
        flags: i32,
        setxattr_flags: SetxattrFlags,
        reply: ReplyEmpty,
    ) {
        let _ = (ctx, ino, name, value, flags, setxattr_flags);
        reply.error(Errno::ENOSYS);
    }

    /// Get extended attribute `name`: with `size` 0 reply its length with
    /// [`ReplyXattr::size`], else the value (ERANGE if it exceeds `size`).
    fn getxattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, size: u32, reply: ReplyXattr) {
        let _ = (ctx, ino, name, size);
        reply.error(Errno::ENOSYS);
    }

    /// List extended attribute names (NUL-separated), sized as for getxattr.
    fn listxattr(&self, ctx: &RequestContext<'_>, ino: Inode, size: u32, reply: ReplyXattr) {
        let _ = (ctx, ino, size);
        reply.error(Errno::ENOSYS);
    }

    /// Remove extended attribute `name`.
    fn removexattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, reply: ReplyEmpty) {
        let _ = (ctx, ino, name);
        reply.error(Errno::ENOSYS);
    }

    /// Check access (`mask`: `R_OK | W_OK | X_OK`, or `F_OK`).
    fn access(&self, ctx: &RequestContext<'_>, ino: Inode, mask: i32, reply: ReplyEmpty) {
        let _ = (ctx, ino, mask);
        reply.error(Errno::ENOSYS);
    }

    /// Create and open `name` in `parent` (FUSE_CREATE). The default calls
    /// [`Filesystem::atomic_open`], so implementing that one serves both.
    fn create(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        mode: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.atomic_open(ctx, parent, name, flags | libc::O_CREAT, mode, reply);
    }

    /// Look up and open `name` in `parent` in one step, creating it when
    /// `flags` has `O_CREAT` (honouring `O_EXCL` and `O_TRUNC`). Serves
    /// FUSE_CREATE (through the default [`Filesystem::create`]) and, when the
    /// session enabled it, the out-of-tree atomic-open request. Reply with
    /// [`ReplyCreate::created`] only when this call created the file.
    fn atomic_open(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        flags: i32,
        mode: u32,
        reply: ReplyCreate,
    ) {
        let _ = (ctx, parent, name, flags, mode);
        reply.error(Errno::ENOSYS);
    }

    /// Test for a lock (GETLK).
    fn getlk(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        owner: LockOwner,
        lock: Lock,
        reply: ReplyLock,
    ) {
        let _ = (ctx, ino, fh, owner, lock);
        reply.error(Errno::ENOSYS);
    }

    /// Take or release a lock (SETLK; `sleep` for SETLKW; `flock` for a BSD
    /// flock rather than a POSIX lock).
    fn setlk(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        owner: LockOwner,
        lock: Lock,
        sleep: bool,
        flock: bool,
        reply: ReplyEmpty,
    ) {
        let _ = (ctx, ino, fh, owner, lock, sleep, flock);
        reply.error(Errno::ENOSYS);
    }

    /// Map block `block` of size `blocksize` to a device block.
    fn bmap(&self, ctx: &RequestContext<'_>, ino: Inode, blocksize: u32, block: u64, reply: ReplyBmap) {
        let _ = (ctx, ino, blocksize, block);
        reply.error(Errno::ENOSYS);
    }

    /// An ioctl; `in_data` is the input, `out_size` the room for output.
    fn ioctl(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        flags: fuse_proto::flags::IoctlFlags,
        cmd: u32,
        arg: u64,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _ = (ctx, ino, fh, flags, cmd, arg, in_data, out_size);
        reply.error(Errno::ENOSYS);
    }

    /// Poll for `events`; with `kh`, notify it when ready.
    fn poll(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        kh: Option<PollHandle>,
        events: u32,
        reply: ReplyPoll,
    ) {
        let _ = (ctx, ino, fh, kh, events);
        reply.error(Errno::ENOSYS);
    }

    /// Allocate, punch or zero a range (`mode` as for `fallocate(2)`).
    fn fallocate(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _ = (ctx, ino, fh, offset, length, mode);
        reply.error(Errno::ENOSYS);
    }

    /// Find data or a hole (`whence`: `SEEK_DATA`, `SEEK_HOLE`, …).
    fn lseek(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        offset: u64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _ = (ctx, ino, fh, offset, whence);
        reply.error(Errno::ENOSYS);
    }

    /// Copy a range between two open files (COPY_FILE_RANGE and
    /// COPY_FILE_RANGE_64).
    fn copy_file_range(
        &self,
        ctx: &RequestContext<'_>,
        ino_in: Inode,
        fh_in: FileHandle,
        off_in: u64,
        ino_out: Inode,
        fh_out: FileHandle,
        off_out: u64,
        len: u64,
        flags: u64,
        reply: ReplyCopy,
    ) {
        let _ = (ctx, ino_in, fh_in, off_in, ino_out, fh_out, off_out, len, flags);
        reply.error(Errno::ENOSYS);
    }

    /// Attributes in statx form (`mask`: the `STATX_*` fields wanted).
    fn statx(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: Option<FileHandle>,
        flags: u32,
        mask: u32,
        reply: ReplyStatx,
    ) {
        let _ = (ctx, ino, fh, flags, mask);
        reply.error(Errno::ENOSYS);
    }

    /// Create an unnamed temporary file in `parent` and open it.
    fn tmpfile(&self, ctx: &RequestContext<'_>, parent: Inode, mode: u32, flags: i32, reply: ReplyCreate) {
        let _ = (ctx, parent, mode, flags);
        reply.error(Errno::ENOSYS);
    }

    /// Synchronise the whole filesystem.
    fn syncfs(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyEmpty) {
        let _ = (ctx, ino);
        reply.error(Errno::ENOSYS);
    }
}
