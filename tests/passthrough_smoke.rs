//! Smoke tests of the passthrough_ll example through a real mount: one test
//! per family of operations, each on its own temporary source and
//! mountpoint, with the daemon started the way mount.fuse3 starts it
//! (`passthrough_ll SOURCE MOUNTPOINT -o OPTIONS`) and stopped by SIGTERM.
//!
//! The example binary is `target/<profile>/examples/passthrough_ll`, built
//! (or found fresh) with the cargo that runs the tests.

mod common;

use common::TempMountpoint;
use std::ffi::CString;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running daemon; SIGTERM (then SIGKILL) on drop, and the mount detached
/// by the [`TempMountpoint`] if anything is left.
struct Daemon {
    child: Option<Child>,
    mnt: PathBuf,
    stats: PathBuf,
}

impl Daemon {
    fn start(tm: &TempMountpoint, opts: &str) -> Daemon {
        Daemon::start_logging(tm, opts, "")
    }

    /// Started with `RUST_LOG=filter` (none if empty), for [`Daemon::stop_with_log`].
    fn start_logging(tm: &TempMountpoint, opts: &str, filter: &str) -> Daemon {
        let src = tm.root().join("src");
        fs::create_dir_all(&src).unwrap();
        fs::set_permissions(&src, fs::Permissions::from_mode(0o777)).unwrap();
        let stats = tm.root().join("stats.json");
        let opts = if common::over_uring() {
            format!("{opts},uring")
        } else {
            opts.to_string()
        };
        let mut cmd = Command::new(common::example_binary("passthrough_ll"));
        if !filter.is_empty() {
            cmd.env("RUST_LOG", filter);
        }
        let mut child = cmd
            .arg(&src)
            .arg(tm.path())
            .arg("-o")
            .arg(&opts)
            .arg("--stats")
            .arg(&stats)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start passthrough_ll");
        common::wait_for_mount(&mut child, tm.path(), "passthrough_ll");
        Daemon {
            child: Some(child),
            mnt: tm.path().to_path_buf(),
            stats,
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// SIGTERM, wait (10 s at most), and return the `--stats` JSON.
    fn stop(mut self) -> String {
        let status = self.terminate();
        assert!(
            status.is_some_and(|s| s.success()),
            "daemon ended with {status:?}"
        );
        assert!(!common::fuse_mounted_at(&self.mnt), "still mounted after SIGTERM");
        let json = fs::read_to_string(&self.stats).expect("stats file");
        if common::over_uring() {
            // The io_uring pass must really have used the rings.
            assert!(
                !json.contains("\"uring\": 0,") && json.contains("\"uring\": "),
                "FUSE_WIRE_TEST_TRANSPORT=uring but no request went over io_uring: {json}"
            );
        }
        json
    }

    /// [`Daemon::stop`], and what the daemon wrote to stderr.
    fn stop_with_log(mut self) -> (String, String) {
        let mut err = self.child.as_mut().and_then(|c| c.stderr.take()).expect("stderr");
        let json = self.stop();
        let mut log = String::new();
        err.read_to_string(&mut log).expect("daemon's stderr");
        (json, log)
    }

    fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        common::terminate_daemon(self.child.take()?, &self.mnt)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.terminate();
    }
}

fn op_count(json: &str, op: &str) -> u64 {
    match json.find(&format!("\"{op}\": {{")) {
        Some(at) => common::json_number(&json[at..], "count").unwrap_or(0),
        None => 0,
    }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// With reads and writes served by the daemon.
#[test]
fn files_directories_links_and_attributes() {
    files_directories_links_and_attributes_with("cache=auto,no_passthrough");
}

/// The same in the default mode: regular files in kernel passthrough.
#[test]
fn files_directories_links_and_attributes_in_passthrough_mode() {
    files_directories_links_and_attributes_with("cache=auto");
}

/// The same without file handles (one descriptor per inode).
#[test]
fn files_directories_links_and_attributes_without_file_handles() {
    files_directories_links_and_attributes_with("cache=auto,inode_file_handles=never,no_passthrough");
}

/// The same with a one-descriptor cache: nearly every step reopens by handle.
#[test]
fn files_directories_links_and_attributes_with_a_tiny_fd_cache() {
    files_directories_links_and_attributes_with("cache=auto,fd_cache=1,no_passthrough");
}

fn files_directories_links_and_attributes_with(opts: &str) {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-files");
    let d = Daemon::start(&tm, opts);
    let src = tm.root().join("src");

    fs::write(d.p("a"), b"hello world").unwrap();
    assert_eq!(fs::read(d.p("a")).unwrap(), b"hello world");
    assert_eq!(fs::read(src.join("a")).unwrap(), b"hello world");
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.p("a"))
        .unwrap();
    f.seek(SeekFrom::Start(6)).unwrap();
    f.write_all(b"fuse!").unwrap();
    drop(f);
    assert_eq!(fs::read_to_string(d.p("a")).unwrap(), "hello fuse!");

    fs::create_dir(d.p("dir")).unwrap();
    fs::rename(d.p("a"), d.p("dir/b")).unwrap();
    assert!(!d.p("a").exists());
    assert!(src.join("dir/b").exists());
    let mut names: Vec<String> = fs::read_dir(d.p("dir"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["b"]);

    // A directory larger than one READDIR reply, read to the end.
    for i in 0..300 {
        fs::write(d.p(&format!("dir/file-with-a-longish-name-{i:04}")), b"").unwrap();
    }
    assert_eq!(fs::read_dir(d.p("dir")).unwrap().count(), 301);

    std::os::unix::fs::symlink("dir/b", d.p("sl")).unwrap();
    assert_eq!(fs::read_link(d.p("sl")).unwrap(), PathBuf::from("dir/b"));
    assert_eq!(fs::read_to_string(d.p("sl")).unwrap(), "hello fuse!");
    assert!(fs::symlink_metadata(d.p("sl")).unwrap().file_type().is_symlink());
    fs::hard_link(d.p("dir/b"), d.p("hl")).unwrap();
    assert_eq!(fs::metadata(d.p("hl")).unwrap().nlink(), 2);
    assert_eq!(
        fs::metadata(d.p("hl")).unwrap().ino(),
        fs::metadata(src.join("dir/b")).unwrap().ino()
    );

    // setattr: size, mode, times (including "now"), owner.
    let f = fs::OpenOptions::new().write(true).open(d.p("hl")).unwrap();
    f.set_len(5).unwrap();
    drop(f);
    assert_eq!(fs::read_to_string(d.p("dir/b")).unwrap(), "hello");
    fs::set_permissions(d.p("hl"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(src.join("hl")).unwrap().mode() & 0o7777, 0o640);
    let t = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000);
    fs::File::options()
        .write(true)
        .open(d.p("hl"))
        .unwrap()
        .set_times(fs::FileTimes::new().set_accessed(t).set_modified(t))
        .unwrap();
    assert_eq!(fs::metadata(src.join("hl")).unwrap().mtime(), 1_000_000);
    // SAFETY: utimensat with a NUL-terminated path and a null times pointer (both "now").
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, cstr(&d.p("hl")).as_ptr(), std::ptr::null(), 0) };
    assert_eq!(r, 0, "utimensat now: errno {}", errno());
    assert!(fs::metadata(src.join("hl")).unwrap().mtime() > 1_000_000);
    std::os::unix::fs::chown(d.p("hl"), Some(65534), Some(65534)).unwrap();
    let m = fs::metadata(src.join("hl")).unwrap();
    assert_eq!((m.uid(), m.gid()), (65534, 65534));

    // statfs
    // SAFETY: an all-zero statvfs is valid storage for the call to fill.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated path, live out-pointer.
    assert_eq!(unsafe { libc::statvfs(cstr(&d.mnt).as_ptr(), &mut sv) }, 0);
    assert!(sv.f_blocks > 0 && sv.f_namemax > 0);

    // Removal, and errors come back as errnos.
    assert_eq!(
        fs::remove_dir(d.p("dir")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    fs::remove_file(d.p("hl")).unwrap();
    fs::remove_file(d.p("sl")).unwrap();
    fs::remove_dir_all(d.p("dir")).unwrap();
    assert_eq!(
        fs::metadata(d.p("nope")).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
    assert_eq!(fs::read_dir(&d.mnt).unwrap().count(), 0);

    let json = d.stop();
    for op in [
        "CREATE", "MKDIR", "RENAME", "SYMLINK", "LINK", "SETATTR", "UNLINK", "RMDIR",
    ] {
        assert!(op_count(&json, op) > 0, "{op} never reached the daemon: {json}");
    }
    let served = opts.contains("no_passthrough");
    for op in ["WRITE", "READ"] {
        assert_eq!(op_count(&json, op) > 0, served, "{op} count with {opts}: {json}");
    }
}

#[test]
fn rename_flags_mknod_tmpfile_and_ranges() {
    rename_flags_mknod_tmpfile_and_ranges_with("cache=never");
}

/// The same without file handles (one descriptor per inode).
#[test]
fn rename_flags_mknod_tmpfile_and_ranges_without_file_handles() {
    rename_flags_mknod_tmpfile_and_ranges_with("cache=never,inode_file_handles=never");
}

/// The same with a one-descriptor cache: nearly every step reopens by handle.
#[test]
fn rename_flags_mknod_tmpfile_and_ranges_with_a_tiny_fd_cache() {
    rename_flags_mknod_tmpfile_and_ranges_with("cache=never,fd_cache=1");
}

fn rename_flags_mknod_tmpfile_and_ranges_with(opts: &str) {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-misc");
    let d = Daemon::start(&tm, opts);
    fs::write(d.p("x"), b"x").unwrap();
    fs::write(d.p("y"), b"yy").unwrap();
    let (x, y) = (cstr(&d.p("x")), cstr(&d.p("y")));
    // SAFETY: renameat2 with NUL-terminated paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            x.as_ptr(),
            libc::AT_FDCWD,
            y.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    assert_eq!((r, errno()), (-1, libc::EEXIST));
    // SAFETY: as above.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            x.as_ptr(),
            libc::AT_FDCWD,
            y.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(r, 0);
    assert_eq!(fs::read(d.p("x")).unwrap(), b"yy");

    // SAFETY: mknod of a FIFO at a NUL-terminated path.
    let r = unsafe { libc::mknod(cstr(&d.p("fifo")).as_ptr(), libc::S_IFIFO | 0o600, 0) };
    assert_eq!(r, 0);
    assert!(
        fs::symlink_metadata(tm.root().join("src/fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );

    // O_TMPFILE, then give it a name.
    let mut t = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(&d.mnt)
        .unwrap();
    t.write_all(b"temporary").unwrap();
    let proc = cstr(Path::new(&format!("/proc/self/fd/{}", t.as_raw_fd())));
    // SAFETY: linkat with NUL-terminated paths.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc.as_ptr(),
            libc::AT_FDCWD,
            cstr(&d.p("named")).as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    assert_eq!(r, 0, "linkat of a tmpfile: errno {}", errno());
    assert_eq!(fs::read(d.p("named")).unwrap(), b"temporary");

    // fallocate, lseek(SEEK_DATA/SEEK_HOLE), copy_file_range.
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(d.p("sparse"))
        .unwrap();
    // SAFETY: plain calls on a live descriptor.
    unsafe {
        assert_eq!(
            libc::fallocate(f.as_raw_fd(), 0, 1 << 20, 4096),
            0,
            "errno {}",
            errno()
        );
        // Allocated but unwritten blocks count as a hole: write data after it.
        assert_eq!(
            libc::pwrite(f.as_raw_fd(), b"data".as_ptr().cast(), 4, 2 << 20),
            4
        );
        assert_eq!(libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA), 2 << 20);
        assert_eq!(libc::lseek(f.as_raw_fd(), 0, libc::SEEK_HOLE), 0);
    }
    assert_eq!(f.metadata().unwrap().len(), (2 << 20) + 4);
    let src = fs::File::open(d.p("named")).unwrap();
    let dst = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(d.p("copy"))
        .unwrap();
    let mut off_in: i64 = 0;
    let mut off_out: i64 = 0;
    // SAFETY: copy_file_range between live descriptors with live offsets.
    let n = unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            &mut off_in,
            dst.as_raw_fd(),
            &mut off_out,
            100,
            0,
        )
    };
    assert_eq!(n, 9, "errno {}", errno());
    assert_eq!(fs::read(d.p("copy")).unwrap(), b"temporary");
    drop((t, f, src, dst));
    let json = d.stop();
    for op in ["RENAME2", "MKNOD", "TMPFILE", "FALLOCATE", "LSEEK"] {
        assert!(op_count(&json, op) > 0, "{op} never reached the daemon: {json}");
    }
}

#[test]
fn xattrs_and_locks() {
    xattrs_and_locks_with("xattr,posix_lock,flock");
}

/// The same without file handles (one descriptor per inode).
#[test]
fn xattrs_and_locks_without_file_handles() {
    xattrs_and_locks_with("xattr,posix_lock,flock,inode_file_handles=never");
}

/// The same with a one-descriptor cache: nearly every step reopens by handle.
#[test]
fn xattrs_and_locks_with_a_tiny_fd_cache() {
    xattrs_and_locks_with("xattr,posix_lock,flock,fd_cache=1");
}

fn xattrs_and_locks_with(opts: &str) {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-xattr");
    let d = Daemon::start(&tm, opts);
    fs::write(d.p("f"), b"data").unwrap();
    let p = cstr(&d.p("f"));
    let name = c"user.test";
    // SAFETY: NUL-terminated strings; value and buffers are live for their lengths.
    unsafe {
        assert_eq!(
            libc::setxattr(p.as_ptr(), name.as_ptr(), b"v1".as_ptr().cast(), 2, 0),
            0,
            "errno {}",
            errno()
        );
        let mut buf = [0u8; 16];
        assert_eq!(
            libc::getxattr(p.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()),
            2
        );
        assert_eq!(&buf[..2], b"v1");
        assert_eq!(
            libc::getxattr(p.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0),
            2
        );
        let n = libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len());
        assert_eq!(&buf[..n as usize], b"user.test\0");
        assert_eq!(
            libc::getxattr(p.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 1),
            -1
        );
        assert_eq!(errno(), libc::ERANGE);
        assert_eq!(libc::removexattr(p.as_ptr(), name.as_ptr()), 0);
        assert_eq!(
            libc::getxattr(p.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()),
            -1
        );
        assert_eq!(errno(), libc::ENODATA);
    }

    // Two opens are two lock owners.
    let a = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.p("f"))
        .unwrap();
    let b = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.p("f"))
        .unwrap();
    let lock = |typ: i32, start: i64, len: i64| libc::flock {
        l_type: typ as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        l_pid: 0,
    };
    // SAFETY: fcntl lock commands with live flock structs; flock on live fds.
    unsafe {
        let mut l = lock(libc::F_WRLCK, 0, 10);
        assert_eq!(
            libc::fcntl(a.as_raw_fd(), libc::F_OFD_SETLK, &mut l),
            0,
            "errno {}",
            errno()
        );
        let mut l = lock(libc::F_WRLCK, 5, 10);
        assert_eq!(libc::fcntl(b.as_raw_fd(), libc::F_OFD_SETLK, &mut l), -1);
        assert_eq!(errno(), libc::EAGAIN);
        let mut l = lock(libc::F_RDLCK, 0, 0);
        assert_eq!(libc::fcntl(b.as_raw_fd(), libc::F_OFD_GETLK, &mut l), 0);
        assert_eq!(l.l_type, libc::F_WRLCK as libc::c_short);
        assert_eq!((l.l_start, l.l_len), (0, 10));
        let mut l = lock(libc::F_WRLCK, 20, 10);
        assert_eq!(libc::fcntl(b.as_raw_fd(), libc::F_OFD_SETLK, &mut l), 0);
        let mut l = lock(libc::F_UNLCK, 0, 10);
        assert_eq!(libc::fcntl(a.as_raw_fd(), libc::F_OFD_SETLK, &mut l), 0);
        let mut l = lock(libc::F_WRLCK, 5, 10);
        assert_eq!(libc::fcntl(b.as_raw_fd(), libc::F_OFD_SETLKW, &mut l), 0);

        assert_eq!(libc::flock(a.as_raw_fd(), libc::LOCK_EX), 0);
        assert_eq!(libc::flock(b.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), -1);
        assert_eq!(errno(), libc::EWOULDBLOCK);
        assert_eq!(libc::flock(a.as_raw_fd(), libc::LOCK_UN), 0);
        assert_eq!(libc::flock(b.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB), 0);
    }
    drop((a, b));
    let json = d.stop();
    for op in [
        "SETXATTR",
        "GETXATTR",
        "LISTXATTR",
        "REMOVEXATTR",
        "SETLK",
        "SETLKW",
        "GETLK",
    ] {
        assert!(op_count(&json, op) > 0, "{op} never reached the daemon: {json}");
    }
}

#[test]
fn files_created_by_another_user_belong_to_that_user() {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-owner");
    let src = tm.root().join("src");
    fs::create_dir_all(src.join("sgid")).unwrap();
    std::os::unix::fs::chown(src.join("sgid"), None, Some(4242)).unwrap();
    fs::set_permissions(src.join("sgid"), fs::Permissions::from_mode(0o2777)).unwrap();
    let d = Daemon::start(&tm, "allow_other");
    let status = Command::new("/bin/sh")
        .arg("-c")
        .arg("touch f && mkdir d && ln -s f l && mkfifo p && touch sgid/g && mkdir sgid/sd")
        .current_dir(&d.mnt)
        .uid(65534)
        .gid(65534)
        .status()
        .expect("run sh as uid 65534");
    assert!(status.success());
    for name in ["f", "d", "l", "p"] {
        let m = fs::symlink_metadata(src.join(name)).unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 65534), "{name}");
    }
    let g = fs::metadata(src.join("sgid/g")).unwrap();
    assert_eq!((g.uid(), g.gid()), (65534, 4242), "setgid directory's group");
    let sd = fs::metadata(src.join("sgid/sd")).unwrap();
    assert_eq!(sd.gid(), 4242);
    assert!(sd.mode() & libc::S_ISGID != 0, "subdirectory inherits S_ISGID");
    // Root's own creations stay root's.
    fs::write(d.p("r"), b"").unwrap();
    assert_eq!(fs::metadata(src.join("r")).unwrap().uid(), 0);
    d.stop();
}

#[test]
fn lookup_counts_return_to_zero_after_the_kernel_forgets() {
    lookup_counts_return_to_zero_after_the_kernel_forgets_with("cache=always");
}

/// The same without file handles (one descriptor per inode).
#[test]
fn lookup_counts_return_to_zero_after_the_kernel_forgets_without_file_handles() {
    lookup_counts_return_to_zero_after_the_kernel_forgets_with("cache=always,inode_file_handles=never");
}

/// The same with a one-descriptor cache: nearly every step reopens by handle.
#[test]
fn lookup_counts_return_to_zero_after_the_kernel_forgets_with_a_tiny_fd_cache() {
    lookup_counts_return_to_zero_after_the_kernel_forgets_with("cache=always,fd_cache=1");
}

fn lookup_counts_return_to_zero_after_the_kernel_forgets_with(opts: &str) {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-forget");
    let d = Daemon::start(&tm, opts);
    let pid = d.child.as_ref().expect("daemon").id();
    // The floor: what the daemon holds once the kernel has forgotten
    // whatever it looked up while mounting (without that, an inode looked
    // up at mount time and forgotten later would hide one still held).
    let paths_at_start = common::evict_until_path_fds(pid, 0, Duration::from_millis(300));
    fs::create_dir_all(d.p("a/b/c")).unwrap();
    for i in 0..50 {
        fs::write(d.p(&format!("a/b/c/f{i}")), b"x").unwrap();
        fs::hard_link(d.p(&format!("a/b/c/f{i}")), d.p(&format!("a/h{i}"))).unwrap();
    }
    for e in fs::read_dir(d.p("a/b/c")).unwrap() {
        fs::metadata(e.unwrap().path()).unwrap();
    }
    // Make the kernel evict the mount's dentries and inodes: it sends
    // FORGETs, and the daemon closes the O_PATH descriptors it held for them.
    common::evict_until_path_fds(pid, paths_at_start, Duration::from_secs(20));
    // FORGETs the kernel queued are read before the next request: a few
    // STATFS round trips (never cached) make sure they were read before
    // the unmount, which drops unread ones.
    for _ in 0..5 {
        common::statfs_round_trip(&d.mnt);
    }
    let json = d.stop();
    assert!(
        op_count(&json, "FORGET") + op_count(&json, "BATCH_FORGET") > 0,
        "{json}"
    );
    assert_eq!(common::json_number(&json, "inodes"), Some(0), "{json}");
}

#[test]
fn passthrough_reads_and_writes_bypass_the_daemon() {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-passthrough");
    let d = Daemon::start(&tm, "passthrough");
    let data: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    fs::write(d.p("big"), &data).unwrap();
    assert_eq!(fs::read(d.p("big")).unwrap(), data);
    assert_eq!(fs::read(tm.root().join("src/big")).unwrap(), data);
    // Several opens of one inode share its backing file.
    let mut r1 = fs::File::open(d.p("big")).unwrap();
    let mut w = fs::OpenOptions::new().write(true).open(d.p("big")).unwrap();
    w.write_all(b"HEAD").unwrap();
    let mut head = [0u8; 4];
    r1.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HEAD");
    drop((r1, w));
    // Reopened after the last release: a new backing file.
    fs::OpenOptions::new()
        .append(true)
        .open(d.p("big"))
        .unwrap()
        .write_all(b"TAIL")
        .unwrap();
    assert!(fs::read(d.p("big")).unwrap().ends_with(b"TAIL"));
    let json = d.stop();
    assert!(op_count(&json, "OPEN") + op_count(&json, "CREATE") >= 4, "{json}");
    assert_eq!(op_count(&json, "READ"), 0, "reads reached the daemon: {json}");
    assert_eq!(op_count(&json, "WRITE"), 0, "writes reached the daemon: {json}");
}

/// What the passthrough-mode tests do through the mount: a file written
/// in the source read back, one written through the mount, and an
/// `O_DIRECT` descriptor's aligned write and read; each checked byte for
/// byte, through the mount and in the source.
fn file_workload(d: &Daemon, src: &Path) {
    let data: Vec<u8> = (0..200 * 1024).map(|i| (i % 253) as u8).collect();
    fs::write(src.join("outside"), &data).unwrap();
    assert_eq!(fs::read(d.p("outside")).unwrap(), data);
    fs::write(d.p("inside"), &data[..5000]).unwrap();
    assert_eq!(fs::read(src.join("inside")).unwrap(), &data[..5000]);
    assert_eq!(fs::read(d.p("inside")).unwrap(), &data[..5000]);
    // O_DIRECT: 4 KiB-aligned buffers, offsets and lengths.
    let layout = std::alloc::Layout::from_size_align(8192, 4096).unwrap();
    // SAFETY: a non-zero size; freed below with the same layout.
    let buf = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!buf.is_null());
    // SAFETY: `buf` holds 8192 bytes, ours alone until freed.
    let buf = unsafe { std::slice::from_raw_parts_mut(buf, 8192) };
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(d.p("outside"))
        .unwrap();
    buf.fill(b'D');
    f.seek(SeekFrom::Start(4096)).unwrap();
    f.write_all(&buf[..4096]).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_exact(&mut buf[..]).unwrap();
    assert_eq!(&buf[..4096], &data[..4096]);
    assert!(buf[4096..].iter().all(|&b| b == b'D'));
    drop(f);
    let mut want = data.clone();
    want[4096..8192].fill(b'D');
    assert_eq!(fs::read(src.join("outside")).unwrap(), want);
    // SAFETY: allocated above with this layout, no longer used.
    unsafe { std::alloc::dealloc(buf.as_mut_ptr(), layout) };
}

/// [`file_workload`] on a daemon started with `opts` over `tm`'s source,
/// logging what it decides; its statistics and log.
fn run_file_workload(tm: &TempMountpoint, opts: &str) -> (String, String) {
    let d = Daemon::start_logging(tm, opts, "passthrough_ll=info");
    file_workload(&d, &tm.root().join("src"));
    d.stop_with_log()
}

/// Without an option about it, passthrough_ll opens regular files in kernel
/// passthrough mode: neither buffered nor `O_DIRECT` reads and writes reach
/// the daemon (the kernel does O_DIRECT on the backing file itself), and
/// the log says it is on.
#[test]
fn passthrough_is_the_default() {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-default");
    let (json, log) = run_file_workload(&tm, "cache=auto");
    assert!(log.contains("kernel passthrough on"), "{log}");
    assert!(!log.contains("kernel passthrough off"), "{log}");
    assert!(op_count(&json, "OPEN") >= 3, "{json}");
    assert_eq!(op_count(&json, "READ"), 0, "reads reached the daemon: {json}");
    assert_eq!(op_count(&json, "WRITE"), 0, "writes reached the daemon: {json}");
}

/// `-o no_passthrough`: the same reads and writes are the daemon's, and
/// nothing says passthrough is on.
#[test]
fn no_passthrough_serves_reads_and_writes_in_the_daemon() {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-nopt");
    let (json, log) = run_file_workload(&tm, "no_passthrough");
    assert!(!log.contains("kernel passthrough on"), "{log}");
    assert!(op_count(&json, "READ") > 0, "{json}");
    assert!(op_count(&json, "WRITE") > 0, "{json}");
}

/// An option that excludes passthrough turns the default off, with one
/// line saying why at start, and is not refused.
#[test]
fn writeback_turns_the_default_off_saying_why() {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-wb");
    let (json, log) = run_file_workload(&tm, "writeback");
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("kernel passthrough")).collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(lines[0].contains("kernel passthrough off: writeback"), "{log}");
    assert!(op_count(&json, "READ") > 0, "{json}");
}

/// A daemon without `CAP_SYS_ADMIN` (dropped by `setpriv`, util-linux)
/// cannot register backing files: its default is off, saying why before it
/// mounts. Without the capability the mount itself goes through
/// fusermount3, which may refuse a root caller stripped of it; the log line
/// comes first either way, and a mount that succeeds is stopped.
#[test]
fn without_cap_sys_admin_the_default_is_off_saying_why() {
    if !common::require_mount_capability() {
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        common::skip("setpriv (util-linux) is not installed");
        return;
    }
    let tm = TempMountpoint::new("pt-nocap");
    let src = tm.root().join("src");
    fs::create_dir_all(&src).unwrap();
    let mut child = Command::new("setpriv")
        .args([
            "--inh-caps=-sys_admin",
            "--ambient-caps=-sys_admin",
            "--bounding-set=-sys_admin",
        ])
        .arg(common::example_binary("passthrough_ll"))
        .arg(&src)
        .arg(tm.path())
        .env("RUST_LOG", "passthrough_ll=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start passthrough_ll under setpriv");
    let mut err = child.stderr.take().expect("stderr");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !common::fuse_mounted_at(tm.path()) && child.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "neither mounted nor exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    if common::fuse_mounted_at(tm.path()) {
        common::terminate_daemon(child, tm.path());
    } else {
        child.wait().unwrap();
    }
    let mut log = String::new();
    err.read_to_string(&mut log).unwrap();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("kernel passthrough")).collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(
        lines[0].contains("kernel passthrough off: the daemon lacks CAP_SYS_ADMIN"),
        "{log}"
    );
}

/// An overlay mount over `lower` (the files) at `at`, detached on drop.
struct Overlay(PathBuf);

impl Overlay {
    fn mount(root: &Path, at: &Path) -> Overlay {
        for d in ["lower", "upper", "work"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        fs::create_dir_all(at).unwrap();
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            root.join("lower").display(),
            root.join("upper").display(),
            root.join("work").display()
        );
        let opts = CString::new(opts).unwrap();
        // SAFETY: live C strings; overlay reads `opts` as its data.
        let r = unsafe {
            libc::mount(
                c"overlay".as_ptr(),
                cstr(at).as_ptr(),
                c"overlay".as_ptr(),
                0,
                opts.as_ptr().cast(),
            )
        };
        assert_eq!(r, 0, "mount overlay: {}", std::io::Error::last_os_error());
        Overlay(at.to_path_buf())
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        // SAFETY: a live C string.
        unsafe { libc::umount2(cstr(&self.0).as_ptr(), libc::MNT_DETACH) };
    }
}

/// A source the kernel refuses backing files on (overlayfs is stacked, and
/// this mount offers max_stack_depth 1): every open is served by the
/// daemon, with correct data, never EIO, and the reason logged once.
#[test]
fn an_open_refused_its_backing_file_is_served_by_the_daemon() {
    if !common::require_mount_capability() {
        return;
    }
    let tm = TempMountpoint::new("pt-fallback");
    let src = tm.root().join("src");
    let _overlay = Overlay::mount(tm.root(), &src);
    let (json, log) = run_file_workload(&tm, "cache=auto");
    assert!(log.contains("kernel passthrough on"), "{log}");
    let fallbacks: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("served by the daemon"))
        .collect();
    assert_eq!(fallbacks.len(), 1, "{log}");
    assert!(fallbacks[0].contains("stacked too deep"), "{log}");
    assert!(op_count(&json, "READ") > 0, "{json}");
    assert!(op_count(&json, "WRITE") > 0, "{json}");
}

#[test]
fn bad_options_fail_before_mounting() {
    let out = Command::new(common::example_binary("passthrough_ll"))
        .args(["-o", "passthrough,writeback", "/nonexistent-mountpoint"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("writeback"), "{err}");
    let out = Command::new(common::example_binary("passthrough_ll"))
        .args(["-o", "frobnicate", "/x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// `f_type` of the filesystem holding `p`.
fn fs_type(p: &Path) -> i64 {
    // SAFETY: an all-zero `statfs` is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the path is a live C string and `st` is writable.
    let r = unsafe { libc::statfs(cstr(p).as_ptr(), &mut st) };
    assert_eq!(
        r,
        0,
        "statfs {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    st.f_type as i64
}

#[test]
fn close_sends_flush_only_when_something_needs_it() {
    if !common::require_mount_capability() {
        return;
    }
    // Creates, opens for reading and writing, and closes, through `d`.
    fn closes(d: &Daemon) {
        for i in 0..3 {
            fs::write(d.p(&format!("f{i}")), b"data").unwrap();
        }
        assert_eq!(fs::read(d.p("f0")).unwrap(), b"data");
        let f = fs::OpenOptions::new().append(true).open(d.p("f1")).unwrap();
        let dup = f.try_clone().unwrap();
        drop((f, dup));
    }
    // Closing a duplicate of a source descriptor does nothing on tmpfs and
    // ext2/3/4 and XFS: there the daemon opens files with FOPEN_NOFLUSH.
    let tm = TempMountpoint::new("pt-noflush");
    let d = Daemon::start(&tm, "cache=auto");
    let quiet = matches!(
        fs_type(&tm.root().join("src")),
        0x0102_1994 | 0xEF53 | 0x5846_5342
    );
    closes(&d);
    let json = d.stop();
    if quiet {
        assert_eq!(op_count(&json, "FLUSH"), 0, "FLUSH reached the daemon: {json}");
    } else {
        assert!(op_count(&json, "FLUSH") >= 6, "this source keeps FLUSH: {json}");
    }

    // With posix_lock the daemon holds the POSIX locks: a close must reach
    // it to drop the closing owner's locks, whatever the source.
    let tm = TempMountpoint::new("pt-flush-locks");
    let d = Daemon::start(&tm, "cache=auto,posix_lock");
    closes(&d);
    let json = d.stop();
    assert!(op_count(&json, "FLUSH") >= 6, "no FLUSH with posix_lock: {json}");
}
