//! slowfs: a filesystem in front of a slow remote. Every operation waits
//! for a simulated round trip (`-o latency_ms=N`) before it answers, served
//! through the sync `Filesystem` trait (`-o api=sync`: the wait holds a
//! worker thread) or the async `AsyncFilesystem` trait on Tokio
//! (`-o api=async`, the default: the wait holds no thread), so that the two
//! can be compared on one mount command.
//!
//! ```sh
//! slowfs [-o api=async|sync,latency_ms=N,read_latency_ms=N,files=N,size=N] MOUNTPOINT
//! ```
//!
//! It holds `files` generated read-only files `file-000`… of `size` bytes
//! (byte `p` of `file-N` is `b'a' + (p + N) % 26`), the writable directory
//! `rw` (files can be created, written, truncated and removed; one that is
//! removed while open is read and written until its last close), and
//! `.stats`, answered at once:
//! operations running now, the most at once, completed, and cancelled (an
//! async operation whose future was dropped, by an INTERRUPT or the end of
//! the session). `--stats FILE` writes the session's statistics with the
//! same counters at exit; slowfs tracks requests in flight
//! (`SessionConfig::track_inflight`), so their `max_inflight` is the
//! session's own count of what `.stats` calls the most at once.

#[path = "../common/cli.rs"]
mod cli;
mod tree;

use fuse_wire::asyncfs::{
    AsyncContext, AsyncFilesystem, AsyncFs, Created, Data, DirEntry, Open, TokioSpawner,
};
use fuse_wire::reply::*;
use fuse_wire::session::SessionConfig;
use fuse_wire::{
    CreateRequest, Entry, Errno, FileAttr, FileHandle, Filesystem, Inode, OpenFlags, ReadRequest,
    ReleaseRequest, RequestContext, SetattrRequest, WriteRequest,
};
use std::ffi::CStr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tree::{Setup, Tree};

const COMMAND: cli::Command = cli::Command {
    name: "slowfs",
    about: "Serves generated files behind a simulated slow remote at MOUNTPOINT.

    -o api=async|sync     the trait that serves it (default async, on Tokio)
    -o latency_ms=N       the remote's round trip for every operation (default 10)
    -o read_latency_ms=N  the round trip of READs (default: latency_ms)
    -o files=N            generated files (default 300)
    -o size=N             their size in bytes (default 65536)
    -o max_in_flight=N    async: most operations at once (default 1024)
    -o runtime_threads=N  async: Tokio worker threads (default 2)
    -o queue_depth=N      io_uring entries per queue
    -o threads=N          worker threads (default: the session's)
    -o max_threads=N      most workers running handlers at once (default: the session's)
    -o uring              serve over FUSE-over-io_uring when the kernel allows it",
    own_options: true,
    stats: true,
};

/// The tree through the sync trait: each operation sleeps on its worker.
struct SyncSlow(Arc<Tree>);

impl SyncSlow {
    fn serve<T>(&self, ino: Inode, read: bool, f: impl FnOnce(&Tree) -> T) -> T {
        let (op, delay) = self.0.op(ino, read);
        std::thread::sleep(delay);
        let r = f(&self.0);
        op.finish();
        r
    }
}

/// The tree through the async trait: each operation awaits a Tokio timer.
struct AsyncSlow(Arc<Tree>);

impl AsyncSlow {
    async fn serve<T>(&self, ino: Inode, read: bool, f: impl FnOnce(&Tree) -> T) -> T {
        let (op, delay) = self.0.op(ino, read);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let r = f(&self.0);
        op.finish();
        r
    }
}

/// The TTL of the attributes GETATTR and SETATTR answer.
const ATTR_TTL: Duration = Duration::from_secs(1);

fn name_ino(name: &CStr, parent: Inode) -> Inode {
    if name.to_bytes() == b".stats" {
        tree::STATS
    } else {
        parent
    }
}

impl Filesystem for SyncSlow {
    fn lookup(&self, _: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        reply.result(self.serve(name_ino(name, parent), false, |t| t.lookup(parent, name)))
    }

    fn getattr(&self, _: &RequestContext<'_>, ino: Inode, _: Option<FileHandle>, reply: ReplyAttr) {
        reply.result(self.serve(ino, false, |t| t.getattr(ino)).map(|a| (ATTR_TTL, a)))
    }

    fn setattr(&self, _: &RequestContext<'_>, ino: Inode, req: &SetattrRequest, reply: ReplyAttr) {
        reply.result(
            self.serve(ino, false, |t| t.setattr(ino, req))
                .map(|a| (ATTR_TTL, a)),
        )
    }

    fn open(&self, _: &RequestContext<'_>, ino: Inode, _: OpenFlags, reply: ReplyOpen) {
        reply.result(self.serve(ino, false, |t| t.open(ino)).map(|o| (o.fh, o.flags)))
    }

    fn read(&self, _: &RequestContext<'_>, ino: Inode, _: FileHandle, req: ReadRequest, reply: ReplyData) {
        reply.result(self.serve(ino, true, |t| t.read(ino, req.offset, req.size)))
    }

    fn write(
        &self,
        _: &RequestContext<'_>,
        ino: Inode,
        _: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        match req.data.fetch() {
            Ok(data) => reply.result(self.serve(ino, false, |t| t.write(ino, req.offset, data))),
            Err(e) => reply.io_error(&e),
        }
    }

    fn readdir(
        &self,
        _: &RequestContext<'_>,
        ino: Inode,
        _: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        match self.serve(ino, false, |t| t.readdir(ino, offset)) {
            Ok(entries) => {
                for e in &entries {
                    if reply.add(e.ino, e.offset, e.kind, &e.name).is_full() {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _: &RequestContext<'_>,
        ino: Inode,
        _: FileHandle,
        _: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        self.0.release(ino);
        reply.ok()
    }

    fn create(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: CreateRequest,
        reply: ReplyCreate,
    ) {
        let owner = (ctx.uid(), ctx.gid());
        reply.result(
            self.serve(parent, false, |t| t.create(parent, name, req.perm(), owner))
                .map(|(e, o)| (e, o.fh, o.flags)),
        )
    }

    fn unlink(&self, _: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        reply.result(self.serve(parent, false, |t| t.unlink(parent, name)))
    }
}

impl AsyncFilesystem for AsyncSlow {
    async fn lookup(&self, _: &AsyncContext, parent: Inode, name: &CStr) -> Result<Entry, Errno> {
        self.serve(name_ino(name, parent), false, |t| t.lookup(parent, name))
            .await
    }

    async fn getattr(
        &self,
        _: &AsyncContext,
        ino: Inode,
        _: Option<FileHandle>,
    ) -> Result<(Duration, FileAttr), Errno> {
        self.serve(ino, false, |t| t.getattr(ino))
            .await
            .map(|a| (ATTR_TTL, a))
    }

    async fn setattr(
        &self,
        _: &AsyncContext,
        ino: Inode,
        req: &SetattrRequest,
    ) -> Result<(Duration, FileAttr), Errno> {
        self.serve(ino, false, |t| t.setattr(ino, req))
            .await
            .map(|a| (ATTR_TTL, a))
    }

    async fn open(&self, _: &AsyncContext, ino: Inode, _: OpenFlags) -> Result<Open, Errno> {
        self.serve(ino, false, |t| t.open(ino)).await
    }

    async fn read(
        &self,
        _: &AsyncContext,
        ino: Inode,
        _: FileHandle,
        req: ReadRequest,
    ) -> Result<Data, Errno> {
        self.serve(ino, true, |t| t.read(ino, req.offset, req.size))
            .await
            .map(Data::from)
    }

    async fn write(
        &self,
        _: &AsyncContext,
        ino: Inode,
        _: FileHandle,
        req: WriteRequest<'_>,
    ) -> Result<u32, Errno> {
        let data = req.data.bytes().ok_or(Errno::EIO)?;
        self.serve(ino, false, |t| t.write(ino, req.offset, data)).await
    }

    async fn readdir(
        &self,
        _: &AsyncContext,
        ino: Inode,
        _: FileHandle,
        offset: u64,
    ) -> Result<Vec<DirEntry>, Errno> {
        self.serve(ino, false, |t| t.readdir(ino, offset)).await
    }

    async fn release(
        &self,
        _: &AsyncContext,
        ino: Inode,
        _: FileHandle,
        _: ReleaseRequest,
    ) -> Result<(), Errno> {
        self.0.release(ino);
        Ok(())
    }

    async fn create(
        &self,
        ctx: &AsyncContext,
        parent: Inode,
        name: &CStr,
        req: CreateRequest,
    ) -> Result<Created, Errno> {
        let owner = (ctx.uid(), ctx.gid());
        let (entry, open) = self
            .serve(parent, false, |t| t.create(parent, name, req.perm(), owner))
            .await?;
        Ok(Created::new(entry, open))
    }

    async fn unlink(&self, _: &AsyncContext, parent: Inode, name: &CStr) -> Result<(), Errno> {
        self.serve(parent, false, |t| t.unlink(parent, name)).await
    }
}

/// What the `-o` options of slowfs's own ask for.
struct Options {
    sync: bool,
    setup: Setup,
    max_in_flight: usize,
    runtime_threads: usize,
    session: SessionConfig,
}

fn options(list: &[String]) -> Result<Options, cli::UsageError> {
    let mut o = Options {
        sync: false,
        setup: Setup {
            files: 300,
            size: 65536,
            latency: Duration::from_millis(10),
            read_latency: None,
        },
        max_in_flight: fuse_wire::asyncfs::DEFAULT_MAX_IN_FLIGHT,
        runtime_threads: 2,
        // slowfs is for watching concurrency: worth one shared counter.
        session: SessionConfig {
            track_inflight: true,
            ..SessionConfig::default()
        },
    };
    for opt in list {
        let bad = || cli::UsageError(format!("unknown or invalid option `{opt}`"));
        if o.session.take_option(opt) {
            continue;
        }
        let (key, value) = opt.split_once('=').ok_or_else(bad)?;
        let n = || value.parse::<u64>().map_err(|_| bad());
        match key {
            "api" if value == "sync" => o.sync = true,
            "api" if value == "async" => o.sync = false,
            "latency_ms" => o.setup.latency = Duration::from_millis(n()?),
            "read_latency_ms" => o.setup.read_latency = Some(Duration::from_millis(n()?)),
            "files" if n()? <= 1000 => o.setup.files = n()?,
            "size" => o.setup.size = n()?,
            "max_in_flight" if n()? > 0 => o.max_in_flight = n()? as usize,
            "runtime_threads" if n()? > 0 => o.runtime_threads = n()? as usize,
            "queue_depth" if n()? > 0 => o.session.uring_queue_depth = n()? as usize,
            _ => return Err(bad()),
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    COMMAND.run(|args| {
        let o = options(&args.options)?;
        let mut mount = args.mount;
        mount.read_only = false;
        mount.fsname.get_or_insert_with(|| "slowfs".into());
        let api = if o.sync { "sync" } else { "async" };
        let tree = Arc::new(Tree::new(o.setup));
        let report = if o.sync {
            fuse_wire::serve_with(SyncSlow(tree.clone()), &args.mountpoint, &mount, o.session)?
        } else {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(o.runtime_threads)
                .thread_name("slowfs-rt")
                .enable_time()
                .build()?;
            let fs = AsyncFs::new(
                AsyncSlow(tree.clone()),
                TokioSpawner::new(runtime.handle().clone()),
            )
            .max_in_flight(o.max_in_flight);
            fuse_wire::serve_with(fs, &args.mountpoint, &mount, o.session)?
        };
        let counters = tree.counters();
        log::info!("served through the {api} trait: {counters:?}");
        if let Some(path) = args.stats {
            std::fs::write(&path, report.stats.to_json_with(&counters))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(())
    })
}

/// The test kit's conformance battery through the fake kernel (no
/// mount), in `rw`, through both traits: what slowfs does not implement
/// (links, renames, xattrs, directories) is unsupported, the rest passes.
#[cfg(test)]
mod battery_tests {
    use super::*;
    use fuse_wire::testing::TestKernel;
    use fuse_wire::testing::battery::Battery;

    fn setup() -> Setup {
        Setup {
            files: 3,
            size: 100,
            latency: Duration::ZERO,
            read_latency: None,
        }
    }

    fn run<F: Filesystem>(k: TestKernel<F>) {
        let rw = Inode(k.lookup(Inode::ROOT, "rw").expect("rw").nodeid);
        let battery = Battery {
            dir: Some(rw),
            ..Battery::default()
        };
        let report = battery.run(&k);
        report.assert_passed();
        let explorer = fuse_wire::testing::explorer::Explorer {
            dir: rw,
            ..Default::default()
        };
        if let Err(f) = explorer.run(&k) {
            panic!("{f}");
        }
        assert_eq!(
            report.outcome("create_write_read"),
            Some(&fuse_wire::testing::battery::Outcome::Passed),
            "{report}"
        );
        if let Err(r) = k.finish() {
            panic!("{r}");
        }
    }

    #[test]
    fn the_conformance_battery_passes_through_the_sync_trait() {
        run(TestKernel::start(SyncSlow(Arc::new(Tree::new(setup())))).expect("the kit starts"));
    }

    #[test]
    fn the_conformance_battery_passes_through_the_async_trait() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .expect("a runtime");
        let fs = AsyncFs::new(
            AsyncSlow(Arc::new(Tree::new(setup()))),
            TokioSpawner::new(runtime.handle().clone()),
        );
        run(TestKernel::start(fs).expect("the kit starts"));
    }
}
