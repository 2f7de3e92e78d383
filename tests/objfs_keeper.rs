//! objfs under a keeper (`objfs -o keeper`), on real mounts: an async
//! filesystem that uploads at close, its staged uploads in kept memory.
//!
//! - `cp` into the mount with the serving daemon killed (SIGKILL) at a
//!   random moment of the copy, five times, and once a graceful upgrade
//!   instead: `cp` exits 0 every time, and the object in the bucket and
//!   what the mount reads back are the source, byte for byte.
//! - A writer that writes half a file, sees its daemon killed, writes the
//!   other half and closes: every write and the close succeed and the
//!   object is whole; a shell's `echo y > existing` (whose first FLUSH
//!   comes before the data) leaves `y`.
//!
//! Every step is bounded: a copy or a close that does not end fails the
//! test, and the keeper's mount is freed on drop.

mod common;
mod keeper_support;

use common::*;
use keeper_support::*;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SIZE: usize = 12 << 20;

/// `SIZE` bytes no two rounds share (a small xorshift from `seed`).
fn source(dir: &Path, seed: u64) -> PathBuf {
    let mut x = seed | 1;
    let mut data = Vec::with_capacity(SIZE);
    while data.len() < SIZE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    let path = dir.join(format!("source-{seed}"));
    fs::write(&path, &data).unwrap();
    path
}

struct Setup {
    tmp: TempMountpoint,
    bucket: PathBuf,
    keeper: Keeper,
}

fn start(tag: &str) -> Option<Setup> {
    if !require_mount_capability() {
        return None;
    }
    let tmp = TempMountpoint::new(tag);
    let bucket = tmp.root().join("bucket");
    fs::create_dir(&bucket).unwrap();
    let keeper = Keeper::start_with(
        Command::new(example_binary("objfs"))
            .arg(tmp.path())
            .args(["-o", &format!("keeper,bucket={}", bucket.display())]),
        tmp.path(),
    );
    Some(Setup { tmp, bucket, keeper })
}

/// The same bytes, or where they first differ.
fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    if got != want {
        let at = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{what}: {} bytes, want {}; first difference at byte {at}",
            got.len(),
            want.len()
        );
    }
}

#[test]
fn cp_into_the_mount_survives_kills_and_an_upgrade_of_the_daemon() {
    let Some(s) = start("objfs-cp") else { return };
    let mnt = s.tmp.path();
    let mut gone = Vec::new();
    let mut mid_copy = 0;
    for round in 0..6u64 {
        let src = source(s.tmp.root(), round + 1);
        let dst = mnt.join(format!("copy-{round}"));
        let daemon = daemon_of(s.keeper.pid(), &gone);
        let mut cp = Command::new("cp")
            .arg(&src)
            .arg(&dst)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cp");
        // A moment somewhere in the copy, different each round.
        std::thread::sleep(Duration::from_millis(15 + (round * 37) % 120));
        let copying = cp.try_wait().unwrap().is_none();
        if round == 5 {
            signal(s.keeper.pid(), libc::SIGUSR2);
        } else {
            signal(daemon, libc::SIGKILL);
        }
        gone.push(daemon);
        mid_copy += usize::from(copying);
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(st) = cp.try_wait().unwrap() {
                break st;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: cp did not end in 120 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        if let Some(mut e) = cp.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        assert!(status.success(), "round {round}: cp failed ({status}): {err}");
        let want = fs::read(&src).unwrap();
        let name = format!("copy-{round}");
        // Uploaded at the FLUSH of cp's close, before close(2) returned.
        assert_same(
            &format!("round {round}: the object"),
            &fs::read(s.bucket.join(&name)).unwrap(),
            &want,
        );
        assert_same(
            &format!("round {round}: read through the mount"),
            &fs::read(mnt.join(&name)).unwrap(),
            &want,
        );
        fs::remove_file(&src).unwrap();
    }
    assert!(
        mid_copy >= 4,
        "only {mid_copy} of 6 daemons went while cp was copying: the test did not test"
    );
    let log = s.keeper.stop();
    assert_logged(&log, "was killed by signal 9; starting another", 5);
}

#[test]
fn a_writer_whose_daemon_is_killed_between_writes_loses_nothing() {
    let Some(s) = start("objfs-writer") else { return };
    let mnt = s.tmp.path();
    let half: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(mnt.join("written"))
        .unwrap();
    f.write_all(&half).unwrap();
    let daemon = daemon_of(s.keeper.pid(), &[]);
    signal(daemon, libc::SIGKILL);
    // The next write reaches the successor, which finds the upload staged.
    f.write_all(&half).unwrap();
    f.sync_all().ok();
    drop(f);
    let want = [half.clone(), half].concat();
    assert_same("the object", &fs::read(s.bucket.join("written")).unwrap(), &want);

    // `echo y > existing`: open, dup2 and close (a FLUSH with no data),
    // then write and close.
    fs::write(s.bucket.join("existing"), b"a longer object\n").unwrap();
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!("echo y > {}", mnt.join("existing").display()))
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(fs::read(s.bucket.join("existing")).unwrap(), b"y\n");
    // And one that is never written to is emptied at its release.
    File::create(mnt.join("existing")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while fs::metadata(s.bucket.join("existing")).unwrap().len() != 0 {
        assert!(
            Instant::now() < deadline,
            "a truncating open left the object as it was"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let log = s.keeper.stop();
    assert_logged(&log, "was killed by signal 9; starting another", 1);
}
