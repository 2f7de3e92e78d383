//! Fake-kernel tests of the library-owned inode table under the node layer
//! (and the path layer): lookup counts after sequences of entry replies,
//! READDIRPLUS (added, truncated and skipped entries), FORGET and
//! BATCH_FORGET; the table empty at the end; a FORGET of an unknown node
//! logged, not a panic; generations bumped when a node id is reused.
//!
//! The filesystem is nodefs's tree (examples/nodefs/tree.rs) behind
//! `NodeFs`, or a small directory listing names of its own.

mod common_fake;
#[allow(dead_code)]
#[path = "../examples/pathfs.rs"]
mod pathfs;
#[allow(dead_code)]
#[path = "../examples/nodefs/tree.rs"]
mod tree;

use common_fake::*;
use fuse_wire::node::{DirFill, Invalidator, Node, NodeFs, NodeRef};
use fuse_wire::path::{PathFilesystem, PathFs, PathInvalidator};
use fuse_wire::proto::flags::InitFlags;
use fuse_wire::session::Filesystem;
use fuse_wire::testing::{decode_dir, decode_dir_plus};
use fuse_wire::{DirAdd, Errno, FileAttr, FileKind, Inode, RequestContext, SessionConfig, Statfs};
use std::collections::HashSet;
use std::ffi::CStr;
use std::sync::{Arc, Mutex};

const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const SYMLINK: u32 = 6;
const MKNOD: u32 = 8;
const MKDIR: u32 = 9;
const UNLINK: u32 = 10;
const RENAME: u32 = 12;
const WRITE: u32 = 16;
const STATFS: u32 = 17;
const LINK: u32 = 13;
const RELEASE: u32 = 18;
const CREATE: u32 = 35;
const BATCH_FORGET: u32 = 42;
const READDIR: u32 = 28;
const READDIRPLUS: u32 = 44;

// ---- a log capture, for "logged, not a panic" ----

static LOGGED: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;
impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        LOGGED.lock().unwrap().push(format!("{} {}", r.level(), r.args()));
    }
    fn flush(&self) {}
}

fn capture_logs() {
    let _ = log::set_logger(&Capture);
    log::set_max_level(log::LevelFilter::Warn);
}

// ---- the session ----

/// What the tests read of a layer's table.
trait Counted: Filesystem {
    fn counts(&self) -> Vec<(Inode, u64)>;
    fn live(&self) -> usize;
}

impl Counted for NodeFs {
    fn counts(&self) -> Vec<(Inode, u64)> {
        self.lookup_counts()
    }
    fn live(&self) -> usize {
        self.live_nodes()
    }
}

impl<F: PathFilesystem> Counted for PathFs<F> {
    fn counts(&self) -> Vec<(Inode, u64)> {
        self.lookup_counts()
    }
    fn live(&self) -> usize {
        self.live_nodes()
    }
}

struct Kernel<F: Counted = NodeFs> {
    fake: Fake<F>,
    unique: std::cell::Cell<u64>,
}

impl Kernel<NodeFs> {
    fn start(root: NodeRef) -> Self {
        Self::serve(NodeFs::new(root))
    }
}

impl<F: Counted> Kernel<F> {
    fn serve(fs: F) -> Self {
        let fake = Fake::start(Arc::new(fs), SessionConfig::default());
        fake.init_ready(45, InitFlags::DO_READDIRPLUS.bits());
        Kernel {
            fake,
            unique: std::cell::Cell::new(10),
        }
    }

    fn fs(&self) -> &F {
        &self.fake.fs
    }

    fn next(&self) -> u64 {
        self.unique.set(self.unique.get() + 1);
        self.unique.get()
    }

    /// Sends a request and returns (error, body) of its reply.
    fn call(&self, opcode: u32, nodeid: u64, body: &[u8]) -> (i32, Vec<u8>) {
        let u = self.next();
        let r = self.fake.roundtrip(request(opcode, u, nodeid, body));
        let unique = u64::from_ne_bytes(r[8..16].try_into().unwrap());
        assert_eq!(unique, u, "reply to another request");
        (i32::from_ne_bytes(r[4..8].try_into().unwrap()), r[16..].to_vec())
    }

    /// An entry reply's (nodeid, generation); panics on an error.
    fn entry(&self, opcode: u32, nodeid: u64, body: &[u8]) -> (u64, u64) {
        let (err, b) = self.call(opcode, nodeid, body);
        assert_eq!(err, 0, "opcode {opcode} failed");
        (u64_at(&b, 0), u64_at(&b, 8))
    }

    fn lookup(&self, parent: u64, name: &str) -> (u64, u64) {
        self.entry(LOOKUP, parent, &B::new().name(name).done())
    }

    fn mkdir(&self, parent: u64, name: &str) -> u64 {
        self.entry(MKDIR, parent, &B::new().u32(0o755).u32(0).name(name).done())
            .0
    }

    fn mknod(&self, parent: u64, name: &str) -> u64 {
        let body = B::new()
            .u32(libc::S_IFIFO | 0o644)
            .u32(0)
            .u32(0)
            .u32(0)
            .name(name)
            .done();
        self.entry(MKNOD, parent, &body).0
    }

    fn symlink(&self, parent: u64, name: &str, target: &str) -> u64 {
        self.entry(SYMLINK, parent, &B::new().name(name).name(target).done())
            .0
    }

    fn link(&self, ino: u64, parent: u64, name: &str) -> u64 {
        self.entry(LINK, parent, &B::new().u64(ino).name(name).done()).0
    }

    /// CREATE; the new node id, generation and file handle.
    fn create_open(&self, parent: u64, name: &str) -> (u64, u64, u64) {
        let body = B::new()
            .u32((libc::O_CREAT | libc::O_RDWR) as u32)
            .u32(libc::S_IFREG | 0o644)
            .u32(0)
            .u32(0)
            .name(name)
            .done();
        let (err, b) = self.call(CREATE, parent, &body);
        assert_eq!(err, 0, "CREATE {name} failed");
        (u64_at(&b, 0), u64_at(&b, 8), u64_at(&b, 128))
    }

    fn release(&self, ino: u64, fh: u64) {
        let rel = B::new().u64(fh).u32(0).u32(0).u64(0).done();
        assert_eq!(self.call(RELEASE, ino, &rel).0, 0);
    }

    /// CREATE, then RELEASE of the handle; the new node id.
    fn create(&self, parent: u64, name: &str) -> (u64, u64) {
        let (ino, generation, fh) = self.create_open(parent, name);
        self.release(ino, fh);
        (ino, generation)
    }

    fn rename(&self, parent: u64, name: &str, newparent: u64, newname: &str) -> i32 {
        self.call(
            RENAME,
            parent,
            &B::new().u64(newparent).name(name).name(newname).done(),
        )
        .0
    }

    /// GETATTR (through `fh` if given): (error, nlink, size).
    fn getattr(&self, ino: u64, fh: Option<u64>) -> (i32, u32, u64) {
        let body = B::new()
            .u32(if fh.is_some() { 1 } else { 0 })
            .u32(0)
            .u64(fh.unwrap_or(0))
            .done();
        let (err, b) = self.call(GETATTR, ino, &body);
        if err != 0 {
            return (err, 0, 0);
        }
        // fuse_attr_out: 16 bytes, then fuse_attr (size at 8, nlink at 64).
        let nlink = u32::from_ne_bytes(b[16 + 64..16 + 68].try_into().unwrap());
        (0, nlink, u64_at(&b, 16 + 8))
    }

    /// READDIR (`plus`: READDIRPLUS) of `dir` from `offset` with a
    /// `size`-byte buffer: the reply's body.
    fn list(&self, plus: bool, dir: u64, offset: u64, size: u32) -> Vec<u8> {
        let body = B::new()
            .u64(0)
            .u64(offset)
            .u32(size)
            .u32(0)
            .u64(0)
            .u32(0)
            .u32(0)
            .done();
        let (err, b) = self.call(if plus { READDIRPLUS } else { READDIR }, dir, &body);
        assert_eq!(err, 0);
        b
    }

    /// READDIRPLUS of `dir` from `offset` with a `size`-byte buffer: the
    /// names and node ids in the reply.
    fn readdirplus(&self, dir: u64, offset: u64, size: u32) -> Vec<(String, u64)> {
        let records = decode_dir_plus(&self.list(true, dir, offset, size)).expect("READDIRPLUS records");
        records
            .iter()
            .map(|p| (p.dirent.name_lossy(), p.entry.nodeid))
            .collect()
    }

    /// READDIR of `dir` from `offset` with a `size`-byte buffer: the
    /// (name, d_ino) of each record in the reply.
    fn readdir(&self, dir: u64, offset: u64, size: u32) -> Vec<(String, u64)> {
        let records = decode_dir(&self.list(false, dir, offset, size)).expect("READDIR records");
        records.iter().map(|d| (d.name_lossy(), d.ino)).collect()
    }

    /// READDIRPLUS of `dir` from 0: the (name, `st_ino`) of each entry.
    fn readdirplus_st_ino(&self, dir: u64) -> Vec<(String, u64)> {
        let records = decode_dir_plus(&self.list(true, dir, 0, 65536)).expect("READDIRPLUS records");
        records
            .iter()
            .map(|p| (p.dirent.name_lossy(), p.entry.attr.ino))
            .collect()
    }

    /// GETATTR of `ino`: the `st_ino` it reports.
    fn st_ino(&self, ino: u64) -> u64 {
        let (err, b) = self.call(GETATTR, ino, &B::new().u32(0).u32(0).u64(0).done());
        assert_eq!(err, 0, "GETATTR {ino} failed");
        // fuse_attr_out: 16 bytes, then fuse_attr (ino first).
        u64_at(&b, 16)
    }

    fn forget(&self, ino: u64, n: u64) {
        self.fake
            .send(request(FORGET, self.next(), ino, &B::new().u64(n).done()));
    }

    fn batch_forget(&self, nodes: &[(u64, u64)]) {
        let mut b = B::new().u32(nodes.len() as u32).u32(0);
        for &(ino, n) in nodes {
            b = b.u64(ino).u64(n);
        }
        self.fake.send(request(BATCH_FORGET, self.next(), 0, &b.done()));
    }

    fn count(&self, ino: u64) -> Option<u64> {
        self.fs()
            .counts()
            .into_iter()
            .find(|&(i, _)| i == Inode(ino))
            .map(|(_, n)| n)
    }

    #[track_caller]
    fn expect_counts(&self, what: &str, want: &[(u64, u64)]) {
        let mut want: Vec<(Inode, u64)> = want.iter().map(|&(i, n)| (Inode(i), n)).collect();
        want.push((Inode::ROOT, self.count(1).unwrap_or(0)));
        want.sort();
        // FORGETs have no reply: wait (bounded) for them to take effect.
        let start = std::time::Instant::now();
        loop {
            let got = self.fs().counts();
            if got == want {
                return;
            }
            assert!(
                start.elapsed() < TIMEOUT,
                "{what}: lookup counts\n got  {got:?}\n want {want:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn lookup_counts_follow_every_entry_reply_and_forget() {
    let k = Kernel::start(tree::root());
    let d = k.mkdir(1, "d");
    k.expect_counts("MKDIR", &[(d, 1)]);
    let (f, _) = k.create(d, "f");
    k.expect_counts("CREATE", &[(d, 1), (f, 1)]);
    let p = k.mknod(d, "p");
    let s = k.symlink(d, "s", "target");
    k.expect_counts("MKNOD, SYMLINK", &[(d, 1), (f, 1), (p, 1), (s, 1)]);
    assert_eq!(k.link(f, d, "g"), f, "a hard link is the same node");
    k.expect_counts("LINK", &[(d, 1), (f, 2), (p, 1), (s, 1)]);
    assert_eq!(k.lookup(d, "f").0, f);
    assert_eq!(k.lookup(1, "d").0, d);
    k.expect_counts("LOOKUP", &[(d, 2), (f, 3), (p, 1), (s, 1)]);
    let missing = k.call(LOOKUP, d, &B::new().name("nothing").done());
    assert_eq!(missing.0, -libc::ENOENT);
    k.expect_counts("failed LOOKUP", &[(d, 2), (f, 3), (p, 1), (s, 1)]);

    // A whole listing: ".", ".." not counted, f and g (one node) twice.
    let all = k.readdirplus(d, 0, 65536);
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, [".", "..", "f", "p", "s", "g"]);
    k.expect_counts("READDIRPLUS", &[(d, 2), (f, 5), (p, 2), (s, 2)]);

    // Truncated: 480 bytes hold ".", ".." and "f" (160 bytes each); "p",
    // which did not fit, is not counted.
    let part = k.readdirplus(d, 0, 480);
    assert_eq!(part.len(), 3, "{part:?}");
    k.expect_counts("truncated READDIRPLUS", &[(d, 2), (f, 6), (p, 2), (s, 2)]);
    // And the rest from the last cookie: p, s, g.
    let rest = k.readdirplus(d, 3, 65536);
    assert_eq!(
        rest.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["p", "s", "g"]
    );
    k.expect_counts("READDIRPLUS from a cookie", &[(d, 2), (f, 7), (p, 3), (s, 3)]);

    // Unlinked names live on while the kernel holds them.
    assert_eq!(k.call(UNLINK, d, &B::new().name("s").done()).0, 0);
    k.expect_counts("UNLINK", &[(d, 2), (f, 7), (p, 3), (s, 3)]);

    k.forget(f, 7);
    k.expect_counts("FORGET", &[(d, 2), (p, 3), (s, 3)]);
    k.batch_forget(&[(p, 1), (s, 3)]);
    k.expect_counts("BATCH_FORGET", &[(d, 2), (p, 2)]);
    k.batch_forget(&[(p, 2), (d, 2)]);
    k.expect_counts("BATCH_FORGET of the rest", &[]);
    assert_eq!(k.fs().live(), 1, "only the root is left");
    // The tree still has them: a new LOOKUP finds them again.
    let (d2, _) = k.lookup(1, "d");
    let (f2, _) = k.lookup(d2, "g");
    k.expect_counts("LOOKUP after FORGET", &[(d2, 1), (f2, 1)]);
}

#[test]
fn forget_of_unknown_or_overcounted_nodes_is_logged_not_a_panic() {
    capture_logs();
    let k = Kernel::start(tree::root());
    let d = k.mkdir(1, "d");
    k.forget(0xdead_beef, 1);
    k.batch_forget(&[(0xfeed, 3), (d, 5)]);
    k.expect_counts("FORGET beyond the count drops the node", &[]);
    // The session still serves.
    let (err, _) = k.call(GETATTR, 1, &B::new().u32(0).u32(0).u64(0).done());
    assert_eq!(err, 0);
    let logged = || format!("{:?}", LOGGED.lock().unwrap());
    wait_until(&format!("the warnings (logged so far: {})", logged()), || {
        let l = LOGGED.lock().unwrap();
        l.iter().any(|m| m.contains("FORGET of node 3735928559"))
            && l.iter().any(|m| m.contains("FORGET of node 65261"))
            && l.iter().any(|m| m.contains("FORGET of 5 references"))
    });
}

#[test]
fn a_reused_node_id_gets_a_new_generation() {
    let k = Kernel::start(tree::root());
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut gens: std::collections::HashMap<u64, u64> = Default::default();
    let mut reused = 0;
    for i in 0..2000 {
        let (ino, generation) = k.create(1, &format!("f{i}"));
        assert!(
            seen.insert((ino, generation)),
            "({ino}, {generation}) was handed out twice"
        );
        if let Some(&old) = gens.get(&ino) {
            assert!(
                generation > old,
                "node id {ino} reused with generation {generation} after {old}"
            );
            reused += 1;
        }
        gens.insert(ino, generation);
        k.forget(ino, 1);
        k.expect_counts("FORGET", &[]);
        if reused >= 20 {
            break;
        }
    }
    assert!(reused >= 20, "node ids were never reused ({reused})");
}

// ---- READDIRPLUS entries the reply leaves out ----

/// A directory listing names the kernel would reject between good ones.
struct Odd {
    files: Vec<(Vec<u8>, NodeRef)>,
}

struct Leaf;
impl Node for Leaf {
    fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
        Ok(FileAttr::new(0, FileKind::RegularFile, 0o644))
    }
}

impl Node for Odd {
    fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
        Ok(FileAttr::new(0, FileKind::Directory, 0o755))
    }
    fn lookup(&self, _: &RequestContext<'_>, name: &CStr) -> Result<NodeRef, Errno> {
        let f = self.files.iter().find(|(n, _)| n == name.to_bytes());
        f.map(|(_, n)| n.clone()).ok_or(Errno::ENOENT)
    }
    fn readdir(&self, _: &RequestContext<'_>, offset: u64, out: &mut DirFill<'_, '_>) -> Result<(), Errno> {
        for (i, (name, node)) in self.files.iter().enumerate().skip(offset as usize) {
            if out.add(name, i as u64 + 1, node).is_full() {
                break;
            }
        }
        Ok(())
    }
}

#[test]
fn skipped_and_truncated_readdirplus_entries_are_not_counted() {
    let names: Vec<Vec<u8>> = vec![
        b"good1".to_vec(),
        b"bad/slash".to_vec(),
        vec![b'x'; 2000],
        b"good2".to_vec(),
        b"good3".to_vec(),
    ];
    let files: Vec<(Vec<u8>, NodeRef)> = names
        .into_iter()
        .map(|n| (n, Arc::new(Leaf) as NodeRef))
        .collect();
    let k = Kernel::start(Arc::new(Odd { files }));
    // ".", "..", good1, good2 fit in 4 × 160 bytes + 8 (good3 does not).
    let got = k.readdirplus(1, 0, 4 * 160 + 8);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, [".", "..", "good1", "good2"]);
    let (g1, g2) = (got[2].1, got[3].1);
    assert_ne!(g1, g2);
    k.expect_counts("skipped and truncated entries", &[(g1, 1), (g2, 1)]);
    assert_eq!(k.fs().live(), 3, "root, good1 and good2 only");
    k.batch_forget(&[(g1, 1), (g2, 1)]);
    k.expect_counts("all forgotten", &[]);
}

// ---- what the layers' `add` answers ----

/// The names the recording directories below list, in order: a good one,
/// two the kernel rejects, (node layer only: one whose attributes cannot
/// be read,) another good one, a long one that does not fit, and a short
/// one that would fit in what is left but must not be sent after it.
fn listed_names(unreadable: bool) -> Vec<Vec<u8>> {
    let mut names = vec![b"good1".to_vec(), b"bad/slash".to_vec(), vec![b'x'; 2000]];
    if unreadable {
        names.push(b"unreadable".to_vec());
    }
    names.extend([b"good2".to_vec(), vec![b'y'; 200], b"z".to_vec()]);
    names
}

/// What each `add` answered, per name.
type Answers = Arc<Mutex<Vec<(String, DirAdd)>>>;

fn short(name: &[u8]) -> String {
    String::from_utf8_lossy(&name[..name.len().min(10)]).into_owned()
}

/// A node whose attributes cannot be read.
struct Unreadable;
impl Node for Unreadable {
    fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
        Err(Errno::EIO)
    }
}

/// A node-layer directory that lists every name, whatever `add` answers,
/// and records the answers.
struct NodeRecording {
    files: Vec<(Vec<u8>, NodeRef)>,
    answers: Answers,
}
impl Node for NodeRecording {
    fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
        Ok(FileAttr::new(0, FileKind::Directory, 0o755))
    }
    fn readdir(&self, _: &RequestContext<'_>, offset: u64, out: &mut DirFill<'_, '_>) -> Result<(), Errno> {
        for (i, (name, node)) in self.files.iter().enumerate().skip(offset as usize) {
            let added = out.add(name, i as u64 + 1, node);
            self.answers.lock().unwrap().push((short(name), added));
        }
        Ok(())
    }
}

/// The same on the path layer.
struct PathRecording {
    answers: Answers,
}
impl PathFilesystem for PathRecording {
    type File = ();
    fn getattr(
        &self,
        _: &RequestContext<'_>,
        _: Option<&std::path::Path>,
        _: Option<&()>,
    ) -> Result<FileAttr, Errno> {
        Ok(FileAttr::new(0, FileKind::Directory, 0o755))
    }
    fn readdir(
        &self,
        _: &RequestContext<'_>,
        _: &std::path::Path,
        offset: u64,
        out: &mut fuse_wire::path::PathDirFill<'_>,
    ) -> Result<(), Errno> {
        for (i, name) in listed_names(false).iter().enumerate().skip(offset as usize) {
            let added = out.add(name, FileKind::RegularFile, i as u64 + 1);
            self.answers.lock().unwrap().push((short(name), added));
        }
        Ok(())
    }
}

/// The answers `add` must give for `listed_names`: the good names added,
/// the rejected and unreadable ones skipped, the long one full, and the
/// short one after it full too (the reply ends at the first entry that
/// did not fit, or the listing would lose it).
fn expected_answers(unreadable: bool) -> Vec<(String, DirAdd)> {
    let mut want = vec![
        ("good1".to_string(), DirAdd::Added),
        ("bad/slash".to_string(), DirAdd::Skipped),
        ("xxxxxxxxxx".to_string(), DirAdd::Skipped),
    ];
    if unreadable {
        want.push(("unreadable".to_string(), DirAdd::Skipped));
    }
    want.extend([
        ("good2".to_string(), DirAdd::Added),
        ("yyyyyyyyyy".to_string(), DirAdd::Full),
        ("z".to_string(), DirAdd::Full),
    ]);
    want
}

#[test]
fn the_layers_add_answers_dir_add_added_skipped_and_full() {
    let answers = Answers::default();
    let files = listed_names(true)
        .into_iter()
        .map(|n| {
            let node: NodeRef = match &n[..] {
                b"unreadable" => Arc::new(Unreadable),
                _ => Arc::new(Leaf),
            };
            (n, node)
        })
        .collect();
    let k = Kernel::start(Arc::new(NodeRecording {
        files,
        answers: answers.clone(),
    }));
    let take = || std::mem::take(&mut *answers.lock().unwrap());

    // READDIR records are 32 bytes for these short names: five fit, the
    // long name (224 bytes) does not, "z" would.
    let got = k.readdir(1, 0, 5 * 32);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, [".", "..", "good1", "good2"], "node layer, READDIR");
    assert_eq!(take(), expected_answers(true), "node layer, READDIR");

    // READDIRPLUS records are 160 bytes for short names, 352 for the long one.
    let got = k.readdirplus(1, 0, 5 * 160);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, [".", "..", "good1", "good2"], "node layer, READDIRPLUS");
    assert_eq!(take(), expected_answers(true), "node layer, READDIRPLUS");

    let k = Kernel::serve(PathFs::new(PathRecording {
        answers: answers.clone(),
    }));
    let got = k.readdir(1, 0, 5 * 32);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, [".", "..", "good1", "good2"], "path layer, READDIR");
    assert_eq!(take(), expected_answers(false), "path layer, READDIR");
}

/// A path-layer directory whose `readdir` gives no inode numbers: `a`
/// (cookie 1), `b` (the largest cookie), and two cookies past it.
struct PathNumbered;
impl PathFilesystem for PathNumbered {
    type File = ();
    fn getattr(
        &self,
        _: &RequestContext<'_>,
        path: Option<&std::path::Path>,
        _: Option<&()>,
    ) -> Result<FileAttr, Errno> {
        match path.and_then(|p| p.to_str()) {
            Some("/") => Ok(FileAttr::new(1000, FileKind::Directory, 0o755)),
            Some("/a") => Ok(FileAttr::new(1001, FileKind::RegularFile, 0o644)),
            Some("/b") => Ok(FileAttr::new(1002, FileKind::RegularFile, 0o644)),
            _ => Err(Errno::ENOENT),
        }
    }
    fn readdir(
        &self,
        _: &RequestContext<'_>,
        _: &std::path::Path,
        offset: u64,
        out: &mut fuse_wire::path::PathDirFill<'_>,
    ) -> Result<(), Errno> {
        let max = fuse_wire::path::MAX_COOKIE;
        for (name, cookie) in [("a", 1), ("b", max), ("c", max + 1), ("d", u64::MAX)] {
            if cookie > offset && out.add(name.as_bytes(), FileKind::RegularFile, cookie).is_full() {
                break;
            }
        }
        Ok(())
    }
}

#[test]
fn path_layer_listings_carry_st_ino_and_cookies_that_cannot_collide() {
    use fuse_wire::testing::TestKernel;
    let k = TestKernel::start(PathFs::new(PathNumbered)).unwrap();
    let listed = |k: &TestKernel<PathFs<PathNumbered>>| {
        let fh = fuse_wire::FileHandle(k.opendir(Inode::ROOT).unwrap().fh);
        let got = k.readdir(Inode::ROOT, fh, 0, 4096).unwrap();
        k.releasedir(Inode::ROOT, fh).unwrap();
        got.iter()
            .map(|e| (e.name_lossy(), e.ino, e.offset))
            .collect::<Vec<_>>()
    };
    let want = |a: u64| {
        vec![
            (".".to_string(), 1000, 1),
            ("..".to_string(), 1000, 2),
            ("a".to_string(), a, 3),
            ("b".to_string(), 1002, u64::MAX),
        ]
    };
    // Names the kernel has not looked up: numbers from getattr; the two
    // cookies past MAX_COOKIE are left out, not sent as u64::MAX again.
    assert_eq!(listed(&k), want(1001));
    // A name the kernel knows: the number it was given.
    let e = k.lookup(Inode::ROOT, "a").unwrap();
    assert_eq!(e.attr.ino, 1001);
    assert_eq!(listed(&k), want(1001));
    k.forget(Inode(e.nodeid), 1);
    k.finish().unwrap();
}

// ---- st_ino on the node layer ----

/// A node reporting its own `st_ino`.
struct Numbered(u64);
impl Node for Numbered {
    fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
        Ok(FileAttr::new(self.0, FileKind::RegularFile, 0o644))
    }
}

#[test]
fn node_layer_st_ino_is_1_for_the_root_and_never_an_address() {
    // Two nodes leaving `ino` 0 and one reporting 7.
    let (a, b): (NodeRef, NodeRef) = (Arc::new(Leaf), Arc::new(Leaf));
    let files = vec![
        (b"a".to_vec(), a.clone()),
        (b"b".to_vec(), b.clone()),
        (b"seven".to_vec(), Arc::new(Numbered(7)) as NodeRef),
    ];
    let root = Arc::new(Odd { files });
    let addresses: Vec<u64> = [
        Arc::as_ptr(&a) as *const () as u64,
        Arc::as_ptr(&b) as *const () as u64,
        Arc::as_ptr(&root) as *const () as u64,
    ]
    .to_vec();
    let k = Kernel::start(root);
    // An address, or one near an address of this heap, is what must not show.
    let fresh = Box::new(0u8);
    let heap = [&addresses[..], &[&*fresh as *const u8 as u64]].concat();
    let address_like = |ino: u64| heap.iter().any(|&h| ino.abs_diff(h) < 1 << 32);

    assert_eq!(k.st_ino(1), 1, "the root's st_ino");
    let (na, _) = k.lookup(1, "a");
    let (nb, _) = k.lookup(1, "b");
    let (n7, _) = k.lookup(1, "seven");
    let (ia, ib) = (k.st_ino(na), k.st_ino(nb));
    for (what, ino) in [("a", ia), ("b", ib)] {
        assert!(ino > 1, "{what}: st_ino {ino:#x}");
        assert!(
            !address_like(ino),
            "{what}: st_ino {ino:#x} is near a heap address {heap:#x?}"
        );
    }
    assert_ne!(ia, ib, "two nodes, one st_ino");
    assert_eq!(k.st_ino(n7), 7, "a node's own number is kept");
    assert_eq!(k.st_ino(na), ia, "st_ino is stable");

    // Listings show the same numbers ("." and ".." of the root are 1).
    let want = [(".", 1), ("..", 1), ("a", ia), ("b", ib), ("seven", 7)];
    let want: Vec<(String, u64)> = want.iter().map(|&(n, i)| (n.to_string(), i)).collect();
    assert_eq!(k.readdir(1, 0, 4096), want, "READDIR d_ino");
    assert_eq!(k.readdirplus_st_ino(1), want, "READDIRPLUS st_ino");
}

// ---- statfs through the layers ----

/// What both layers' filesystems below report.
const STATS: Statfs = Statfs::new()
    .with_block_size(4096)
    .with_blocks(1000, 500, 400)
    .with_files(77, 66)
    .with_namelen(200);

struct NodeStats;
impl Node for NodeStats {
    fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
        Ok(FileAttr::fixed(0, FileKind::Directory, 0o755))
    }
    fn statfs(&self, _: &RequestContext<'_>) -> Result<Statfs, Errno> {
        Ok(STATS)
    }
}

struct PathStats;
impl PathFilesystem for PathStats {
    type File = ();
    fn getattr(
        &self,
        _: &RequestContext<'_>,
        _: Option<&std::path::Path>,
        _: Option<&()>,
    ) -> Result<FileAttr, Errno> {
        Ok(FileAttr::fixed(1, FileKind::Directory, 0o755))
    }
    fn statfs(&self, _: &RequestContext<'_>, _: &std::path::Path) -> Result<Statfs, Errno> {
        Ok(STATS)
    }
}

#[test]
fn the_layers_answer_statfs_with_a_typed_statfs() {
    // fuse_kstatfs: blocks, bfree, bavail, files, ffree, then bsize,
    // namelen, frsize, padding and 6 spare u32s.
    let want = B::new()
        .u64(1000)
        .u64(500)
        .u64(400)
        .u64(77)
        .u64(66)
        .u32(4096)
        .u32(200)
        .u32(4096)
        .u32(0)
        .zeros(24)
        .done();
    let (err, got) = Kernel::start(Arc::new(NodeStats)).call(STATFS, 1, &[]);
    assert_eq!(err, 0);
    assert_bytes("node layer STATFS", &got, &want);
    let (err, got) = Kernel::serve(PathFs::new(PathStats)).call(STATFS, 1, &[]);
    assert_eq!(err, 0);
    assert_bytes("path layer STATFS", &got, &want);
    // The raw form converts both ways without loss.
    assert_eq!(Statfs::from(STATS.to_abi()), STATS);
}

// ---- the path layer ----

#[test]
fn path_layer_counts_and_moves_names_with_renames_and_unlinks() {
    let src = std::env::temp_dir().join(format!("fuse-wire-layers-fake-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir(&src).unwrap();
    // pathfs creates nodes as their caller (uid 1000 here, and the fake
    // kernel checks nothing): let it.
    std::fs::set_permissions(&src, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let k = Kernel::serve(PathFs::new(pathfs::Mirror::new(src.clone())));
    let path = |ino: u64| k.fs().path_of(Inode(ino)).map(|p| p.display().to_string());

    let d = k.mkdir(1, "d");
    let e = k.mkdir(d, "e");
    let (f, _, fh) = k.create_open(e, "f");
    assert_eq!(k.lookup(d, "e").0, e);
    k.expect_counts("MKDIR, CREATE, LOOKUP", &[(d, 1), (e, 2), (f, 1)]);
    assert_eq!(path(f).as_deref(), Some("/d/e/f"));

    // A directory rename moves the subtree.
    assert_eq!(k.rename(1, "d", 1, "x"), 0);
    assert_eq!(path(f).as_deref(), Some("/x/e/f"));
    assert!(src.join("x/e/f").exists());
    assert_eq!(k.lookup(d, "e").0, e, "the moved directory keeps its node");

    // Unlinked while open: no path, but the open file still works.
    assert_eq!(k.call(UNLINK, e, &B::new().name("f").done()).0, 0);
    assert_eq!(path(f), None);
    let w = B::new()
        .u64(fh)
        .u64(0)
        .u32(5)
        .u32(0)
        .u64(0)
        .u32(0)
        .u32(0)
        .bytes(b"hello")
        .done();
    assert_eq!(k.call(WRITE, f, &w).0, 0, "WRITE through the open file");
    assert_eq!(k.getattr(f, Some(fh)), (0, 0, 5), "fstat through the file");
    assert_eq!(
        k.getattr(f, None),
        (0, 0, 5),
        "GETATTR of the unnamed node uses its open file"
    );
    assert_eq!(k.lookup(1, "x").0, d);
    k.release(f, fh);

    // A hard link is the same node; renaming one name onto the other does nothing.
    let (g, _) = k.create(d, "g");
    assert_eq!(k.link(g, d, "h"), g);
    k.expect_counts("LINK", &[(d, 2), (e, 3), (f, 1), (g, 2)]);
    assert_eq!(k.rename(d, "g", d, "h"), 0);
    assert_eq!(path(g).as_deref(), Some("/x/g"));
    assert_eq!(k.call(UNLINK, d, &B::new().name("g").done()).0, 0);
    assert_eq!(path(g).as_deref(), Some("/x/h"), "the other name is left");

    k.batch_forget(&[(d, 2), (e, 3), (f, 1), (g, 2)]);
    k.expect_counts("all forgotten", &[]);
    assert_eq!(k.fs().live(), 1);
    // Forgotten names are looked up afresh, with new node ids or generations.
    let (h2, _) = k.lookup(1, "x");
    assert_eq!(path(h2).as_deref(), Some("/x"));
    let _ = std::fs::remove_dir_all(&src);
}

// ---- invalidation from inside a handler ----

/// A root whose LOOKUP of "x" first drops the kernel's cache of "x" and of
/// the file, from inside the handler, then answers.
struct Invalidating {
    file: NodeRef,
    me: std::sync::OnceLock<(Invalidator, std::sync::Weak<Invalidating>)>,
}

impl Node for Invalidating {
    fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
        Ok(FileAttr::new(0, FileKind::Directory, 0o755))
    }
    fn lookup(&self, _: &RequestContext<'_>, name: &CStr) -> Result<NodeRef, Errno> {
        if name.to_bytes() != b"x" {
            return Err(Errno::ENOENT);
        }
        let (inval, me) = self.me.get().expect("set before serving");
        let me: NodeRef = me.upgrade().expect("alive");
        inval.entry(&me, b"x").expect("INVAL_ENTRY queued");
        inval
            .content(&self.file)
            .expect("INVAL_INODE queued (or not needed)");
        Ok(self.file.clone())
    }
}

#[test]
fn a_node_invalidates_its_own_entries_from_inside_a_handler() {
    let root = Arc::new(Invalidating {
        file: Arc::new(Leaf),
        me: Default::default(),
    });
    let fs = NodeFs::new(root.clone());
    let _ = root.me.set((fs.invalidator(), Arc::downgrade(&root)));
    let k = Kernel::serve(fs);
    // The first LOOKUP: the file is not known yet, so only the entry is
    // invalidated; the second: both. Each reply comes (no deadlock).
    for round in 0..2 {
        let u = k.next();
        k.fake.send(request(LOOKUP, u, 1, &B::new().name("x").done()));
        let want = if round == 0 { 2 } else { 3 };
        let mut got = Vec::new();
        for _ in 0..want {
            got.push(k.fake.recv());
        }
        let entry = B::new().u64(1).u32(1).u32(0).cstr("x").done();
        assert!(
            got.contains(&notification(3, &entry)),
            "round {round}: no INVAL_ENTRY of (1, x) among {} messages",
            got.len()
        );
        let reply = got
            .iter()
            .find(|m| u64::from_ne_bytes(m[8..16].try_into().unwrap()) == u)
            .unwrap_or_else(|| panic!("round {round}: no reply to the LOOKUP"));
        assert_eq!(i32::from_ne_bytes(reply[4..8].try_into().unwrap()), 0);
        if round == 1 {
            let ino = u64_at(reply, 16);
            let inode = B::new().u64(ino).i64(0).i64(0).done();
            assert!(got.contains(&notification(2, &inode)), "no INVAL_INODE of {ino}");
        }
    }
    k.fake.expect_silence("after the two lookups");
}

// ---- concurrency ----

#[test]
fn concurrent_lookups_and_forgets_leave_the_table_empty() {
    // Many LOOKUPs in flight on the session's workers at once, each reply
    // forgotten as soon as it arrives while others are still being served:
    // nodes drop to 0 and come back (new numbers or generations) under
    // concurrent lookups. Every reply is given back; nothing may be left.
    let k = Kernel::start(tree::root());
    let d = k.mkdir(1, "d");
    for i in 0..8 {
        let (f, _) = k.create(d, &format!("f{i}"));
        k.forget(f, 1);
    }
    k.forget(d, 1);
    k.expect_counts("set up", &[]);
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut names_of: std::collections::HashMap<(u64, u64), String> = Default::default();
    for round in 0..200 {
        // The directory itself, then its files, all at once.
        let (dir, _) = k.lookup(1, "d");
        let first = k.next();
        for i in 0..8u64 {
            let name = format!("f{}", (i + round) % 8);
            k.fake
                .send(request(LOOKUP, first + i, dir, &B::new().name(&name).done()));
        }
        for _ in 0..8 {
            k.next();
        }
        for _ in 0..8 {
            let r = k.fake.recv();
            let unique = u64::from_ne_bytes(r[8..16].try_into().unwrap());
            assert_eq!(
                i32::from_ne_bytes(r[4..8].try_into().unwrap()),
                0,
                "LOOKUP {unique} failed"
            );
            let (ino, generation) = (u64_at(&r, 16), u64_at(&r, 24));
            let name = format!("f{}", (unique - first + round) % 8);
            // One (number, generation) never names two files.
            let other = names_of.entry((ino, generation)).or_insert_with(|| name.clone());
            assert_eq!(*other, name, "({ino}, {generation}) named two files");
            seen.insert((ino, generation));
            k.forget(ino, 1);
        }
        k.forget(dir, 1);
    }
    k.expect_counts("every reply forgotten", &[]);
    assert!(seen.len() >= 8);
}

#[test]
fn a_path_filesystem_invalidates_its_own_paths_from_inside_a_method() {
    /// Its GETATTR of "/x" drops the kernel's entry of "x" and the
    /// content of "/x" before answering.
    struct SelfInvalidating {
        inval: std::sync::OnceLock<PathInvalidator>,
    }
    impl PathFilesystem for SelfInvalidating {
        type File = ();
        fn getattr(
            &self,
            _: &RequestContext<'_>,
            path: Option<&std::path::Path>,
            _: Option<&()>,
        ) -> Result<FileAttr, Errno> {
            match path.and_then(|p| p.to_str()) {
                Some("/") => Ok(FileAttr::new(1, FileKind::Directory, 0o755)),
                Some("/x") => {
                    let inval = self.inval.get().expect("set before serving");
                    inval
                        .entry(std::path::Path::new("/"), b"x")
                        .expect("INVAL_ENTRY queued");
                    inval
                        .content(std::path::Path::new("/x"))
                        .expect("INVAL_INODE queued");
                    Ok(FileAttr::new(0, FileKind::RegularFile, 0o644))
                }
                _ => Err(Errno::ENOENT),
            }
        }
    }
    let fs = PathFs::new(SelfInvalidating {
        inval: Default::default(),
    });
    let _ = fs.inner().inval.set(fs.invalidator());
    let k = Kernel::serve(fs);
    for round in 0..2 {
        let u = k.next();
        k.fake.send(request(LOOKUP, u, 1, &B::new().name("x").done()));
        // Round 0: "/x" is not known yet (entry only); round 1: both.
        let want = if round == 0 { 2 } else { 3 };
        let got: Vec<Vec<u8>> = (0..want).map(|_| k.fake.recv()).collect();
        let entry = B::new().u64(1).u32(1).u32(0).cstr("x").done();
        assert!(
            got.contains(&notification(3, &entry)),
            "round {round}: no INVAL_ENTRY"
        );
        let reply = got
            .iter()
            .find(|m| u64::from_ne_bytes(m[8..16].try_into().unwrap()) == u)
            .unwrap_or_else(|| panic!("round {round}: no reply to the LOOKUP"));
        if round == 1 {
            let inode = B::new().u64(u64_at(reply, 16)).i64(0).i64(0).done();
            assert!(got.contains(&notification(2, &inode)), "no INVAL_INODE");
        }
    }
    k.fake.expect_silence("after the two lookups");
}

// ---- FLUSH only where a file asks for it ----

/// A directory whose CREATE makes a file that asks for FLUSH when its name
/// starts with "flushed".
struct FlushChoice;
impl Node for FlushChoice {
    fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
        Ok(FileAttr::new(0, FileKind::Directory, 0o755))
    }
    fn create(
        &self,
        _: &RequestContext<'_>,
        name: &CStr,
        _: fuse_wire::CreateRequest,
    ) -> Result<(NodeRef, fuse_wire::node::Opened), Errno> {
        let opened = fuse_wire::node::Opened::new(NoIo);
        let opened = match name.to_bytes().starts_with(b"flushed") {
            true => opened.with_flush(),
            false => opened,
        };
        Ok((Arc::new(Leaf), opened))
    }
}
struct NoIo;
impl fuse_wire::node::OpenFile for NoIo {}

/// The same for the path layer.
struct PathFlushChoice;
impl PathFilesystem for PathFlushChoice {
    type File = ();
    fn getattr(
        &self,
        _: &RequestContext<'_>,
        path: Option<&std::path::Path>,
        _: Option<&()>,
    ) -> Result<FileAttr, Errno> {
        let kind = match path.map(|p| p.as_os_str() == "/") {
            Some(true) => FileKind::Directory,
            _ => FileKind::RegularFile,
        };
        Ok(FileAttr::new(0, kind, 0o644))
    }
    fn create(
        &self,
        _: &RequestContext<'_>,
        path: &std::path::Path,
        _: fuse_wire::CreateRequest,
    ) -> Result<(FileAttr, fuse_wire::path::PathOpened<()>), Errno> {
        let opened = fuse_wire::path::PathOpened::new(());
        let flushed = path
            .file_name()
            .is_some_and(|n| n.as_encoded_bytes().starts_with(b"flushed"));
        let opened = if flushed { opened.with_flush() } else { opened };
        Ok((FileAttr::new(0, FileKind::RegularFile, 0o644), opened))
    }
}

/// Checks the `fuse_open_out` (fh, open_flags, backing_id) of CREATE
/// replies: NOFLUSH by default, no flags for a file that asks for FLUSH.
fn expect_flush_choice<F: Counted>(k: &Kernel<F>, layer: &str) {
    const NOFLUSH: u32 = 1 << 5;
    for (name, flags) in [("plain", NOFLUSH), ("flushed", 0)] {
        let body = B::new()
            .u32((libc::O_CREAT | libc::O_RDWR) as u32)
            .u32(libc::S_IFREG | 0o644)
            .u32(0)
            .u32(0)
            .name(name)
            .done();
        let (err, b) = k.call(CREATE, 1, &body);
        assert_eq!(err, 0, "{layer}: CREATE {name} failed");
        let want = B::new().u64(u64_at(&b, 128)).u32(flags).u32(0).done();
        assert_eq!(b[128..], want[..], "{layer}: open flags of {name}");
    }
}

#[test]
fn layer_files_are_opened_without_flush_unless_they_ask_for_it() {
    expect_flush_choice(&Kernel::start(Arc::new(FlushChoice)), "node layer");
    expect_flush_choice(&Kernel::serve(PathFs::new(PathFlushChoice)), "path layer");
}
