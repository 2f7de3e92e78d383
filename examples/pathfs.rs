//! pathfs: a directory of this machine mirrored on the path layer
//! (`fuse_wire::path`): each method is the system call of the same name
//! on `SOURCE/path`, open files are real file descriptors (so a file
//! unlinked while open keeps working), reads are spliced from them;
//! extended attributes are the source's.
//!
//! ```sh
//! pathfs [-f] [-d] [-s] [-o source=DIR,threads=N,uring,passthrough,idmap,MOUNT_OPTIONS] [--stats FILE] [SOURCE] MOUNTPOINT
//! ```
//!
//! The command line follows passthrough_ll's (`--help` lists it): `-o`
//! anywhere, the source as `-o source=DIR` or as the first of two
//! positional arguments (mount.fuse3's form); `-f` is accepted and changes
//! nothing, pathfs always runs in the foreground until unmounted, SIGINT,
//! SIGTERM or SIGHUP; `-d` (or `-o debug`) logs at debug level (warnings
//! only otherwise; `RUST_LOG` overrides both); `-s` runs one worker.
//!
//! Permission checks are the kernel's (`default_permissions` is always
//! on); new files are given to the caller's uid and gid when pathfs runs as
//! root (see below). `passthrough` opens files in kernel passthrough mode when the
//! kernel allows it. `idmap` lets the mount be idmapped (`ALLOW_IDMAP`):
//! the kernel then names the caller only in creates, and the re-checks
//! below act for an unnamed caller only on the node the kernel checked
//! (docs/security.md). With `--stats FILE` it writes the session's statistics
//! as JSON at exit, with `live_nodes` and `open_files`.
//!
//! Any depth the source holds is served: a path longer than one system
//! call takes (`PATH_MAX`, some two thousand levels of short names) is
//! resolved in chunks, each relative to the directory the one before it
//! reached, under the same rule as below.
//!
//! The kernel checks a request against the node it knows, but pathfs acts
//! on a name, which whoever can write the source directory may replace in
//! between (by a symbolic link, or a hard link to any file, even one
//! outside the source), and pathfs may be root. So, the rule here:
//!
//! - paths are resolved under the source by `openat2` with
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`: no symbolic link is followed,
//!   in the middle of a path nor at its end; a path past `PATH_MAX` is
//!   resolved in chunks of whole components, each by that same `openat2`
//!   beneath the directory the chunk before it opened, a directory that
//!   was beneath the source when it was reached (as is the directory that
//!   every call by name below acts in);
//! - what is changed is changed through an `O_PATH | O_NOFOLLOW`
//!   descriptor of the node, checked first (`fchownat` with
//!   `AT_EMPTY_PATH`; `chmod`, `truncate`, `link` and xattr calls on
//!   `/proc/self/fd/N`, which is that same inode, a symbolic link itself);
//! - MKNOD, MKDIR and SYMLINK create as their caller (the library's
//!   credential switching), so nothing is chowned or chmodded afterwards;
//!   CREATE, which holds the new file open, gives it to its caller through
//!   that descriptor;
//! - a SETATTR, SETXATTR, REMOVEXATTR or LINK by name from a caller other
//!   than root acts only on a node that caller owns (or, for a size, a
//!   time set to now or a `user.*` attribute, may write by its mode bits;
//!   for LINK, the `fs.protected_hardlinks` rule), as the kernel checked on
//!   the node it knows: a name swapped for a hard link to someone else's
//!   file is refused (`EPERM`). Groups the library cannot know, and ACLs,
//!   count as no grant for these rechecks.
//!
//! So a caller racing a writer of the source may see, besides the error a
//! system call gives on whatever it finds under a name (`ENOENT`,
//! `ENOTDIR`, `EISDIR`...):
//!
//! - `ESTALE`: a name just created, or opened, that is no longer of the
//!   type made or expected, and a CREATE of a name that exists (the kernel
//!   looks the name up again, once);
//! - `EIO`: the kernel's own answer to attributes of another type than
//!   the node it knows (a name swapped for a node of another type);
//! - `EINVAL`: READLINK of a name that is no longer a symbolic link, and a
//!   SETATTR of a size on one that is no longer a regular file;
//! - `EOPNOTSUPP`: a SETATTR of the mode on a name that is now a symbolic
//!   link;
//! - `ELOOP`: a directory of the path swapped for a symbolic link.

use fuse_wire::path::{PathDirFill, PathFilesystem, PathFs, PathOpened};
use fuse_wire::proto::abi::Kstatfs;
use fuse_wire::reply::ReplyData;
use fuse_wire::session::credentials;
use fuse_wire::session::keeper::{KeeperLink, run_keeper};
use fuse_wire::{
    CreateRequest, Errno, FallocateRequest, FileAttr, FileKind, InitConfig, InitFlags, LseekRequest,
    MknodRequest, OpenFlags, ReadRequest, RenameFlags, RequestContext, SetattrRequest, TimeOrNow,
    WriteRequest,
};
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub struct Mirror {
    /// The source directory (`O_PATH`), every name is resolved under it;
    /// `None` if it could not be opened (every request fails).
    source: Option<OwnedFd>,
    passthrough: bool,
    /// The mount is `noatime`: reading through it leaves the source's
    /// atime alone too (files are opened `O_NOATIME` where allowed; in
    /// kernel passthrough mode the kernel's own backing file reads, and the
    /// source's mount decides).
    pub noatime: bool,
    /// `-o idmap`: ask for `ALLOW_IDMAP`, so the mount can be idmapped.
    pub idmap: bool,
}

/// A name in a directory of the source: the directory, opened without
/// following symbolic links, and the last component (`.` for the root).
struct At {
    dir: File,
    name: CString,
}

fn cpath(p: &Path) -> Result<CString, Errno> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

/// `-1` as the errno of the call.
fn check(r: libc::c_int) -> Result<(), Errno> {
    if r < 0 {
        Err(io::Error::last_os_error().into())
    } else {
        Ok(())
    }
}

/// The bytes of an xattr call that reports the size it needs: asks for
/// the size, then the value (again if it grew in between).
fn sized(mut call: impl FnMut(&mut [u8]) -> isize) -> Result<Vec<u8>, Errno> {
    loop {
        let n = call(&mut []);
        if n < 0 {
            return Err(io::Error::last_os_error().into());
        }
        let mut buf = vec![0; n as usize];
        let got = call(&mut buf);
        if got >= 0 {
            buf.truncate(got as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e.into());
        }
    }
}

fn timespec(t: Option<TimeOrNow>) -> libc::timespec {
    let (tv_sec, tv_nsec) = match t {
        None => (0, libc::UTIME_OMIT),
        Some(TimeOrNow::Now) => (0, libc::UTIME_NOW),
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as i64),
            // Before 1970: whole seconds down, nanoseconds up.
            Err(e) => {
                let d = e.duration();
                match d.subsec_nanos() {
                    0 => (-(d.as_secs() as i64), 0),
                    n => (-(d.as_secs() as i64) - 1, 1_000_000_000 - n as i64),
                }
            }
        },
    };
    libc::timespec { tv_sec, tv_nsec }
}

/// `/proc/self/fd/N` for `fd`: the very inode `fd` refers to, even for an
/// `O_PATH` descriptor of a symbolic link (the link itself, not followed).
fn proc_path(fd: &impl AsRawFd) -> CString {
    // A decimal number holds no NUL.
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
}

/// `openat(dir, name, flags, mode)`, as a `File`.
fn open_at(dir: &impl AsRawFd, name: &CStr, flags: i32, mode: u32) -> Result<File, Errno> {
    // SAFETY: a valid C string; the fd returned is owned by the File below.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    check(fd)?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The longest path, in bytes, that one system call takes: `PATH_MAX`
/// counts the terminating NUL.
const CHUNK_MAX: usize = libc::PATH_MAX as usize - 1;

/// `openat2(dir, path, flags)` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
/// | RESOLVE_NO_MAGICLINKS`: `path` resolves below `dir` without following
/// any symbolic link, as a `File`.
fn openat2(dir: &impl AsRawFd, path: &CStr, flags: i32) -> Result<File, Errno> {
    // SAFETY: all-zero is a valid open_how (its fields are integers).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: an fd we hold, a valid C string and an open_how of the size
    // given; the fd returned is owned by the File below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    check(fd as libc::c_int)?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd as libc::c_int) })
}

impl Mirror {
    /// A mirror of the directory `source` (without passthrough), or why it
    /// cannot be opened.
    pub fn open(source: &Path) -> Result<Mirror, Errno> {
        let dir = Self::open_path(source, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        Ok(Mirror {
            source: Some(dir.into()),
            passthrough: false,
            noatime: false,
            idmap: false,
        })
    }

    /// A mirror of `source` (without passthrough); one whose source cannot
    /// be opened fails every request (`EIO`).
    pub fn new(source: PathBuf) -> Mirror {
        let source = Self::open_path(&source, libc::O_PATH | libc::O_DIRECTORY, 0)
            .ok()
            .map(OwnedFd::from);
        Mirror {
            source,
            passthrough: false,
            noatime: false,
            idmap: false,
        }
    }

    /// Opens `path` (relative to the source; empty for the source itself)
    /// with `flags`, never following a symbolic link nor leaving the
    /// source. A symbolic link at the end is opened itself with
    /// `O_PATH | O_NOFOLLOW`, and refused (`ELOOP`) otherwise.
    ///
    /// A path too long for one system call (`PATH_MAX`, which a tree
    /// reaches at a depth of some two thousand short names) is resolved in
    /// chunks of whole components, each below `PATH_MAX` and opened as a
    /// directory by the same `openat2` relative to the directory the chunk
    /// before it reached: no depth the source holds is out of reach, and
    /// no chunk can leave the directory it starts from, nor follow a link.
    fn resolve(&self, rel: &Path, flags: i32) -> Result<File, Errno> {
        let source = self.source.as_ref().ok_or(Errno::EIO)?;
        let mut rest = rel.as_os_str().as_bytes();
        if rest.is_empty() {
            return openat2(source, c".", flags);
        }
        let mut dir: Option<File> = None;
        while rest.len() > CHUNK_MAX {
            // The last slash that leaves a chunk of at most CHUNK_MAX
            // bytes before it (a name is at most NAME_MAX bytes, so one is
            // there unless the path is not the layer's).
            let cut = rest[..=CHUNK_MAX]
                .iter()
                .rposition(|&b| b == b'/')
                .filter(|&i| i > 0)
                .ok_or(Errno::ENAMETOOLONG)?;
            let chunk = CString::new(&rest[..cut]).map_err(|_| Errno::EINVAL)?;
            let next = match &dir {
                Some(d) => openat2(d, &chunk, libc::O_PATH | libc::O_DIRECTORY)?,
                None => openat2(source, &chunk, libc::O_PATH | libc::O_DIRECTORY)?,
            };
            dir = Some(next);
            rest = &rest[cut + 1..];
        }
        let last = CString::new(rest).map_err(|_| Errno::EINVAL)?;
        match &dir {
            Some(d) => openat2(d, &last, flags),
            None => openat2(source, &last, flags),
        }
    }

    fn rel(path: &Path) -> &Path {
        path.strip_prefix("/").unwrap_or(path)
    }

    /// The node at `path`, opened `O_PATH | O_NOFOLLOW` (see
    /// [`Self::resolve`]).
    fn node(&self, path: &Path) -> Result<File, Errno> {
        self.resolve(Self::rel(path), libc::O_PATH | libc::O_NOFOLLOW)
    }

    /// The directory of `path` and its last component.
    fn at(&self, path: &Path) -> Result<At, Errno> {
        let rel = Self::rel(path);
        let (parent, name) = match (rel.parent(), rel.file_name()) {
            (Some(p), Some(n)) => (p, cpath(Path::new(n))?),
            _ => (Path::new(""), c".".to_owned()),
        };
        Ok(At {
            dir: self.resolve(parent, libc::O_PATH | libc::O_DIRECTORY)?,
            name,
        })
    }

    /// The attributes of the node just created at `at`. MKNOD, MKDIR and
    /// SYMLINK create as their caller ([`Caller::act_as`]), so the node is
    /// the caller's (its group the directory's in a set-group-ID
    /// directory) with the set-ID bits the kernel let through, and nothing
    /// is changed after the fact, by a name that could have been swapped
    /// meanwhile for a link to another file. A name that no longer is of
    /// the `kind` created (`S_IFMT` bits) is answered `ESTALE`: the kernel
    /// refuses attributes of another type for a new node.
    ///
    /// [`Caller::act_as`]: credentials::Caller::act_as
    fn created(at: &At, kind: u32) -> Result<FileAttr, Errno> {
        use std::os::unix::fs::MetadataExt;
        let m = open_at(&at.dir, &at.name, libc::O_PATH | libc::O_NOFOLLOW, 0)?.metadata()?;
        if m.mode() & libc::S_IFMT != kind {
            return Err(Errno::ESTALE);
        }
        Ok(FileAttr::from(&m))
    }

    /// The attributes of the file just created in `dir` and open as `file`
    /// (by CREATE, as the daemon), given to the caller when we are root:
    /// changed through the descriptor, whatever becomes of the name.
    fn created_file(&self, ctx: &RequestContext<'_>, dir: &File, file: &File) -> Result<FileAttr, Errno> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let m = file.metadata()?;
        if let Some((uid, gid)) = self.new_owner(ctx, dir, &m) {
            std::os::unix::fs::fchown(file, Some(uid), Some(gid))?;
            if m.mode() & 0o6000 != 0 {
                file.set_permissions(std::fs::Permissions::from_mode(m.mode() & 0o7777))?;
            }
        }
        Ok(FileAttr::from(&file.metadata()?))
    }

    /// The owner to give a new node of `dir` (attributes `m`), if it must
    /// change: the caller, when we are root.
    fn new_owner(&self, ctx: &RequestContext<'_>, dir: &File, m: &std::fs::Metadata) -> Option<(u32, u32)> {
        use std::os::unix::fs::MetadataExt;
        let sgid_dir = dir.metadata().is_ok_and(|d| d.mode() & 0o2000 != 0);
        let gid = if sgid_dir { m.gid() } else { ctx.gid() };
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        (root && (m.uid(), m.gid()) != (ctx.uid(), gid)).then_some((ctx.uid(), gid))
    }

    /// Whether the caller of `ctx` may change the node `m` by name as the
    /// kernel allowed it on the node it knows: root may; others must own
    /// it, or (`write`) may write it by its mode bits, or hold `cap`; for a
    /// caller the kernel does not name ([`credentials::Caller::is_unmapped`]),
    /// see [`Self::kernel_checked`]. A node
    /// that fails this is not the one the kernel checked (a name swapped
    /// for a hard link to someone else's file): `EPERM`.
    fn may_change(
        ctx: &RequestContext<'_>,
        m: &std::fs::Metadata,
        write: bool,
        cap: u32,
    ) -> Result<(), Errno> {
        use std::os::unix::fs::MetadataExt;
        if ctx.caller().is_unmapped() {
            return Self::kernel_checked(ctx, m);
        }
        if ctx.uid() == 0 || m.uid() == ctx.uid() {
            return Ok(());
        }
        let caller = ctx.caller();
        if write && (Self::mode_allows(ctx, m, 0o2) || caller.has_capability(credentials::cap::DAC_OVERRIDE))
        {
            return Ok(());
        }
        if caller.has_capability(cap) {
            return Ok(());
        }
        Err(Errno::EPERM)
    }

    /// For a caller the kernel does not name (an idmapped mount's requests
    /// other than creates), whom nothing here can check: the node `m` found
    /// by name must be the one the kernel checked with the caller's mapped
    /// ids (`default_permissions`), the same `st_ino`, owner and group as
    /// last reported ([`RequestContext::node_attr`]); anything else
    /// (a name swapped in the source, or no node known) is refused
    /// (`EPERM`), never served as root.
    fn kernel_checked(ctx: &RequestContext<'_>, m: &std::fs::Metadata) -> Result<(), Errno> {
        use std::os::unix::fs::MetadataExt;
        match ctx.node_attr() {
            Some(a) if (a.ino, a.uid, a.gid) == (m.ino(), m.uid(), m.gid()) => Ok(()),
            _ => Err(Errno::EPERM),
        }
    }

    /// Whether the mode bits of `m` give the caller of `ctx` (who does not
    /// own it) all of `bits` (`0o4` read, `0o2` write), from the group's
    /// bits or the others'. Groups that cannot be known count as none.
    fn mode_allows(ctx: &RequestContext<'_>, m: &std::fs::Metadata, bits: u32) -> bool {
        use std::os::unix::fs::MetadataExt;
        let group = m.gid() == ctx.gid() || ctx.caller().in_group(m.gid());
        let class = if group {
            (m.mode() >> 3) & 0o7
        } else {
            m.mode() & 0o7
        };
        class & bits == bits
    }

    /// Whether the caller of `ctx` may make a new name for the node `m`:
    /// the kernel's `fs.protected_hardlinks` rule, applied here whatever
    /// that setting, since the node may not be the one the kernel checked.
    /// Root may; others must own it, or it must be a regular file without
    /// set-user-ID (nor executable set-group-ID) that they may read and
    /// write.
    fn may_link(ctx: &RequestContext<'_>, m: &std::fs::Metadata) -> Result<(), Errno> {
        use std::os::unix::fs::MetadataExt;
        if ctx.caller().is_unmapped() {
            return Self::kernel_checked(ctx, m);
        }
        let setid = m.mode() & 0o4000 != 0 || m.mode() & 0o2010 == 0o2010;
        let ok = ctx.uid() == 0
            || m.uid() == ctx.uid()
            || (m.is_file() && !setid && Self::mode_allows(ctx, m, 0o6))
            || ctx.caller().has_capability(credentials::cap::FOWNER);
        if ok { Ok(()) } else { Err(Errno::EPERM) }
    }

    /// Whether a change to the extended attribute `name` needs the node's
    /// owner: all but `user.*`, which need only write permission.
    fn xattr_needs_owner(name: &CStr) -> bool {
        !name.to_bytes().starts_with(b"user.")
    }

    /// `open(real, flags, mode)`, as a `File`.
    fn open_path(real: &Path, flags: i32, mode: u32) -> Result<File, Errno> {
        let c = cpath(real)?;
        // SAFETY: a valid C string; the fd returned is owned by the File below.
        let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
        check(fd)?;
        // SAFETY: `fd` was just opened and is owned by nobody else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Opens the regular file at `path` with `flags`. The kernel sends OPEN
    /// for regular files only, but the name may have been replaced in the
    /// source behind the mount's back, by a FIFO (whose open blocks), a
    /// device node (whose open acts on the device) or a symbolic link
    /// (which leads anywhere, and we may be root). So the name is opened
    /// `O_PATH | O_NOFOLLOW` (which opens nothing), checked, and reopened
    /// through `/proc/self/fd/N`, that same inode. Anything but a regular
    /// file is answered `ESTALE`: the kernel then looks the name up again
    /// and opens what it finds itself.
    fn open_regular(&self, path: &Path, flags: i32) -> Result<File, Errno> {
        let path = self.node(path)?;
        if !path.metadata()?.file_type().is_file() {
            return Err(Errno::ESTALE);
        }
        let proc = format!("/proc/self/fd/{}", path.as_raw_fd());
        let flags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW);
        self.without_atime(flags, |flags| Self::open_path(Path::new(&proc), flags, 0))
    }

    /// Runs `open` with `flags`, plus `O_NOATIME` on a `noatime` mount;
    /// again without it if that is refused (`EPERM`: the file is not ours).
    fn without_atime(&self, flags: i32, open: impl Fn(i32) -> Result<File, Errno>) -> Result<File, Errno> {
        if !self.noatime {
            return open(flags);
        }
        match open(flags | libc::O_NOATIME) {
            Err(e) if e == Errno::EPERM => open(flags),
            r => r,
        }
    }

    /// `file` as an open file of the layer, with a backing file in
    /// passthrough mode.
    fn opened(&self, ctx: &RequestContext<'_>, file: File) -> PathOpened<File> {
        if !self.passthrough {
            return PathOpened::new(file);
        }
        // The backing file serves every open of the inode (the layer keeps
        // the first): open it for reading and writing when allowed.
        let proc = Path::new(&format!("/proc/self/fd/{}", file.as_raw_fd())).to_path_buf();
        let open = |flags| self.without_atime(flags, |flags| Self::open_path(&proc, flags, 0));
        let backing = open(libc::O_RDWR)
            .or_else(|_| open(libc::O_RDONLY))
            .ok()
            .and_then(|b| ctx.open_backing(b.as_fd()).ok());
        match backing {
            Some(b) => PathOpened::new(file).passthrough(b),
            None => PathOpened::new(file),
        }
    }
}

impl PathFilesystem for Mirror {
    type File = File;

    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        if self.idmap {
            // Creates then come with the caller's ids mapped into the
            // filesystem, other requests with none: their re-checks compare
            // the node with the kernel's (`kernel_checked`).
            config.want(InitFlags::ALLOW_IDMAP);
        }
        if self.passthrough {
            // Backing files on a filesystem that is not itself stacked.
            config.wanted |= InitFlags::PASSTHROUGH;
            config.max_stack_depth = 1;
        }
        Ok(())
    }

    fn getattr(
        &self,
        _: &RequestContext<'_>,
        path: Option<&Path>,
        file: Option<&File>,
    ) -> Result<FileAttr, Errno> {
        let m = match (file, path) {
            (Some(f), _) => f.metadata()?,
            (None, Some(p)) => self.node(p)?.metadata()?,
            (None, None) => return Err(Errno::ENOENT),
        };
        Ok(FileAttr::from(&m))
    }

    fn setattr(
        &self,
        ctx: &RequestContext<'_>,
        path: Option<&Path>,
        file: Option<&File>,
        req: &SetattrRequest,
    ) -> Result<FileAttr, Errno> {
        let times = req.atime.is_some() || req.mtime.is_some();
        let t = [timespec(req.atime), timespec(req.mtime)];
        match (file, path) {
            // Through the open file (it may have no name left).
            (Some(f), _) => {
                let fd = f.as_raw_fd();
                if let Some(perm) = req.perm {
                    // SAFETY: plain syscall on an fd we hold.
                    check(unsafe { libc::fchmod(fd, perm as libc::mode_t) })?;
                }
                if req.uid.is_some() || req.gid.is_some() {
                    std::os::unix::fs::fchown(f, req.uid, req.gid)?;
                }
                if let Some(size) = req.size {
                    // SAFETY: plain syscall on an fd we hold.
                    check(unsafe { libc::ftruncate(fd, size as i64) })?;
                }
                if times {
                    // SAFETY: plain syscall on an fd we hold, two timespecs.
                    check(unsafe { libc::futimens(fd, t.as_ptr()) })?;
                }
                Ok(FileAttr::from(&f.metadata()?))
            }
            // By name, through an O_PATH descriptor of the node (never
            // opening it: a fifo would block an open), checked first.
            (None, Some(p)) => {
                use credentials::cap;
                let node = self.node(p)?;
                let m = node.metadata()?;
                let now = |t: Option<TimeOrNow>| matches!(t, None | Some(TimeOrNow::Now));
                if let Some(perm) = req.perm {
                    // Only set-ID bits dropped: the kernel clearing them
                    // after it let the caller write, truncate or fallocate
                    // the file (without ownership). Allowed to a caller who
                    // may write the file by its mode bits, so a name
                    // swapped for someone else's set-ID file stays refused.
                    let cur = std::os::unix::fs::MetadataExt::mode(&m) & 0o7777;
                    let setid = libc::S_ISUID | libc::S_ISGID;
                    let perm = u32::from(perm) & 0o7777;
                    let kill_only = perm != cur && (cur ^ perm) & !setid == 0 && perm & !cur == 0;
                    Self::may_change(ctx, &m, kill_only, cap::FOWNER)?;
                }
                if req.uid.is_some() || req.gid.is_some() {
                    Self::may_change(ctx, &m, false, cap::CHOWN)?;
                }
                if req.size.is_some() {
                    Self::may_change(ctx, &m, true, cap::DAC_OVERRIDE)?;
                }
                if times {
                    let touch = now(req.atime) && now(req.mtime);
                    Self::may_change(ctx, &m, touch, cap::FOWNER)?;
                }
                let proc = proc_path(&node);
                if let Some(perm) = req.perm {
                    if m.file_type().is_symlink() {
                        return Err(Errno::EOPNOTSUPP);
                    }
                    // SAFETY: a valid C string (this very inode).
                    check(unsafe { libc::chmod(proc.as_ptr(), perm as libc::mode_t) })?;
                }
                if req.uid.is_some() || req.gid.is_some() {
                    let (uid, gid) = (req.uid.unwrap_or(u32::MAX), req.gid.unwrap_or(u32::MAX));
                    // SAFETY: an fd we hold and an empty C string, with AT_EMPTY_PATH.
                    check(unsafe {
                        libc::fchownat(node.as_raw_fd(), c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH)
                    })?;
                }
                if let Some(size) = req.size {
                    if m.is_dir() {
                        return Err(Errno::EISDIR);
                    }
                    if !m.is_file() {
                        return Err(Errno::EINVAL);
                    }
                    // SAFETY: a valid C string (this very inode, a regular file).
                    check(unsafe { libc::truncate(proc.as_ptr(), size as i64) })?;
                }
                if times {
                    // SAFETY: an fd we hold, an empty C string with
                    // AT_EMPTY_PATH and two timespecs.
                    check(unsafe {
                        libc::utimensat(node.as_raw_fd(), c"".as_ptr(), t.as_ptr(), libc::AT_EMPTY_PATH)
                    })?;
                }
                Ok(FileAttr::from(&node.metadata()?))
            }
            (None, None) => Err(Errno::ENOENT),
        }
    }

    fn readlink(&self, _: &RequestContext<'_>, path: &Path) -> Result<Vec<u8>, Errno> {
        let at = self.at(path)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize];
        // SAFETY: an fd we hold, a valid C string and a buffer of the length given.
        let n = unsafe {
            libc::readlinkat(
                at.dir.as_raw_fd(),
                at.name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error().into());
        }
        buf.truncate(n as usize);
        Ok(buf)
    }

    fn mknod(&self, ctx: &RequestContext<'_>, path: &Path, req: MknodRequest) -> Result<FileAttr, Errno> {
        let at = self.at(path)?;
        let as_caller = ctx.caller().act_as()?;
        // SAFETY: an fd we hold and a valid C string.
        check(unsafe {
            libc::mknodat(
                at.dir.as_raw_fd(),
                at.name.as_ptr(),
                req.mode as libc::mode_t,
                req.rdev as libc::dev_t,
            )
        })?;
        drop(as_caller);
        let kind = match req.mode & libc::S_IFMT {
            0 => libc::S_IFREG,
            k => k,
        };
        Self::created(&at, kind)
    }

    fn mkdir(&self, ctx: &RequestContext<'_>, path: &Path, mode: u32) -> Result<FileAttr, Errno> {
        let at = self.at(path)?;
        let as_caller = ctx.caller().act_as()?;
        // SAFETY: an fd we hold and a valid C string.
        check(unsafe { libc::mkdirat(at.dir.as_raw_fd(), at.name.as_ptr(), mode as libc::mode_t) })?;
        drop(as_caller);
        Self::created(&at, libc::S_IFDIR)
    }

    fn symlink(&self, ctx: &RequestContext<'_>, path: &Path, target: &CStr) -> Result<FileAttr, Errno> {
        let at = self.at(path)?;
        let as_caller = ctx.caller().act_as()?;
        // SAFETY: valid C strings and an fd we hold.
        check(unsafe { libc::symlinkat(target.as_ptr(), at.dir.as_raw_fd(), at.name.as_ptr()) })?;
        drop(as_caller);
        Self::created(&at, libc::S_IFLNK)
    }

    /// Links the very node checked (through `/proc/self/fd/N` of its
    /// `O_PATH` descriptor), not whatever the name has become.
    fn link(&self, ctx: &RequestContext<'_>, from: &Path, to: &Path) -> Result<FileAttr, Errno> {
        let (node, b) = (self.node(from)?, self.at(to)?);
        Self::may_link(ctx, &node.metadata()?)?;
        let p = proc_path(&node);
        // SAFETY: valid C strings and an fd we hold; following the magic
        // link gives the node itself, even a symbolic link.
        check(unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                p.as_ptr(),
                b.dir.as_raw_fd(),
                b.name.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        })?;
        Ok(FileAttr::from(&node.metadata()?))
    }

    fn unlink(&self, _: &RequestContext<'_>, path: &Path) -> Result<(), Errno> {
        let at = self.at(path)?;
        // SAFETY: an fd we hold and a valid C string.
        check(unsafe { libc::unlinkat(at.dir.as_raw_fd(), at.name.as_ptr(), 0) })
    }

    fn rmdir(&self, _: &RequestContext<'_>, path: &Path) -> Result<(), Errno> {
        let at = self.at(path)?;
        // SAFETY: an fd we hold and a valid C string.
        check(unsafe { libc::unlinkat(at.dir.as_raw_fd(), at.name.as_ptr(), libc::AT_REMOVEDIR) })
    }

    fn rename(
        &self,
        _: &RequestContext<'_>,
        from: &Path,
        to: &Path,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let (a, b) = (self.at(from)?, self.at(to)?);
        // SAFETY: fds we hold and valid C strings.
        check(unsafe {
            libc::renameat2(
                a.dir.as_raw_fd(),
                a.name.as_ptr(),
                b.dir.as_raw_fd(),
                b.name.as_ptr(),
                flags.bits(),
            )
        })
    }

    fn open(
        &self,
        ctx: &RequestContext<'_>,
        path: &Path,
        flags: OpenFlags,
    ) -> Result<PathOpened<File>, Errno> {
        let file = self.open_regular(path, flags.bits())?;
        Ok(self.opened(ctx, file))
    }

    /// Creates the file with `O_EXCL` (and `O_NOFOLLOW`), whatever the
    /// caller asked: the kernel sends CREATE for a name it believes
    /// missing, and has checked only the caller's right to create in the
    /// directory. A name that exists after all (made in the source behind
    /// the mount's back) is not opened here, where we may be root and it
    /// may be anything: unless the caller asked for `O_EXCL`, `ESTALE`
    /// makes the kernel look the name up again and open what it finds
    /// with its own checks.
    fn create(
        &self,
        ctx: &RequestContext<'_>,
        path: &Path,
        req: CreateRequest,
    ) -> Result<(FileAttr, PathOpened<File>), Errno> {
        let at = self.at(path)?;
        let flags = req.flags.bits();
        let file = match open_at(
            &at.dir,
            &at.name,
            flags | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            req.mode,
        ) {
            Ok(file) => file,
            Err(e) if e == Errno::EEXIST && flags & libc::O_EXCL == 0 => return Err(Errno::ESTALE),
            Err(e) => return Err(e),
        };
        Ok((self.created_file(ctx, &at.dir, &file)?, self.opened(ctx, file)))
    }

    fn read(&self, _: &RequestContext<'_>, file: &File, req: ReadRequest, reply: ReplyData) {
        reply.splice_from(file.as_fd(), req.offset, req.size as usize)
    }

    fn write(&self, _: &RequestContext<'_>, file: &File, req: WriteRequest<'_>) -> Result<u32, Errno> {
        Ok(file.write_at(req.data.fetch()?, req.offset)? as u32)
    }

    fn fsync(&self, _: &RequestContext<'_>, file: &File, datasync: bool) -> Result<(), Errno> {
        let r = if datasync {
            file.sync_data()
        } else {
            file.sync_all()
        };
        Ok(r?)
    }

    fn readdir(
        &self,
        _: &RequestContext<'_>,
        path: &Path,
        offset: u64,
        out: &mut PathDirFill<'_>,
    ) -> Result<(), Errno> {
        // The source's own cookies (telldir), stable while entries come and go.
        let fd = self.resolve(Self::rel(path), libc::O_RDONLY | libc::O_DIRECTORY)?;
        // SAFETY: an fd we own, given to the stream (closed with it below).
        let dir = unsafe { libc::fdopendir(fd.as_raw_fd()) };
        if dir.is_null() {
            return Err(io::Error::last_os_error().into());
        }
        let _ = std::os::fd::IntoRawFd::into_raw_fd(fd);
        // SAFETY: `dir` is an open stream; `offset` is 0 or a cookie it gave.
        unsafe { libc::seekdir(dir, offset as libc::c_long) };
        loop {
            // SAFETY: `dir` is an open stream; the entry is read before the next call.
            let e = unsafe { libc::readdir(dir) };
            if e.is_null() {
                break;
            }
            // SAFETY: readdir returned a valid entry with a NUL-terminated name.
            let (name, typ, next, ino) = unsafe {
                (
                    CStr::from_ptr((*e).d_name.as_ptr()),
                    (*e).d_type,
                    (*e).d_off,
                    (*e).d_ino,
                )
            };
            if matches!(name.to_bytes(), b"." | b"..") {
                continue;
            }
            let kind = FileKind::from_mode((typ as u32) << 12).unwrap_or(FileKind::RegularFile);
            // The source's d_ino is the st_ino getattr reports: no lstat per name.
            if out
                .add_with_ino(name.to_bytes(), kind, next as u64, ino)
                .is_full()
            {
                break;
            }
        }
        // SAFETY: closing the stream opened above.
        unsafe { libc::closedir(dir) };
        Ok(())
    }

    fn fallocate(&self, _: &RequestContext<'_>, file: &File, req: FallocateRequest) -> Result<(), Errno> {
        // SAFETY: plain syscall on an fd we hold.
        check(unsafe { libc::fallocate(file.as_raw_fd(), req.mode, req.offset as i64, req.length as i64) })
    }

    fn lseek(&self, _: &RequestContext<'_>, file: &File, req: LseekRequest) -> Result<u64, Errno> {
        // SAFETY: plain syscall on an fd we hold (pread/pwrite elsewhere do
        // not use its position).
        let r = unsafe { libc::lseek(file.as_raw_fd(), req.offset as i64, req.whence) };
        if r < 0 {
            Err(io::Error::last_os_error().into())
        } else {
            Ok(r as u64)
        }
    }

    fn copy_file_range(
        &self,
        _: &RequestContext<'_>,
        from: &File,
        off_in: u64,
        to: &File,
        off_out: u64,
        len: u64,
    ) -> Result<u64, Errno> {
        let (mut i, mut o) = (off_in as i64, off_out as i64);
        // SAFETY: plain syscall on two fds we hold, with offsets of our own.
        let r = unsafe {
            libc::copy_file_range(from.as_raw_fd(), &mut i, to.as_raw_fd(), &mut o, len as usize, 0)
        };
        if r < 0 {
            Err(io::Error::last_os_error().into())
        } else {
            Ok(r as u64)
        }
    }

    fn getxattr(&self, _: &RequestContext<'_>, path: &Path, name: &CStr) -> Result<Vec<u8>, Errno> {
        let node = self.node(path)?;
        let c = proc_path(&node);
        // SAFETY: valid C strings and a buffer of the length given.
        sized(|buf| unsafe { libc::getxattr(c.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
    }

    fn listxattr(&self, _: &RequestContext<'_>, path: &Path) -> Result<Vec<u8>, Errno> {
        let node = self.node(path)?;
        let c = proc_path(&node);
        // SAFETY: a valid C string and a buffer of the length given.
        sized(|buf| unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
    }

    fn setxattr(
        &self,
        ctx: &RequestContext<'_>,
        path: &Path,
        name: &CStr,
        value: &[u8],
        flags: i32,
    ) -> Result<(), Errno> {
        let node = self.node(path)?;
        let write = !Self::xattr_needs_owner(name);
        Self::may_change(ctx, &node.metadata()?, write, credentials::cap::FOWNER)?;
        let c = proc_path(&node);
        // SAFETY: valid C strings and a value of the length given.
        check(unsafe {
            libc::setxattr(
                c.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        })
    }

    fn removexattr(&self, ctx: &RequestContext<'_>, path: &Path, name: &CStr) -> Result<(), Errno> {
        let node = self.node(path)?;
        let write = !Self::xattr_needs_owner(name);
        Self::may_change(ctx, &node.metadata()?, write, credentials::cap::FOWNER)?;
        let c = proc_path(&node);
        // SAFETY: valid C strings.
        check(unsafe { libc::removexattr(c.as_ptr(), name.as_ptr()) })
    }

    fn statfs(&self, _: &RequestContext<'_>, path: &Path) -> Result<fuse_wire::Statfs, Errno> {
        let node = self.node(path)?;
        // SAFETY: all-zero is a valid statvfs.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: an fd we hold (fstatvfs works on O_PATH) and a statvfs to fill.
        check(unsafe { libc::fstatvfs(node.as_raw_fd(), &mut st) })?;
        Ok(Kstatfs {
            blocks: st.f_blocks,
            bfree: st.f_bfree,
            bavail: st.f_bavail,
            files: st.f_files,
            ffree: st.f_ffree,
            bsize: st.f_bsize as u32,
            namelen: st.f_namemax as u32,
            frsize: st.f_frsize as u32,
            ..Default::default()
        }
        .into())
    }
}

fn main() -> ExitCode {
    // Started by a keeper (`-o keeper`): serve the connection it holds,
    // with the path layer's table kept where the keeper holds it.
    let link = KeeperLink::from_env();
    let args = match cli::start(
        "pathfs",
        args::USAGE,
        args::parse,
        |a| a.debug,
        log::LevelFilter::Warn,
    ) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let mut fs = match Mirror::open(&args.source) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("pathfs: {}: {e}", args.source.display());
            return ExitCode::FAILURE;
        }
    };
    fs.passthrough = args.passthrough;
    fs.noatime = args.mount.noatime;
    fs.idmap = args.idmap;
    if let Some(link) = link {
        let ttl = std::time::Duration::from_secs(1);
        let mut fs = Some(fs);
        let served = link.serve(
            |r| {
                let fs = fs.take().ok_or_else(|| std::io::Error::other("restored twice"))?;
                PathFs::kept(fs, ttl, &r)
            },
            |_| Vec::new(),
            args.session,
        );
        return match served {
            Ok(true) => KeeperLink::exit_retired(),
            Ok(false) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("pathfs: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if args.keeper {
        if args.passthrough {
            eprintln!("pathfs: -o keeper with passthrough: backing files live in the daemon; refused");
            return ExitCode::FAILURE;
        }
        // This process keeps the mount; a child serves it, and is replaced
        // when it dies (SIGUSR2: a graceful upgrade to the binary on disk).
        let program = std::env::current_exe().unwrap_or_else(|_| "pathfs".into());
        let mut child_args: Vec<std::ffi::OsString> = vec!["-o".into()];
        let mut o = std::ffi::OsString::from("source=");
        o.push(&args.source);
        child_args.push(o);
        if args.debug {
            child_args.push("-d".into());
        }
        if args.idmap {
            child_args.push("-o".into());
            child_args.push("idmap".into());
        }
        if args.session.workers == 1 {
            child_args.push("-s".into());
        }
        child_args.push(args.mountpoint.clone().into());
        return match run_keeper(&args.mountpoint, &args.mount, program, child_args) {
            Ok(report) => {
                eprintln!(
                    "pathfs: keeper done ({} daemons started, {} crashes, {} upgrades)",
                    report.started, report.crashes, report.upgrades
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("pathfs: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let fs = PathFs::new(fs);
    let counts = fs.clone();
    match fuse_wire::serve_with(fs, &args.mountpoint, &args.mount, args.session) {
        Ok(report) => {
            if let Some(path) = args.stats {
                let counts = [
                    ("live_nodes", counts.live_nodes() as u64),
                    ("open_files", counts.open_files() as u64),
                ];
                if let Err(e) = std::fs::write(&path, report.stats.to_json_with(&counts)) {
                    eprintln!("pathfs: {}: {e}", path.display());
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pathfs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The command line: `pathfs [-f] [-d] [-s] [-o opt,...] [--stats FILE]
/// [SOURCE] MOUNTPOINT`, with passthrough_ll's conventions: `-o` anywhere
/// (mount.fuse3 puts it after the mountpoint), two positional arguments
/// for an fstab line's source and mountpoint (`-o source=DIR` wins over
/// the first), `-f` accepted (pathfs always runs in the foreground).
#[path = "common/cli.rs"]
mod cli;

mod args {
    use fuse_wire::MountOptions;
    use fuse_wire::session::SessionConfig;
    use std::path::PathBuf;

    /// Everything the command line says.
    #[derive(Debug)]
    pub struct Args {
        pub mountpoint: PathBuf,
        pub source: PathBuf,
        pub mount: MountOptions,
        pub session: SessionConfig,
        pub passthrough: bool,
        pub stats: Option<PathBuf>,
        pub debug: bool,
        pub keeper: bool,
        pub idmap: bool,
    }

    /// What the command line asks for.
    /// What the command line asks for.
    pub type Command = super::cli::Parsed<Box<Args>>;

    pub const USAGE: &str = "\
usage: pathfs [-f] [-d] [-s] [-o opt,[opt...]] [--stats FILE] [SOURCE] MOUNTPOINT

Mirrors the directory SOURCE (or -o source=DIR) at MOUNTPOINT on the path
layer. Runs in the foreground until unmounted, SIGINT, SIGTERM or SIGHUP.

    -f                 foreground (always)
    -d                 debug logging (also -o debug)
    -s                 one worker thread
    --stats FILE       write the session's statistics as JSON to FILE at exit,
                       with live_nodes and open_files
    -h, --help         this help
    -V, --version      version

filesystem options (-o):
    source=DIR         directory to mirror (required, here or as SOURCE)
    threads=N          worker threads (default: two per CPU)
    max_threads=N      most workers running handlers at once (default: max(4 x threads, 16))
    uring              serve requests over FUSE-over-io_uring when the kernel
                       allows it; otherwise /dev/fuse, with the reason logged
    passthrough        open files in kernel passthrough mode when the kernel
                       allows it
    idmap              let the mount be idmapped (ALLOW_IDMAP). The kernel then
                       names the caller only in creates; a chmod, chown, utimes,
                       truncate, link or xattr change by name is done only on the
                       node the kernel checked (EPERM if the name was replaced),
                       trusted.* names are listed to nobody, and per-user shares
                       see one user for requests other than creates
    keeper             keep the mount in this process and serve it from a child,
                       replaced when it dies (SIGUSR2: upgrade to the binary on
                       disk); node ids and open files survive (docs/recovery.md)

mount options: fsname=, subtype=, allow_other, allow_root, ro, rw, [no]suid,
    [no]dev, [no]exec, [no]atime, [no]diratime, sync, async, dirsync,
    max_read=, auto_unmount

default_permissions is always on: the kernel checks every access.
";

    /// fstab and mount(8) options that mean nothing to the filesystem itself.
    const IGNORED: &[&str] = &[
        "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group", "_netdev", "nofail",
        "nonempty",
    ];

    /// Parses the arguments after the program name.
    pub fn parse(argv: &[String]) -> Result<Command, String> {
        let flags = match super::cli::lex(argv, true)? {
            super::cli::Parsed::Run(f) => f,
            super::cli::Parsed::Help => return Ok(Command::Help),
            super::cli::Parsed::Version => return Ok(Command::Version),
        };
        let super::cli::Flags {
            opts,
            mut source,
            mountpoint,
            mut debug,
            single,
            stats,
        } = flags;
        let (mut mount, rest) = MountOptions::parse_known(&opts.join(",")).map_err(|e| e.to_string())?;
        let mut session = SessionConfig {
            // The statistics file reports the peaks of requests in flight.
            track_inflight: stats.is_some(),
            ..SessionConfig::default()
        };
        if single {
            session.workers = 1;
        }
        let mut passthrough = false;
        let mut keeper = false;
        let mut idmap = false;
        for o in rest.iter().filter(|o| !session.take_option(o)) {
            match o.split_once('=') {
                Some(("source", dir)) => source = Some(PathBuf::from(dir)),
                Some(("threads", n)) => return Err(format!("threads={n}: expected a number above 0")),
                None if o == "passthrough" => passthrough = true,
                None if o == "keeper" => keeper = true,
                None if o == "idmap" => idmap = true,
                None if o == "debug" => debug = true,
                None if IGNORED.contains(&o.as_str()) => {}
                _ if o.starts_with("x-") || o.starts_with("comment=") => {}
                _ => return Err(format!("unknown option `{o}`")),
            }
        }
        let source = source.ok_or("no source directory given (SOURCE or -o source=DIR)")?;
        // The kernel checks every access: pathfs acts on the caller's
        // behalf, possibly as root (see the header).
        mount.default_permissions = true;
        mount.fsname.get_or_insert_with(|| "pathfs".into());
        Ok(Command::Run(Box::new(Args {
            mountpoint,
            source,
            mount,
            session,
            passthrough,
            stats,
            debug,
            keeper,
            idmap,
        })))
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use fuse_wire::session::Transport;

        fn run(args: &[&str]) -> Result<Args, String> {
            let v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            match parse(&v)? {
                Command::Run(a) => Ok(*a),
                c => Err(format!("{c:?}")),
            }
        }

        #[test]
        fn passthrough_ll_conventions() {
            let a = run(&["-f", "-o", "source=/srv", "/mnt"]).unwrap();
            assert_eq!(
                (a.source.to_str(), a.mountpoint.to_str()),
                (Some("/srv"), Some("/mnt"))
            );
            assert!(!a.debug && !a.passthrough && a.stats.is_none());
            assert_eq!(a.session.workers, SessionConfig::default().workers);
            assert!(a.mount.default_permissions);
            assert_eq!(a.mount.fsname.as_deref(), Some("pathfs"));
            assert!(run(&["-d", "-o", "source=/srv", "/mnt"]).unwrap().debug);
            assert!(run(&["-o", "source=/srv,debug", "/mnt"]).unwrap().debug);
            assert_eq!(run(&["-s", "-osource=/srv", "/mnt"]).unwrap().session.workers, 1);
            for help in ["-h", "--help"] {
                let v = [help.to_string(), "/mnt".into()];
                assert!(matches!(parse(&v), Ok(Command::Help)));
            }
            assert!(matches!(parse(&["-V".to_string()]), Ok(Command::Version)));
        }

        #[test]
        fn mount_fuse3_form_and_options_after_the_mountpoint() {
            let a = run(&[
                "/data",
                "/mnt",
                "-o",
                "rw,nodev,allow_other,threads=3,uring,passthrough,_netdev",
                "--stats=/tmp/s.json",
            ])
            .unwrap();
            assert_eq!(
                (a.source.to_str(), a.mountpoint.to_str()),
                (Some("/data"), Some("/mnt"))
            );
            assert!(a.mount.allow_other && a.passthrough);
            assert_eq!(a.session.workers, 3);
            assert!(matches!(a.session.transport, Transport::Uring));
            assert_eq!(a.stats.as_deref().and_then(|p| p.to_str()), Some("/tmp/s.json"));
            // -o source= wins over the positional source.
            let a = run(&["dummy", "/mnt", "-o", "source=/real", "--", "-x"]);
            assert_eq!(a.unwrap_err(), "too many arguments: -x");
            let a = run(&["dummy", "/mnt", "-o", "source=/real"]).unwrap();
            assert_eq!(a.source.to_str(), Some("/real"));
        }

        #[test]
        fn errors_say_what_is_wrong() {
            let err = |args: &[&str]| run(args).unwrap_err();
            assert_eq!(
                err(&["/mnt"]),
                "no source directory given (SOURCE or -o source=DIR)"
            );
            assert_eq!(err(&["-o", "source=/s"]), "no mountpoint given");
            assert_eq!(err(&["-x", "-o", "source=/s", "/mnt"]), "unknown argument `-x`");
            assert_eq!(err(&["-o", "source=/s,bogus", "/mnt"]), "unknown option `bogus`");
            assert_eq!(
                err(&["-o", "source=/s,threads=0", "/mnt"]),
                "threads=0: expected a number above 0"
            );
            assert_eq!(err(&["-o"]), "-o needs an option list");
            assert_eq!(err(&["/s", "/mnt", "--stats"]), "--stats needs a file name");
            assert_eq!(err(&["a", "b", "c"]), "too many arguments: c");
        }
    }
}

/// A scratch directory of this machine, removed on drop.
#[cfg(test)]
struct Scratch(PathBuf);

#[cfg(test)]
impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("pathfs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).expect("scratch directory");
        Scratch(p)
    }
}

#[cfg(test)]
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The test kit's conformance battery on a mirror of a scratch directory,
/// through the fake kernel (no mount), the kernel checking permissions as
/// `default_permissions` makes it; the layer's lookup counts are gone once
/// the kernel forgot every node.
#[cfg(test)]
mod battery_tests {
    use super::*;
    use fuse_wire::testing::TestKernel;
    use fuse_wire::testing::battery::Battery;

    #[test]
    fn the_conformance_battery_passes() {
        let s = Scratch::new("battery");
        let k = TestKernel::start(PathFs::new(Mirror::new(s.0.clone()))).expect("the kit starts");
        // A mirror gives new files the caller's owner only when it runs as
        // root (unprivileged, the host makes them the mirror's own).
        let me = fuse_wire::testing::Caller::current();
        let battery = Battery {
            default_permissions: true,
            owner: (me.uid != 0).then_some(me),
            ..Battery::default()
        };
        if let Err(f) = fuse_wire::testing::explorer::Explorer::default().run(&k) {
            panic!("{f}");
        }
        let report = battery.run(&k);
        report.assert_passed();
        if let Err(r) = k.finish_with(Some(&|fs: &PathFs<Mirror>| fs.lookup_counts())) {
            panic!("{r}");
        }
    }
}

/// Resolution of paths longer than `PATH_MAX`, on a scratch directory of
/// this machine (no mount).
#[cfg(test)]
mod deep_tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// Makes `levels` directories `d` one in another below `top` (each
    /// relative to the one above: no single path could name the bottom)
    /// and returns the bottom, opened.
    fn chain(top: &Path, levels: usize) -> File {
        let mut cur = File::open(top).expect("open the top");
        for _ in 0..levels {
            // SAFETY: an fd we hold and a valid C string.
            check(unsafe { libc::mkdirat(cur.as_raw_fd(), c"d".as_ptr(), 0o755) }).expect("mkdirat");
            cur = open_at(&cur, c"d", libc::O_RDONLY | libc::O_DIRECTORY, 0).expect("open level");
        }
        cur
    }

    /// `/d/d/.../d` of `levels` names, and after it `tail`.
    fn path(levels: usize, tail: &str) -> PathBuf {
        let mut p = "/d".repeat(levels);
        p.push_str(tail);
        PathBuf::from(p)
    }

    #[test]
    fn paths_past_path_max_resolve_in_chunks() {
        let s = Scratch::new("chunks");
        // 6,000 levels: some 12,000 bytes, chunks of exactly CHUNK_MAX
        // bytes ("d/" repeated ends a chunk on a slash at CHUNK_MAX).
        let bottom = chain(&s.0, 6000);
        let f = open_at(&bottom, c"f", libc::O_CREAT | libc::O_WRONLY, 0o644).expect("create f");
        let m = Mirror::new(s.0.clone());
        let want = f.metadata().expect("stat f").ino();
        let got = m.node(&path(6000, "/f")).expect("the file at the bottom");
        assert_eq!(got.metadata().expect("fstat").ino(), want);
        // Around the first chunk's end: a relative path of 2 * levels - 1
        // bytes is CHUNK_MAX at 2048 levels.
        for levels in 2040..2060 {
            let d = m
                .node(&path(levels, ""))
                .unwrap_or_else(|e| panic!("level {levels}: {e}"));
            assert!(d.metadata().expect("fstat").is_dir());
        }
        let at = m.at(&path(6000, "/f")).expect("the bottom directory");
        assert_eq!(
            at.dir.metadata().expect("fstat").ino(),
            bottom.metadata().expect("fstat").ino()
        );
        assert_eq!(m.node(&path(6000, "/missing")).err(), Some(Errno::ENOENT));
        assert_eq!(m.node(&path(6001, "")).err(), Some(Errno::ENOENT));
    }

    /// A directory of the path swapped for a symbolic link to the very same
    /// directory, in a later chunk or at a chunk's end, is still refused.
    #[test]
    fn no_chunk_follows_a_symbolic_link() {
        let s = Scratch::new("links");
        let levels = 5000;
        let bottom = chain(&s.0, levels);
        drop(bottom);
        let m = Mirror::new(s.0.clone());
        let target = path(levels, "");
        assert!(m.node(&target).is_ok());
        // Level 2048 ends the first chunk (CHUNK_MAX bytes); level 3000 is
        // inside the second.
        for level in [2048, 3000] {
            let parent = m.node(&path(level - 1, "")).expect("the parent");
            let dir = open_at(&parent, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0).expect("open");
            // SAFETY: an fd we hold and valid C strings.
            check(unsafe { libc::renameat(dir.as_raw_fd(), c"d".as_ptr(), dir.as_raw_fd(), c"x".as_ptr()) })
                .expect("rename");
            // SAFETY: an fd we hold and valid C strings.
            check(unsafe { libc::symlinkat(c"x".as_ptr(), dir.as_raw_fd(), c"d".as_ptr()) })
                .expect("symlink");
            assert_eq!(
                m.node(&target).err(),
                Some(Errno::ELOOP),
                "a link at level {level}"
            );
            assert_eq!(m.at(&target).err(), Some(Errno::ELOOP), "a link at level {level}");
            // SAFETY: an fd we hold and valid C strings.
            check(unsafe { libc::unlinkat(dir.as_raw_fd(), c"d".as_ptr(), 0) }).expect("unlink");
            // SAFETY: an fd we hold and valid C strings.
            check(unsafe { libc::renameat(dir.as_raw_fd(), c"x".as_ptr(), dir.as_raw_fd(), c"d".as_ptr()) })
                .expect("rename back");
            assert!(m.node(&target).is_ok());
        }
    }
}
