//! The small examples' command line (`examples/common/cli.rs`), run as
//! programs: each takes `-f`, `-d`, `-o`, `--help` and `--version` as
//! `passthrough_ll` does, refuses what it does not know with exit status 2,
//! and prints an error with its `Display` text after its name, never the
//! `Debug` form that `main() -> Result<_, Box<dyn Error>>` would print.
//!
//! Only the last test mounts; the others fail before mounting.

mod common;

use common::TempMountpoint;
use std::fs;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The examples that use the shared command line.
const EXAMPLES: [&str; 5] = ["hello", "hello_path", "notes", "nodefs", "slowfs"];

/// Runs example `name` with `args` (no mount is reached, so it ends by itself).
fn run(name: &str, args: &[&str]) -> Output {
    Command::new(common::example_binary(name))
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A mountpoint that does not exist: the error every newcomer meets first.
#[test]
fn a_missing_mountpoint_is_reported_with_its_message() {
    let dir = TempMountpoint::new("cli-missing");
    let missing = dir.root().join("no-such-dir");
    for name in EXAMPLES {
        let out = run(name, &[missing.to_str().unwrap()]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        let want = format!("{name}: mountpoint {} does not exist", missing.display());
        assert!(
            err.lines().any(|l| l == want),
            "{name}: expected `{want}` on stderr, got: {err}"
        );
        assert!(
            !err.contains("MountpointMissing"),
            "{name} printed the Debug form: {err}"
        );
        assert!(out.stdout.is_empty(), "{name}: {}", text(&out.stdout));
    }
}

#[test]
fn help_and_version_go_to_stdout() {
    for name in EXAMPLES {
        for flag in ["--help", "-h"] {
            let out = run(name, &[flag]);
            let help = text(&out.stdout);
            assert!(out.status.success(), "{name} {flag}: {}", text(&out.stderr));
            let first = help.lines().next().unwrap_or_default();
            assert!(
                first.starts_with(&format!("usage: {name} [-f] [-d] [-o opt,...] "))
                    && first.ends_with(" MOUNTPOINT"),
                "{name} {flag}: {first}"
            );
            for f in ["-f ", "-d ", "-o opt,...", "-h, --help", "-V, --version"] {
                assert!(
                    help.contains(&format!("\n    {f}")),
                    "{name} {flag} does not describe {f}: {help}"
                );
            }
        }
        let out = run(name, &["-V"]);
        let want = format!("{name} (fuse-wire {})\n", env!("CARGO_PKG_VERSION"));
        assert!(out.status.success());
        assert_eq!(text(&out.stdout), want);
    }
}

/// `-f` (always in the foreground), `-d` and `-o` lists in both forms, in
/// any place: accepted, so the command fails only on the mountpoint.
#[test]
fn the_common_flags_are_accepted_anywhere() {
    let dir = TempMountpoint::new("cli-flags");
    let missing = dir.root().join("absent");
    let missing = missing.to_str().unwrap();
    for name in EXAMPLES {
        for args in [
            &["-f", "-d", "-o", "ro,fsname=x", missing][..],
            &[missing, "-f", "-oallow_other", "-o", "debug", "-d"],
            &["-d", "--", missing],
        ] {
            let out = run(name, args);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{name} {args:?}: {err}");
            assert!(err.contains("does not exist"), "{name} {args:?}: {err}");
        }
    }
}

/// What the command line cannot mean: exit status 2, the reason after the
/// program's name, and where to look.
#[test]
fn a_bad_command_line_exits_2_saying_why() {
    let cases: [(&[&str], &str); 6] = [
        (&["-x", "/mnt"], "unknown argument `-x`"),
        (&["-o", "no_such_option", "/mnt"], "no_such_option"),
        (&["-o", "fd=3", "/mnt"], "fd"),
        (&[], "no mountpoint given"),
        (&["/mnt", "/other"], "one mountpoint only"),
        (&["/mnt", "-o"], "-o needs an option list"),
    ];
    for name in EXAMPLES {
        for (args, why) in cases {
            let out = run(name, args);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name} {args:?}: {err}");
            let first = err.lines().next().unwrap_or_default();
            assert!(
                first.starts_with(&format!("{name}: ")) && first.contains(why),
                "{name} {args:?}: expected `{why}`, got: {err}"
            );
            assert!(err.contains(&format!("{name} --help")), "{name} {args:?}: {err}");
        }
    }
    // nodefs takes options of its own: a bad one is still a usage error.
    let out = run("nodefs", &["-o", "threads=0", "/mnt"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).starts_with("nodefs: unknown or invalid option `threads=0`"));
    // So does slowfs.
    let out = run("slowfs", &["-o", "api=fast", "/mnt"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).starts_with("slowfs: unknown or invalid option `api=fast`"));
}

/// hello, mounted with `-f -d -o fsname=...`: the options reach the mount,
/// `-d` turns debug logging on, and SIGTERM unmounts it.
#[test]
fn hello_mounts_with_the_common_flags() {
    if !common::require_mount_capability() {
        return;
    }
    let mp = TempMountpoint::new("cli-hello");
    let log = mp.root().join("hello.log");
    let mut child = Command::new(common::example_binary("hello"))
        .args(["-f", "-d", "-o", "fsname=cli-hello,allow_other"])
        .arg(mp.path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).expect("create the log"))
        .spawn()
        .expect("start hello");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !common::fuse_mounted_at(mp.path()) {
        let exited = child.try_wait().expect("wait for hello");
        if exited.is_some() || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "hello did not mount ({exited:?}): {}",
                fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let info = common::mountinfo(mp.path()).expect("the mount's line");
    let content = read_bounded(&mp.path().join("hello"));
    let status = common::terminate_daemon(child, mp.path());
    let log = fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(info.source, "cli-hello", "{info:?}");
    assert!(info.super_opts.contains("allow_other"), "{info:?}");
    assert!(
        info.mount_opts.split(',').any(|o| o == "ro"),
        "hello mounts read-only: {info:?}"
    );
    assert_eq!(content, b"Hello, world!\n");
    assert!(
        status.is_some_and(|s| s.success()),
        "hello ended with {status:?}: {log}"
    );
    assert!(
        log.contains("DEBUG fuse_session"),
        "-d logs at debug level: {log}"
    );
    assert!(!common::fuse_mounted_at(mp.path()), "still mounted after SIGTERM");
}

/// Reads `path` in a thread, aborting the mount's connection if the read
/// has not returned within 10 s.
fn read_bounded(path: &Path) -> Vec<u8> {
    let (tx, rx) = mpsc::channel();
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(fs::read(&p));
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(r) => r.unwrap_or_else(|e| panic!("read {}: {e}", path.display())),
        Err(_) => {
            let mnt = path.parent().expect("a file in the mount");
            let _ = common::abort_fuse_connection(mnt);
            panic!("reading {} did not return within 10 s", path.display());
        }
    }
}
