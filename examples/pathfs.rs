//! pathfs: a directory of this machine mirrored on the path layer
//! (`fuse_wire::path`): each method is the system call of the same name
//! on `SOURCE/path`, open files are real file descriptors (so a file
//! unlinked while open keeps working), reads are spliced from them;
//! extended attributes are the source's.
//!
//! ```sh
//! pathfs [-o source=DIR,threads=N,uring,passthrough,MOUNT_OPTIONS] [--stats FILE] MOUNTPOINT
//! ```
//!
//! Permission checks are the kernel's (`default_permissions` is always
//! on); new files are given to the caller's uid and gid when pathfs runs as
//! root. `passthrough` opens files in kernel passthrough mode when the
//! kernel allows it. With `--stats FILE` it writes the session's statistics
//! as JSON at exit, with `live_nodes` and `open_files`.

use fuse_wire::path::{PathDirFill, PathFilesystem, PathFs, PathOpened};
use fuse_wire::proto::abi::Kstatfs;
use fuse_wire::reply::ReplyData;
use fuse_wire::session::SessionConfig;
use fuse_wire::{
    CreateRequest, Errno, FallocateRequest, FileAttr, FileKind, InitConfig, InitFlags, LseekRequest,
    MknodRequest, MountOptions, OpenFlags, ReadRequest, RenameFlags, RequestContext, SetattrRequest,
    TimeOrNow, WriteRequest,
};
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub struct Mirror {
    source: PathBuf,
    passthrough: bool,
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

impl Mirror {
    /// A mirror of `source` (without passthrough).
    pub fn new(source: PathBuf) -> Mirror {
        Mirror {
            source,
            passthrough: false,
        }
    }

    fn real(&self, path: &Path) -> PathBuf {
        self.source.join(path.strip_prefix("/").unwrap_or(path))
    }

    /// The attributes of a new node, given to the caller when we are root
    /// (its group stays the directory's in a set-group-ID directory).
    fn created(&self, ctx: &RequestContext<'_>, real: &Path) -> Result<FileAttr, Errno> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let m = std::fs::symlink_metadata(real)?;
        if let Some((uid, gid)) = self.new_owner(ctx, real, &m) {
            std::os::unix::fs::lchown(real, Some(uid), Some(gid))?;
            if !m.is_symlink() && m.mode() & 0o6000 != 0 {
                // chown cleared the set-ID bits the creator asked for.
                std::fs::set_permissions(real, std::fs::Permissions::from_mode(m.mode() & 0o7777))?;
            }
        }
        Ok(FileAttr::from(&std::fs::symlink_metadata(real)?))
    }

    /// [`Self::created`] for the file just created at `real` and open as
    /// `file`: changed through the descriptor, whatever becomes of the name.
    fn created_file(&self, ctx: &RequestContext<'_>, real: &Path, file: &File) -> Result<FileAttr, Errno> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let m = file.metadata()?;
        if let Some((uid, gid)) = self.new_owner(ctx, real, &m) {
            std::os::unix::fs::fchown(file, Some(uid), Some(gid))?;
            if m.mode() & 0o6000 != 0 {
                file.set_permissions(std::fs::Permissions::from_mode(m.mode() & 0o7777))?;
            }
        }
        Ok(FileAttr::from(&file.metadata()?))
    }

    /// The owner to give the new node `real` (attributes `m`), if it must
    /// change: the caller, when we are root.
    fn new_owner(&self, ctx: &RequestContext<'_>, real: &Path, m: &std::fs::Metadata) -> Option<(u32, u32)> {
        use std::os::unix::fs::MetadataExt;
        let sgid_dir = real
            .parent()
            .and_then(|p| p.metadata().ok())
            .is_some_and(|d| d.mode() & 0o2000 != 0);
        let gid = if sgid_dir { m.gid() } else { ctx.gid() };
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        (root && (m.uid(), m.gid()) != (ctx.uid(), gid)).then_some((ctx.uid(), gid))
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

    /// Opens the regular file at `real` with `flags`. The kernel sends OPEN
    /// for regular files only, but the name may have been replaced in the
    /// source behind the mount's back, by a FIFO (whose open blocks), a
    /// device node (whose open acts on the device) or a symbolic link
    /// (which leads anywhere, and we may be root). So the name is opened
    /// `O_PATH | O_NOFOLLOW` (which opens nothing), checked, and reopened
    /// through `/proc/self/fd/N`, that same inode. Anything but a regular
    /// file is answered `ESTALE`: the kernel then looks the name up again
    /// and opens what it finds itself.
    fn open_regular(real: &Path, flags: i32) -> Result<File, Errno> {
        let path = Self::open_path(real, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        if !path.metadata()?.file_type().is_file() {
            return Err(Errno::ESTALE);
        }
        let proc = format!("/proc/self/fd/{}", path.as_raw_fd());
        let flags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW);
        Self::open_path(Path::new(&proc), flags, 0)
    }

    /// `file` as an open file of the layer, with a backing file in
    /// passthrough mode.
    fn opened(&self, ctx: &RequestContext<'_>, file: File) -> PathOpened<File> {
        if !self.passthrough {
            return PathOpened::new(file);
        }
        // The backing file serves every open of the inode (the layer keeps
        // the first): open it for reading and writing when allowed.
        let proc = format!("/proc/self/fd/{}", file.as_raw_fd());
        let rw = std::fs::OpenOptions::new().read(true).write(true).open(&proc);
        let backing = rw
            .or_else(|_| File::open(&proc))
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
            (None, Some(p)) => std::fs::symlink_metadata(self.real(p))?,
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
            // By name, never opening it (a fifo would block an open).
            (None, Some(p)) => {
                let real = self.real(p);
                let c = cpath(&real)?;
                if let Some(perm) = req.perm {
                    // SAFETY: a valid C string.
                    check(unsafe {
                        libc::fchmodat(
                            libc::AT_FDCWD,
                            c.as_ptr(),
                            perm as libc::mode_t,
                            libc::AT_SYMLINK_NOFOLLOW,
                        )
                    })?;
                }
                if req.uid.is_some() || req.gid.is_some() {
                    std::os::unix::fs::lchown(&real, req.uid, req.gid)?;
                }
                if let Some(size) = req.size {
                    // SAFETY: a valid C string.
                    check(unsafe { libc::truncate(c.as_ptr(), size as i64) })?;
                }
                if times {
                    // SAFETY: a valid C string and two timespecs.
                    check(unsafe {
                        libc::utimensat(libc::AT_FDCWD, c.as_ptr(), t.as_ptr(), libc::AT_SYMLINK_NOFOLLOW)
                    })?;
                }
                self.getattr(ctx, path, None)
            }
            (None, None) => Err(Errno::ENOENT),
        }
    }

    fn readlink(&self, _: &RequestContext<'_>, path: &Path) -> Result<Vec<u8>, Errno> {
        Ok(std::fs::read_link(self.real(path))?.into_os_string().into_vec())
    }

    fn mknod(&self, ctx: &RequestContext<'_>, path: &Path, req: MknodRequest) -> Result<FileAttr, Errno> {
        let real = self.real(path);
        let c = cpath(&real)?;
        // SAFETY: a valid C string.
        check(unsafe { libc::mknod(c.as_ptr(), req.mode as libc::mode_t, req.rdev as libc::dev_t) })?;
        self.created(ctx, &real)
    }

    fn mkdir(&self, ctx: &RequestContext<'_>, path: &Path, mode: u32) -> Result<FileAttr, Errno> {
        let real = self.real(path);
        let c = cpath(&real)?;
        // SAFETY: a valid C string.
        check(unsafe { libc::mkdir(c.as_ptr(), mode as libc::mode_t) })?;
        self.created(ctx, &real)
    }

    fn symlink(&self, ctx: &RequestContext<'_>, path: &Path, target: &CStr) -> Result<FileAttr, Errno> {
        let real = self.real(path);
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target.to_bytes()), &real)?;
        self.created(ctx, &real)
    }

    fn link(&self, _: &RequestContext<'_>, from: &Path, to: &Path) -> Result<FileAttr, Errno> {
        std::fs::hard_link(self.real(from), self.real(to))?;
        Ok(FileAttr::from(&std::fs::symlink_metadata(self.real(to))?))
    }

    fn unlink(&self, _: &RequestContext<'_>, path: &Path) -> Result<(), Errno> {
        Ok(std::fs::remove_file(self.real(path))?)
    }

    fn rmdir(&self, _: &RequestContext<'_>, path: &Path) -> Result<(), Errno> {
        Ok(std::fs::remove_dir(self.real(path))?)
    }

    fn rename(
        &self,
        _: &RequestContext<'_>,
        from: &Path,
        to: &Path,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let (a, b) = (cpath(&self.real(from))?, cpath(&self.real(to))?);
        // SAFETY: valid C strings.
        check(unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
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
        let file = Self::open_regular(&self.real(path), flags.bits())?;
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
        let real = self.real(path);
        let flags = req.flags.bits();
        let file = match Self::open_path(
            &real,
            flags | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            req.mode,
        ) {
            Ok(file) => file,
            Err(e) if e == Errno::EEXIST && flags & libc::O_EXCL == 0 => return Err(Errno::ESTALE),
            Err(e) => return Err(e),
        };
        Ok((self.created_file(ctx, &real, &file)?, self.opened(ctx, file)))
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
        let c = cpath(&self.real(path))?;
        // SAFETY: a valid C string; the stream is closed below.
        let dir = unsafe { libc::opendir(c.as_ptr()) };
        if dir.is_null() {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: `dir` is an open stream; `offset` is 0 or a cookie it gave.
        unsafe { libc::seekdir(dir, offset as libc::c_long) };
        loop {
            // SAFETY: `dir` is an open stream; the entry is read before the next call.
            let e = unsafe { libc::readdir(dir) };
            if e.is_null() {
                break;
            }
            // SAFETY: readdir returned a valid entry with a NUL-terminated name.
            let (name, typ, next) =
                unsafe { (CStr::from_ptr((*e).d_name.as_ptr()), (*e).d_type, (*e).d_off) };
            if matches!(name.to_bytes(), b"." | b"..") {
                continue;
            }
            let kind = FileKind::from_mode((typ as u32) << 12).unwrap_or(FileKind::RegularFile);
            if !out.add(name.to_bytes(), kind, next as u64) {
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
        let c = cpath(&self.real(path))?;
        // SAFETY: valid C strings and a buffer of the length given.
        sized(|buf| unsafe { libc::lgetxattr(c.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
    }

    fn listxattr(&self, _: &RequestContext<'_>, path: &Path) -> Result<Vec<u8>, Errno> {
        let c = cpath(&self.real(path))?;
        // SAFETY: a valid C string and a buffer of the length given.
        sized(|buf| unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
    }

    fn setxattr(
        &self,
        _: &RequestContext<'_>,
        path: &Path,
        name: &CStr,
        value: &[u8],
        flags: i32,
    ) -> Result<(), Errno> {
        let c = cpath(&self.real(path))?;
        // SAFETY: valid C strings and a value of the length given.
        check(unsafe {
            libc::lsetxattr(
                c.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        })
    }

    fn removexattr(&self, _: &RequestContext<'_>, path: &Path, name: &CStr) -> Result<(), Errno> {
        let c = cpath(&self.real(path))?;
        // SAFETY: valid C strings.
        check(unsafe { libc::lremovexattr(c.as_ptr(), name.as_ptr()) })
    }

    fn statfs(&self, _: &RequestContext<'_>, path: &Path) -> Result<Kstatfs, Errno> {
        let c = cpath(&self.real(path))?;
        // SAFETY: all-zero is a valid statvfs.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid C string and a statvfs to fill.
        check(unsafe { libc::statvfs(c.as_ptr(), &mut st) })?;
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
        })
    }
}

const USAGE: &str =
    "usage: pathfs -o source=DIR[,threads=N,uring,passthrough,MOUNT_OPTIONS] [--stats FILE] MOUNTPOINT";

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let (mut mountpoint, mut opts, mut stats) = (None, Vec::new(), None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-o" => opts.extend(args.next()),
            "--stats" => stats = args.next().map(PathBuf::from),
            s if !s.starts_with('-') && mountpoint.is_none() => mountpoint = Some(PathBuf::from(s)),
            _ => return usage(),
        }
    }
    let Some(mountpoint) = mountpoint else {
        return usage();
    };
    let Ok((mut mount, ours)) = MountOptions::parse_known(&opts.join(",")) else {
        return usage();
    };
    mount.default_permissions = true;
    mount.fsname.get_or_insert_with(|| "pathfs".into());
    let (mut session, mut fs) = (
        SessionConfig::default(),
        Mirror {
            source: PathBuf::new(),
            passthrough: false,
        },
    );
    for o in ours.into_iter().filter(|o| !session.take_option(o)) {
        match o.split_once('=') {
            Some(("source", dir)) => fs.source = PathBuf::from(dir),
            None if o == "passthrough" => fs.passthrough = true,
            _ => return usage(),
        }
    }
    if !fs.source.is_dir() {
        return usage();
    }
    let fs = PathFs::new(fs);
    let counts = fs.clone();
    match fuse_wire::serve_with(fs, &mountpoint, &mount, session) {
        Ok(report) => {
            if let Some(path) = stats {
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

fn usage() -> ExitCode {
    eprintln!("{USAGE}");
    ExitCode::from(2)
}
