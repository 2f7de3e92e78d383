//! The passthrough filesystem: every operation is done on the source tree
//! with the `*at` system calls relative to the inode's `O_PATH` descriptor
//! (`O_NOFOLLOW`, `AT_EMPTY_PATH`, `/proc/self/fd/N`), so no symbolic link or
//! `..` leads outside the source directory.

use crate::durable::{self, Keep, Mirror, Words};
use crate::handles::{Budget, DirStream, Direct, Handle, HandleTable, Kept, Open, Opens};
use crate::inodes::{Found, HandleMode, InodeData, InodeFd, InodeTable, LockOwnerFd, Passthrough, SHARDS};
use crate::passthrough::{Fallback, Fallbacks};
use crate::sys::{self, Dir, EMPTY, proc_path};
use fuse_wire::proto::abi::{Attr, EntryOut, Kstatfs, SetattrIn, Statx, SxTime};
use fuse_wire::proto::flags::{FopenFlags, InitFlags, OpenInFlags, SetattrValid, SetxattrFlags, WriteFlags};
use fuse_wire::session::credentials::{self, ActingAs};
use fuse_wire::session::journal::Replay;
use fuse_wire::session::notify::NotifyError;
use fuse_wire::session::reply::*;
use fuse_wire::session::{
    BackingFile, CopyFileRangeRequest, CreateRequest, Entry, Errno, FallocateRequest, FileAttr, FileHandle,
    Filesystem, InitConfig, Inode, Lock, LockOwner, LockRequest, LseekRequest, MknodRequest, OpenFlags,
    ReadRequest, Recovery, ReleaseRequest, RenameRequest, RequestContext, SetattrRequest, SetxattrRequest,
    StatxRequest, WriteRequest,
};
use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Kernel caching policy (`cache=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cache {
    /// No caching: zero timeouts and `DIRECT_IO` opens.
    Never,
    /// 1 s timeouts; page cache kept only while unchanged.
    Auto,
    /// Long timeouts and `KEEP_CACHE`.
    Always,
}

/// How the filesystem behaves (from the `-o` options).
#[derive(Clone, Debug)]
pub struct FsOptions {
    pub cache: Cache,
    /// Entry and attribute timeout.
    pub timeout: Duration,
    /// How long the kernel may cache a name's absence (`negative_timeout=`).
    pub negative_timeout: Duration,
    pub writeback: bool,
    pub xattr: bool,
    pub flock: bool,
    pub posix_lock: bool,
    pub readdirplus: bool,
    /// Ask the kernel for passthrough and open regular files with a
    /// backing file (on by default where the options allow it, see
    /// `args.rs`).
    pub passthrough: bool,
    /// The user asked for passthrough (`-o passthrough`): what keeps it
    /// off is a warning, not a note.
    pub passthrough_forced: bool,
    pub parallel_direct_writes: bool,
    pub default_permissions: bool,
    /// `-o idmap`: ask for `ALLOW_IDMAP`, so the mount can be idmapped.
    /// The kernel then names no caller in requests other than creates:
    /// they are served as the daemon, and what is decided per user (lock
    /// wait shares, handler shares) sees one user for them.
    pub idmap: bool,
    /// The mount is `noatime`: reads through it leave the source's atime
    /// alone too (files opened `O_NOATIME` where allowed). Not in kernel
    /// passthrough mode, whose backing files the kernel opens with the
    /// caller's flags (the source's mount decides), so `noatime` keeps the
    /// default out of it (`passthrough.rs`).
    pub noatime: bool,
    /// Answer reads of buffered handles with `splice(2)` from the source file.
    pub splice: bool,
    /// Whether inodes are known by file handle (`inode_file_handles=`).
    pub inode_file_handles: HandleMode,
    /// Most descriptors cached in file-handle mode (`fd_cache=`).
    pub fd_cache: usize,
    /// Descriptors for open files (sized from the open-file limit at
    /// start; see `openfds.rs`).
    pub open_fds: usize,
    /// `max_write=` (`None`: the session's default, 1 MiB).
    pub max_write: Option<u32>,
    /// Under a keeper: how many nodes the kept table holds (`keeper_nodes=`).
    pub keeper_nodes: usize,
}

impl Default for FsOptions {
    fn default() -> Self {
        Self {
            cache: Cache::Auto,
            timeout: Duration::from_secs(1),
            negative_timeout: Duration::ZERO,
            writeback: false,
            xattr: false,
            flock: false,
            posix_lock: false,
            readdirplus: true,
            passthrough: false,
            passthrough_forced: false,
            parallel_direct_writes: false,
            default_permissions: false,
            idmap: false,
            noatime: false,
            splice: true,
            inode_file_handles: HandleMode::Prefer,
            fd_cache: crate::fdcache::DEFAULT_CAPACITY,
            open_fds: crate::openfds::DEFAULT_DESCRIPTORS,
            max_write: None,
            keeper_nodes: DEFAULT_KEEPER_NODES,
        }
    }
}

/// Nodes the kept table holds by default under a keeper (its records take
/// memory only as they are used).
pub const DEFAULT_KEEPER_NODES: usize = 1 << 20;

/// Reads at least this large are spliced (with `splice`). A spliced reply
/// costs four system calls where `pread` + `writev` cost two; measured on
/// tmpfs with 2 CPUs that only pays from about 32 KiB (4 KiB random reads
/// lost ~5% with splice, 32 KiB ones gained ~5%, 64 KiB ones ~11%).
const SPLICE_MIN: usize = 32 * 1024;

/// `__FMODE_EXEC`: in the flags of the OPEN the kernel sends for a program
/// it is about to execute (`execve` opens `O_RDONLY | __FMODE_EXEC`). The
/// same bit on every architecture; open(2) drops it from callers' flags.
const FMODE_EXEC: i32 = 0o40;

/// The filesystem.
pub struct PassthroughFs {
    opts: FsOptions,
    inodes: InodeTable,
    handles: HandleTable,
    /// The daemon runs as root and can act as its callers.
    root: bool,
    /// Under a keeper (`-o keeper`): notes for the journal are written.
    kept: bool,
    passthrough_warned: AtomicBool,
    /// Why opens are served by the daemon although passthrough is on, each
    /// logged once (see [`Fallback`]).
    fallbacks: Fallbacks,
    /// The kernel refused a backing file for a reason that holds for the
    /// whole connection (no CAP_SYS_ADMIN, not negotiated): later opens
    /// do not ask again.
    backing_refused: AtomicBool,
    /// The device of the source's root when its filesystem does nothing
    /// when a descriptor is closed (see [`quiet_close`]): files on it are
    /// opened without FLUSH, when nothing else needs one.
    quiet_close_dev: Option<u64>,
}

/// Whether a filesystem of type `f_type` acts on close(2) of a descriptor
/// (its file operations have a `flush`, as NFS, CIFS, FUSE and f2fs do, to
/// report delayed write errors or finish atomic writes). Our FLUSH closes a
/// duplicate of the source descriptor for those; on the filesystems listed
/// here that close does nothing, so the FLUSH round trip can be left out.
/// A list of those known, not a guess: any other type keeps FLUSH.
fn quiet_close(f_type: i64) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const EXT4_SUPER_MAGIC: i64 = 0xEF53; // ext2 and ext3 too
    const XFS_SUPER_MAGIC: i64 = 0x5846_5342;
    matches!(f_type, TMPFS_MAGIC | EXT4_SUPER_MAGIC | XFS_SUPER_MAGIC)
}

type Res<T> = io::Result<T>;

fn err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

fn stale() -> io::Error {
    err(libc::ESTALE)
}

/// Makes this thread act as the caller of `ctx` (uid, gid, groups and
/// capabilities, as the library can know them) until the guard drops.
/// The change after which set-ID bits may have to go
/// ([`PassthroughFs::kill_suidgid`]).
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// Content or size changed by a caller without CAP_FSETID.
    Written,
    /// Owner or group changed; the file's group was `old_gid`.
    Chowned { old_gid: u32 },
}

fn as_caller(ctx: &RequestContext<'_>) -> Res<ActingAs> {
    ctx.caller().act_as()
}

/// Rejects names that could step outside the directory they are looked up in.
fn check_name(name: &CStr) -> Res<()> {
    let b = name.to_bytes();
    if b.is_empty() || b.contains(&b'/') {
        return Err(err(libc::EINVAL));
    }
    Ok(())
}

/// A create-style system call's result, for a request sent again after a
/// crash ([`Replay::MaybeDone`]): its `EEXIST` is the predecessor's doing,
/// and so success, when the name now is what the request makes (`made`
/// says, from its attributes). The kernel holds the directory's lock from
/// before the first attempt to the answer, so nobody else made it.
fn done_before(
    ctx: &RequestContext<'_>,
    r: Res<()>,
    dir: BorrowedFd<'_>,
    name: &CStr,
    made: impl FnOnce(&libc::stat) -> bool,
) -> Res<()> {
    match r {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) && ctx.replay() == Replay::MaybeDone => {
            match sys::fstatat(Dir::Fd(dir), name, libc::AT_SYMLINK_NOFOLLOW) {
                Ok(st) if made(&st) => {
                    log::info!("{name:?}: made by the predecessor before it died; answered as done");
                    Ok(())
                }
                _ => Err(e),
            }
        }
        r => r,
    }
}

/// A removal's result under [`Replay::MaybeDone`]: a name already gone was
/// removed by the predecessor (the kernel holds the directory's lock).
fn gone_before(ctx: &RequestContext<'_>, r: Res<()>, name: &CStr) -> Res<()> {
    match r {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) && ctx.replay() == Replay::MaybeDone => {
            log::info!("{name:?}: removed by the predecessor before it died; answered as done");
            Ok(())
        }
        r => r,
    }
}

/// Whether the file at `path` has extended attribute `name` with `value`.
fn holds_xattr(path: &CStr, name: &CStr, value: &[u8]) -> bool {
    let mut buf = vec![0u8; value.len() + 1];
    sys::getxattr(path, name, &mut buf).is_ok_and(|n| buf[..n] == *value)
}

/// Whether `st` is of kind `kind` (`S_IFMT` bits).
fn is_kind(st: &libc::stat, kind: u32) -> bool {
    st.st_mode & libc::S_IFMT == kind
}

/// Refuses the options whose state cannot outlive the daemon under a
/// keeper, saying why.
pub fn check_keeper_options(opts: &FsOptions) -> Result<(), String> {
    if opts.inode_file_handles == HandleMode::Never {
        return Err(
            "-o keeper needs inodes known by file handle: a successor finds an inode again only \
                    by its handle; drop inode_file_handles=never"
                .into(),
        );
    }
    if opts.passthrough {
        return Err(
            "-o keeper with passthrough: the kernel's backing files and their counts live in the \
                    daemon; not supported yet"
                .into(),
        );
    }
    if opts.posix_lock {
        return Err(
            "-o keeper with posix_lock: the daemon's lock owner descriptors (and so every POSIX \
                    lock) would be lost with it; not supported yet"
                .into(),
        );
    }
    Ok(())
}

fn is_dot_or_dotdot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

impl PassthroughFs {
    /// Serves the directory behind `root` (an `O_PATH` descriptor).
    pub fn new(root: OwnedFd, opts: FsOptions) -> Res<Self> {
        let quiet_close_dev = match sys::fs_type(root.as_fd()) {
            Ok(t) if quiet_close(t) => Some(sys::stat_fd(root.as_fd())?.st_dev),
            _ => None,
        };
        Ok(Self {
            quiet_close_dev,
            inodes: InodeTable::new(root, opts.inode_file_handles, opts.fd_cache)?,
            handles: HandleTable::new(Arc::new(Budget::new(opts.open_fds))),
            opts,
            root: sys::geteuid() == 0,
            kept: false,
            passthrough_warned: AtomicBool::new(false),
            fallbacks: Fallbacks::default(),
            backing_refused: AtomicBool::new(false),
        })
    }

    /// Serves `root` under a keeper (`-o keeper`): the node table is
    /// mirrored in `region` (memory the keeper holds) and every open file's
    /// descriptor deposited with `keep`; what a predecessor left there (the
    /// table's records, and `deposits`, the descriptors it left with the
    /// vault) is taken up first, so the node ids, generations, lookup
    /// counts and file handles the kernel holds stay valid.
    /// `takeover`: a predecessor served the connection, so its table must
    /// be there.
    pub fn kept(
        root: OwnedFd,
        opts: FsOptions,
        region: Arc<dyn Words>,
        keep: Arc<dyn Keep>,
        deposits: Vec<(u64, OwnedFd)>,
        takeover: bool,
    ) -> Res<Self> {
        check_keeper_options(&opts).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mirror = Mirror::new(region, SHARDS, opts.keeper_nodes.div_ceil(SHARDS), takeover)?;
        let (mut anchors, mut files) = (HashMap::new(), Vec::new());
        let kept = Kept::new(keep.clone(), &mirror);
        for (key, fd) in deposits {
            match durable::anchor_of(key) {
                Some(id) => {
                    anchors.insert(id, fd);
                }
                None if key < durable::FH_KEYS_END => files.push((key, fd)),
                None => {
                    log::warn!("a kept descriptor under the unknown key {key:#x}: closed");
                    if let Err(e) = keep.withdraw(key) {
                        log::warn!("withdrawing it: {e}");
                    }
                }
            }
        }
        let mut fs = Self::new(root, opts)?;
        fs.kept = true;
        fs.inodes = fs.inodes.keep_in(mirror, keep.clone(), anchors)?;
        let mut handles = HandleTable::new(Arc::new(Budget::new(fs.opts.open_fds)));
        let reopen = |inode: &Arc<InodeData>, flags: i32| {
            let fd = fs.inodes.fd(inode)?;
            // Opened already: nothing to create or truncate.
            let flags = fs.source_flags(flags) & !(libc::O_TRUNC | libc::O_TMPFILE);
            sys::openat(Dir::Cwd, &proc_path(fd.as_fd()), flags, 0)
        };
        handles.restore(kept, files, &fs.inodes, &reopen, |f| fs.source_flags(f));
        fs.handles = handles;
        Ok(fs)
    }

    /// Inodes the kernel holds lookups on (the root not counted).
    pub fn live_inodes(&self) -> usize {
        self.inodes.live()
    }

    /// Open files and directories.
    pub fn open_handles(&self) -> usize {
        self.handles.len()
    }

    /// Whether inodes are known by file handle, their descriptors reopened
    /// on demand and cached (`-o inode_file_handles=`, the source probed at
    /// start), rather than each holding a descriptor.
    pub fn uses_file_handles(&self) -> bool {
        self.inodes.uses_file_handles()
    }

    /// The most descriptors cached in file-handle mode (0 without it).
    pub fn fd_cache_capacity(&self) -> usize {
        self.inodes.fd_cache_capacity()
    }

    /// A descriptor of `inode` (see `InodeTable::fd`); keep it while any
    /// path made from it is in use.
    fn fd<'a>(&self, inode: &'a InodeData) -> Res<InodeFd<'a>> {
        self.inodes.fd(inode)
    }

    fn inode(&self, ino: Inode) -> Res<Arc<InodeData>> {
        self.inodes.get(ino.0).ok_or_else(stale)
    }

    fn handle(&self, fh: FileHandle) -> Res<Arc<Handle>> {
        self.handles.get(fh.0).ok_or_else(|| err(libc::EBADF))
    }

    /// Open file `fh` with its descriptor, opened again if it was closed
    /// while idle (see `openfds.rs`).
    fn open_file(&self, fh: FileHandle) -> Res<Open> {
        self.handles.open(fh.0, |h, flags| self.reopen(fh.0, h, flags))
    }

    /// Opens the source file of handle `fh` again with `flags` (those of
    /// its open, less what creates or truncates), through its node: as the
    /// daemon, since the caller's open was checked when it was made, as a
    /// descriptor open on a plain directory stays usable after a chmod.
    /// Checked to be the same inode; a failure is logged and answers the
    /// request that needed the file with an error (`EIO` for an inode that
    /// is gone), never with another file's data.
    fn reopen(&self, fh: u64, h: &Handle, flags: i32) -> Res<OwnedFd> {
        let r = (|| {
            let _as_daemon = credentials::as_daemon();
            let ifd = self.fd(&h.inode)?;
            let fd = self.open_source(&proc_path(ifd.as_fd()), flags)?;
            let st = sys::stat_fd(fd.as_fd())?;
            if (st.st_dev, st.st_ino) != h.inode.key {
                return Err(stale());
            }
            Ok(fd)
        })();
        r.map_err(|e| {
            log::error!(
                "open file {fh} (node {}): opening it again (its descriptor was closed while idle): {e}; \
                 the request fails",
                h.node
            );
            match e.raw_os_error() {
                Some(libc::ESTALE) | Some(libc::ENOENT) | None => err(libc::EIO),
                Some(_) => e,
            }
        })
    }

    fn entry(&self, parent: &InodeData, found: &Found, st: &libc::stat) -> Entry {
        let ttl = self.child_ttl(parent);
        Entry {
            ino: Inode(found.id),
            generation: found.generation,
            attr: FileAttr::from_stat(st),
            entry_ttl: ttl,
            attr_ttl: self.attr_ttl(ttl, st.st_mode),
        }
    }

    /// How long the kernel may keep attributes whose mode is `mode`, at
    /// most `ttl`: not at all for a set-ID regular file with kernel
    /// passthrough. A passed-through write clears the bits in the source
    /// without a word to us, and the kernel keeps the mode it has cached;
    /// a cached S_ISUID would make an exec through the mount set-user-ID
    /// with content an unprivileged writer changed. Uncached, every exec
    /// and stat asks again (the kernel refreshes expired attributes before
    /// an exec).
    fn attr_ttl(&self, ttl: Duration, mode: u32) -> Duration {
        if self.opts.passthrough
            && mode & libc::S_IFMT == libc::S_IFREG
            && mode & (libc::S_ISUID | libc::S_ISGID) != 0
        {
            Duration::ZERO
        } else {
            ttl
        }
    }

    /// How long the kernel may keep an entry of `parent` and its
    /// attributes.
    ///
    /// Without `default_permissions` the kernel checks no permission on a
    /// path walk: a cached entry would let anyone reach a name that only
    /// its first caller could search for (root reads `secret/file`, then
    /// everyone can). So below a directory that not everyone may search
    /// (a class without the search bit, or an ACL that may single users out)
    /// nothing is cached, and every walk through it comes here as a LOOKUP
    /// made as its caller, which the source filesystem checks.
    fn child_ttl(&self, parent: &InodeData) -> Duration {
        if self.opts.default_permissions || self.opts.timeout.is_zero() || self.searchable_by_all(parent) {
            self.opts.timeout
        } else {
            Duration::ZERO
        }
    }

    /// How long the kernel may cache that a name is missing in `parent`
    /// (`None`: not at all), by the rule of [`Self::child_ttl`]: below a
    /// directory that not everyone may search, each walk is asked again.
    fn negative_ttl(&self, parent: Inode) -> Option<Duration> {
        let ttl = self.opts.negative_timeout;
        if ttl.is_zero() {
            return None;
        }
        let dir = self.inode(parent).ok()?;
        (self.opts.default_permissions || self.searchable_by_all(&dir)).then_some(ttl)
    }

    /// Whether everyone may search `dir` (remembered until a chmod or ACL
    /// change through this mount).
    fn searchable_by_all(&self, dir: &InodeData) -> bool {
        match dir.search_all.load(Ordering::Relaxed) {
            1 => return true,
            2 => return false,
            _ => {}
        }
        let _as_daemon = credentials::as_daemon();
        let Ok(fd) = self.fd(dir) else {
            return false;
        };
        let all = match sys::stat_fd(fd.as_fd()) {
            // Every class: the owner and the group class are held to their
            // own bits even where others may search.
            Ok(st) if st.st_mode & 0o111 == 0o111 => {
                let acl = sys::getxattr(&proc_path(fd.as_fd()), c"system.posix_acl_access", &mut []);
                matches!(acl, Err(e) if e.raw_os_error() == Some(libc::ENODATA) || e.raw_os_error() == Some(libc::EOPNOTSUPP))
            }
            _ => false,
        };
        dir.search_all.store(if all { 1 } else { 2 }, Ordering::Relaxed);
        all
    }

    /// After a change of `dir`'s mode or ACL through the mount: forget what
    /// was known of its searchability and, if not everyone may search it
    /// now, drop the kernel's cached entries below it (cached while it was
    /// open to all) before the change is answered. The kernel's entry
    /// epoch (INC_EPOCH, 7.44) does that at once, for every cached entry;
    /// per-name invalidation, the fallback, must be queued, because the
    /// kernel takes the directory's lock for it, which the request being
    /// served holds, so it lands shortly after the answer.
    /// After a change of `ino`'s ACL: the mode may have changed with it.
    /// A kernel without POSIX_ACL does not know that, and in writeback mode
    /// keeps the mode it has; drop its cached attributes before answering
    /// (attributes only: that takes no lock the request holds).
    fn acl_changed(&self, ctx: &RequestContext<'_>, ino: Inode, inode: &InodeData) {
        if !ctx.negotiated().flags.contains(InitFlags::POSIX_ACL)
            && let Err(e) = ctx.notifier().inval_inode(ino, -1, 0).and_then(|t| t.wait())
        {
            log::warn!("invalidating the attributes of ino {ino} after an ACL change: {e}");
        }
        self.search_changed(ctx, ino, inode);
    }

    fn search_changed(&self, ctx: &RequestContext<'_>, ino: Inode, dir: &InodeData) {
        if self.opts.default_permissions || !dir.is_dir() {
            return;
        }
        let before = dir.search_all.swap(0, Ordering::Relaxed);
        if before == 2 || self.searchable_by_all(dir) {
            return;
        }
        match ctx.notifier().inc_epoch() {
            Ok(t) => match t.wait() {
                Ok(()) => return,
                Err(e) => log::warn!("INC_EPOCH after closing directory ino {ino}: {e}"),
            },
            Err(e) => log::debug!("INC_EPOCH: {e}; invalidating entries one by one"),
        }
        let _as_daemon = credentials::as_daemon();
        let Ok(dfd) = self.fd(dir) else {
            return;
        };
        let Ok(fd) = sys::openat(Dir::Fd(dfd.as_fd()), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0) else {
            return;
        };
        let mut stream = DirStream::new();
        while let Ok(Some(rec)) = stream.peek(fd.as_fd()) {
            let (len, next) = (rec.len(), rec.next);
            let name = rec.name.to_bytes();
            if !is_dot_or_dotdot(name)
                && let Err(e) = ctx.notifier().inval_entry(ino, name, false)
            {
                log::warn!("invalidating cached entries below ino {ino}: {e}");
                return;
            }
            stream.advance(len, next);
        }
    }

    /// After a RENAME put `name` in `dir`: if not everyone may search `dir`,
    /// what the kernel cached of the moved entry and below it while it was
    /// reachable by all must go before the answer, or other users would
    /// walk into it through the cache. The entry epoch (INC_EPOCH) drops it
    /// at once; the per-name fallback is queued (the kernel takes `dir`'s
    /// lock for it, which the rename holds) and lands just after the answer.
    fn moved_into(&self, ctx: &RequestContext<'_>, ino: Inode, dir: &InodeData, name: &CStr) {
        if self.opts.default_permissions || self.opts.timeout.is_zero() || self.searchable_by_all(dir) {
            return;
        }
        match ctx.notifier().inc_epoch() {
            Ok(t) => match t.wait() {
                Ok(()) => return,
                Err(e) => log::warn!("INC_EPOCH after a rename into directory ino {ino}: {e}"),
            },
            Err(e) => log::debug!("INC_EPOCH: {e}; invalidating the renamed entry"),
        }
        if let Err(e) = ctx.notifier().inval_entry(ino, name.to_bytes(), false) {
            log::warn!("invalidating {name:?} in ino {ino} after a rename: {e}");
        }
    }

    /// Looks `name` up in `parent` and counts one lookup of the result.
    fn do_lookup(&self, parent: &Arc<InodeData>, name: &CStr) -> Res<(Found, libc::stat)> {
        check_name(name)?;
        let b = name.to_bytes();
        let pfd = self.fd(parent)?;
        if b == b"." || (b == b".." && Arc::ptr_eq(parent, self.inodes.root())) {
            // The directory itself, or the root's parent, which is the root.
            let fd = sys::openat(Dir::Fd(pfd.as_fd()), c".", libc::O_PATH, 0)?;
            let st = sys::stat_fd(fd.as_fd())?;
            let found = self.inodes.lookup_or_insert(fd, &st)?;
            return Ok((found, st));
        }
        let fd = sys::openat(Dir::Fd(pfd.as_fd()), name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        drop(pfd);
        let st = sys::stat_fd(fd.as_fd())?;
        let found = self.inodes.lookup_or_insert(fd, &st)?;
        Ok((found, st))
    }

    /// Open flags for a reopen or create on the source side.
    fn source_flags(&self, flags: i32) -> i32 {
        let mut f = flags & !(libc::O_NOFOLLOW | libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | FMODE_EXEC);
        if self.opts.writeback {
            // The kernel reads pages around partial writes, and keeps the
            // file size itself: a write-only or append-only descriptor
            // would fail those reads or write at the wrong place.
            if f & libc::O_ACCMODE == libc::O_WRONLY {
                f = (f & !libc::O_ACCMODE) | libc::O_RDWR;
            }
            f &= !libc::O_APPEND;
        }
        if self.kept {
            // Appends pick their offset themselves (see write_as_caller).
            f &= !libc::O_APPEND;
        }
        f
    }

    /// Opens the source file at `path` (a `/proc/self/fd` path) with
    /// `flags`, plus `O_NOATIME` on a `noatime` mount, and again without
    /// it where that is refused (`EPERM`: not the opener's file, no
    /// `CAP_FOWNER`).
    fn open_source(&self, path: &CStr, flags: i32) -> io::Result<OwnedFd> {
        if self.opts.noatime {
            match sys::openat(Dir::Cwd, path, flags | libc::O_NOATIME, 0) {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                r => return r,
            }
        }
        sys::openat(Dir::Cwd, path, flags, 0)
    }

    fn file_open_flags(&self, inode: &InodeData, passthrough: bool) -> FopenFlags {
        let mut f = FopenFlags::empty();
        let regular = inode.kind == libc::S_IFREG;
        if self.needs_no_flush(inode) {
            f |= FopenFlags::NOFLUSH;
        }
        if !passthrough {
            match self.opts.cache {
                Cache::Never => f |= FopenFlags::DIRECT_IO,
                Cache::Always => f |= FopenFlags::KEEP_CACHE,
                Cache::Auto => {}
            }
        }
        if self.opts.parallel_direct_writes && regular {
            f |= FopenFlags::DIRECT_IO | FopenFlags::PARALLEL_DIRECT_WRITES;
            f -= FopenFlags::KEEP_CACHE;
        }
        f
    }

    /// Whether closing a descriptor of this inode may skip FLUSH
    /// (`FOPEN_NOFLUSH`). FLUSH does two things here: it drops the POSIX
    /// locks of the closing lock owner, which only `-o posix_lock` hands to
    /// us (otherwise the kernel keeps them and drops them itself on close),
    /// and it closes a duplicate of the source descriptor, which reports
    /// nothing on the source filesystems [`quiet_close`] lists. With
    /// `writeback` the kernel sends FLUSH anyway, to write dirty pages back.
    fn needs_no_flush(&self, inode: &InodeData) -> bool {
        !self.opts.posix_lock
            && !self.opts.writeback
            && inode.kind == libc::S_IFREG
            && self.quiet_close_dev == Some(inode.key.0)
    }

    /// Whether opens of this inode go through a kernel backing file.
    fn use_passthrough(&self, ctx: &RequestContext<'_>, inode: &InodeData) -> bool {
        if !self.opts.passthrough
            || inode.kind != libc::S_IFREG
            || self.backing_refused.load(Ordering::Relaxed)
        {
            return false;
        }
        if ctx.negotiated().flags.contains(InitFlags::PASSTHROUGH) {
            return true;
        }
        // Not offered is said at INIT; this is a kernel that was offered
        // it and refused it.
        if self.opts.passthrough_forced && !self.passthrough_warned.swap(true, Ordering::Relaxed) {
            log::warn!("passthrough was requested but the kernel did not grant it; serving reads and writes");
        }
        false
    }

    /// An open of an inode with no passthrough open that cannot have a
    /// backing file for `why`: it is served by the daemon (and so are the
    /// inode's opens until the last such one is released), never failed.
    fn fall_back(
        &self,
        pt: &mut Passthrough,
        why: Fallback,
        detail: &dyn std::fmt::Display,
    ) -> Res<Option<BackingFile>> {
        if self.fallbacks.first(why) {
            log::warn!("passthrough: {detail}; such opens are served by the daemon (logged once)");
        }
        pt.served += 1;
        Ok(None)
    }

    /// Takes a reference on the inode's backing file, registering it first
    /// if this is the inode's first passthrough open; `None` for an open the
    /// daemon serves itself.
    ///
    /// Opens of a set-user-ID or set-group-ID file are served by the daemon
    /// while no passthrough open exists: the kernel runs passed-through
    /// writes with the backing file's credentials, which clear those bits
    /// for every writer, where a writer with `CAP_FSETID` keeps them on a
    /// plain directory. The kernel refuses to mix the two kinds of open on
    /// one inode, so the choice holds while either kind is open.
    fn attach_backing(
        &self,
        ctx: &RequestContext<'_>,
        inode: &InodeData,
        fd: BorrowedFd<'_>,
        write: bool,
    ) -> Res<Option<BackingFile>> {
        let mut pt = inode.passthrough();
        if pt.backing.is_none()
            && (pt.served > 0 || sys::stat_fd(fd)?.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0)
        {
            pt.served += 1;
            return Ok(None);
        }
        if let Some(b) = &pt.backing {
            if write && !pt.writable {
                return Err(err(pt.write_errno));
            }
            let b = b.clone();
            pt.opens += 1;
            return Ok(Some(b));
        }
        // One backing file serves every open of the inode, so open it for
        // reading and writing when the source allows.
        let ifd = self.fd(inode)?;
        let path = proc_path(ifd.as_fd());
        // Shared by the later opens of every caller: opened as the daemon.
        let _as_daemon = credentials::as_daemon();
        let (fd, writable, write_errno) = match self.open_source(&path, libc::O_RDWR) {
            Ok(fd) => (fd, true, 0),
            Err(e) => {
                let werr = e.raw_os_error().unwrap_or(libc::EACCES);
                match self.open_source(&path, libc::O_RDONLY) {
                    Ok(fd) => (fd, false, werr),
                    Err(e) => {
                        return self.fall_back(
                            &mut pt,
                            Fallback::Reopen,
                            &format_args!("reopening a file for its backing file: {e}"),
                        );
                    }
                }
            }
        };
        if write && !writable {
            // The caller may write through its own descriptor.
            let e = io::Error::from_raw_os_error(write_errno);
            return self.fall_back(
                &mut pt,
                Fallback::Reopen,
                &format_args!("reopening a file for writing for its backing file: {e}"),
            );
        }
        let b = match ctx.open_backing(fd.as_fd()) {
            Ok(b) => b,
            Err(e) => {
                let why = Fallback::of(&e);
                if why.is_connection_wide() {
                    self.backing_refused.store(true, Ordering::Relaxed);
                }
                return self.fall_back(&mut pt, why, &format_args!("registering a backing file: {e}"));
            }
        };
        pt.backing = Some(b.clone());
        pt.opens = 1;
        pt.writable = writable;
        pt.write_errno = write_errno;
        Ok(Some(b))
    }

    /// Makes a handle of `fd`, with a backing file in passthrough mode.
    fn new_handle(
        &self,
        ctx: &RequestContext<'_>,
        node: u64,
        inode: Arc<InodeData>,
        fd: OwnedFd,
        flags: i32,
        named: bool,
    ) -> Res<(FileHandle, FopenFlags, Option<BackingFile>)> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let (backing, served) = match self.use_passthrough(ctx, &inode) {
            true => match self.attach_backing(ctx, &inode, fd.as_fd(), write)? {
                Some(b) => (Some(b), false),
                None => (None, true),
            },
            false => (None, false),
        };
        let passthrough = backing.is_some();
        let open_flags = self.file_open_flags(&inode, passthrough);
        // A passed-through O_DIRECT open without DIRECT_IO is the kernel's
        // to serve: it reads and writes the backing file with O_DIRECT's
        // iocb, so the daemon needs no O_DIRECT descriptor of its own.
        let kernel_served = passthrough && !open_flags.contains(FopenFlags::DIRECT_IO);
        let direct = if flags & libc::O_DIRECT != 0 && inode.kind == libc::S_IFREG && !kernel_served {
            // A reopen of what the caller has just opened (or created: its
            // mode may refuse a second open), so as the daemon.
            let _as_daemon = credentials::as_daemon();
            Some(Direct::new(fd.as_fd(), self.source_flags(flags))?)
        } else {
            None
        };
        let mut handle = Handle::new(fd, inode, passthrough, ctx.uid());
        handle.direct = direct;
        handle.served = served;
        handle.append = self.kept && !self.opts.writeback && flags & libc::O_APPEND != 0;
        if named {
            handle = handle.reopen_with(self.source_flags(flags));
        }
        let fh = self.handles.insert(handle, node, flags)?;
        Ok((FileHandle(fh), open_flags, backing))
    }

    /// Whether `flags` are those of the kernel's own open of a program for
    /// `execve` (`O_RDONLY | __FMODE_EXEC`; no caller can set that bit in
    /// open(2)), on a mount where the kernel has checked the caller's
    /// execute permission itself.
    fn is_exec_open(&self, flags: i32) -> bool {
        self.opts.default_permissions && flags & FMODE_EXEC != 0 && flags & libc::O_ACCMODE == libc::O_RDONLY
    }

    /// Opens a program the caller may execute but not read (mode 0711 and
    /// the like) for the kernel's `execve`: as the daemon, once the source
    /// agrees that the caller may execute it. The descriptor serves only
    /// the kernel's reads of the program (the caller never holds this open
    /// file), and an ordinary open for reading still fails as the caller.
    ///
    /// Only with `default_permissions`: there the kernel also finds the
    /// program unreadable and makes the new process non-dumpable, so its
    /// pages cannot be read through ptrace or `/proc/PID/mem`. Without it
    /// the kernel asks nothing before deciding dumpability and would let
    /// the caller read the program that way; such execs keep failing.
    fn open_for_exec(&self, path: &CStr, flags: i32) -> Res<OwnedFd> {
        sys::faccessat(path, libc::X_OK, libc::AT_EACCESS)?;
        let _as_daemon = credentials::as_daemon();
        sys::openat(Dir::Cwd, path, self.source_flags(flags), 0)
    }

    /// The mode to create a node with, after giving this thread the
    /// caller's umask. The kernel leaves the umask to us (`DONT_MASK`)
    /// because the source applies it only where the parent directory has no
    /// default ACL; where it has one, the ACL decides. Without `DONT_MASK`
    /// the kernel has applied it, and the thread's umask must be 0.
    fn caller_umask(&self, ctx: &RequestContext<'_>, mode: u32) -> u32 {
        let umask = match ctx.umask() {
            Some(u) if ctx.negotiated().flags.contains(InitFlags::DONT_MASK) => u & 0o777,
            _ => 0,
        };
        match sys::thread_umask(umask) {
            Ok(()) => mode,
            Err(e) => {
                // Default ACLs then get the umask applied on top.
                log::warn!("cannot give this thread its own umask: {e}");
                mode & !umask
            }
        }
    }

    /// Lookup + open (+ create) for CREATE and atomic open.
    ///
    /// Creating with `O_EXCL` tells exactly whether this call created the
    /// file. A name that exists is never opened by name: it may be anything
    /// someone put in the source behind the mount's back (the kernel sends
    /// CREATE for a name it believes missing), and opening a FIFO blocks
    /// this worker until a writer or reader comes, opening a device node
    /// acts on the device. So the name is first opened `O_PATH` (which
    /// opens nothing), and only a regular file (or, for an atomic open
    /// without `O_CREAT`, a directory) is reopened, through
    /// `/proc/self/fd/N`: that same inode, whatever happens to the name
    /// meanwhile. Anything else is answered `ESTALE`, on which the kernel
    /// walks the path again with `LOOKUP_REVAL`: its cached negative entry
    /// is then revalidated by a LOOKUP, and the kernel opens the FIFO or
    /// device itself (or follows the symbolic link, or refuses the
    /// directory) as on any filesystem. A file removed in between is
    /// retried, a few times (then `ESTALE` too).
    fn open_at(&self, parent: &Arc<InodeData>, name: &CStr, flags: i32, mode: u32) -> Res<(OwnedFd, bool)> {
        let oflags = self.source_flags(flags) | libc::O_NOFOLLOW;
        let create = flags & libc::O_CREAT != 0;
        let exclusive = flags & libc::O_EXCL != 0;
        let pfd = self.fd(parent)?;
        let dir = Dir::Fd(pfd.as_fd());
        for _ in 0..8 {
            if create {
                match sys::openat(dir, name, oflags | libc::O_CREAT | libc::O_EXCL, mode) {
                    Ok(fd) => return Ok((fd, true)),
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) && !exclusive => {}
                    Err(e) => return Err(e),
                }
            }
            let path_fd = match sys::openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0) {
                Ok(fd) => fd,
                Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(e),
            };
            let kind = sys::stat_fd(path_fd.as_fd())?.st_mode & libc::S_IFMT;
            if kind != libc::S_IFREG && (create || kind != libc::S_IFDIR) {
                log::debug!(
                    "open of {name:?}: not a regular file (mode {kind:o}); the kernel looks it up again"
                );
                return Err(stale());
            }
            // The magic link is what O_NOFOLLOW would refuse; it leads to
            // the inode just checked, never elsewhere.
            let fd = sys::openat(
                Dir::Cwd,
                &proc_path(path_fd.as_fd()),
                oflags & !libc::O_NOFOLLOW,
                0,
            )?;
            return Ok((fd, false));
        }
        // The name keeps appearing and vanishing: the kernel walks again.
        Err(stale())
    }

    /// Registers the open `fd` (created or not) as an inode and a handle,
    /// and answers the CREATE-style reply.
    fn finish_create(
        &self,
        ctx: &RequestContext<'_>,
        parent: &InodeData,
        fd: OwnedFd,
        flags: i32,
        created: bool,
        reply: ReplyCreate,
    ) {
        let stat_and_path = sys::stat_fd(fd.as_fd()).and_then(|st| {
            Ok((
                st,
                sys::openat(Dir::Cwd, &proc_path(fd.as_fd()), libc::O_PATH, 0)?,
            ))
        });
        let (st, path_fd) = match logged(stat_and_path) {
            Ok(v) => v,
            Err(e) => return reply.io_error(&e),
        };
        let found = match logged(self.inodes.lookup_or_insert(path_fd, &st)) {
            Ok(f) => f,
            Err(e) => return reply.io_error(&e),
        };
        let mut st = st;
        if !created && flags & libc::O_TRUNC != 0 && ctx.open_in_flags().contains(OpenInFlags::KILL_SUIDGID) {
            // The answer carries the attributes: the mode after the kill.
            match self
                .kill_suidgid(ctx, &found.data, Kill::Written, None)
                .and_then(|_| sys::stat_fd(fd.as_fd()))
            {
                Ok(now) => st = now,
                Err(e) => {
                    // The kernel never sees this entry: drop the lookup it counted.
                    self.inodes.forget(found.id, 1);
                    return reply.io_error(&e);
                }
            }
        }
        if self.kept
            && st.st_nlink == 0
            && let Err(e) = self.keep_node(found.id, &found.data)
        {
            // A file without a name (O_TMPFILE) is reached only through a
            // deposited descriptor after a crash.
            self.inodes.forget(found.id, 1);
            return reply.io_error(&e);
        }
        let entry = self.entry(parent, &found, &st);
        if found.data.is_dir() {
            // An atomic open of an existing directory: a directory handle.
            return match self.handles.insert(
                Handle::new(fd, found.data.clone(), false, ctx.uid()),
                found.id,
                flags,
            ) {
                Ok(fh) => reply.opened(&entry, FileHandle(fh), FopenFlags::empty()),
                Err(e) => {
                    self.inodes.forget(found.id, 1);
                    reply.io_error(&e)
                }
            };
        }
        match self.new_handle(ctx, found.id, found.data.clone(), fd, flags, st.st_nlink > 0) {
            Ok((fh, fl, None)) if created => reply.created(&entry, fh, fl),
            Ok((fh, fl, None)) => reply.opened(&entry, fh, fl),
            Ok((fh, fl, Some(b))) => reply.passthrough(&entry, fh, fl, &b, created),
            Err(e) => {
                // The kernel never sees this entry: drop the lookup it counted.
                self.inodes.forget(found.id, 1);
                reply.io_error(&e)
            }
        }
    }

    fn set_times(
        &self,
        inode: &InodeData,
        h: Option<&Open>,
        attr: &SetattrIn,
        valid: SetattrValid,
    ) -> Res<()> {
        let ts = |set: bool, now: bool, sec: u64, nsec: u32| libc::timespec {
            tv_sec: if set && !now { sec as libc::time_t } else { 0 },
            tv_nsec: if now {
                libc::UTIME_NOW
            } else if set {
                nsec as libc::c_long
            } else {
                libc::UTIME_OMIT
            },
        };
        let times = [
            ts(
                valid.contains(SetattrValid::ATIME),
                valid.contains(SetattrValid::ATIME_NOW),
                attr.atime,
                attr.atimensec,
            ),
            ts(
                valid.contains(SetattrValid::MTIME),
                valid.contains(SetattrValid::MTIME_NOW),
                attr.mtime,
                attr.mtimensec,
            ),
        ];
        let ifd = self.fd(inode)?;
        let set = |times: &[libc::timespec; 2]| {
            if let Some(h) = h {
                return sys::futimens(h.fd(), times);
            }
            let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
            match sys::utimensat(Dir::Fd(ifd.as_fd()), EMPTY, times, flags) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && !inode.is_symlink() => {
                    sys::utimensat(Dir::Cwd, &proc_path(ifd.as_fd()), times, 0)
                }
                r => r,
            }
        };
        match set(&times) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) && self.kernel_times(valid) => {
                self.set_kernel_times(ifd.as_fd(), &times, attr, valid, set)
            }
            r => r,
        }
    }

    /// Whether a SETATTR of times may be the kernel's own bookkeeping in
    /// writeback mode: after writes (and with a truncate) it sends the
    /// modification time it keeps itself as an explicit time, with the
    /// caller's credentials, and an explicit time needs ownership where
    /// "now" needs only write permission. Its shape: an explicit mtime, and
    /// an atime that is absent or "now" (`touch` sends that too).
    fn kernel_times(&self, valid: SetattrValid) -> bool {
        self.opts.writeback
            && valid.contains(SetattrValid::MTIME)
            && !valid.contains(SetattrValid::MTIME_NOW)
            && (!valid.contains(SetattrValid::ATIME) || valid.contains(SetattrValid::ATIME_NOW))
    }

    /// The second try for [`PassthroughFs::kernel_times`] after the caller
    /// was refused. With `default_permissions` the kernel has already
    /// refused what the caller may not do (a user's explicit time by a
    /// non-owner never arrives), so the times are set as the daemon.
    /// Without it a user's explicit mtime cannot be told from the kernel's,
    /// so the times are set as the daemon only for a caller with write
    /// permission (which the kernel's own update follows) and an mtime
    /// within two minutes of now; anything else stays refused.
    fn set_kernel_times(
        &self,
        fd: BorrowedFd<'_>,
        times: &[libc::timespec; 2],
        attr: &SetattrIn,
        valid: SetattrValid,
        set: impl Fn(&[libc::timespec; 2]) -> Res<()>,
    ) -> Res<()> {
        if !self.opts.default_permissions {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            if now.abs_diff(attr.mtime) > 120 {
                return Err(err(libc::EPERM));
            }
            // As the caller, with its effective (fs) credentials. A refused
            // `touch` (atime "now" too) says EACCES, as utimensat(NULL) does;
            // an explicit time stays EPERM.
            let touch = valid.contains(SetattrValid::ATIME_NOW);
            sys::faccessat(&proc_path(fd), libc::W_OK, libc::AT_EACCESS)
                .map_err(|e| if touch { e } else { err(libc::EPERM) })?;
        }
        let _as_daemon = credentials::as_daemon();
        set(times)
    }

    fn do_setattr(&self, ctx: &RequestContext<'_>, ino: Inode, attr: &SetattrIn) -> Res<libc::stat> {
        let inode = self.inode(ino)?;
        let ifd = self.fd(&inode)?;
        let valid = SetattrValid::from_bits_retain(attr.valid);
        let h = if valid.contains(SetattrValid::FH) {
            Some(self.open_file(FileHandle(attr.fh))?)
        } else {
            None
        };
        if valid.contains(SetattrValid::MODE) {
            let mode = attr.mode & 0o7777;
            match &h {
                Some(h) => sys::fchmod(h.fd(), mode)?,
                None if inode.is_symlink() => return Err(err(libc::EOPNOTSUPP)),
                None => sys::chmod(&proc_path(ifd.as_fd()), mode)?,
            }
        }
        // A chown's set-ID rule looks at the group the file had.
        let kill = if !valid.contains(SetattrValid::KILL_SUIDGID) {
            None
        } else if valid.intersects(SetattrValid::UID | SetattrValid::GID) {
            Some(Kill::Chowned {
                old_gid: sys::stat_fd(ifd.as_fd())?.st_gid,
            })
        } else {
            Some(Kill::Written)
        };
        if valid.intersects(SetattrValid::UID | SetattrValid::GID) {
            let uid = if valid.contains(SetattrValid::UID) {
                attr.uid
            } else {
                u32::MAX
            };
            let gid = if valid.contains(SetattrValid::GID) {
                attr.gid
            } else {
                u32::MAX
            };
            sys::fchown_fd(ifd.as_fd(), uid, gid)?;
        }
        if valid.contains(SetattrValid::SIZE) {
            match &h {
                Some(h) => sys::ftruncate(h.fd(), attr.size)?,
                None => sys::truncate(&proc_path(ifd.as_fd()), attr.size)?,
            }
        }
        if valid.intersects(
            SetattrValid::ATIME | SetattrValid::MTIME | SetattrValid::ATIME_NOW | SetattrValid::MTIME_NOW,
        ) {
            self.set_times(&inode, h.as_ref(), attr, valid)?;
        }
        if let Some(why) = kill {
            // The answer carries the new attributes.
            self.kill_suidgid(ctx, &inode, why, None)?;
        }
        sys::stat_fd(ifd.as_fd())
    }

    /// Clears the set-ID bits of a regular file as the VFS does for the
    /// change `why` (the kernel leaves it to us: `HANDLE_KILLPRIV_V2`):
    /// S_ISUID always, and S_ISGID where it means set-group-ID (group
    /// execute is set) or the caller may not keep it (not in the file's
    /// group, as far as that can be known, and without CAP_FSETID). Returns
    /// whether the mode changed.
    ///
    /// The kernel keeps the mode it has cached after a WRITE, a FALLOCATE or
    /// a COPY_FILE_RANGE (a `stat` asking for the mode alone would show the
    /// bits for as long as the attributes are valid), whether we clear the
    /// bits here or the source did as the caller wrote; so for those,
    /// `ino`'s cached attributes are dropped before the answer
    /// (`Some(ino)`).
    fn kill_suidgid(
        &self,
        ctx: &RequestContext<'_>,
        inode: &InodeData,
        why: Kill,
        inval: Option<Inode>,
    ) -> Res<bool> {
        if inode.kind != libc::S_IFREG {
            return Ok(false);
        }
        let changed = self.clear_setid(ctx, inode, why)?;
        match inval.map(|ino| (ino, ctx.notifier().inval_inode(ino, -1, 0).and_then(|t| t.wait()))) {
            // An inode the kernel does not hold yet (a create's): nothing cached.
            Some((_, Err(NotifyError::Kernel(e)))) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Some((ino, Err(e))) => {
                log::warn!("invalidating the attributes of ino {ino} after clearing its set-ID bits: {e}")
            }
            _ => {}
        }
        Ok(changed)
    }

    /// The mode change of [`Self::kill_suidgid`].
    fn clear_setid(&self, ctx: &RequestContext<'_>, inode: &InodeData, why: Kill) -> Res<bool> {
        // Rare (the kernel asks only when the file has the bits), and done
        // as the daemon: the caller may not own the file, and the thread may
        // hold CAP_FSETID for the caller (with default_permissions).
        let _as_daemon = credentials::as_daemon();
        let ifd = self.fd(inode)?;
        let st = sys::stat_fd(ifd.as_fd())?;
        let mode = st.st_mode & 0o7777;
        if mode & (libc::S_ISUID | libc::S_ISGID) == 0 {
            return Ok(false);
        }
        let caller = ctx.caller();
        // May the caller keep S_ISGID, as the VFS's in_group_or_capable?
        let may_keep = |gid: u32| caller.in_group(gid) || caller.holds_capability(credentials::cap::FSETID);
        let kill_sgid = mode & libc::S_IXGRP != 0
            || match why {
                // The kernel said the caller lacks CAP_FSETID.
                Kill::Written => !caller.in_group(st.st_gid),
                // Judged on the group the file had, and on its new one when
                // S_ISUID goes too (the mode is then rewritten).
                Kill::Chowned { old_gid } => {
                    !may_keep(old_gid) || (mode & libc::S_ISUID != 0 && !may_keep(st.st_gid))
                }
            };
        let mut kept = mode & !libc::S_ISUID;
        if kill_sgid {
            kept &= !libc::S_ISGID;
        }
        if kept == mode {
            return Ok(false);
        }
        sys::chmod(&proc_path(ifd.as_fd()), kept)?;
        Ok(true)
    }

    /// What the VFS's `file_modified` does to set-ID bits, for the changes
    /// of content or size the kernel sends without a kill flag (FALLOCATE of
    /// every mode, COPY_FILE_RANGE into the file): a caller without
    /// CAP_FSETID loses them. File capabilities (`security.capability`) are
    /// the kernel's part: it removes them with a REMOVEXATTR first, or the
    /// source does while we act (see `removexattr_as_caller`).
    ///
    /// Runs `change` (as the caller, who must be acting already), then
    /// clears the bits if the file had them before.
    fn file_modified<T>(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        h: &Open,
        change: impl FnOnce() -> Res<T>,
    ) -> Res<T> {
        let had_setid = h.inode.kind == libc::S_IFREG
            && sys::stat_fd(h.fd()).is_ok_and(|st| st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0);
        let r = change()?;
        if had_setid && !ctx.caller().holds_capability(credentials::cap::FSETID) {
            self.kill_suidgid(ctx, &h.inode, Kill::Written, Some(ino))?;
        }
        Ok(r)
    }

    /// The descriptor that holds the POSIX locks of lock owner `owner` on
    /// the inode of `h` (one per owner and inode, so that two descriptors
    /// of one process share its locks, as POSIX wants); made on first use
    /// if `create`, recording `pid` for F_GETLK, and charged to `uid`.
    fn lock_owner_fd(
        &self,
        h: &Open,
        owner: u64,
        (pid, uid): (u32, u32),
        create: bool,
    ) -> Res<Option<Arc<LockOwnerFd>>> {
        let mut owners = h.inode.lock_owners();
        if let Some(o) = owners.get(&owner) {
            return Ok(Some(o.clone()));
        }
        if !create {
            return Ok(None);
        }
        let charge = self.handles.charge(uid)?;
        let fd = if h.inode.kind == libc::S_IFREG {
            // Its own open file description, readable and writable so that
            // it can take either kind of lock (the kernel has checked the
            // caller's descriptor for the kind it asks), as the daemon.
            let _as_daemon = credentials::as_daemon();
            let ifd = self.fd(&h.inode)?;
            let path = proc_path(ifd.as_fd());
            sys::openat(Dir::Cwd, &path, libc::O_RDWR, 0)
                .or_else(|_| sys::openat(Dir::Cwd, &path, libc::O_RDONLY, 0))?
        } else {
            // Reopening a device or FIFO could have side effects: lock
            // through the handle's own open file description.
            h.fd().try_clone_to_owned()?
        };
        let o = Arc::new(LockOwnerFd {
            fd,
            pid,
            _charge: charge,
        });
        owners.insert(owner, o.clone());
        Ok(Some(o))
    }

    /// Closes the lock descriptor of `owner` on `inode`, dropping its POSIX
    /// locks there: a process's close of any descriptor of a file does.
    fn drop_lock_owner(&self, inode: &InodeData, owner: u64) {
        if self.opts.posix_lock {
            let gone = inode.lock_owners().remove(&owner);
            // Unlocked explicitly: closing the descriptor releases the
            // locks only with the last reference to its open file, which a
            // system call of another thread may hold for a moment.
            if let Some(o) = &gone {
                let mut all = libc::flock {
                    l_type: libc::F_UNLCK as libc::c_short,
                    l_whence: libc::SEEK_SET as libc::c_short,
                    l_start: 0,
                    l_len: 0,
                    l_pid: 0,
                };
                if let Err(e) = sys::fcntl_lock(o.fd.as_fd(), libc::F_OFD_SETLK, &mut all) {
                    log::warn!("unlocking the locks of lock owner {owner:#x}: {e}");
                }
            }
            drop(gone);
        }
    }

    /// The pid of the owner holding `found`, the lock F_OFD_GETLK reported
    /// against `asked` for owner `me`: the owner whose own view of the same
    /// question no longer shows that lock (an owner's locks are invisible
    /// to itself). 0 when it is no owner of this mount.
    fn lock_holder(&self, inode: &InodeData, me: u64, asked: &Lock, found: &libc::flock) -> u32 {
        let others: Vec<Arc<LockOwnerFd>> = inode
            .lock_owners()
            .iter()
            .filter(|(id, _)| **id != me)
            .map(|(_, o)| o.clone())
            .collect();
        let same =
            |a: &libc::flock| (a.l_type, a.l_start, a.l_len) == (found.l_type, found.l_start, found.l_len);
        for o in others {
            let Ok(mut fl) = to_flock(asked) else {
                return 0;
            };
            if sys::fcntl_lock(o.fd.as_fd(), libc::F_OFD_GETLK, &mut fl).is_ok() && !same(&fl) {
                return o.pid;
            }
        }
        0
    }

    /// The inode for xattr calls (`ENOSYS` without `-o xattr`). Their path
    /// is `/proc/self/fd/N` of its descriptor, which reaches the inode
    /// itself. Also for a symbolic link: following the magic link of its
    /// `O_PATH` descriptor ends on the link, never on what it points to (the
    /// `f*xattr` calls and the `*xattrat` calls with `AT_EMPTY_PATH` refuse
    /// `O_PATH` descriptors, and the link's name in its parent could change
    /// meanwhile).
    fn xattr_inode(&self, ino: Inode) -> Res<Arc<InodeData>> {
        if !self.opts.xattr {
            return Err(err(libc::ENOSYS));
        }
        self.inode(ino)
    }

    fn readdir_common(
        &self,
        ino: Inode,
        fh: FileHandle,
        offset: u64,
        mut add: impl FnMut(&Arc<InodeData>, u64, i64, u8, &CStr) -> Res<bool>,
    ) -> Res<()> {
        let h = self.open_file(fh)?;
        let _ = ino;
        let mut guard = h.dir();
        let stream = guard.get_or_insert_with(DirStream::new);
        let offset = i64::try_from(offset).map_err(|_| err(libc::EINVAL))?;
        stream.seek(h.fd(), offset)?;
        let mut added = 0usize;
        loop {
            let rec = match stream.peek(h.fd()) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) if added == 0 => return Err(e),
                Err(_) => break,
            };
            let (len, next) = (rec.len(), rec.next);
            match add(&h.inode, rec.ino, rec.next, rec.typ, rec.name) {
                Ok(true) => break, // full
                Ok(false) => {}
                Err(e) if added == 0 => return Err(e),
                Err(_) => break,
            }
            added += 1;
            stream.advance(len, next);
        }
        Ok(())
    }
}

fn statx_time(t: libc::statx_timestamp) -> SxTime {
    SxTime {
        tv_sec: t.tv_sec,
        tv_nsec: t.tv_nsec,
        reserved: 0,
    }
}

fn to_fuse_statx(s: &libc::statx) -> Statx {
    Statx {
        mask: s.stx_mask,
        blksize: s.stx_blksize,
        attributes: s.stx_attributes,
        nlink: s.stx_nlink,
        uid: s.stx_uid,
        gid: s.stx_gid,
        mode: s.stx_mode,
        spare0: [0],
        ino: s.stx_ino,
        size: s.stx_size,
        blocks: s.stx_blocks,
        attributes_mask: s.stx_attributes_mask,
        atime: statx_time(s.stx_atime),
        btime: statx_time(s.stx_btime),
        ctime: statx_time(s.stx_ctime),
        mtime: statx_time(s.stx_mtime),
        rdev_major: s.stx_rdev_major,
        rdev_minor: s.stx_rdev_minor,
        dev_major: s.stx_dev_major,
        dev_minor: s.stx_dev_minor,
        spare2: [0; 14],
    }
}

/// `struct flock` for the byte range of a FUSE lock (`end` inclusive,
/// `OFFSET_MAX` meaning to the end of the file).
fn to_flock(lock: &Lock) -> Res<libc::flock> {
    let start = i64::try_from(lock.start).map_err(|_| err(libc::EINVAL))?;
    let len = if lock.end >= i64::MAX as u64 {
        0
    } else if lock.end < lock.start {
        return Err(err(libc::EINVAL));
    } else {
        (lock.end - lock.start + 1) as i64
    };
    Ok(libc::flock {
        l_type: lock.typ as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        l_pid: 0,
    })
}

fn from_flock(fl: &libc::flock, pid: u32) -> Lock {
    let start = fl.l_start.max(0) as u64;
    let end = if fl.l_len == 0 {
        i64::MAX as u64
    } else {
        start + fl.l_len as u64 - 1
    };
    Lock {
        start,
        end,
        typ: fl.l_type as i32,
        pid,
    }
}

/// Waits for a lock (`wait`, a blocking `fcntl` or `flock`) on a helper
/// thread of the session, so that the wait holds no worker: one user's
/// waiters cannot stop the mount for everyone else. An INTERRUPT makes the
/// call return `EINTR` (the session signals the helper thread), which is
/// the answer then. Beyond the session's limits on waits (per caller uid,
/// per session, per io_uring queue) the request is answered `ENOLCK`, the
/// errno for "no lock record available".
fn wait_for_lock(
    ctx: &RequestContext<'_>,
    reply: ReplyEmpty,
    wait: impl FnOnce() -> Res<()> + Send + 'static,
) {
    if ctx.is_interrupted() {
        return reply.error(Errno::EINTR);
    }
    let deferred = ctx.defer(reply, move |reply, w| {
        if w.is_interrupted() {
            return reply.error(Errno::EINTR);
        }
        match wait() {
            Ok(()) => reply.ok(),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => reply.error(Errno::EINTR),
            Err(e) => reply.io_error(&e),
        }
    });
    if let Err(refused) = deferred {
        log::debug!("lock wait of uid {} refused: {:?}", ctx.uid(), refused.reason);
        refused.into_reply().error(Errno::ENOLCK);
    }
}

/// Logs a failed request's error at debug level, where its reply goes out.
fn logged<T>(r: Res<T>) -> Res<T> {
    if let Err(e) = &r {
        log::debug!("error: {e}");
    }
    r
}

/// A getxattr or listxattr answer: the size needed, or the bytes.
enum XattrOut {
    Size(u32),
    Data(Vec<u8>),
}

/// A removal under a keeper, between [`PassthroughFs::before_removal`] and
/// [`PassthroughFs::after_removal`]: how many files were open and opened
/// before it, and the source key of what it removes (if files were open).
struct Removal {
    before: Opens,
    victim: Option<(u64, u64)>,
}

/// A CREATE-style request's file, opened as the caller, for
/// `finish_create` to register while the caller's guard still holds.
struct NewFile {
    _as_caller: ActingAs,
    parent: Arc<InodeData>,
    fd: OwnedFd,
    created: bool,
}

/// What a SETLK does once the handle is found.
enum SetLk {
    /// Done (or nothing to do): the result.
    Done(Res<()>),
    /// A type flock cannot take.
    Invalid,
    /// A blocking flock with this operation.
    WaitFlock(Open, i32),
    /// A blocking POSIX lock through this owner's descriptor.
    WaitPosix(Arc<LockOwnerFd>, libc::flock),
}

/// The requests' work, done as the caller: each returns what its reply
/// carries, and the `Filesystem` methods below answer with it.
impl PassthroughFs {
    /// The entry for `name` in `parent` just made: one counted lookup.
    fn new_entry(&self, parent: &Arc<InodeData>, name: &CStr) -> Res<Entry> {
        let (found, st) = self.do_lookup(parent, name)?;
        Ok(self.entry(parent, &found, &st))
    }

    fn lookup_entry(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr) -> Res<Entry> {
        let _as_caller = logged(as_caller(ctx))?;
        log::debug!("lookup parent={parent} name={name:?}");
        if name.to_bytes() == b"." {
            // The node itself (`FUSE_EXPORT_SUPPORT`: the kernel opens a
            // file handle of a node it dropped), forgotten or not.
            let (found, st) = logged(self.inodes.lookup_node(parent.0))?;
            return Ok(self.entry(&found.data, &found, &st));
        }
        // ".." (`FUSE_EXPORT_SUPPORT`, reconnecting a directory to its
        // parent) is the source's "..", the root's being the root.
        let parent = logged(self.inode(parent))?;
        // A miss is routine: not logged.
        let (found, st) = self.do_lookup(&parent, name)?;
        Ok(self.entry(&parent, &found, &st))
    }

    fn getattr_as_caller(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: Option<FileHandle>,
    ) -> Res<(Duration, FileAttr)> {
        let _as_caller = as_caller(ctx)?;
        log::debug!("getattr ino={ino} fh={fh:?}");
        // The open file's descriptor if it has one now (nothing to open
        // again for a stat), else the node's.
        let st = match fh.and_then(|fh| self.handles.get(fh.0)).and_then(|h| h.current()) {
            Some(fd) => sys::stat_fd(fd.as_fd())?,
            None => {
                let inode = self.inode(ino)?;
                let inode_fd = self.fd(&inode)?;
                sys::stat_fd(inode_fd.as_fd())?
            }
        };
        Ok((
            self.attr_ttl(self.opts.timeout, st.st_mode),
            FileAttr::from_stat(&st),
        ))
    }

    fn setattr_as_caller(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        attr: &SetattrIn,
    ) -> Res<(Duration, FileAttr)> {
        let _as_caller = as_caller(ctx)?;
        log::debug!("setattr ino={ino} valid={:#x}", attr.valid);
        let st = self.do_setattr(ctx, ino, attr)?;
        // A chown changes who the owner and group classes are.
        if SetattrValid::from_bits_retain(attr.valid)
            .intersects(SetattrValid::MODE | SetattrValid::UID | SetattrValid::GID)
            && let Ok(inode) = self.inode(ino)
        {
            self.search_changed(ctx, ino, &inode);
        }
        Ok((
            self.attr_ttl(self.opts.timeout, st.st_mode),
            FileAttr::from_stat(&st),
        ))
    }

    fn readlink_as_caller(&self, ctx: &RequestContext<'_>, ino: Inode) -> Res<Vec<u8>> {
        let _as_caller = as_caller(ctx)?;
        let inode = self.inode(ino)?;
        let inode_fd = self.fd(&inode)?;
        sys::readlink_fd(inode_fd.as_fd())
    }

    fn symlink_as_caller(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        target: &CStr,
    ) -> Res<Entry> {
        let _as_caller = as_caller(ctx)?;
        log::debug!("symlink parent={parent} name={name:?} target={target:?}");
        let parent = self.inode(parent)?;
        check_name(name)?;
        let parent_fd = self.fd(&parent)?;
        let r = sys::symlinkat(target, parent_fd.as_fd(), name);
        done_before(ctx, r, parent_fd.as_fd(), name, |st| is_kind(st, libc::S_IFLNK))?;
        self.new_entry(&parent, name)
    }

    fn mknod_as_caller(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: MknodRequest,
    ) -> Res<Entry> {
        let MknodRequest { mode, rdev } = req;
        let _as_caller = as_caller(ctx)?;
        log::debug!("mknod parent={parent} name={name:?} mode={mode:o}");
        let parent = self.inode(parent)?;
        check_name(name)?;
        let mode = self.caller_umask(ctx, mode);
        let parent_fd = self.fd(&parent)?;
        let r = sys::mknodat(parent_fd.as_fd(), name, mode, rdev as u64);
        done_before(ctx, r, parent_fd.as_fd(), name, |st| {
            is_kind(st, mode & libc::S_IFMT)
        })?;
        self.new_entry(&parent, name)
    }

    fn mkdir_as_caller(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, mode: u32) -> Res<Entry> {
        let _as_caller = as_caller(ctx)?;
        log::debug!("mkdir parent={parent} name={name:?} mode={mode:o}");
        let parent = self.inode(parent)?;
        check_name(name)?;
        let mode = self.caller_umask(ctx, mode);
        let parent_fd = self.fd(&parent)?;
        let r = sys::mkdirat(parent_fd.as_fd(), name, mode);
        done_before(ctx, r, parent_fd.as_fd(), name, |st| is_kind(st, libc::S_IFDIR))?;
        self.new_entry(&parent, name)
    }

    /// UNLINK (`flags` 0) or RMDIR (`AT_REMOVEDIR`).
    fn unlink_as_caller(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, flags: i32) -> Res<()> {
        let _as_caller = as_caller(ctx)?;
        if flags & libc::AT_REMOVEDIR != 0 {
            log::debug!("rmdir parent={parent} name={name:?}");
        } else {
            log::debug!("unlink parent={parent} name={name:?}");
        }
        let parent = self.inode(parent)?;
        check_name(name)?;
        let parent_fd = self.fd(&parent)?;
        let removal = self.before_removal(parent_fd.as_fd(), name)?;
        gone_before(ctx, sys::unlinkat(parent_fd.as_fd(), name, flags), name)?;
        self.after_removal(removal);
        Ok(())
    }

    /// Under a keeper, before `name` in `dir` goes (UNLINK, RMDIR, a
    /// RENAME over it): if files of its inode are open, the inode's
    /// descriptor is deposited with the vault, for it may be the last name
    /// (see `InodeTable::keep_removed`). Fails, and the name stays, if the
    /// keeper cannot take it. With no file open at all it costs nothing; the
    /// result is for [`Self::after_removal`].
    ///
    /// Without a keeper too: the inode's descriptor is kept while files of
    /// it are open (see `InodeData::pin_removed`), for an open file that
    /// closed its own descriptor while idle is opened again through it.
    fn before_removal(&self, dir: BorrowedFd<'_>, name: &CStr) -> Res<Option<Removal>> {
        // Under a keeper one word says whether any file is open at all;
        // without one nothing counts them, so the name is looked at always.
        // Either way once: both uses below take the same answer.
        let before = self.kept.then(|| self.handles.opens());
        let st = if before.is_none_or(|b| b.any()) {
            sys::fstatat(Dir::Fd(dir), name, libc::AT_SYMLINK_NOFOLLOW).ok()
        } else {
            None
        };
        if let Some(st) = &st
            && st.st_mode & libc::S_IFMT == libc::S_IFREG
            && let Some(data) = self.inodes.live_of((st.st_dev, st.st_ino))
            && data.has_open_files()
        {
            // Not reachable now: nothing to keep (the removal goes on).
            if let Ok(fd) = self.fd(&data) {
                data.pin_removed(fd.as_fd());
            }
        }
        let Some(before) = before else {
            return Ok(None);
        };
        let victim = st.map(|st| (st.st_dev, st.st_ino));
        if let Some(key) = victim
            && let Some((id, data)) = self.inodes.open_node_of(key)
        {
            self.keep_node(id, &data)?;
        }
        Ok(Some(Removal { before, victim }))
    }

    /// After a removal that [`Self::before_removal`] prepared: a file opened
    /// meanwhile (the kernel runs an OPEN of the inode beside the removal)
    /// is kept too, the removed inode's if it is known, else every open
    /// file's whose inode has no name left. Between the removal and this, a
    /// crash would lose such a file: a window of a few system calls.
    fn after_removal(&self, removal: Option<Removal>) {
        let Some(Removal { before, victim }) = removal else {
            return;
        };
        if !before.opened_since(self.handles.opens()) {
            return;
        }
        match victim {
            Some(key) => {
                if let Some((id, data)) = self.inodes.open_node_of(key) {
                    let _ = self.keep_node(id, &data);
                }
            }
            None => self.keep_removed_open_files(),
        }
    }

    /// Deposits node `id`'s descriptor with the vault (see `before_removal`).
    fn keep_node(&self, id: u64, data: &InodeData) -> Res<()> {
        let fd = self.inodes.fd(data)?;
        self.inodes.keep_removed(id, data, fd.as_fd()).map_err(|e| {
            log::error!("node {id}: keeping its descriptor with the keeper before a removal: {e}");
            err(libc::EIO)
        })
    }

    /// Under a keeper: deposits the descriptor of every open file's inode
    /// that has no name left, so that a successor still reaches it. For a
    /// daemon retiring (a name may have been removed in the source directory
    /// itself) and after a removal that an open ran beside.
    pub fn keep_removed_open_files(&self) {
        for h in self.handles.all() {
            if h.node == 0 || HandleTable::is_deposited(&h) {
                continue;
            }
            // One without its descriptor now was opened again by name.
            let Some(fd) = h.current() else { continue };
            if sys::stat_fd(fd.as_fd()).is_ok_and(|st| st.st_nlink == 0) {
                let _ = self.keep_node(h.node, &h.inode);
            }
        }
    }

    fn rename_as_caller(&self, ctx: &RequestContext<'_>, req: &RenameRequest<'_>) -> Res<()> {
        let RenameRequest {
            parent,
            name,
            newparent,
            newname,
            flags,
        } = *req;
        let flags = flags.bits();
        let _as_caller = as_caller(ctx)?;
        log::debug!("rename {parent}/{name:?} -> {newparent}/{newname:?} flags={flags:#x}");
        let old = self.inode(parent)?;
        let new = self.inode(newparent)?;
        check_name(name)?;
        check_name(newname)?;
        let old_fd = self.fd(&old)?;
        let new_fd = self.fd(&new)?;
        // Under a keeper the inode moved is noted first: if this daemon dies
        // before answering, the successor finds whether the move happened
        // (the source gone or exchanged, and the target that inode).
        let note = ctx.journal_note();
        let moved = |st: libc::stat| note == Some(st.st_ino);
        if ctx.replay() == Replay::MaybeDone
            && note.is_some()
            && sys::fstatat(Dir::Fd(new_fd.as_fd()), newname, libc::AT_SYMLINK_NOFOLLOW).is_ok_and(moved)
            && (flags & libc::RENAME_EXCHANGE != 0
                || sys::fstatat(Dir::Fd(old_fd.as_fd()), name, libc::AT_SYMLINK_NOFOLLOW)
                    .is_err_and(|e| e.raw_os_error() == Some(libc::ENOENT)))
        {
            log::info!("rename of {name:?}: done by the predecessor before it died; answered as done");
        } else {
            if self.kept {
                let st = sys::fstatat(Dir::Fd(old_fd.as_fd()), name, libc::AT_SYMLINK_NOFOLLOW)?;
                ctx.set_journal_note(st.st_ino);
            }
            let removal = if flags & (libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) == 0 {
                self.before_removal(new_fd.as_fd(), newname)?
            } else {
                None
            };
            sys::renameat2(old_fd.as_fd(), name, new_fd.as_fd(), newname, flags)?;
            self.after_removal(removal);
        }
        self.moved_into(ctx, newparent, &new, newname);
        if flags & libc::RENAME_EXCHANGE != 0 {
            self.moved_into(ctx, parent, &old, name);
        }
        Ok(())
    }

    fn link_as_caller(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        newparent: Inode,
        newname: &CStr,
    ) -> Res<Entry> {
        let _as_caller = as_caller(ctx)?;
        log::debug!("link ino={ino} -> {newparent}/{newname:?}");
        let inode = self.inode(ino)?;
        let parent = self.inode(newparent)?;
        check_name(newname)?;
        let inode_fd = self.fd(&inode)?;
        let parent_fd = self.fd(&parent)?;
        let key = inode.key;
        let same = |st: &libc::stat| (st.st_dev, st.st_ino) == key;
        let r = sys::linkat(
            Dir::Fd(inode_fd.as_fd()),
            EMPTY,
            parent_fd.as_fd(),
            newname,
            libc::AT_EMPTY_PATH,
        );
        match r {
            // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; /proc/self/fd does not.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EPERM)) && !inode.is_symlink() => {
                let r = sys::linkat(
                    Dir::Cwd,
                    &proc_path(inode_fd.as_fd()),
                    parent_fd.as_fd(),
                    newname,
                    libc::AT_SYMLINK_FOLLOW,
                );
                done_before(ctx, r, parent_fd.as_fd(), newname, same)?
            }
            r => done_before(ctx, r, parent_fd.as_fd(), newname, same)?,
        }
        drop((inode_fd, parent_fd));
        self.new_entry(&parent, newname)
    }

    fn open_as_caller(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        flags: i32,
    ) -> Res<(FileHandle, FopenFlags, Option<BackingFile>)> {
        let _as_caller = as_caller(ctx)?;
        log::debug!("open ino={ino} flags={flags:#o}");
        let inode = self.inode(ino)?;
        let inode_fd = self.fd(&inode)?;
        let path = proc_path(inode_fd.as_fd());
        let fd = match self.open_source(&path, self.source_flags(flags)) {
            Err(e) if e.raw_os_error() == Some(libc::EACCES) && self.is_exec_open(flags) => {
                self.open_for_exec(&path, flags)?
            }
            r => r?,
        };
        drop(inode_fd);
        if flags & libc::O_TRUNC != 0 && ctx.open_in_flags().contains(OpenInFlags::KILL_SUIDGID) {
            // The session drops the kernel's cached mode before answering.
            self.kill_suidgid(ctx, &inode, Kill::Written, None)?;
        }
        self.new_handle(ctx, ino.0, inode, fd, flags, true)
    }

    /// Acts as the caller (for as long as the guard lives), runs `log`
    /// and finds `fh`.
    fn caller_handle(
        &self,
        ctx: &RequestContext<'_>,
        fh: FileHandle,
        log: impl FnOnce(),
    ) -> Res<(ActingAs, Open)> {
        let as_caller = as_caller(ctx)?;
        log();
        Ok((as_caller, self.open_file(fh)?))
    }

    fn write_as_caller(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: WriteRequest<'_>,
    ) -> Res<u32> {
        let WriteRequest {
            offset,
            data,
            write_flags,
            ..
        } = req;
        let _as_caller = as_caller(ctx)?;
        log::debug!("write ino={ino} fh={fh} off={offset} size={}", data.len());
        let h = self.open_file(fh)?;
        // An appending write under a keeper: the end of the file is taken
        // and noted under the inode's lock, and written at positionally, so
        // that a successor given it again (the predecessor died before
        // answering) writes the same bytes at the same place, not twice.
        let _append = h
            .append
            .then(|| h.inode.appends.lock().unwrap_or_else(|e| e.into_inner()));
        let offset = match (h.append, ctx.replay(), ctx.journal_note()) {
            (false, ..) => offset,
            (true, Replay::MaybeDone, Some(at)) => at,
            (true, ..) => {
                let at = sys::stat_fd(h.fd())?.st_size as u64;
                ctx.set_journal_note(at);
                at
            }
        };
        let n = if data.is_in_pipe() && h.direct.is_none() {
            // With splice_write: from the session's pipe into the source
            // file, not through our memory (an O_APPEND source gets a
            // pwrite, which appends, as below).
            data.splice_to(h.fd(), offset)?
        } else {
            // In memory already, or fetched from the pipe into the
            // page-aligned receive buffer (O_DIRECT handles).
            h.write_at(data.fetch()?, offset)?
        };
        if write_flags.contains(WriteFlags::KILL_SUIDGID) {
            // The session drops the kernel's cached mode before answering.
            self.kill_suidgid(ctx, &h.inode, Kill::Written, None)?;
        }
        Ok(n as u32)
    }

    fn flush_handle(&self, ino: Inode, fh: FileHandle, owner: LockOwner) -> Res<()> {
        // Not as the caller: closing descriptors checks no credentials, and
        // finding out the caller's would cost a system call per close.
        log::debug!("flush ino={ino} fh={fh}");
        let h = self.handle(fh)?;
        // The caller closed a descriptor of this file: that drops its
        // process's POSIX locks on the file, whichever descriptor took them.
        self.drop_lock_owner(&h.inode, owner.0);
        // Closing a duplicate reports delayed write errors (NFS and the
        // like). A descriptor closed while idle reported them to nobody.
        if let Some(fd) = h.current() {
            drop(fd.try_clone()?);
        }
        Ok(())
    }

    /// FSYNC and FSYNCDIR.
    fn fsync_as_caller(&self, ctx: &RequestContext<'_>, fh: FileHandle, datasync: bool) -> Res<()> {
        let _as_caller = as_caller(ctx)?;
        let h = self.open_file(fh)?;
        sys::fsync(h.fd(), datasync)
    }

    fn opendir_as_caller(&self, ctx: &RequestContext<'_>, ino: Inode) -> Res<(FileHandle, FopenFlags)> {
        let _as_caller = as_caller(ctx)?;
        log::debug!("opendir ino={ino}");
        let inode = self.inode(ino)?;
        let inode_fd = self.fd(&inode)?;
        // Through /proc, which (like a native open) needs read but not
        // search permission on the directory itself, unlike "." would.
        let fd = sys::openat(
            Dir::Cwd,
            &proc_path(inode_fd.as_fd()),
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )?;
        drop(inode_fd);
        let fh = self.handles.insert(
            Handle::new(fd, inode, false, ctx.uid()),
            ino.0,
            libc::O_RDONLY | libc::O_DIRECTORY,
        )?;
        let flags = if self.opts.cache == Cache::Always {
            FopenFlags::CACHE_DIR | FopenFlags::KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        Ok((FileHandle(fh), flags))
    }

    fn statfs_as_caller(&self, ctx: &RequestContext<'_>, ino: Inode) -> Res<Kstatfs> {
        let _as_caller = as_caller(ctx)?;
        let inode = self.inode(ino)?;
        let inode_fd = self.fd(&inode)?;
        let s = sys::fstatvfs(inode_fd.as_fd())?;
        Ok(Kstatfs {
            blocks: s.f_blocks,
            bfree: s.f_bfree,
            bavail: s.f_bavail,
            files: s.f_files,
            ffree: s.f_ffree,
            bsize: s.f_bsize as u32,
            namelen: s.f_namemax as u32,
            frsize: s.f_frsize as u32,
            ..Default::default()
        })
    }

    fn setxattr_as_caller(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        name: &CStr,
        req: SetxattrRequest<'_>,
    ) -> Res<()> {
        let SetxattrRequest {
            value,
            flags,
            setxattr_flags,
        } = req;
        let _as_caller = as_caller(ctx)?;
        log::debug!("setxattr ino={ino} name={name:?}");
        let xi = self.xattr_inode(ino)?;
        let xfd = self.fd(&xi)?;
        let path = proc_path(xfd.as_fd());
        match sys::setxattr(&path, name, value, flags) {
            // Sent again after a crash: an attribute that exists with this
            // value was made by the predecessor (the kernel holds the
            // inode's lock from before the first attempt to the answer).
            Err(e)
                if e.raw_os_error() == Some(libc::EEXIST)
                    && ctx.replay() == Replay::MaybeDone
                    && holds_xattr(&path, name, value) =>
            {
                log::info!("xattr {name:?}: set by the predecessor before it died; answered as done");
            }
            r => r?,
        }
        if setxattr_flags.contains(SetxattrFlags::ACL_KILL_SGID)
            && name.to_bytes() == b"system.posix_acl_access"
        {
            // The caller may not keep S_ISGID (the kernel decided); we set the
            // ACL with privileges that would have kept it, so clear it here.
            let inode = self.inode(ino)?;
            let inode_fd = self.fd(&inode)?;
            let st = sys::stat_fd(inode_fd.as_fd())?;
            if st.st_mode & libc::S_ISGID != 0 {
                sys::chmod(&path, st.st_mode & 0o7777 & !libc::S_ISGID)?;
            }
        }
        if name.to_bytes().starts_with(b"system.posix_acl")
            && let Ok(inode) = self.inode(ino)
        {
            self.acl_changed(ctx, ino, &inode);
        }
        Ok(())
    }

    /// GETXATTR (`name` given) or LISTXATTR.
    fn xattr_as_caller(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        name: Option<&CStr>,
        size: u32,
    ) -> Res<XattrOut> {
        let _as_caller = as_caller(ctx)?;
        match name {
            Some(name) => log::debug!("getxattr ino={ino} name={name:?} size={size}"),
            None => log::debug!("listxattr ino={ino} size={size}"),
        }
        let xi = self.xattr_inode(ino)?;
        let xfd = self.fd(&xi)?;
        let path = proc_path(xfd.as_fd());
        let get = |buf: &mut [u8]| match name {
            Some(name) => sys::getxattr(&path, name, buf),
            None => sys::listxattr(&path, buf),
        };
        if size == 0 {
            return Ok(XattrOut::Size(get(&mut [])? as u32));
        }
        let mut buf = vec![0u8; size as usize];
        let n = get(&mut buf)?;
        buf.truncate(n);
        Ok(XattrOut::Data(buf))
    }

    fn removexattr_as_caller(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr) -> Res<()> {
        let _as_caller = as_caller(ctx)?;
        log::debug!("removexattr ino={ino} name={name:?}");
        let xi = self.xattr_inode(ino)?;
        let xfd = self.fd(&xi)?;
        let path = proc_path(xfd.as_fd());
        match sys::removexattr(&path, name) {
            // File capabilities: the kernel asked for CAP_SETFCAP before a
            // caller's removexattr(2) reached us, and removes them itself,
            // unasked, when an unprivileged caller writes, truncates,
            // fallocates or chowns the file (killpriv), which the source
            // would refuse such a caller. Either way it is decided.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) && name.to_bytes() == b"security.capability" => {
                let _as_daemon = credentials::as_daemon();
                sys::removexattr(&path, name)?;
            }
            // Sent again after a crash: gone already, by the predecessor
            // (the kernel holds the inode's lock).
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) && ctx.replay() == Replay::MaybeDone => {
                log::info!("xattr {name:?}: removed by the predecessor before it died; answered as done");
            }
            r => r?,
        }
        if name.to_bytes().starts_with(b"system.posix_acl")
            && let Ok(inode) = self.inode(ino)
        {
            self.acl_changed(ctx, ino, &inode);
        }
        Ok(())
    }

    fn access_as_caller(&self, ctx: &RequestContext<'_>, ino: Inode, mask: i32) -> Res<()> {
        let _as_caller = as_caller(ctx)?;
        log::debug!("access ino={ino} mask={mask:#o}");
        let inode = self.inode(ino)?;
        let inode_fd = self.fd(&inode)?;
        let path = proc_path(inode_fd.as_fd());
        sys::faccessat(&path, mask, libc::AT_EACCESS)
    }

    /// The start of an ATOMIC_OPEN: the open (or created) file, and the
    /// guard to keep acting as the caller while `finish_create` registers
    /// it; `None` for "." or "..".
    fn open_in(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        flags: i32,
        mode: u32,
    ) -> Res<Option<NewFile>> {
        let as_caller = as_caller(ctx)?;
        log::debug!("create/atomic_open parent={parent} name={name:?} flags={flags:#o} mode={mode:o}");
        let parent = self.inode(parent)?;
        check_name(name)?;
        if is_dot_or_dotdot(name.to_bytes()) {
            return Ok(None);
        }
        let mode = self.caller_umask(ctx, mode);
        // Sent again after a crash: the predecessor may have created (and
        // truncated) the file; opening what is there is the answer it gave.
        let flags = match ctx.replay() {
            Replay::MaybeDone => flags & !(libc::O_EXCL | libc::O_TRUNC),
            Replay::Fresh => flags,
        };
        let (fd, created) = self.open_at(&parent, name, flags, mode)?;
        Ok(Some(NewFile {
            _as_caller: as_caller,
            parent,
            fd,
            created,
        }))
    }

    /// The start of a TMPFILE, as `open_in`.
    fn open_tmpfile(&self, ctx: &RequestContext<'_>, parent: Inode, flags: i32, mode: u32) -> Res<NewFile> {
        let as_caller = as_caller(ctx)?;
        log::debug!("tmpfile parent={parent} flags={flags:#o} mode={mode:o}");
        let parent = self.inode(parent)?;
        let oflags = self.source_flags(flags) | libc::O_TMPFILE;
        let mode = self.caller_umask(ctx, mode);
        let parent_fd = self.fd(&parent)?;
        let fd = sys::openat(Dir::Fd(parent_fd.as_fd()), c".", oflags, mode)?;
        drop(parent_fd);
        Ok(NewFile {
            _as_caller: as_caller,
            parent,
            fd,
            created: true,
        })
    }

    fn getlk_as_caller(&self, ctx: &RequestContext<'_>, fh: FileHandle, req: LockRequest) -> Res<Lock> {
        let LockRequest { owner, lock, .. } = req;
        let _as_caller = as_caller(ctx)?;
        let h = self.open_file(fh)?;
        let mut fl = to_flock(&lock)?;
        // The owner's own locks never conflict with it: ask through its
        // descriptor, or through the handle's, which holds none.
        let mine = h.inode.lock_owners().get(&owner.0).cloned();
        let probe = mine.as_ref().map_or(h.fd(), |o| o.fd.as_fd());
        sys::fcntl_lock(probe, libc::F_OFD_GETLK, &mut fl)?;
        let pid = if fl.l_type == libc::F_UNLCK as libc::c_short {
            0
        } else {
            self.lock_holder(&h.inode, owner.0, &lock, &fl)
        };
        Ok(from_flock(&fl, pid))
    }

    /// A SETLK or SETLKW on handle `h`, up to the wait if it must block.
    fn setlk_step(&self, ctx: &RequestContext<'_>, fh: FileHandle, h: Open, req: LockRequest) -> Res<SetLk> {
        let LockRequest {
            owner,
            lock,
            sleep,
            flock,
        } = req;
        if flock {
            let mut op = match lock.typ {
                libc::F_RDLCK => libc::LOCK_SH,
                libc::F_WRLCK => libc::LOCK_EX,
                libc::F_UNLCK => libc::LOCK_UN,
                _ => return Ok(SetLk::Invalid),
            };
            if !sleep {
                op |= libc::LOCK_NB;
            }
            // The lock belongs to the open file description: it keeps its
            // descriptor from now on (charged to its user), and under a
            // keeper a successor must get this very one, not a new open.
            let h = if op & libc::LOCK_UN == 0 {
                self.handles.pin(fh.0, h)?
            } else {
                h
            };
            if sleep && op != libc::LOCK_UN {
                return Ok(SetLk::WaitFlock(h, op));
            }
            Ok(SetLk::Done(sys::flock(h.fd(), op)))
        } else {
            let fl = to_flock(&lock)?;
            let unlock = lock.typ == libc::F_UNLCK;
            let pid = if lock.pid != 0 { lock.pid } else { ctx.pid() };
            let o = match self.lock_owner_fd(&h, owner.0, (pid, ctx.uid()), !unlock)? {
                Some(o) => o,
                // Nothing locked by this owner: nothing to unlock.
                None => return Ok(SetLk::Done(Ok(()))),
            };
            if sleep && !unlock {
                return Ok(SetLk::WaitPosix(o, fl));
            }
            let mut fl = fl;
            Ok(SetLk::Done(sys::fcntl_lock(
                o.fd.as_fd(),
                libc::F_OFD_SETLK,
                &mut fl,
            )))
        }
    }

    fn fallocate_as_caller(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: FallocateRequest,
    ) -> Res<()> {
        let FallocateRequest { offset, length, mode } = req;
        let _as_caller = as_caller(ctx)?;
        let h = self.open_file(fh)?;
        self.file_modified(ctx, ino, &h, || sys::fallocate(h.fd(), mode, offset, length))
    }

    fn lseek_as_caller(&self, ctx: &RequestContext<'_>, fh: FileHandle, req: LseekRequest) -> Res<u64> {
        let LseekRequest { offset, whence } = req;
        let _as_caller = as_caller(ctx)?;
        let h = self.open_file(fh)?;
        // The kernel passes the caller's off_t through as u64: reinterpret it
        // (a negative offset arrives as a huge value) and let the source
        // filesystem judge it, so the errno is the one it gives natively.
        sys::lseek(h.fd(), offset as i64, whence)
    }

    fn copy_as_caller(&self, ctx: &RequestContext<'_>, req: &CopyFileRangeRequest) -> Res<u64> {
        let CopyFileRangeRequest {
            fh_in,
            off_in,
            fh_out,
            off_out,
            len,
            flags,
            ..
        } = *req;
        let _as_caller = as_caller(ctx)?;
        let hi = self.open_file(fh_in)?;
        let ho = self.open_file(fh_out)?;
        let flags = u32::try_from(flags).map_err(|_| err(libc::EINVAL))?;
        let n = self.file_modified(ctx, req.ino_out, &ho, || {
            sys::copy_file_range(hi.fd(), off_in, ho.fd(), off_out, len, flags)
        })?;
        Ok(n as u64)
    }

    fn statx_as_caller(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: Option<FileHandle>,
        req: StatxRequest,
    ) -> Res<Statx> {
        let StatxRequest { flags, mask } = req;
        let _as_caller = as_caller(ctx)?;
        log::debug!("statx ino={ino} mask={mask:#x}");
        let sync = flags as i32 & libc::AT_STATX_SYNC_TYPE;
        let at = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW | sync;
        let st = match fh.and_then(|fh| self.handles.get(fh.0)).and_then(|h| h.current()) {
            Some(fd) => sys::statx(fd.as_fd(), at, mask)?,
            None => {
                let inode = self.inode(ino)?;
                let inode_fd = self.fd(&inode)?;
                sys::statx(inode_fd.as_fd(), at, mask)?
            }
        };
        Ok(to_fuse_statx(&st))
    }
}

/// Answers a GETXATTR or LISTXATTR.
fn reply_xattr(reply: ReplyXattr, r: Res<XattrOut>) {
    match logged(r) {
        Ok(XattrOut::Size(n)) => reply.size(n),
        Ok(XattrOut::Data(d)) => reply.data(&d),
        Err(e) => reply.io_error(&e),
    }
}

impl Filesystem for PassthroughFs {
    // Under a keeper its node table and open files are mirrored in memory
    // the keeper holds (durable.rs); otherwise they die with the process.
    fn recovery(&self) -> Recovery {
        if self.kept {
            Recovery::Durable
        } else {
            Recovery::Unsupported("passthrough_ll keeps its node table for a successor only with -o keeper")
        }
    }

    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        if self.opts.writeback {
            config.want(InitFlags::WRITEBACK_CACHE);
        }
        if self.opts.flock {
            config.want(InitFlags::FLOCK_LOCKS);
        }
        if self.opts.posix_lock {
            config.want(InitFlags::POSIX_LOCKS);
        }
        if self.opts.readdirplus {
            config.want(InitFlags::DO_READDIRPLUS | InitFlags::READDIRPLUS_AUTO);
        }
        // The umask reaches the source with each create (see caller_umask).
        config.want(InitFlags::DONT_MASK);
        if self.opts.idmap {
            // Idmapped mounts: creates come with the caller's ids mapped into
            // the filesystem, other requests with none (`Caller::act_as`
            // serves them as the daemon). Checked at start: only with
            // default_permissions, and not with xattrs (LISTXATTR hides
            // trusted.* names from unprivileged callers only by running as
            // the caller, whom such requests do not name).
            config.want(InitFlags::ALLOW_IDMAP);
        }
        // O_TRUNC in OPEN (see `open`): the truncation happens through the
        // descriptor just opened, as the caller, with its KILL_SUIDGID.
        config.want(InitFlags::ATOMIC_O_TRUNC);
        if self.opts.xattr && self.opts.default_permissions {
            // The kernel checks permissions itself here: with the ACLs (which
            // it reads as system.posix_acl_* xattrs and caches), not just the
            // mode bits, or an ACL entry granting access would be ignored.
            // The source keeps ACL and mode in step on chmod and setfacl, as
            // the kernel expects of a filesystem with POSIX_ACL; POSIX_ACL
            // would also force default_permissions on, so not without it.
            config.want(InitFlags::POSIX_ACL);
        }
        if self.root {
            config.want(InitFlags::CREATE_SUPP_GROUP);
            // The source filesystem clears S_ISUID/S_ISGID itself, as the
            // caller, on writes, truncates and chowns. Without this the
            // kernel sends its own idea of the new mode along with a chown,
            // computed from an inode mode that lacks S_ISVTX when the kernel
            // does not check permissions itself: the sticky bit was lost.
            config.want(InitFlags::HANDLE_KILLPRIV_V2);
        }
        if self.opts.passthrough {
            if config.offered().contains(InitFlags::PASSTHROUGH) {
                config.want(InitFlags::PASSTHROUGH);
                // This mount may itself be a lower layer of overlayfs; a
                // source on a stacked filesystem falls back (`fall_back`).
                config.max_stack_depth = 1;
                log::info!("kernel passthrough on: regular files' reads and writes do not reach the daemon");
            } else if self.opts.passthrough_forced {
                self.passthrough_warned.store(true, Ordering::Relaxed);
                log::warn!(
                    "passthrough was requested but the kernel does not offer FUSE_PASSTHROUGH; serving reads and writes"
                );
            } else {
                log::info!(
                    "kernel passthrough off: the kernel does not offer FUSE_PASSTHROUGH (CONFIG_FUSE_PASSTHROUGH)"
                );
            }
        }
        if self.inodes.uses_file_handles() {
            // LOOKUP of "." answers for any node id whose slot still holds
            // its handle (`InodeTable::lookup_node`): file handles of the
            // mount (open_by_handle_at, NFS export) outlive the kernel's
            // cache. A node held by a descriptor is gone once forgotten,
            // so without file handles the kernel is not told we can.
            config.want(InitFlags::EXPORT_SUPPORT);
        } else {
            log::info!(
                "no file handles: EXPORT_SUPPORT not offered (open_by_handle_at through the mount works only while the kernel caches the inode)"
            );
        }
        if let Some(m) = self.opts.max_write {
            config.max_write = m;
        }
        config.default_permissions = self.opts.default_permissions;
        Ok(())
    }

    fn destroy(&self) {
        log::info!(
            "destroy: {} inodes still looked up, {} handles open",
            self.live_inodes(),
            self.open_handles()
        );
    }

    fn lookup(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        match self.lookup_entry(ctx, parent, name) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => match self.negative_ttl(parent) {
                Some(ttl) => reply.negative(ttl),
                None => reply.io_error(&e),
            },
            r => reply.result(r),
        }
    }

    fn forget(&self, _ctx: &RequestContext<'_>, ino: Inode, nlookup: u64) {
        log::debug!("forget ino={ino} n={nlookup}");
        self.inodes.forget(ino.0, nlookup);
    }

    fn batch_forget(&self, _ctx: &RequestContext<'_>, nodes: &mut dyn Iterator<Item = (Inode, u64)>) {
        for (ino, n) in nodes {
            self.inodes.forget(ino.0, n);
        }
    }

    fn getattr(&self, ctx: &RequestContext<'_>, ino: Inode, fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.result(logged(self.getattr_as_caller(ctx, ino, fh)));
    }

    fn setattr(&self, ctx: &RequestContext<'_>, ino: Inode, req: &SetattrRequest, reply: ReplyAttr) {
        // The kernel's struct: do_setattr follows its `valid` bits.
        reply.result(logged(self.setattr_as_caller(ctx, ino, req.raw())));
    }

    fn readlink(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyData) {
        reply.result(logged(self.readlink_as_caller(ctx, ino)));
    }

    fn symlink(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        target: &CStr,
        reply: ReplyEntry,
    ) {
        reply.result(logged(self.symlink_as_caller(ctx, parent, name, target)));
    }

    fn mknod(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: MknodRequest,
        reply: ReplyEntry,
    ) {
        reply.result(logged(self.mknod_as_caller(ctx, parent, name, req)));
    }

    fn mkdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, mode: u32, reply: ReplyEntry) {
        reply.result(logged(self.mkdir_as_caller(ctx, parent, name, mode)));
    }

    fn unlink(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        reply.result(logged(self.unlink_as_caller(ctx, parent, name, 0)));
    }

    fn rmdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        reply.result(logged(self.unlink_as_caller(
            ctx,
            parent,
            name,
            libc::AT_REMOVEDIR,
        )));
    }

    fn rename(&self, ctx: &RequestContext<'_>, req: &RenameRequest<'_>, reply: ReplyEmpty) {
        reply.result(logged(self.rename_as_caller(ctx, req)));
    }

    fn link(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        newparent: Inode,
        newname: &CStr,
        reply: ReplyEntry,
    ) {
        reply.result(logged(self.link_as_caller(ctx, ino, newparent, newname)));
    }

    fn open(&self, ctx: &RequestContext<'_>, ino: Inode, flags: OpenFlags, reply: ReplyOpen) {
        match logged(self.open_as_caller(ctx, ino, flags.bits())) {
            Ok((fh, fl, None)) => reply.opened(fh, fl),
            Ok((fh, fl, Some(b))) => reply.passthrough(fh, fl, &b),
            Err(e) => reply.io_error(&e),
        }
    }

    fn read(&self, ctx: &RequestContext<'_>, ino: Inode, fh: FileHandle, req: ReadRequest, reply: ReplyData) {
        let ReadRequest { offset, size, .. } = req;
        let log = || log::debug!("read ino={ino} fh={fh} off={offset} size={size}");
        let (_as_caller, h) = match logged(self.caller_handle(ctx, fh, log)) {
            Ok(found) => found,
            Err(e) => return reply.io_error(&e),
        };
        if self.opts.splice && h.direct.is_none() && size as usize >= SPLICE_MIN {
            // From the source's page cache into the kernel's, not through our memory.
            return reply.splice_from(h.fd(), offset, size as usize);
        }
        reply.with_buffer(size as usize, |buf| h.read_at(buf, offset));
    }

    fn write(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        reply.result(logged(self.write_as_caller(ctx, ino, fh, req)));
    }

    fn flush(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.result(logged(self.flush_handle(ino, fh, owner)));
    }

    fn release(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        let ReleaseRequest {
            lock_owner,
            flush,
            flock_release,
            ..
        } = req;
        log::debug!("release ino={ino} fh={fh}");
        if let Some(h) = self.handles.remove(fh.0) {
            if flock_release && let Some(fd) = h.current() {
                let _ = sys::flock(fd.as_fd(), libc::LOCK_UN);
            }
            // A release that stands in for the FLUSH.
            if flush && let Some(owner) = lock_owner {
                self.drop_lock_owner(&h.inode, owner.0);
            }
        }
        reply.ok();
    }

    fn fsync(
        &self,
        ctx: &RequestContext<'_>,
        _ino: Inode,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.result(logged(self.fsync_as_caller(ctx, fh, datasync)));
    }

    fn opendir(&self, ctx: &RequestContext<'_>, ino: Inode, _flags: OpenFlags, reply: ReplyOpen) {
        match logged(self.opendir_as_caller(ctx, ino)) {
            Ok((fh, flags)) => reply.opened(fh, flags),
            Err(e) => reply.io_error(&e),
        }
    }

    fn readdir(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _as_caller = match as_caller(ctx) {
            Ok(c) => c,
            Err(e) => return reply.io_error(&e),
        };
        log::debug!("readdir ino={ino} fh={fh} off={offset}");
        let r = self.readdir_common(ino, fh, offset, |_, d_ino, next, typ, name| {
            // The source's d_type as it is (DT_UNKNOWN included).
            Ok(reply
                .add_raw(d_ino, next as u64, typ as u32, name.to_bytes())
                .is_full())
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.io_error(&e),
        }
    }

    fn readdirplus(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _as_caller = match as_caller(ctx) {
            Ok(c) => c,
            Err(e) => return reply.io_error(&e),
        };
        log::debug!("readdirplus ino={ino} fh={fh} off={offset}");
        let r = self.readdir_common(ino, fh, offset, |dir, d_ino, next, typ, name| {
            let bytes = name.to_bytes();
            let found = if is_dot_or_dotdot(bytes) {
                None
            } else {
                match self.do_lookup(dir, name) {
                    Ok(x) => Some(x),
                    // Removed since the directory was read: leave it out.
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
                    // A directory the caller may read but not search: the
                    // name without attributes, as a native readdir lists it.
                    Err(e) if e.raw_os_error() == Some(libc::EACCES) => None,
                    Err(e) => return Err(e),
                }
            };
            let Some((found, st)) = found else {
                // Node id 0: a name without an entry (and no lookup).
                let out = EntryOut {
                    attr: Attr {
                        ino: d_ino,
                        mode: (typ as u32) << 12,
                        ..Default::default()
                    },
                    ..Default::default()
                };
                return Ok(reply.add_raw(&out, next as u64, bytes).is_full());
            };
            let added = reply.add(&self.entry(dir, &found, &st), next as u64, bytes);
            if !added.counts_lookup() {
                // Not sent (full, or a name the kernel would refuse): the
                // kernel did not get this lookup.
                self.inodes.forget(found.id, 1);
            }
            Ok(added.is_full())
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.io_error(&e),
        }
    }

    fn releasedir(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        _: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        log::debug!("releasedir ino={ino} fh={fh}");
        self.handles.remove(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        ctx: &RequestContext<'_>,
        _ino: Inode,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.result(logged(self.fsync_as_caller(ctx, fh, datasync)));
    }

    fn statfs(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyStatfs) {
        reply.result(logged(self.statfs_as_caller(ctx, ino)));
    }

    fn setxattr(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        name: &CStr,
        req: SetxattrRequest<'_>,
        reply: ReplyEmpty,
    ) {
        reply.result(logged(self.setxattr_as_caller(ctx, ino, name, req)));
    }

    fn getxattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, self.xattr_as_caller(ctx, ino, Some(name), size));
    }

    fn listxattr(&self, ctx: &RequestContext<'_>, ino: Inode, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, self.xattr_as_caller(ctx, ino, None, size));
    }

    fn removexattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, reply: ReplyEmpty) {
        reply.result(logged(self.removexattr_as_caller(ctx, ino, name)));
    }

    fn access(&self, ctx: &RequestContext<'_>, ino: Inode, mask: i32, reply: ReplyEmpty) {
        reply.result(logged(self.access_as_caller(ctx, ino, mask)));
    }

    fn atomic_open(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: CreateRequest,
        reply: ReplyCreate,
    ) {
        let (flags, mode) = (req.flags.bits(), req.mode);
        match logged(self.open_in(ctx, parent, name, flags, mode)) {
            Ok(Some(f)) => self.finish_create(ctx, &f.parent, f.fd, flags, f.created, reply),
            Ok(None) => reply.error(Errno::EISDIR),
            Err(e) => reply.io_error(&e),
        }
    }

    fn tmpfile(&self, ctx: &RequestContext<'_>, parent: Inode, req: CreateRequest, reply: ReplyCreate) {
        let (flags, mode) = (req.flags.bits(), req.mode);
        match logged(self.open_tmpfile(ctx, parent, flags, mode)) {
            Ok(f) => self.finish_create(ctx, &f.parent, f.fd, flags, f.created, reply),
            Err(e) => reply.io_error(&e),
        }
    }

    fn getlk(
        &self,
        ctx: &RequestContext<'_>,
        _ino: Inode,
        fh: FileHandle,
        req: LockRequest,
        reply: ReplyLock,
    ) {
        reply.result(logged(self.getlk_as_caller(ctx, fh, req)));
    }

    fn setlk(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: LockRequest,
        reply: ReplyEmpty,
    ) {
        let LockRequest {
            lock, sleep, flock, ..
        } = req;
        let log = || log::debug!("setlk ino={ino} fh={fh} {lock:?} sleep={sleep} flock={flock}");
        let (_as_caller, h) = match logged(self.caller_handle(ctx, fh, log)) {
            Ok(found) => found,
            Err(e) => return reply.io_error(&e),
        };
        match logged(self.setlk_step(ctx, fh, h, req)) {
            Ok(SetLk::Done(r)) => reply.result(logged(r)),
            Ok(SetLk::Invalid) => reply.error(Errno::EINVAL),
            Ok(SetLk::WaitFlock(h, op)) => wait_for_lock(ctx, reply, move || sys::flock(h.fd(), op)),
            Ok(SetLk::WaitPosix(o, mut fl)) => wait_for_lock(ctx, reply, move || {
                sys::fcntl_lock(o.fd.as_fd(), libc::F_OFD_SETLKW, &mut fl)
            }),
            Err(e) => reply.io_error(&e),
        }
    }

    fn fallocate(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: FallocateRequest,
        reply: ReplyEmpty,
    ) {
        reply.result(logged(self.fallocate_as_caller(ctx, ino, fh, req)));
    }

    fn lseek(
        &self,
        ctx: &RequestContext<'_>,
        _ino: Inode,
        fh: FileHandle,
        req: LseekRequest,
        reply: ReplyLseek,
    ) {
        reply.result(logged(self.lseek_as_caller(ctx, fh, req)));
    }

    fn copy_file_range(&self, ctx: &RequestContext<'_>, req: &CopyFileRangeRequest, reply: ReplyCopy) {
        reply.result(logged(self.copy_as_caller(ctx, req)));
    }

    fn statx(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: Option<FileHandle>,
        req: StatxRequest,
        reply: ReplyStatx,
    ) {
        match logged(self.statx_as_caller(ctx, ino, fh, req)) {
            Ok(st) => reply.statx(self.attr_ttl(self.opts.timeout, u32::from(st.mode)), &st),
            Err(e) => reply.io_error(&e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_ranges_convert_both_ways() {
        let l = Lock {
            start: 10,
            end: 19,
            typ: libc::F_WRLCK,
            pid: 5,
        };
        let fl = to_flock(&l).unwrap();
        assert_eq!((fl.l_start, fl.l_len, fl.l_pid), (10, 10, 0));
        assert_eq!(from_flock(&fl, 5), l);
        let whole = Lock {
            start: 0,
            end: i64::MAX as u64,
            typ: libc::F_RDLCK,
            pid: 0,
        };
        let fl = to_flock(&whole).unwrap();
        assert_eq!(fl.l_len, 0);
        assert_eq!(from_flock(&fl, 0), whole);
        assert!(
            to_flock(&Lock {
                start: 5,
                end: 1,
                ..l
            })
            .is_err()
        );
        assert!(to_flock(&Lock { start: u64::MAX, ..l }).is_err());
    }

    #[test]
    fn names_that_leave_the_directory_are_refused() {
        assert!(check_name(c"a/b").is_err());
        assert!(check_name(c"").is_err());
        assert!(check_name(c"ok").is_ok());
    }
}
