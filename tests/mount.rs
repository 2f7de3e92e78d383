//! Real mounts through `fuse_wire::session::mount`: privileged `mount(2)`,
//! unmount and drop, error paths that must leave nothing mounted and no fd
//! open, the `/dev/fd/N` handover, and `fusermount3` as an unprivileged user
//! (with and without `auto_unmount`).
//!
//! The session loop is not used: a tiny server thread (tests/common) answers
//! INIT and GETATTR of the root so that `stat(mountpoint)` works.
//!
//! The unprivileged tests re-run this test binary as uid/gid 65534 with
//! `FUSE_WIRE_MOUNT_TEST_CHILD` set; the `unprivileged_child` test is that
//! child's entry point and does nothing otherwise.

mod common;

use common::*;
use fuse_wire::session::mount::{self, Mount, MountError, MountMethod, MountOptions};
use std::ffi::CString;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::IntoRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "FUSE_WIRE_MOUNT_TEST_CHILD";
const CHILD_MNT_ENV: &str = "FUSE_WIRE_MOUNT_TEST_MNT";
const CHILD_UID_ENV: &str = "FUSE_WIRE_MOUNT_TEST_UID";
const NOBODY: u32 = 65534;
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// Mount tests run one at a time, so that counting this process's `/dev/fuse`
/// fds is meaningful and concurrent mounts cannot confuse each other.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn dev_fuse_fds() -> usize {
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t == Path::new("/dev/fuse"))
        .count()
}

fn opts(subtype: &str) -> MountOptions {
    MountOptions {
        subtype: Some(subtype.into()),
        ..Default::default()
    }
}

/// `stat(mnt)` answered by the server: a 0755 directory.
fn assert_root_is_served(mnt: &Path, uid: u32) {
    let md = fs::metadata(mnt).unwrap_or_else(|e| panic!("stat {}: {e}", mnt.display()));
    assert_eq!(md.mode(), libc::S_IFDIR | 0o755, "mode of the served root");
    assert_eq!(md.ino(), 1);
    assert_eq!(md.uid(), uid);
}

#[test]
fn privileged_mount_serves_and_unmounts() {
    if !require_mount_capability() {
        return;
    }
    let _s = serial();
    let tm = TempMountpoint::new("priv");
    let o = MountOptions::parse_opts(
        "fsname=fwsrc,subtype=fwtest,default_permissions,allow_other,max_read=65536,noexec",
    )
    .unwrap();
    let m = Mount::new(tm.path(), &o).expect("privileged mount");
    assert_eq!(m.method(), MountMethod::Privileged);
    assert_eq!(m.mountpoint(), Some(tm.path()));

    let mi = mountinfo(tm.path()).expect("mounted");
    assert_eq!(mi.fstype, "fuse.fwtest");
    assert_eq!(mi.source, "fwsrc");
    for flag in ["nosuid", "nodev", "noexec"] {
        assert!(
            mi.mount_opts.split(',').any(|f| f == flag),
            "{flag} in {}",
            mi.mount_opts
        );
    }
    for o in [
        "user_id=0",
        "group_id=0",
        "default_permissions",
        "allow_other",
        "max_read=65536",
    ] {
        assert!(
            mi.super_opts.split(',').any(|f| f == o),
            "{o} in {}",
            mi.super_opts
        );
    }

    let (dev, guard) = m.into_parts();
    let server = serve_root(dev, 0, 0);
    assert_root_is_served(tm.path(), 0);

    guard.unmount().expect("unmount");
    assert!(!fuse_mounted_at(tm.path()), "still mounted after unmount");
    let seen = join_server(server).expect("server ends with ENODEV");
    assert!(seen.contains(&26), "INIT was served: {seen:?}");
}

#[test]
fn mount_unmount_closes_and_unmounts() {
    if !require_mount_capability() {
        return;
    }
    let _s = serial();
    let tm = TempMountpoint::new("unmount");
    let m = Mount::new(tm.path(), &opts("fwunmount")).expect("mount");
    let server = serve_root(m.dev().try_dup().unwrap(), 0, 0);
    assert_root_is_served(tm.path(), 0);
    m.unmount().expect("Mount::unmount");
    assert!(!fuse_mounted_at(tm.path()));
    join_server(server).expect("server ends with ENODEV");
}

#[test]
fn drop_unmounts() {
    if !require_mount_capability() {
        return;
    }
    let _s = serial();
    // Dropping a Mount.
    let tm = TempMountpoint::new("drop");
    let m = Mount::new(tm.path(), &opts("fwdrop")).expect("mount");
    let server = serve_root(m.dev().try_dup().unwrap(), 0, 0);
    assert_root_is_served(tm.path(), 0);
    drop(m);
    assert!(
        wait_unmounted(tm.path(), STEP_TIMEOUT),
        "Mount drop did not unmount"
    );
    join_server(server).expect("server ends with ENODEV");

    // Dropping the guard while the server still owns the fd.
    let m = Mount::new(tm.path(), &opts("fwdrop")).expect("mount again");
    let (dev, guard) = m.into_parts();
    let server = serve_root(dev, 0, 0);
    assert_root_is_served(tm.path(), 0);
    drop(guard);
    assert!(
        wait_unmounted(tm.path(), STEP_TIMEOUT),
        "MountGuard drop did not unmount"
    );
    join_server(server).expect("server ends with ENODEV");
}

#[test]
fn mount_errors_leave_nothing_behind() {
    if !require_mount_capability() {
        return;
    }
    let _s = serial();
    let tm = TempMountpoint::new("errors");
    let before = dev_fuse_fds();

    let missing = tm.root().join("missing");
    let e = Mount::new(&missing, &opts("fwerr")).unwrap_err();
    assert!(
        matches!(&e, MountError::MountpointMissing { path } if *path == missing),
        "{e}"
    );

    let file = tm.root().join("file");
    fs::write(&file, b"x").unwrap();
    let e = Mount::new(&file, &opts("fwerr")).unwrap_err();
    assert!(matches!(e, MountError::NotADirectory { .. }), "{e}");
    assert!(mountinfo(&file).is_none());

    let e = MountOptions::parse_opts("subtype=fwerr,frobnicate").unwrap_err();
    assert!(
        matches!(&e, MountError::UnknownOption(o) if o == "frobnicate"),
        "{e}"
    );

    let bad = MountOptions {
        fsname: Some("a,allow_other".into()),
        ..opts("fwerr")
    };
    let e = Mount::new(tm.path(), &bad).unwrap_err();
    assert!(
        matches!(&e, MountError::InvalidOption { option, .. } if option == "fsname"),
        "{e}"
    );

    let e = Mount::new(tm.path(), &MountOptions::parse_opts("blksize=4096").unwrap()).unwrap_err();
    assert!(
        matches!(&e, MountError::InvalidOption { option, .. } if option == "blksize"),
        "{e}"
    );

    // mount(2) itself fails after /dev/fuse was opened: fuseblk needs a block device.
    let blk = MountOptions::parse_opts(&format!("blkdev,fsname={}", file.display())).unwrap();
    let e = Mount::new(tm.path(), &blk).unwrap_err();
    assert!(
        matches!(&e, MountError::Mount { fstype, .. } if fstype == "fuseblk"),
        "{e}"
    );

    // Non-empty directories are allowed unless nonempty_check is set.
    fs::write(tm.path().join("inside"), b"x").unwrap();
    let check = MountOptions {
        nonempty_check: true,
        ..opts("fwerr")
    };
    let e = Mount::new(tm.path(), &check).unwrap_err();
    assert!(matches!(e, MountError::NotEmpty { .. }), "{e}");

    assert!(!fuse_mounted_at(tm.path()), "an error left a mount behind");
    assert_eq!(dev_fuse_fds(), before, "an error leaked a /dev/fuse fd");

    let m = Mount::new(tm.path(), &opts("fwerr")).expect("mounting over a non-empty dir is allowed");
    let server = serve_root(m.dev().try_dup().unwrap(), 0, 0);
    assert_root_is_served(tm.path(), 0);
    m.unmount().unwrap();
    join_server(server).unwrap();
    assert!(tm.path().join("inside").exists(), "the covered file is back");
}

#[test]
fn handed_over_fd_is_served_and_never_unmounted() {
    if !require_mount_capability() {
        return;
    }
    let _s = serial();
    let tm = TempMountpoint::new("handover");
    // Play the privileged helper: open /dev/fuse and mount(2) it ourselves.
    let fd = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .unwrap()
        .into_raw_fd();
    let src = CString::new("fwhand").unwrap();
    let target = CString::new(tm.path().as_os_str().as_encoded_bytes()).unwrap();
    let fstype = CString::new("fuse.fwhand").unwrap();
    let data = CString::new(format!("fd={fd},rootmode=40755,user_id=0,group_id=0")).unwrap();
    // SAFETY: all pointers are NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    assert_eq!(r, 0, "helper mount(2): {}", std::io::Error::last_os_error());

    let m = Mount::new(format!("/dev/fd/{fd}"), &MountOptions::default()).expect("handover");
    assert_eq!(m.method(), MountMethod::HandedOver);
    assert_eq!(m.mountpoint(), None);
    let server = serve_root(m.dev().try_dup().unwrap(), 0, 0);
    assert_root_is_served(tm.path(), 0);
    assert_eq!(mountinfo(tm.path()).unwrap().fstype, "fuse.fwhand");

    m.unmount().expect("unmounting a handed-over fd is a no-op");
    assert!(
        fuse_mounted_at(tm.path()),
        "a handed-over mount must stay mounted"
    );
    // fd N now belongs to the Mount, which closed it.
    assert_eq!(dev_fuse_fds(), 1, "only the server's dup is left");

    mount::unmount(tm.path(), false).expect("standalone unmount");
    assert!(!fuse_mounted_at(tm.path()));
    join_server(server).expect("server ends with ENODEV");

    // Mount::from_fd takes any fd as handed over.
    let f = fs::File::open("/dev/null").unwrap();
    let m = Mount::from_fd(f.into());
    assert_eq!(m.method(), MountMethod::HandedOver);
    drop(m);
}

/// The pids of this process's children (reaped ones are gone).
fn children() -> Vec<u32> {
    let me = std::process::id().to_string();
    let mut v: Vec<u32> = fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // /proc/PID/stat: "pid (comm) state ppid ..."
            fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
                st.rsplit_once(") ")
                    .is_some_and(|(_, t)| t.split(' ').nth(1) == Some(&me))
            })
        })
        .collect();
    v.sort();
    v
}

#[test]
fn root_auto_unmount_mounts_with_mount2_and_a_watchdog() {
    if !require_mount_capability() {
        return;
    }
    let _s = serial();
    let tm = TempMountpoint::new("rootauto");
    let o = MountOptions {
        auto_unmount: true,
        ..opts("fwrootauto")
    };
    let before = children();
    let m = Mount::new(tm.path(), &o).expect("auto_unmount mount as root");
    assert_eq!(m.method(), MountMethod::Privileged);
    assert_eq!(mountinfo(tm.path()).unwrap().fstype, "fuse.fwrootauto");
    assert_eq!(children().len(), before.len() + 1, "one watchdog process runs");
    // Named as itself in `ps`, not as a second copy of this process.
    let watchdog = children()
        .into_iter()
        .find(|c| !before.contains(c))
        .expect("the watchdog");
    // (It renames itself right after the fork: give it a moment.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let cmdline = loop {
        let c = fs::read(format!("/proc/{watchdog}/cmdline")).expect("its cmdline");
        if c.starts_with(b"fuse-wire-unmnt\0") || std::time::Instant::now() > deadline {
            break c;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    // Its name, then only the zeroed rest of the argument area.
    let shown = String::from_utf8_lossy(&cmdline);
    assert!(
        cmdline.starts_with(b"fuse-wire-unmnt\0") && cmdline.iter().skip(16).all(|b| *b == 0),
        "the watchdog's command line: {shown:?}"
    );
    let (dev, guard) = m.into_parts();
    let server = serve_root(dev, 0, 0);
    assert_root_is_served(tm.path(), 0);
    guard.unmount().expect("unmount");
    assert!(!fuse_mounted_at(tm.path()));
    // Told to stand down, the watchdog exited and was reaped.
    assert_eq!(children(), before);
    join_server(server).expect("server ends with ENODEV");
}

// ---------------------------------------------------------------------------
// Unprivileged: fusermount3 from a child running as nobody.

/// A re-run of this test binary as uid/gid `uid` in one child mode.
struct Unprivileged {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Receiver<String>,
}

impl Unprivileged {
    fn spawn(mode: &str, tm: &TempMountpoint, uid: u32) -> Self {
        std::os::unix::fs::chown(tm.path(), Some(uid), Some(uid)).unwrap();
        // The child must be able to execute the binary whatever the
        // permissions of the build directory: run a copy next to the mountpoint.
        let exe = tm.root().join("mount-test");
        fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
        let mut child = Command::new(&exe)
            .args(["--exact", "unprivileged_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, mode)
            .env(CHILD_MNT_ENV, tm.path())
            .env(CHILD_UID_ENV, uid.to_string())
            .current_dir("/")
            .uid(uid)
            .gid(uid)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the unprivileged child");
        let stdin = child.stdin.take();
        let (tx, lines) = std::sync::mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                // The harness prints `test unprivileged_child ... ` before the first one.
                if let Some((_, msg)) = l.split_once("CHILD:") {
                    let _ = tx.send(msg.to_string());
                }
            }
        });
        let (etx, stderr) = std::sync::mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = etx.send(l);
            }
        });
        Self {
            child,
            stdin,
            lines,
            stderr,
        }
    }

    /// The child's stderr so far, and what it writes until it closes the
    /// pipe or stays quiet for 100 ms (for failure messages).
    fn stderr_text(&self) -> String {
        let mut lines = Vec::new();
        while let Ok(l) = self.stderr.recv_timeout(Duration::from_millis(100)) {
            lines.push(l);
        }
        lines.join("\n")
    }

    /// The next `CHILD:` line, or a panic with the child's stderr.
    fn expect_line(&mut self, prefix: &str) -> String {
        match self.lines.recv_timeout(STEP_TIMEOUT) {
            Ok(l) if l.starts_with(prefix) => l,
            Ok(l) => self.fail(&format!("expected {prefix}, child said {l}")),
            Err(RecvTimeoutError::Timeout) => self.fail(&format!("timed out waiting for {prefix}")),
            Err(RecvTimeoutError::Disconnected) => self.fail(&format!("child exited before {prefix}")),
        }
    }

    fn fail(&mut self, what: &str) -> ! {
        let _ = self.child.kill();
        let _ = self.child.wait();
        panic!("{what}; child stderr:\n{}", self.stderr_text());
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Waits (bounded) for the child to exit successfully.
    fn expect_success(&mut self) {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            match self.child.try_wait().unwrap() {
                Some(st) if st.success() => return,
                Some(st) => {
                    let err = self.stderr_text();
                    panic!("child failed with {st}; stderr:\n{err}");
                }
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                None => self.fail("child did not exit"),
            }
        }
    }
}

impl Drop for Unprivileged {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn unprivileged_fusermount3_mount_and_unmount() {
    if !require_fusermount_capability() {
        return;
    }
    let _s = serial();
    let _open = DevFuseOpenToAll::new().expect("make /dev/fuse 0666 for the test");
    let tm = TempMountpoint::new("unpriv");
    let mut c = Unprivileged::spawn("mount", &tm, NOBODY);
    c.expect_line("MOUNTED");
    let mi = mountinfo(tm.path()).expect("the child's mount is visible");
    assert_eq!(mi.fstype, "fuse.fwunpriv");
    assert_eq!(mi.source, "fwunpriv");
    assert!(mi.super_opts.contains("user_id=65534"), "{}", mi.super_opts);
    assert!(mi.mount_opts.contains("nosuid") && mi.mount_opts.contains("nodev"));
    c.send("unmount");
    c.expect_line("DONE");
    c.expect_success();
    assert!(!fuse_mounted_at(tm.path()));
}

/// Kills a child serving an `auto_unmount` mount; fusermount3 must unmount.
fn kill_and_expect_auto_unmount(mode: &str, uid: u32, fstype: &str) {
    let tm = TempMountpoint::new("auto");
    let mut c = Unprivileged::spawn(mode, &tm, uid);
    c.expect_line("MOUNTED");
    assert_eq!(mountinfo(tm.path()).expect("mounted").fstype, fstype);
    c.child.kill().unwrap();
    c.child.wait().unwrap();
    assert!(
        wait_unmounted(tm.path(), STEP_TIMEOUT),
        "{mode} as uid {uid}: fusermount3 did not auto-unmount after the server was killed"
    );
}

#[test]
fn auto_unmount_when_the_server_dies() {
    if !require_fusermount_capability() {
        return;
    }
    let _s = serial();
    let mut grant = DevFuseOpenToAll::new().expect("make /dev/fuse 0666 for the test");

    // A root server (fusermount3 is still the one that unmounts).
    kill_and_expect_auto_unmount("auto", 0, "fuse.fwauto");

    // An unprivileged server: the watchdog, running as that user, checks
    // the mount and runs fusermount3 -u -z. Unlike fusermount3's own
    // auto_unmount before libfuse 3.15 (#586), this needs no allow_other.
    kill_and_expect_auto_unmount("auto", NOBODY, "fuse.fwauto");
    grant
        .allow_other_for_users()
        .expect("add user_allow_other to /etc/fuse.conf");
    kill_and_expect_auto_unmount("auto_allow_root", NOBODY, "fuse.fwauto");
}

/// A tmpfs the test mounts over a mountpoint; detached on drop if still on top.
struct TmpfsOver(PathBuf);

impl TmpfsOver {
    fn mount(path: &Path) -> TmpfsOver {
        let target = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"fw-cover".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"size=1m".as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
        TmpfsOver(path.to_path_buf())
    }

    fn on_top(&self) -> bool {
        mountinfo(&self.0).is_some_and(|m| m.fstype == "tmpfs" && m.source == "fw-cover")
    }
}

impl Drop for TmpfsOver {
    fn drop(&mut self) {
        if self.on_top() {
            let _ = mount::unmount(&self.0, true);
        }
    }
}

/// A user's own unmount through fusermount3 must not unmount a root tmpfs
/// placed over its mount (`fusermount3 -u` alone would: it only checks that
/// the user has a FUSE mount on that path, then unmounts the topmost one).
#[test]
fn unprivileged_unmount_leaves_a_mount_placed_over_it() {
    if !require_fusermount_capability() {
        return;
    }
    let _s = serial();
    let _open = DevFuseOpenToAll::new().expect("make /dev/fuse 0666 for the test");
    let tm = TempMountpoint::new("unpriv-covered");
    let mut c = Unprivileged::spawn("covered", &tm, NOBODY);
    c.expect_line("MOUNTED");
    let cover = TmpfsOver::mount(tm.path());
    c.send("unmount");
    let result = c.expect_line("RESULT");
    c.expect_success();
    assert_eq!(result, "RESULT:covered");
    assert!(cover.on_top(), "the user's unmount removed root's tmpfs");
    drop(cover);
    // The user's mount is below, dead since its process exited.
    assert!(fuse_mounted_at(tm.path()));
    mount::unmount(tm.path(), true).expect("unmount the dead mount");
    assert!(!fuse_mounted_at(tm.path()));
}

#[test]
fn unprivileged_fusermount3_failure_reports_its_stderr() {
    if !require_fusermount_capability() {
        return;
    }
    let _s = serial();
    let _open = DevFuseOpenToAll::new().expect("make /dev/fuse 0666 for the test");
    let tm = TempMountpoint::new("fail");
    // A mountpoint the child may not write to (fusermount3 refuses it).
    fs::create_dir(tm.root().join("rootowned")).unwrap();
    let mut c = Unprivileged::spawn("failures", &tm, NOBODY);
    c.expect_line("OK");
    c.expect_success();
    assert!(!fuse_mounted_at(tm.path()));
    assert!(!fuse_mounted_at(&tm.root().join("rootowned")));
}

/// The child side of the unprivileged tests (a no-op in a normal run).
#[test]
fn unprivileged_child() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mnt = PathBuf::from(std::env::var(CHILD_MNT_ENV).expect("mountpoint"));
    let uid: u32 = std::env::var(CHILD_UID_ENV).unwrap().parse().unwrap();
    assert_eq!(euid(), uid, "the child runs as the requested user");
    match mode.as_str() {
        "mount" => {
            let m = Mount::new(&mnt, &opts("fwunpriv")).expect("mount through fusermount3");
            assert_eq!(m.method(), MountMethod::Fusermount);
            let (dev, guard) = m.into_parts();
            let server = serve_root(dev, uid, uid);
            assert_root_is_served(&mnt, uid);
            assert_eq!(mountinfo(&mnt).unwrap().fstype, "fuse.fwunpriv");
            println!("CHILD:MOUNTED");
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).unwrap();
            assert_eq!(line.trim(), "unmount");
            guard.unmount().expect("fusermount3 -u -z");
            assert!(wait_unmounted(&mnt, STEP_TIMEOUT));
            join_server(server).expect("server ends with ENODEV");
            println!("CHILD:DONE");
        }
        "covered" => {
            let m = Mount::new(&mnt, &opts("fwcovered")).expect("mount through fusermount3");
            assert_eq!(m.method(), MountMethod::Fusermount);
            let (dev, guard) = m.into_parts();
            let _server = serve_root(dev, uid, uid);
            assert_root_is_served(&mnt, uid);
            println!("CHILD:MOUNTED");
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).unwrap();
            assert_eq!(line.trim(), "unmount");
            match guard.unmount() {
                Err(MountError::Covered { .. }) => println!("CHILD:RESULT:covered"),
                other => println!("CHILD:RESULT:{other:?}"),
            }
            // Exit now: closing the fd aborts the connection (the server
            // thread would otherwise wait for a ENODEV that never comes).
            std::process::exit(0);
        }
        "auto" | "auto_allow_root" => {
            let o = MountOptions {
                auto_unmount: true,
                allow_root: mode == "auto_allow_root",
                ..opts("fwauto")
            };
            let m = Mount::new(&mnt, &o).expect("auto_unmount mount");
            let method = if uid == 0 {
                MountMethod::Privileged
            } else {
                MountMethod::Fusermount
            };
            assert_eq!(m.method(), method);
            assert_eq!(m.allow_root(), o.allow_root);
            let (dev, _guard) = m.into_parts();
            let _server = serve_root(dev, uid, uid);
            assert_root_is_served(&mnt, uid);
            println!("CHILD:MOUNTED");
            // The parent kills us; never outlive the test.
            std::thread::sleep(STEP_TIMEOUT * 2);
            std::process::exit(3);
        }
        "failures" => {
            let expect_failure = |mnt: &Path, o: &MountOptions, needle: &str| {
                let e = Mount::new(mnt, o).unwrap_err();
                match &e {
                    MountError::FusermountFailed { stderr, status, .. } => {
                        assert!(!status.success());
                        assert!(stderr.contains(needle), "stderr: {stderr}");
                        assert!(e.to_string().contains(needle), "{e}");
                    }
                    other => panic!("expected FusermountFailed, got {other:?}"),
                }
                assert!(!fuse_mounted_at(mnt));
            };
            let rootowned = mnt.parent().unwrap().join("rootowned");
            expect_failure(&rootowned, &opts("fwfail"), "write access");
            let allowed = fs::read_to_string("/etc/fuse.conf")
                .unwrap_or_default()
                .lines()
                .any(|l| l.trim() == "user_allow_other");
            if !allowed {
                let o = MountOptions {
                    allow_other: true,
                    ..opts("fwfail")
                };
                expect_failure(&mnt, &o, "user_allow_other");
            }
            println!("CHILD:OK");
        }
        other => panic!("unknown child mode {other}"),
    }
}

/// A filesystem with an empty root, for the stacking tests.
struct EmptyRoot;

impl fuse_wire::session::Filesystem for EmptyRoot {
    fn getattr(
        &self,
        _: &fuse_wire::session::RequestContext<'_>,
        ino: fuse_wire::session::Inode,
        _: Option<fuse_wire::session::FileHandle>,
        reply: fuse_wire::session::reply::ReplyAttr,
    ) {
        use fuse_wire::session::{FileAttr, FileKind};
        reply.attr(
            Duration::from_secs(1),
            &FileAttr::fixed(ino.0, FileKind::Directory, 0o755),
        );
    }
}

/// A second instance on a mounted mountpoint is refused with a message
/// naming what is mounted there; with `-o stack` it mounts on top. The
/// covered one, stopped first, leaves its mount in place and says so in
/// its report; the top one unmounts.
#[test]
fn a_second_mount_on_a_mountpoint_is_refused_unless_stacked() {
    use fuse_wire::session::{SessionConfig, SessionError, spawn};
    if !require_mount_capability() {
        return;
    }
    let _s = serial();
    let tm = TempMountpoint::new("stacked");
    let first = spawn(EmptyRoot, tm.path(), &opts("fwfirst"), SessionConfig::default()).expect("first mount");
    // Each session is stopped only after INIT, or it ends with
    // EndedBeforeInit instead of reporting on its mount.
    let inited = |h: &fuse_wire::session::SessionHandle| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while h.negotiated().is_none() {
            assert!(Instant::now() < deadline, "no INIT within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    inited(first.handle());
    let refused = spawn(EmptyRoot, tm.path(), &opts("fwsecond"), SessionConfig::default());
    match &refused {
        Err(SessionError::Mount(MountError::AlreadyMounted { mounted, .. })) => {
            assert!(mounted.contains("fuse.fwfirst"), "names the mount: {mounted}")
        }
        other => panic!("a second mount must be refused: {:?}", other.as_ref().map(|_| ())),
    }
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains("-o stack") && message.contains("fuse.fwfirst"),
        "{message}"
    );
    assert_eq!(
        mountinfo(tm.path()).map(|m| m.fstype),
        Some("fuse.fwfirst".into())
    );

    let stacked = MountOptions::parse_opts("stack,subtype=fwsecond").expect("-o stack parses");
    assert!(stacked.stack);
    let second = spawn(EmptyRoot, tm.path(), &stacked, SessionConfig::default()).expect("a stacked mount");
    inited(second.handle());
    assert_eq!(
        mountinfo(tm.path()).map(|m| m.fstype),
        Some("fuse.fwsecond".into())
    );
    let first_report = first.stop().expect("the covered session ends");
    let left = first_report
        .mount_left
        .expect("the covered mount is reported as left in place");
    assert!(left.contains("covered"), "{left}");
    assert_eq!(
        mountinfo(tm.path()).map(|m| m.fstype),
        Some("fuse.fwsecond".into())
    );
    let second_report = second.stop().expect("the top session ends");
    assert_eq!(second_report.mount_left, None, "the top mount is unmounted");
    // The covered mount is left, dead: TempMountpoint's drop detaches it.
    assert_eq!(
        mountinfo(tm.path()).map(|m| m.fstype),
        Some("fuse.fwfirst".into())
    );
}

/// `-o nonempty_check` refuses a non-empty mountpoint; without it, the
/// mount goes ahead.
#[test]
fn nonempty_check_is_an_o_option() {
    if !require_mount_capability() {
        return;
    }
    let _s = serial();
    let tm = TempMountpoint::new("nonempty");
    fs::write(tm.path().join("hidden"), b"x").unwrap();
    let o = MountOptions::parse_opts("nonempty_check,subtype=fwnonempty").expect("parses");
    match Mount::new(tm.path(), &o) {
        Err(MountError::NotEmpty { path }) => assert_eq!(path, tm.path()),
        other => panic!("expected NotEmpty, got {:?}", other.map(|m| m.method())),
    }
    assert!(!fuse_mounted_at(tm.path()));
    let m = Mount::new(tm.path(), &opts("fwnonempty")).expect("mounts without the check");
    assert!(fuse_mounted_at(tm.path()));
    let (dev, guard) = m.into_parts();
    drop(dev);
    guard.unmount().expect("unmount");
}
