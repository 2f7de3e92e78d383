//! Permission corners of the `passthrough_ll` example, run as root with an
//! unprivileged user (`nobody`) as the other caller, each compared step by
//! step with a plain directory of this machine:
//!
//! - programs another user may execute but not read (mode 0711 and the
//!   like) run through the mount and stay unreadable to that user.
//!
//! Needs root and `/dev/fuse` (skips loudly without, fails under
//! `CI=true`) and the examples built (`cargo build --examples`).

mod common;
mod posix_support;

use posix_support::*;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

// ---------------------------------------------------------------------------
// small wrappers

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
        ],
    );
    if common::require_mount_capability() {
        check_exec_only_without_default_permissions();
    }
}
