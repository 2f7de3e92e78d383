//! Differential security checks of the `passthrough_ll` example: every
//! attack and access check runs as root switching to unprivileged users
//! (uid 65534, uid 1000, uid 0 without capabilities, a process borrowing
//! another's pid number) on a plain tmpfs directory and through the mount,
//! and every step's outcome (errno, resulting mode, owner, content) must be
//! the same: the plain directory is the specification.
//!
//! Each configuration (the option sets below, each with and without
//! `default_permissions`, each with the daemon in the test's pid namespace
//! and in one of its own, over the transport `FUSE_WIRE_TEST_TRANSPORT`
//! selects) is mounted once and runs every check in a fresh subdirectory.
//! A failure lists, per check, each differing step (plain vs mount) and the
//! daemon's last output lines.
//!
//! The named attacks:
//! - S1: a daemon in its own pid namespace sees callers from outside with
//!   pid 0; they must still get their own permissions, not the daemon's.
//! - S2: a caller inside that namespace must not get the supplementary
//!   groups of the process that has its pid number in the daemon's `/proc`.
//! - S3: writes, truncates and chowns clear set-user-ID and set-group-ID
//!   bits as they do natively (also with kernel passthrough); so do
//!   fallocate of every mode, O_DIRECT writes and copy_file_range (S3b),
//!   and file capabilities go as natively; the mode seen through the mount
//!   (the kernel's cached one, `stat -c %a`) agrees at once.
//! - S4: a dentry cached by root's walk does not let another user past a
//!   directory it may not search, nor one cached before its subtree was
//!   moved or linked below such a directory (S4b).
//! - S5: uid 0 without capabilities gets no more than its permission bits.
//! - C1: with the writeback cache, a non-owner with write permission can
//!   write, sync, truncate and close; and still cannot set explicit times.
//!
//! Needs root and `/dev/fuse` (skips loudly without, fails under `CI=true`),
//! `unshare` from util-linux, and the examples built
//! (`cargo build --examples`).

mod common;
mod posix_support;
mod security_support;

use posix_support::{Log, NOBODY, NOGROUP, errno_name, open, pread, pwrite, shape_of, write};
use security_support::callers::{
    EXTRA_GROUP, TWIN_VALUES, USER, USER_GROUP, Who, as_pid_twin, by, by_root_without_caps, rc,
};
use security_support::ops::*;
use security_support::suite::{Check, Config, Ctx, Needs, run_config};
use std::ffi::CString;
use std::path::{Path, PathBuf};

use libc::{F_OK, R_OK, W_OK, X_OK};
use libc::{O_APPEND, O_CREAT, O_DIRECTORY, O_EXCL, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY};

const ROOT: (u32, u32) = (0, 0);
const USERS: [Who; 2] = [Who::Nobody, Who::User];

fn s(p: &Path, name: &str) -> PathBuf {
    p.join(name)
}

/// The mode through the filesystem under test, and as the backing
/// filesystem holds it (past the kernel's attribute cache).
fn log_mode(ctx: &Ctx, log: &mut Log, what: &str, p: &Path) {
    // The mode alone first, as `stat -c %a` asks (from the kernel's cache
    // while valid); then a full lstat, which may refresh it.
    log.res(&format!("mode of {what} (alone)"), &mode_only_of(p));
    log.res(&format!("mode of {what}"), &mode_of(p));
    log.res(&format!("mode of {what} (backing)"), &mode_of(&ctx.backing(p)));
}

// ---------------------------------------------------------------------------
// S1: callers that arrive with pid 0

fn s1_other_user_against_root_files(ctx: &Ctx, log: &mut Log) {
    let secret = mkfile(&ctx.p("secret"), 0o600, ROOT.0, ROOT.1, b"root only");
    let d = mkdirp(&ctx.p("rootdir"), 0o755, 0, 0);
    by(log, Who::Nobody, |l| {
        l.res("read root's 0600 file", &text(&secret));
        l.done("open root's 0600 file read-write", &open(&secret, O_RDWR, 0));
        l.done(
            "create in root's 0755 directory",
            &open(&s(&d, "new"), O_CREAT | O_WRONLY, 0o644),
        );
        l.res("mkdir in root's 0755 directory", &mkdir(&s(&d, "newdir"), 0o755));
        l.res("symlink in root's 0755 directory", &symlink("x", &s(&d, "l")));
        l.res("chmod root's file", &chmod(&secret, 0o666));
        l.res(
            "chown root's file to itself",
            &chown(&secret, NOBODY, NOGROUP, true),
        );
    });
    log.res("what the attempts left in the directory", &names_in(&d));
    log.res(
        "the owner of a file they created (if any)",
        &owner_of(&s(&d, "new")),
    );
    log.res(
        "the owner of the backing file (if any)",
        &owner_of(&ctx.backing(&s(&d, "new"))),
    );
    log.res("root's file", &shape_of(&secret, false));
    log.res("root's file content", &text(&secret));
}

// ---------------------------------------------------------------------------
// S2: the supplementary groups of a pid twin

const TWIN_STEPS: [&str; TWIN_VALUES - 1] = [
    "stat grp/f",
    "open grp/f for reading",
    "open grp for listing",
    "create a file in grp",
    "mkdir in grp",
    "access(grp, R_OK|X_OK)",
    "unlink grp/victim",
];

fn twin_round(ctx: &Ctx, log: &mut Log, what: &str, twin_groups: &[u32], groups: &[u32], round: &str) {
    let g = ctx.p("grp");
    let cs = |p: PathBuf| CString::new(p.to_str().expect("utf-8 path")).expect("no NUL");
    let (cg, cf, cvictim) = (cs(g.clone()), cs(s(&g, "f")), cs(s(&g, "victim")));
    let (cnew, cdir) = (cs(s(&g, &format!("new{round}"))), cs(s(&g, &format!("d{round}"))));
    let ops = || {
        let mut v = [0i64; TWIN_VALUES];
        // SAFETY: (each call) valid C strings and a live stat buffer; any
        // descriptor opened is closed at once.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            v[0] = rc(libc::stat(cf.as_ptr(), &mut st) as i64);
            let fd = libc::open(cf.as_ptr(), O_RDONLY);
            v[1] = rc(fd as i64);
            if fd >= 0 {
                libc::close(fd);
            }
            let fd = libc::open(cg.as_ptr(), O_RDONLY | O_DIRECTORY);
            v[2] = rc(fd as i64);
            if fd >= 0 {
                libc::close(fd);
            }
            let fd = libc::open(cnew.as_ptr(), O_CREAT | O_EXCL | O_WRONLY, 0o644);
            v[3] = rc(fd as i64);
            if fd >= 0 {
                libc::close(fd);
            }
            v[4] = rc(libc::mkdir(cdir.as_ptr(), 0o755) as i64);
            v[5] = rc(libc::access(cg.as_ptr(), R_OK | X_OK) as i64);
            v[6] = if round == "1" {
                // Only the attacker tries to destroy.
                rc(libc::unlink(cvictim.as_ptr()) as i64)
            } else {
                0
            };
        }
        v
    };
    let ns = ctx
        .pid_ns
        .as_ref()
        .expect("S2 runs with the daemon in its own pid namespace");
    let (uid, gid) = (NOBODY, NOGROUP);
    let v = as_pid_twin(ns, twin_groups, uid, gid, groups, &ops).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        v[TWIN_VALUES - 1],
        1,
        "{what}: the caller did not get the twin's pid number in the daemon's namespace"
    );
    for (i, step) in TWIN_STEPS.iter().enumerate() {
        let r: Result<(), i32> = if v[i] == 0 { Ok(()) } else { Err(v[i] as i32) };
        log.done(&format!("{what}: {step}"), &r);
    }
}

/// The daemon runs in a pid namespace of its own but sees the test's
/// `/proc` (no `--mount-proc`, or its mount would be invisible here). A
/// caller inside that namespace arrives with its pid *there*; a daemon that
/// looks that number up in its `/proc` finds another process: the "twin",
/// which this check creates with the groups it wants the daemon to borrow,
/// and gives the caller the twin's number with `clone3(set_tid)`.
fn s2_groups_of_a_pid_twin(ctx: &Ctx, log: &mut Log) {
    let g = mkdirp(&ctx.p("grp"), 0o070, 0, USER_GROUP);
    mkfile(&s(&g, "f"), 0o060, 0, USER_GROUP, b"group 1000 only");
    mkfile(
        &s(&g, "victim"),
        0o060,
        0,
        USER_GROUP,
        b"to be removed by group 1000 only",
    );
    // The attack: no groups, but the process with the same pid number in
    // the daemon's /proc has group 1000.
    twin_round(
        ctx,
        log,
        "uid 65534 without groups, twin in group 1000",
        &[USER_GROUP],
        &[],
        "1",
    );
    // And the other way round: a member must not lose its group either.
    // Only where the kernel checks permissions: without default_permissions
    // the daemon cannot know the groups of a caller numbered in a pid
    // namespace its /proc does not show, and then denies by rule
    // (docs/security.md), where a plain directory would let the member in.
    if ctx.cfg.default_permissions {
        twin_round(
            ctx,
            log,
            "uid 65534 in group 1000, twin without groups",
            &[],
            &[USER_GROUP],
            "2",
        );
    }
    log.res("what is in grp now", &names_in(&g));
    log.res("grp/f", &text(&s(&g, "f")));
}

// ---------------------------------------------------------------------------
// S3: set-ID bits cleared by writes, truncates and chowns

const SETID_MODES: [(&str, u32); 4] = [
    ("4777", 0o4777),
    ("2777", 0o2777),
    ("6777", 0o6777),
    ("2767", 0o2767),
];

fn s3_setid_cleared_by_append(ctx: &Ctx, log: &mut Log) {
    let files: Vec<(String, PathBuf)> = SETID_MODES
        .iter()
        .map(|(n, m)| (n.to_string(), mkfile(&ctx.p(&format!("f{n}")), *m, 0, 0, b"x")))
        .collect();
    by(log, Who::Nobody, |l| {
        for (n, p) in &files {
            l.res(
                &format!("append to root's {n} file"),
                &open_write(p, O_WRONLY | O_APPEND, b"y"),
            );
        }
    });
    for (n, p) in &files {
        log_mode(ctx, log, &format!("the {n} file after the append"), p);
        log.res(&format!("content of the {n} file"), &text(p));
    }
}

fn s3_setid_cleared_by_write(ctx: &Ctx, log: &mut Log) {
    let files: Vec<(String, PathBuf)> = SETID_MODES
        .iter()
        .map(|(n, m)| (n.to_string(), mkfile(&ctx.p(&format!("f{n}")), *m, 0, 0, b"xxxx")))
        .collect();
    let owned = mkfile(&ctx.p("owned"), 0o4755, NOBODY, NOGROUP, b"xxxx");
    let rootw = mkfile(&ctx.p("rootw"), 0o6777, 0, 0, b"xxxx");
    by(log, Who::Nobody, |l| {
        for (n, p) in &files {
            l.res(
                &format!("write into root's {n} file"),
                &open_write(p, O_WRONLY, b"y"),
            );
            l.res(
                &format!("read-write pwrite into root's {n} file"),
                &open(p, O_RDWR, 0).and_then(|fd| pwrite(&fd, b"z", 2)),
            );
        }
        l.res(
            "the owner writes its own 4755 file",
            &open_write(&owned, O_WRONLY, b"o"),
        );
    });
    log.res(
        "root writes its own 6777 file",
        &open_write(&rootw, O_WRONLY, b"r"),
    );
    for (n, p) in &files {
        log_mode(ctx, log, &format!("the {n} file after the writes"), p);
        log.res(&format!("content of the {n} file"), &text(p));
    }
    log_mode(ctx, log, "the owner's 4755 file after its write", &owned);
    log_mode(ctx, log, "root's 6777 file after root's write (kept)", &rootw);
}

fn s3_setid_cleared_by_truncate(ctx: &Ctx, log: &mut Log) {
    let mk = |pre: &str| -> Vec<(String, PathBuf)> {
        SETID_MODES
            .iter()
            .map(|(n, m)| {
                (
                    n.to_string(),
                    mkfile(&ctx.p(&format!("{pre}{n}")), *m, 0, 0, b"0123456789"),
                )
            })
            .collect()
    };
    let (trunc, ftrunc, otrunc) = (mk("t"), mk("ft"), mk("ot"));
    by(log, Who::Nobody, |l| {
        for (n, p) in &trunc {
            l.res(&format!("truncate root's {n} file"), &truncate(p, 3));
        }
        for (n, p) in &ftrunc {
            l.res(
                &format!("ftruncate root's {n} file"),
                &open(p, O_WRONLY, 0).and_then(|fd| ftruncate(&fd, 5)),
            );
        }
        for (n, p) in &otrunc {
            l.done(
                &format!("O_TRUNC open of root's {n} file"),
                &open(p, O_WRONLY | O_TRUNC, 0),
            );
        }
    });
    for (what, set) in [("truncate", &trunc), ("ftruncate", &ftrunc), ("O_TRUNC", &otrunc)] {
        for (n, p) in set {
            log_mode(ctx, log, &format!("the {n} file after {what}"), p);
            log.res(&format!("size of the {n} file after {what}"), &shape_of(p, false));
        }
    }
}

fn s3_setid_cleared_by_chown(ctx: &Ctx, log: &mut Log) {
    let a = mkfile(&ctx.p("suid"), 0o4755, USER, USER_GROUP, b"x");
    let b = mkfile(&ctx.p("sgid"), 0o2755, USER, USER_GROUP, b"x");
    let c = mkfile(&ctx.p("sgid_noexec"), 0o2745, USER, USER_GROUP, b"x");
    let d = mkfile(&ctx.p("both"), 0o6755, USER, USER_GROUP, b"x");
    let e = mkfile(&ctx.p("owners"), 0o4755, USER, USER_GROUP, b"x");
    let dir = mkdirp(&ctx.p("sgid_dir"), 0o2755, USER, USER_GROUP);
    log.res("root chowns a 4755 file to root", &chown(&a, 0, 0, true));
    log.res("root chgrps a 2755 file", &chown(&b, u32::MAX, 0, true));
    log.res("root chgrps a 2745 file", &chown(&c, u32::MAX, 0, true));
    // A group root is not in: root keeps S_ISGID by CAP_FSETID (xfstests
    // generic/193).
    let c2 = mkfile(&ctx.p("sgid_noexec2"), 0o2745, USER, 0, b"x");
    let c3 = mkfile(&ctx.p("both_noexec"), 0o6745, USER, 0, b"x");
    log.res(
        "root chowns a 2745 file to another group",
        &chown(&c2, USER, USER_GROUP, true),
    );
    log.res(
        "root chowns a 6745 file to another group",
        &chown(&c3, USER, USER_GROUP, true),
    );
    log_mode(ctx, log, "the 2745 file after the chown to another group", &c2);
    log_mode(ctx, log, "the 6745 file after the chown to another group", &c3);
    log.res(
        "root chowns a 6755 file to its owner",
        &chown(&d, USER, USER_GROUP, true),
    );
    log.res("root chowns a 2755 directory", &chown(&dir, 0, 0, true));
    by(log, Who::User, |l| {
        l.res(
            "the owner chgrps its 4755 file to its own group",
            &chown(&e, u32::MAX, USER_GROUP, true),
        );
    });
    for (what, p) in [
        ("the 4755 file", &a),
        ("the 2755 file", &b),
        ("the 2745 file", &c),
        ("the 6755 file", &d),
        ("the owner's 4755 file", &e),
        ("the 2755 directory", &dir),
    ] {
        log_mode(ctx, log, &format!("{what} after the chown"), p);
        log.res(&format!("owner of {what}"), &owner_of(p));
    }
}

/// S3b: FALLOCATE comes without a kill flag; the bits go as on a plain
/// directory for every mode flag, for callers without CAP_FSETID only.
fn s3_setid_cleared_by_fallocate(ctx: &Ctx, log: &mut Log) {
    const FLAGS: [(&str, i32); 4] = [
        ("extend", 0),
        ("keep size", libc::FALLOC_FL_KEEP_SIZE),
        (
            "punch hole",
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        ),
        ("zero range", libc::FALLOC_FL_ZERO_RANGE),
    ];
    let data = vec![b'x'; 3 * 4096];
    let mut files = Vec::new();
    for (fname, flag) in FLAGS {
        for (n, m) in SETID_MODES {
            let p = mkfile(&ctx.p(&format!("{}{n}", fname.replace(' ', "_"))), m, 0, 0, &data);
            files.push((format!("{fname} of root's {n} file"), p, flag));
        }
    }
    // Stat everything first, so that the kernel has the modes cached.
    for (what, p, _) in &files {
        log_mode(ctx, log, &format!("{what}: before"), p);
    }
    by(log, Who::Nobody, |l| {
        for (what, p, flag) in &files {
            l.res(
                what,
                &open(p, O_RDWR, 0).and_then(|fd| fallocate(&fd, *flag, 0, 4 * 4096)),
            );
        }
    });
    for (what, p, _) in &files {
        log_mode(ctx, log, &format!("{what}: after"), p);
        log.res(&format!("{what}: content"), &text(p).map(|t| t.len()));
    }
    // Kept for root with CAP_FSETID; gone for root without it.
    let rootf = mkfile(&ctx.p("root_keeps"), 0o6777, 0, 0, &data);
    log.res(
        "root fallocates its 6777 file",
        &open(&rootf, O_RDWR, 0).and_then(|fd| fallocate(&fd, 0, 0, 5 * 4096)),
    );
    log_mode(ctx, log, "root's 6777 file after root's fallocate (kept)", &rootf);
    // A root caller from outside the daemon's pid namespace (pid 0) cannot
    // be told from the kernel's own requests and is served as root
    // (docs/security.md, limits), capabilities or not.
    if ctx.pid_ns.is_none() {
        let capless = mkfile(&ctx.p("capless_root"), 0o6777, 0, 0, &data);
        by_root_without_caps(log, |l| {
            l.res(
                "fallocate of root's 6777 file",
                &open(&capless, O_RDWR, 0).and_then(|fd| fallocate(&fd, 0, 0, 5 * 4096)),
            );
        });
        log_mode(
            ctx,
            log,
            "the 6777 file after capability-less root's fallocate",
            &capless,
        );
    }
}

/// An O_DIRECT write, and a COPY_FILE_RANGE into the file (which comes
/// without a kill flag).
fn s3_setid_cleared_by_direct_write_and_copy(ctx: &Ctx, log: &mut Log) {
    let data = vec![b'x'; 8192];
    let mut direct = Vec::new();
    let mut copied = Vec::new();
    for (n, m) in SETID_MODES {
        direct.push((n, mkfile(&ctx.p(&format!("direct{n}")), m, 0, 0, &data)));
        copied.push((n, mkfile(&ctx.p(&format!("copied{n}")), m, 0, 0, &data)));
    }
    let from = mkfile(&ctx.p("from"), 0o644, 0, 0, b"copied over");
    for (i, (n, p)) in direct.iter().chain(&copied).enumerate() {
        log_mode(ctx, log, &format!("{n} file #{i} before"), p);
    }
    by(log, Who::Nobody, |l| {
        for (n, p) in &direct {
            l.res(&format!("O_DIRECT write into root's {n} file"), &direct_write(p));
        }
        for (n, p) in &copied {
            l.res(
                &format!("copy_file_range into root's {n} file"),
                &open(&from, O_RDONLY, 0)
                    .and_then(|a| open(p, O_WRONLY, 0).and_then(|b| copy_range(&a, &b, 11))),
            );
        }
    });
    for (n, p) in &direct {
        log_mode(ctx, log, &format!("the {n} file after the O_DIRECT write"), p);
    }
    for (n, p) in &copied {
        log_mode(ctx, log, &format!("the {n} file after copy_file_range"), p);
        log.res(&format!("content of the {n} file"), &text(p));
    }
}

/// One step on a path, with its outcome.
type PathOp = fn(&Path) -> Result<i64, i32>;

/// File capabilities (`security.capability`) go when an unprivileged caller
/// writes, truncates or fallocates the file, and when root chowns it; the
/// change itself succeeds.
fn s3_file_capabilities_dropped(ctx: &Ctx, log: &mut Log) {
    let caps = file_caps();
    let ops: [(&str, PathOp); 4] = [
        ("write", |p| open_write(p, O_WRONLY | O_APPEND, b"more")),
        ("truncate", |p| truncate(p, 2)),
        ("fallocate", |p| {
            open(p, O_RDWR, 0).and_then(|fd| fallocate(&fd, 0, 0, 8192))
        }),
        ("O_TRUNC open", |p| open(p, O_WRONLY | O_TRUNC, 0).map(|_| 0)),
    ];
    let files: Vec<PathBuf> = ops
        .iter()
        .map(|(what, _)| {
            let p = mkfile(&ctx.p(&what.replace(' ', "_")), 0o777, 0, 0, b"binary");
            log.res(
                &format!("root sets file capabilities on the {what} file"),
                &setx(&p, "security.capability", &caps, true),
            );
            log.res(&format!("capabilities of the {what} file before"), &caps_len(&p));
            p
        })
        .collect();
    by(log, Who::Nobody, |l| {
        for ((what, op), p) in ops.iter().zip(&files) {
            l.res(&format!("{what} of root's 0777 file with capabilities"), &op(p));
        }
    });
    for ((what, _), p) in ops.iter().zip(&files) {
        log.res(&format!("capabilities of the {what} file after"), &caps_len(p));
        log.res(
            &format!("capabilities of the {what} file after (backing)"),
            &caps_len(&ctx.backing(p)),
        );
        log.res(&format!("content of the {what} file"), &text(p));
    }
    let owned = mkfile(&ctx.p("chowned"), 0o755, 0, 0, b"binary");
    log.res(
        "root sets capabilities on a file",
        &setx(&owned, "security.capability", &caps, true),
    );
    log.res("root chowns it", &chown(&owned, USER, USER_GROUP, true));
    log.res("its capabilities after the chown", &caps_len(&owned));
    by(log, Who::Nobody, |l| {
        l.res(
            "remove the capabilities of root's file",
            &removex(&files[0], "security.capability"),
        );
    });
}

// ---------------------------------------------------------------------------
// S4: what root's walk cached does not let others past

fn s4_cached_walk_into_private_dir(ctx: &Ctx, log: &mut Log) {
    let d = mkdirp(&ctx.p("secret"), 0o700, 0, 0);
    let f = mkfile(&s(&d, "file"), 0o644, 0, 0, b"behind a 0700 directory");
    let w = mkfile(&s(&d, "writable"), 0o666, 0, 0, b"w");
    let sub = mkdirp(&s(&d, "sub"), 0o755, 0, 0);
    let deep = mkfile(&s(&sub, "file"), 0o644, 0, 0, b"deeper");
    let missing = s(&d, "missing");
    // Root walks everything: dentries, attributes and negative entries cached.
    log.res("root reads secret/file", &text(&f));
    log.res("root reads secret/sub/file", &text(&deep));
    log.res("root reads secret/writable", &text(&w));
    log.res("root stats secret/missing", &shape_of(&missing, false));
    log.res("root lists secret/sub", &names_in(&sub));
    for who in USERS {
        by(log, who, |l| {
            l.res("stat secret/file", &shape_of(&f, false));
            l.res("read secret/file", &text(&f));
            l.res("access(secret/file, R_OK)", &access(&f, R_OK));
            l.res("getxattr on secret/file", &getx(&f, "user.none"));
            l.res("write secret/writable", &open_write(&w, O_WRONLY, b"pwned"));
            l.res("truncate secret/writable", &truncate(&w, 0));
            l.res("stat secret/missing", &shape_of(&missing, false));
            l.done(
                "create secret/missing",
                &open(&missing, O_CREAT | O_WRONLY, 0o644),
            );
            l.res("stat secret/sub", &shape_of(&sub, false));
            l.res("list secret/sub", &names_in(&sub));
            l.res("stat secret/sub/file", &shape_of(&deep, false));
            l.res("read secret/sub/file", &text(&deep));
            l.res("stat secret/sub/nothing", &shape_of(&s(&sub, "nothing"), false));
        });
    }
    log.res("secret/writable afterwards", &text(&w));
    log.res("secret afterwards", &names_in(&d));
}

/// S4b: a subtree others walked while it was reachable, then moved (or
/// linked) below a directory they may not search.
fn s4_moved_into_private_dir(ctx: &Ctx, log: &mut Log) {
    let public = mkdirp(&ctx.p("pub"), 0o755, 0, 0);
    let secret = mkdirp(&ctx.p("secret"), 0o700, 0, 0);
    let a = mkdirp(&s(&public, "a"), 0o755, 0, 0);
    mkfile(&s(&a, "f"), 0o644, 0, 0, b"in a moved directory");
    let sub = mkdirp(&s(&a, "sub"), 0o755, 0, 0);
    mkfile(&s(&sub, "g"), 0o644, 0, 0, b"deeper in it");
    let lone = mkfile(&s(&public, "lone"), 0o644, 0, 0, b"a moved file");
    let linked = mkfile(&s(&public, "linked"), 0o644, 0, 0, b"a linked file");
    let other = mkdirp(&ctx.p("other"), 0o755, 0, 0);
    let x = mkdirp(&s(&other, "x"), 0o755, 0, 0);
    mkfile(&s(&x, "f"), 0o644, 0, 0, b"exchanged");
    let y = mkfile(&s(&secret, "y"), 0o644, 0, 0, b"exchanged the other way");
    for who in USERS {
        by(log, who, |l| {
            l.res("read pub/a/f", &text(&s(&a, "f")));
            l.res("read pub/a/sub/g", &text(&s(&sub, "g")));
            l.res("read pub/lone", &text(&lone));
            l.res("read pub/linked", &text(&linked));
            l.res("read other/x/f", &text(&s(&x, "f")));
        });
    }
    log.res("root moves pub/a into secret", &rename(&a, &s(&secret, "a")));
    log.res(
        "root moves pub/lone into secret",
        &rename(&lone, &s(&secret, "lone")),
    );
    log.res(
        "root links pub/linked into secret",
        &link(&linked, &s(&secret, "linked")),
    );
    log.res("root unlinks pub/linked", &unlink(&linked));
    log.res(
        "root exchanges other/x and secret/y",
        &rename2(&x, &y, libc::RENAME_EXCHANGE),
    );
    for who in USERS {
        by(log, who, |l| {
            l.res("stat secret/a", &shape_of(&s(&secret, "a"), false));
            l.res("read secret/a/f", &text(&s(&secret, "a/f")));
            l.res("read secret/a/sub/g", &text(&s(&secret, "a/sub/g")));
            l.res("list secret/a/sub", &names_in(&s(&secret, "a/sub")));
            l.res("read secret/lone", &text(&s(&secret, "lone")));
            l.res(
                "write secret/lone",
                &open_write(&s(&secret, "lone"), O_WRONLY, b"pwned"),
            );
            l.res("read secret/linked", &text(&s(&secret, "linked")));
            l.res("read secret/y/f (was other/x)", &text(&s(&secret, "y/f")));
            l.res("read other/x (was secret/y)", &text(&x));
        });
    }
    log.res("secret/lone afterwards", &text(&s(&secret, "lone")));
    // Last: a chmod that closes a directory drops every cached entry
    // (s4_search_permission_revoked), which would hide the above.
    let chowned = mkdirp(&ctx.p("chowned"), 0o750, USER, USER_GROUP);
    mkfile(
        &s(&chowned, "f"),
        0o644,
        USER,
        USER_GROUP,
        b"in a directory given away",
    );
    by(log, Who::User, |l| {
        l.res("read chowned/f", &text(&s(&chowned, "f")))
    });
    log.res("root chowns chowned to root", &chown(&chowned, 0, 0, true));
    by(log, Who::User, |l| {
        l.res("read chowned/f after", &text(&s(&chowned, "f")))
    });
}

fn s4_search_permission_revoked(ctx: &Ctx, log: &mut Log) {
    let d = mkdirp(&ctx.p("was_open"), 0o755, 0, 0);
    let f = mkfile(
        &s(&d, "file"),
        0o666,
        0,
        0,
        b"readable while the directory was open",
    );
    let sub = mkdirp(&s(&d, "sub"), 0o755, 0, 0);
    let deep = mkfile(&s(&sub, "file"), 0o644, 0, 0, b"deep");
    by(log, Who::Nobody, |l| {
        l.res("read was_open/file while allowed", &text(&f));
        l.res("read was_open/sub/file while allowed", &text(&deep));
    });
    log.res("root closes the directory (chmod 0700)", &chmod(&d, 0o700));
    by(log, Who::Nobody, |l| {
        l.res("stat was_open/file", &shape_of(&f, false));
        l.res("read was_open/file", &text(&f));
        l.res("write was_open/file", &open_write(&f, O_WRONLY, b"late"));
        l.res("read was_open/sub/file", &text(&deep));
        l.res("list was_open/sub", &names_in(&sub));
    });
    log.res("was_open/file afterwards", &text(&f));
}

// ---------------------------------------------------------------------------
// S5: uid 0 without capabilities

fn s5_root_without_capabilities(ctx: &Ctx, log: &mut Log) {
    let home = mkdirp(&ctx.p("home"), 0o755, USER, USER_GROUP);
    let theirs = mkfile(&s(&home, "private"), 0o600, USER, USER_GROUP, b"1000's secret");
    let ro = mkfile(&s(&home, "ro"), 0o444, USER, USER_GROUP, b"read-only");
    let rootro = mkfile(&ctx.p("rootro"), 0o444, 0, 0, b"root's read-only");
    let mine = mkfile(&ctx.p("mine"), 0o600, 0, 0, b"root's own");
    let closed = mkdirp(&ctx.p("closed"), 0o700, USER, USER_GROUP);
    let inside = mkfile(&s(&closed, "f"), 0o644, USER, USER_GROUP, b"inside");
    by_root_without_caps(log, |l| {
        l.res("read 1000's 0600 file", &text(&theirs));
        l.done("open 1000's 0600 file for writing", &open(&theirs, O_WRONLY, 0));
        l.res("access(1000's 0600 file, R_OK)", &access(&theirs, R_OK));
        l.res("write 1000's 0444 file", &open_write(&ro, O_WRONLY, b"w"));
        l.res("write root's own 0444 file", &open_write(&rootro, O_WRONLY, b"w"));
        l.res("truncate 1000's 0444 file", &truncate(&ro, 0));
        l.res("chown 1000's file to root", &chown(&theirs, 0, 0, true));
        l.res("chmod 1000's file", &chmod(&theirs, 0o666));
        l.res(
            "set explicit times on 1000's file",
            &utimens(&theirs, Some([ts(1000, 0), ts(1000, 0)]), true),
        );
        l.done(
            "create in 1000's 0755 directory",
            &open(&s(&home, "new"), O_CREAT | O_WRONLY, 0o644),
        );
        l.res("unlink in 1000's 0755 directory", &unlink(&ro));
        l.res("mkdir in 1000's 0755 directory", &mkdir(&s(&home, "d"), 0o755));
        l.res("read through 1000's 0700 directory", &text(&inside));
        l.res("list 1000's 0700 directory", &names_in(&closed));
        l.res("read its own 0600 file", &text(&mine));
        l.res(
            "chown its own file to 1000",
            &chown(&mine, USER, USER_GROUP, true),
        );
        l.res("chmod its own file", &chmod(&mine, 0o640));
        l.res(
            "mknod a character device",
            &mknod(&ctx.p("null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3)),
        );
    });
    log.res("1000's 0600 file", &shape_of(&theirs, false));
    log.res("1000's 0444 file", &text(&ro));
    log.res("root's 0444 file", &text(&rootro));
    log.res("root's own file", &shape_of(&mine, false));
    log.res("1000's directory", &names_in(&home));
}

// ---------------------------------------------------------------------------
// C1: a non-owner writing with the writeback cache

fn c1_non_owner_writer(ctx: &Ctx, log: &mut Log) {
    let f = mkfile(&ctx.p("shared"), 0o666, 0, 0, b"0123456789");
    let g = mkfile(&ctx.p("group_shared"), 0o660, 0, USER_GROUP, b"abcdefghij");
    for (who, p) in [(Who::Nobody, &f), (Who::User, &g)] {
        by(log, who, |l| {
            match open(p, O_RDWR, 0) {
                Ok(fd) => {
                    l.res("pwrite abc at 2", &pwrite(&fd, b"abc", 2));
                    l.res("fsync", &fsync(&fd));
                    l.res("ftruncate to 8", &ftruncate(&fd, 8));
                    l.res("pwrite Z at 0", &pwrite(&fd, b"Z", 0));
                    l.res("fdatasync", &fdatasync(&fd));
                    l.res(
                        "read back",
                        &pread(&fd, 100, 0).map(|b| String::from_utf8_lossy(&b).into_owned()),
                    );
                    l.res(
                        "futimens to a past time",
                        &futimens(&fd, Some([ts(1000, 0), ts(2000, 0)])),
                    );
                    l.res("futimens now", &futimens(&fd, None));
                    l.res("close", &close(fd));
                }
                Err(e) => l.val("open read-write", errno_name(e)),
            }
            l.res("content after close", &text(p));
            match open(p, O_WRONLY | O_APPEND, 0) {
                Ok(fd) => {
                    l.res("append", &write(&fd, b"+"));
                    l.res("close after append", &close(fd));
                }
                Err(e) => l.val("open for appending", errno_name(e)),
            }
            l.res("truncate by path to 6", &truncate(p, 6));
            l.res("content after truncate", &text(p));
            l.res(
                "utimensat to a past time",
                &utimens(p, Some([ts(1000, 0), ts(2000, 0)]), true),
            );
            l.res(
                "utimensat only mtime to a past time",
                &utimens(p, Some([ts(0, libc::UTIME_OMIT), ts(3000, 0)]), true),
            );
            l.res("utimensat now", &utimens(p, None, true));
            l.res(
                "utimensat UTIME_NOW, UTIME_NOW",
                &utimens(p, Some([ts(0, libc::UTIME_NOW), ts(0, libc::UTIME_NOW)]), true),
            );
        });
        log.res("content (backing)", &text(&ctx.backing(p)));
        log.res("shape", &shape_of(p, false));
        log.res(
            "mtime is not a time the non-owner set",
            &mtime_of(p).map(|(s, _)| s > 100_000),
        );
    }
}

// ---------------------------------------------------------------------------
// ordinary permission checks: reading and writing by mode

const FILE_MODES: [u32; 9] = [0o644, 0o640, 0o604, 0o600, 0o400, 0o000, 0o066, 0o460, 0o406];

/// Files named `<owner>_<mode>` owned by root and by uid 1000 (each in its
/// own group), one per mode.
fn files_by_mode(ctx: &Ctx, pre: &str) -> Vec<(String, PathBuf)> {
    let mut v = Vec::new();
    for (owner, uid, gid) in [("root", 0, 0), ("u1000", USER, USER_GROUP)] {
        for m in FILE_MODES {
            let n = format!("{owner}_{m:04o}");
            v.push((
                n.clone(),
                mkfile(&ctx.p(&format!("{pre}{n}")), m, uid, gid, n.as_bytes()),
            ));
        }
    }
    v
}

fn a01_read_by_mode(ctx: &Ctx, log: &mut Log) {
    let files = files_by_mode(ctx, "");
    for who in USERS {
        by(log, who, |l| {
            for (n, p) in &files {
                l.res(&format!("read {n}"), &text(p));
            }
        });
    }
}

fn a02_write_by_mode(ctx: &Ctx, log: &mut Log) {
    let files = files_by_mode(ctx, "");
    for who in USERS {
        by(log, who, |l| {
            for (n, p) in &files {
                l.res(&format!("write {n}"), &open_write(p, O_WRONLY, b"W"));
            }
        });
    }
    for (n, p) in &files {
        log.res(&format!("content of {n}"), &text(p));
    }
}

fn a03_open_trunc(ctx: &Ctx, log: &mut Log) {
    let files = files_by_mode(ctx, "");
    for who in USERS {
        by(log, who, |l| {
            for (n, p) in &files {
                l.done(&format!("O_TRUNC {n}"), &open(p, O_WRONLY | O_TRUNC, 0));
                l.done(&format!("O_RDWR {n}"), &open(p, O_RDWR, 0));
            }
        });
    }
    for (n, p) in &files {
        log.res(&format!("content of {n}"), &text(p));
    }
}

fn a04_access_checks(ctx: &Ctx, log: &mut Log) {
    let files = files_by_mode(ctx, "");
    let x = [
        mkfile(&ctx.p("x0755"), 0o755, 0, 0, b""),
        mkfile(&ctx.p("x0754"), 0o754, 0, USER_GROUP, b""),
        mkfile(&ctx.p("x0744"), 0o744, 0, 0, b""),
        mkfile(&ctx.p("x0644"), 0o644, 0, 0, b""),
        mkdirp(&ctx.p("d0711"), 0o711, 0, 0),
        mkdirp(&ctx.p("d0700"), 0o700, 0, 0),
        mkdirp(&ctx.p("d0770"), 0o770, 0, USER_GROUP),
    ];
    let modes = [
        ("F_OK", F_OK),
        ("R_OK", R_OK),
        ("W_OK", W_OK),
        ("X_OK", X_OK),
        ("R_OK|W_OK", R_OK | W_OK),
    ];
    for who in USERS {
        by(log, who, |l| {
            for (n, p) in &files {
                for (mn, m) in modes {
                    l.res(&format!("access({n}, {mn})"), &access(p, m));
                }
                l.res(
                    &format!("faccessat({n}, R_OK|W_OK, AT_EACCESS)"),
                    &eaccess(p, R_OK | W_OK),
                );
            }
            for p in &x {
                let n = p.file_name().expect("name").to_string_lossy();
                for (mn, m) in modes {
                    l.res(&format!("access({n}, {mn})"), &access(p, m));
                }
            }
        });
    }
    for p in &x {
        let n = p.file_name().expect("name").to_string_lossy();
        log.res(&format!("root: access({n}, X_OK)"), &access(p, X_OK));
        log.res(&format!("root: access({n}, W_OK)"), &access(p, W_OK));
    }
}

fn a05_owner_and_group_class_precedence(ctx: &Ctx, log: &mut Log) {
    // The owner's bits apply to the owner even when others' are wider.
    let own = mkfile(&ctx.p("owner_denied"), 0o077, USER, USER_GROUP, b"others may");
    // The group's bits apply to the group even when others' are wider.
    let grp = mkfile(&ctx.p("group_denied"), 0o604, 0, USER_GROUP, b"others may");
    let dgrp = mkdirp(&ctx.p("dir_group_denied"), 0o705, 0, USER_GROUP);
    mkfile(&s(&dgrp, "f"), 0o644, 0, 0, b"f");
    for who in USERS {
        by(log, who, |l| {
            l.res("read a 0077 file of 1000's", &text(&own));
            l.res("write a 0077 file of 1000's", &open_write(&own, O_WRONLY, b"x"));
            l.res("read a 0604 file of group 1000", &text(&grp));
            l.res("list a 0705 directory of group 1000", &names_in(&dgrp));
            l.res(
                "read a file in a 0705 directory of group 1000",
                &text(&s(&dgrp, "f")),
            );
        });
    }
}

// ---------------------------------------------------------------------------
// creating and removing in directories of various modes

/// Directories named after their owner and mode.
fn dirs_by_mode(ctx: &Ctx) -> Vec<(String, PathBuf)> {
    let specs: [(&str, u32, u32, u32); 9] = [
        ("root_0755", 0o755, 0, 0),
        ("root_0777", 0o777, 0, 0),
        ("root_0775_g1000", 0o775, 0, USER_GROUP),
        ("root_0703", 0o703, 0, 0),
        ("root_0766", 0o766, 0, 0),
        ("root_0701", 0o701, 0, 0),
        ("u1000_0700", 0o700, USER, USER_GROUP),
        ("u1000_0500", 0o500, USER, USER_GROUP),
        ("u65534_0755", 0o755, NOBODY, NOGROUP),
    ];
    specs
        .iter()
        .map(|(n, m, u, g)| (n.to_string(), mkdirp(&ctx.p(n), *m, *u, *g)))
        .collect()
}

fn who_tag(who: Who) -> &'static str {
    match who {
        Who::Nobody => "n",
        Who::User => "u",
        Who::Member => "m",
    }
}

fn a06_create_in_dirs(ctx: &Ctx, log: &mut Log) {
    let dirs = dirs_by_mode(ctx);
    for who in USERS {
        by(log, who, |l| {
            for (n, d) in &dirs {
                let f = s(d, &format!("f_{}", who_tag(who)));
                l.done(
                    &format!("create in {n}"),
                    &open(&f, O_CREAT | O_EXCL | O_WRONLY, 0o640),
                );
                l.res(
                    &format!("mknod a fifo in {n}"),
                    &mknod(&s(d, &format!("p_{}", who_tag(who))), libc::S_IFIFO | 0o640, 0),
                );
                l.res(
                    &format!("symlink in {n}"),
                    &symlink("target", &s(d, &format!("l_{}", who_tag(who)))),
                );
            }
        });
    }
    for (n, d) in &dirs {
        for name in ["f_n", "f_u", "p_n", "p_u", "l_n", "l_u"] {
            log.res(&format!("{n}/{name}"), &shape_of(&s(d, name), false));
        }
    }
}

fn a07_mkdir_in_dirs(ctx: &Ctx, log: &mut Log) {
    let dirs = dirs_by_mode(ctx);
    for who in USERS {
        by(log, who, |l| {
            for (n, d) in &dirs {
                l.res(
                    &format!("mkdir in {n}"),
                    &mkdir(&s(d, &format!("d_{}", who_tag(who))), 0o750),
                );
            }
        });
    }
    for (n, d) in &dirs {
        for name in ["d_n", "d_u"] {
            log.res(&format!("{n}/{name}"), &shape_of(&s(d, name), false));
        }
    }
}

fn a08_unlink_in_dirs(ctx: &Ctx, log: &mut Log) {
    let dirs = dirs_by_mode(ctx);
    for (_, d) in &dirs {
        for (name, uid, gid) in [
            ("root_f", 0, 0),
            ("n_f", NOBODY, NOGROUP),
            ("u_f", USER, USER_GROUP),
        ] {
            mkfile(&s(d, name), 0o644, uid, gid, b"victim");
        }
    }
    for who in USERS {
        by(log, who, |l| {
            for (n, d) in &dirs {
                l.res(&format!("unlink {n}/root_f"), &unlink(&s(d, "root_f")));
                let mine = if who == Who::Nobody { "n_f" } else { "u_f" };
                l.res(&format!("unlink its own file in {n}"), &unlink(&s(d, mine)));
            }
        });
    }
    for (n, d) in &dirs {
        log.res(&format!("{n} afterwards"), &names_in(d));
    }
}

fn a09_rmdir_in_dirs(ctx: &Ctx, log: &mut Log) {
    let dirs = dirs_by_mode(ctx);
    for (_, d) in &dirs {
        for (name, uid, gid) in [
            ("root_d", 0, 0),
            ("n_d", NOBODY, NOGROUP),
            ("u_d", USER, USER_GROUP),
        ] {
            mkdirp(&s(d, name), 0o755, uid, gid);
        }
    }
    for who in USERS {
        by(log, who, |l| {
            for (n, d) in &dirs {
                l.res(&format!("rmdir {n}/root_d"), &rmdir(&s(d, "root_d")));
                let mine = if who == Who::Nobody { "n_d" } else { "u_d" };
                l.res(&format!("rmdir its own directory in {n}"), &rmdir(&s(d, mine)));
            }
        });
    }
    for (n, d) in &dirs {
        log.res(&format!("{n} afterwards"), &names_in(d));
    }
}

fn a10_search_and_list(ctx: &Ctx, log: &mut Log) {
    let specs = [
        ("d0700", 0o700, 0),
        ("d0711", 0o711, 0),
        ("d0744", 0o744, 0),
        ("d0755", 0o755, 0),
        ("d0750_g1000", 0o750, USER_GROUP),
        ("d0705_g1000", 0o705, USER_GROUP),
    ];
    let dirs: Vec<(&str, PathBuf)> = specs
        .iter()
        .map(|(n, m, g)| {
            let d = mkdirp(&ctx.p(n), *m, 0, *g);
            mkfile(&s(&d, "f"), 0o644, 0, 0, b"content");
            (*n, d)
        })
        .collect();
    for who in USERS {
        by(log, who, |l| {
            for (n, d) in &dirs {
                l.res(&format!("list {n}"), &names_in(d));
                l.res(&format!("stat {n}/f"), &shape_of(&s(d, "f"), false));
                l.res(&format!("read {n}/f"), &text(&s(d, "f")));
                l.res(&format!("stat {n}/none"), &shape_of(&s(d, "none"), false));
            }
        });
    }
}

fn a11_create_over_existing(ctx: &Ctx, log: &mut Log) {
    let d = mkdirp(&ctx.p("pub"), 0o777, 0, 0);
    let f = mkfile(&s(&d, "roots"), 0o644, 0, 0, b"root's");
    by(log, Who::Nobody, |l| {
        l.done(
            "O_CREAT|O_WRONLY on root's 0644 file",
            &open(&f, O_CREAT | O_WRONLY, 0o666),
        );
        l.done(
            "O_CREAT|O_RDONLY on root's 0644 file",
            &open(&f, O_CREAT | O_RDONLY, 0o666),
        );
        l.done(
            "O_CREAT|O_EXCL on root's file",
            &open(&f, O_CREAT | O_EXCL | O_WRONLY, 0o666),
        );
        l.done(
            "O_CREAT|O_TRUNC on root's file",
            &open(&f, O_CREAT | O_TRUNC | O_WRONLY, 0o666),
        );
    });
    log.res("root's file", &shape_of(&f, false));
    log.res("root's file content", &text(&f));
}

fn a12_new_files_belong_to_their_creator(ctx: &Ctx, log: &mut Log) {
    let d = mkdirp(&ctx.p("pub"), 0o777, 0, 0);
    for who in USERS {
        let t = who_tag(who);
        by(log, who, |l| {
            l.done(
                "create 0777",
                &open(&s(&d, &format!("{t}_f")), O_CREAT | O_WRONLY, 0o777),
            );
            l.res("mkdir 0777", &mkdir(&s(&d, &format!("{t}_d")), 0o777));
            l.done(
                "create 04755",
                &open(&s(&d, &format!("{t}_suid")), O_CREAT | O_WRONLY, 0o4755),
            );
            l.done(
                "create 02755",
                &open(&s(&d, &format!("{t}_sgid")), O_CREAT | O_WRONLY, 0o2755),
            );
            l.res("mkdir 01777", &mkdir(&s(&d, &format!("{t}_sticky")), 0o1777));
        });
        for n in ["f", "d", "suid", "sgid", "sticky"] {
            let p = s(&d, &format!("{t}_{n}"));
            log.res(&format!("{t}_{n}"), &shape_of(&p, false));
            log.res(&format!("{t}_{n} (backing)"), &shape_of(&ctx.backing(&p), false));
        }
    }
}

// ---------------------------------------------------------------------------
// changing attributes

fn a13_chmod(ctx: &Ctx, log: &mut Log) {
    let rootf = mkfile(&ctx.p("rootf"), 0o666, 0, 0, b"x");
    let userf = mkfile(&ctx.p("userf"), 0o644, USER, USER_GROUP, b"x");
    let user_root_group = mkfile(&ctx.p("user_root_group"), 0o644, USER, 0, b"x");
    let userd = mkdirp(&ctx.p("userd"), 0o755, USER, USER_GROUP);
    by(log, Who::Nobody, |l| {
        l.res("chmod root's 0666 file", &chmod(&rootf, 0o777));
        l.res("chmod 4777 root's 0666 file", &chmod(&rootf, 0o4777));
        l.res("chmod 1000's file", &chmod(&userf, 0o666));
        l.res("chmod 1000's directory", &chmod(&userd, 0o777));
        l.res(
            "fchmod root's 0666 file",
            &open(&rootf, O_RDWR, 0).and_then(|fd| fchmod(&fd, 0o777)),
        );
    });
    by(log, Who::User, |l| {
        l.res("chmod its own file 0600", &chmod(&userf, 0o600));
        l.res("chmod 4755 its own file", &chmod(&userf, 0o4755));
        l.res("chmod 2755 its own file (own group)", &chmod(&userf, 0o2755));
        l.res(
            "chmod 2755 its own file in group 0",
            &chmod(&user_root_group, 0o2755),
        );
        l.res("chmod 1777 its own directory", &chmod(&userd, 0o1777));
        l.res("chmod 2775 its own directory", &chmod(&userd, 0o2775));
        l.res("chmod root's file", &chmod(&rootf, 0o600));
    });
    for (n, p) in [
        ("root's file", &rootf),
        ("1000's file", &userf),
        ("1000's file in group 0", &user_root_group),
        ("1000's directory", &userd),
    ] {
        log_mode(ctx, log, n, p);
    }
}

fn a14_chown_by_non_root(ctx: &Ctx, log: &mut Log) {
    let userf = mkfile(&ctx.p("userf"), 0o644, USER, USER_GROUP, b"x");
    let rootf = mkfile(&ctx.p("rootf"), 0o666, 0, 0, b"x");
    let link = ctx.p("link");
    symlink("userf", &link).expect("setup symlink");
    chown(&link, USER, USER_GROUP, false).expect("setup lchown");
    by(log, Who::User, |l| {
        l.res(
            "chown its own file to 65534",
            &chown(&userf, NOBODY, u32::MAX, true),
        );
        l.res(
            "chown its own file to itself",
            &chown(&userf, USER, u32::MAX, true),
        );
        l.res(
            "chgrp its own file to its group",
            &chown(&userf, u32::MAX, USER_GROUP, true),
        );
        l.res(
            "chgrp its own file to a group it is not in",
            &chown(&userf, u32::MAX, EXTRA_GROUP, true),
        );
        l.res("chgrp its own file to group 0", &chown(&userf, u32::MAX, 0, true));
        l.res(
            "chown root's file to itself",
            &chown(&rootf, USER, USER_GROUP, true),
        );
        l.res(
            "lchown its own symlink to 65534",
            &chown(&link, NOBODY, u32::MAX, false),
        );
        l.res(
            "fchown root's 0666 file",
            &open(&rootf, O_RDWR, 0).and_then(|fd| fchown(&fd, USER, USER_GROUP)),
        );
    });
    by(log, Who::Nobody, |l| {
        l.res(
            "chown 1000's file to itself",
            &chown(&userf, NOBODY, NOGROUP, true),
        );
        l.res("chgrp 1000's file", &chown(&userf, u32::MAX, NOGROUP, true));
        l.res("lchown 1000's symlink", &chown(&link, NOBODY, NOGROUP, false));
    });
    log.res("1000's file", &shape_of(&userf, false));
    log.res("root's file", &shape_of(&rootf, false));
    log.res("the symlink's owner", &owner_of(&link));
}

fn a15_chown_by_root(ctx: &Ctx, log: &mut Log) {
    let f = mkfile(&ctx.p("f"), 0o640, 0, 0, b"x");
    let d = mkdirp(&ctx.p("d"), 0o750, 0, 0);
    let link = ctx.p("link");
    symlink("f", &link).expect("setup symlink");
    log.res("root chowns a file to 1000", &chown(&f, USER, USER_GROUP, true));
    log.res(
        "root chowns a directory to 65534",
        &chown(&d, NOBODY, NOGROUP, true),
    );
    log.res("root lchowns a symlink", &chown(&link, USER, EXTRA_GROUP, false));
    log.res("the file", &shape_of(&f, false));
    log.res("the file (backing)", &shape_of(&ctx.backing(&f), false));
    log.res("the directory", &shape_of(&d, false));
    log.res("the symlink", &owner_of(&link));
    by(log, Who::User, |l| {
        l.res("the new owner reads its 0640 file", &text(&f))
    });
    by(log, Who::Nobody, |l| {
        l.res("the new owner lists its 0750 directory", &names_in(&d))
    });
}

fn a16_chgrp_to_supplementary_group(ctx: &Ctx, log: &mut Log) {
    let f = mkfile(&ctx.p("f"), 0o2755, USER, USER_GROUP, b"x");
    let grpf = mkfile(&ctx.p("grpf"), 0o640, 0, EXTRA_GROUP, b"group 2000");
    let grpd = mkdirp(&ctx.p("grpd"), 0o770, 0, EXTRA_GROUP);
    for who in [Who::Member, Who::User] {
        by(log, who, |l| {
            l.res("read a 0640 file of group 2000", &text(&grpf));
            l.done(
                "create in a 0770 directory of group 2000",
                &open(
                    &s(&grpd, &format!("new_{}", who_tag(who))),
                    O_CREAT | O_WRONLY,
                    0o644,
                ),
            );
        });
    }
    by(log, Who::Member, |l| {
        l.res(
            "chgrp its own file to its supplementary group",
            &chown(&f, u32::MAX, EXTRA_GROUP, true),
        );
        l.res(
            "chgrp its own file to a group it is not in",
            &chown(&f, u32::MAX, 3000, true),
        );
        l.done(
            "create a 02755 file in group 2000's directory",
            &open(&s(&grpd, "sgid"), O_CREAT | O_WRONLY, 0o2755),
        );
    });
    log.res("the file", &shape_of(&f, false));
    log.res("group 2000's directory", &names_in(&grpd));
    log.res("the member's file", &shape_of(&s(&grpd, "new_m"), false));
    log.res("the member's 02755 file", &shape_of(&s(&grpd, "sgid"), false));
}

fn a17_utimes_now(ctx: &Ctx, log: &mut Log) {
    let rw = mkfile(&ctx.p("root_0666"), 0o666, 0, 0, b"x");
    let ro = mkfile(&ctx.p("root_0644"), 0o644, 0, 0, b"x");
    let own = mkfile(&ctx.p("own_0444"), 0o444, NOBODY, NOGROUP, b"x");
    for p in [&rw, &ro, &own] {
        utimens(p, Some([ts(5000, 0), ts(5000, 0)]), true).expect("setup times");
    }
    by(log, Who::Nobody, |l| {
        for (n, p) in [
            ("root's 0666 file", &rw),
            ("root's 0644 file", &ro),
            ("its own 0444 file", &own),
        ] {
            l.res(&format!("utimensat(NULL) on {n}"), &utimens(p, None, true));
            l.res(
                &format!("utimensat(UTIME_NOW, UTIME_OMIT) on {n}"),
                &utimens(p, Some([ts(0, libc::UTIME_NOW), ts(0, libc::UTIME_OMIT)]), true),
            );
        }
    });
    for (n, p) in [
        ("root's 0666 file", &rw),
        ("root's 0644 file", &ro),
        ("its own 0444 file", &own),
    ] {
        log.res(
            &format!("mtime of {n} moved"),
            &mtime_of(p).map(|(s, _)| s != 5000),
        );
    }
}

fn a18_utimes_explicit(ctx: &Ctx, log: &mut Log) {
    let rw = mkfile(&ctx.p("root_0666"), 0o666, 0, 0, b"x");
    let own = mkfile(&ctx.p("own"), 0o644, NOBODY, NOGROUP, b"x");
    let link = ctx.p("link");
    symlink("root_0666", &link).expect("setup symlink");
    by(log, Who::Nobody, |l| {
        l.res(
            "explicit times on root's 0666 file",
            &utimens(&rw, Some([ts(1000, 1), ts(2000, 2)]), true),
        );
        l.res(
            "explicit mtime only on root's 0666 file",
            &utimens(&rw, Some([ts(0, libc::UTIME_OMIT), ts(2000, 2)]), true),
        );
        l.res(
            "UTIME_OMIT both on root's 0666 file",
            &utimens(
                &rw,
                Some([ts(0, libc::UTIME_OMIT), ts(0, libc::UTIME_OMIT)]),
                true,
            ),
        );
        l.res(
            "futimens explicit on root's 0666 file",
            &open(&rw, O_RDWR, 0).and_then(|fd| futimens(&fd, Some([ts(1000, 1), ts(2000, 2)]))),
        );
        l.res(
            "explicit times on root's symlink (nofollow)",
            &utimens(&link, Some([ts(1000, 1), ts(2000, 2)]), false),
        );
        l.res(
            "explicit times on its own file",
            &utimens(&own, Some([ts(1000, 1), ts(2000, 2)]), true),
        );
    });
    log.res("root's file mtime", &mtime_of(&rw).map(|t| t == (2000, 2)));
    log.res("its own file mtime", &mtime_of(&own));
    log.res("its own file mtime (backing)", &mtime_of(&ctx.backing(&own)));
}

fn a19_truncate(ctx: &Ctx, log: &mut Log) {
    let rw = mkfile(&ctx.p("root_0666"), 0o666, 0, 0, b"0123456789");
    let ro = mkfile(&ctx.p("root_0644"), 0o644, 0, 0, b"0123456789");
    let own = mkfile(&ctx.p("own_0444"), 0o444, NOBODY, NOGROUP, b"0123456789");
    by(log, Who::Nobody, |l| {
        l.res("truncate root's 0666 file", &truncate(&rw, 4));
        l.res("truncate root's 0644 file", &truncate(&ro, 4));
        l.res("truncate its own 0444 file", &truncate(&own, 4));
        l.res(
            "ftruncate on a read-only descriptor",
            &open(&ro, O_RDONLY, 0).and_then(|fd| ftruncate(&fd, 2)),
        );
        l.res(
            "ftruncate root's 0666 file to grow",
            &open(&rw, O_WRONLY, 0).and_then(|fd| ftruncate(&fd, 20)),
        );
    });
    for (n, p) in [
        ("root's 0666 file", &rw),
        ("root's 0644 file", &ro),
        ("its own 0444 file", &own),
    ] {
        log.res(n, &shape_of(p, false));
    }
}

fn a20_o_noatime_and_fd_metadata(ctx: &Ctx, log: &mut Log) {
    let rw = mkfile(&ctx.p("root_0666"), 0o666, 0, 0, b"x");
    let own = mkfile(&ctx.p("own"), 0o644, NOBODY, NOGROUP, b"x");
    by(log, Who::Nobody, |l| {
        l.done(
            "O_NOATIME on root's file",
            &open(&rw, O_RDONLY | libc::O_NOATIME, 0),
        );
        l.done(
            "O_NOATIME on its own file",
            &open(&own, O_RDONLY | libc::O_NOATIME, 0),
        );
        match open(&rw, O_RDWR, 0) {
            Ok(fd) => {
                l.res("fchmod through a writable descriptor", &fchmod(&fd, 0o4777));
                l.res(
                    "fchown through a writable descriptor",
                    &fchown(&fd, NOBODY, NOGROUP),
                );
                l.res("futimens now through it", &futimens(&fd, None));
            }
            Err(e) => l.val("open root's 0666 file", errno_name(e)),
        }
    });
    log.res("root's file", &shape_of(&rw, false));
}

// ---------------------------------------------------------------------------
// links and renames

fn a21_hard_links(ctx: &Ctx, log: &mut Log) {
    let pubd = mkdirp(&ctx.p("pub"), 0o777, 0, 0);
    let rootd = mkdirp(&ctx.p("rootd"), 0o755, 0, 0);
    let private = mkfile(&ctx.p("private"), 0o600, 0, 0, b"p");
    let readable = mkfile(&ctx.p("readable"), 0o644, 0, 0, b"r");
    let writable = mkfile(&ctx.p("writable"), 0o666, 0, 0, b"w");
    let own = mkfile(&ctx.p("own"), 0o600, NOBODY, NOGROUP, b"o");
    by(log, Who::Nobody, |l| {
        l.res("link root's 0600 file", &link(&private, &s(&pubd, "private")));
        l.res("link root's 0644 file", &link(&readable, &s(&pubd, "readable")));
        l.res("link root's 0666 file", &link(&writable, &s(&pubd, "writable")));
        l.res("link its own file", &link(&own, &s(&pubd, "own")));
        l.res("link into root's 0755 directory", &link(&own, &s(&rootd, "own")));
        l.res(
            "read root's 0600 file through a new link",
            &text(&s(&pubd, "private")),
        );
    });
    log.res("pub", &names_in(&pubd));
    log.res("rootd", &names_in(&rootd));
    log.res("root's 0600 file", &shape_of(&private, false));
}

fn a22_symlinks(ctx: &Ctx, log: &mut Log) {
    let pubd = mkdirp(&ctx.p("pub"), 0o777, 0, 0);
    let rootd = mkdirp(&ctx.p("rootd"), 0o755, 0, 0);
    let sticky = mkdirp(&ctx.p("sticky"), 0o1777, 0, 0);
    mkfile(&ctx.p("target"), 0o644, 0, 0, b"target");
    let private = mkfile(&ctx.p("private"), 0o600, 0, 0, b"private");
    let rootlink = s(&rootd, "l");
    symlink("../private", &rootlink).expect("setup symlink");
    by(log, Who::User, |l| {
        l.res(
            "symlink in a 1777 directory",
            &symlink("../target", &s(&sticky, "ul")),
        );
    });
    by(log, Who::Nobody, |l| {
        l.res("symlink in root's 0755 directory", &symlink("x", &s(&rootd, "x")));
        l.res(
            "symlink in a 0777 directory",
            &symlink("../target", &s(&pubd, "nl")),
        );
        l.res("readlink root's symlink", &readlink(&rootlink));
        l.res("follow root's symlink to a 0600 file", &text(&rootlink));
        l.res(
            "follow 1000's symlink in a sticky directory",
            &text(&s(&sticky, "ul")),
        );
        l.res("follow its own symlink", &text(&s(&pubd, "nl")));
    });
    log.res("its symlink", &shape_of(&s(&pubd, "nl"), false));
    log.res("root's 0755 directory", &names_in(&rootd));
    log.res("root's 0600 file", &text(&private));
}

fn a23_rename_within_dirs(ctx: &Ctx, log: &mut Log) {
    let pubd = mkdirp(&ctx.p("pub"), 0o777, 0, 0);
    let rootd = mkdirp(&ctx.p("rootd"), 0o755, 0, 0);
    mkfile(&s(&pubd, "roots"), 0o644, 0, 0, b"root's");
    mkfile(&s(&pubd, "mine"), 0o644, NOBODY, NOGROUP, b"mine");
    mkfile(&s(&pubd, "victim"), 0o644, 0, 0, b"victim");
    mkfile(&s(&rootd, "f"), 0o644, 0, 0, b"f");
    by(log, Who::Nobody, |l| {
        l.res(
            "rename root's file in a 0777 directory",
            &rename(&s(&pubd, "roots"), &s(&pubd, "roots2")),
        );
        l.res(
            "rename its own file over root's",
            &rename(&s(&pubd, "mine"), &s(&pubd, "victim")),
        );
        l.res(
            "rename in root's 0755 directory",
            &rename(&s(&rootd, "f"), &s(&rootd, "g")),
        );
        l.res(
            "RENAME_NOREPLACE over an existing file",
            &rename2(&s(&pubd, "roots2"), &s(&pubd, "victim"), libc::RENAME_NOREPLACE),
        );
        l.res(
            "RENAME_EXCHANGE of two files",
            &rename2(&s(&pubd, "roots2"), &s(&pubd, "victim"), libc::RENAME_EXCHANGE),
        );
    });
    log.res("pub", &names_in(&pubd));
    log.res("pub/victim", &text(&s(&pubd, "victim")));
    log.res("rootd", &names_in(&rootd));
}

fn a24_rename_across_dirs(ctx: &Ctx, log: &mut Log) {
    let a = mkdirp(&ctx.p("a"), 0o777, 0, 0);
    let b = mkdirp(&ctx.p("b"), 0o777, 0, 0);
    let rootd = mkdirp(&ctx.p("rootd"), 0o755, 0, 0);
    mkfile(&s(&a, "mine"), 0o644, NOBODY, NOGROUP, b"mine");
    mkfile(&s(&a, "roots"), 0o644, 0, 0, b"root's");
    mkdirp(&s(&a, "rootsdir"), 0o755, 0, 0);
    mkdirp(&s(&a, "mydir"), 0o755, NOBODY, NOGROUP);
    mkfile(&s(&rootd, "f"), 0o644, 0, 0, b"f");
    by(log, Who::Nobody, |l| {
        l.res(
            "move its own file to another 0777 directory",
            &rename(&s(&a, "mine"), &s(&b, "mine")),
        );
        l.res(
            "move root's file to another 0777 directory",
            &rename(&s(&a, "roots"), &s(&b, "roots")),
        );
        l.res(
            "move root's directory to another directory",
            &rename(&s(&a, "rootsdir"), &s(&b, "rootsdir")),
        );
        l.res(
            "move its own directory to another directory",
            &rename(&s(&a, "mydir"), &s(&b, "mydir")),
        );
        l.res(
            "move a file into root's 0755 directory",
            &rename(&s(&b, "mine"), &s(&rootd, "mine")),
        );
        l.res(
            "move a file out of root's 0755 directory",
            &rename(&s(&rootd, "f"), &s(&b, "f")),
        );
        l.res(
            "rename root's directory in place",
            &rename(&s(&a, "rootsdir"), &s(&a, "rootsdir2")),
        );
    });
    for (n, d) in [("a", &a), ("b", &b), ("rootd", &rootd)] {
        log.res(n, &names_in(d));
    }
}

fn a25_sticky_directory(ctx: &Ctx, log: &mut Log) {
    let st = mkdirp(&ctx.p("sticky"), 0o1777, 0, 0);
    for (name, uid, gid) in [
        ("root_f", 0, 0),
        ("u_f", USER, USER_GROUP),
        ("n_f", NOBODY, NOGROUP),
    ] {
        mkfile(&s(&st, name), 0o666, uid, gid, name.as_bytes());
        mkfile(&s(&st, &format!("{name}2")), 0o666, uid, gid, name.as_bytes());
    }
    mkdirp(&s(&st, "root_d"), 0o777, 0, 0);
    mkdirp(&s(&st, "u_d"), 0o777, USER, USER_GROUP);
    by(log, Who::Nobody, |l| {
        l.res("unlink root's file", &unlink(&s(&st, "root_f")));
        l.res("unlink 1000's file", &unlink(&s(&st, "u_f")));
        l.res("unlink its own file", &unlink(&s(&st, "n_f")));
        l.res(
            "rename root's file",
            &rename(&s(&st, "root_f2"), &s(&st, "moved_root")),
        );
        l.res(
            "rename 1000's file away",
            &rename(&s(&st, "u_f2"), &s(&st, "moved_u")),
        );
        l.res(
            "rename its own file over 1000's",
            &rename(&s(&st, "n_f2"), &s(&st, "u_f")),
        );
        l.res("rmdir root's empty directory", &rmdir(&s(&st, "root_d")));
        l.res("rmdir 1000's empty directory", &rmdir(&s(&st, "u_d")));
        l.res(
            "write root's 0666 file (allowed)",
            &open_write(&s(&st, "root_f"), O_WRONLY, b"w"),
        );
        l.res(
            "set user.x on root's 0666 file",
            &setx(&s(&st, "root_f"), "user.x", b"1", true),
        );
    });
    log.res("the sticky directory afterwards", &names_in(&st));
    log.res("root's file content", &text(&s(&st, "root_f")));
}

fn a26_sticky_directory_of_a_user(ctx: &Ctx, log: &mut Log) {
    let st = mkdirp(&ctx.p("sticky"), 0o1777, USER, USER_GROUP);
    mkfile(&s(&st, "n_f"), 0o644, NOBODY, NOGROUP, b"n");
    mkfile(&s(&st, "root_f"), 0o644, 0, 0, b"r");
    mkfile(&s(&st, "u_f"), 0o644, USER, USER_GROUP, b"u");
    by(log, Who::Nobody, |l| {
        l.res("a non-owner unlinks the owner's file", &unlink(&s(&st, "u_f")));
        l.res(
            "a non-owner sets user.x on the sticky directory",
            &setx(&st, "user.x", b"1", true),
        );
    });
    by(log, Who::User, |l| {
        l.res(
            "the directory's owner unlinks 65534's file",
            &unlink(&s(&st, "n_f")),
        );
        l.res(
            "the directory's owner renames root's file",
            &rename(&s(&st, "root_f"), &s(&st, "r2")),
        );
        l.res(
            "the directory's owner sets user.x on it",
            &setx(&st, "user.x", b"1", true),
        );
    });
    log.res("the directory afterwards", &names_in(&st));
}

fn a27_setgid_directory(ctx: &Ctx, log: &mut Log) {
    let sg = mkdirp(&ctx.p("sg"), 0o2777, 0, EXTRA_GROUP);
    for who in USERS {
        let t = who_tag(who);
        by(log, who, |l| {
            l.done(
                "create in a 2777 directory of group 2000",
                &open(&s(&sg, &format!("{t}_f")), O_CREAT | O_WRONLY, 0o644),
            );
            l.res("mkdir in it", &mkdir(&s(&sg, &format!("{t}_d")), 0o755));
            l.res("mkdir inside that", &mkdir(&s(&sg, &format!("{t}_d/dd")), 0o700));
            l.done(
                "create a 02755 file (not in group 2000)",
                &open(&s(&sg, &format!("{t}_x")), O_CREAT | O_WRONLY, 0o2755),
            );
            l.res(
                "mkfifo in it",
                &mknod(&s(&sg, &format!("{t}_p")), libc::S_IFIFO | 0o644, 0),
            );
            l.res("symlink in it", &symlink("x", &s(&sg, &format!("{t}_l"))));
        });
        for n in ["f", "d", "d/dd", "x", "p", "l"] {
            let p = s(&sg, &format!("{t}_{n}"));
            log.res(&format!("{t}_{n}"), &shape_of(&p, false));
            log.res(&format!("{t}_{n} (backing)"), &shape_of(&ctx.backing(&p), false));
        }
    }
    log.done(
        "root creates in it",
        &open(&s(&sg, "root_f"), O_CREAT | O_WRONLY, 0o644),
    );
    log.res("root's file", &shape_of(&s(&sg, "root_f"), false));
}

// ---------------------------------------------------------------------------
// extended attributes and ACLs

fn a28_user_xattrs(ctx: &Ctx, log: &mut Log) {
    let own = mkfile(&ctx.p("own"), 0o644, NOBODY, NOGROUP, b"x");
    let ro = mkfile(&ctx.p("root_0644"), 0o644, 0, 0, b"x");
    let rw = mkfile(&ctx.p("root_0666"), 0o666, 0, 0, b"x");
    let private = mkfile(&ctx.p("root_0600"), 0o600, 0, 0, b"x");
    for p in [&ro, &rw, &private] {
        setx(p, "user.root", b"root's value", true).expect("setup user xattr");
    }
    by(log, Who::Nobody, |l| {
        l.res("owner sets user.a", &setx(&own, "user.a", b"1", true));
        l.res("owner gets it", &getx(&own, "user.a"));
        l.res("owner lists", &listx(&own));
        l.res("owner removes it", &removex(&own, "user.a"));
        l.res("set user.a on root's 0644 file", &setx(&ro, "user.a", b"1", true));
        l.res("set user.a on root's 0666 file", &setx(&rw, "user.a", b"1", true));
        l.res("get user.root of root's 0644 file", &getx(&ro, "user.root"));
        l.res("get user.root of root's 0600 file", &getx(&private, "user.root"));
        l.res("list root's 0600 file", &listx(&private));
        l.res("remove user.root of root's 0644 file", &removex(&ro, "user.root"));
        l.res("remove user.root of root's 0666 file", &removex(&rw, "user.root"));
    });
    for (n, p) in [("root's 0644 file", &ro), ("root's 0666 file", &rw)] {
        log.res(&format!("xattrs of {n}"), &listx(p));
    }
}

fn a29_privileged_xattr_names(ctx: &Ctx, log: &mut Log) {
    let f = mkfile(&ctx.p("f"), 0o644, 0, 0, b"x");
    let own = mkfile(&ctx.p("own"), 0o755, NOBODY, NOGROUP, b"x");
    log.res("root sets trusted.t", &setx(&f, "trusted.t", b"root only", true));
    // A valid VFS_CAP_REVISION_2 value granting nothing.
    let mut caps = 0x0200_0000u32.to_le_bytes().to_vec();
    caps.extend_from_slice(&[0u8; 16]);
    by(log, Who::Nobody, |l| {
        l.res("get trusted.t", &getx(&f, "trusted.t"));
        l.res("list root's file", &listx(&f));
        l.res(
            "set trusted.x on its own file",
            &setx(&own, "trusted.x", b"1", true),
        );
        l.res(
            "set security.capability on its own file",
            &setx(&own, "security.capability", &caps, true),
        );
        l.res(
            "set security.evil on its own file",
            &setx(&own, "security.evil", b"1", true),
        );
        l.res("list its own file", &listx(&own));
    });
    log.res("root lists its own file", &listx(&f));
    log.res("xattrs of its file (backing)", &listx(&ctx.backing(&own)));
}

fn a30_acl_by_non_owner(ctx: &Ctx, log: &mut Log) {
    let f = mkfile(&ctx.p("f"), 0o666, 0, 0, b"x");
    let own = mkfile(&ctx.p("own"), 0o644, NOBODY, NOGROUP, b"x");
    let open_to_all = acl(&[
        (ACL_USER_OBJ, 7, ACL_UNDEFINED),
        (ACL_GROUP_OBJ, 7, ACL_UNDEFINED),
        (ACL_OTHER, 7, ACL_UNDEFINED),
    ]);
    let owner_only = acl(&[
        (ACL_USER_OBJ, 6, ACL_UNDEFINED),
        (ACL_GROUP_OBJ, 0, ACL_UNDEFINED),
        (ACL_OTHER, 0, ACL_UNDEFINED),
    ]);
    by(log, Who::Nobody, |l| {
        l.res(
            "set an ACL on root's 0666 file",
            &setx(&f, "system.posix_acl_access", &open_to_all, true),
        );
        l.res(
            "set an ACL on its own file",
            &setx(&own, "system.posix_acl_access", &owner_only, true),
        );
    });
    log_mode(ctx, log, "root's file", &f);
    log_mode(ctx, log, "its own file", &own);
}

fn a31_acl_denying_a_named_user(ctx: &Ctx, log: &mut Log) {
    let f = mkfile(&ctx.p("f"), 0o644, 0, 0, b"readable by all but 65534");
    let denied = acl(&[
        (ACL_USER_OBJ, 6, ACL_UNDEFINED),
        (ACL_USER, 0, NOBODY),
        (ACL_GROUP_OBJ, 4, ACL_UNDEFINED),
        (ACL_MASK, 4, ACL_UNDEFINED),
        (ACL_OTHER, 4, ACL_UNDEFINED),
    ]);
    log.res(
        "root sets the ACL",
        &setx(&f, "system.posix_acl_access", &denied, true),
    );
    log_mode(ctx, log, "the file", &f);
    for who in USERS {
        by(log, who, |l| {
            l.res("read", &text(&f));
            l.res("access(R_OK)", &access(&f, R_OK));
        });
    }
}

// ---------------------------------------------------------------------------
// special files

fn a32_device_nodes(ctx: &Ctx, log: &mut Log) {
    let d = mkdirp(&ctx.p("pub"), 0o777, 0, 0);
    by(log, Who::Nobody, |l| {
        l.res(
            "mknod a character device",
            &mknod(&s(&d, "null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3)),
        );
        l.res(
            "mknod a block device",
            &mknod(&s(&d, "blk"), libc::S_IFBLK | 0o666, libc::makedev(7, 0)),
        );
        l.res("mknod a fifo", &mknod(&s(&d, "fifo"), libc::S_IFIFO | 0o666, 0));
    });
    log.res("what is there", &names_in(&d));
}

macro_rules! checks {
    ($($f:ident $(: $needs:ident)?),* $(,)?) => {
        &[$(Check {
            name: stringify!($f),
            run: $f,
            needs: checks!(@needs $($needs)?),
        }),*]
    };
    (@needs) => { Needs::Nothing };
    (@needs $n:ident) => { Needs::$n };
}

/// Every check, in the order they run.
const CHECKS: &[Check] = checks![
    s1_other_user_against_root_files,
    s2_groups_of_a_pid_twin: OwnPidNs,
    s3_setid_cleared_by_append,
    s3_setid_cleared_by_write,
    s3_setid_cleared_by_truncate,
    s3_setid_cleared_by_chown,
    s3_setid_cleared_by_fallocate,
    s3_setid_cleared_by_direct_write_and_copy,
    s3_file_capabilities_dropped,
    s4_cached_walk_into_private_dir,
    s4_moved_into_private_dir,
    s4_search_permission_revoked,
    s5_root_without_capabilities: CallerCaps,
    c1_non_owner_writer,
    a01_read_by_mode,
    a02_write_by_mode,
    a03_open_trunc,
    a04_access_checks,
    a05_owner_and_group_class_precedence,
    a06_create_in_dirs,
    a07_mkdir_in_dirs,
    a08_unlink_in_dirs,
    a09_rmdir_in_dirs,
    a10_search_and_list,
    a11_create_over_existing,
    a12_new_files_belong_to_their_creator,
    a13_chmod,
    a14_chown_by_non_root,
    a15_chown_by_root,
    a16_chgrp_to_supplementary_group: CallerGroups,
    a17_utimes_now,
    a18_utimes_explicit,
    a19_truncate,
    a20_o_noatime_and_fd_metadata,
    a21_hard_links,
    a22_symlinks,
    a23_rename_within_dirs,
    a24_rename_across_dirs,
    a25_sticky_directory,
    a26_sticky_directory_of_a_user,
    a27_setgid_directory,
    a28_user_xattrs,
    a29_privileged_xattr_names,
    a30_acl_by_non_owner,
    a31_acl_denying_a_named_user,
    a32_device_nodes,
];

// ---------------------------------------------------------------------------
// the configurations: each mounted once, every check run in it

macro_rules! configs {
    ($($name:ident: $opts:expr, dp = $dp:expr, own_pid_ns = $ns:expr;)*) => {$(
        #[test]
        fn $name() {
            run_config(
                Config {
                    opts: $opts,
                    default_permissions: $dp,
                    own_pid_ns: $ns,
                },
                CHECKS,
            );
        }
    )*};
}

configs! {
    // The default options: regular files in kernel passthrough mode.
    default_options: "", dp = false, own_pid_ns = false;
    default_options_dp: "", dp = true, own_pid_ns = false;
    // The same with reads and writes served by the daemon.
    no_passthrough: "no_passthrough", dp = false, own_pid_ns = false;
    no_passthrough_dp: "no_passthrough", dp = true, own_pid_ns = false;
    writeback: "writeback", dp = false, own_pid_ns = false;
    writeback_dp: "writeback", dp = true, own_pid_ns = false;
    passthrough: "passthrough", dp = false, own_pid_ns = false;
    passthrough_dp: "passthrough", dp = true, own_pid_ns = false;
    cache_never: "cache=never", dp = false, own_pid_ns = false;
    cache_never_dp: "cache=never", dp = true, own_pid_ns = false;
    cache_always: "cache=always", dp = false, own_pid_ns = false;
    cache_always_dp: "cache=always", dp = true, own_pid_ns = false;
    parallel_direct_writes: "parallel_direct_writes", dp = false, own_pid_ns = false;
    parallel_direct_writes_dp: "parallel_direct_writes", dp = true, own_pid_ns = false;
    no_file_handles: "inode_file_handles=never", dp = false, own_pid_ns = false;
    no_file_handles_dp: "inode_file_handles=never", dp = true, own_pid_ns = false;
    tiny_fd_cache: "fd_cache=1", dp = false, own_pid_ns = false;
    tiny_fd_cache_dp: "fd_cache=1", dp = true, own_pid_ns = false;
    // Every WRITE payload left in the pipe and spliced into the source.
    splice_write: "splice_write,splice_write_min=1", dp = false, own_pid_ns = false;
    splice_write_dp: "splice_write,splice_write_min=1", dp = true, own_pid_ns = false;
    splice_write_writeback: "writeback,splice_write,splice_write_min=1", dp = false, own_pid_ns = false;
    pidns_default_options: "", dp = false, own_pid_ns = true;
    pidns_default_options_dp: "", dp = true, own_pid_ns = true;
    pidns_no_passthrough: "no_passthrough", dp = false, own_pid_ns = true;
    pidns_no_passthrough_dp: "no_passthrough", dp = true, own_pid_ns = true;
    pidns_writeback: "writeback", dp = false, own_pid_ns = true;
    pidns_writeback_dp: "writeback", dp = true, own_pid_ns = true;
    pidns_passthrough: "passthrough", dp = false, own_pid_ns = true;
    pidns_passthrough_dp: "passthrough", dp = true, own_pid_ns = true;
    pidns_cache_never: "cache=never", dp = false, own_pid_ns = true;
    pidns_cache_never_dp: "cache=never", dp = true, own_pid_ns = true;
    pidns_cache_always: "cache=always", dp = false, own_pid_ns = true;
    pidns_cache_always_dp: "cache=always", dp = true, own_pid_ns = true;
    pidns_parallel_direct_writes: "parallel_direct_writes", dp = false, own_pid_ns = true;
    pidns_parallel_direct_writes_dp: "parallel_direct_writes", dp = true, own_pid_ns = true;
}
