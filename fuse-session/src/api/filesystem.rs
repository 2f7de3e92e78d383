//! The [`Filesystem`] trait: one method per operation of protocol 7.45.
//!
//! Methods take `&self` (the session calls them from many threads at once;
//! keep shared state sharded or per object), a [`RequestContext`] with the
//! caller's identity, the operation's arguments (typed: [`crate::attr`],
//! [`crate::ops`]), and a typed reply handle. A handler may answer at once
//! or move the handle to another thread and answer later; a handle dropped
//! unanswered answers `EIO`, and a panicking handler answers `EIO` too.
//!
//! # Lookup counts
//!
//! The kernel keeps a node (an [`Inode`]) alive while it holds lookup
//! references to it. Every successful reply of LOOKUP, MKNOD, MKDIR,
//! SYMLINK, LINK, CREATE/atomic open and TMPFILE adds one reference to the
//! node in the entry (a negative entry, node id 0, adds none), and so does
//! every entry READDIRPLUS adds (see
//! [`crate::reply::ReplyDirectoryPlus::add`]). FORGET and BATCH_FORGET give
//! them back. A filesystem whose node ids name things that never go away
//! (hello) needs no counting; one that frees nodes must free a node only
//! once its count is back at 0 (and it is not in use otherwise).
//!
//! # Caching
//!
//! Entries and attributes carry TTLs: for that long the kernel answers
//! `stat` and path walks from its cache without asking. Zero TTLs are always
//! correct; long ones suit content that only this filesystem changes. File
//! content is cached in the page cache: `FopenFlags::KEEP_CACHE` keeps it
//! across opens (default: dropped at each open), `FopenFlags::DIRECT_IO`
//! bypasses it (each `read(2)` becomes a READ whatever the size in the
//! attributes says, which content of unknown size needs).
//!
//! # Defaults
//!
//! Every method has a default. Most answer `ENOSYS`, which the kernel
//! remembers for some operations (it stops sending them and answers on its
//! own: e.g. `EOPNOTSUPP` for the xattr calls, success for FLUSH, FSYNC,
//! ACCESS). OPEN/OPENDIR/RELEASE/RELEASEDIR succeed, STATFS reports an
//! empty filesystem, and CREATE answers `EROFS` unless the filesystem
//! implements [`Filesystem::create`] or [`Filesystem::atomic_open`].

use crate::context::RequestContext;
use crate::init::InitConfig;
use crate::ops::*;
use crate::reply::*;
use crate::types::{FileHandle, Inode};
use fuse_proto::Errno;
use std::ffi::CStr;

/// A filesystem's recovery contract ([`Filesystem::recovery`]): how the
/// node ids and file handles the kernel holds stay valid in a successor
/// that takes the connection over. Whatever it states, a successor answers
/// a node id or file handle it cannot resolve with `ESTALE` or `EBADF`,
/// never with another object's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Recovery {
    /// Nothing stated: refused under a keeper or the fd store.
    Unstated,
    /// Refused under a keeper, for the reason given (a layer that does not
    /// keep its tables where a successor finds them: the node layer, and
    /// the path layer unless built with `PathFs::kept`).
    Unsupported(&'static str),
    /// Node ids and file handles are durable names: any daemon of this
    /// filesystem resolves them to the same object again, or answers
    /// `ESTALE`/`EBADF`. Fixed node ids (hello), object ids of a backing
    /// store, or a node table kept in memory the keeper holds
    /// ([`crate::vault::Vault::region`], as passthrough_ll does, and as the
    /// path layer does when built with `PathFs::kept`: see
    /// `docs/recovery.md` for what it survives and what not).
    Durable,
    /// The filesystem's state lives in its process: it hands the whole of
    /// it to its successor at a graceful upgrade (the `save` and `restore`
    /// of [`crate::keeper::KeeperLink::serve`]), and after a crash answers
    /// `ESTALE` (`EBADF` for file handles) for every node id and handle it
    /// does not have, and never gives out again a node id the kernel may
    /// hold (memfs keeps its next node id in the vault's shared memory).
    HandedOver,
}

impl Recovery {
    /// `Err(why)` when a filesystem stating this may not run under a keeper.
    pub fn check(self) -> Result<(), String> {
        match self {
            Recovery::Durable | Recovery::HandedOver => Ok(()),
            Recovery::Unsupported(why) => Err(why.to_string()),
            Recovery::Unstated => Err(
                "the filesystem states no recovery contract (Filesystem::recovery): a \
                 successor could give the node ids and file handles the kernel holds to other files; say \
                 how they stay valid (Recovery::Durable or Recovery::HandedOver, see docs/recovery.md), or \
                 serve without a keeper"
                    .to_string(),
            ),
        }
    }
}

/// A filesystem served by a [`crate::Session`] (or [`crate::serve`]).
///
/// Implement the methods the filesystem supports; the defaults answer the
/// rest (see the [module documentation](self)).
pub trait Filesystem: Send + Sync + 'static {
    /// Called once with the kernel's INIT offer; state the capabilities and
    /// limits you want in `config` (the defaults are
    /// [`crate::init::DEFAULT_WANTED`]; none of them changes which requests
    /// the methods receive). Returning an error fails the mount.
    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        let _ = config;
        Ok(())
    }

    /// Called when the session ends (DESTROY, unmount or shutdown).
    fn destroy(&self) {}

    /// How the node ids and file handles the kernel holds stay right when
    /// another process takes this filesystem's connection over: a keeper's
    /// next daemon after a crash or an upgrade ([`crate::keeper`], the fd
    /// store of [`crate::service`]). The kernel keeps using the node ids,
    /// generations and file handles it was given, so a successor that gave
    /// the same numbers to other objects would read and write the wrong
    /// files. The default, [`Recovery::Unstated`], makes
    /// [`crate::keeper::KeeperLink::serve`] and
    /// [`crate::service::serve_with_fdstore`] refuse to serve it, with a
    /// message saying so; a session of its own ([`crate::serve`]) never asks.
    fn recovery(&self) -> Recovery {
        Recovery::Unstated
    }

    /// LOOKUP: the kernel resolves `name` in directory `parent` (a path
    /// walk, `stat`, `open` of a name whose entry is not cached).
    ///
    /// Reply with [`ReplyEntry::entry`] (one lookup reference on its node),
    /// [`ReplyEntry::negative`] to let the kernel cache the absence, or
    /// `ENOENT`. `name` is never "." or ".." unless the filesystem asked
    /// for [`InitFlags::EXPORT_SUPPORT`](crate::InitFlags): then "." in
    /// `parent` asks for the entry of `parent` itself (which the kernel may
    /// have forgotten: it asks when it opens a file handle of a node it no
    /// longer caches, and takes only that node id with the generation the
    /// handle holds) and ".." for its parent directory. Otherwise `name`
    /// can be anything else the caller typed.
    fn lookup(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        let _ = (ctx, parent, name);
        reply.error(Errno::ENOSYS);
    }

    /// FORGET: drop `nlookup` lookup references of `ino`. No reply. The
    /// kernel may never send it for nodes still referenced at unmount
    /// (DESTROY ends them all).
    fn forget(&self, ctx: &RequestContext<'_>, ino: Inode, nlookup: u64) {
        let _ = (ctx, ino, nlookup);
    }

    /// BATCH_FORGET: by default calls [`Filesystem::forget`] for each node.
    fn batch_forget(&self, ctx: &RequestContext<'_>, nodes: &mut dyn Iterator<Item = (Inode, u64)>) {
        for (ino, n) in nodes {
            self.forget(ctx, ino, n);
        }
    }

    /// GETATTR: attributes of `ino` (`fh` when the kernel asks through an
    /// open file, `fstat`). Sent when cached attributes expired.
    ///
    /// Reply with [`ReplyAttr::attr`]; its TTL says how long the kernel may
    /// answer `stat` from its cache.
    fn getattr(&self, ctx: &RequestContext<'_>, ino: Inode, fh: Option<FileHandle>, reply: ReplyAttr) {
        let _ = (ctx, ino, fh);
        reply.error(Errno::ENOSYS);
    }

    /// SETATTR: `chmod`, `chown`, `truncate`, `utimensat`, and the
    /// truncation of `open(O_TRUNC)` (unless `ATOMIC_O_TRUNC` was asked
    /// for, then it comes in [`Filesystem::open`]'s flags). Apply the
    /// fields that are `Some` and reply with the new attributes; without
    /// `default_permissions` the permission checks are yours.
    fn setattr(&self, ctx: &RequestContext<'_>, ino: Inode, req: &SetattrRequest, reply: ReplyAttr) {
        let _ = (ctx, ino, req);
        reply.error(Errno::ENOSYS);
    }

    /// READLINK: the target of symbolic link `ino` ([`ReplyData::data`]).
    fn readlink(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyData) {
        let _ = (ctx, ino);
        reply.error(Errno::ENOSYS);
    }

    /// SYMLINK: create symbolic link `name` in `parent` pointing at
    /// `target`. Reply with the new entry (one lookup reference).
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

    /// MKNOD: create a node (`mkfifo`, `mknod`, and a regular file when
    /// CREATE answered `ENOSYS`). Reply with the new entry (one lookup
    /// reference). The mode is as [`CreateRequest::mode`] says.
    fn mknod(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: MknodRequest,
        reply: ReplyEntry,
    ) {
        let _ = (ctx, parent, name, req);
        reply.error(Errno::ENOSYS);
    }

    /// MKDIR: create a directory (`mode`: permission bits, to create with
    /// exactly, see [`CreateRequest::mode`]). Reply with the new entry (one
    /// lookup reference).
    fn mkdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, mode: u32, reply: ReplyEntry) {
        let _ = (ctx, parent, name, mode);
        reply.error(Errno::ENOSYS);
    }

    /// UNLINK: remove `name` from `parent`. The node lives on while the
    /// kernel holds lookup references or open files.
    fn unlink(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        let _ = (ctx, parent, name);
        reply.error(Errno::ENOSYS);
    }

    /// RMDIR: remove directory `name` from `parent` (`ENOTEMPTY` unless empty).
    fn rmdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        let _ = (ctx, parent, name);
        reply.error(Errno::ENOSYS);
    }

    /// RENAME and RENAME2 (`renameat2` flags in `req.flags`; answer
    /// `EINVAL` for flags you do not support). A replaced target loses its
    /// name as with UNLINK.
    fn rename(&self, ctx: &RequestContext<'_>, req: &RenameRequest<'_>, reply: ReplyEmpty) {
        let _ = (ctx, req);
        reply.error(Errno::ENOSYS);
    }

    /// LINK: hard-link `ino` as `newname` in `newparent`. Reply with the
    /// entry of `ino` (one more lookup reference). The default answers
    /// `ENOSYS`, which the kernel hands to `link(2)` as `EPERM`
    /// ("Operation not permitted", what `link(2)` documents for a
    /// filesystem without hard links); it asks again at the next `link`.
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

    /// OPEN: `open(2)` of `ino` (not for O_CREAT of a new name: that is
    /// CREATE). `flags` never has `O_CREAT`/`O_EXCL`, and has `O_TRUNC`
    /// only when the filesystem asked for `ATOMIC_O_TRUNC` in
    /// [`Filesystem::init`]; otherwise a truncating open is followed by a
    /// SETATTR of size 0 through the new handle.
    ///
    /// Reply [`ReplyOpen::opened`] with a handle of your choice (passed back
    /// in READ, WRITE, RELEASE…) and flags: `DIRECT_IO` for content whose
    /// size is not known in advance (else the kernel reads no further than
    /// the size in the attributes), `KEEP_CACHE` to keep cached pages of an
    /// unchanged file. The default opens with handle 0 and no flags. An
    /// `O_DIRECT` open's answer may get `DIRECT_IO | PARALLEL_DIRECT_WRITES`
    /// added by the session (see
    /// [`crate::SessionConfig::o_direct_parallel_writes`]), here and in
    /// CREATE and TMPFILE.
    fn open(&self, ctx: &RequestContext<'_>, ino: Inode, flags: OpenFlags, reply: ReplyOpen) {
        let _ = (ctx, ino, flags);
        reply.opened(FileHandle(0), fuse_proto::flags::FopenFlags::empty());
    }

    /// READ: up to `req.size` bytes at `req.offset`. Reply
    /// [`ReplyData::data`]; a shorter reply means end of file (with
    /// `DIRECT_IO` it is returned to the caller as is). Without `DIRECT_IO`
    /// the kernel reads whole pages (and reads ahead) to fill its page
    /// cache, and never beyond the size in the attributes.
    fn read(&self, ctx: &RequestContext<'_>, ino: Inode, fh: FileHandle, req: ReadRequest, reply: ReplyData) {
        let _ = (ctx, ino, fh, req);
        reply.error(Errno::ENOSYS);
    }

    /// WRITE: `req.data` at `req.offset`; reply [`ReplyWrite::written`]
    /// with the count (anything but the whole length is a short write the
    /// caller sees). With the writeback cache, writes come later, from the
    /// page cache, with `FUSE_WRITE_CACHE` set. With
    /// [`SessionConfig::splice_write`](crate::SessionConfig) large payloads
    /// may still wait in a pipe: [`WriteData::splice_to`](crate::WriteData::splice_to)
    /// moves them into a file, [`WriteData::fetch`](crate::WriteData::fetch)
    /// gives the bytes.
    fn write(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        let _ = (ctx, ino, fh, req);
        reply.error(Errno::ENOSYS);
    }

    /// FLUSH: a file descriptor of an open file is being closed (each
    /// `close(2)`, possibly many per open). Its error is what `close`
    /// returns; drop POSIX locks of `lock_owner` here. `ENOSYS` makes the
    /// kernel stop sending it.
    ///
    /// What a filesystem that commits at close must know (the tutorial's
    /// "Committing at close"): there is one FLUSH per `close` of any
    /// duplicate of the descriptor, so several per open, and the first may
    /// come before any data: bash runs `echo x > f` as open, `dup2` onto
    /// stdout, `close` of the original (a FLUSH, nothing written yet),
    /// write, and a last `close` (a second FLUSH). A FLUSH says nothing
    /// about whether data came: commit at a FLUSH only what was written
    /// (or truncated, `O_TRUNC` included) since the last commit, and
    /// expect more FLUSHes and writes after it, until RELEASE.
    ///
    /// FLUSH is interruptible like any request a caller waits for (a
    /// signalled `close` makes the kernel send INTERRUPT); open a
    /// [`RequestContext::must_finish`] section around a commit the caller
    /// must see the true result of (see [`MustFinish`](crate::MustFinish)).
    fn flush(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        lock_owner: crate::types::LockOwner,
        reply: ReplyEmpty,
    ) {
        let _ = (ctx, ino, fh, lock_owner);
        reply.error(Errno::ENOSYS);
    }

    /// RELEASE: the last reference to an open file is gone; free the handle.
    /// Its reply is not waited for by anyone; the default succeeds.
    ///
    /// It comes once per open, after every FLUSH and write, but when the
    /// last reference goes, which may be long after the last `close` (a
    /// mapping, a descriptor a child inherited), and `close` does not wait
    /// for it: its error reaches nobody, and a program that reopens the
    /// file at once may get there first. Commit where the caller waits
    /// (FLUSH, FSYNC) if it must see the result; see [`Filesystem::flush`].
    fn release(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        let _ = (ctx, ino, fh, req);
        reply.ok();
    }

    /// FSYNC: synchronise file contents (`datasync`: data only). `ENOSYS`
    /// makes the kernel treat later fsyncs as successful.
    fn fsync(&self, ctx: &RequestContext<'_>, ino: Inode, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let _ = (ctx, ino, fh, datasync);
        reply.error(Errno::ENOSYS);
    }

    /// OPENDIR: open directory `ino`. Defaults to handle 0. Reply flags:
    /// `CACHE_DIR` lets the kernel cache the listing, `KEEP_CACHE` keep it.
    fn opendir(&self, ctx: &RequestContext<'_>, ino: Inode, flags: OpenFlags, reply: ReplyOpen) {
        let _ = (ctx, ino, flags);
        reply.opened(FileHandle(0), fuse_proto::flags::FopenFlags::empty());
    }

    /// READDIR: entries after cookie `offset` (0: from the start). Add
    /// entries with [`ReplyDirectory::add`] until it reports
    /// [`DirAdd::Full`], then [`ReplyDirectory::ok`]; no entry added means
    /// the end of the directory. The `offset` given with an entry is its
    /// cookie: the value the kernel passes back as `offset` to continue
    /// after that entry (so never 0). "." and ".." are yours to list here,
    /// with cookies like any other entry. Adds no lookup references.
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

    /// READDIRPLUS: like READDIR with an entry (attributes, TTLs) per name;
    /// sent instead of READDIR only when the filesystem asked for
    /// `DO_READDIRPLUS` in [`Filesystem::init`]. Each entry added takes a
    /// lookup reference unless it is "." or ".." or has node id 0: count
    /// one exactly when [`ReplyDirectoryPlus::add`] returns
    /// [`DirPlusAdd::Added`] with `lookup: true`.
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

    /// RELEASEDIR: release an open directory. The default succeeds. `req`
    /// is what [`Filesystem::release`] gets (this method took only its
    /// `flags` before: they are `req.flags`).
    fn releasedir(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        let _ = (ctx, ino, fh, req);
        reply.ok();
    }

    /// FSYNCDIR: synchronise directory contents. `ENOSYS` makes the kernel
    /// treat later calls as successful.
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

    /// STATFS: filesystem statistics (`df`): answer
    /// [`ReplyStatfs::statfs`] with a [`Statfs`](crate::Statfs). The
    /// default reports an empty filesystem with 255-byte names
    /// ([`Statfs::new`](crate::Statfs::new)), as the kernel would without
    /// the call.
    fn statfs(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyStatfs) {
        let _ = (ctx, ino);
        reply.statfs(crate::Statfs::new());
    }

    /// SETXATTR: set extended attribute `name` (`req.flags`:
    /// `XATTR_CREATE`, `XATTR_REPLACE`). `ENOSYS` makes the kernel answer
    /// later calls `EOPNOTSUPP` itself.
    fn setxattr(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        name: &CStr,
        req: SetxattrRequest<'_>,
        reply: ReplyEmpty,
    ) {
        let _ = (ctx, ino, name, req);
        reply.error(Errno::ENOSYS);
    }

    /// GETXATTR: with `size` 0 reply the value's length with
    /// [`ReplyXattr::size`], else the value (`ERANGE` if it exceeds `size`);
    /// `ENODATA` if there is none. `ENOSYS` is remembered as for setxattr.
    fn getxattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, size: u32, reply: ReplyXattr) {
        let _ = (ctx, ino, name, size);
        reply.error(Errno::ENOSYS);
    }

    /// LISTXATTR: attribute names, each followed by a NUL, sized as for
    /// getxattr.
    fn listxattr(&self, ctx: &RequestContext<'_>, ino: Inode, size: u32, reply: ReplyXattr) {
        let _ = (ctx, ino, size);
        reply.error(Errno::ENOSYS);
    }

    /// REMOVEXATTR: remove extended attribute `name`.
    fn removexattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, reply: ReplyEmpty) {
        let _ = (ctx, ino, name);
        reply.error(Errno::ENOSYS);
    }

    /// ACCESS: `access(2)` and `chdir` (`mask`: `R_OK | W_OK | X_OK`, or
    /// `F_OK`). Not sent with `default_permissions`. `ENOSYS` makes the
    /// kernel grant later checks.
    fn access(&self, ctx: &RequestContext<'_>, ino: Inode, mask: i32, reply: ReplyEmpty) {
        let _ = (ctx, ino, mask);
        reply.error(Errno::ENOSYS);
    }

    /// CREATE: `open(O_CREAT)` of a name that is not cached as existing:
    /// create (or, without `O_EXCL`, open an existing) `name` in `parent`
    /// and open it. Reply [`ReplyCreate::created`] with the entry (one
    /// lookup reference) and the open file, as for OPEN.
    ///
    /// The default calls [`Filesystem::atomic_open`], so implementing that
    /// one serves both; if that answers `ENOSYS` too (nothing implemented)
    /// the answer becomes `EROFS`, so that `touch` on a filesystem that
    /// creates nothing says "Read-only file system". To have the kernel
    /// fall back to MKNOD + OPEN instead, implement `create` and answer
    /// `ENOSYS` from it (the kernel then never sends CREATE again).
    fn create(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: CreateRequest,
        reply: ReplyCreate,
    ) {
        let req = CreateRequest {
            flags: OpenFlags::from_bits(req.flags.bits() | libc::O_CREAT),
            ..req
        };
        self.atomic_open(ctx, parent, name, req, reply.enosys_as(Errno::EROFS));
    }

    /// Look up and open `name` in `parent` in one step, creating it when
    /// `req.flags` has `O_CREAT` (honouring `O_EXCL` and `O_TRUNC`). Serves
    /// FUSE_CREATE (through the default [`Filesystem::create`]) and, when
    /// the session enabled it, the out-of-tree atomic-open request (whose
    /// `ENOSYS` makes the kernel fall back to LOOKUP + OPEN). Reply with
    /// [`ReplyCreate::created`] only when this call created the file.
    fn atomic_open(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: CreateRequest,
        reply: ReplyCreate,
    ) {
        let _ = (ctx, parent, name, req);
        reply.error(Errno::ENOSYS);
    }

    /// GETLK: test for a lock; reply the conflicting lock or one of type
    /// `F_UNLCK`. Only sent when the filesystem asked for `POSIX_LOCKS`;
    /// otherwise the kernel keeps locks itself, valid on this machine only.
    fn getlk(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: LockRequest,
        reply: ReplyLock,
    ) {
        let _ = (ctx, ino, fh, req);
        reply.error(Errno::ENOSYS);
    }

    /// SETLK/SETLKW: take or release a lock (`req.sleep` for SETLKW: wait,
    /// e.g. with [`RequestContext::defer`]; `req.flock` for a BSD flock).
    /// Only sent when the filesystem asked for `POSIX_LOCKS` / `FLOCK_LOCKS`.
    fn setlk(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: LockRequest,
        reply: ReplyEmpty,
    ) {
        let _ = (ctx, ino, fh, req);
        reply.error(Errno::ENOSYS);
    }

    /// BMAP: map block `block` of size `blocksize` to a device block (only
    /// for `fuseblk` mounts).
    fn bmap(&self, ctx: &RequestContext<'_>, ino: Inode, blocksize: u32, block: u64, reply: ReplyBmap) {
        let _ = (ctx, ino, blocksize, block);
        reply.error(Errno::ENOSYS);
    }

    /// IOCTL: `req.in_data` is the input, `req.out_size` the room for output.
    fn ioctl(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: IoctlRequest<'_>,
        reply: ReplyIoctl,
    ) {
        let _ = (ctx, ino, fh, req);
        reply.error(Errno::ENOSYS);
    }

    /// POLL: reply the ready events; with `req.kh`, notify it when they
    /// change. `ENOSYS` makes the kernel treat the file as always ready.
    fn poll(&self, ctx: &RequestContext<'_>, ino: Inode, fh: FileHandle, req: PollRequest, reply: ReplyPoll) {
        let _ = (ctx, ino, fh, req);
        reply.error(Errno::ENOSYS);
    }

    /// FALLOCATE: allocate, punch or zero a range (`mode` as for
    /// `fallocate(2)`). `ENOSYS` makes later calls fail `EOPNOTSUPP`.
    fn fallocate(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: FallocateRequest,
        reply: ReplyEmpty,
    ) {
        let _ = (ctx, ino, fh, req);
        reply.error(Errno::ENOSYS);
    }

    /// LSEEK: find data or a hole (`SEEK_DATA`, `SEEK_HOLE`). `ENOSYS`
    /// makes the kernel use its generic answer (all data).
    fn lseek(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: LseekRequest,
        reply: ReplyLseek,
    ) {
        let _ = (ctx, ino, fh, req);
        reply.error(Errno::ENOSYS);
    }

    /// COPY_FILE_RANGE (and COPY_FILE_RANGE_64): copy between two open
    /// files; reply the count copied. `ENOSYS` makes the kernel copy
    /// through READ and WRITE.
    fn copy_file_range(&self, ctx: &RequestContext<'_>, req: &CopyFileRangeRequest, reply: ReplyCopy) {
        let _ = (ctx, req);
        reply.error(Errno::ENOSYS);
    }

    /// STATX: attributes in statx form (`req.mask`: the `STATX_*` fields
    /// wanted). `ENOSYS` makes the kernel use GETATTR.
    fn statx(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: Option<FileHandle>,
        req: StatxRequest,
        reply: ReplyStatx,
    ) {
        let _ = (ctx, ino, fh, req);
        reply.error(Errno::ENOSYS);
    }

    /// TMPFILE: create an unnamed temporary file in `parent` and open it
    /// (`O_TMPFILE`); reply as for CREATE.
    fn tmpfile(&self, ctx: &RequestContext<'_>, parent: Inode, req: CreateRequest, reply: ReplyCreate) {
        let _ = (ctx, parent, req);
        reply.error(Errno::ENOSYS);
    }

    /// SYNCFS: synchronise the whole filesystem (`syncfs(2)`, `sync`).
    fn syncfs(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyEmpty) {
        let _ = (ctx, ino);
        reply.error(Errno::ENOSYS);
    }
}
