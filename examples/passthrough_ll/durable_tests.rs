//! The node table and the open files under a keeper, without a mount: a
//! table mirrored in shared words and a handle table recording its files
//! there (depositing with a vault what a new open cannot replace) are
//! dropped as a crash would drop them (nothing forgotten, nothing
//! withdrawn), and a successor built from the words and the deposits holds
//! the same node ids, generations and lookup counts, remembers forgotten
//! inodes, and serves the open files, an unlinked one included.

use crate::durable::{self, Keep, Mirror, Words};
use crate::handles::{Budget, Handle, HandleTable, Kept};
use crate::inodes::{HandleMode, InodeData, InodeTable, SHARDS};
use crate::sys;
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// A vault in memory: duplicates by key.
#[derive(Default)]
struct FakeVault(Mutex<HashMap<u64, OwnedFd>>);

impl Keep for FakeVault {
    fn deposit(&self, key: u64, fd: BorrowedFd<'_>) -> std::io::Result<()> {
        let dup = fd.try_clone_to_owned()?;
        self.0.lock().unwrap().insert(key, dup);
        Ok(())
    }

    fn withdraw(&self, key: u64) -> std::io::Result<()> {
        self.0.lock().unwrap().remove(&key);
        Ok(())
    }
}

impl FakeVault {
    /// What a successor receives: a duplicate of everything held.
    fn deposits(&self) -> Vec<(u64, OwnedFd)> {
        let m = self.0.lock().unwrap();
        m.iter().map(|(k, fd)| (*k, fd.try_clone().unwrap())).collect()
    }
}

/// Words shared by the "processes" of a test.
#[derive(Clone)]
struct SharedWords(Arc<[AtomicU64]>);

impl SharedWords {
    /// `bytes` of zeroed words, as a new region.
    fn zeroed(bytes: usize) -> Self {
        SharedWords((0..bytes / 8).map(|_| AtomicU64::new(0)).collect())
    }
}

impl Words for SharedWords {
    fn words(&self) -> &[AtomicU64] {
        &self.0
    }
}

const PER_SHARD: usize = 64;

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pt-durable-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("d")).unwrap();
    dir
}

fn cpath(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

fn path_fd(p: &Path) -> (OwnedFd, libc::stat) {
    let fd = sys::openat(sys::Dir::Cwd, &cpath(p), libc::O_PATH | libc::O_NOFOLLOW, 0).unwrap();
    let st = sys::stat_fd(fd.as_fd()).unwrap();
    (fd, st)
}

/// A daemon's tables over `dir`, kept in `words` and `vault`, taking up
/// what is there.
fn daemon(dir: &Path, words: &SharedWords, vault: &Arc<FakeVault>) -> Option<(InodeTable, HandleTable)> {
    let (root, _) = path_fd(dir);
    let t = InodeTable::new(root, HandleMode::Prefer, 64).unwrap();
    if !t.uses_file_handles() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no file handles on {}",
            dir.display()
        );
        eprintln!("skipped: no file handles on {}", dir.display());
        return None;
    }
    let mirror = Mirror::new(Arc::new(words.clone()), SHARDS, PER_SHARD, false).unwrap();
    let deposits = vault.deposits();
    let anchors = deposits
        .iter()
        .filter_map(|(k, fd)| Some((durable::anchor_of(*k)?, fd.try_clone().unwrap())))
        .collect();
    let keep: Arc<dyn Keep> = vault.clone();
    let kept = Kept::new(keep.clone(), &mirror);
    let t = t.keep_in(mirror, keep.clone(), anchors).unwrap();
    let files = deposits
        .into_iter()
        .filter(|(k, _)| *k < durable::FH_KEYS_END)
        .collect();
    let mut h = HandleTable::new(Arc::new(Budget::new(1 << 12)));
    let reopen = |inode: &Arc<InodeData>, flags: i32| {
        let fd = t.fd(inode)?;
        sys::openat(
            sys::Dir::Cwd,
            &sys::proc_path(fd.as_fd()),
            flags & !libc::O_TRUNC,
            0,
        )
    };
    h.restore(kept, files, &t, &reopen, |f| f);
    Some((t, h))
}

#[test]
fn a_successor_takes_up_the_node_table_and_the_open_files() {
    let dir = scratch("takeover");
    for f in ["f", "g", "d/h", "k", "u", "l"] {
        std::fs::write(dir.join(f), f).unwrap();
    }
    let words = SharedWords::zeroed(durable::region_len(SHARDS, PER_SHARD));
    let vault = Arc::new(FakeVault::default());
    let Some((t1, h1)) = daemon(&dir, &words, &vault) else {
        return;
    };
    let look = |t: &InodeTable, p: &str| {
        let (fd, st) = path_fd(&dir.join(p));
        t.lookup_or_insert(fd, &st).unwrap()
    };
    let f = look(&t1, "f");
    look(&t1, "f");
    let g = look(&t1, "g");
    let d = look(&t1, "d");
    let h = look(&t1, "d/h");
    // f open for reading and writing, then unlinked; d open as a directory.
    let ffd = sys::openat(sys::Dir::Cwd, &cpath(&dir.join("f")), libc::O_RDWR, 0).unwrap();
    let fh = h1
        .insert(Handle::new(ffd, f.data.clone(), false, 0), f.id, libc::O_RDWR)
        .unwrap();
    let dfd = sys::openat(
        sys::Dir::Cwd,
        &cpath(&dir.join("d")),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    )
    .unwrap();
    let dh = h1
        .insert(
            Handle::new(dfd, d.data.clone(), false, 0),
            d.id,
            libc::O_RDONLY | libc::O_DIRECTORY,
        )
        .unwrap();
    let closed = sys::openat(sys::Dir::Cwd, &cpath(&dir.join("g")), libc::O_RDONLY, 0).unwrap();
    let gone_fh = h1
        .insert(
            Handle::new(closed, g.data.clone(), false, 0),
            g.id,
            libc::O_RDONLY,
        )
        .unwrap();
    assert!(h1.remove(gone_fh).is_some());
    // k open for writing only: recorded, nothing deposited.
    let k = look(&t1, "k");
    let kfd = sys::openat(sys::Dir::Cwd, &cpath(&dir.join("k")), libc::O_WRONLY, 0).unwrap();
    let kh = h1
        .insert(Handle::new(kfd, k.data.clone(), false, 0), k.id, libc::O_WRONLY)
        .unwrap();
    assert!(vault.deposits().is_empty(), "opens are recorded, not deposited");
    // f keeps its descriptor with the vault before its last name goes, as
    // an UNLINK does; u loses its name without.
    let ffd = t1.fd(&f.data).unwrap();
    t1.keep_removed(f.id, &f.data, ffd.as_fd()).unwrap();
    drop(ffd);
    std::fs::remove_file(dir.join("f")).unwrap();
    let u = look(&t1, "u");
    let ufd = sys::openat(sys::Dir::Cwd, &cpath(&dir.join("u")), libc::O_RDONLY, 0).unwrap();
    let uh = h1
        .insert(Handle::new(ufd, u.data.clone(), false, 0), u.id, libc::O_RDONLY)
        .unwrap();
    std::fs::remove_file(dir.join("u")).unwrap();
    // l holds a flock lock: its very open file description is deposited.
    let l = look(&t1, "l");
    let lfd = sys::openat(sys::Dir::Cwd, &cpath(&dir.join("l")), libc::O_RDONLY, 0).unwrap();
    let lh = h1
        .insert(Handle::new(lfd, l.data.clone(), false, 0), l.id, libc::O_RDONLY)
        .unwrap();
    let held = h1.open(lh, |_, _| unreachable!("l has its descriptor")).unwrap();
    let held = h1.pin(lh, held).unwrap();
    sys::flock(held.fd(), libc::LOCK_EX).unwrap();
    drop(held);
    // g is forgotten after the last lookup: a node looked up later in
    // g's shard (shards go by inode number, so that varies from run to
    // run) would take g's freed slot, and its node id, with a new
    // generation.
    t1.forget(g.id, 1);
    let (k_id, u_id) = (k.id, u.id);
    drop((k, u, l));
    let (f_id, f_gen, d_id, h_id) = (f.id, f.generation, d.id, h.id);
    let (g_id, g_gen, h_gen) = (g.id, g.generation, h.generation);
    drop((f, g, d, h));
    // The crash: nothing forgotten, nothing withdrawn.
    drop((t1, h1));

    let (t2, h2) = daemon(&dir, &words, &vault).expect("file handles as before");
    assert_eq!(t2.live(), 6, "f, d, d/h, k, u and l are held by the kernel");
    assert_eq!(t2.nlookup(f_id), Some(2));
    assert_eq!(t2.nlookup(d_id), Some(1));
    assert_eq!(t2.nlookup(h_id), Some(1));
    assert!(t2.nlookup(g_id).is_none(), "g was forgotten");
    // By name, d/h is the same node with the same generation.
    let h_again = look(&t2, "d/h");
    assert_eq!((h_again.id, h_again.generation), (h_id, h_gen));
    assert_eq!(t2.nlookup(h_id), Some(2));
    // The forgotten g comes back under its old id and generation.
    let (g2, _) = t2.lookup_node(g_id).unwrap();
    assert_eq!((g2.id, g2.generation), (g_id, g_gen));
    // The unlinked open file: still the same node, readable and writable.
    let no_reopen = |_: &Handle, _: i32| -> std::io::Result<OwnedFd> { unreachable!("taken up open") };
    let hf = h2.open(fh, no_reopen).expect("the open file is taken up");
    assert_eq!(hf.inode.key, t2.get(f_id).unwrap().key);
    assert!(std::sync::Arc::ptr_eq(&hf.inode, &t2.get(f_id).unwrap()));
    assert_eq!(hf.write_at(b"F!", 1).unwrap(), 2);
    let mut buf = [0u8; 3];
    assert_eq!(hf.read_at(&mut buf, 0).unwrap(), 3);
    assert_eq!(&buf, b"fF!");
    let (fnode, _) = t2.lookup_node(f_id).unwrap();
    assert_eq!(fnode.generation, f_gen);
    assert!(h2.get(dh).is_some(), "the open directory is taken up");
    assert!(h2.get(gone_fh).is_none(), "a released file stays released");
    // k is open again, for writing.
    let hk = h2.open(kh, no_reopen).expect("the write-only file is taken up");
    assert!(Arc::ptr_eq(&hk.inode, &t2.get(k_id).unwrap()));
    assert_eq!(hk.write_at(b"K", 0).unwrap(), 1);
    assert_eq!(std::fs::read(dir.join("k")).unwrap(), b"K");
    assert!(
        hk.read_at(&mut buf, 0).is_err(),
        "opened for writing only, as before"
    );
    // u lost its last name without a deposit: its handle no longer opens it.
    assert!(h2.get(uh).is_none(), "{u_id}: a removed file nothing kept");
    // l is the same open file description: its lock still holds, until
    // it is released and withdrawn.
    let other = sys::openat(sys::Dir::Cwd, &cpath(&dir.join("l")), libc::O_RDONLY, 0).unwrap();
    let busy = sys::flock(other.as_fd(), libc::LOCK_EX | libc::LOCK_NB).unwrap_err();
    assert_eq!(busy.raw_os_error(), Some(libc::EWOULDBLOCK));
    drop(h2.remove(lh).expect("the locked file is taken up"));
    sys::flock(other.as_fd(), libc::LOCK_EX | libc::LOCK_NB).expect("the lock went with the release");
    // New handles take no number given before, not even a released one
    // (a RELEASE sent again would close the new file).
    let again = sys::openat(sys::Dir::Cwd, &cpath(&dir.join("g")), libc::O_RDONLY, 0).unwrap();
    let new_fh = h2
        .insert(
            Handle::new(again, g2.data.clone(), false, 0),
            g2.id,
            libc::O_RDONLY,
        )
        .unwrap();
    assert!(
        new_fh > gone_fh && gone_fh > fh.max(dh),
        "{new_fh} after {gone_fh}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_blank_region_on_a_takeover_or_one_of_another_layout_is_refused() {
    let words = SharedWords::zeroed(durable::region_len(SHARDS, PER_SHARD));
    // A blank region on a takeover: the table is lost, refused.
    let e = match Mirror::new(Arc::new(words.clone()), SHARDS, PER_SHARD, true) {
        Ok(_) => panic!("a blank table taken over"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("the kept node table is blank on a takeover"), "{e}");
    Mirror::new(Arc::new(words.clone()), SHARDS, PER_SHARD, false).unwrap();
    Mirror::new(Arc::new(words.clone()), SHARDS, PER_SHARD, true).unwrap();
    let e = match Mirror::new(Arc::new(words.clone()), SHARDS, PER_SHARD / 2, true) {
        Ok(_) => panic!("a layout with other sizes accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("another layout"), "{e}");
    let small = SharedWords::zeroed(128);
    assert!(Mirror::new(Arc::new(small), SHARDS, PER_SHARD, false).is_err());
}

/// Two live nodes of one source key (the source gave a removed inode's
/// number to a new one while the kernel held both): the successor's key
/// leads to the one whose handle still opens, and an open file of it is
/// taken up, wherever the slots lie.
#[test]
fn of_two_live_nodes_of_one_key_the_successor_keeps_the_one_there() {
    let dir = scratch("twokeys");
    std::fs::write(dir.join("f"), b"f").unwrap();
    let words = SharedWords::zeroed(durable::region_len(SHARDS, PER_SHARD));
    let vault = Arc::new(FakeVault::default());
    let Some((t1, h1)) = daemon(&dir, &words, &vault) else {
        return;
    };
    let (fd, st) = path_fd(&dir.join("f"));
    let (real, _) = sys::name_to_handle(fd.as_fd()).unwrap();
    let now = t1.insert_with_handle(fd, &st, Some(real)).unwrap();
    // The removed inode's node, in a later slot of the same shard.
    let (fd, st) = path_fd(&dir.join("f"));
    let gone = sys::RawFileHandle::from_parts(real.handle_type(), &[0x5a; 8]);
    let old = t1.insert_with_handle(fd, &st, Some(gone)).unwrap();
    assert_ne!(now.id, old.id);
    let file = sys::openat(sys::Dir::Cwd, &cpath(&dir.join("f")), libc::O_RDWR, 0).unwrap();
    let fh = h1
        .insert(
            Handle::new(file, now.data.clone(), false, 0),
            now.id,
            libc::O_RDWR,
        )
        .unwrap();
    drop((now.data, old.data));
    drop((t1, h1));

    let (t2, h2) = daemon(&dir, &words, &vault).unwrap();
    let taken = h2.get(fh).expect("the open file is taken up");
    assert!(Arc::ptr_eq(&taken.inode, &t2.get(now.id).unwrap()));
    let (fd, st) = path_fd(&dir.join("f"));
    assert_eq!(
        t2.lookup_or_insert(fd, &st).unwrap().id,
        now.id,
        "the key leads to the inode there"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
