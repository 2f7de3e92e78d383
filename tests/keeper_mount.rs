//! The keeper on real mounts (`hello -o keeper`): its daemon is killed with
//! SIGKILL again and again, and upgraded with SIGUSR2, while readers keep
//! reading through the mount; no reader may see an error or wrong content,
//! the mount must stay, and SIGTERM to the keeper must unmount.
//!
//! In the io_uring pass the daemons are asked for io_uring, which a keeper
//! refuses (saying why): the same guarantee then holds over `/dev/fuse`.
//!
//! Every step is bounded: a keeper that does not end in time has its
//! connection aborted and is killed, so a failure cannot hang CI.

mod common;
mod keeper_support;

use common::*;
use keeper_support::*;
use std::path::Path;
use std::time::{Duration, Instant};

#[test]
fn killed_daemons_are_replaced_and_no_reader_sees_an_error() {
    if !require_mount_capability() {
        return;
    }
    let tmp = TempMountpoint::new("keeper-kill");
    let keeper = Keeper::start(tmp.path());
    let readers = Readers::start(tmp.path(), 4);
    let mut killed = Vec::new();
    for i in 0..20u64 {
        let daemon = daemon_of(keeper.pid(), &killed);
        // Vary the moment: the readers are mid-request at most of them.
        std::thread::sleep(Duration::from_millis(20 + (i * 37) % 90));
        signal(daemon, libc::SIGKILL);
        killed.push(daemon);
    }
    let last = daemon_of(keeper.pid(), &killed);
    assert!(!killed.contains(&last), "a killed daemon still serves");
    let (reads, errors) = readers.finish(tmp.path());
    assert!(reads > 20, "the readers hardly ran ({reads} reads)");
    let log = keeper.stop();
    assert!(
        errors.is_empty(),
        "readers saw errors across 20 kills: {errors:?}\nkeeper log:\n{log}"
    );
    // A daemon killed before it reported INIT (or its takeover) is logged
    // as killed "before serving"; it was replaced all the same.
    assert_logged(&log, "was killed by signal 9", 20);
    assert_uring_refused(&log);
}

#[test]
fn graceful_upgrades_keep_the_mount_and_lose_no_request() {
    if !require_mount_capability() {
        return;
    }
    let tmp = TempMountpoint::new("keeper-upgrade");
    let keeper = Keeper::start(tmp.path());
    let readers = Readers::start(tmp.path(), 4);
    let mut seen = Vec::new();
    for _ in 0..5 {
        let daemon = daemon_of(keeper.pid(), &seen);
        seen.push(daemon);
        std::thread::sleep(Duration::from_millis(100));
        signal(keeper.pid(), libc::SIGUSR2);
        // Wait until another daemon serves.
        let deadline = Instant::now() + Duration::from_secs(10);
        while children(keeper.pid()).iter().any(|p| *p == daemon && alive(*p)) {
            assert!(
                Instant::now() < deadline,
                "the daemon did not retire 10 s after SIGUSR2"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let (reads, errors) = readers.finish(tmp.path());
    assert!(reads > 5, "the readers hardly ran ({reads} reads)");
    let log = keeper.stop();
    assert!(
        errors.is_empty(),
        "readers saw errors across 5 upgrades: {errors:?}\nkeeper log:\n{log}"
    );
    assert_logged(&log, "upgrade requested", 5);
    assert!(
        !log.contains("the retiring daemon"),
        "a daemon did not retire cleanly; the keeper's log:\n{log}"
    );
    assert_uring_refused(&log);
}

/// A keeper in a pid namespace of its own (as in a container): its daemons
/// are killed and upgraded from outside, and readers see no error.
#[test]
fn a_keeper_in_its_own_pid_namespace_recovers() {
    if !require_mount_capability() {
        return;
    }
    let tmp = TempMountpoint::new("keeper-pidns");
    let opts = if over_uring() { "keeper,uring" } else { "keeper" };
    let wrapper = Keeper::start_with(
        std::process::Command::new("unshare")
            .args(["--pid", "--fork"])
            .arg(example_binary("hello"))
            .arg(tmp.path())
            .args(["-o", opts]),
        tmp.path(),
    );
    // The keeper is the wrapper's child, pid 1 of the new namespace.
    let keeper = daemon_of(wrapper.pid(), &[]);
    let ns = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/pid")).expect("a pid namespace");
    assert_ne!(
        ns(keeper),
        ns(std::process::id()),
        "the keeper shares our pid namespace"
    );
    let readers = Readers::start(tmp.path(), 2);
    let mut gone = Vec::new();
    for i in 0..6u64 {
        let daemon = daemon_of(keeper, &gone);
        std::thread::sleep(Duration::from_millis(30 + (i * 37) % 60));
        if i % 3 == 2 {
            signal(keeper, libc::SIGUSR2);
            let deadline = Instant::now() + Duration::from_secs(10);
            while alive(daemon) {
                assert!(
                    Instant::now() < deadline,
                    "the daemon did not retire 10 s after SIGUSR2"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        } else {
            signal(daemon, libc::SIGKILL);
        }
        gone.push(daemon);
    }
    daemon_of(keeper, &gone);
    let (reads, errors) = readers.finish(tmp.path());
    assert!(reads > 6, "the readers hardly ran ({reads} reads)");
    let log = wrapper.stop_via(keeper);
    assert!(
        errors.is_empty(),
        "readers saw errors across kills and upgrades: {errors:?}\nkeeper log:\n{log}"
    );
    assert_logged(&log, "was killed by signal 9", 4);
    assert_logged(&log, "upgrade requested", 2);
}

/// A takeover checks it has the right mount: a descriptor's connection is
/// compared with the mount's device, read from mountinfo (no request to
/// the possibly hung mount).
#[test]
fn a_descriptor_of_another_mount_is_refused() {
    use fuse_wire::session::handover::{HandoverError, check_mountpoint, connection_of};
    use fuse_wire::session::mount::{Mount, MountOptions};
    use std::os::fd::AsFd;
    if !require_mount_capability() {
        return;
    }
    let (ta, tb) = (
        TempMountpoint::new("keeper-check-a"),
        TempMountpoint::new("keeper-check-b"),
    );
    let opts = MountOptions::default();
    // Mounted but never served: nothing here touches the mounts.
    let a = Mount::new(ta.path(), &opts).expect("mount a");
    let b = Mount::new(tb.path(), &opts).expect("mount b");
    let (da, ga) = a.into_parts();
    let (db, gb) = b.into_parts();
    let ca = connection_of(da.as_fd())
        .flatten()
        .expect("a's fdinfo names its connection");
    let cb = connection_of(db.as_fd())
        .flatten()
        .expect("b's fdinfo names its connection");
    assert_ne!(ca, cb);
    let ok_a = check_mountpoint(da.as_fd(), ta.path());
    let wrong = check_mountpoint(da.as_fd(), tb.path());
    let none = check_mountpoint(db.as_fd(), Path::new("/nonexistent-mountpoint"));
    for (d, g, p) in [(da, ga, ta.path()), (db, gb, tb.path())] {
        let _ = abort_fuse_connection(p);
        drop(d);
        let _ = g.unmount();
    }
    assert!(ok_a.is_ok(), "{ok_a:?}");
    assert!(
        matches!(wrong, Err(HandoverError::WrongMount { conn, minor }) if conn == ca && minor == cb),
        "{wrong:?}"
    );
    assert!(matches!(none, Err(HandoverError::Invalid(_))), "{none:?}");
}

/// A keeper killed with SIGKILL leaves its daemon serving: readers see no
/// error, and the mount stays until the daemon goes too.
#[test]
fn a_killed_keeper_leaves_its_daemon_serving() {
    if !require_mount_capability() {
        return;
    }
    let tmp = TempMountpoint::new("keeper-dies");
    let mut keeper = Keeper::start(tmp.path());
    let daemon = daemon_of(keeper.pid(), &[]);
    let readers = Readers::start(tmp.path(), 2);
    std::thread::sleep(Duration::from_millis(200));
    let mut k = keeper.child.take().expect("running");
    signal(k.id(), libc::SIGKILL);
    let _ = k.wait();
    std::thread::sleep(Duration::from_millis(300));
    let (reads, errors) = readers.finish(tmp.path());
    assert!(alive(daemon), "the daemon ended with its keeper");
    assert!(fuse_mounted_at(tmp.path()), "the mount went with the keeper");
    signal(daemon, libc::SIGKILL);
    assert!(reads > 2, "the readers hardly ran ({reads} reads)");
    assert!(
        errors.is_empty(),
        "readers saw errors when the keeper died: {errors:?}"
    );
    // The last holder is gone: the connection is dead; TempMountpoint
    // detaches the mount.
}

/// An upgrade to a binary that cannot take over (here a build that exits
/// at once) is undone: the keeper starts the previous binary again, which
/// it held open, with the same state; readers see nothing. An upgrade to a
/// program that cannot be started at all (missing, not executable) is
/// refused and retires nothing. A later upgrade to a working binary goes
/// through.
#[test]
fn an_upgrade_that_fails_to_take_over_falls_back_to_the_previous_binary() {
    use std::os::unix::fs::PermissionsExt;
    if !require_mount_capability() {
        return;
    }
    let tmp = TempMountpoint::new("keeper-fallback");
    // The keeper runs a copy of hello, which the test replaces on disk.
    let program = tmp.root().join("hello-copy");
    std::fs::copy(example_binary("hello"), &program).expect("copy hello");
    let replace_with = |content: &[u8]| {
        let next = tmp.root().join("hello-next");
        std::fs::write(&next, content).unwrap();
        std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&next, &program).unwrap();
    };
    let keeper = Keeper::start_with(
        std::process::Command::new(&program)
            .arg(tmp.path())
            .args(["-o", "keeper"]),
        tmp.path(),
    );
    let readers = Readers::start(tmp.path(), 2);
    let upgrade = |seen: &mut Vec<u32>| {
        let daemon = daemon_of(keeper.pid(), seen);
        seen.push(daemon);
        std::thread::sleep(Duration::from_millis(100));
        signal(keeper.pid(), libc::SIGUSR2);
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(daemon) {
            assert!(Instant::now() < deadline, "the daemon did not retire");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Whoever serves next (the new binary, or the previous one again).
        let next = daemon_of(keeper.pid(), seen);
        std::thread::sleep(Duration::from_millis(300));
        next
    };
    let mut seen = Vec::new();
    replace_with(b"#!/bin/sh\necho 'a broken build' >&2\nexit 3\n");
    upgrade(&mut seen);
    upgrade(&mut seen);
    // A program that is not there at all (a deploy halfway), then one that
    // is not executable: the upgrade is refused before anything is
    // retired, and the daemon serving serves on.
    let refused = |seen: &[u32]| {
        let serving = daemon_of(keeper.pid(), seen);
        signal(keeper.pid(), libc::SIGUSR2);
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            alive(serving),
            "daemon {serving} was retired for a program that cannot start"
        );
        assert_eq!(daemon_of(keeper.pid(), seen), serving);
    };
    std::fs::remove_file(&program).unwrap();
    refused(&seen);
    std::fs::copy(example_binary("hello"), &program).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused(&seen);
    std::fs::remove_file(&program).unwrap();
    std::fs::copy(example_binary("hello"), tmp.root().join("hello-good")).unwrap();
    std::fs::rename(tmp.root().join("hello-good"), &program).unwrap();
    upgrade(&mut seen);
    let (reads, errors) = readers.finish(tmp.path());
    let log = keeper.stop();
    assert!(reads > 3, "the readers hardly ran ({reads} reads)");
    assert!(
        errors.is_empty(),
        "readers saw errors: {errors:?}\nkeeper log:\n{log}"
    );
    assert_logged(&log, "going back to the previous binary", 2);
    assert_logged(&log, "a broken build", 2);
    assert_logged(&log, "upgrade refused", 2);
}

/// The first daemon dies while answering INIT: before telling the keeper
/// what it negotiated, and after telling it but before the kernel had the
/// answer. Either way the next daemon answers INIT (sent again) and the
/// mount serves; nothing hangs.
#[test]
fn a_first_daemon_dying_in_init_leaves_init_to_its_successor() {
    if !require_mount_capability() {
        return;
    }
    for point in ["effect", "reply"] {
        let tmp = TempMountpoint::new(&format!("keeper-init-{point}"));
        let keeper = Keeper::start_with(
            std::process::Command::new(example_binary("hello"))
                .arg(tmp.path())
                .args(["-o", "keeper"])
                .env("FUSE_WIRE_FAULT", format!("{point}:INIT")),
            tmp.path(),
        );
        let readers = Readers::start(tmp.path(), 2);
        std::thread::sleep(Duration::from_millis(500));
        let (reads, errors) = readers.finish(tmp.path());
        let log = keeper.stop();
        assert!(
            errors.is_empty(),
            "{point}: readers saw errors: {errors:?}\nkeeper log:\n{log}"
        );
        assert!(
            reads > 2,
            "{point}: the mount hardly served ({reads} reads)\nkeeper log:\n{log}"
        );
        assert_eq!(
            log.matches("killing this daemon at").count(),
            1,
            "{point}: one daemon dies in INIT\nkeeper log:\n{log}"
        );
    }
}

/// A filesystem on the node layer under a keeper: the layer keeps its node
/// ids in the daemon only, so a successor would give the ids the kernel
/// holds to other nodes. The daemon refuses to serve, says
/// why, and the keeper ends the mount at once instead of starting daemons
/// that would write into the wrong files.
#[test]
fn a_node_layer_filesystem_is_refused_under_a_keeper_and_the_mount_ends() {
    if !require_mount_capability() {
        return;
    }
    let tmp = TempMountpoint::new("keeper-node-refused");
    let mut child = std::process::Command::new(example_binary("nodefs"))
        .arg(tmp.path())
        .args(["-o", "keeper"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start nodefs -o keeper");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        match child.try_wait().unwrap() {
            Some(s) => break Some(s),
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            None => break None,
        }
    };
    if status.is_none() {
        let _ = abort_fuse_connection(tmp.path());
        let _ = child.kill();
    }
    let mut log = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut log).unwrap();
    let _ = child.wait();
    let status = status.unwrap_or_else(|| panic!("the keeper still ran after 20 s; its log:\n{log}"));
    assert!(!status.success(), "the keeper exited 0; its log:\n{log}");
    assert!(
        log.contains("refused to serve under a keeper: the node layer keeps its node table"),
        "the keeper's error does not say why; its log:\n{log}"
    );
    assert_logged(&log, "refused under a keeper: the node layer", 1);
    assert!(
        !fuse_mounted_at(tmp.path()),
        "the refused mount was left behind; its log:\n{log}"
    );
}

/// An upgrade whose daemon cannot retire (a request it serves does not end
/// by the deadline) is called off: the daemon, which may hold the only copy
/// of a filesystem's state, serves on instead of being killed, and the
/// request it was stuck in still gets its answer.
#[test]
fn a_retirement_past_its_deadline_is_called_off_and_the_daemon_serves_on() {
    if !require_mount_capability() {
        return;
    }
    let tmp = TempMountpoint::new("keeper-retire-deadline");
    let opts = if over_uring() { "keeper,uring" } else { "keeper" };
    let keeper = Keeper::start_with(
        std::process::Command::new(example_binary("hello"))
            .arg(tmp.path())
            .args(["-o", opts])
            // The first OPEN stalls 6 s in the daemon; the keeper gives a
            // retiring daemon 1 s.
            .env("FUSE_WIRE_FAULT", "effect:OPEN")
            .env("FUSE_WIRE_FAULT_STALL_MS", "6000")
            .env("FUSE_WIRE_RETIRE_DEADLINE_MS", "1000"),
        tmp.path(),
    );
    let daemon = daemon_of(keeper.pid(), &[]);
    // Run through the binary the keeper holds open (/proc/self/fd/N), it
    // still goes by its program's name, for ps, top and pgrep: it takes the
    // name as it starts, a moment after the keeper has started it.
    let comm = || std::fs::read_to_string(format!("/proc/{daemon}/comm")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while comm() != "hello\n" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(comm(), "hello\n", "the daemon's process name");
    let read = |what: &'static str| {
        let file = tmp.path().join("hello");
        let reader = std::thread::spawn(move || std::fs::read_to_string(file));
        (what, reader)
    };
    let wait = |(what, reader): (&str, std::thread::JoinHandle<std::io::Result<String>>), secs: u64| {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !reader.is_finished() {
            if Instant::now() > deadline {
                let _ = abort_fuse_connection(tmp.path());
                panic!("{what}: no answer within {secs} s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let got = reader.join().unwrap();
        assert_eq!(got.as_deref().map_err(|e| e.to_string()), Ok(CONTENT), "{what}");
    };
    let stuck = read("the read whose OPEN stalls");
    std::thread::sleep(Duration::from_millis(500));
    signal(keeper.pid(), libc::SIGUSR2);
    // Past the deadline the daemon serves again: a read now is answered
    // long before the stalled OPEN ends.
    std::thread::sleep(Duration::from_millis(1500));
    wait(read("a read after the upgrade was called off"), 3);
    assert!(alive(daemon), "the daemon that could not retire was killed");
    assert_eq!(daemon_of(keeper.pid(), &[]), daemon, "another daemon serves");
    wait(stuck, 15);
    let log = keeper.stop();
    assert_logged(&log, "calling the upgrade off: it serves on", 1);
    assert_logged(&log, "the keeper called the retirement off: serving on", 1);
}
