//! Permission corners of the `passthrough_ll` example, run as root with an
//! unprivileged user (`nobody`) as the other caller, each compared step by
//! step with a plain directory of this machine:
//!
//! - programs another user may execute but not read (mode 0711 and the
//!   like) run through the mount and stay unreadable to that user;
//! - extended attributes of symbolic links themselves, and which names an
//!   unprivileged caller is listed (no `trusted.*`);
//! - POSIX ACLs: the mode and the ACL after `setfacl` and `chmod`, access
//!   granted or denied by ACL entries, and default ACLs inherited by new
//!   files and directories created by root and by another user.
//!
//! The ACLs are set and read as raw `system.posix_acl_*` values, so no
//! `acl` package is needed. Needs root and `/dev/fuse` (skips loudly
//! without, fails under `CI=true`) and the examples built
//! (`cargo build --examples`).

mod common;
mod posix_support;

use posix_support::*;
use std::ffi::CString;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

// ---------------------------------------------------------------------------
// small wrappers

fn c(p: &Path) -> CString {
    cpath(p)
}

fn mode_of(p: &Path) -> Result<String, i32> {
    stat(p, false).map(|s| format!("{:o}", s.st_mode))
}

fn open_ro(p: &Path) -> Result<(), i32> {
    open(p, libc::O_RDONLY, 0).map(drop)
}

// ---------------------------------------------------------------------------
// execute-only programs

/// Copies the program `from` to `to` (as root) with `mode`, owned by root
/// and group `gid`. The copy is written by a `cp` process: a descriptor
/// open for writing in this process would also be held, until their exec,
/// by the children other tests' threads fork meanwhile, and running the
/// program then fails with ETXTBSY.
fn install_program(from: &str, to: &Path, mode: u32, gid: u32) {
    let st = Command::new("cp")
        .arg(from)
        .arg(to)
        .stdin(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cp {from} {}: {e}", to.display()));
    assert!(st.success(), "cp {from} {}: {st}", to.display());
    set_owner(to, 0, gid);
    set_mode(to, mode);
}

/// Runs `p`: its exit code, or the errno of the failed exec.
fn run(p: &Path) -> Result<i32, i32> {
    Command::new(p)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.code().unwrap_or(-1))
        .map_err(|e| io_errno(&e))
}

/// [`run`] as nobody (the child inherits the thread's credentials).
fn run_as_nobody(p: &Path) -> Result<i32, i32> {
    as_user(NOBODY, NOGROUP, &[], || run(p))
}

/// Starts the `sleep` program `p` as nobody and, while it runs, opens its
/// memory as nobody (which succeeds only if the process is dumpable: a
/// program its user may not read makes it non-dumpable, or the user could
/// read the program's pages there).
fn memory_of_running_program(p: &Path) -> Result<Result<(), i32>, i32> {
    let mut child = as_user(NOBODY, NOGROUP, &[], || {
        Command::new(p)
            .arg("60")
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| io_errno(&e))
    })?;
    // spawn() returns once the exec has happened (or failed).
    let mem = Path::new("/proc").join(child.id().to_string()).join("mem");
    let r = as_user(NOBODY, NOGROUP, &[], || open_ro(&mem));
    let _ = child.kill();
    let _ = child.wait();
    Ok(r)
}

fn check_exec_only(ctx: &Ctx, log: &mut Log) {
    let programs: &[(&str, u32, u32)] = &[
        ("x0711", 0o711, 0),
        ("x0111", 0o111, 0),
        ("x0001", 0o001, 0),
        ("x0010", 0o010, NOGROUP),
        ("x0100", 0o100, 0),
        ("x0755", 0o755, 0),
    ];
    for &(name, mode, gid) in programs {
        let p = ctx.p(name);
        install_program("/bin/true", &p, mode, gid);
        log.res(&format!("{name}: mode"), &mode_of(&p));
        log.res(&format!("{name}: nobody runs it"), &run_as_nobody(&p));
        log.res(
            &format!("{name}: nobody opens it for reading"),
            &as_user(NOBODY, NOGROUP, &[], || open_ro(&p)),
        );
        log.res(
            &format!("{name}: nobody reads it"),
            &as_user(NOBODY, NOGROUP, &[], || content(&p)).map(|b| b.len()),
        );
        log.res(&format!("{name}: root runs it"), &run(&p));
    }
    // Once its pages are cached, the program is still not nobody's to read.
    let p = ctx.p("x0711");
    log.res("x0711 again: nobody runs it", &run_as_nobody(&p));
    log.res(
        "x0711 again: nobody opens it read-write",
        &as_user(NOBODY, NOGROUP, &[], || open(&p, libc::O_RDWR, 0).map(drop)),
    );
    let s = ctx.p("sleep0711");
    install_program("/bin/sleep", &s, 0o711, 0);
    log.res(
        "a running execute-only program's memory, opened by its user",
        &memory_of_running_program(&s),
    );
}

/// Without `default_permissions` the kernel would leave a process running
/// a program it could not read dumpable (it asks the daemon nothing about
/// read permission there), so the daemon refuses such execs: the program's
/// bytes must stay out of its user's reach either way.
fn check_exec_only_without_default_permissions() {
    let d = Daemon::start(Fs::Passthrough(""));
    let s = d.mnt.join("sleep0711");
    install_program("/bin/sleep", &s, 0o711, 0);
    let mem = memory_of_running_program(&s);
    assert!(
        matches!(mem, Err(libc::EACCES) | Ok(Err(libc::EACCES))),
        "without default_permissions nobody ran an execute-only program with readable memory: {mem:?}"
    );
    let t = d.mnt.join("true0711");
    install_program("/bin/true", &t, 0o711, 0);
    let r = as_user(NOBODY, NOGROUP, &[], || open_ro(&t));
    assert_eq!(
        r,
        Err(libc::EACCES),
        "nobody opened an execute-only file for reading"
    );
    let exit = d.finish();
    assert!(
        exit.status.is_some_and(|s| s.success()),
        "daemon exit {:?}:\n{}",
        exit.status,
        exit.output_tail
    );
}

#[test]
fn execute_only_programs_run_but_stay_unreadable() {
    differential(
        "execute_only_programs",
        check_exec_only,
        &[
            Fs::Passthrough("default_permissions"),
            Fs::Passthrough("default_permissions,cache=always"),
            Fs::Passthrough("default_permissions,cache=never"),
            Fs::Passthrough("default_permissions,inode_file_handles=never"),
            Fs::Passthrough("default_permissions,fd_cache=1"),
        ],
    );
    if common::require_mount_capability() {
        check_exec_only_without_default_permissions();
    }
}

// ---------------------------------------------------------------------------
// extended attributes of symbolic links

fn cname(name: &str) -> CString {
    CString::new(name).expect("no NUL")
}

/// `getxattr`/`lgetxattr` with a buffer of `size` (0: the size query).
fn getx(p: &Path, name: &str, size: usize, follow: bool) -> Result<Vec<u8>, i32> {
    let (cp, cn) = (c(p), cname(name));
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: valid C strings; `buf` is valid for `size` bytes.
    let r = unsafe {
        if follow {
            libc::getxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), size)
        } else {
            libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), size)
        }
    };
    let n = chk(r as i64)? as usize;
    if size == 0 {
        return Ok(vec![0; n]);
    }
    buf.truncate(n);
    Ok(buf)
}

/// `setxattr`/`lsetxattr`.
fn setx(p: &Path, name: &str, val: &[u8], follow: bool) -> Result<i64, i32> {
    let (cp, cn) = (c(p), cname(name));
    // SAFETY: valid C strings and value.
    let r = unsafe {
        if follow {
            libc::setxattr(cp.as_ptr(), cn.as_ptr(), val.as_ptr().cast(), val.len(), 0)
        } else {
            libc::lsetxattr(cp.as_ptr(), cn.as_ptr(), val.as_ptr().cast(), val.len(), 0)
        }
    };
    chk(r as i64)
}

/// `removexattr`/`lremovexattr`.
fn removex(p: &Path, name: &str, follow: bool) -> Result<i64, i32> {
    let (cp, cn) = (c(p), cname(name));
    // SAFETY: valid C strings.
    let r = unsafe {
        if follow {
            libc::removexattr(cp.as_ptr(), cn.as_ptr())
        } else {
            libc::lremovexattr(cp.as_ptr(), cn.as_ptr())
        }
    };
    chk(r as i64)
}

/// `listxattr`/`llistxattr` with a buffer of `size` (`None`: ask for the
/// size first), every name, sorted.
fn listx(p: &Path, size: Option<usize>, follow: bool) -> Result<Vec<String>, i32> {
    let cp = c(p);
    let call = |buf: *mut libc::c_char, len: usize| {
        // SAFETY: valid C string; `buf` is null with a 0 length or valid for `len` bytes.
        let r = unsafe {
            if follow {
                libc::listxattr(cp.as_ptr(), buf, len)
            } else {
                libc::llistxattr(cp.as_ptr(), buf, len)
            }
        };
        chk(r as i64).map(|n| n as usize)
    };
    let size = match size {
        Some(s) => s,
        None => call(std::ptr::null_mut(), 0)?,
    };
    let mut buf = vec![0u8; size.max(1)];
    let n = call(buf.as_mut_ptr().cast(), size)?;
    buf.truncate(n);
    let mut names: Vec<String> = buf
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// The size `listxattr`/`llistxattr` reports for the list of `p`.
fn listx_size(p: &Path, follow: bool) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string; a null buffer of size 0 asks for the size.
    let r = unsafe {
        if follow {
            libc::listxattr(cp.as_ptr(), std::ptr::null_mut(), 0)
        } else {
            libc::llistxattr(cp.as_ptr(), std::ptr::null_mut(), 0)
        }
    };
    chk(r as i64)
}

fn check_symlink_xattrs(ctx: &Ctx, log: &mut Log) {
    let f = ctx.p("f");
    fs::write(&f, b"x").expect("create f");
    let s = ctx.p("s");
    std::os::unix::fs::symlink("f", &s).expect("symlink");
    log.res("llistxattr of a fresh link", &listx(&s, None, false));
    log.res(
        "lsetxattr trusted.x on the link",
        &setx(&s, "trusted.x", b"on-link", false),
    );
    log.res(
        "setxattr trusted.t on the target",
        &setx(&f, "trusted.t", b"on-target", true),
    );
    log.res("llistxattr", &listx(&s, None, false));
    log.res("llistxattr, exact buffer", &listx(&s, Some(10), false));
    log.res("llistxattr, 1-byte buffer", &listx(&s, Some(1), false));
    log.res("listxattr through the link", &listx(&s, None, true));
    log.res(
        "lgetxattr size",
        &getx(&s, "trusted.x", 0, false).map(|v| v.len()),
    );
    log.res("lgetxattr", &getx(&s, "trusted.x", 64, false));
    log.res("lgetxattr, small buffer", &getx(&s, "trusted.x", 2, false));
    log.res(
        "lgetxattr of the target's name",
        &getx(&s, "trusted.t", 64, false),
    );
    log.res("getxattr through the link", &getx(&s, "trusted.t", 64, true));
    log.res("lsetxattr user.* on the link", &setx(&s, "user.u", b"u", false));
    log.res(
        "lsetxattr security.* on the link",
        &setx(&s, "security.fw", b"s", false),
    );
    log.res("llistxattr with security.*", &listx(&s, None, false));
    log.res("lremovexattr trusted.x", &removex(&s, "trusted.x", false));
    log.res("lremovexattr it again", &removex(&s, "trusted.x", false));
    log.res("lremovexattr security.fw", &removex(&s, "security.fw", false));
    log.res("llistxattr after removing", &listx(&s, None, false));
    log.res("the target's list", &listx(&f, None, true));
    // What an unprivileged caller is listed: no trusted.* names.
    log.res(
        "lsetxattr trusted.x again",
        &setx(&s, "trusted.x", b"again", false),
    );
    log.res("set user.a on the target", &setx(&f, "user.a", b"a", true));
    let d = ctx.p("d");
    fs::create_dir(&d).expect("mkdir d");
    log.res("set trusted.d on a directory", &setx(&d, "trusted.d", b"d", true));
    let sub = as_user(NOBODY, NOGROUP, &[], || {
        let mut l = Log::default();
        l.res("nobody: llistxattr of the link", &listx(&s, None, false));
        l.res("nobody: the link's list size", &listx_size(&s, false));
        l.res("nobody: the target's list size", &listx_size(&f, true));
        l.res("nobody: listxattr of the target", &listx(&f, None, true));
        l.res(
            "nobody: the target's list, 7-byte buffer",
            &listx(&f, Some(7), true),
        );
        l.res(
            "nobody: the target's list, 6-byte buffer",
            &listx(&f, Some(6), true),
        );
        l.res("nobody: listxattr of the directory", &listx(&d, None, true));
        l.res("nobody: lgetxattr trusted.x", &getx(&s, "trusted.x", 64, false));
        l
    });
    log.extend(sub);
}

#[test]
fn symlink_xattrs_like_a_plain_directory() {
    differential(
        "symlink_xattrs",
        check_symlink_xattrs,
        &[
            Fs::Passthrough("xattr"),
            Fs::Passthrough("xattr,default_permissions"),
            Fs::Passthrough("xattr,inode_file_handles=never"),
            Fs::Passthrough("xattr,fd_cache=1"),
            Fs::Pathfs(""),
        ],
    );
}

// ---------------------------------------------------------------------------
// POSIX ACLs

fn chmod(p: &Path, mode: u32) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::chmod(cp.as_ptr(), mode) } as i64)
}

fn open_wo(p: &Path) -> Result<(), i32> {
    open(p, libc::O_WRONLY, 0).map(drop)
}

const ACL_ACCESS: &str = "system.posix_acl_access";
const ACL_DEFAULT: &str = "system.posix_acl_default";

const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// The `system.posix_acl_*` value of `entries` (tag, permissions, id).
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// An ACL value read back, as `tag:perm[:id]` entries (the raw bytes when
/// they do not parse, so a difference still shows).
fn acl_entries(v: &[u8]) -> Vec<String> {
    if v.len() < 4 || !(v.len() - 4).is_multiple_of(8) {
        return vec![format!("raw {v:?}")];
    }
    v[4..]
        .chunks(8)
        .map(|e| {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let perm = u16::from_le_bytes([e[2], e[3]]);
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            if tag == USER || tag == 0x08 {
                format!("{tag:#x}:{perm:o}:{id}")
            } else {
                format!("{tag:#x}:{perm:o}")
            }
        })
        .collect()
}

/// The mode and both ACLs of `p`, for the log.
fn acl_state(p: &Path) -> String {
    let get = |name: &str| match getx(p, name, 4096, true) {
        Ok(v) => format!("{:?}", acl_entries(&v)),
        Err(e) => errno_name(e),
    };
    let st = stat(p, false);
    format!(
        "mode={:?} uid={:?} access={} default={}",
        st.map(|s| format!("{:o}", s.st_mode)),
        st.map(|s| s.st_uid),
        get(ACL_ACCESS),
        get(ACL_DEFAULT)
    )
}

/// Creates, in a forked child with `umask` and (with `nobody`) nobody's
/// credentials: a file `<tag>-file` (mode 0666), a directory `<tag>-dir`
/// (0777), a FIFO `<tag>-fifo` (0666) and an unnamed O_TMPFILE file (0666)
/// in `dir`. Returns each call's errno (0: done) and the O_TMPFILE file's mode.
fn create_in(dir: &Path, tag: &str, umask: u32, nobody: bool) -> Result<[i64; CHILD_VALUES], String> {
    let file = c(&dir.join(format!("{tag}-file")));
    let sub = c(&dir.join(format!("{tag}-dir")));
    let fifo = c(&dir.join(format!("{tag}-fifo")));
    let cdir = c(dir);
    let child = fork_child(move || {
        let mut out = [0i64; CHILD_VALUES];
        let last_errno = || errno() as i64;
        // SAFETY: plain system calls on prepared C strings in the forked child.
        unsafe {
            libc::umask(umask);
            if nobody {
                let ok = libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setresgid(NOGROUP, NOGROUP, NOGROUP) == 0
                    && libc::setresuid(NOBODY, NOBODY, NOBODY) == 0;
                if !ok {
                    out[7] = -1;
                    return out;
                }
            }
            let fd = libc::open(
                file.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                0o666,
            );
            out[0] = if fd < 0 { last_errno() } else { 0 };
            if fd >= 0 {
                libc::close(fd);
            }
            out[1] = if libc::mkdir(sub.as_ptr(), 0o777) < 0 {
                last_errno()
            } else {
                0
            };
            out[2] = if libc::mknod(fifo.as_ptr(), libc::S_IFIFO | 0o666, 0) < 0 {
                last_errno()
            } else {
                0
            };
            let fd = libc::open(cdir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o666);
            if fd < 0 {
                out[3] = last_errno();
            } else {
                let mut st: libc::stat = std::mem::zeroed();
                out[4] = if libc::fstat(fd, &mut st) == 0 {
                    st.st_mode as i64
                } else {
                    -last_errno()
                };
                libc::close(fd);
            }
        }
        out
    });
    child.wait(CHILD_TIMEOUT)
}

const CHILD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

fn log_created(log: &mut Log, ctx: &Ctx, dir: &str, tag: &str, umask: u32, nobody: bool) {
    let d = ctx.p(dir);
    match create_in(&d, tag, umask, nobody) {
        Ok(v) => log.val(
            &format!("{dir}: {tag} creates (umask {umask:03o}): errnos, O_TMPFILE mode"),
            (v[0], v[1], v[2], v[3], format!("{:o}", v[4]), v[7]),
        ),
        Err(e) => log.val(&format!("{dir}: {tag} creates"), format!("child failed: {e}")),
    }
    for kind in ["file", "dir", "fifo"] {
        let p = d.join(format!("{tag}-{kind}"));
        log.val(&format!("{dir}: {tag}-{kind}"), acl_state(&p));
    }
}

fn check_acls(ctx: &Ctx, log: &mut Log) {
    // setfacl -m u:65534:rw f; chmod 640 f
    let f = ctx.p("f");
    fs::write(&f, b"data").expect("create f");
    set_mode(&f, 0o644);
    let a = acl(&[
        (USER_OBJ, 6, 0),
        (USER, 6, NOBODY),
        (GROUP_OBJ, 4, 0),
        (MASK, 6, 0),
        (OTHER, 4, 0),
    ]);
    log.res("f: set an access ACL", &setx(&f, ACL_ACCESS, &a, true));
    log.val("f: after setfacl", acl_state(&f));
    log.res("f: chmod 640", &chmod(&f, 0o640));
    log.val("f: after chmod", acl_state(&f));
    log.res(
        "f: nobody (ACL entry rw, mask r) opens for reading",
        &as_user(NOBODY, NOGROUP, &[], || open_ro(&f)),
    );
    log.res(
        "f: nobody opens for writing",
        &as_user(NOBODY, NOGROUP, &[], || open_wo(&f)),
    );
    log.res("f: chmod 660", &chmod(&f, 0o660));
    log.val("f: after chmod 660", acl_state(&f));
    log.res(
        "f: nobody opens for writing (mask rw)",
        &as_user(NOBODY, NOGROUP, &[], || open_wo(&f)),
    );
    // An ACL with a mask narrower than its entries, then chmod.
    let g = ctx.p("g");
    fs::write(&g, b"data").expect("create g");
    set_mode(&g, 0o640);
    let a = acl(&[
        (USER_OBJ, 4, 0),
        (USER, 6, NOBODY),
        (GROUP_OBJ, 4, 0),
        (MASK, 2, 0),
        (OTHER, 0, 0),
    ]);
    log.res("g: set an ACL with mask -w-", &setx(&g, ACL_ACCESS, &a, true));
    log.val("g: after setfacl", acl_state(&g));
    log.res(
        "g: nobody opens for reading (masked out)",
        &as_user(NOBODY, NOGROUP, &[], || open_ro(&g)),
    );
    for mode in [0o751, 0o400, 0o604] {
        log.res(&format!("g: chmod {mode:o}"), &chmod(&g, mode));
        log.val(&format!("g: after chmod {mode:o}"), acl_state(&g));
        log.res(
            &format!("g: nobody opens for reading after chmod {mode:o}"),
            &as_user(NOBODY, NOGROUP, &[], || open_ro(&g)),
        );
    }
    log.res("g: remove the ACL", &removex(&g, ACL_ACCESS, true));
    log.val("g: after removing it", acl_state(&g));
    // An entry that denies what the other bits allow.
    let h = ctx.p("h");
    fs::write(&h, b"data").expect("create h");
    set_mode(&h, 0o644);
    let a = acl(&[
        (USER_OBJ, 6, 0),
        (USER, 0, NOBODY),
        (GROUP_OBJ, 4, 0),
        (MASK, 4, 0),
        (OTHER, 4, 0),
    ]);
    log.res("h: set an ACL denying nobody", &setx(&h, ACL_ACCESS, &a, true));
    log.res(
        "h: nobody opens for reading",
        &as_user(NOBODY, NOGROUP, &[], || open_ro(&h)),
    );
    // Default ACLs, inherited by what root and nobody create.
    let d = ctx.p("d");
    fs::create_dir(&d).expect("mkdir d");
    set_mode(&d, 0o777);
    let a = acl(&[
        (USER_OBJ, 7, 0),
        (USER, 6, NOBODY),
        (GROUP_OBJ, 5, 0),
        (MASK, 7, 0),
        (OTHER, 1, 0),
    ]);
    log.res("d: set a default ACL", &setx(&d, ACL_DEFAULT, &a, true));
    log.val("d: after setting it", acl_state(&d));
    log_created(log, ctx, "d", "root", 0o022, false);
    log_created(log, ctx, "d", "nobody", 0o077, true);
    log_created(log, ctx, "d/root-dir", "deeper", 0o027, false);
    // Without a default ACL the umask applies as ever.
    let e = ctx.p("e");
    fs::create_dir(&e).expect("mkdir e");
    set_mode(&e, 0o777);
    log_created(log, ctx, "e", "root", 0o027, false);
    log_created(log, ctx, "e", "nobody", 0o002, true);
}

#[test]
fn posix_acls_like_a_plain_directory() {
    differential(
        "posix_acls",
        check_acls,
        &[
            Fs::Passthrough("xattr"),
            Fs::Passthrough("xattr,default_permissions"),
            Fs::Passthrough("xattr,default_permissions,cache=always"),
            Fs::Passthrough("xattr,default_permissions,inode_file_handles=never"),
            Fs::Passthrough("xattr,fd_cache=1"),
        ],
    );
}
