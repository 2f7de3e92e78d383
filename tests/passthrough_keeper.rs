//! passthrough_ll under a keeper on real mounts (`-o keeper`): clients run a
//! metadata and data workload (exclusive creates, writes, fsync, reads that
//! verify, exclusive setxattr and removexattr, appends, renames, links,
//! unlinks, mkdir/rmdir, symlinks, listings) while the serving daemon is killed with SIGKILL at random
//! moments, kills itself between carrying out a non-idempotent request
//! and answering it (`FUSE_WIRE_FAULT`), or is upgraded (`SIGUSR2`). No client may see an error (no
//! EEXIST or ENOENT from a request carried out twice), and files opened
//! before the first kill, an unlinked one among them, must still read and
//! write, and a `flock` lock taken before must still hold. An fsx-style
//! exerciser (random writes, truncations, reads and fsyncs on one file
//! kept open throughout, every read checked against a model) runs beside
//! the clients.
//!
//! Every step is bounded: clients still blocked 30 s after the end have the
//! connection aborted under them (and that fails the test), and the keeper
//! is killed and its mount freed on drop.

mod common;
mod keeper_support;

use common::*;
use keeper_support::workload::*;
use keeper_support::*;
use std::fs;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A keeper serving `src` on `tm`'s mountpoint, its daemons killing
/// themselves as `fault` says (`FUSE_WIRE_FAULT`, none if empty). A line a
/// daemon in the log (counted below), no more: the log goes into a pipe
/// nobody reads until the end.
fn keeper(tm: &TempMountpoint, src: &Path, fault: &str) -> Keeper {
    passthrough_keeper(
        "passthrough_ll",
        "flock,xattr",
        "error,passthrough_ll=info",
        tm,
        src,
        fault,
    )
}

/// `mnt/name`, created (or emptied) for reading and writing, holding `text`.
fn written(mnt: &Path, name: &str, text: &[u8]) -> fs::File {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mnt.join(name))
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
    f.write_all_at(text, 0)
        .unwrap_or_else(|e| panic!("write {name}: {e}"));
    f
}

/// Files opened before the first kill: one kept, one unlinked at once, one
/// holding a `flock` lock, and one whose name is removed in the source
/// directory itself, not through the mount.
struct Early {
    kept: fs::File,
    unlinked: fs::File,
    locked: fs::File,
    outside: fs::File,
}

impl Early {
    fn open(mnt: &Path, src: &Path) -> Early {
        let kept = written(mnt, "kept", b"before the kills");
        let unlinked = written(mnt, "unlinked", b"no name any more");
        fs::remove_file(mnt.join("unlinked")).expect("unlink unlinked");
        let locked = fs::File::create(mnt.join("locked")).expect("create locked");
        // SAFETY: flock on a descriptor the File owns.
        let r = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&locked), libc::LOCK_EX) };
        assert_eq!(r, 0, "flock: {}", std::io::Error::last_os_error());
        let outside = written(mnt, "outside", b"removed at the source");
        fs::remove_file(src.join("outside")).expect("unlink outside, in the source");
        Early {
            kept,
            unlinked,
            locked,
            outside,
        }
    }

    /// The files still read what was written and take new writes, and the
    /// lock still holds against another open file. `outside`: whether the
    /// file removed in the source is checked too (it survives upgrades; a
    /// crash loses it, see docs/recovery.md).
    fn check(&self, mnt: &Path, outside: bool) {
        let other = fs::File::open(mnt.join("locked")).expect("open locked again");
        // SAFETY: flock on a descriptor the File owns.
        let r = unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&other),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        };
        let e = std::io::Error::last_os_error();
        assert!(
            r == -1 && e.raw_os_error() == Some(libc::EWOULDBLOCK),
            "the flock lock taken before the kills no longer holds ({r}, {e})"
        );
        let _ = &self.locked;
        let mut files = vec![
            (&self.kept, "kept", &b"before the kills"[..]),
            (&self.unlinked, "unlinked", &b"no name any more"[..]),
        ];
        if outside {
            files.push((&self.outside, "outside", &b"removed at the source"[..]));
        }
        for (f, what, text) in files {
            let mut buf = vec![0u8; text.len()];
            f.read_exact_at(&mut buf, 0)
                .unwrap_or_else(|e| panic!("reading the {what} file opened before the kills: {e}"));
            assert_eq!(buf, text, "the {what} file's content");
            f.write_all_at(b"after", 100)
                .unwrap_or_else(|e| panic!("writing the {what} file opened before the kills: {e}"));
            let mut tail = [0u8; 5];
            f.read_exact_at(&mut tail, 100).unwrap();
            assert_eq!(&tail, b"after");
        }
    }
}

/// The fsx-style exerciser: a thread doing random operations on
/// `fsx.dat`, opened once before the kills and kept open throughout.
struct Fsx {
    mnt: PathBuf,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<u64, String>>,
}

/// Offsets and sizes stay below this.
const FSX_SPAN: u64 = 256 * 1024;

impl Fsx {
    fn start(mnt: &Path) -> Fsx {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(mnt.join("fsx.dat"))
            .expect("create fsx.dat");
        let stop = Arc::new(AtomicBool::new(false));
        let seed = 0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id());
        let s = stop.clone();
        let thread = std::thread::spawn(move || fsx(&file, seed, &s));
        Fsx {
            mnt: mnt.to_path_buf(),
            stop,
            thread,
        }
    }

    /// Stops it: it must end within 60 s (else the connection is aborted
    /// under it and the test fails), have done some work and seen nothing
    /// wrong.
    fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.thread.is_finished() {
            if Instant::now() > deadline {
                let _ = abort_fuse_connection(&self.mnt);
                panic!("fsx still in a request 60 s after it was told to stop; connection aborted");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        match self.thread.join().expect("the fsx thread") {
            Ok(ops) => assert!(ops >= 100, "fsx did only {ops} operations"),
            Err(e) => panic!("fsx: {e}"),
        }
    }
}

/// Random writes, truncations, fsyncs and reads on `file` until `stop`,
/// each read compared with `model`, what the file must hold; every 64
/// operations the whole file is. The operations done, or what went wrong.
fn fsx(file: &fs::File, seed: u64, stop: &AtomicBool) -> Result<u64, String> {
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut model: Vec<u8> = Vec::new();
    let mut ops = 0u64;
    let compare = |model: &[u8], off: usize, len: usize, what: &str| -> Result<(), String> {
        let mut buf = vec![0u8; len];
        let mut got = 0;
        while got < len {
            match file.read_at(&mut buf[got..], (off + got) as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => return Err(format!("{what}: read of {len} at {off}: {e}")),
            }
        }
        let want = &model[off.min(model.len())..(off + len).min(model.len())];
        if &buf[..got] != want {
            let at = buf[..got].iter().zip(want).position(|(a, b)| a != b);
            return Err(format!(
                "{what}: read {got} bytes at {off}, expected {} (first difference at {at:?})",
                want.len()
            ));
        }
        Ok(())
    };
    while !stop.load(Ordering::Relaxed) {
        let r = next();
        let off = (next() % FSX_SPAN) as usize;
        match r % 8 {
            0..=2 => {
                let len = 1 + (next() % 16384) as usize;
                let data: Vec<u8> = (0..len).map(|i| (i as u64 ^ r >> 8 ^ ops) as u8).collect();
                file.write_all_at(&data, off as u64)
                    .map_err(|e| format!("write of {len} at {off}: {e}"))?;
                if model.len() < off + len {
                    model.resize(off + len, 0);
                }
                model[off..off + len].copy_from_slice(&data);
            }
            3 => {
                file.set_len(off as u64)
                    .map_err(|e| format!("truncate to {off}: {e}"))?;
                model.resize(off, 0);
            }
            4 => file.sync_data().map_err(|e| format!("fsync: {e}"))?,
            _ => compare(&model, off, 1 + (next() % 32768) as usize, "read")
                .map_err(|e| format!("{e} after {ops} operations"))?,
        }
        ops += 1;
        if ops.is_multiple_of(64) {
            let len = file.metadata().map_err(|e| format!("fstat: {e}"))?.len();
            if len != model.len() as u64 {
                return Err(format!(
                    "size {len}, expected {} after {ops} operations",
                    model.len()
                ));
            }
            compare(&model, 0, model.len(), "whole file")
                .map_err(|e| format!("{e} after {ops} operations"))?;
        }
    }
    Ok(ops)
}

/// `fio --verify` on `mnt/fio.dat` for `secs` seconds: random 4 KiB
/// O_DIRECT writes on a file it keeps open, each checked as it goes. `None`
/// (said loudly) where fio is not installed, outside CI.
fn start_fio(mnt: &Path, secs: u32) -> Option<std::process::Child> {
    let spawned = Command::new("fio")
        .args([
            "--name=verify",
            "--size=4M",
            "--bs=4k",
            "--rw=randwrite",
            "--direct=1",
            "--ioengine=psync",
            "--verify=crc32c",
            "--verify_backlog=16",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--time_based",
        ])
        .arg(format!("--runtime={secs}"))
        .arg(format!("--filename={}", mnt.join("fio.dat").display()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    match spawned {
        Ok(c) => Some(c),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            skip("fio is not installed: the workload runs without fio --verify");
            None
        }
        Err(e) => panic!("starting fio: {e}"),
    }
}

/// fio's end: it must exit 0 with no error, within 60 s.
fn finish_fio(mut fio: std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = fio.try_wait().expect("wait for fio") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = fio.kill();
            let _ = fio.wait();
            panic!("fio still running 60 s after its end");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let _ = fio.stdout.take().map(|mut o| o.read_to_string(&mut out));
    let _ = fio.stderr.take().map(|mut o| o.read_to_string(&mut out));
    assert!(
        status.success() && out.contains("err= 0"),
        "fio --verify: {status}\n{out}"
    );
}

/// SIGKILL of the daemon at random moments, 20 times, under four clients
/// and fio --verify.
#[test]
fn repeated_kills_under_a_workload_lose_nothing() {
    let Some((tm, src)) = setup("pt-keeper-kill") else {
        return;
    };
    let k = keeper(&tm, &src, "");
    let early = Early::open(tm.path(), &src);
    let fsx = Fsx::start(tm.path());
    let fio = start_fio(tm.path(), 4);
    let mut seed = 0x2545_f491_4f6c_dd1d_u64 ^ u64::from(std::process::id());
    let mut gone = Vec::new();
    let done = workload(tm.path(), 4, 1000, |done| {
        for _ in 0..20 {
            // xorshift: a pause of 5 to 100 ms before each kill.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let pid = serving_daemon(k.pid(), &gone);
            std::thread::sleep(Duration::from_millis(5 + seed % 96));
            signal(pid, libc::SIGKILL);
            gone.push(pid);
        }
        // Some work by the last daemon too.
        let at = done.load(Ordering::Relaxed);
        let t = Instant::now();
        while done.load(Ordering::Relaxed) < at + 8 && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    assert!(done >= 20, "only {done} iterations done in all");
    if let Some(fio) = fio {
        finish_fio(fio);
    }
    fsx.finish();
    early.check(tm.path(), false);
    drop(early);
    let log = k.stop();
    assert_eq!(crashes(&log), Some(20), "{log}");
}

/// Each daemon kills itself after carrying out a non-idempotent request and
/// before the journal records its answer: every such request is sent again
/// to a successor, which must find it done and answer as the first would.
#[test]
fn kills_between_effect_and_answer_lose_nothing() {
    let Some((tm, src)) = setup("pt-keeper-fault") else {
        return;
    };
    let fault = FAULT_OPCODES
        .iter()
        .map(|op| format!("effect:{op}"))
        .collect::<Vec<_>>()
        .join(",");
    let k = keeper(&tm, &src, &fault);
    // The early files' own requests already go through killed daemons.
    let early = Early::open(tm.path(), &src);
    let done = workload(tm.path(), 2, 3, |_| {});
    assert_eq!(done, 6);
    early.check(tm.path(), false);
    drop(early);
    let log = k.stop();
    // A kill at each fault point the workload reaches, at least.
    assert!(crashes(&log).is_some_and(|n| n > 10), "{log}");
}

/// Five graceful upgrades (`SIGUSR2`) under two clients.
#[test]
fn upgrades_under_a_workload_lose_nothing() {
    let Some((tm, src)) = setup("pt-keeper-upgrade") else {
        return;
    };
    let k = keeper(&tm, &src, "");
    let early = Early::open(tm.path(), &src);
    let fsx = Fsx::start(tm.path());
    let mut gone = Vec::new();
    workload(tm.path(), 2, 1000, |done| {
        for _ in 0..5 {
            let pid = serving_daemon(k.pid(), &gone);
            let at = done.load(Ordering::Relaxed);
            let t = Instant::now();
            // Some work by each daemon.
            while done.load(Ordering::Relaxed) < at + 3 && t.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(5));
            }
            signal(k.pid(), libc::SIGUSR2);
            gone.push(pid);
        }
        serving_daemon(k.pid(), &gone);
    });
    fsx.finish();
    early.check(tm.path(), true);
    drop(early);
    let log = k.stop();
    assert!(log.contains("5 upgrades"), "{log}");
}
