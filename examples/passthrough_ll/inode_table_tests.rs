//! The inode table under concurrency, on its own (no mount): inserts into
//! other shards proceed while one shard's lock is held, and many threads
//! inserting and forgetting at once lose nothing.

use crate::fdcache::DEFAULT_CAPACITY;
use crate::inodes::{HandleMode, InodeTable, SHARDS, shard_of};
use crate::sys;
use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

/// A fresh directory under the system's temporary directory, removed on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("pt-table-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An `O_PATH` descriptor of `p` and its attributes, for the inode table.
fn path_fd(p: &Path) -> (OwnedFd, libc::stat) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL");
    let fd = sys::openat(sys::Dir::Cwd, &c, libc::O_PATH | libc::O_NOFOLLOW, 0).expect("open");
    let st = sys::stat_fd(fd.as_fd()).expect("fstat");
    (fd, st)
}

/// The inode table has no lock that every insert takes: while one shard's
/// lock is held, inserts of inodes that hash to other shards complete, and
/// an insert into the held shard waits exactly until it is released.
#[test]
fn inserts_into_other_shards_proceed_while_one_is_held() {
    let base = TempDir::new("shards");
    let files: Vec<PathBuf> = (0..4 * SHARDS)
        .map(|i| {
            let p = base.0.join(format!("f{i}"));
            std::fs::write(&p, b"").expect("create");
            p
        })
        .collect();
    let shard = |p: &Path| {
        let (_, st) = path_fd(p);
        shard_of((st.st_dev, st.st_ino))
    };
    let held = shard(&files[0]);
    let (same, others): (Vec<PathBuf>, Vec<PathBuf>) =
        files[1..].iter().cloned().partition(|p| shard(p) == held);
    assert!(!others.is_empty(), "every file hashed to shard {held}");
    let (root_fd, _) = path_fd(&base.0);
    let table = Arc::new(InodeTable::new(root_fd, HandleMode::Prefer, DEFAULT_CAPACITY).expect("table"));

    let guard = table.lock_shard(held);
    let (tx, rx) = mpsc::channel();
    let t = table.clone();
    let n_others = others.len();
    std::thread::spawn(move || {
        for p in &others {
            let (fd, st) = path_fd(p);
            t.lookup_or_insert(fd, &st).unwrap();
        }
        let _ = tx.send(());
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(30)).is_ok(),
        "inserts into other shards blocked while shard {held} was held"
    );
    assert_eq!(table.live(), n_others);

    let (tx, rx) = mpsc::channel();
    let t = table.clone();
    let first = files[0].clone();
    std::thread::spawn(move || {
        let (fd, st) = path_fd(&first);
        let _ = tx.send(t.lookup_or_insert(fd, &st).unwrap().id);
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "an insert into the held shard {held} did not wait for its lock"
    );
    drop(guard);
    let id = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the insert into the released shard finished");
    assert!(table.get(id).is_some());
    assert_eq!(table.live(), n_others + 1);
    // Files in the held shard besides the first one, if any, insert normally now.
    for p in &same {
        let (fd, st) = path_fd(p);
        table.lookup_or_insert(fd, &st).unwrap();
    }
    assert_eq!(table.live(), files.len());
}

/// Many threads inserting and forgetting distinct inodes at once lose
/// nothing and get distinct node ids.
#[test]
fn concurrent_inserts_and_forgets() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 500;
    let base = TempDir::new("inodes");
    for t in 0..THREADS {
        for i in 0..PER_THREAD {
            std::fs::write(base.0.join(format!("t{t}-{i}")), b"").expect("create");
        }
    }
    let (root_fd, _) = path_fd(&base.0);
    // File handles (where the scratch directory gives them) with a small
    // descriptor cache: the inserts evict each other's descriptors too.
    let table = Arc::new(InodeTable::new(root_fd, HandleMode::Prefer, 64).expect("table"));
    let (tx, rx) = mpsc::channel();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let table = table.clone();
            let dir = base.0.clone();
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut ids = Vec::new();
                for i in 0..PER_THREAD {
                    for _ in 0..2 {
                        let (fd, st) = path_fd(&dir.join(format!("t{t}-{i}")));
                        ids.push(table.lookup_or_insert(fd, &st).unwrap().id);
                    }
                }
                let _ = tx.send(());
                ids
            })
        })
        .collect();
    for _ in 0..THREADS {
        rx.recv_timeout(Duration::from_secs(60))
            .expect("an inserting thread did not finish within 60 s");
    }
    let ids: Vec<Vec<u64>> = handles
        .into_iter()
        .map(|h| h.join().expect("inserter panicked"))
        .collect();
    let mut all = HashSet::new();
    for per_thread in &ids {
        for pair in per_thread.chunks(2) {
            assert_eq!(pair[0], pair[1], "the same inode got two node ids");
            assert_eq!(table.nlookup(pair[0]), Some(2));
            assert!(all.insert(pair[0]), "node id {} given to two inodes", pair[0]);
        }
    }
    assert_eq!(table.live(), THREADS * PER_THREAD);
    let forgets: Vec<_> = ids
        .into_iter()
        .map(|v| {
            let table = table.clone();
            std::thread::spawn(move || {
                for id in v.into_iter().step_by(2) {
                    table.forget(id, 2);
                }
            })
        })
        .collect();
    for h in forgets {
        h.join().expect("forgetter panicked");
    }
    assert_eq!(table.live(), 0, "every inode forgotten");
}
