//! objfs: an object store as a filesystem, on the async trait. Each object
//! of a flat bucket is a file of the root; a file opened for writing is
//! staged and uploaded whole when it is closed, as filesystems over S3 and
//! its kin do (an object store has no partial writes).
//!
//! ```sh
//! objfs -o bucket=DIR[,keeper,max_object=BYTES,staging=N,nodes=N,put_delay_ms=N] MOUNTPOINT
//! ```
//!
//! - `bucket=DIR`: the bucket, here a local directory standing in for the
//!   store (`bucket.rs`: one file an object, a PUT replaces it at once).
//! - Staged uploads and the names behind node ids live in kept memory
//!   (`kept.rs`): `staging` uploads at once (default 16) of `max_object`
//!   bytes at most (default 16 MiB: a larger file gets `EFBIG`), `nodes`
//!   names the kernel may hold (default 65536). Memory is taken only as
//!   uploads are written, and given back when they are sent.
//! - `-o keeper`: this process keeps the mount, and a child serves it.
//!   The kept memory is the keeper's, so a daemon killed in the middle of
//!   a `cp` into the mount loses nothing: its successor finds every staged
//!   upload and every node id's name, the kernel sends again what the dead
//!   daemon had not answered, and the `cp` goes on and exits 0 with the
//!   object whole. `SIGUSR2` to the keeper is a graceful upgrade.
//!
//! When uploads happen (the kernel's close order, which every filesystem
//! that commits at close must mind): close(2) sends FLUSH, and RELEASE
//! follows the last close of an open file. A shell's `echo x > f` opens,
//! `dup2`s and closes the first descriptor before it writes, so its first
//! FLUSH comes before any data. objfs uploads at a FLUSH only if data was
//! written since the last upload (so close(2) reports an upload's error),
//! and at RELEASE if what is staged still differs from the object (an
//! open with `O_TRUNC` and no write: the object is emptied then).
//!
//! An upload at FLUSH is a must-finish section (`AsyncContext::must_finish`):
//! a caller interrupted while it runs (Ctrl-C on a `cp`) waits for it and
//! gets its true result, so close(2) never reports `EINTR` for an object
//! that was sent. `-o put_delay_ms=N` makes every PUT take N ms longer, as a
//! far store would; `-o cancellable_uploads` leaves the section out, to see
//! the difference (the caller then gets `EINTR` while the PUT goes on).
//!
//! Under a keeper, a request the dead daemon may have carried out
//! (`AsyncContext::replay`) is answered by its postcondition: a CREATE
//! finds the object and the upload the predecessor staged for it (named
//! by the journal note it left), an UNLINK finds the object gone, a RENAME
//! finds the target there and the source gone. WRITEs, FLUSHes and
//! truncations come to the same when done again. A node id whose name was
//! removed answers ESTALE, never another object.

mod bucket;
#[path = "../common/cli.rs"]
mod cli;
mod kept;

use bucket::Bucket;
use fuse_wire::asyncfs::{
    AsyncContext, AsyncFilesystem, AsyncFs, Created, Data, DirEntry, Open, TokioSpawner,
};
use fuse_wire::proto::flags::InitFlags;
use fuse_wire::session::journal::Replay;
use fuse_wire::session::keeper::{KeeperLink, Restore, run_keeper};
use fuse_wire::session::region::SharedRegion;
use fuse_wire::session::{InitConfig, LockOwner, RenameFlags, RenameRequest};
use fuse_wire::{
    CreateRequest, Entry, Errno, FileAttr, FileHandle, FileKind, Inode, OpenFlags, ReadRequest, Recovery,
    ReleaseRequest, SessionConfig, SetattrRequest, WriteRequest,
};
use kept::{DIRTY, Kept, Sizes, WRITTEN};
use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The vault key of the kept tables.
const KEPT_KEY: u64 = 1;
const TTL: Duration = Duration::from_secs(1);
const SHARDS: usize = 16;

/// The filesystem.
struct ObjFs {
    bucket: Arc<Bucket>,
    kept: Arc<Kept>,
    /// Name → node id, for the names the kernel was given (rebuilt from
    /// the kept tables at start); sharded by name.
    names: [Mutex<HashMap<Vec<u8>, u64>>; SHARDS],
    started: SystemTime,
    /// How long each PUT waits first (`put_delay_ms`).
    put_delay: Duration,
    /// Uploads at FLUSH are cancelled by an INTERRUPT (`cancellable_uploads`).
    cancellable_uploads: bool,
}

fn shard(name: &[u8]) -> usize {
    name.iter()
        .fold(0usize, |h, &b| h.wrapping_mul(31).wrapping_add(b as usize))
        % SHARDS
}

fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

/// Runs blocking store calls off the runtime's threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> io::Result<T> + Send + 'static) -> Result<T, Errno> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(errno),
        Err(_) => Err(Errno::EIO),
    }
}

impl ObjFs {
    fn new(bucket: Bucket, kept: Kept, o: &Options) -> ObjFs {
        let fs = ObjFs {
            bucket: Arc::new(bucket),
            kept: Arc::new(kept),
            names: Default::default(),
            started: SystemTime::now(),
            put_delay: o.put_delay,
            cancellable_uploads: o.cancellable_uploads,
        };
        for (id, name) in fs.kept.nodes() {
            fs.names[shard(&name)].lock().unwrap().insert(name, id);
        }
        fs
    }

    fn object_name(name: &CStr) -> Result<Vec<u8>, Errno> {
        let name = name.to_bytes();
        if !Bucket::valid(name) {
            return Err(if name.len() > 255 {
                Errno::ENAMETOOLONG
            } else {
                Errno::EINVAL
            });
        }
        Ok(name.to_vec())
    }

    /// The node id of `name`, given one if it has none yet.
    fn node_of(&self, name: &[u8]) -> Result<u64, Errno> {
        let mut names = self.names[shard(name)].lock().unwrap();
        if let Some(&id) = names.get(name) {
            return Ok(id);
        }
        let id = self.kept.add_node(name).ok_or(Errno::ENOSPC)?;
        names.insert(name.to_vec(), id);
        Ok(id)
    }

    fn forget_name(&self, name: &[u8]) -> Option<u64> {
        let id = self.names[shard(name)].lock().unwrap().remove(name)?;
        self.kept.remove_node(id);
        Some(id)
    }

    fn name(&self, ino: Inode) -> Result<Vec<u8>, Errno> {
        self.kept.name(ino.0).ok_or(Errno::ESTALE)
    }

    fn root_attr(&self) -> FileAttr {
        FileAttr::at(Inode::ROOT.0, FileKind::Directory, 0o755, self.started)
    }

    /// The attributes of node `ino`: the object's, with the length of an
    /// upload staged for it if there is one.
    async fn attr(&self, ino: Inode) -> Result<FileAttr, Errno> {
        if ino == Inode::ROOT {
            return Ok(self.root_attr());
        }
        let name = self.name(ino)?;
        let bucket = self.bucket.clone();
        let head = blocking(move || bucket.head(&name)).await?.ok_or(Errno::ESTALE)?;
        let staged = self
            .kept
            .all_staged()
            .into_iter()
            .filter(|(_, s)| s.node == ino.0)
            .map(|(_, s)| s.len)
            .max();
        let mut a = FileAttr::at(ino.0, FileKind::RegularFile, 0o644, head.mtime);
        a.size = staged.unwrap_or(head.size);
        a.blocks = a.size.div_ceil(512);
        Ok(a)
    }

    async fn entry(&self, ino: Inode) -> Result<Entry, Errno> {
        Ok(Entry::new(ino, self.attr(ino).await?, TTL))
    }

    /// Sends upload `fh` as its object.
    async fn upload(&self, fh: u64) -> Result<(), Errno> {
        let st = self.kept.staged(fh).ok_or(Errno::EBADF)?;
        let name = self.kept.name(st.node).ok_or(Errno::ESTALE)?;
        let data = self.kept.read(fh, 0, u32::MAX).ok_or(Errno::EBADF)?;
        let (bucket, delay) = (self.bucket.clone(), self.put_delay);
        blocking(move || {
            std::thread::sleep(delay);
            bucket.put(&name, &data)
        })
        .await?;
        self.kept.clear_flags(fh, WRITTEN | DIRTY);
        Ok(())
    }

    /// A staged upload of node `ino` holding the object's bytes (none if
    /// `truncate`), for an open for writing. `reuse`: the upload a
    /// predecessor staged for this request (its journal note), if it is
    /// still there for this node.
    async fn stage(&self, ctx: &AsyncContext, ino: Inode, truncate: bool) -> Result<u64, Errno> {
        let reuse = (ctx.replay() == Replay::MaybeDone)
            .then(|| ctx.journal_note())
            .flatten()
            .filter(|&fh| self.kept.staged(fh).is_some_and(|s| s.node == ino.0));
        if let Some(fh) = reuse {
            return Ok(fh);
        }
        let fh = self.kept.add_staged(ino.0).ok_or(Errno::ENOSPC)?;
        ctx.set_journal_note(fh);
        let filled = async {
            if truncate {
                return self.kept.set_len(fh, 0, DIRTY).map_err(Errno::new_or_eio);
            }
            let name = self.name(ino)?;
            let (bucket, max) = (self.bucket.clone(), self.kept.max_object());
            let data = blocking(move || bucket.get(&name, 0, max + 1)).await?;
            if data.len() > max {
                return Err(Errno::EFBIG);
            }
            self.kept.write(fh, 0, &data).map_err(Errno::new_or_eio)?;
            self.kept.clear_flags(fh, WRITTEN | DIRTY);
            Ok(())
        };
        match filled.await {
            Ok(()) => Ok(fh),
            Err(e) => {
                self.kept.remove_staged(fh);
                Err(e)
            }
        }
    }
}

impl AsyncFilesystem for ObjFs {
    // Node ids and staged uploads live in the kept tables, which the
    // keeper holds: any daemon of the mount resolves them alike.
    fn recovery(&self) -> Recovery {
        Recovery::Durable
    }

    // O_TRUNC comes with the OPEN, so the upload it stages starts empty
    // (without it, the kernel truncates by a SETATTR naming no open file).
    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        config.want(InitFlags::ATOMIC_O_TRUNC);
        Ok(())
    }

    async fn lookup(&self, _: &AsyncContext, parent: Inode, name: &CStr) -> Result<Entry, Errno> {
        if parent != Inode::ROOT {
            return Err(Errno::ENOTDIR);
        }
        let name = Self::object_name(name).map_err(|_| Errno::ENOENT)?;
        let (bucket, n) = (self.bucket.clone(), name.clone());
        if blocking(move || bucket.head(&n)).await?.is_none() {
            return Err(Errno::ENOENT);
        }
        let ino = Inode(self.node_of(&name)?);
        self.entry(ino).await
    }

    async fn getattr(
        &self,
        _: &AsyncContext,
        ino: Inode,
        _: Option<FileHandle>,
    ) -> Result<(Duration, FileAttr), Errno> {
        Ok((TTL, self.attr(ino).await?))
    }

    async fn setattr(
        &self,
        _: &AsyncContext,
        ino: Inode,
        req: &SetattrRequest,
    ) -> Result<(Duration, FileAttr), Errno> {
        if ino == Inode::ROOT {
            return Err(Errno::EPERM);
        }
        if let Some(size) = req.size {
            match req.fh.filter(|fh| self.kept.staged(fh.0).is_some()) {
                Some(fh) => self.kept.set_len(fh.0, size, DIRTY).map_err(Errno::new_or_eio)?,
                None => {
                    // No open upload: the object is read, cut or grown,
                    // and put again whole.
                    let (name, bucket) = (self.name(ino)?, self.bucket.clone());
                    let max = self.kept.max_object() as u64;
                    if size > max {
                        return Err(Errno::EFBIG);
                    }
                    blocking(move || {
                        let mut data = bucket.get(&name, 0, size as usize)?;
                        data.resize(size as usize, 0);
                        bucket.put(&name, &data)
                    })
                    .await?;
                }
            }
        }
        // Owners, modes and times are not an object store's to keep.
        Ok((TTL, self.attr(ino).await?))
    }

    async fn open(&self, ctx: &AsyncContext, ino: Inode, flags: OpenFlags) -> Result<Open, Errno> {
        self.name(ino)?;
        if flags.access_mode() == fuse_wire::AccessMode::Read {
            return Ok(Open::new(FileHandle(0)));
        }
        let fh = self.stage(ctx, ino, flags.truncate()).await?;
        Ok(Open::new(FileHandle(fh)))
    }

    async fn create(
        &self,
        ctx: &AsyncContext,
        parent: Inode,
        name: &CStr,
        req: CreateRequest,
    ) -> Result<Created, Errno> {
        if parent != Inode::ROOT {
            return Err(Errno::ENOTDIR);
        }
        let name = Self::object_name(name)?;
        let (bucket, n) = (self.bucket.clone(), name.clone());
        let existed = blocking(move || bucket.create_empty(&n)).await?;
        let ino = Inode(self.node_of(&name)?);
        let again = ctx.replay() == Replay::MaybeDone;
        // An O_EXCL create that finds the object is refused, unless the
        // dead daemon made it for this very request: its upload is there.
        let ours = again
            && ctx
                .journal_note()
                .and_then(|fh| self.kept.staged(fh))
                .is_some_and(|s| s.node == ino.0);
        if existed && req.flags.exclusive() && !ours {
            return Err(Errno::EEXIST);
        }
        let fh = self.stage(ctx, ino, true).await?;
        Ok(Created::new(self.entry(ino).await?, Open::new(FileHandle(fh))))
    }

    async fn read(
        &self,
        _: &AsyncContext,
        ino: Inode,
        fh: FileHandle,
        req: ReadRequest,
    ) -> Result<Data, Errno> {
        if let Some(data) = self.kept.read(fh.0, req.offset, req.size) {
            return Ok(Data::new(data));
        }
        let (name, bucket) = (self.name(ino)?, self.bucket.clone());
        let data = blocking(move || bucket.get(&name, req.offset, req.size as usize)).await?;
        Ok(Data::new(data))
    }

    async fn write(
        &self,
        _: &AsyncContext,
        _: Inode,
        fh: FileHandle,
        req: WriteRequest<'_>,
    ) -> Result<u32, Errno> {
        let data = req.data.fetch().map_err(errno)?;
        self.kept
            .write(fh.0, req.offset, data)
            .map_err(Errno::new_or_eio)?;
        Ok(data.len() as u32)
    }

    async fn flush(&self, ctx: &AsyncContext, _: Inode, fh: FileHandle, _: LockOwner) -> Result<(), Errno> {
        match self.kept.staged(fh.0) {
            Some(st) if st.flags & WRITTEN != 0 => {
                // Once the PUT is under way, the caller is told how it
                // ended, interrupted or not: an EINTR would report a
                // written file as failed. (RELEASE needs no section: the
                // kernel never interrupts it.)
                let _sent_whole = match self.cancellable_uploads {
                    false => Some(ctx.must_finish()?),
                    true => None,
                };
                self.upload(fh.0).await
            }
            _ => Ok(()),
        }
    }

    async fn release(
        &self,
        _: &AsyncContext,
        _: Inode,
        fh: FileHandle,
        _: ReleaseRequest,
    ) -> Result<(), Errno> {
        let result = match self.kept.staged(fh.0) {
            Some(st) if st.flags & DIRTY != 0 => self.upload(fh.0).await,
            _ => Ok(()),
        };
        if let Err(e) = result {
            log::error!("objfs: uploading at close: {e:?}; the staged bytes are dropped");
        }
        self.kept.remove_staged(fh.0);
        result
    }

    async fn unlink(&self, ctx: &AsyncContext, parent: Inode, name: &CStr) -> Result<(), Errno> {
        if parent != Inode::ROOT {
            return Err(Errno::ENOTDIR);
        }
        let name = Self::object_name(name).map_err(|_| Errno::ENOENT)?;
        let (bucket, n) = (self.bucket.clone(), name.clone());
        let was = blocking(move || bucket.delete(&n)).await?;
        self.forget_name(&name);
        // Gone already: done, if the dead daemon removed it for this request.
        if was || ctx.replay() == Replay::MaybeDone {
            Ok(())
        } else {
            Err(Errno::ENOENT)
        }
    }

    async fn rename(&self, ctx: &AsyncContext, req: &RenameRequest<'_>) -> Result<(), Errno> {
        if req.parent != Inode::ROOT || req.newparent != Inode::ROOT {
            return Err(Errno::ENOTDIR);
        }
        if !(req.flags - RenameFlags::NOREPLACE).is_empty() {
            return Err(Errno::EINVAL);
        }
        let from = Self::object_name(req.name).map_err(|_| Errno::ENOENT)?;
        let to = Self::object_name(req.newname)?;
        if from == to {
            return Ok(());
        }
        let (bucket, f, t, noreplace) = (
            self.bucket.clone(),
            from.clone(),
            to.clone(),
            req.flags.contains(RenameFlags::NOREPLACE),
        );
        let moved = blocking(move || bucket.rename(&f, &t, noreplace)).await;
        if let Err(e) = moved {
            let done = e == Errno::ENOENT && ctx.replay() == Replay::MaybeDone && {
                let (bucket, t) = (self.bucket.clone(), to.clone());
                blocking(move || bucket.head(&t)).await?.is_some()
            };
            if !done {
                return Err(e);
            }
        }
        // The moved object keeps its node id under its new name; the one
        // it replaced names nothing any more.
        self.forget_name(&to);
        let id = self.names[shard(&from)].lock().unwrap().remove(&from);
        if let Some(id) = id
            && self.kept.rename_node(id, &to)
        {
            self.names[shard(&to)].lock().unwrap().insert(to, id);
        }
        Ok(())
    }

    async fn readdir(
        &self,
        _: &AsyncContext,
        ino: Inode,
        _: FileHandle,
        offset: u64,
    ) -> Result<Vec<DirEntry>, Errno> {
        if ino != Inode::ROOT {
            return Err(Errno::ENOTDIR);
        }
        let bucket = self.bucket.clone();
        let names = blocking(move || bucket.list()).await?;
        let mut all = vec![
            DirEntry::new(Inode::ROOT, 1, FileKind::Directory, "."),
            DirEntry::new(Inode::ROOT, 2, FileKind::Directory, ".."),
        ];
        for (i, name) in names.into_iter().enumerate() {
            let id = self.node_of(&name)?;
            all.push(DirEntry::new(
                Inode(id),
                i as u64 + 3,
                FileKind::RegularFile,
                name,
            ));
        }
        Ok(all.into_iter().skip(offset as usize).take(512).collect())
    }
}

/// The `-o` options objfs takes itself.
struct Options {
    bucket: PathBuf,
    keeper: bool,
    sizes: Sizes,
    put_delay: Duration,
    cancellable_uploads: bool,
}

fn options(list: &[String]) -> Result<Options, cli::UsageError> {
    let (mut bucket, mut keeper, mut cancellable_uploads) = (None, false, false);
    let mut put_delay = Duration::ZERO;
    let mut sizes = Sizes {
        nodes: 65536,
        staging: 16,
        max_object: 16 << 20,
    };
    for opt in list {
        let bad = || cli::UsageError(format!("unknown or invalid option `{opt}`"));
        if opt == "keeper" {
            keeper = true;
            continue;
        }
        if opt == "cancellable_uploads" {
            cancellable_uploads = true;
            continue;
        }
        let (key, value) = opt.split_once('=').ok_or_else(bad)?;
        let n = || {
            value
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0 && n < 1 << 31)
                .ok_or_else(bad)
        };
        match key {
            "bucket" => bucket = Some(std::path::absolute(value).map_err(|_| bad())?),
            "nodes" => sizes.nodes = n()?,
            "staging" => sizes.staging = n()?,
            "max_object" => sizes.max_object = n()?,
            "put_delay_ms" => put_delay = Duration::from_millis(n()? as u64),
            _ => return Err(bad()),
        }
    }
    let bucket = bucket.ok_or_else(|| cli::UsageError("objfs needs -o bucket=DIR".into()))?;
    Ok(Options {
        bucket,
        keeper,
        sizes,
        put_delay,
        cancellable_uploads,
    })
}

/// The option list a keeper's child gets: the same tables and bucket.
fn child_options(o: &Options) -> String {
    let mut list = format!(
        "bucket={},nodes={},staging={},max_object={}",
        o.bucket.display(),
        o.sizes.nodes,
        o.sizes.staging,
        o.sizes.max_object
    );
    if !o.put_delay.is_zero() {
        list.push_str(&format!(",put_delay_ms={}", o.put_delay.as_millis()));
    }
    if o.cancellable_uploads {
        list.push_str(",cancellable_uploads");
    }
    list
}

fn runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("objfs-rt")
        .build()
}

/// Under a keeper: the tables are the vault's, new for a new mount, else
/// the predecessor's (refused if blank or of other sizes).
fn restore(r: Restore<'_>, o: &Options) -> io::Result<AsyncFs<ObjFs, TokioSpawner>> {
    let region = r.vault.region(KEPT_KEY, o.sizes.bytes())?;
    let kept = Kept::open(region, o.sizes, r.state.is_none())?;
    let rt = runtime()?;
    let fs = ObjFs::new(Bucket::open(o.bucket.clone())?, kept, o);
    // The runtime lives as long as the process.
    let handle = rt.handle().clone();
    std::mem::forget(rt);
    Ok(AsyncFs::new(fs, TokioSpawner::new(handle)))
}

const COMMAND: cli::Command = cli::Command {
    name: "objfs",
    about: "Serves the objects of a bucket (a directory standing in for an object store) at MOUNTPOINT,
    each uploaded whole when a file written is closed.

    -o bucket=DIR         the bucket (required)
    -o max_object=BYTES   the largest object a write may make (default 16 MiB)
    -o staging=N          uploads staged at once (default 16)
    -o nodes=N            names the kernel may hold at once (default 65536)
    -o put_delay_ms=N     make every upload N ms slower, as a far store would
    -o cancellable_uploads
                          let an interrupt cancel an upload at close (close(2) then
                          says EINTR); by default the caller waits for its result
    -o keeper             keep the mount in this process and serve it from a child,
                          replaced when it dies (SIGUSR2: upgrade to the binary on disk);
                          staged uploads survive the child",
    own_options: true,
    stats: false,
};

fn main() -> ExitCode {
    // Started by a keeper: the options come as one list after `--child`.
    if let Some(link) = KeeperLink::from_env() {
        cli::init_logging(std::env::args().any(|a| a == "-d"));
        let list: Vec<String> = std::env::args()
            .skip_while(|a| a != "--child")
            .nth(1)
            .map(|l| l.split(',').map(String::from).collect())
            .unwrap_or_default();
        let result = options(&list).map_err(|e| e.0).and_then(|o| {
            link.serve(|r| restore(r, &o), |_| Vec::new(), SessionConfig::default())
                .map_err(|e| e.to_string())
        });
        return match result {
            Ok(true) => KeeperLink::exit_retired(),
            r => COMMAND.finish(r.map(drop).map_err(Into::into)),
        };
    }
    COMMAND.run(|args| {
        let o = options(&args.options)?;
        let mut mount = args.mount;
        mount.fsname.get_or_insert_with(|| "objfs".into());
        if o.keeper {
            let program = std::env::current_exe().unwrap_or_else(|_| "objfs".into());
            let mut child = vec!["--child".into(), child_options(&o).into()];
            if args.debug {
                child.push("-d".into());
            }
            run_keeper(&args.mountpoint, &mount, program, child)?;
            return Ok(());
        }
        let region = SharedRegion::create("objfs-kept", o.sizes.bytes())?;
        let fs = ObjFs::new(
            Bucket::open(o.bucket.clone())?,
            Kept::open(region, o.sizes, true)?,
            &o,
        );
        let rt = runtime()?;
        let fs = AsyncFs::new(fs, TokioSpawner::new(rt.handle().clone()));
        fuse_wire::serve_with(fs, &args.mountpoint, &mount, SessionConfig::default())?;
        Ok(())
    })
}
