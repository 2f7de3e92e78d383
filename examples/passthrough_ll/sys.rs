//! Thin, safe wrappers around the system calls the filesystem needs.
//!
//! Every `unsafe` block of the example lives here, next to the one libc call
//! it makes. Paths are `&CStr`; results are `io::Result`; descriptors come
//! back as `OwnedFd` so nothing leaks on an error path.

use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The empty path, for the `AT_EMPTY_PATH` calls.
pub const EMPTY: &CStr = c"";

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn check_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// A directory to resolve a path against: an fd, or the working directory.
#[derive(Clone, Copy)]
pub enum Dir<'a> {
    /// `AT_FDCWD`.
    Cwd,
    /// A descriptor.
    Fd(BorrowedFd<'a>),
}

impl Dir<'_> {
    fn raw(self) -> RawFd {
        match self {
            Dir::Cwd => libc::AT_FDCWD,
            Dir::Fd(fd) => fd.as_raw_fd(),
        }
    }
}

/// `/proc/self/fd/N` for `fd`: reaches exactly the inode behind the fd.
pub fn proc_path(fd: BorrowedFd<'_>) -> CString {
    // A formatted integer never contains a NUL byte.
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
}

pub fn openat(dir: Dir<'_>, path: &CStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `path` is a valid NUL-terminated string for the call's duration.
    let r = check(unsafe { libc::openat(dir.raw(), path.as_ptr(), flags | libc::O_CLOEXEC, mode) })?;
    // SAFETY: openat returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// `fstatat(fd, path, flags)`.
pub fn fstatat(dir: Dir<'_>, path: &CStr, flags: libc::c_int) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` is a live, writable stat.
    check(unsafe { libc::fstatat(dir.raw(), path.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// The attributes of the inode behind `fd` itself (works on `O_PATH` fds).
pub fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    fstatat(
        Dir::Fd(fd),
        EMPTY,
        libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
    )
}

pub fn statx(fd: BorrowedFd<'_>, flags: libc::c_int, mask: u32) -> io::Result<libc::statx> {
    // SAFETY: an all-zero `statx` is a valid value of this plain C struct.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the empty path is NUL-terminated and `st` is live and writable.
    check(unsafe { libc::statx(fd.as_raw_fd(), EMPTY.as_ptr(), flags, mask, &mut st) })?;
    Ok(st)
}

pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

pub fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, rdev) }).map(drop)
}

pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

pub fn renameat2(
    olddir: BorrowedFd<'_>,
    old: &CStr,
    newdir: BorrowedFd<'_>,
    new: &CStr,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: both names are NUL-terminated.
    check(unsafe {
        libc::renameat2(
            olddir.as_raw_fd(),
            old.as_ptr(),
            newdir.as_raw_fd(),
            new.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

pub fn linkat(
    olddir: Dir<'_>,
    old: &CStr,
    newdir: BorrowedFd<'_>,
    new: &CStr,
    flags: libc::c_int,
) -> io::Result<()> {
    // SAFETY: both paths are NUL-terminated.
    check(unsafe {
        libc::linkat(
            olddir.raw(),
            old.as_ptr(),
            newdir.as_raw_fd(),
            new.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// The target of the symbolic link behind `fd`.
pub fn readlink_fd(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: the buffer is live and writable for `buf.len()` bytes.
    let n = check_size(unsafe {
        libc::readlinkat(fd.as_raw_fd(), EMPTY.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    })?;
    if n >= buf.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    buf.truncate(n);
    Ok(buf)
}

/// Changes owner and/or group of the inode behind `fd` (`u32::MAX`: keep).
pub fn fchown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: the empty path is NUL-terminated.
    check(unsafe { libc::fchownat(fd.as_raw_fd(), EMPTY.as_ptr(), uid, gid, flags) }).map(drop)
}

pub fn chmod(path: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated.
    check(unsafe { libc::chmod(path.as_ptr(), mode) }).map(drop)
}

pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: plain call on a live descriptor.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) }).map(drop)
}

pub fn truncate(path: &CStr, size: u64) -> io::Result<()> {
    let size = i64::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: `path` is NUL-terminated.
    check(unsafe { libc::truncate(path.as_ptr(), size) }).map(drop)
}

pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    let size = i64::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: plain call on a live descriptor.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), size) }).map(drop)
}

/// `utimensat(dir, path, times, flags)`.
pub fn utimensat(
    dir: Dir<'_>,
    path: &CStr,
    times: &[libc::timespec; 2],
    flags: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated and `times` points at two timespecs.
    check(unsafe { libc::utimensat(dir.raw(), path.as_ptr(), times.as_ptr(), flags) }).map(drop)
}

pub fn futimens(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> io::Result<()> {
    // SAFETY: `times` points at two timespecs.
    check(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) }).map(drop)
}

pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let off = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `buf` is live and writable for `buf.len()` bytes.
    check_size(unsafe { libc::pread64(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), off) })
}

pub fn pwrite(fd: BorrowedFd<'_>, buf: &[u8], offset: u64) -> io::Result<usize> {
    let off = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `buf` is live and readable for `buf.len()` bytes.
    check_size(unsafe { libc::pwrite64(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), off) })
}

pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> io::Result<()> {
    // SAFETY: plain calls on a live descriptor.
    check(unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    })
    .map(drop)
}

/// The filesystem type (`f_type`, a `*_MAGIC` number) of the file behind `fd`.
pub fn fs_type(fd: BorrowedFd<'_>) -> io::Result<i64> {
    // SAFETY: an all-zero `statfs` is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is live and writable.
    check(unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) })?;
    Ok(st.f_type as i64)
}

pub fn fstatvfs(fd: BorrowedFd<'_>) -> io::Result<libc::statvfs> {
    // SAFETY: an all-zero `statvfs` is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is live and writable.
    check(unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

pub fn getxattr(path: &CStr, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: strings are NUL-terminated; `buf` is writable for its length
    // (a zero length with a dangling pointer only asks for the size).
    check_size(unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

pub fn listxattr(path: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `path` is NUL-terminated; `buf` is writable for its length.
    check_size(unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

pub fn setxattr(path: &CStr, name: &CStr, value: &[u8], flags: libc::c_int) -> io::Result<()> {
    // SAFETY: strings are NUL-terminated; `value` is readable for its length.
    check(unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

pub fn removexattr(path: &CStr, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated.
    check(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}

pub fn faccessat(path: &CStr, mask: libc::c_int, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated.
    check(unsafe { libc::faccessat(libc::AT_FDCWD, path.as_ptr(), mask, flags) }).map(drop)
}

/// `fcntl(fd, cmd, &mut lock)` for the `F_OFD_*` lock commands.
pub fn fcntl_lock(fd: BorrowedFd<'_>, cmd: libc::c_int, lock: &mut libc::flock) -> io::Result<()> {
    // SAFETY: the lock commands read and write one `struct flock`, which is live.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), cmd, lock as *mut libc::flock) }).map(drop)
}

/// `fcntl(fd, F_GETFL)`: the open file description's status flags.
pub fn get_fl(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    // SAFETY: plain call on a live descriptor.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })
}

pub fn flock(fd: BorrowedFd<'_>, op: libc::c_int) -> io::Result<()> {
    // SAFETY: plain call on a live descriptor.
    check(unsafe { libc::flock(fd.as_raw_fd(), op) }).map(drop)
}

pub fn fallocate(fd: BorrowedFd<'_>, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    let off = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    let len = i64::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: plain call on a live descriptor.
    check(unsafe { libc::fallocate64(fd.as_raw_fd(), mode, off, len) }).map(drop)
}

pub fn copy_file_range(
    fd_in: BorrowedFd<'_>,
    off_in: u64,
    fd_out: BorrowedFd<'_>,
    off_out: u64,
    len: u64,
    flags: u32,
) -> io::Result<usize> {
    let bad = || io::Error::from_raw_os_error(libc::EINVAL);
    let mut off_in = i64::try_from(off_in).map_err(|_| bad())?;
    let mut off_out = i64::try_from(off_out).map_err(|_| bad())?;
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    // SAFETY: the offsets are live locals the call may update.
    check_size(unsafe {
        libc::copy_file_range(
            fd_in.as_raw_fd(),
            &mut off_in,
            fd_out.as_raw_fd(),
            &mut off_out,
            len,
            flags,
        )
    })
}

pub fn lseek(fd: BorrowedFd<'_>, offset: i64, whence: libc::c_int) -> io::Result<u64> {
    // SAFETY: plain call on a live descriptor.
    let r = unsafe { libc::lseek64(fd.as_raw_fd(), offset, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as u64)
    }
}

/// Reads directory records (`struct linux_dirent64`) into `buf`.
pub fn getdents64(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: getdents64 writes at most `buf.len()` bytes into the live buffer.
    let r = unsafe { libc::syscall(libc::SYS_getdents64, fd.as_raw_fd(), buf.as_mut_ptr(), buf.len()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

pub fn geteuid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::umask(mask) }
}

thread_local! {
    /// This thread's own umask, once it has one (its own `fs_struct`).
    static OWN_UMASK: Cell<Option<u32>> = const { Cell::new(None) };
}

/// Gives this thread the umask `mask`, for the creates it makes next.
///
/// The umask lives in the `fs_struct` that threads share; the first call on
/// a thread gives it a copy of its own (`unshare(CLONE_FS)`: same root and
/// working directory), so that other threads keep theirs. The mask stays
/// until the next call, which makes no system call when the mask is the
/// same (callers usually share one umask): every create on a worker goes
/// through here, so none sees a mask left by another caller.
pub fn thread_umask(mask: u32) -> io::Result<()> {
    match OWN_UMASK.get() {
        Some(current) if current == mask => return Ok(()),
        Some(_) => {}
        // The process's umask is 0 (main), which is what "no mask" needs.
        None if mask == 0 => return Ok(()),
        None => {
            // SAFETY: unshare changes only this thread's kernel state;
            // CLONE_FS is allowed in a multithreaded process.
            check(unsafe { libc::unshare(libc::CLONE_FS) })?;
        }
    }
    set_umask(mask);
    OWN_UMASK.set(Some(mask));
    Ok(())
}

/// Raises the soft limit of open files to the hard limit (without file
/// handles every known inode holds a descriptor).
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is live and writable.
    check(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) })?;
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: `lim` is live and readable.
    check(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) })?;
    Ok(lim.rlim_cur)
}

fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is valid storage; sigemptyset initialises
    // it and sigaddset adds valid signal numbers to it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks `signals` in this thread (and every thread it starts afterwards).
pub fn block_signals(signals: &[libc::c_int]) -> io::Result<()> {
    let set = sigset(signals);
    // SAFETY: `set` is an initialised sigset; the old mask is not wanted.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if r != 0 {
        Err(io::Error::from_raw_os_error(r))
    } else {
        Ok(())
    }
}

/// Waits for one of `signals` (which must be blocked) and returns it.
pub fn wait_signal(signals: &[libc::c_int]) -> io::Result<libc::c_int> {
    let set = sigset(signals);
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is initialised and `sig` is a live, writable int.
    let r = unsafe { libc::sigwait(&set, &mut sig) };
    if r != 0 {
        Err(io::Error::from_raw_os_error(r))
    } else {
        Ok(sig)
    }
}

/// Largest file handle the kernel gives (`MAX_HANDLE_SZ`).
pub const MAX_HANDLE_SZ: usize = 128;

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RawFileHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

impl RawFileHandle {
    /// The filesystem's handle type.
    pub fn handle_type(&self) -> i32 {
        self.handle_type
    }

    /// The opaque handle bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.f_handle[..(self.handle_bytes as usize).min(MAX_HANDLE_SZ)]
    }

    /// A handle of `handle_type` made of `bytes` (at most [`MAX_HANDLE_SZ`];
    /// tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn from_parts(handle_type: i32, bytes: &[u8]) -> Self {
        let n = bytes.len().min(MAX_HANDLE_SZ);
        let mut f_handle = [0u8; MAX_HANDLE_SZ];
        f_handle[..n].copy_from_slice(&bytes[..n]);
        Self {
            handle_bytes: n as u32,
            handle_type,
            f_handle,
        }
    }
}

/// `name_to_handle_at(fd, "", AT_EMPTY_PATH)`: the file handle of the inode
/// behind `fd` (any kind, `O_PATH` too, symbolic links included) and the id
/// of the mount `fd` is on.
pub fn name_to_handle(fd: BorrowedFd<'_>) -> io::Result<(RawFileHandle, i32)> {
    let mut h = RawFileHandle {
        handle_bytes: MAX_HANDLE_SZ as u32,
        handle_type: 0,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `h` is a `struct file_handle` whose handle_bytes says how much
    // room follows; the path is NUL-terminated; `mount_id` is a live int.
    check(unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            &mut h as *mut RawFileHandle,
            &mut mount_id as *mut libc::c_int,
            libc::AT_EMPTY_PATH,
        )
    } as libc::c_int)?;
    Ok((h, mount_id))
}

/// `open_by_handle_at(mount_fd, handle, flags)`: needs `CAP_DAC_READ_SEARCH`.
/// `mount_fd` must not be an `O_PATH` descriptor.
pub fn open_by_handle(
    mount_fd: BorrowedFd<'_>,
    h: &RawFileHandle,
    flags: libc::c_int,
) -> io::Result<OwnedFd> {
    // SAFETY: `h` is a valid `struct file_handle` the call only reads.
    let r = check(unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd.as_raw_fd(),
            h as *const RawFileHandle,
            flags | libc::O_CLOEXEC,
        )
    } as libc::c_int)?;
    // SAFETY: the call returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}
