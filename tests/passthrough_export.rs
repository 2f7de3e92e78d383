//! File handles of a `passthrough_ll` mount outlive the kernel's cache
//! (`FUSE_EXPORT_SUPPORT`), on real mounts: handles taken with
//! `name_to_handle_at` through the mount open with `open_by_handle_at` after
//! the kernel dropped every inode of the mount (`drop_caches`, the daemon
//! told by FORGET) - a file, a file in a subdirectory, a directory three
//! levels down (which the kernel reconnects to the root through ".." and
//! the listings of its ancestors), a directory moved meanwhile - and read
//! the right data; the handle of a removed file gives `ESTALE`; and every
//! lookup the kernel made to get there is forgotten again afterwards. These
//! are the cases of xfstests generic/426, 467 and 477 (which get `ESTALE`
//! without export support, as libfuse's passthrough does).
//!
//! Each test runs under a deadline: past it, the mount's connection is
//! aborted and the daemon killed, so nothing hangs.

mod common;

use common::TempMountpoint;
use std::ffi::CString;
use std::fs;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long one test may take.
const DEADLINE: Duration = Duration::from_secs(60);
/// `MAX_HANDLE_SZ`.
const HANDLE_SZ: usize = 128;

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
#[derive(Clone, Copy)]
struct FileHandle {
    bytes: u32,
    kind: i32,
    f: [u8; HANDLE_SZ],
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("a path without NUL")
}

/// `AT_HANDLE_CONNECTABLE` (Linux 6.13): a handle that also names the
/// parent directory, so that what it opens is connected to its path.
const AT_HANDLE_CONNECTABLE: i32 = 0x002;

/// `name_to_handle_at(AT_FDCWD, p, 0)`.
fn handle_of(p: &Path) -> FileHandle {
    handle_with(p, 0)
}

/// `name_to_handle_at(AT_FDCWD, p, flags)`.
fn handle_with(p: &Path, flags: i32) -> FileHandle {
    let mut h = FileHandle {
        bytes: HANDLE_SZ as u32,
        kind: 0,
        f: [0; HANDLE_SZ],
    };
    let mut mount_id = 0;
    let c = cpath(p);
    // SAFETY: `h` is a `struct file_handle` whose `bytes` says how much room
    // follows; `c` is NUL-terminated; `mount_id` is a live int.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            c.as_ptr(),
            &mut h as *mut FileHandle,
            &mut mount_id as *mut libc::c_int,
            flags,
        )
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    h
}

/// `open_by_handle_at(mount, h, flags)`.
fn open_by_handle(mount: &fs::File, h: &FileHandle, flags: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: `h` is a valid `struct file_handle` the call only reads.
    let r = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount.as_raw_fd(),
            h as *const FileHandle,
            flags | libc::O_CLOEXEC,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the call returned a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// The content of the file opened by `h`.
fn read_by_handle(mount: &fs::File, h: &FileHandle) -> std::io::Result<String> {
    let mut f = fs::File::from(open_by_handle(mount, h, libc::O_RDONLY)?);
    let mut s = String::new();
    f.read_to_string(&mut s)?;
    Ok(s)
}

/// The sorted names in the directory opened by `h`, and the content of
/// `file` in it (opened relative to that descriptor).
fn list_by_handle(mount: &fs::File, h: &FileHandle, file: &str) -> std::io::Result<(Vec<String>, String)> {
    let fd = open_by_handle(mount, h, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let proc = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    let mut names: Vec<String> = fs::read_dir(&proc)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    let data = fs::read_to_string(proc.join(file))?;
    Ok((names, data))
}

/// A `passthrough_ll` daemon over `src` with file handles required, killed
/// (its connection aborted first) past [`DEADLINE`] or on drop.
struct Daemon {
    child: Option<Child>,
    mnt: PathBuf,
    done: Option<mpsc::Sender<()>>,
}

impl Daemon {
    fn start(tm: &TempMountpoint, src: &Path) -> Daemon {
        let mut o = String::from("inode_file_handles=mandatory");
        if common::over_uring() {
            o.push_str(",uring");
        }
        let mut child = Command::new(common::example_binary("passthrough_ll"))
            .arg(src)
            .arg(tm.path())
            .arg("-o")
            .arg(&o)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start passthrough_ll");
        common::wait_for_mount(&mut child, tm.path(), &format!("passthrough_ll -o {o}"));
        let (tx, rx) = mpsc::channel::<()>();
        let (mnt, pid) = (tm.path().to_path_buf(), child.id());
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(DEADLINE) {
                eprintln!(
                    "passthrough_export: not done within {DEADLINE:?}; aborting {} and killing the daemon",
                    mnt.display()
                );
                let _ = common::abort_fuse_connection(&mnt);
                // SAFETY: kill(2) of our own child, not reaped before the
                // test ends (which this deadline precedes).
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
        });
        Daemon {
            child: Some(child),
            mnt: tm.path().to_path_buf(),
            done: Some(tx),
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Makes the kernel drop every inode of the mount but the root: waits
    /// until the daemon holds no more `O_PATH` descriptors than `base` (it
    /// holds one per inode the kernel knows while they fit its cache, and
    /// closes it when FORGET comes).
    fn drop_caches(&self, base: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            fs::write("/proc/sys/vm/drop_caches", "3").expect("write /proc/sys/vm/drop_caches");
            std::thread::sleep(Duration::from_millis(20));
            let held = common::open_path_fds(self.pid());
            if held <= base {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon still holds {held} O_PATH descriptors (at start: {base}): inodes not forgotten"
            );
        }
    }

    fn stop(mut self) {
        let child = self.child.take().expect("running");
        let status = common::terminate_daemon(child, &self.mnt);
        assert!(
            status.is_some_and(|s| s.success()),
            "daemon ended with {status:?}"
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            if std::thread::panicking() {
                let _ = common::abort_fuse_connection(&self.mnt);
            }
            common::terminate_daemon(child, &self.mnt);
        }
        drop(self.done.take());
    }
}

/// A source tree: `top` ("top"), `a/f` ("in a"), `a/b/c/` holding `g`
/// ("deep") and `h`, `a/gone` ("bye"), `m/n/` holding `k` ("moved").
fn source(tm: &TempMountpoint) -> PathBuf {
    let src = tm.root().join("src");
    fs::create_dir_all(src.join("a/b/c")).unwrap();
    fs::create_dir_all(src.join("m/n")).unwrap();
    fs::write(src.join("top"), "top").unwrap();
    fs::write(src.join("a/f"), "in a").unwrap();
    fs::write(src.join("a/b/c/g"), "deep").unwrap();
    fs::write(src.join("a/b/c/h"), "").unwrap();
    fs::write(src.join("a/gone"), "bye").unwrap();
    fs::write(src.join("m/n/k"), "moved").unwrap();
    src
}

fn setup(tag: &str) -> Option<(TempMountpoint, Daemon, usize)> {
    if !common::require_mount_capability() {
        return None;
    }
    let tm = TempMountpoint::new(tag);
    let src = source(&tm);
    let d = Daemon::start(&tm, &src);
    // Only the root known yet: what the daemon holds for it and itself.
    common::statfs_round_trip(tm.path());
    let base = common::open_path_fds(d.pid());
    Some((tm, d, base))
}

/// Files and directories open by handle after the kernel dropped them, a
/// directory moved meanwhile included, and the lookups this made are all
/// forgotten again once they are closed.
#[test]
fn handles_open_after_the_kernel_dropped_the_inodes() {
    let Some((tm, d, base)) = setup("export") else {
        return;
    };
    let mnt = tm.path();
    let root = fs::File::open(mnt).expect("open the mount's root");
    let top = handle_of(&mnt.join("top"));
    let f = handle_of(&mnt.join("a/f"));
    let g = handle_of(&mnt.join("a/b/c/g"));
    let c = handle_of(&mnt.join("a/b/c"));
    let n = handle_of(&mnt.join("m/n"));
    assert_eq!(
        read_by_handle(&root, &f).expect("open a/f by handle, cached"),
        "in a"
    );

    d.drop_caches(base);
    assert_eq!(read_by_handle(&root, &top).expect("open top by handle"), "top");
    assert_eq!(read_by_handle(&root, &f).expect("open a/f by handle"), "in a");
    assert_eq!(read_by_handle(&root, &g).expect("open a/b/c/g by handle"), "deep");
    d.drop_caches(base);
    // The directory alone: the kernel reconnects it through "..".
    let (names, data) = list_by_handle(&root, &c, "g").expect("open a/b/c by handle");
    assert_eq!(names, ["g", "h"]);
    assert_eq!(data, "deep");

    // A directory moved after its handle was taken (generic/477).
    fs::rename(mnt.join("m/n"), mnt.join("a/n2")).expect("rename m/n");
    d.drop_caches(base);
    let (names, data) = list_by_handle(&root, &n, "k").expect("open the moved m/n by handle");
    assert_eq!((names, data.as_str()), (vec!["k".to_string()], "moved"));
    assert!(
        fs::read_to_string(mnt.join("a/n2/k")).is_ok_and(|s| s == "moved"),
        "the moved directory's path"
    );
    // Every lookup the handles made was counted, and is forgotten again.
    drop(root);
    d.drop_caches(base);
    d.stop();
}

/// A connectable handle of a file (xfstests' `open_by_handle -p`): it opens
/// after the kernel dropped the file and its directories, and the kernel
/// connects it to its path (LOOKUP of "." in the parent's node id, ".." up
/// to the root, and the listings to find each name).
#[test]
fn a_connectable_handle_opens_connected_to_its_path() {
    let Some((tm, d, base)) = setup("export-conn") else {
        return;
    };
    let mnt = tm.path();
    let root = fs::File::open(mnt).expect("open the mount's root");
    let g = handle_with(&mnt.join("a/b/c/g"), AT_HANDLE_CONNECTABLE);
    assert!(
        g.bytes > 12,
        "a connectable handle carries its parent too ({} bytes)",
        g.bytes
    );
    d.drop_caches(base);
    let fd = open_by_handle(&root, &g, libc::O_RDONLY).expect("open a/b/c/g by connectable handle");
    let path = fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("readlink");
    assert_eq!(path, mnt.join("a/b/c/g"));
    let mut data = String::new();
    fs::File::from(fd).read_to_string(&mut data).unwrap();
    assert_eq!(data, "deep");
    drop(root);
    d.drop_caches(base);
    d.stop();
}

/// A removed file's handle gives `ESTALE` once the kernel dropped it,
/// also after its node id went to other files, while a handle of a file
/// still there opens.
#[test]
fn a_removed_files_handle_is_stale() {
    let Some((tm, d, base)) = setup("export-stale") else {
        return;
    };
    let mnt = tm.path();
    let root = fs::File::open(mnt).expect("open the mount's root");
    let gone = handle_of(&mnt.join("a/gone"));
    let f = handle_of(&mnt.join("a/f"));
    fs::remove_file(mnt.join("a/gone")).expect("remove a/gone");
    d.drop_caches(base);
    let e = read_by_handle(&root, &gone).expect_err("a removed file opened by handle");
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    assert_eq!(read_by_handle(&root, &f).expect("open a/f by handle"), "in a");

    // Many new files take the freed node ids, the removed file's included
    // (its slot is reused with a new generation): still stale, never
    // another file's data.
    let many = mnt.join("many");
    fs::create_dir(&many).unwrap();
    let held: Vec<fs::File> = (0..2000)
        .map(|i| {
            let p = many.join(format!("x{i}"));
            fs::write(&p, "x").unwrap();
            fs::File::open(&p).unwrap()
        })
        .collect();
    let e =
        read_by_handle(&root, &gone).expect_err("a removed file opened by handle after node ids were reused");
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    drop(held);
    drop(root);
    d.stop();
}
