//! [`AsyncFs`]: serves an [`AsyncFilesystem`] as a [`Filesystem`].
//!
//! Each request's handler, called on a `/dev/fuse` worker or an io_uring
//! queue thread, takes a place in the bound on futures in flight (waiting
//! for one when there is none), copies what the request borrows from the
//! worker's buffer (names, WRITE data, xattr values, ioctl input), makes
//! the future and polls it once, in the executor's context
//! ([`Spawn::enter`]). A future that completes then is answered at once; a
//! pending one goes to the [`Spawn`]er, and the thread goes back to
//! reading. Its task ([`crate::layers::asyncfs::task`]) answers with the
//! reply handle when the future completes.

use crate::context::RequestContext;
use crate::filesystem::Filesystem;
use crate::init::InitConfig;
use crate::layers::asyncfs::context::AsyncContext;
use crate::layers::asyncfs::filesystem::AsyncFilesystem;
use crate::layers::asyncfs::task::{self, Core, Held, Limit, Registry, Spawn, TaskState};
use crate::layers::core::{Answer, SizedXattr, hide_trusted};
use crate::layers::values::DirEntryPlus;
use crate::ops::*;
use crate::reply::*;
use crate::types::{FileHandle, Inode, LockOwner};
use fuse_proto::{Errno, Opcode};
use std::ffi::CStr;
use std::future::Future;
use std::sync::Arc;

/// Default of [`AsyncFs::max_in_flight`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// Serves an [`AsyncFilesystem`] through the session, running its futures
/// on `S`. See the [module documentation](crate::asyncfs).
pub struct AsyncFs<F, S> {
    fs: Arc<F>,
    spawner: S,
    core: Arc<Core>,
}

impl<F: AsyncFilesystem, S: Spawn> AsyncFs<F, S> {
    /// Serves `fs`, spawning its futures with `spawner`, with at most
    /// [`DEFAULT_MAX_IN_FLIGHT`] futures in flight.
    pub fn new(fs: F, spawner: S) -> Self {
        Self::from_arc(Arc::new(fs), spawner)
    }

    /// [`AsyncFs::new`] for a filesystem the caller keeps a reference to.
    pub fn from_arc(fs: Arc<F>, spawner: S) -> Self {
        AsyncFs {
            fs,
            spawner,
            core: Arc::new(Core {
                limit: Limit::new(DEFAULT_MAX_IN_FLIGHT),
                registry: Registry::default(),
            }),
        }
    }

    /// At most `n` (at least 1) futures in flight: a request read while
    /// `n` run waits, holding the thread that read it, until one ends.
    /// That is the backpressure: with every thread of the pool waiting,
    /// requests are parked by the session (bounded) and then stay in the
    /// kernel, whatever the number of callers; none is refused. The places
    /// are shared by caller uid: from `n` = 8 on, the last quarter of them
    /// (2 to 16) go only
    /// to uids holding none of those yet, so one user's requests leave
    /// another user's next request a place at once, and one user alone
    /// runs at most all but that quarter, plus one. Memory
    /// stays bounded by `n` times what one request holds (its arguments,
    /// its future, at most one reply's data).
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.core = Arc::new(Core {
            limit: Limit::new(n),
            registry: Registry::default(),
        });
        self
    }

    /// The filesystem.
    pub fn filesystem(&self) -> &Arc<F> {
        &self.fs
    }

    /// Futures in flight now.
    pub fn in_flight(&self) -> usize {
        self.core.limit.in_flight()
    }

    /// The most futures that were in flight at once.
    pub fn peak_in_flight(&self) -> usize {
        self.core.limit.high_water()
    }

    /// The bound ([`AsyncFs::max_in_flight`]).
    pub fn in_flight_limit(&self) -> usize {
        self.core.limit.max()
    }

    /// Runs the future `make` builds for this request (its first poll
    /// here, the rest on the executor) and answers `reply` with its
    /// output. A `cancellable` request's future is dropped (and `EINTR`
    /// answered) on INTERRUPT or when the session stops.
    fn start<R, T, Fut>(
        &self,
        ctx: &RequestContext<'_>,
        reply: R,
        cancellable: bool,
        make: impl FnOnce(Arc<F>, AsyncContext) -> Fut,
    ) where
        R: Answer<T> + Send + 'static,
        T: Send + 'static,
        Fut: Future<Output = Result<T, Errno>> + Send + 'static,
    {
        let gave_up = || {
            if ctx.session_stopping() {
                Some(true)
            } else {
                // The caller gave up while its request waited for room: it
                // never started, so it ends here.
                (cancellable && ctx.is_interrupted()).then_some(false)
            }
        };
        let place = match self.core.limit.acquire(ctx.uid(), gave_up) {
            Ok(place) => place,
            Err(stopping) => {
                if stopping {
                    // Waited at the bound until the session stopped: end what
                    // runs, so that the others waiting get out too.
                    self.core.registry.close();
                }
                return reply.fail(Errno::EINTR);
            }
        };
        let held = Held::new(self.core.clone(), place);
        let mut fut = Box::pin(make(self.fs.clone(), AsyncContext::new(ctx)));
        let first = self.spawner.enter(|| task::poll_first(fut.as_mut(), reply, held));
        let Some((reply, held)) = first else {
            return; // answered already
        };
        let state = cancellable.then(|| {
            let state = TaskState::new();
            let s = state.clone();
            ctx.on_interrupt(move || s.cancel());
            state
        });
        self.spawner.spawn(task::run(held, state, reply, fut));
    }
}

impl<F, S> Drop for AsyncFs<F, S> {
    fn drop(&mut self) {
        self.core.registry.close();
    }
}

/// A READDIRPLUS reply, answered with as many entries as fit; the lookup
/// reference of each entry that was not sent, or that the kernel does not
/// count, goes back through the filesystem's `forget`.
struct PlusAnswer<F>(ReplyDirectoryPlus, Arc<F>);

impl<F: AsyncFilesystem> Fail for PlusAnswer<F> {
    fn fail(self, errno: Errno) {
        self.0.fail(errno)
    }
    fn request(&self) -> (Opcode, u64) {
        self.0.request()
    }
    fn record_panic(&self, message: String) {
        self.0.record_panic(message)
    }
}

impl<F: AsyncFilesystem> Answer<Vec<DirEntryPlus>> for PlusAnswer<F> {
    fn answer(self, r: Result<Vec<DirEntryPlus>, Errno>) {
        let PlusAnswer(mut reply, fs) = self;
        match r {
            Ok(entries) => {
                let mut full = false;
                for e in &entries {
                    let counted = e.entry.ino.0 != 0 && e.name != b"." && e.name != b"..";
                    if !full {
                        let added = reply.add(&e.entry, e.offset, &e.name);
                        full = added.is_full();
                        if added.counts_lookup() {
                            continue;
                        }
                    }
                    if counted {
                        fs.forget(e.entry.ino, 1);
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }
}

/// The bytes of a WRITE, owned (read from the pipe if they wait there).
fn owned_write(req: &WriteRequest<'_>) -> Result<Vec<u8>, Errno> {
    req.data.to_vec().map_err(|e| {
        log::error!("WRITE: reading its data: {e}");
        Errno::new_or_eio(e.raw_os_error().unwrap_or(libc::EIO))
    })
}

/// Serves an operation whose arguments are all `Copy`: its future gets them
/// as they are.
macro_rules! forward {
    ($($op:ident($($arg:ident: $t:ty),*) -> $reply:ty;)*) => {$(
        fn $op(&self, ctx: &RequestContext<'_>, $($arg: $t,)* reply: $reply) {
            let make = |fs: Arc<F>, cx| async move { fs.$op(&cx, $($arg),*).await };
            self.start(ctx, reply, true, make)
        }
    )*};
}

/// Serves an operation on a name in a node (`at`): its future gets an owned
/// copy of the name.
macro_rules! forward_named {
    ($($op:ident($at:ident, $name:ident $(, $arg:ident: $t:ty)*) -> $reply:ty;)*) => {$(
        fn $op(&self, ctx: &RequestContext<'_>, $at: Inode, $name: &CStr, $($arg: $t,)* reply: $reply) {
            let $name = $name.to_owned();
            let make = |fs: Arc<F>, cx| async move { fs.$op(&cx, $at, &$name, $($arg),*).await };
            self.start(ctx, reply, true, make)
        }
    )*};
}

impl<F: AsyncFilesystem, S: Spawn> Filesystem for AsyncFs<F, S> {
    forward! {
        getattr(ino: Inode, fh: Option<FileHandle>) -> ReplyAttr;
        readlink(ino: Inode) -> ReplyData;
        open(ino: Inode, flags: OpenFlags) -> ReplyOpen;
        read(ino: Inode, fh: FileHandle, req: ReadRequest) -> ReplyData;
        flush(ino: Inode, fh: FileHandle, owner: LockOwner) -> ReplyEmpty;
        fsync(ino: Inode, fh: FileHandle, datasync: bool) -> ReplyEmpty;
        opendir(ino: Inode, flags: OpenFlags) -> ReplyOpen;
        readdir(ino: Inode, fh: FileHandle, offset: u64) -> ReplyDirectory;
        fsyncdir(ino: Inode, fh: FileHandle, datasync: bool) -> ReplyEmpty;
        statfs(ino: Inode) -> ReplyStatfs;
        access(ino: Inode, mask: i32) -> ReplyEmpty;
        getlk(ino: Inode, fh: FileHandle, req: LockRequest) -> ReplyLock;
        setlk(ino: Inode, fh: FileHandle, req: LockRequest) -> ReplyEmpty;
        bmap(ino: Inode, blocksize: u32, block: u64) -> ReplyBmap;
        poll(ino: Inode, fh: FileHandle, req: PollRequest) -> ReplyPoll;
        fallocate(ino: Inode, fh: FileHandle, req: FallocateRequest) -> ReplyEmpty;
        lseek(ino: Inode, fh: FileHandle, req: LseekRequest) -> ReplyLseek;
        statx(ino: Inode, fh: Option<FileHandle>, req: StatxRequest) -> ReplyStatx;
        tmpfile(parent: Inode, req: CreateRequest) -> ReplyCreate;
        syncfs(ino: Inode) -> ReplyEmpty;
    }

    forward_named! {
        lookup(parent, name) -> ReplyEntry;
        mknod(parent, name, req: MknodRequest) -> ReplyEntry;
        mkdir(parent, name, mode: u32) -> ReplyEntry;
        unlink(parent, name) -> ReplyEmpty;
        rmdir(parent, name) -> ReplyEmpty;
        removexattr(ino, name) -> ReplyEmpty;
        create(parent, name, req: CreateRequest) -> ReplyCreate;
        atomic_open(parent, name, req: CreateRequest) -> ReplyCreate;
    }

    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        self.fs.init(config)
    }

    fn destroy(&self) {
        self.core.registry.close();
        self.fs.destroy()
    }

    fn recovery(&self) -> crate::Recovery {
        match self.fs.recovery() {
            crate::Recovery::HandedOver => crate::Recovery::Unsupported(
                "an async filesystem cannot hand its state over yet: its futures still running at a \
                 retirement could change the state after it is saved (state Recovery::Durable instead)",
            ),
            r => r,
        }
    }

    fn forget(&self, _: &RequestContext<'_>, ino: Inode, nlookup: u64) {
        self.fs.forget(ino, nlookup)
    }

    fn batch_forget(&self, _: &RequestContext<'_>, nodes: &mut dyn Iterator<Item = (Inode, u64)>) {
        self.fs.batch_forget(nodes)
    }

    fn setattr(&self, ctx: &RequestContext<'_>, ino: Inode, req: &SetattrRequest, reply: ReplyAttr) {
        let req = *req;
        let make = |fs: Arc<F>, cx| async move { fs.setattr(&cx, ino, &req).await };
        self.start(ctx, reply, true, make)
    }

    fn symlink(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        target: &CStr,
        reply: ReplyEntry,
    ) {
        let (name, target) = (name.to_owned(), target.to_owned());
        let make = |fs: Arc<F>, cx| async move { fs.symlink(&cx, parent, &name, &target).await };
        self.start(ctx, reply, true, make)
    }

    fn rename(&self, ctx: &RequestContext<'_>, req: &RenameRequest<'_>, reply: ReplyEmpty) {
        let (parent, newparent, flags) = (req.parent, req.newparent, req.flags);
        let (name, newname) = (req.name.to_owned(), req.newname.to_owned());
        let make = |fs: Arc<F>, cx| async move {
            let req = RenameRequest {
                parent,
                name: &name,
                newparent,
                newname: &newname,
                flags,
            };
            fs.rename(&cx, &req).await
        };
        self.start(ctx, reply, true, make)
    }

    fn link(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        newparent: Inode,
        newname: &CStr,
        reply: ReplyEntry,
    ) {
        let newname = newname.to_owned();
        let make = |fs: Arc<F>, cx| async move { fs.link(&cx, ino, newparent, &newname).await };
        self.start(ctx, reply, true, make)
    }

    fn write(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        let data = match owned_write(&req) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let (offset, write_flags, flags, lock_owner) =
            (req.offset, req.write_flags, req.flags, req.lock_owner);
        let make = |fs: Arc<F>, cx| async move {
            let req = WriteRequest {
                offset,
                data: WriteData::from(&data[..]),
                write_flags,
                flags,
                lock_owner,
            };
            fs.write(&cx, ino, fh, req).await
        };
        self.start(ctx, reply, true, make)
    }

    fn release(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        // Never cancelled: the kernel does not send it again.
        let make = |fs: Arc<F>, cx| async move { fs.release(&cx, ino, fh, req).await };
        self.start(ctx, reply, false, make)
    }

    fn readdirplus(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let fs = self.fs.clone();
        let make = |fs: Arc<F>, cx| async move { fs.readdirplus(&cx, ino, fh, offset).await };
        self.start(ctx, PlusAnswer(reply, fs), true, make)
    }

    fn releasedir(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        // Never cancelled, as RELEASE.
        let make = |fs: Arc<F>, cx| async move { fs.releasedir(&cx, ino, fh, req).await };
        self.start(ctx, reply, false, make)
    }

    fn setxattr(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        name: &CStr,
        req: SetxattrRequest<'_>,
        reply: ReplyEmpty,
    ) {
        let (name, value) = (name.to_owned(), req.value.to_vec());
        let (flags, setxattr_flags) = (req.flags, req.setxattr_flags);
        let make = |fs: Arc<F>, cx| async move {
            let req = SetxattrRequest {
                value: &value,
                flags,
                setxattr_flags,
            };
            fs.setxattr(&cx, ino, &name, req).await
        };
        self.start(ctx, reply, true, make)
    }

    fn getxattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, size: u32, reply: ReplyXattr) {
        let name = name.to_owned();
        let make = |fs: Arc<F>, cx| async move { fs.getxattr(&cx, ino, &name).await };
        self.start(ctx, SizedXattr(reply, size), true, make)
    }

    fn listxattr(&self, ctx: &RequestContext<'_>, ino: Inode, size: u32, reply: ReplyXattr) {
        let make = |fs: Arc<F>, cx: AsyncContext| async move {
            let admin = || cx.caller().holds_capability(crate::credentials::cap::SYS_ADMIN);
            fs.listxattr(&cx, ino).await.map(|l| hide_trusted(admin, l))
        };
        self.start(ctx, SizedXattr(reply, size), true, make)
    }

    fn ioctl(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: IoctlRequest<'_>,
        reply: ReplyIoctl,
    ) {
        let input = req.in_data.to_vec();
        let (flags, cmd, arg, out_size) = (req.flags, req.cmd, req.arg, req.out_size);
        let make = |fs: Arc<F>, cx| async move {
            let req = IoctlRequest {
                flags,
                cmd,
                arg,
                in_data: &input,
                out_size,
            };
            fs.ioctl(&cx, ino, fh, req).await
        };
        self.start(ctx, reply, true, make)
    }

    fn copy_file_range(&self, ctx: &RequestContext<'_>, req: &CopyFileRangeRequest, reply: ReplyCopy) {
        let req = *req;
        let make = |fs: Arc<F>, cx| async move { fs.copy_file_range(&cx, &req).await };
        self.start(ctx, reply, true, make)
    }
}
