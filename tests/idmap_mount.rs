//! Idmapped mounts of `passthrough_ll` and `pathfs` (with `allow_other`,
//! `default_permissions` and `-o idmap`, so the library grants
//! `FUSE_ALLOW_IDMAP`): the
//! test makes an idmapped bind mount of the FUSE mount (`open_tree` with
//! `OPEN_TREE_CLONE`, `mount_setattr` with `MOUNT_ATTR_IDMAP` and a user
//! namespace whose maps it writes, `move_mount`) and checks, as a mapped
//! user through it, the owners the kernel's rules give:
//!
//! - creates (create, mkdir, symlink, mknod) carry the caller's ids mapped
//!   down into the filesystem in the request header, and stamp those;
//! - other requests carry `FUSE_INVALID_UIDGID` (-1) as uid and gid: a
//!   chown (by root) and a chgrp (by the owner) must still be served and
//!   stamp the ids the kernel mapped down into the request's attributes.
//!
//! Needs root and `/dev/fuse` (skips loudly without, fails under
//! `CI=true`) and the examples built (`cargo build --examples`).

mod common;
mod posix_support;

use posix_support::*;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Filesystem ids `FS_BASE..FS_BASE+COUNT` show through the idmapped mount
/// as `CALLER_BASE..`.
const FS_BASE: u32 = 1000;
const CALLER_BASE: u32 = 2000;
const COUNT: u32 = 10;

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
const AT_RECURSIVE: libc::c_uint = 0x8000;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in a test path")
}

/// A user namespace mapping `FS_BASE..` (inside) to `CALLER_BASE..`
/// (outside), for uids and gids; its descriptor.
fn user_namespace() -> std::os::fd::OwnedFd {
    let mut cmd = Command::new("sleep");
    cmd.arg("600").stdin(Stdio::null());
    // SAFETY: unshare is a raw syscall, safe in the forked child before exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let mut child = cmd.spawn().expect("spawn sleep in a new user namespace");
    let pid = child.id();
    let map = format!("{FS_BASE} {CALLER_BASE} {COUNT}\n");
    let res = (|| {
        fs::write(format!("/proc/{pid}/uid_map"), &map)?;
        fs::write(format!("/proc/{pid}/gid_map"), &map)?;
        fs::File::open(format!("/proc/{pid}/ns/user"))
    })();
    let _ = child.kill();
    let _ = child.wait();
    res.expect("write the maps of the user namespace and open it")
        .into()
}

/// An idmapped bind mount of `from` at `at`, unmounted when dropped.
struct IdmappedMount(PathBuf);

impl IdmappedMount {
    fn new(from: &Path, at: &Path) -> IdmappedMount {
        match Self::make(from, at) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        }
    }

    /// The mount, or why the kernel refused it.
    fn make(from: &Path, at: &Path) -> Result<IdmappedMount, String> {
        use std::os::fd::AsRawFd;
        let ns = user_namespace();
        let from_c = c(from);
        let at_c = c(at);
        // SAFETY: open_tree(2) with a valid NUL-terminated path.
        let tree = unsafe {
            libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                from_c.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
            )
        };
        assert!(tree >= 0, "open_tree {}: {}", from.display(), errno_name(errno()));
        let tree = tree as i32;
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_IDMAP,
            attr_clr: 0,
            propagation: 0,
            userns_fd: ns.as_raw_fd() as u64,
        };
        let empty = c"";
        // SAFETY: mount_setattr(2) on the detached tree with a valid
        // `struct mount_attr` and its size.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree,
                empty.as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        let setattr_err = (r != 0).then(errno);
        // SAFETY: move_mount(2) of the detached tree onto a directory.
        let r = setattr_err.is_none().then(|| unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                tree,
                empty.as_ptr(),
                libc::AT_FDCWD,
                at_c.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            )
        });
        let move_err = (r.is_some_and(|r| r != 0)).then(errno);
        // SAFETY: closes the tree's descriptor, opened above.
        unsafe { libc::close(tree) };
        if let Some(e) = setattr_err {
            return Err(format!(
                "mount_setattr(MOUNT_ATTR_IDMAP) on {}: {}",
                from.display(),
                errno_name(e)
            ));
        }
        if let Some(e) = move_err {
            return Err(format!("move_mount onto {}: {}", at.display(), errno_name(e)));
        }
        Ok(IdmappedMount(at.to_path_buf()))
    }
}

impl Drop for IdmappedMount {
    fn drop(&mut self) {
        let p = c(&self.0);
        // SAFETY: umount2(2) with a valid path.
        if unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) } != 0 {
            eprintln!("unmounting {}: {}", self.0.display(), errno_name(errno()));
        }
    }
}

fn owner(p: &Path) -> Result<(u32, u32), i32> {
    stat(p, false).map(|s| (s.st_uid, s.st_gid))
}

/// Runs every step through the idmapped view `view` of the mount of `d`,
/// and lists (step, through the mount, in the source) owners.
fn check(d: &Daemon) {
    let src = d.source.clone().expect("a mirroring filesystem has a source");
    let view = d.outside.join("idmapped");
    fs::create_dir(&view).expect("mkdir the idmapped mountpoint");
    // A directory the mapped user may create in.
    let dir = d.mnt.join("d");
    fs::create_dir(&dir).expect("mkdir through the mount");
    set_owner(&dir, FS_BASE, FS_BASE);
    let _m = IdmappedMount::new(&d.mnt, &view);
    let v = view.join("d");
    assert_eq!(
        owner(&v),
        Ok((CALLER_BASE, CALLER_BASE)),
        "{}: the directory through the idmapped mount",
        d.label()
    );

    let (u, g) = (CALLER_BASE, CALLER_BASE);
    let extra = CALLER_BASE + 1;
    let made = as_user(u, g, &[g, extra], || {
        // SAFETY: plain syscalls with valid NUL-terminated paths.
        unsafe {
            libc::umask(0o022);
            let f = c(&v.join("file"));
            let fd = libc::open(f.as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_EXCL, 0o644);
            let create = if fd >= 0 {
                libc::close(fd);
                Ok(())
            } else {
                Err(errno())
            };
            let mkdir = chk(libc::mkdir(c(&v.join("sub")).as_ptr(), 0o755) as i64).map(drop);
            let symlink = chk(libc::symlink(c"file".as_ptr(), c(&v.join("link")).as_ptr()) as i64).map(drop);
            let mknod =
                chk(libc::mknod(c(&v.join("fifo")).as_ptr(), libc::S_IFIFO | 0o644, 0) as i64).map(drop);
            // The owner gives the file to another group of theirs: a
            // SETATTR, whose header the kernel sends with uid/gid -1.
            let g2 = c(&v.join("chgrp"));
            let fd = libc::open(g2.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
            let chgrp = if fd >= 0 {
                libc::close(fd);
                chk(libc::chown(g2.as_ptr(), u32::MAX, extra) as i64).map(drop)
            } else {
                Err(errno())
            };
            [create, mkdir, symlink, mknod, chgrp]
        }
    });
    let names = ["create", "mkdir", "symlink", "mknod", "chgrp"];
    let mut failures = Vec::new();
    for (name, r) in names.iter().zip(made) {
        if let Err(e) = r {
            failures.push(format!(
                "{name} as {u}:{g} through the idmapped mount: {}",
                errno_name(e)
            ));
        }
    }
    // Root, unmapped in the idmapping, gives a file to another mapped user:
    // the kernel maps the new owner down into the SETATTR's attributes.
    let given = v.join("given");
    fs::write(d.mnt.join("d/given"), b"x").expect("create through the mount");
    if let Err(e) = ioe(std::os::unix::fs::chown(
        &given,
        Some(CALLER_BASE + 3),
        Some(CALLER_BASE + 4),
    )) {
        failures.push(format!(
            "chown by root through the idmapped mount: {}",
            errno_name(e)
        ));
    }
    let want = [
        ("file", (FS_BASE, FS_BASE)),
        ("sub", (FS_BASE, FS_BASE)),
        ("link", (FS_BASE, FS_BASE)),
        ("fifo", (FS_BASE, FS_BASE)),
        ("chgrp", (FS_BASE, FS_BASE + 1)),
        ("given", (FS_BASE + 3, FS_BASE + 4)),
    ];
    for (name, (fu, fg)) in want {
        let in_source = owner(&src.join("d").join(name));
        if in_source != Ok((fu, fg)) {
            failures.push(format!(
                "{name}: owner in the source {in_source:?}, want ({fu}, {fg})"
            ));
        }
        let seen = owner(&v.join(name));
        let shown = (fu - FS_BASE + CALLER_BASE, fg - FS_BASE + CALLER_BASE);
        if seen != Ok(shown) {
            failures.push(format!(
                "{name}: owner through the idmapped mount {seen:?}, want {shown:?}"
            ));
        }
        let plain = owner(&d.mnt.join("d").join(name));
        if plain != Ok((fu, fg)) {
            failures.push(format!(
                "{name}: owner through the plain mount {plain:?}, want ({fu}, {fg})"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}:\n  {}\ndaemon output:\n{}",
        d.label(),
        failures.join("\n  "),
        d.output_tail()
    );
}

/// A name swapped in the source between the kernel's check and the
/// daemon's act: the mapped owner of `d/mine` looks it up through the
/// idmapped view (the kernel now holds its attributes), then the source's
/// `d/mine` is replaced by a hard link to root's `d/roots`, then the owner
/// chmods `d/mine`. The kernel checks the node it knows (the owner's) and
/// sends a SETATTR with no caller named. `refused`: the daemon acts by
/// name (pathfs), so it must refuse (`EPERM`); otherwise (passthrough_ll,
/// which acts on the node it holds) the chmod is served on the owner's
/// file. Either way root's file keeps its mode.
fn check_swapped_name(d: &Daemon, refused: bool) {
    use std::os::unix::fs::PermissionsExt;
    let src = d.source.clone().expect("a mirroring filesystem has a source");
    let sd = src.join("d");
    fs::create_dir(&sd).expect("mkdir in the source");
    set_owner(&sd, FS_BASE, FS_BASE);
    fs::write(sd.join("mine"), b"mine").expect("write the owner's file");
    set_owner(&sd.join("mine"), FS_BASE, FS_BASE);
    fs::write(sd.join("roots"), b"roots").expect("write root's file");
    fs::set_permissions(sd.join("roots"), fs::Permissions::from_mode(0o644)).expect("chmod");
    // Through the mount first: the kernel idmaps a mount only once INIT
    // has granted ALLOW_IDMAP.
    fs::metadata(d.mnt.join("d/roots")).expect("stat through the mount");
    let view = d.outside.join("idmapped");
    fs::create_dir(&view).expect("mkdir the idmapped mountpoint");
    let _m = IdmappedMount::new(&d.mnt, &view);
    let mine = view.join("d/mine");
    let (u, g) = (CALLER_BASE, CALLER_BASE);
    let seen = as_user(u, g, &[g], || stat(&mine, false).map(|s| (s.st_uid, s.st_gid)));
    assert_eq!(
        seen,
        Ok((u, g)),
        "{}: the owner's file through the view",
        d.label()
    );
    fs::hard_link(sd.join("roots"), sd.join("swap")).expect("link root's file");
    fs::rename(sd.join("swap"), sd.join("mine")).expect("swap the name in the source");
    let path = c(&mine);
    let chmod = as_user(u, g, &[g], || {
        // SAFETY: chmod(2) with a valid NUL-terminated path.
        let r = unsafe { libc::chmod(path.as_ptr(), 0o666) };
        chk(r as i64)
    });
    let roots_mode = stat(&sd.join("roots"), false).map(|s| s.st_mode & 0o7777);
    let want = if refused { Err(libc::EPERM) } else { Ok(0) };
    assert!(
        chmod == want && roots_mode == Ok(0o644),
        "{}: chmod of a name swapped for root's file: {:?} (want {:?}); root's file mode {:?}\ndaemon output:\n{}",
        d.label(),
        chmod.map_err(errno_name),
        want.map_err(errno_name),
        roots_mode.map(|m| format!("{m:o}")),
        d.output_tail()
    );
}

#[test]
fn passthrough_ll_under_an_idmapped_mount() {
    if !common::require_mount_capability() {
        return;
    }
    let d = Daemon::start(Fs::Passthrough("default_permissions,idmap"));
    check(&d);
}

#[test]
fn passthrough_ll_acts_on_the_node_the_kernel_checked_when_a_name_is_swapped() {
    if !common::require_mount_capability() {
        return;
    }
    let d = Daemon::start(Fs::Passthrough("default_permissions,idmap"));
    check_swapped_name(&d, false);
}

#[test]
fn pathfs_refuses_a_name_swapped_after_the_kernel_checked_it() {
    if !common::require_mount_capability() {
        return;
    }
    let d = Daemon::start(Fs::Pathfs("default_permissions,idmap"));
    check_swapped_name(&d, true);
}

/// pathfs with `-o idmap`: creates as the mapped caller, chowns and
/// chgrps by name (re-checked against the node the kernel checked, the
/// caller being unnamed) give the owners the kernel's rules say.
#[test]
fn pathfs_under_an_idmapped_mount() {
    if !common::require_mount_capability() {
        return;
    }
    let d = Daemon::start(Fs::Pathfs("default_permissions,idmap"));
    check(&d);
}

/// pathfs without `-o idmap` does not ask for `ALLOW_IDMAP`, so the
/// kernel refuses to idmap its mount.
#[test]
fn pathfs_without_idmap_refuses_to_be_idmapped() {
    if !common::require_mount_capability() {
        return;
    }
    let d = Daemon::start(Fs::Pathfs("default_permissions"));
    // INIT answered first, so that EINVAL is the kernel's answer to the
    // filesystem's flags, not to a mount still waiting for INIT.
    fs::metadata(&d.mnt).expect("stat through the mount");
    let view = d.outside.join("idmapped");
    fs::create_dir(&view).expect("mkdir the idmapped mountpoint");
    match IdmappedMount::make(&d.mnt, &view) {
        Ok(_m) => panic!(
            "{}: the kernel idmapped a mount that did not ask for ALLOW_IDMAP",
            d.label()
        ),
        Err(e) => assert!(
            e.contains("mount_setattr") && e.contains("EINVAL"),
            "{}: {e}",
            d.label()
        ),
    }
}
