//! Differential POSIX conformance: every check runs on a plain directory of
//! this machine and on FUSE mounts (the `passthrough_ll` example over a fresh
//! source directory, with several option sets), and each operation's result
//! and errno must be the same on both.
//!
//! A check records every step in a [`Log`]; only values that must agree
//! between filesystems are recorded (sizes, modes, owners, contents, errno
//! names; never inode numbers, devices or creation times). On a mismatch the
//! test fails listing every differing step with both outcomes.
//!
//! Needs root and `/dev/fuse` (skips loudly without, fails under `CI=true`)
//! and the examples built (`cargo test --workspace --all-targets`).

mod common;
mod posix_support;

use posix_support::*;
use std::ffi::CString;
use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// passthrough_ll with the default options (cache=auto, no default_permissions;
/// regular files in kernel passthrough mode when the tests run as root).
const PT: Fs = Fs::Passthrough("");
/// passthrough_ll with reads and writes served by the daemon.
const PT_NOPT: Fs = Fs::Passthrough("no_passthrough");
/// passthrough_ll without the page cache (every read and write goes to the daemon).
const PT_NEVER: Fs = Fs::Passthrough("cache=never");
/// passthrough_ll with the kernel checking permissions.
const PT_DP: Fs = Fs::Passthrough("default_permissions");
/// passthrough_ll with atomic open requested (falls back on kernels without it).
const PT_ATOMIC: Fs = Fs::Passthrough("atomic_open");
/// passthrough_ll without file handles (one descriptor per inode).
const PT_NOFH: Fs = Fs::Passthrough("inode_file_handles=never");
/// passthrough_ll with a one-descriptor cache: nearly every operation
/// reopens its inode by file handle.
const PT_FD1: Fs = Fs::Passthrough("fd_cache=1");
/// passthrough_ll with every WRITE payload left in the pipe and spliced
/// into the source (through the page cache, and without it).
const PT_SPLICE: Fs = Fs::Passthrough("splice_write,splice_write_min=1");
const PT_SPLICE_NEVER: Fs = Fs::Passthrough("cache=never,splice_write,splice_write_min=1");
/// memfs (no backing directory).
const MEM: Fs = Fs::Memfs("");
/// memfs with the kernel checking permissions.
const MEM_DP: Fs = Fs::Memfs("default_permissions");
/// nodefs: an in-memory filesystem on the node layer (the kernel checks permissions).
const NODE: Fs = Fs::Nodefs("");
/// pathfs: a mirror of a source directory on the path layer (the kernel checks permissions).
const PATH: Fs = Fs::Pathfs("");
/// pathfs with its files opened in kernel passthrough mode (reads and writes
/// never reach the daemon).
const PATH_PT: Fs = Fs::Pathfs("passthrough");

// ---------------------------------------------------------------------------
// small wrappers

fn c(p: &Path) -> CString {
    cpath(p)
}

fn mode_of(p: &Path) -> Result<String, i32> {
    stat(p, false).map(|s| format!("{:o}", s.st_mode))
}

fn owner_of(p: &Path) -> Result<(u32, u32), i32> {
    stat(p, false).map(|s| (s.st_uid, s.st_gid))
}

fn create(p: &Path, data: &[u8]) {
    fs::write(p, data).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
}

fn mkdir(p: &Path, mode: u32) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::mkdir(cp.as_ptr(), mode) } as i64)
}

fn rmdir(p: &Path) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::rmdir(cp.as_ptr()) } as i64)
}

fn unlink(p: &Path) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::unlink(cp.as_ptr()) } as i64)
}

fn link(a: &Path, b: &Path) -> Result<i64, i32> {
    let (ca, cb) = (c(a), c(b));
    // SAFETY: valid C strings; flags 0 (do not follow a symlink at `a`).
    chk(unsafe { libc::linkat(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), 0) } as i64)
}

fn symlink(target: &str, p: &Path) -> Result<i64, i32> {
    let ct = CString::new(target).expect("no NUL");
    let cp = c(p);
    // SAFETY: valid C strings.
    chk(unsafe { libc::symlink(ct.as_ptr(), cp.as_ptr()) } as i64)
}

fn readlink(p: &Path) -> Result<String, i32> {
    ioe(fs::read_link(p)).map(|t| t.to_string_lossy().into_owned())
}

fn rename(a: &Path, b: &Path) -> Result<i64, i32> {
    let (ca, cb) = (c(a), c(b));
    // SAFETY: valid C strings.
    chk(unsafe { libc::rename(ca.as_ptr(), cb.as_ptr()) } as i64)
}

fn rename2(a: &Path, b: &Path, flags: u32) -> Result<i64, i32> {
    let (ca, cb) = (c(a), c(b));
    // SAFETY: valid C strings.
    chk(unsafe { libc::renameat2(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), flags) } as i64)
}

fn chmod(p: &Path, mode: u32) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::chmod(cp.as_ptr(), mode) } as i64)
}

fn chown(p: &Path, uid: u32, gid: u32, follow: bool) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe {
        if follow {
            libc::chown(cp.as_ptr(), uid, gid)
        } else {
            libc::lchown(cp.as_ptr(), uid, gid)
        }
    } as i64)
}

fn truncate(p: &Path, len: i64) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::truncate(cp.as_ptr(), len) } as i64)
}

fn ftruncate(fd: &Fd, len: i64) -> Result<i64, i32> {
    // SAFETY: plain syscall on an fd we own.
    chk(unsafe { libc::ftruncate(fd.0, len) } as i64)
}

fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

/// `utimensat(2)`; `times` `None` means "now".
fn utimens(p: &Path, times: Option<[libc::timespec; 2]>, follow: bool) -> Result<i64, i32> {
    let cp = c(p);
    let flags = if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
    let ptr = times.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: valid C string; `ptr` is null or points at two timespecs.
    chk(unsafe { libc::utimensat(libc::AT_FDCWD, cp.as_ptr(), ptr, flags) } as i64)
}

/// A time as `(sec, nsec)`.
type Time = (i64, i64);

/// `(atime, mtime)`.
fn times_of(p: &Path, follow: bool) -> Result<(Time, Time), i32> {
    stat(p, follow).map(|s| ((s.st_atime, s.st_atime_nsec), (s.st_mtime, s.st_mtime_nsec)))
}

fn access(p: &Path, mode: i32) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::access(cp.as_ptr(), mode) } as i64)
}

fn lseek(fd: &Fd, off: i64, whence: i32) -> Result<i64, i32> {
    // SAFETY: plain syscall on an fd we own.
    chk(unsafe { libc::lseek(fd.0, off, whence) })
}

fn fallocate(fd: &Fd, mode: i32, off: i64, len: i64) -> Result<i64, i32> {
    // SAFETY: plain syscall on an fd we own.
    chk(unsafe { libc::fallocate(fd.0, mode, off, len) } as i64)
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn names_in(dir: &Path) -> Result<Vec<String>, i32> {
    let mut v: Vec<String> = ioe(fs::read_dir(dir))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    v.sort();
    Ok(v)
}

// ---------------------------------------------------------------------------
// create and open flags

fn check_open_flags(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    let rw = libc::O_RDWR;
    log.done(
        "O_CREAT|O_EXCL on a new name",
        &open(&f, libc::O_CREAT | libc::O_EXCL | rw, 0o644),
    );
    log.res("shape of the new file", &shape_of(&f, false));
    log.done(
        "O_CREAT|O_EXCL on an existing file",
        &open(&f, libc::O_CREAT | libc::O_EXCL | rw, 0o644),
    );
    log.done(
        "O_CREAT on an existing file",
        &open(&f, libc::O_CREAT | rw, 0o600),
    );
    log.res("mode unchanged by O_CREAT on an existing file", &mode_of(&f));
    log.done("O_EXCL without O_CREAT", &open(&f, libc::O_EXCL | rw, 0));
    log.done("open a missing name", &open(&ctx.p("missing"), rw, 0));
    log.done(
        "O_CREAT in a missing directory",
        &open(&ctx.p("nodir/x"), libc::O_CREAT | rw, 0o644),
    );
    log.done(
        "O_CREAT below a regular file",
        &open(&ctx.p("f/x"), libc::O_CREAT | rw, 0o644),
    );
    let long = "n".repeat(256);
    log.done(
        "O_CREAT with a 256-byte name",
        &open(&ctx.p(&long), libc::O_CREAT | rw, 0o644),
    );
    let ok255 = "m".repeat(255);
    log.done(
        "O_CREAT with a 255-byte name",
        &open(&ctx.p(&ok255), libc::O_CREAT | rw, 0o644),
    );

    create(&f, b"hello world");
    log.done(
        "O_TRUNC on a file with data",
        &open(&f, libc::O_TRUNC | libc::O_WRONLY, 0),
    );
    log.res("content after O_TRUNC", &content(&f));
    create(&f, b"hello world");
    log.done("O_RDONLY|O_TRUNC", &open(&f, libc::O_TRUNC | libc::O_RDONLY, 0));
    log.res("content after O_RDONLY|O_TRUNC", &content(&f));
    log.done(
        "O_CREAT|O_TRUNC on an existing file",
        &open(&f, libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY, 0o600),
    );
    log.res("size after O_CREAT|O_TRUNC", &shape_of(&f, false));

    create(&f, b"0123456789");
    match open(&f, libc::O_WRONLY | libc::O_APPEND, 0) {
        Ok(fd) => {
            log.res("O_APPEND write", &write(&fd, b"ab"));
            log.res("O_APPEND pwrite at 0 (Linux appends)", &pwrite(&fd, b"cd", 0));
            log.res("O_APPEND position", &lseek(&fd, 0, libc::SEEK_CUR));
            log.res("O_APPEND after lseek to 0", &{
                let _ = lseek(&fd, 0, libc::SEEK_SET);
                write(&fd, b"ef")
            });
        }
        Err(e) => log.val("open O_APPEND", errno_name(e)),
    }
    log.res(
        "content after O_APPEND writes",
        &content(&f).map(|b| String::from_utf8_lossy(&b).into_owned()),
    );

    let d = ctx.p("dir");
    log.res("mkdir", &mkdir(&d, 0o755));
    log.done(
        "O_DIRECTORY on a regular file",
        &open(&f, libc::O_DIRECTORY | libc::O_RDONLY, 0),
    );
    log.done(
        "O_DIRECTORY on a directory",
        &open(&d, libc::O_DIRECTORY | libc::O_RDONLY, 0),
    );
    log.done("O_WRONLY on a directory", &open(&d, libc::O_WRONLY, 0));
    log.done(
        "O_CREAT on a directory",
        &open(&d, libc::O_CREAT | libc::O_RDONLY, 0o644),
    );
    log.done(
        "O_CREAT|O_EXCL on a directory",
        &open(&d, libc::O_CREAT | libc::O_EXCL | rw, 0o644),
    );

    log.res(
        "symlink to a missing name",
        &symlink("target", &ctx.p("dangling")),
    );
    log.done(
        "O_CREAT|O_EXCL on a dangling symlink",
        &open(&ctx.p("dangling"), libc::O_CREAT | libc::O_EXCL | rw, 0o644),
    );
    log.done(
        "O_NOFOLLOW on a symlink",
        &open(&ctx.p("dangling"), libc::O_NOFOLLOW | rw, 0),
    );
    log.done(
        "O_CREAT through a dangling symlink",
        &open(&ctx.p("dangling"), libc::O_CREAT | rw, 0o640),
    );
    log.res(
        "the symlink's target was created",
        &shape_of(&ctx.p("target"), false),
    );

    // A mode with every bit: the umask (022 for the test process) applies.
    log.done(
        "O_CREAT mode 07777",
        &open(&ctx.p("allbits"), libc::O_CREAT | rw, 0o7777),
    );
    log.res("mode of the 07777 file", &mode_of(&ctx.p("allbits")));
    log.done("O_CREAT mode 0", &open(&ctx.p("nobits"), libc::O_CREAT | rw, 0));
    log.done(
        "root opens a mode-0 file for writing",
        &open(&ctx.p("nobits"), rw, 0),
    );

    // O_DIRECT with aligned buffers and offsets.
    let dp = ctx.p("direct");
    match open(&dp, libc::O_CREAT | libc::O_DIRECT | rw, 0o644) {
        Ok(fd) => {
            log.val("open O_DIRECT", "ok");
            let a = AlignedBuf::from_slice(&pattern(8192, 7));
            log.res("O_DIRECT pwrite 8192 at 0", &pwrite(&fd, &a, 0));
            log.res("O_DIRECT pwrite 8192 at 16384", &pwrite(&fd, &a, 16384));
            let mut r = AlignedBuf::new(8192);
            log.res("O_DIRECT pread 8192 at 16384", &pread_into(&fd, &mut r, 16384));
            log.val("O_DIRECT read-back content", digest(&r));
            log.res(
                "O_DIRECT pread 8192 at 8192 (hole)",
                &pread_into(&fd, &mut r, 8192),
            );
            log.val("hole reads as zeros", r.iter().all(|&b| b == 0));
            log.res("O_DIRECT pread at EOF", &pread_into(&fd, &mut r, 24576));
        }
        Err(e) => log.val("open O_DIRECT", errno_name(e)),
    }
    log.res("size after O_DIRECT writes", &shape_of(&dp, false));
    log.res("content after O_DIRECT writes", &content(&dp).map(|b| digest(&b)));
}

#[test]
fn open_flags() {
    differential(
        "open_flags",
        check_open_flags,
        &[
            PT,
            PT_NOFH,
            PT_NEVER,
            PT_DP,
            PT_SPLICE,
            PT_SPLICE_NEVER,
            MEM,
            NODE,
            PATH,
        ],
    );
}

#[test]
fn open_flags_with_atomic_open_requested() {
    differential("open_flags (atomic_open)", check_open_flags, &[PT_ATOMIC]);
}

// ---------------------------------------------------------------------------
// read and write at offsets

fn check_read_write(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    let fd = open(&f, libc::O_CREAT | libc::O_RDWR, 0o644).expect("create");
    log.res("pwrite abc at 0", &pwrite(&fd, b"abc", 0));
    log.res("pwrite xyz at 10", &pwrite(&fd, b"xyz", 10));
    log.res("size", &fstat(&fd).map(|s| s.st_size));
    log.res("pread 100 at 0", &pread(&fd, 100, 0));
    log.res("pread 5 at 11 (short at EOF)", &pread(&fd, 5, 11));
    log.res("pread at EOF", &pread(&fd, 5, 13));
    log.res("pread far past EOF", &pread(&fd, 5, 1 << 30));
    log.res("pwrite at 1 MiB", &pwrite(&fd, b"end", 1 << 20));
    log.res("size after writing past EOF", &fstat(&fd).map(|s| s.st_size));
    log.res(
        "the hole reads as zeros",
        &pread(&fd, 8192, 4096).map(|b| (b.len(), b.iter().all(|&x| x == 0))),
    );
    log.res("pwrite at a negative offset", &pwrite(&fd, b"x", -1));
    log.res("pread at a negative offset", &pread(&fd, 1, -1));
    if !ctx.is_memfs() {
        // ext4's file size limit, and the errno the daemon must pass on.
        log.res("pwrite at 16 TiB", &pwrite(&fd, b"x", 1 << 44));
        log.backing_specific();
    }
    log.res("pwrite of 0 bytes past EOF", &pwrite(&fd, b"", 5 << 20));
    log.res("size unchanged by an empty write", &fstat(&fd).map(|s| s.st_size));
    let big = pattern((1 << 20) + 13, 3);
    log.res("pwrite 1 MiB + 13 at 7", &pwrite(&fd, &big, 7));
    log.res("pread it back", &pread(&fd, big.len(), 7).map(|b| b == big));
    log.res("lseek SEEK_END", &lseek(&fd, 0, libc::SEEK_END));
    log.res("write at the end position", &write(&fd, b"tail"));
    log.res("lseek SEEK_CUR", &lseek(&fd, 0, libc::SEEK_CUR));
    log.res("lseek past EOF", &lseek(&fd, 10 << 20, libc::SEEK_SET));
    log.res("size unchanged by lseek", &fstat(&fd).map(|s| s.st_size));
    log.res("lseek to a negative offset", &lseek(&fd, -5, libc::SEEK_SET));
    drop(fd);
    log.res("whole content", &content(&f).map(|b| digest(&b)));

    let ro = open(&f, libc::O_RDONLY, 0).expect("open ro");
    log.res("write on an O_RDONLY fd", &write(&ro, b"x"));
    let wo = open(&f, libc::O_WRONLY, 0).expect("open wo");
    log.res("read on an O_WRONLY fd", &pread(&wo, 1, 0));

    // Two descriptors see each other's writes at once.
    let a = open(&f, libc::O_RDWR, 0).expect("open a");
    let b = open(&f, libc::O_RDWR, 0).expect("open b");
    log.res("write through one fd", &pwrite(&a, b"SHARED", 100));
    log.res("read through another", &pread(&b, 6, 100));
    log.res("extend through one fd", &pwrite(&a, b"MORE", 3 << 20));
    log.res("size seen through the other", &fstat(&b).map(|s| s.st_size));
}

#[test]
fn read_write_offsets() {
    differential(
        "read_write_offsets",
        check_read_write,
        &[
            PT,
            PT_NOFH,
            PT_NEVER,
            PT_SPLICE,
            PT_SPLICE_NEVER,
            MEM,
            NODE,
            PATH,
            PATH_PT,
        ],
    );
}

// ---------------------------------------------------------------------------
// truncate and ftruncate

fn check_truncate(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    create(&f, &pattern(1000, 1));
    log.res("truncate to 100", &truncate(&f, 100));
    log.res("content", &content(&f).map(|b| digest(&b)));
    log.res("truncate to 5000", &truncate(&f, 5000));
    log.res("content after growing", &content(&f).map(|b| digest(&b)));
    log.res("truncate to -1", &truncate(&f, -1));
    if !ctx.is_memfs() {
        log.res("truncate to 16 TiB", &truncate(&f, 1 << 44));
        log.backing_specific();
    }
    log.res("truncate to 0", &truncate(&f, 0));
    log.res("shape", &shape_of(&f, false));
    log.res("mkdir", &mkdir(&ctx.p("d"), 0o755));
    log.res("truncate a directory", &truncate(&ctx.p("d"), 0));
    log.res("truncate a missing name", &truncate(&ctx.p("missing"), 0));
    log.res("truncate through a symlink", &{
        let _ = symlink("f", &ctx.p("s"));
        create(&f, b"0123456789");
        truncate(&ctx.p("s"), 4)
    });
    log.res("content after truncate through a symlink", &content(&f));

    let ro = open(&f, libc::O_RDONLY, 0).expect("open ro");
    log.res("ftruncate on an O_RDONLY fd", &ftruncate(&ro, 0));
    let fd = open(&f, libc::O_RDWR, 0).expect("open rw");
    log.res("ftruncate to 2", &ftruncate(&fd, 2));
    log.res("fstat size", &fstat(&fd).map(|s| s.st_size));
    log.res("read after ftruncate", &pread(&fd, 10, 0));
    log.res("ftruncate to 70000", &ftruncate(&fd, 70000));
    log.res(
        "read across the new zeros",
        &pread(&fd, 70000, 0).map(|b| digest(&b)),
    );
    log.res("ftruncate to -5", &ftruncate(&fd, -5));
    log.res("other fd sees the size", &fstat(&ro).map(|s| s.st_size));
    let app = open(&f, libc::O_WRONLY | libc::O_APPEND, 0).expect("open append");
    log.res("ftruncate on an O_APPEND fd", &ftruncate(&app, 1));
    log.res("final content", &content(&f).map(|b| digest(&b)));
}

#[test]
fn truncate_and_ftruncate() {
    differential(
        "truncate",
        check_truncate,
        &[PT, PT_NOPT, PT_NEVER, MEM, NODE, PATH, PATH_PT],
    );
}

// ---------------------------------------------------------------------------
// chmod, chown, utimensat as root

fn check_attrs_as_root(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    create(&f, b"data");
    log.res("chmod 0600", &chmod(&f, 0o600));
    log.res("mode", &mode_of(&f));
    log.res("chmod 07777", &chmod(&f, 0o7777));
    log.res("mode", &mode_of(&f));
    log.res("chown 65534:65534", &chown(&f, NOBODY, NOGROUP, true));
    log.res(
        "owner and mode after chown of a setuid file",
        &shape_of(&f, false),
    );
    log.res("chmod 06755", &chmod(&f, 0o6755));
    log.res("chown -1:0", &chown(&f, u32::MAX, 0, true));
    log.res("owner and mode after chgrp", &shape_of(&f, false));
    log.res("chown -1:-1", &chown(&f, u32::MAX, u32::MAX, true));
    log.res("chmod a missing name", &chmod(&ctx.p("missing"), 0o644));
    log.res("chown a missing name", &chown(&ctx.p("missing"), 0, 0, true));

    log.res(
        "utimensat explicit times",
        &utimens(&f, Some([ts(1000, 123_456_789), ts(2000, 987_654_321)]), true),
    );
    log.res("times", &times_of(&f, true));
    log.res(
        "utimensat UTIME_OMIT atime",
        &utimens(&f, Some([ts(0, libc::UTIME_OMIT), ts(3000, 5)]), true),
    );
    log.res("times", &times_of(&f, true));
    log.res(
        "utimensat UTIME_NOW mtime",
        &utimens(&f, Some([ts(0, libc::UTIME_OMIT), ts(0, libc::UTIME_NOW)]), true),
    );
    log.res(
        "mtime is now, atime kept",
        &times_of(&f, true).map(|(a, m)| (a, (now_secs() - m.0).abs() < 60)),
    );
    log.res("utimensat NULL", &utimens(&f, None, true));
    log.res(
        "both times are now",
        &times_of(&f, true).map(|(a, m)| ((now_secs() - a.0).abs() < 60, (now_secs() - m.0).abs() < 60)),
    );
    log.res(
        "utimensat with a bad nsec",
        &utimens(&f, Some([ts(1, 2_000_000_000), ts(1, 0)]), true),
    );
    log.res(
        "utimensat before 1970",
        &utimens(&f, Some([ts(-100, 0), ts(-200, 0)]), true),
    );
    log.res("times before 1970", &times_of(&f, true));

    // A symlink's own times and owner, not its target's.
    log.res("symlink", &symlink("f", &ctx.p("s")));
    log.res(
        "utimensat AT_SYMLINK_NOFOLLOW",
        &utimens(&ctx.p("s"), Some([ts(5000, 0), ts(6000, 0)]), false),
    );
    log.res("the link's times", &times_of(&ctx.p("s"), false));
    log.res(
        "the target's times",
        &times_of(&f, false).map(|(_, m)| m.0 == 6000),
    );
    log.res("lchown the link", &chown(&ctx.p("s"), 1, 2, false));
    log.res("the link's owner", &owner_of(&ctx.p("s")));
    log.res("the target's owner", &owner_of(&f));

    let d = ctx.p("d");
    log.res("mkdir", &mkdir(&d, 0o755));
    log.res("chmod a directory 01777", &chmod(&d, 0o1777));
    log.res("chmod a directory 02755", &chmod(&d, 0o2755));
    log.res("directory mode", &mode_of(&d));
    log.res("chown a directory", &chown(&d, 7, 8, true));
    log.res("directory shape", &shape_of(&d, false));
}

#[test]
fn attrs_as_root() {
    differential(
        "attrs_as_root",
        check_attrs_as_root,
        &[PT, PT_NOPT, PT_NOFH, PT_FD1, PT_DP, MEM, NODE, PATH],
    );
}

// ---------------------------------------------------------------------------
// permissions as an unprivileged user

fn check_attrs_unprivileged(ctx: &Ctx, log: &mut Log) {
    let rootf = ctx.p("rootf");
    create(&rootf, b"root's");
    set_mode(&rootf, 0o644);
    let rootdir = ctx.p("rootdir");
    fs::create_dir(&rootdir).expect("mkdir rootdir");
    set_mode(&rootdir, 0o755);
    create(&rootdir.join("x"), b"x");
    let pubdir = ctx.p("pub");
    fs::create_dir(&pubdir).expect("mkdir pub");
    set_mode(&pubdir, 0o777);
    let sticky = ctx.p("sticky");
    fs::create_dir(&sticky).expect("mkdir sticky");
    set_mode(&sticky, 0o1777);
    create(&sticky.join("rootowned"), b"r");
    set_mode(&sticky.join("rootowned"), 0o666);
    let theirs = pubdir.join("theirs");
    create(&theirs, b"theirs");
    set_owner(&theirs, NOBODY, 0);
    set_mode(&theirs, 0o644);
    let secret = ctx.p("secret");
    create(&secret, b"secret");
    set_mode(&secret, 0o600);

    let sub = as_user(NOBODY, NOGROUP, &[], || {
        let mut log = Log::default();
        log.res("read a 0644 root file", &content(&rootf));
        log.res("read a 0600 root file", &content(&secret));
        log.done(
            "open a 0644 root file for writing",
            &open(&rootf, libc::O_WRONLY, 0),
        );
        log.done(
            "O_TRUNC a 0644 root file",
            &open(&rootf, libc::O_WRONLY | libc::O_TRUNC, 0),
        );
        log.res("truncate a 0644 root file", &truncate(&rootf, 0));
        log.res("chmod a root file", &chmod(&rootf, 0o666));
        log.res("chown a root file to me", &chown(&rootf, NOBODY, NOGROUP, true));
        log.res(
            "utimensat explicit on a root file",
            &utimens(&rootf, Some([ts(1, 0), ts(2, 0)]), true),
        );
        log.res("utimensat now on a root file", &utimens(&rootf, None, true));
        log.res("access W_OK on a root file", &access(&rootf, libc::W_OK));
        log.res("access R_OK on a root file", &access(&rootf, libc::R_OK));
        log.res("access X_OK on a root file", &access(&rootf, libc::X_OK));
        log.done(
            "create in a 0755 root directory",
            &open(&rootdir.join("new"), libc::O_CREAT | libc::O_WRONLY, 0o644),
        );
        log.res(
            "mkdir in a 0755 root directory",
            &mkdir(&rootdir.join("newd"), 0o755),
        );
        log.res("unlink in a 0755 root directory", &unlink(&rootdir.join("x")));
        log.res(
            "rename out of a 0755 root directory",
            &rename(&rootdir.join("x"), &pubdir.join("x")),
        );
        log.res(
            "symlink in a 0755 root directory",
            &symlink("x", &rootdir.join("l")),
        );
        log.res(
            "link into a 0755 root directory",
            &link(&theirs, &rootdir.join("h")),
        );
        log.res(
            "unlink someone else's file in a sticky dir",
            &unlink(&sticky.join("rootowned")),
        );
        log.res(
            "rename someone else's file in a sticky dir",
            &rename(&sticky.join("rootowned"), &sticky.join("moved")),
        );
        log.res("write someone else's 0666 file in a sticky dir", &{
            open(&sticky.join("rootowned"), libc::O_WRONLY, 0).and_then(|fd| write(&fd, b"w"))
        });

        let mine = pubdir.join("mine");
        log.done(
            "create my file",
            &open(&mine, libc::O_CREAT | libc::O_RDWR, 0o644),
        );
        log.res("chmod my file", &chmod(&mine, 0o600));
        log.res("mode", &mode_of(&mine));
        log.res("chown my file to root", &chown(&mine, 0, u32::MAX, true));
        log.res(
            "chgrp my file to a group I am not in",
            &chown(&mine, u32::MAX, 0, true),
        );
        log.res(
            "chgrp my file to my group",
            &chown(&mine, u32::MAX, NOGROUP, true),
        );
        log.res("chown my file to myself", &chown(&mine, NOBODY, u32::MAX, true));
        log.res(
            "utimensat explicit on my file",
            &utimens(&mine, Some([ts(10, 1), ts(20, 2)]), true),
        );
        log.res("times", &times_of(&mine, true));
        log.res("chmod my file 0 then open it", &{
            let _ = chmod(&mine, 0);
            open(&mine, libc::O_RDONLY, 0).map(|_| ())
        });
        log.res("chmod it back", &chmod(&mine, 0o644));
        log.res("chmod 04755 on my file", &chmod(&mine, 0o4755));
        log.res("mode", &mode_of(&mine));
        log.res("write to my setuid file", &{
            open(&mine, libc::O_WRONLY, 0).and_then(|fd| write(&fd, b"clears setuid"))
        });
        log.res("mode after the write", &mode_of(&mine));
        // A file of mine whose group I am not in: setting S_ISGID is ignored.
        log.res("chmod 02755 on my file in group root", &chmod(&theirs, 0o2755));
        log.res("mode", &mode_of(&theirs));
        log.res("truncate my file", &truncate(&theirs, 2));
        log.res("content", &content(&theirs));
        log
    });
    log.extend(sub);
    log.res("root's file after all that", &content(&rootf));
    log.res("root's file shape", &shape_of(&rootf, false));
    log.res("sticky dir listing", &names_in(&sticky));
    log.res("root dir listing", &names_in(&rootdir));
}

#[test]
fn permissions_unprivileged_with_default_permissions() {
    differential(
        "permissions (default_permissions)",
        check_attrs_unprivileged,
        &[PT_DP, MEM_DP, NODE, PATH],
    );
}

#[test]
fn permissions_unprivileged_without_default_permissions() {
    differential(
        "permissions (no default_permissions)",
        check_attrs_unprivileged,
        &[PT, PT_NOPT, MEM],
    );
}

// ---------------------------------------------------------------------------
// hard links

fn check_links(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    create(&f, b"linked");
    log.res("link", &link(&f, &ctx.p("g")));
    log.res("shape of f", &shape_of(&f, false));
    log.res("shape of g", &shape_of(&ctx.p("g"), false));
    log.res("content of g", &content(&ctx.p("g")));
    log.res("link onto an existing name", &link(&f, &ctx.p("g")));
    log.res("link a missing name", &link(&ctx.p("missing"), &ctx.p("h")));
    log.res("mkdir", &mkdir(&ctx.p("d"), 0o755));
    log.res("link a directory", &link(&ctx.p("d"), &ctx.p("d2")));
    log.res("link into a missing directory", &link(&f, &ctx.p("nodir/x")));
    log.res("link into a subdirectory", &link(&f, &ctx.p("d/f")));
    log.res("nlink now", &stat(&f, false).map(|s| s.st_nlink));
    let fd = open(&ctx.p("g"), libc::O_WRONLY | libc::O_APPEND, 0).expect("open g");
    log.res("append through one name", &write(&fd, b"+more"));
    log.res("read through the other", &content(&ctx.p("d/f")));
    log.res("unlink f", &unlink(&f));
    log.res("shape of g after unlink", &shape_of(&ctx.p("g"), false));
    log.res("fstat nlink after unlink", &fstat(&fd).map(|s| s.st_nlink));
    log.res("unlink a missing name", &unlink(&f));
    log.res("unlink a directory", &unlink(&ctx.p("d")));
    log.res("symlink", &symlink("g", &ctx.p("s")));
    log.res("link a symlink (not followed)", &link(&ctx.p("s"), &ctx.p("s2")));
    log.res("the new link is a symlink", &shape_of(&ctx.p("s2"), false));
    log.res("readlink it", &readlink(&ctx.p("s2")));
    log.res(
        "g's nlink is unchanged",
        &stat(&ctx.p("g"), false).map(|s| s.st_nlink),
    );
    log.res("listing", &names_in(&ctx.root));
}

#[test]
fn hard_links() {
    differential(
        "hard_links",
        check_links,
        &[PT, PT_NOPT, PT_NOFH, PT_FD1, MEM, NODE, PATH],
    );
}

// ---------------------------------------------------------------------------
// symlinks, and symlinks that point out of the filesystem

fn check_symlinks(ctx: &Ctx, log: &mut Log) {
    let s = ctx.p("s");
    log.res("symlink to a missing name", &symlink("t", &s));
    log.res("readlink", &readlink(&s));
    log.res("lstat", &shape_of(&s, false));
    log.res("stat (dangling)", &shape_of(&s, true));
    create(&ctx.p("t"), b"target");
    log.res("stat (followed)", &shape_of(&s, true));
    log.res("read through the link", &content(&s));
    log.res("symlink onto an existing name", &symlink("x", &s));
    log.res("readlink a regular file", &readlink(&ctx.p("t")));
    log.res("readlink a missing name", &readlink(&ctx.p("missing")));
    log.res("symlink with an empty target", &symlink("", &ctx.p("empty")));
    log.res("loop a->b", &symlink("b", &ctx.p("a")));
    log.res("loop b->a", &symlink("a", &ctx.p("b")));
    log.res("stat a loop", &shape_of(&ctx.p("a"), true));
    let long = "L".repeat(4000);
    log.res("symlink with a 4000-byte target", &symlink(&long, &ctx.p("long")));
    log.res("readlink it", &readlink(&ctx.p("long")).map(|t| t.len()));
    log.res(
        "symlink with a 4096-byte target",
        &symlink(&"M".repeat(4096), &ctx.p("toolong")),
    );
    log.res("mkdir", &mkdir(&ctx.p("d"), 0o755));
    log.res("directory symlink", &symlink("d", &ctx.p("dl")));
    log.res("create through a directory symlink", &{
        open(&ctx.p("dl/inner"), libc::O_CREAT | libc::O_WRONLY, 0o644).map(|_| ())
    });
    log.res("it is in the directory", &names_in(&ctx.p("d")));
    log.res("rmdir a directory symlink", &rmdir(&ctx.p("dl")));
    log.res("unlink a directory symlink", &unlink(&ctx.p("dl")));
    log.res("the directory survives", &names_in(&ctx.p("d")));

    // Links pointing outside. The kernel resolves them in the caller's view,
    // as on any filesystem; operations on the link itself must never reach
    // the target.
    let victim = ctx.outside.join("victim");
    create(&victim, b"secret");
    set_mode(&victim, 0o640);
    let before = stat(&victim, false).expect("stat victim");
    let victim_abs = victim.to_string_lossy().into_owned();
    for (name, target) in [("rel", "../outside/victim"), ("abs", victim_abs.as_str())] {
        let l = ctx.p(name);
        log.res(&format!("{name}: symlink out"), &symlink(target, &l));
        log.res(&format!("{name}: read through it"), &content(&l));
        log.res(
            &format!("{name}: lchown the link"),
            &chown(&l, NOBODY, NOGROUP, false),
        );
        log.res(&format!("{name}: the link's owner"), &owner_of(&l));
        log.res(
            &format!("{name}: utimensat the link"),
            &utimens(&l, Some([ts(7, 0), ts(8, 0)]), false),
        );
        log.res(
            &format!("{name}: open O_NOFOLLOW"),
            &open(&l, libc::O_RDONLY | libc::O_NOFOLLOW, 0).map(|_| ()),
        );
        let cl = c(&l);
        let name_x = c"user.escape";
        // SAFETY: valid C strings and a 1-byte value.
        let r = unsafe { libc::lsetxattr(cl.as_ptr(), name_x.as_ptr(), b"x".as_ptr().cast(), 1, 0) };
        log.res(&format!("{name}: lsetxattr on the link"), &chk(r as i64));
        log.res(
            &format!("{name}: hard link to the link"),
            &link(&l, &ctx.p(&format!("{name}-hard"))),
        );
        log.res(
            &format!("{name}: that is a symlink"),
            &stat(&ctx.p(&format!("{name}-hard")), false).map(|s| s.st_mode & libc::S_IFMT),
        );
        log.res(
            &format!("{name}: rename the link"),
            &rename(&l, &ctx.p(&format!("{name}-moved"))),
        );
        log.res(
            &format!("{name}: unlink the link"),
            &unlink(&ctx.p(&format!("{name}-moved"))),
        );
        log.res(
            &format!("{name}: unlink the hard link"),
            &unlink(&ctx.p(&format!("{name}-hard"))),
        );
    }
    let after = stat(&victim, false).expect("stat victim");
    log.val(
        "the outside file is untouched (owner, mode, nlink, mtime, ctime)",
        (
            after.st_uid == before.st_uid && after.st_gid == before.st_gid,
            after.st_mode == before.st_mode,
            after.st_nlink,
            (after.st_mtime, after.st_mtime_nsec) == (before.st_mtime, before.st_mtime_nsec),
            (after.st_ctime, after.st_ctime_nsec) == (before.st_ctime, before.st_ctime_nsec),
        ),
    );
    log.res("its content", &content(&victim));
    let cv = c(&victim);
    let mut buf = [0u8; 16];
    // SAFETY: valid C strings and buffer.
    let r = unsafe {
        libc::lgetxattr(
            cv.as_ptr(),
            c"user.escape".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    log.res("it got no xattr", &chk(r as i64));
    log.res("the outside directory", &names_in(&ctx.outside));
    if let Some(src) = &ctx.source {
        // Nothing of the outside directory may have been copied or linked in.
        let names = names_in(src).unwrap_or_default();
        assert!(
            !names.iter().any(|n| n.contains("victim")),
            "source dir: {names:?}"
        );
    }
}

#[test]
fn symlinks_and_escapes() {
    differential(
        "symlinks",
        check_symlinks,
        &[PT, PT_NOPT, PT_NOFH, PT_FD1, PT_DP, MEM, NODE, PATH],
    );
}

// ---------------------------------------------------------------------------
// rename and renameat2

fn check_rename(ctx: &Ctx, log: &mut Log) {
    let p = |n: &str| ctx.p(n);
    create(&p("a"), b"A");
    create(&p("b"), b"B");
    fs::create_dir(p("d1")).expect("d1");
    fs::create_dir_all(p("d2/s")).expect("d2/s");
    create(&p("d2/x"), b"X");
    fs::create_dir(p("empty")).expect("empty");
    log.res("rename a file over a file", &rename(&p("a"), &p("b")));
    log.res("the target has the source's content", &content(&p("b")));
    log.res("the source is gone", &content(&p("a")));
    log.res("rename a file over a directory", &rename(&p("b"), &p("d1")));
    log.res("rename a directory over a file", &rename(&p("d1"), &p("b")));
    log.res(
        "rename a directory over a non-empty directory",
        &rename(&p("d1"), &p("d2")),
    );
    log.res(
        "rename a directory over an empty one",
        &rename(&p("d1"), &p("empty")),
    );
    log.res("rename a directory into itself", &rename(&p("d2"), &p("d2/s/t")));
    log.res("rename a missing name", &rename(&p("missing"), &p("z")));
    log.res("rename to the same name", &rename(&p("b"), &p("b")));
    log.res("rename into a missing directory", &rename(&p("b"), &p("nodir/b")));
    log.res("rename into a subdirectory", &rename(&p("b"), &p("d2/b")));
    log.res("rename . ", &rename(&p("d2/."), &p("dot")));
    log.res("listing of d2", &names_in(&p("d2")));
    create(&p("c"), b"C");
    create(&p("e"), b"E");
    log.res(
        "NOREPLACE onto an existing name",
        &rename2(&p("c"), &p("e"), libc::RENAME_NOREPLACE),
    );
    log.res(
        "NOREPLACE onto a new name",
        &rename2(&p("c"), &p("c2"), libc::RENAME_NOREPLACE),
    );
    log.res(
        "EXCHANGE two files",
        &rename2(&p("c2"), &p("e"), libc::RENAME_EXCHANGE),
    );
    log.val("contents swapped", (content(&p("c2")), content(&p("e"))));
    log.res(
        "EXCHANGE a file and a directory",
        &rename2(&p("e"), &p("empty"), libc::RENAME_EXCHANGE),
    );
    log.val("types swapped", (mode_of(&p("e")), mode_of(&p("empty"))));
    log.res(
        "EXCHANGE with a missing name",
        &rename2(&p("e"), &p("missing"), libc::RENAME_EXCHANGE),
    );
    log.res(
        "NOREPLACE|EXCHANGE",
        &rename2(&p("e"), &p("c2"), libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE),
    );
    log.res("unknown renameat2 flag", &rename2(&p("e"), &p("c3"), 1 << 10));
    log.res(
        "EXCHANGE across directories",
        &rename2(&p("c2"), &p("d2/x"), libc::RENAME_EXCHANGE),
    );
    log.val("contents after", (content(&p("c2")), content(&p("d2/x"))));
    log.res("link", &link(&p("c2"), &p("c2-link")));
    log.res(
        "rename onto another link of the same file",
        &rename(&p("c2"), &p("c2-link")),
    );
    log.val(
        "both names remain",
        (shape_of(&p("c2"), false), shape_of(&p("c2-link"), false)),
    );
    // An open file keeps its content when another file is renamed over its name.
    let fd = open(&p("c2"), libc::O_RDONLY, 0).expect("open c2");
    create(&p("repl"), b"replacement");
    log.res("rename over an open file", &rename(&p("repl"), &p("c2")));
    log.res("the open fd reads the old content", &pread(&fd, 100, 0));
    log.res("the name reads the new content", &content(&p("c2")));
    log.res("final listing", &names_in(&ctx.root));
    log.res("d2 nlink", &stat(&p("d2"), false).map(|s| s.st_nlink));
}

#[test]
fn rename_and_renameat2() {
    differential(
        "rename",
        check_rename,
        &[PT, PT_NOPT, PT_NOFH, PT_FD1, PT_DP, MEM, NODE, PATH],
    );
}

// ---------------------------------------------------------------------------
// mkdir and rmdir

fn check_dirs(ctx: &Ctx, log: &mut Log) {
    let p = |n: &str| ctx.p(n);
    log.res("mkdir", &mkdir(&p("d"), 0o755));
    log.res("shape", &shape_of(&p("d"), false));
    log.res("mkdir again", &mkdir(&p("d"), 0o755));
    log.res("mkdir in a missing directory", &mkdir(&p("nodir/x"), 0o755));
    create(&p("f"), b"f");
    log.res("mkdir below a file", &mkdir(&p("f/x"), 0o755));
    log.res("mkdir with a trailing slash", &mkdir(&p("t/"), 0o755));
    log.res("mkdir mode 01777", &mkdir(&p("sticky"), 0o1777));
    log.res("mode", &mode_of(&p("sticky")));
    log.res("mkdir mode 0", &mkdir(&p("none"), 0));
    log.res("mode", &mode_of(&p("none")));
    log.res(
        "mkdir inside a mode-0 directory (root)",
        &mkdir(&p("none/in"), 0o755),
    );
    log.res("mkdir d/sub", &mkdir(&p("d/sub"), 0o755));
    create(&p("d/file"), b"x");
    log.res("nlink of d", &stat(&p("d"), false).map(|s| s.st_nlink));
    log.res("rmdir a non-empty directory", &rmdir(&p("d")));
    log.res("rmdir a file", &rmdir(&p("d/file")));
    log.res("unlink a directory", &unlink(&p("d/sub")));
    log.res("rmdir .", &rmdir(&p("d/sub/.")));
    log.res("rmdir ..", &rmdir(&p("d/sub/..")));
    log.res("rmdir a missing name", &rmdir(&p("missing")));
    log.res("rmdir a symlink to a directory", &{
        let _ = symlink("d/sub", &p("sl"));
        rmdir(&p("sl"))
    });
    log.res("rmdir d/sub", &rmdir(&p("d/sub")));
    log.res("nlink of d", &stat(&p("d"), false).map(|s| s.st_nlink));
    log.res("rmdir still non-empty", &rmdir(&p("d")));
    log.res("unlink d/file", &unlink(&p("d/file")));
    log.res("rmdir the empty directory", &rmdir(&p("d")));
    log.res("stat it", &shape_of(&p("d"), false));
    // A directory removed while open: reading it gives nothing more.
    let _ = mkdir(&p("gone"), 0o755);
    let fd = open(&p("gone"), libc::O_RDONLY | libc::O_DIRECTORY, 0).expect("open dir");
    log.res("rmdir an open directory", &rmdir(&p("gone")));
    log.res(
        "fstat nlink of the removed directory",
        &fstat(&fd).map(|s| s.st_nlink),
    );
    let cn = c"x";
    // SAFETY: valid fd and C string.
    let r = unsafe {
        libc::openat(
            fd.0,
            cn.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
            0o644,
        )
    };
    log.res(
        "create in the removed directory",
        &chk(r as i64).map(|fd| drop(Fd(fd as i32))),
    );
    log.res("root listing", &names_in(&ctx.root));
}

#[test]
fn mkdir_and_rmdir() {
    differential(
        "mkdir_rmdir",
        check_dirs,
        &[PT, PT_NOPT, PT_NOFH, PT_FD1, PT_DP, MEM, NODE, PATH],
    );
}

// ---------------------------------------------------------------------------
// readdir of 10k entries with telldir/seekdir

const BIG_DIR_ENTRIES: usize = 10_000;

fn check_readdir_10k(ctx: &Ctx, log: &mut Log) {
    let d = ctx.p("big");
    fs::create_dir(&d).expect("mkdir big");
    for i in 0..BIG_DIR_ENTRIES {
        let name = d.join(format!("entry-{i:05}"));
        if let Err(e) = open(&name, libc::O_CREAT | libc::O_WRONLY, 0o644) {
            log.val(&format!("create entry {i}"), errno_name(e));
            return;
        }
    }
    let cd = c(&d);
    // SAFETY: valid C string.
    let dir = unsafe { libc::opendir(cd.as_ptr()) };
    if dir.is_null() {
        log.val("opendir", errno_name(errno()));
        return;
    }
    // Read everything, remembering telldir() before every entry.
    let read_one = |dir: *mut libc::DIR| -> Option<String> {
        // SAFETY: `dir` is an open DIR stream.
        let e = unsafe { libc::readdir(dir) };
        if e.is_null() {
            return None;
        }
        // SAFETY: `d_name` is NUL-terminated inside the dirent.
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
        Some(name.to_string_lossy().into_owned())
    };
    let mut entries: Vec<(libc::c_long, String)> = Vec::new();
    loop {
        // SAFETY: open DIR stream.
        let pos = unsafe { libc::telldir(dir) };
        match read_one(dir) {
            Some(n) => entries.push((pos, n)),
            None => break,
        }
        if entries.len() > BIG_DIR_ENTRIES * 2 {
            break;
        }
    }
    let mut names: Vec<&str> = entries.iter().map(|(_, n)| n.as_str()).collect();
    names.sort();
    let dups = names.windows(2).filter(|w| w[0] == w[1]).count();
    log.val("entries read (with . and ..)", entries.len());
    log.val("duplicates", dups);
    log.val("has . and ..", (names.contains(&"."), names.contains(&"..")));
    log.val("sorted names", digest(names.join("/").as_bytes()));
    // seekdir back to positions spread over the whole stream, in a scrambled order.
    let mut bad = Vec::new();
    let picks: Vec<usize> = (0..entries.len())
        .step_by(997)
        .chain([entries.len() - 1, 1, 0])
        .collect();
    for (k, &i) in picks.iter().enumerate().rev() {
        let (pos, ref want) = entries[i];
        // SAFETY: open DIR stream and a position telldir returned.
        unsafe { libc::seekdir(dir, pos) };
        let got = read_one(dir);
        if got.as_deref() != Some(want.as_str()) {
            bad.push(format!("#{i}: want {want}, got {got:?}"));
        }
        if k % 3 == 0 {
            // From here, the rest of the stream is exactly what followed the first time.
            let mut rest = 0;
            while read_one(dir).is_some() {
                rest += 1;
            }
            if rest != entries.len() - i - 1 {
                bad.push(format!(
                    "after seekdir to #{i}: {rest} entries followed, not {}",
                    entries.len() - i - 1
                ));
            }
        }
    }
    log.val("seekdir(telldir()) returns to the same entry", bad);
    // SAFETY: open DIR stream.
    unsafe { libc::rewinddir(dir) };
    let mut again = 0;
    while read_one(dir).is_some() {
        again += 1;
    }
    log.val("entries after rewinddir", again);
    // Removing entries while reading: every entry is seen at most once.
    // SAFETY: open DIR stream.
    unsafe { libc::rewinddir(dir) };
    let mut seen = std::collections::HashSet::new();
    let mut twice = 0;
    let mut removed = 0;
    while let Some(n) = read_one(dir) {
        if !seen.insert(n.clone()) {
            twice += 1;
        }
        if n.starts_with("entry-") && unlink(&d.join(&n)).is_ok() {
            removed += 1;
        }
    }
    log.val("entries returned twice while removing", twice);
    log.val("entries removed while reading", removed);
    // SAFETY: open DIR stream, closed once.
    unsafe { libc::closedir(dir) };
    log.res("left in the directory", &names_in(&d).map(|v| v.len()));
    log.res("rmdir", &rmdir(&d));
}

#[test]
fn readdir_10k_telldir_seekdir() {
    differential("readdir_10k", check_readdir_10k, &[PT, PT_NOPT, MEM, NODE, PATH]);
}

/// `readdir(3)`'s `d_ino` is `stat`'s `st_ino`, for each entry but `..`
/// (of a mount's root, outside it): what `find -inum` and `ls -i` use.
fn check_readdir_d_ino(ctx: &Ctx, log: &mut Log) {
    let d = ctx.p("inos");
    fs::create_dir(&d).expect("mkdir inos");
    for n in ["f1", "f2", "f3"] {
        create(&d.join(n), b"x");
    }
    fs::create_dir(d.join("sub")).expect("mkdir sub");
    link(&d.join("f1"), &d.join("f1.link")).expect("link");
    // Some names looked up before the listing, the others only listed.
    for n in [".", "f1", "sub"] {
        let _ = stat(&d.join(n), false);
    }
    let cd = c(&d);
    // SAFETY: valid C string.
    let dir = unsafe { libc::opendir(cd.as_ptr()) };
    assert!(!dir.is_null(), "opendir inos");
    let mut listed = Vec::new();
    loop {
        // SAFETY: `dir` is an open DIR stream.
        let e = unsafe { libc::readdir(dir) };
        if e.is_null() {
            break;
        }
        // SAFETY: `d_name` is NUL-terminated inside the dirent.
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
        // SAFETY: `e` is the entry just read.
        listed.push((name.to_string_lossy().into_owned(), unsafe { (*e).d_ino }));
    }
    // SAFETY: open DIR stream, closed once.
    unsafe { libc::closedir(dir) };
    let mut wrong = Vec::new();
    for (name, d_ino) in &listed {
        if name == ".." {
            continue;
        }
        match stat(&d.join(name), false) {
            Ok(st) if st.st_ino == *d_ino => {}
            other => wrong.push(format!(
                "{name}: d_ino {d_ino}, stat {:?}",
                other.map(|s| s.st_ino)
            )),
        }
    }
    log.val("entries listed", listed.len());
    log.val("entries whose d_ino is not their st_ino", wrong);
    for n in ["f1", "f1.link", "f2", "f3"] {
        let _ = unlink(&d.join(n));
    }
    log.res("rmdir sub", &rmdir(&d.join("sub")));
    log.res("rmdir", &rmdir(&d));
}

#[test]
fn readdir_d_ino_is_st_ino() {
    differential(
        "readdir_d_ino",
        check_readdir_d_ino,
        &[PT, PT_NOPT, MEM, NODE, PATH],
    );
}

/// A caller with a umask of 0 creates a file (0666), a directory (0777)
/// and a fifo (0666): their modes lose no bits, whatever the daemon's own
/// umask (022 for every daemon these tests start).
fn check_umask_of_the_caller_only(ctx: &Ctx, log: &mut Log) {
    let d = ctx.p("masks");
    fs::create_dir(&d).expect("mkdir masks");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("umask 000 && : > f && mkdir d && mkfifo p && umask 027 && : > g")
        .current_dir(&d)
        .status()
        .expect("run sh");
    log.val("sh", out.success());
    for n in ["f", "d", "p", "g"] {
        log.res(&format!("mode of {n}"), &mode_of(&d.join(n)));
    }
    for n in ["f", "p", "g"] {
        let _ = unlink(&d.join(n));
    }
    log.res("rmdir d", &rmdir(&d.join("d")));
    log.res("rmdir", &rmdir(&d));
}

#[test]
fn umask_of_the_caller_only() {
    differential(
        "umask",
        check_umask_of_the_caller_only,
        &[PT, PT_NOPT, MEM, NODE, PATH, PATH_PT],
    );
}

// ---------------------------------------------------------------------------
// extended attributes

fn getx(p: &Path, name: &str, size: usize) -> Result<Vec<u8>, i32> {
    let (cp, cn) = (c(p), CString::new(name).expect("no NUL"));
    let mut buf = vec![0u8; size];
    // SAFETY: valid C strings; `buf` is valid for `size` bytes (or null when 0).
    let r = unsafe {
        libc::getxattr(
            cp.as_ptr(),
            cn.as_ptr(),
            if size == 0 {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast()
            },
            size,
        )
    };
    let n = chk(r as i64)?;
    if size == 0 {
        return Ok(vec![0; n as usize]);
    }
    buf.truncate(n as usize);
    Ok(buf)
}

fn setx(p: &Path, name: &str, val: &[u8], flags: i32, follow: bool) -> Result<i64, i32> {
    let (cp, cn) = (c(p), CString::new(name).expect("no NUL"));
    // SAFETY: valid C strings and value.
    let r = unsafe {
        if follow {
            libc::setxattr(cp.as_ptr(), cn.as_ptr(), val.as_ptr().cast(), val.len(), flags)
        } else {
            libc::lsetxattr(cp.as_ptr(), cn.as_ptr(), val.as_ptr().cast(), val.len(), flags)
        }
    };
    chk(r as i64)
}

fn removex(p: &Path, name: &str) -> Result<i64, i32> {
    let (cp, cn) = (c(p), CString::new(name).expect("no NUL"));
    // SAFETY: valid C strings.
    chk(unsafe { libc::removexattr(cp.as_ptr(), cn.as_ptr()) } as i64)
}

/// `listxattr` with a buffer of `size` (`None`: ask for the size first),
/// keeping only `user.*` names.
fn listx(p: &Path, size: Option<usize>) -> Result<Vec<String>, i32> {
    let cp = c(p);
    let size = match size {
        Some(s) => s,
        // SAFETY: valid C string; a null buffer of size 0 asks for the size.
        None => chk(unsafe { libc::listxattr(cp.as_ptr(), std::ptr::null_mut(), 0) } as i64)? as usize,
    };
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: valid C string and buffer of `size` bytes.
    let n = chk(unsafe { libc::listxattr(cp.as_ptr(), buf.as_mut_ptr().cast(), size) } as i64)?;
    buf.truncate(n as usize);
    let mut names: Vec<String> = buf
        .split(|&b| b == 0)
        .filter(|s| s.starts_with(b"user."))
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    names.sort();
    Ok(names)
}

fn check_xattrs(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    create(&f, b"x");
    log.res("set user.a", &setx(&f, "user.a", b"hello", 0, true));
    log.res("size query", &getx(&f, "user.a", 0).map(|v| v.len()));
    log.res("get", &getx(&f, "user.a", 64));
    log.res("get with a small buffer", &getx(&f, "user.a", 2));
    log.res("get with an exact buffer", &getx(&f, "user.a", 5));
    log.res("get a missing name", &getx(&f, "user.nope", 64));
    log.res(
        "XATTR_CREATE on an existing name",
        &setx(&f, "user.a", b"x", libc::XATTR_CREATE, true),
    );
    log.res(
        "XATTR_REPLACE on a missing name",
        &setx(&f, "user.b", b"x", libc::XATTR_REPLACE, true),
    );
    log.res(
        "XATTR_REPLACE on an existing name",
        &setx(&f, "user.a", b"bye", libc::XATTR_REPLACE, true),
    );
    log.res("get after replace", &getx(&f, "user.a", 64));
    log.res(
        "XATTR_CREATE on a new name",
        &setx(&f, "user.b", b"", libc::XATTR_CREATE, true),
    );
    log.res("get an empty value", &getx(&f, "user.b", 64));
    let big = pattern(4000, 9);
    log.res("set a 4000-byte value", &setx(&f, "user.big", &big, 0, true));
    log.res("get it", &getx(&f, "user.big", 8192).map(|v| v == big));
    log.res(
        "set a 70000-byte value",
        &setx(&f, "user.huge", &pattern(70000, 1), 0, true),
    );
    log.res("list", &listx(&f, None));
    log.res("list with a 1-byte buffer", &listx(&f, Some(1)));
    log.res("set an unknown namespace", &setx(&f, "bogus.a", b"x", 0, true));
    log.res("set an empty name", &setx(&f, "", b"x", 0, true));
    log.res(
        "set a 256-byte name",
        &setx(&f, &format!("user.{}", "n".repeat(251)), b"x", 0, true),
    );
    log.res("remove user.a", &removex(&f, "user.a"));
    log.res("get the removed name", &getx(&f, "user.a", 64));
    log.res("remove it again", &removex(&f, "user.a"));
    log.res("list after remove", &listx(&f, None));
    log.res("mkdir", &mkdir(&ctx.p("d"), 0o755));
    log.res(
        "set on a directory",
        &setx(&ctx.p("d"), "user.d", b"dir", 0, true),
    );
    log.res("get on a directory", &getx(&ctx.p("d"), "user.d", 64));
    log.res("symlink", &symlink("f", &ctx.p("s")));
    log.res(
        "lsetxattr user.* on a symlink",
        &setx(&ctx.p("s"), "user.l", b"x", 0, false),
    );
    log.res(
        "setxattr through a symlink",
        &setx(&ctx.p("s"), "user.t", b"via", 0, true),
    );
    log.res("the target got it", &getx(&f, "user.t", 64));
    log.res("get on a missing file", &getx(&ctx.p("missing"), "user.a", 64));
    let fd = open(&f, libc::O_RDONLY, 0).expect("open");
    let mut buf = [0u8; 16];
    // SAFETY: valid fd, C string and buffer.
    let r = unsafe { libc::fgetxattr(fd.0, c"user.t".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    log.res("fgetxattr", &chk(r as i64).map(|n| buf[..n as usize].to_vec()));
    // SAFETY: valid fd, C string and value.
    let r = unsafe { libc::fsetxattr(fd.0, c"user.fd".as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    log.res("fsetxattr on an O_RDONLY fd", &chk(r as i64));
    let sub = as_user(NOBODY, NOGROUP, &[], || {
        let mut l = Log::default();
        l.res("another user reads user.t", &getx(&f, "user.t", 64));
        l.res(
            "another user sets user.x on root's 0644 file",
            &setx(&f, "user.x", b"x", 0, true),
        );
        l.res("another user removes user.t", &removex(&f, "user.t"));
        l
    });
    log.extend(sub);
    log.res("final list", &listx(&f, None));
}

#[test]
fn xattrs() {
    differential(
        "xattrs",
        check_xattrs,
        &[
            Fs::Passthrough("xattr"),
            Fs::Passthrough("xattr,default_permissions"),
            MEM_DP,
            NODE,
            PATH,
        ],
    );
}

// ---------------------------------------------------------------------------
// POSIX record locks between processes

fn flock_struct(ty: i32, start: i64, len: i64) -> libc::flock {
    libc::flock {
        l_type: ty as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: start,
        l_len: len,
        l_pid: 0,
    }
}

fn setlk(fd: i32, cmd: i32, ty: i32, start: i64, len: i64) -> i64 {
    let fl = flock_struct(ty, start, len);
    // SAFETY: valid fd and flock struct.
    let r = unsafe { libc::fcntl(fd, cmd, &fl) };
    if r < 0 { -(errno() as i64) } else { r as i64 }
}

fn getlk(fd: i32, ty: i32, start: i64, len: i64) -> libc::flock {
    let mut fl = flock_struct(ty, start, len);
    // SAFETY: valid fd and flock struct.
    let r = unsafe { libc::fcntl(fd, libc::F_GETLK, &mut fl) };
    if r < 0 {
        fl.l_type = -(errno() as i16);
    }
    fl
}

/// A blocked child's values with the second (when its call returned)
/// replaced by whether it waited for the release: it was seen asleep in the
/// call, and the call returned after `released_at`.
fn waited_for(mut v: [i64; CHILD_VALUES], blocked: bool, released_at: i64) -> [i64; CHILD_VALUES] {
    v[1] = (blocked && v[1] >= released_at) as i64;
    v
}

fn child_result(log: &mut Log, what: &str, vals: Result<[i64; CHILD_VALUES], String>, names: &[&str]) {
    match vals {
        Ok(v) => {
            for (i, n) in names.iter().enumerate() {
                let x = v[i];
                let s = if x < 0 {
                    errno_name(-x as i32)
                } else {
                    x.to_string()
                };
                log.val(&format!("{what}: {n}"), s);
            }
        }
        Err(e) => log.val(what, e),
    }
}

fn check_posix_locks(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    create(&f, &pattern(1000, 2));
    let cf = c(&f);
    let fd = open(&f, libc::O_RDWR, 0).expect("open");
    log.val(
        "parent: write lock [0,100)",
        setlk(fd.0, libc::F_SETLK, libc::F_WRLCK, 0, 100),
    );
    let own = getlk(fd.0, libc::F_WRLCK, 0, 100);
    log.val("parent: F_GETLK over its own lock", own.l_type);
    let me = std::process::id() as i64;
    // One process owns its locks whatever descriptor it uses.
    let fd_b = open(&f, libc::O_RDWR, 0).expect("open b");
    log.val(
        "parent, second fd: write lock over its own lock",
        setlk(fd_b.0, libc::F_SETLK, libc::F_WRLCK, 0, 10),
    );
    drop(fd_b);
    log.val(
        "parent: write lock [0,100) again",
        setlk(fd.0, libc::F_SETLK, libc::F_WRLCK, 0, 100),
    );

    let child = fork_child(|| {
        // SAFETY: valid C string.
        let cfd = unsafe { libc::open(cf.as_ptr(), libc::O_RDWR) };
        let a = setlk(cfd, libc::F_SETLK, libc::F_WRLCK, 50, 10);
        let b = setlk(cfd, libc::F_SETLK, libc::F_RDLCK, 0, 10);
        let g = getlk(cfd, libc::F_WRLCK, 50, 10);
        let c2 = setlk(cfd, libc::F_SETLK, libc::F_WRLCK, 100, 100);
        let g2 = getlk(cfd, libc::F_RDLCK, 150, 1);
        // SAFETY: trivial getter.
        let ppid = unsafe { libc::getppid() } as i64;
        let who = match g.l_pid as i64 {
            p if p == ppid => 1,
            0 => 0,
            -1 => -1,
            _ => 2,
        };
        [
            a,
            b,
            g.l_type as i64,
            g.l_start,
            g.l_len,
            who,
            c2,
            g2.l_type as i64,
        ]
    });
    child_result(
        log,
        "child vs parent's write lock",
        child.wait(Duration::from_secs(30)),
        &[
            "F_SETLK write [50,60)",
            "F_SETLK read [0,10)",
            "F_GETLK type",
            "F_GETLK start",
            "F_GETLK len",
            "F_GETLK pid (1 = the parent, 0, -1, 2 = another)",
            "F_SETLK write [100,200)",
            "F_GETLK over its own lock (type)",
        ],
    );
    // The child's locks went away when it exited.
    let g = getlk(fd.0, libc::F_WRLCK, 100, 100);
    log.val("parent: F_GETLK after the child exited", g.l_type);

    log.val(
        "parent: downgrade to read lock",
        setlk(fd.0, libc::F_SETLK, libc::F_RDLCK, 0, 100),
    );
    let child = fork_child(|| {
        // SAFETY: valid C string.
        let cfd = unsafe { libc::open(cf.as_ptr(), libc::O_RDWR) };
        let a = setlk(cfd, libc::F_SETLK, libc::F_RDLCK, 0, 10);
        let b = setlk(cfd, libc::F_SETLK, libc::F_WRLCK, 0, 10);
        let g = getlk(cfd, libc::F_WRLCK, 0, 0);
        [a, b, g.l_type as i64, g.l_start, g.l_len, 0, 0, 0]
    });
    child_result(
        log,
        "child vs parent's read lock",
        child.wait(Duration::from_secs(30)),
        &[
            "F_SETLK read [0,10)",
            "F_SETLK write [0,10)",
            "F_GETLK type",
            "F_GETLK start",
            "F_GETLK len",
        ],
    );

    // A blocked F_SETLKW is granted when the parent unlocks.
    log.val(
        "parent: write lock again",
        setlk(fd.0, libc::F_SETLK, libc::F_WRLCK, 0, 100),
    );
    let child = fork_child(|| {
        // SAFETY: valid C string.
        let cfd = unsafe { libc::open(cf.as_ptr(), libc::O_RDWR) };
        let a = setlk(cfd, libc::F_SETLKW, libc::F_WRLCK, 10, 10);
        [a, monotonic_ns(), 0, 0, 0, 0, 0, 0]
    });
    // It waits in fcntl(2) until the unlock, and gets the lock only after it.
    let blocked = child.wait_blocked_in(libc::SYS_fcntl, Duration::from_secs(20));
    let unlocked_at = monotonic_ns();
    log.val(
        "parent: unlock",
        setlk(fd.0, libc::F_SETLK, libc::F_UNLCK, 0, 100),
    );
    child_result(
        log,
        "blocked child",
        child
            .wait(Duration::from_secs(30))
            .map(|v| waited_for(v, blocked, unlocked_at)),
        &["F_SETLKW write [10,20)", "it waited for the unlock"],
    );

    // Closing any descriptor of the file drops the process's locks on it.
    log.val(
        "parent: write lock [0,10)",
        setlk(fd.0, libc::F_SETLK, libc::F_WRLCK, 0, 10),
    );
    drop(open(&f, libc::O_RDONLY, 0).expect("second open"));
    let child = fork_child(|| {
        // SAFETY: valid C string.
        let cfd = unsafe { libc::open(cf.as_ptr(), libc::O_RDWR) };
        [
            setlk(cfd, libc::F_SETLK, libc::F_WRLCK, 0, 10),
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ]
    });
    child_result(
        log,
        "after the parent closed another fd",
        child.wait(Duration::from_secs(30)),
        &["F_SETLK write [0,10)"],
    );
    // Adjacent locks of one type merge, an unlock in the middle splits, a
    // lock of the other type cuts: F_GETLK shows the ranges as held.
    log.val(
        "parent: unlock all",
        setlk(fd.0, libc::F_SETLK, libc::F_UNLCK, 0, 0),
    );
    for (what, ty, start, len) in [
        ("parent: write lock [0,10)", libc::F_WRLCK, 0, 10),
        ("parent: write lock [10,20) (merges)", libc::F_WRLCK, 10, 10),
        ("parent: unlock [5,8) (splits)", libc::F_UNLCK, 5, 3),
        ("parent: read lock [12,14) (cuts)", libc::F_RDLCK, 12, 2),
        ("parent: read lock [30,40)", libc::F_RDLCK, 30, 10),
        ("parent: read lock [40,50) (merges)", libc::F_RDLCK, 40, 10),
    ] {
        log.val(what, setlk(fd.0, libc::F_SETLK, ty, start, len));
    }
    let child = fork_child(|| {
        let mut v = [0i64; CHILD_VALUES];
        // The ranges F_GETLK reports, probing each piece.
        for (i, at) in [0, 9, 12, 15, 35].into_iter().enumerate() {
            // SAFETY: valid C string.
            let cfd = unsafe { libc::open(cf.as_ptr(), libc::O_RDWR) };
            let g = getlk(cfd, libc::F_WRLCK, at, 1);
            v[i] = if g.l_type as i32 == libc::F_UNLCK {
                -1
            } else {
                (g.l_type as i64) << 32 | g.l_start << 16 | g.l_len
            };
        }
        v
    });
    child_result(
        log,
        "child probes the merged and split locks",
        child.wait(Duration::from_secs(30)),
        &[
            "at 0 (type<<32|start<<16|len, -1 free)",
            "at 9",
            "at 12",
            "at 15",
            "at 35",
        ],
    );
    log.val("the parent's pid is not zero", me != 0);
    // An invalid lock type.
    log.val("F_SETLK with a bad type", setlk(fd.0, libc::F_SETLK, 77, 0, 1));
    log.val(
        "F_SETLK with a negative start",
        setlk(fd.0, libc::F_SETLK, libc::F_RDLCK, -1, 1),
    );
}

#[test]
fn posix_locks_between_processes() {
    differential(
        "posix_locks",
        check_posix_locks,
        &[
            PT,
            PT_NOPT,
            Fs::Passthrough("posix_lock"),
            MEM,
            Fs::Memfs("posix_lock"),
        ],
    );
}

// ---------------------------------------------------------------------------
// flock between processes

fn do_flock(fd: i32, op: i32) -> i64 {
    // SAFETY: valid fd.
    let r = unsafe { libc::flock(fd, op) };
    if r < 0 { -(errno() as i64) } else { r as i64 }
}

fn check_flock(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    create(&f, b"flock");
    let cf = c(&f);
    let fd = open(&f, libc::O_RDWR, 0).expect("open");
    log.val("parent: LOCK_EX", do_flock(fd.0, libc::LOCK_EX));
    let probe = || {
        fork_child(|| {
            // SAFETY: valid C string.
            let cfd = unsafe { libc::open(cf.as_ptr(), libc::O_RDONLY) };
            let a = do_flock(cfd, libc::LOCK_SH | libc::LOCK_NB);
            let b = do_flock(cfd, libc::LOCK_EX | libc::LOCK_NB);
            [a, b, 0, 0, 0, 0, 0, 0]
        })
        .wait(Duration::from_secs(30))
    };
    child_result(
        log,
        "child vs LOCK_EX",
        probe(),
        &["LOCK_SH|LOCK_NB", "LOCK_EX|LOCK_NB"],
    );
    log.val("parent: LOCK_SH (convert)", do_flock(fd.0, libc::LOCK_SH));
    child_result(
        log,
        "child vs LOCK_SH",
        probe(),
        &["LOCK_SH|LOCK_NB", "LOCK_EX|LOCK_NB"],
    );
    let fd2 = open(&f, libc::O_RDWR, 0).expect("open 2");
    log.val(
        "parent, second open: LOCK_EX|LOCK_NB",
        do_flock(fd2.0, libc::LOCK_EX | libc::LOCK_NB),
    );
    log.val("parent: LOCK_UN", do_flock(fd.0, libc::LOCK_UN));
    child_result(
        log,
        "child after LOCK_UN",
        probe(),
        &["LOCK_SH|LOCK_NB", "LOCK_EX|LOCK_NB"],
    );
    log.val("parent: LOCK_EX", do_flock(fd.0, libc::LOCK_EX));
    let child = fork_child(|| {
        // SAFETY: valid C string.
        let cfd = unsafe { libc::open(cf.as_ptr(), libc::O_RDONLY) };
        let a = do_flock(cfd, libc::LOCK_EX);
        [a, monotonic_ns(), 0, 0, 0, 0, 0, 0]
    });
    let blocked = child.wait_blocked_in(libc::SYS_flock, Duration::from_secs(20));
    let released_at = monotonic_ns();
    drop(fd);
    child_result(
        log,
        "blocked child, released by close",
        child
            .wait(Duration::from_secs(30))
            .map(|v| waited_for(v, blocked, released_at)),
        &["LOCK_EX", "it waited"],
    );
    log.val("bad operation", do_flock(fd2.0, 0));
}

#[test]
fn flock_between_processes() {
    differential(
        "flock",
        check_flock,
        &[PT, PT_NOPT, Fs::Passthrough("flock"), MEM, Fs::Memfs("flock")],
    );
}

// ---------------------------------------------------------------------------
// mmap coherence

fn check_mmap(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    create(&f, &pattern(16384, 4));
    let fd = open(&f, libc::O_RDWR, 0).expect("open");
    // SAFETY: mapping a valid fd; the result is checked.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            16384,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.0,
            0,
        )
    };
    if m == libc::MAP_FAILED {
        log.val("mmap MAP_SHARED rw", errno_name(errno()));
        return;
    }
    log.val("mmap MAP_SHARED rw", "ok");
    // SAFETY: the mapping is 16384 bytes long and stays mapped until munmap below.
    let map = unsafe { std::slice::from_raw_parts_mut(m.cast::<u8>(), 16384) };
    log.val("the mapping shows the file", digest(map));
    map[100..110].copy_from_slice(b"MAPPEDDATA");
    // SAFETY: valid mapping.
    log.val("msync", unsafe { libc::msync(m, 16384, libc::MS_SYNC) });
    let other = open(&f, libc::O_RDONLY, 0).expect("open 2");
    log.res("read() sees the store", &pread(&other, 10, 100));
    log.res("pwrite", &pwrite(&fd, b"PWRITTEN", 5000));
    log.val(
        "the mapping sees the pwrite",
        String::from_utf8_lossy(&map[5000..5008]).into_owned(),
    );
    // Extend the file and the old mapping's page beyond EOF stays zero.
    log.res("ftruncate to 8192", &ftruncate(&fd, 8192));
    log.res("ftruncate back to 16384", &ftruncate(&fd, 16384));
    log.val(
        "the mapping's truncated part reads zero",
        map[8192..].iter().all(|&b| b == 0),
    );
    map[9000] = 0x5a;
    // SAFETY: valid mapping, unmapped once.
    unsafe {
        libc::msync(m, 16384, libc::MS_SYNC);
        libc::munmap(m, 16384);
    }
    log.res("content after unmapping", &content(&f).map(|b| digest(&b)));
    // A private mapping never reaches the file.
    // SAFETY: mapping a valid fd; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE,
            fd.0,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        log.val("mmap MAP_PRIVATE", errno_name(errno()));
    } else {
        // SAFETY: 4096-byte private mapping.
        unsafe {
            *p.cast::<u8>() = b'!';
            libc::munmap(p, 4096);
        }
        log.res("file unchanged by a private mapping", &pread(&other, 1, 0));
    }
    // SAFETY: mapping a read-only fd shared and writable must fail.
    let q = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            other.0,
            0,
        )
    };
    log.val(
        "MAP_SHARED writable on an O_RDONLY fd",
        if q == libc::MAP_FAILED {
            errno_name(errno())
        } else {
            "ok".into()
        },
    );
    if q != libc::MAP_FAILED {
        // SAFETY: unmapping what we mapped.
        unsafe { libc::munmap(q, 4096) };
    }
}

#[test]
fn mmap_shared_coherence() {
    differential(
        "mmap",
        check_mmap,
        &[
            PT,
            PT_NOPT,
            Fs::Passthrough("cache=always"),
            MEM,
            NODE,
            PATH,
            PATH_PT,
        ],
    );
}

// ---------------------------------------------------------------------------
// statfs

fn check_statfs(ctx: &Ctx, log: &mut Log) {
    let cr = c(&ctx.root);
    // SAFETY: zeroed statfs is a valid out value.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    let r = unsafe { libc::statfs(cr.as_ptr(), &mut s) };
    log.res("statfs", &chk(r as i64));
    log.val("f_bsize", s.f_bsize);
    log.val("f_namelen", s.f_namelen);
    log.val("f_frsize", s.f_frsize);
    // SAFETY: zeroed statvfs is a valid out value.
    let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    let r = unsafe { libc::statvfs(cr.as_ptr(), &mut v) };
    log.res("statvfs", &chk(r as i64));
    log.val("f_namemax", v.f_namemax);
    log.val("f_bsize (statvfs)", v.f_bsize);
}

#[test]
fn statfs_fields() {
    differential("statfs", check_statfs, &[PT, PT_NOPT]);
}

// ---------------------------------------------------------------------------
// fallocate

fn check_fallocate(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    let fd = open(&f, libc::O_CREAT | libc::O_RDWR, 0o644).expect("create");
    log.res("fallocate 1 MiB", &fallocate(&fd, 0, 0, 1 << 20));
    log.res(
        "size and allocated blocks",
        &fstat(&fd).map(|s| (s.st_size, s.st_blocks >= (1 << 20) / 512)),
    );
    log.res(
        "reads as zeros",
        &pread(&fd, 1 << 20, 0).map(|b| b.iter().all(|&x| x == 0)),
    );
    log.res(
        "KEEP_SIZE up to 2 MiB",
        &fallocate(&fd, libc::FALLOC_FL_KEEP_SIZE, 0, 2 << 20),
    );
    log.res("size kept", &fstat(&fd).map(|s| s.st_size));
    log.res("write 64 KiB", &pwrite(&fd, &pattern(65536, 5), 0));
    log.res(
        "PUNCH_HOLE|KEEP_SIZE [4096, 12288)",
        &fallocate(
            &fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            4096,
            8192,
        ),
    );
    log.res(
        "the hole reads as zeros",
        &pread(&fd, 8192, 4096).map(|b| b.iter().all(|&x| x == 0)),
    );
    log.res("before the hole", &pread(&fd, 4096, 0).map(|b| digest(&b)));
    log.res("after the hole", &pread(&fd, 4096, 12288).map(|b| digest(&b)));
    log.res("size after punching", &fstat(&fd).map(|s| s.st_size));
    log.res(
        "PUNCH_HOLE without KEEP_SIZE",
        &fallocate(&fd, libc::FALLOC_FL_PUNCH_HOLE, 0, 4096),
    );
    log.res("fallocate beyond EOF extends", &fallocate(&fd, 0, 3 << 20, 4096));
    log.res("size", &fstat(&fd).map(|s| s.st_size));
    log.res("length 0", &fallocate(&fd, 0, 0, 0));
    log.res("negative offset", &fallocate(&fd, 0, -1, 10));
    let ro = open(&f, libc::O_RDONLY, 0).expect("open ro");
    log.res("on an O_RDONLY fd", &fallocate(&ro, 0, 0, 10));
    let app = open(&f, libc::O_WRONLY | libc::O_APPEND, 0).expect("open append");
    log.res("on an O_APPEND fd", &fallocate(&app, 0, 0, 10));
    log.res("final content", &content(&f).map(|b| digest(&b)));
}

#[test]
fn fallocate_modes() {
    differential(
        "fallocate",
        check_fallocate,
        &[PT, PT_NOPT, PT_NEVER, MEM, NODE, PATH],
    );
}

// ---------------------------------------------------------------------------
// SEEK_DATA / SEEK_HOLE

fn check_seek_data_hole(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    let fd = open(&f, libc::O_CREAT | libc::O_RDWR, 0o644).expect("create");
    let mib = 1 << 20;
    log.res("write 4 KiB at 0", &pwrite(&fd, &pattern(4096, 1), 0));
    log.res("write 4 KiB at 1 MiB", &pwrite(&fd, &pattern(4096, 2), mib));
    log.res("extend to 4 MiB", &ftruncate(&fd, 4 * mib));
    // SAFETY: plain syscall on our fd.
    log.res("fsync", &chk(unsafe { libc::fsync(fd.0) } as i64));
    for (what, off, whence) in [
        ("SEEK_DATA 0", 0, libc::SEEK_DATA),
        ("SEEK_HOLE 0", 0, libc::SEEK_HOLE),
        ("SEEK_DATA 4096", 4096, libc::SEEK_DATA),
        ("SEEK_HOLE 1 MiB", mib, libc::SEEK_HOLE),
        ("SEEK_DATA 1 MiB + 4 KiB", mib + 4096, libc::SEEK_DATA),
        ("SEEK_HOLE 4 MiB - 1", 4 * mib - 1, libc::SEEK_HOLE),
        ("SEEK_DATA at EOF", 4 * mib, libc::SEEK_DATA),
        ("SEEK_HOLE at EOF", 4 * mib, libc::SEEK_HOLE),
        ("SEEK_HOLE past EOF", 5 * mib, libc::SEEK_HOLE),
        ("SEEK_DATA negative", -1, libc::SEEK_DATA),
        ("SEEK_END 0", 0, libc::SEEK_END),
        ("SEEK_SET -1", -1, libc::SEEK_SET),
        ("bad whence", 0, 42),
    ] {
        log.res(what, &lseek(&fd, off, whence));
    }
    log.res(
        "position after the last good seek",
        &lseek(&fd, 0, libc::SEEK_CUR),
    );
    let empty = open(&ctx.p("empty"), libc::O_CREAT | libc::O_RDWR, 0o644).expect("create empty");
    log.res("SEEK_DATA in an empty file", &lseek(&empty, 0, libc::SEEK_DATA));
    log.res("SEEK_HOLE in an empty file", &lseek(&empty, 0, libc::SEEK_HOLE));
}

#[test]
fn lseek_data_and_hole() {
    differential(
        "seek_data_hole",
        check_seek_data_hole,
        &[PT, PT_NOPT, PT_NEVER, PATH],
    );
}

// ---------------------------------------------------------------------------
// copy_file_range

fn cfr(a: &Fd, ao: Option<i64>, b: &Fd, bo: Option<i64>, len: usize) -> Result<i64, i32> {
    let mut ao = ao;
    let mut bo = bo;
    let ap = ao.as_mut().map_or(std::ptr::null_mut(), |x| x as *mut i64);
    let bp = bo.as_mut().map_or(std::ptr::null_mut(), |x| x as *mut i64);
    // SAFETY: valid fds; offset pointers are null or point at live i64s.
    chk(unsafe { libc::copy_file_range(a.0, ap, b.0, bp, len, 0) } as i64)
}

fn check_copy_file_range(ctx: &Ctx, log: &mut Log) {
    let src = ctx.p("src");
    let data = pattern(1 << 20, 6);
    create(&src, &data);
    let s = open(&src, libc::O_RDONLY, 0).expect("open src");
    let d = open(&ctx.p("dst"), libc::O_CREAT | libc::O_RDWR, 0o644).expect("create dst");
    log.res(
        "copy 300000 bytes from 1000 to 5000",
        &cfr(&s, Some(1000), &d, Some(5000), 300_000),
    );
    log.res("dst size", &fstat(&d).map(|x| x.st_size));
    let got = content(&ctx.p("dst")).unwrap_or_default();
    log.val(
        "dst content",
        (
            got.len() >= 305_000 && got[5000..305_000] == data[1000..301_000],
            got[..5000].iter().all(|&b| b == 0),
        ),
    );
    log.res("copy from past EOF", &cfr(&s, Some(2 << 20), &d, Some(0), 100));
    log.res("copy 0 bytes", &cfr(&s, Some(0), &d, Some(0), 0));
    log.res(
        "copy across EOF (short)",
        &cfr(&s, Some((1 << 20) - 10), &d, Some(0), 100),
    );
    log.res(
        "overlapping copy within one file",
        &cfr(&d, Some(0), &d, Some(10), 100),
    );
    log.res(
        "non-overlapping copy within one file",
        &cfr(&d, Some(0), &d, Some(400_000), 100),
    );
    let wo = open(&src, libc::O_WRONLY, 0).expect("open wo");
    log.res("from an O_WRONLY fd", &cfr(&wo, Some(0), &d, Some(0), 10));
    log.res("to an O_RDONLY fd", &cfr(&d, Some(0), &s, Some(0), 10));
    let app = open(&ctx.p("dst"), libc::O_WRONLY | libc::O_APPEND, 0).expect("open append");
    log.res("to an O_APPEND fd", &cfr(&s, Some(0), &app, Some(0), 10));
    log.res("set src position 10", &lseek(&s, 10, libc::SEEK_SET));
    log.res("set dst position 0", &lseek(&d, 0, libc::SEEK_SET));
    log.res("copy 100 at the file positions", &cfr(&s, None, &d, None, 100));
    log.res("src position", &lseek(&s, 0, libc::SEEK_CUR));
    log.res("dst position", &lseek(&d, 0, libc::SEEK_CUR));
    log.res("final dst", &content(&ctx.p("dst")).map(|b| digest(&b)));
    log.res("mkdir", &mkdir(&ctx.p("dir"), 0o755));
    let dfd = open(&ctx.p("dir"), libc::O_RDONLY | libc::O_DIRECTORY, 0).expect("open dir");
    log.res("from a directory", &cfr(&dfd, Some(0), &d, Some(0), 10));
}

#[test]
fn copy_file_range_between_files() {
    differential(
        "copy_file_range",
        check_copy_file_range,
        &[PT, PT_NOPT, PT_NEVER, MEM, NODE, PATH],
    );
}

// ---------------------------------------------------------------------------
// open, unlink, read

fn check_open_unlink(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    create(&f, b"still here");
    let fd = open(&f, libc::O_RDWR, 0).expect("open");
    let ro = open(&f, libc::O_RDONLY, 0).expect("open ro");
    log.res("unlink the open file", &unlink(&f));
    log.res("stat the name", &shape_of(&f, false));
    log.res("fstat", &fstat(&fd).map(|s| shape(&s)));
    log.res("read it", &pread(&fd, 100, 0));
    log.res("write to it", &pwrite(&fd, b" and more", 10));
    log.res("read through the other fd", &pread(&ro, 100, 0));
    log.res("ftruncate it", &ftruncate(&fd, 5));
    log.res("fstat size", &fstat(&ro).map(|s| s.st_size));
    // SAFETY: plain syscalls on our fd.
    log.res("fchmod it", &chk(unsafe { libc::fchmod(fd.0, 0o600) } as i64));
    log.res("fstat mode", &fstat(&ro).map(|s| format!("{:o}", s.st_mode)));
    log.res("listing", &names_in(&ctx.root));
    create(&f, b"new file");
    log.res("a new file under the same name", &content(&f));
    log.res("the old fd still reads the old file", &pread(&ro, 100, 0));
    // Drop the kernel's cached pages: the reads below must come from the file.
    drop_dentries_and_inodes();
    log.res("after dropping caches", &pread(&ro, 100, 0));
    drop(fd);
    drop(ro);
    log.res("the new file after the old one is closed", &content(&f));
    log.res("listing", &names_in(&ctx.root));
}

#[test]
fn open_unlink_read() {
    differential(
        "open_unlink_read",
        check_open_unlink,
        &[
            PT, PT_NOPT, PT_NOFH, PT_FD1, PT_NEVER, PT_SPLICE, MEM, NODE, PATH, PATH_PT,
        ],
    );
}

/// Unlinking an open file changes its ctime (a name went) but not its
/// mtime (its content did not change): `fstat` through the open file says so.
fn check_unlinked_times(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    create(&f, b"content");
    log.res(
        "set mtime",
        &utimens(&f, Some([ts(1_000_000_000, 0), ts(1_000_000_000, 5)]), true),
    );
    let fd = open(&f, libc::O_RDONLY, 0).expect("open");
    let before = fstat(&fd).expect("fstat");
    // The filesystems' clocks tick in at most jiffies: let one pass.
    std::thread::sleep(Duration::from_millis(20));
    log.res("unlink the open file", &unlink(&f));
    let after = fstat(&fd).map(|s| {
        (
            (s.st_mtime, s.st_mtime_nsec),
            (s.st_ctime, s.st_ctime_nsec) > (before.st_ctime, before.st_ctime_nsec),
            s.st_nlink,
        )
    });
    log.res("fstat: mtime, ctime moved, links", &after);
}

#[test]
fn unlink_keeps_mtime_and_moves_ctime() {
    differential(
        "unlinked_times",
        check_unlinked_times,
        &[PT, PT_NOPT, MEM, NODE, PATH],
    );
}

/// Every operation that takes a name refuses one over 255 bytes with
/// `ENAMETOOLONG` (the kernel passes up to 1024), existing or not.
fn check_long_names(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    create(&f, b"x");
    fs::create_dir(ctx.p("d")).expect("mkdir d");
    for len in [256, 1000] {
        let long = ctx.p(&"n".repeat(len));
        log.res(&format!("{len}: stat"), &stat(&long, false).map(|_| ()));
        log.res(&format!("{len}: unlink"), &unlink(&long));
        log.res(&format!("{len}: rmdir"), &rmdir(&long));
        log.res(&format!("{len}: mkdir"), &mkdir(&long, 0o755));
        log.res(&format!("{len}: rename from"), &rename(&long, &f));
        log.res(&format!("{len}: rename to"), &rename(&f, &long));
        log.res(&format!("{len}: link from"), &link(&long, &ctx.p("g")));
        log.res(&format!("{len}: link to"), &link(&f, &long));
        log.res(&format!("{len}: symlink"), &symlink("f", &long));
        log.res(&format!("{len}: chmod"), &chmod(&long, 0o600));
        log.res(&format!("{len}: chown"), &chown(&long, 0, 0, true));
        log.res(&format!("{len}: truncate"), &truncate(&long, 0));
        log.res(
            &format!("{len}: create"),
            &open(&long, libc::O_CREAT | libc::O_WRONLY, 0o644).map(|_| ()),
        );
        log.res(&format!("{len}: utimens"), &utimens(&long, None, true));
    }
    log.res("listing", &names_in(&ctx.root));
    log.res("rmdir d", &rmdir(&ctx.p("d")));
    log.res("unlink f", &unlink(&f));
}

#[test]
fn names_over_255_bytes() {
    differential("long_names", check_long_names, &[PT, PT_NOPT, MEM, NODE, PATH]);
}

// ---------------------------------------------------------------------------
// ownership of what another user creates

const SGID_GROUP: u32 = 4242;

fn check_ownership(ctx: &Ctx, log: &mut Log) {
    let pubdir = ctx.p("pub");
    fs::create_dir(&pubdir).expect("mkdir pub");
    set_mode(&pubdir, 0o777);
    let sg = ctx.p("sg");
    fs::create_dir(&sg).expect("mkdir sg");
    set_owner(&sg, 0, SGID_GROUP);
    set_mode(&sg, 0o2777);
    log.res("the setgid directory", &shape_of(&sg, false));
    let sub = as_user(NOBODY, NOGROUP, &[NOGROUP], || {
        let mut l = Log::default();
        l.done(
            "create a file",
            &open(&pubdir.join("f"), libc::O_CREAT | libc::O_WRONLY, 0o644),
        );
        l.res("its owner and mode", &shape_of(&pubdir.join("f"), false));
        l.res("mkdir", &mkdir(&pubdir.join("d"), 0o755));
        l.res("its owner and mode", &shape_of(&pubdir.join("d"), false));
        l.res("symlink", &symlink("f", &pubdir.join("l")));
        l.res("its owner", &owner_of(&pubdir.join("l")));
        let cp = c(&pubdir.join("fifo"));
        // SAFETY: valid C string.
        l.res("mkfifo", &chk(unsafe { libc::mkfifo(cp.as_ptr(), 0o640) } as i64));
        l.res("its owner and mode", &shape_of(&pubdir.join("fifo"), false));
        l.res("link to my file", &link(&pubdir.join("f"), &pubdir.join("f2")));
        l.res("the link's owner", &owner_of(&pubdir.join("f2")));
        l.done(
            "create in the setgid directory",
            &open(&sg.join("f"), libc::O_CREAT | libc::O_WRONLY, 0o644),
        );
        l.res(
            "its group comes from the directory",
            &shape_of(&sg.join("f"), false),
        );
        l.res("mkdir in the setgid directory", &mkdir(&sg.join("d"), 0o755));
        l.res(
            "it inherits the group and the setgid bit",
            &shape_of(&sg.join("d"), false),
        );
        l.res("mkdir inside that", &mkdir(&sg.join("d/dd"), 0o700));
        l.res("still inherited", &shape_of(&sg.join("d/dd"), false));
        l.done(
            "create a 02755 file in the setgid directory (not in its group)",
            &open(&sg.join("x"), libc::O_CREAT | libc::O_WRONLY, 0o2755),
        );
        l.res("S_ISGID is dropped", &shape_of(&sg.join("x"), false));
        l.done(
            "create a 04755 file",
            &open(&pubdir.join("suid"), libc::O_CREAT | libc::O_WRONLY, 0o4755),
        );
        l.res("S_ISUID is kept", &shape_of(&pubdir.join("suid"), false));
        l.res(
            "rename my file into the setgid directory",
            &rename(&pubdir.join("f2"), &sg.join("moved")),
        );
        l.res("rename keeps the group", &owner_of(&sg.join("moved")));
        l
    });
    log.extend(sub);
    let sub = as_user(NOBODY, NOGROUP, &[NOGROUP, SGID_GROUP], || {
        let mut l = Log::default();
        l.done(
            "a member of the group creates a 02755 file",
            &open(&sg.join("member"), libc::O_CREAT | libc::O_WRONLY, 0o2755),
        );
        l.res("S_ISGID is kept", &shape_of(&sg.join("member"), false));
        l.res(
            "chgrp to a supplementary group",
            &chown(&pubdir.join("f"), u32::MAX, SGID_GROUP, true),
        );
        l.res("its group", &owner_of(&pubdir.join("f")));
        l
    });
    log.extend(sub);
    log.done(
        "root creates in the setgid directory",
        &open(&sg.join("r"), libc::O_CREAT | libc::O_WRONLY, 0o644),
    );
    log.res("its owner", &shape_of(&sg.join("r"), false));
    if let Some(src) = &ctx.source {
        // What the daemon created in the source directory belongs to the caller too.
        log.res("mkdir", &owner_of(&src.join("pub/d")));
    } else {
        log.res("mkdir", &owner_of(&pubdir.join("d")));
    }
}

#[test]
fn ownership_of_files_created_by_another_user() {
    differential(
        "ownership",
        check_ownership,
        &[PT, PT_NOPT, PT_DP, MEM_DP, NODE, PATH],
    );
}

// ---------------------------------------------------------------------------
// atime of the source

/// A read through a `noatime` mount leaves the source file's atime alone
/// (passthrough_ll and pathfs open it `O_NOATIME`); through a default
/// (`relatime`) mount it moves an atime older than a day, as a read of the
/// source itself does. Not in kernel passthrough mode: the kernel opens
/// its own backing file with the caller's flags, so the source's mount
/// decides (a limit of the kernel the daemon cannot lift); so `noatime`
/// keeps passthrough_ll's default out of kernel passthrough.
#[test]
fn noatime_mounts_leave_the_source_atime_alone() {
    if !common::require_mount_capability() {
        return;
    }
    const OLD: Time = (1_000_000_000, 0);
    for (fs, noatime) in [
        (Fs::Passthrough("noatime,cache=never"), true),
        (Fs::Passthrough("cache=never"), false),
        // Kernel passthrough would move it: noatime turns its default off.
        (Fs::Passthrough("noatime"), true),
        (Fs::Pathfs("noatime"), true),
        (Fs::Pathfs(""), false),
    ] {
        let d = Daemon::start(fs);
        let src = d.source.clone().expect("a source").join("f");
        create(&src, b"data");
        utimens(&src, Some([ts(OLD.0, OLD.1), ts(OLD.0, OLD.1)]), true).expect("set times");
        assert_eq!(fs::read(d.mnt.join("f")).expect("read"), b"data", "{}", d.label());
        let atime = times_of(&src, true).expect("stat the source").0;
        assert_eq!(
            atime == OLD,
            noatime,
            "{}: the source's atime is {atime:?}",
            d.label()
        );
    }
}
