//! pathfs under a keeper on real mounts (`-o keeper`): the path layer keeps
//! its node table and open files where the keeper holds them
//! (`PathFs::kept`), so after a crash every node id the kernel holds names
//! the same path again and every open file is opened again. Without it a
//! successor gives the kernel's node ids to other paths, and a write to one
//! file lands in another.
//!
//! Every step is bounded: clients still blocked after the end have the
//! connection aborted under them (and that fails the test), and the keeper
//! is killed and its mount freed on drop.

mod common;
mod keeper_support;

use common::*;
use keeper_support::workload::*;
use keeper_support::*;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A keeper running pathfs over `src` on `tm`'s mountpoint, its daemons
/// killing themselves as `fault` says (`FUSE_WIRE_FAULT`, none if empty).
fn keeper(tm: &TempMountpoint, src: &Path, fault: &str) -> Keeper {
    passthrough_keeper(
        "pathfs",
        "",
        "error,fuse_session::recovery::keeper=info",
        tm,
        src,
        fault,
    )
}

/// The data-loss case: the kernel holds node ids for A1..A6 when
/// the daemon is killed; the successor is asked for B1..B6 first. Each
/// append to A1..A6 afterwards (by path, and through a file opened before
/// the kill) must land in its own file, and B1..B6 stay as they were.
#[test]
fn after_a_crash_every_node_id_and_open_file_means_the_same_file() {
    let Some((tm, src)) = setup("path-keeper-ids") else {
        return;
    };
    for i in 1..=6 {
        fs::write(src.join(format!("A{i}")), format!("a{i}\n")).unwrap();
        fs::write(src.join(format!("B{i}")), format!("b{i}\n")).unwrap();
    }
    let k = keeper(&tm, &src, "");
    let mnt = tm.path();
    for i in 1..=6 {
        fs::metadata(mnt.join(format!("A{i}"))).expect("stat A");
    }
    let mut early = fs::OpenOptions::new()
        .append(true)
        .open(mnt.join("A1"))
        .expect("open A1 before the kill");
    let daemon = daemon_of(k.pid(), &[]);
    signal(daemon, libc::SIGKILL);
    for i in 1..=6 {
        fs::metadata(mnt.join(format!("B{i}"))).expect("stat B after the kill");
    }
    for i in 1..=6 {
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(mnt.join(format!("A{i}")))
            .expect("open A after the kill");
        f.write_all(format!("after{i}\n").as_bytes())
            .expect("append to A");
    }
    early
        .write_all(b"early\n")
        .expect("write through the file opened before the kill");
    drop(early);
    for i in 1..=6 {
        let a = fs::read_to_string(src.join(format!("A{i}"))).unwrap();
        let want = if i == 1 {
            "a1\nafter1\nearly\n".to_string()
        } else {
            format!("a{i}\nafter{i}\n")
        };
        assert_eq!(a, want, "A{i} in the source");
        let b = fs::read_to_string(src.join(format!("B{i}"))).unwrap();
        assert_eq!(b, format!("b{i}\n"), "B{i} in the source");
    }
    let log = k.stop();
    assert_logged(&log, "was killed by signal 9", 1);
}

/// Kills at random moments and graceful upgrades under four clients: no
/// client error, and the tree at the end is the clients' (each iteration
/// checks what it made and leaves its directory empty).
#[test]
fn kills_and_upgrades_under_four_clients_lose_nothing() {
    let Some((tm, src)) = setup("path-keeper-kill") else {
        return;
    };
    let k = keeper(&tm, &src, "");
    let mut seed = 0x2545_f491_4f6c_dd1d_u64 ^ u64::from(std::process::id());
    let mut gone = Vec::new();
    let done = workload(tm.path(), 4, 1000, |done| {
        for round in 0..13 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let pid = serving_daemon(k.pid(), &gone);
            std::thread::sleep(Duration::from_millis(5 + seed % 96));
            if round % 4 == 3 {
                signal(k.pid(), libc::SIGUSR2);
            } else {
                signal(pid, libc::SIGKILL);
            }
            gone.push(pid);
        }
        // Some work by the last daemon too.
        let at = done.load(Ordering::Relaxed);
        let t = Instant::now();
        while done.load(Ordering::Relaxed) < at + 8 && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    assert!(done >= 13, "only {done} iterations done in all");
    for c in 0..4 {
        let left: Vec<_> = fs::read_dir(src.join(format!("w{c}")))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            left.is_empty(),
            "client {c}'s directory holds {left:?} at the end"
        );
    }
    let log = k.stop();
    assert!(log.contains("3 upgrades"), "{log}");
}

/// Each daemon kills itself after carrying out a non-idempotent request
/// (its tree updated, the answer not recorded): the successor is sent the
/// request again and must find it done, with the tree naming every node as
/// before.
#[test]
fn kills_between_effect_and_answer_lose_nothing() {
    let Some((tm, src)) = setup("path-keeper-fault") else {
        return;
    };
    let fault = FAULT_OPCODES
        .iter()
        .map(|op| format!("effect:{op}"))
        .collect::<Vec<_>>()
        .join(",");
    let k = keeper(&tm, &src, &fault);
    let done = workload(tm.path(), 2, 3, |_| {});
    assert_eq!(done, 6);
    let log = k.stop();
    // A kill at each fault point the workload reaches, at least.
    assert!(crashes(&log).is_some_and(|n| n > 10), "{log}");
}
