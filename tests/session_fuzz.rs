//! A session fuzzer: random but well-formed request sequences, sent through
//! the fake kernel into memfs and into passthrough_ll (over a temporary
//! directory), and into the layers' examples (nodefs on the node layer,
//! pathfs on the path layer over a temporary directory), checked as the
//! kernel would see them:
//!
//! - no handler panics (a panic hook counts them; the session would turn
//!   one into EIO and a log line);
//! - no hang: every batch of requests must be answered before a deadline,
//!   else the test fails with the seed and the last requests;
//! - exactly one reply per request (none for FORGET, BATCH_FORGET and
//!   INTERRUPT), each with a well-formed header: a pending unique, a length
//!   that matches, an error of 0 or -1..-4095 (error replies header-only);
//! - lookup counts balance: the fuzzer counts what the kernel would from the
//!   replies (LOOKUP, CREATE, MKNOD, MKDIR, SYMLINK, LINK, TMPFILE entries
//!   and READDIRPLUS entries), removes the tree, releases its handles and
//!   sends the matching FORGETs, and then the filesystem must hold no inode
//!   but the root (and memfs must count one inode slot and the bytes of
//!   the root alone).
//!
//! Requests follow the kernel's contract where a filesystem may rely on it
//! (an inode is used only while the kernel holds a lookup on it; FORGET
//! never drops more than was counted) and break it where a filesystem must
//! cope anyway (invalid file handles, names such as "." and "..", names of
//! 256 bytes, bytes above 0x7f, huge offsets and sizes, INTERRUPT of any
//! request, unknown opcodes, a second INIT).
//!
//! CI runs fixed seeds with a small budget. `scripts/fuzz-session` runs a
//! long one: `FUZZ_SEED` (else random, printed), `FUZZ_REQUESTS`,
//! `FUZZ_TARGET` (`memfs`, `passthrough`, `nodefs`, `pathfs`, or all),
//! through the ignored test
//! `fuzz_long`.

mod common_fake;

// The example filesystems, compiled into this test. Kept together here so
// that one place changes when the examples become a library.
#[allow(dead_code)]
#[path = "../examples/passthrough_ll/durable.rs"]
mod durable;
#[allow(dead_code)]
#[path = "../examples/passthrough_ll/fdcache.rs"]
mod fdcache;
#[allow(dead_code)]
#[path = "../examples/passthrough_ll/handles.rs"]
mod handles;
#[allow(dead_code)]
#[path = "../examples/passthrough_ll/inodes.rs"]
mod inodes;
#[allow(dead_code)]
#[path = "../examples/memfs/fs.rs"]
mod memfs_fs;
#[allow(dead_code)]
#[path = "../examples/passthrough_ll/openfds.rs"]
mod openfds;
#[allow(dead_code)]
#[path = "../examples/passthrough_ll/passthrough.rs"]
mod passthrough;
#[allow(dead_code)]
#[path = "../examples/passthrough_ll/fs.rs"]
mod passthrough_fs;
#[allow(dead_code)]
#[path = "../examples/passthrough_ll/sys.rs"]
mod sys;
// The layers' examples: nodefs's tree (node layer) and pathfs's mirror
// (path layer).
#[allow(dead_code)]
#[path = "../examples/nodefs/tree.rs"]
mod nodefs_tree;
#[allow(dead_code)]
#[path = "../examples/pathfs.rs"]
mod pathfs;

use common_fake::{Fake, OP_INIT, init_body};
use fuse_wire::proto::Opcode;
use fuse_wire::proto::abi::*;
use fuse_wire::session::{Filesystem, SessionConfig};
use fuse_wire::testing::{decode_dir, decode_dir_plus};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};
use zerocopy::{FromBytes, IntoBytes};

/// How long a batch may take before the run counts as hung.
const HANG: Duration = Duration::from_secs(20);
/// How long to wait before interrupting requests that have no reply yet
/// (a lock wait blocks until interrupted or the lock is freed).
const NUDGE: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------
// Panics
// ---------------------------------------------------------------------------

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static PANIC_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Counts every panic in the process (the session catches handler panics;
/// this hook sees them first).
fn watch_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current().name().unwrap_or("?").to_string();
            // Only the session's threads: a failing test elsewhere in this
            // binary is not the filesystem's panic.
            if !thread.starts_with("fuse") {
                return default(info);
            }
            PANIC_COUNT.fetch_add(1, Ordering::SeqCst);
            if let Ok(mut p) = PANICS.lock() {
                p.push(format!("thread {thread}: {info}"));
            }
            default(info);
        }));
    });
}

// ---------------------------------------------------------------------------
// Randomness
// ---------------------------------------------------------------------------

/// splitmix64: small, fast, reproducible from one seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
    /// Mostly small values, sometimes edges.
    fn offset(&mut self) -> u64 {
        match self.below(10) {
            0 => *self.pick(&[
                0,
                u64::MAX,
                i64::MAX as u64,
                (i64::MAX as u64) - 1,
                1 << 40,
                4095,
                65536,
            ]),
            1..=3 => self.below(4096),
            4..=7 => self.below(256 * 1024),
            _ => self.below(8 << 20),
        }
    }
    fn size(&mut self, max: u64) -> u64 {
        match self.below(10) {
            0 => 0,
            1 => max,
            2..=6 => self.below(4097),
            _ => self.below(max + 1),
        }
    }
}

// ---------------------------------------------------------------------------
// The target filesystems
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Memfs,
    Passthrough,
    /// nodefs on the node layer.
    Nodefs,
    /// pathfs on the path layer (over a scratch directory).
    Pathfs,
}

/// A final check of a filesystem's own accounting.
type Check<F> = dyn Fn(&F) -> Result<(), String>;

/// A filesystem under test and how to look inside it.
struct Subject<F: Filesystem> {
    fs: Arc<F>,
    /// Inodes the filesystem holds that must be gone at the end.
    live: Box<dyn Fn(&F) -> usize>,
    /// What `live` must come back to.
    baseline: usize,
    /// Extra checks at the end (capacity accounting).
    settled: Box<Check<F>>,
    target: Target,
}

/// A scratch directory for passthrough_ll (on tmpfs when /dev/shm is one),
/// removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(seed: u64) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let base = if std::fs::metadata("/dev/shm").is_ok_and(|m| m.is_dir()) {
            std::path::PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!(
            "fuse-wire-fuzz-{}-{}-{seed:x}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn memfs_subject() -> Subject<memfs_fs::MemFs> {
    let config = memfs_fs::MemFsConfig {
        posix_lock: true,
        flock: true,
        // Small, so that ENOSPC paths are reached.
        size: 16 << 20,
        nr_inodes: 300,
        ..memfs_fs::MemFsConfig::default()
    };
    Subject {
        fs: Arc::new(memfs_fs::MemFs::new(config)),
        live: Box::new(|fs| fs.inode_count()),
        baseline: 1,
        // At rest memfs holds its root alone: one inode slot, and the
        // root's record (its directory and xattrs empty again).
        settled: Box::new(|fs| match fs.usage() {
            (memfs_fs::capacity::INODE_COST, 1) => Ok(()),
            (bytes, inodes) => Err(format!(
                "memfs still counts {bytes} bytes and {inodes} inode slots (want {} and 1)",
                memfs_fs::capacity::INODE_COST
            )),
        }),
        target: Target::Memfs,
    }
}

/// passthrough_ll over `dir`; odd seeds use one `O_PATH` descriptor per
/// inode, even ones file handles behind a tiny descriptor cache (so that
/// reopening by handle happens all the time).
fn passthrough_subject(dir: &std::path::Path, seed: u64) -> Subject<passthrough_fs::PassthroughFs> {
    use std::os::fd::OwnedFd;
    let root: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_path()
        .open(dir)
        .expect("open scratch")
        .into();
    let opts = passthrough_fs::FsOptions {
        xattr: true,
        flock: true,
        posix_lock: true,
        splice: false,
        inode_file_handles: if seed % 2 == 1 {
            inodes::HandleMode::Never
        } else {
            inodes::HandleMode::Prefer
        },
        fd_cache: 4,
        ..passthrough_fs::FsOptions::default()
    };
    Subject {
        fs: Arc::new(passthrough_fs::PassthroughFs::new(root, opts).expect("passthrough fs")),
        live: Box::new(|fs| fs.live_inodes()),
        baseline: 0,
        settled: Box::new(|fs| match fs.open_handles() {
            0 => Ok(()),
            n => Err(format!("passthrough_ll still holds {n} open handles")),
        }),
        target: Target::Passthrough,
    }
}

/// nodefs's tree on the node layer: the library's table must be back to
/// the root, with no open file.
fn nodefs_subject() -> Subject<fuse_wire::node::NodeFs> {
    Subject {
        fs: Arc::new(fuse_wire::node::NodeFs::new(nodefs_tree::root())),
        live: Box::new(|fs| fs.live_nodes()),
        baseline: 1,
        settled: Box::new(|fs| match fs.open_files() {
            0 => Ok(()),
            n => Err(format!("the node layer still holds {n} open files")),
        }),
        target: Target::Nodefs,
    }
}

/// pathfs over `dir` on the path layer.
fn pathfs_subject(dir: &std::path::Path) -> Subject<fuse_wire::path::PathFs<pathfs::Mirror>> {
    Subject {
        fs: Arc::new(fuse_wire::path::PathFs::new(pathfs::Mirror::new(
            dir.to_path_buf(),
        ))),
        live: Box::new(|fs| fs.live_nodes()),
        baseline: 1,
        settled: Box::new(|fs| match fs.open_files() {
            0 => Ok(()),
            n => Err(format!("the path layer still holds {n} open files")),
        }),
        target: Target::Pathfs,
    }
}

/// `O_PATH | O_DIRECTORY` for the passthrough root.
trait PathFlags {
    fn custom_flags_path(&mut self) -> &mut Self;
}

impl PathFlags for std::fs::OpenOptions {
    fn custom_flags_path(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_PATH | libc::O_DIRECTORY)
    }
}

// ---------------------------------------------------------------------------
// The fuzzer
// ---------------------------------------------------------------------------

/// What the fuzzer remembers of a request until its reply.
#[derive(Clone, Debug)]
struct Pending {
    op: u32,
    nodeid: u64,
    desc: String,
}

/// An open file or directory as the kernel would hold it.
#[derive(Clone, Copy, Debug)]
struct Handle {
    nodeid: u64,
    fh: u64,
    dir: bool,
}

/// Results of one run.
#[derive(Default)]
struct Report {
    requests: BTreeMap<&'static str, u64>,
    errors: BTreeMap<i32, u64>,
    total: u64,
}

struct Fuzzer<'a, F: Filesystem> {
    fake: &'a Fake<F>,
    rng: Rng,
    seed: u64,
    target: Target,
    unique: u64,
    /// The kernel's lookup count per node id (the root is never counted).
    lookups: HashMap<u64, u64>,
    /// `S_IFMT` bits of the nodes seen.
    kinds: HashMap<u64, u32>,
    /// Node ids that had a lookup once, for deliberately stale requests.
    forgotten: Vec<u64>,
    handles: Vec<Handle>,
    names: Vec<Vec<u8>>,
    pending: HashMap<u64, Pending>,
    /// INTERRUPTs sent: each may get one reply, EAGAIN ("not in flight
    /// yet, send it again"), or none.
    interrupts: std::collections::HashSet<u64>,
    recent: VecDeque<String>,
    setxattr_ext: bool,
    report: Report,
}

const ROOT: u64 = 1;

fn op_name(op: u32) -> &'static str {
    Opcode::from_u32(op).map(|o| o.name()).unwrap_or("UNKNOWN")
}

impl<'a, F: Filesystem> Fuzzer<'a, F> {
    fn new(fake: &'a Fake<F>, seed: u64, target: Target) -> Self {
        Fuzzer {
            fake,
            rng: Rng(seed),
            seed,
            target,
            unique: 1,
            lookups: HashMap::new(),
            kinds: HashMap::from([(ROOT, libc::S_IFDIR)]),
            forgotten: Vec::new(),
            handles: Vec::new(),
            names: [&b"a"[..], b"b", b"c", b"dir", b"f"]
                .iter()
                .map(|n| n.to_vec())
                .collect(),
            pending: HashMap::new(),
            interrupts: std::collections::HashSet::new(),
            recent: VecDeque::new(),
            setxattr_ext: false,
            report: Report::default(),
        }
    }

    fn fail(&self, what: &str) -> ! {
        let recent: Vec<&String> = self.recent.iter().collect();
        panic!(
            "session fuzz ({:?}, seed {:#x}): {what}\nlast requests (oldest first):\n  {}",
            self.target,
            self.seed,
            recent.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n  ")
        );
    }

    fn remember(&mut self, s: String) {
        if self.recent.len() == 64 {
            self.recent.pop_front();
        }
        self.recent.push_back(s);
    }

    /// Sends one request; `reply` says whether one is expected.
    fn send(&mut self, op: u32, nodeid: u64, body: &[u8], reply: bool, desc: String) -> u64 {
        self.unique += 1;
        let unique = self.unique;
        let (uid, gid, pid) = if self.rng.chance(85) {
            me()
        } else {
            (1000, 1000, 0x3fff_fff0)
        };
        let len = 40 + body.len();
        let mut req = Vec::with_capacity(len);
        req.extend_from_slice(
            InHeader {
                len: len as u32,
                opcode: op,
                unique,
                nodeid,
                uid,
                gid,
                pid,
                total_extlen: 0,
                padding: 0,
            }
            .as_bytes(),
        );
        req.extend_from_slice(body);
        let name = op_name(op);
        *self.report.requests.entry(name).or_default() += 1;
        self.report.total += 1;
        self.remember(format!("#{unique} {name} node={nodeid} uid={uid} {desc}"));
        if reply {
            self.pending.insert(unique, Pending { op, nodeid, desc });
        } else if op == 36 {
            self.interrupts.insert(unique);
        }
        self.fake.send(req);
        unique
    }

    fn name(&mut self) -> Vec<u8> {
        match self.rng.below(20) {
            0 => b".".to_vec(),
            1 => b"..".to_vec(),
            2 => vec![b'n'; 255],
            3 => vec![b'x'; 256],
            4 | 5 => {
                // Any bytes but NUL and '/', many above 0x7f.
                let n = 1 + self.rng.below(40) as usize;
                (0..n)
                    .map(|_| match self.rng.below(256) as u8 {
                        0 | b'/' => 0xff,
                        b => b,
                    })
                    .collect()
            }
            _ => self.rng.pick(&self.names).clone(),
        }
    }

    fn cname(&mut self) -> Vec<u8> {
        let mut n = self.name();
        n.push(0);
        n
    }

    /// A node the kernel holds (or, rarely, one it does not).
    fn node(&mut self) -> u64 {
        if self.rng.chance(3) && !self.forgotten.is_empty() {
            return *self.rng.pick(&self.forgotten);
        }
        if self.rng.chance(1) {
            return self.rng.next() | 1 << 63;
        }
        let held: Vec<u64> = self
            .lookups
            .iter()
            .filter(|(_, c)| **c > 0)
            .map(|(n, _)| *n)
            .collect();
        if held.is_empty() || self.rng.chance(15) {
            ROOT
        } else {
            *self.rng.pick(&held)
        }
    }

    /// A node the kernel could OPEN: a regular file, mostly (the kernel
    /// opens FIFOs, sockets and devices itself, and opening a FIFO on the
    /// source side would block; directories get OPENDIR).
    fn openable(&mut self) -> u64 {
        for _ in 0..8 {
            let n = self.node();
            match self.kinds.get(&n) {
                Some(&libc::S_IFREG) | None => return n,
                Some(&libc::S_IFDIR) if self.rng.chance(5) => return n,
                Some(_) => continue,
            }
        }
        ROOT
    }

    fn dir(&mut self) -> u64 {
        for _ in 0..4 {
            let n = self.node();
            if self.kinds.get(&n) == Some(&libc::S_IFDIR) {
                return n;
            }
        }
        if self.rng.chance(80) { ROOT } else { self.node() }
    }

    /// A handle for `nodeid` (mostly a real one), or a random one.
    fn fh(&mut self, nodeid: u64, dir: bool) -> u64 {
        let mine: Vec<u64> = self
            .handles
            .iter()
            .filter(|h| h.nodeid == nodeid && h.dir == dir)
            .map(|h| h.fh)
            .collect();
        match self.rng.below(10) {
            0 => self.rng.next(),
            1 => 0,
            2 if !self.handles.is_empty() => self.rng.pick(&self.handles).fh,
            _ if !mine.is_empty() => *self.rng.pick(&mine),
            _ => self.rng.below(8),
        }
    }

    /// A node with an open handle (file or directory), if any.
    fn opened(&mut self, dir: bool) -> (u64, u64) {
        let cand: Vec<Handle> = self.handles.iter().filter(|h| h.dir == dir).copied().collect();
        if cand.is_empty() || self.rng.chance(10) {
            let n = if dir { self.dir() } else { self.node() };
            (n, self.fh(n, dir))
        } else {
            let h = *self.rng.pick(&cand);
            (h.nodeid, h.fh)
        }
    }

    fn owner(&mut self) -> u64 {
        *self.rng.pick(&[1u64, 2, 3, 0xdead_beef])
    }

    fn mode(&mut self) -> u32 {
        (self.rng.next() as u32) & 0o7777
    }

    /// One random request.
    fn random_request(&mut self) {
        let r = &mut self.rng;
        // The kernel releases what it opens: keep the open handles few.
        // The kernel forgets inodes it no longer caches: keep the held
        // ones bounded too (passthrough_ll keeps a descriptor for each).
        let held = self.lookups.values().filter(|c| **c > 0).count();
        let choice = if self.handles.len() > 48 && r.chance(30) {
            52
        } else if held > 256 && r.chance(30) {
            90
        } else {
            r.below(100)
        };
        match choice {
            0..=9 => {
                let (p, n) = (self.dir(), self.cname());
                self.send(1, p, &n, true, format!("LOOKUP {}", show(&n)));
            }
            10..=12 => {
                let n = self.node();
                let fh = self.fh(n, false);
                let flags = if self.rng.chance(30) { 1 } else { 0 };
                let b = GetattrIn {
                    getattr_flags: flags,
                    dummy: 0,
                    fh,
                };
                self.send(3, n, b.as_bytes(), true, format!("fh={fh}"));
            }
            13..=16 => {
                let n = self.node();
                let valid = (self.rng.next() as u32) & 0x1fff;
                let size = if self.rng.chance(80) {
                    self.rng.below(300_000)
                } else {
                    self.rng.offset()
                };
                let b = SetattrIn {
                    valid,
                    fh: self.fh(n, false),
                    size,
                    mode: self.mode(),
                    uid: *self.rng.pick(&[0, 1000, 65534, u32::MAX]),
                    gid: *self.rng.pick(&[0, 1000, 65534, u32::MAX]),
                    atime: self.rng.next() >> 1,
                    mtime: self.rng.below(1 << 33),
                    atimensec: self.rng.next() as u32,
                    mtimensec: self.rng.below(1_000_000_000) as u32,
                    ..SetattrIn::default()
                };
                self.send(4, n, b.as_bytes(), true, format!("valid={valid:#x} size={size}"));
            }
            17 => {
                let n = self.node();
                self.send(5, n, &[], true, String::new());
            }
            18..=20 => {
                let (p, mut n) = (self.dir(), self.cname());
                // On passthrough_ll the target stays a plain name: nothing
                // here should lead outside the scratch directory.
                let t = if matches!(self.target, Target::Passthrough | Target::Pathfs) {
                    let mut t = self.rng.pick(&self.names).clone();
                    t.push(0);
                    t
                } else {
                    self.cname()
                };
                let desc = format!("SYMLINK {} -> {}", show(&n), show(&t));
                n.extend_from_slice(&t);
                self.send(6, p, &n, true, desc);
            }
            21..=22 => {
                let (p, n) = (self.dir(), self.cname());
                let kinds: &[u32] = &[libc::S_IFIFO, libc::S_IFREG, libc::S_IFSOCK, 0, libc::S_IFDIR];
                let kind = *self.rng.pick(kinds);
                let b = MknodIn {
                    mode: kind | self.mode(),
                    rdev: 0,
                    umask: 0o022,
                    padding: 0,
                };
                let body = [b.as_bytes(), &n].concat();
                self.send(8, p, &body, true, format!("MKNOD {} mode={:o}", show(&n), b.mode));
            }
            23..=26 => {
                let (p, n) = (self.dir(), self.cname());
                let b = MkdirIn {
                    mode: self.mode() | 0o700,
                    umask: 0o022,
                };
                let body = [b.as_bytes(), &n].concat();
                self.send(9, p, &body, true, format!("MKDIR {}", show(&n)));
            }
            27..=29 => {
                let (p, n) = (self.dir(), self.cname());
                let op = if self.rng.chance(70) { 10 } else { 11 };
                self.send(op, p, &n, true, show(&n));
            }
            30..=32 => {
                let (p, n, np, nn) = (self.dir(), self.cname(), self.dir(), self.cname());
                let desc = format!("{} -> {np}/{}", show(&n), show(&nn));
                if self.rng.chance(50) {
                    let body = [RenameIn { newdir: np }.as_bytes(), &n, &nn].concat();
                    self.send(12, p, &body, true, desc);
                } else {
                    let flags = *self.rng.pick(&[0u32, 1, 2, 3, 4]);
                    let b = Rename2In {
                        newdir: np,
                        flags,
                        padding: 0,
                    };
                    let body = [b.as_bytes(), &n, &nn].concat();
                    self.send(45, p, &body, true, format!("flags={flags} {desc}"));
                }
            }
            33..=34 => {
                let (old, p, n) = (self.node(), self.dir(), self.cname());
                let body = [LinkIn { oldnodeid: old }.as_bytes(), &n].concat();
                self.send(13, p, &body, true, format!("LINK {old} as {}", show(&n)));
            }
            35..=38 => {
                let n = self.openable();
                let flags = *self.rng.pick(&[
                    libc::O_RDONLY,
                    libc::O_WRONLY,
                    libc::O_RDWR,
                    libc::O_RDWR | libc::O_TRUNC,
                    libc::O_WRONLY | libc::O_APPEND,
                    libc::O_RDONLY | libc::O_DIRECTORY,
                ]) as u32;
                let b = OpenIn { flags, open_flags: 0 };
                self.send(14, n, b.as_bytes(), true, format!("flags={flags:#o}"));
            }
            39..=43 => {
                let (n, fh) = self.opened(false);
                let b = ReadIn {
                    fh,
                    offset: self.rng.offset(),
                    size: self.rng.size(128 * 1024) as u32,
                    lock_owner: self.owner(),
                    ..ReadIn::default()
                };
                self.send(
                    15,
                    n,
                    b.as_bytes(),
                    true,
                    format!("fh={fh} off={} size={}", b.offset, b.size),
                );
            }
            44..=50 => {
                let (n, fh) = self.opened(false);
                let size = self.rng.size(128 * 1024) as usize;
                let byte = self.rng.next() as u8;
                let b = WriteIn {
                    fh,
                    offset: self.rng.offset(),
                    size: size as u32,
                    write_flags: *self.rng.pick(&[0u32, 2, 4]),
                    lock_owner: self.owner(),
                    ..WriteIn::default()
                };
                let body = [b.as_bytes(), &vec![byte; size]].concat();
                self.send(
                    16,
                    n,
                    &body,
                    true,
                    format!("fh={fh} off={} size={size}", b.offset),
                );
            }
            51 => {
                let n = self.node();
                self.send(17, n, &[], true, String::new());
            }
            52..=53 => {
                // RELEASE / RELEASEDIR of a held handle (or a bogus one).
                let dir = self.rng.chance(30);
                let pick = self
                    .handles
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| h.dir == dir)
                    .map(|(i, _)| i)
                    .collect::<Vec<_>>();
                let (n, fh) = if !pick.is_empty() && self.rng.chance(90) {
                    let h = self.handles.swap_remove(*self.rng.pick(&pick));
                    (h.nodeid, h.fh)
                } else {
                    let n = self.node();
                    (n, self.rng.next())
                };
                let b = ReleaseIn {
                    fh,
                    flags: 0,
                    release_flags: if self.rng.chance(30) { 2 } else { 0 },
                    lock_owner: self.owner(),
                };
                self.send(
                    if dir { 29 } else { 18 },
                    n,
                    b.as_bytes(),
                    true,
                    format!("fh={fh}"),
                );
            }
            54 => {
                let dir = self.rng.chance(30);
                let (n, fh) = self.opened(dir);
                let b = FsyncIn {
                    fh,
                    fsync_flags: self.rng.below(2) as u32,
                    padding: 0,
                };
                self.send(
                    if dir { 30 } else { 20 },
                    n,
                    b.as_bytes(),
                    true,
                    format!("fh={fh}"),
                );
            }
            55..=57 => {
                let n = self.node();
                let mut name = self
                    .rng
                    .pick(&["user.", "trusted.", "security.", "system.", "other."])
                    .as_bytes()
                    .to_vec();
                name.extend(self.name());
                name.push(0);
                let len = self.rng.size(70_000) as usize;
                let value = vec![self.rng.next() as u8; len];
                let flags = *self.rng.pick(&[0u32, 1, 2, 3]);
                let head = SetxattrIn {
                    size: len as u32,
                    flags,
                    setxattr_flags: 0,
                    padding: 0,
                };
                let head = if self.setxattr_ext {
                    head.as_bytes()
                } else {
                    &head.as_bytes()[..8]
                };
                let body = [head, &name, &value].concat();
                self.send(21, n, &body, true, format!("SETXATTR {} len={len}", show(&name)));
            }
            58..=59 => {
                let n = self.node();
                let mut name = self
                    .rng
                    .pick(&["user.", "trusted.", "security.", "bogus"])
                    .as_bytes()
                    .to_vec();
                name.extend(self.name());
                name.push(0);
                let size = self.rng.size(70_000) as u32;
                match self.rng.below(3) {
                    0 => {
                        let body = [GetxattrIn { size, padding: 0 }.as_bytes(), &name].concat();
                        self.send(
                            22,
                            n,
                            &body,
                            true,
                            format!("GETXATTR {} size={size}", show(&name)),
                        );
                    }
                    1 => {
                        self.send(
                            23,
                            n,
                            GetxattrIn { size, padding: 0 }.as_bytes(),
                            true,
                            format!("size={size}"),
                        );
                    }
                    _ => {
                        self.send(24, n, &name, true, show(&name));
                    }
                }
            }
            60 => {
                let (n, fh) = self.opened(false);
                let b = FlushIn {
                    fh,
                    unused: 0,
                    padding: 0,
                    lock_owner: self.owner(),
                };
                self.send(25, n, b.as_bytes(), true, format!("fh={fh}"));
            }
            61..=62 => {
                let n = self.dir();
                let b = OpenIn {
                    flags: libc::O_RDONLY as u32,
                    open_flags: 0,
                };
                self.send(27, n, b.as_bytes(), true, String::new());
            }
            63..=66 => {
                let (n, fh) = self.opened(true);
                let off = if self.rng.chance(70) {
                    self.rng.below(12)
                } else {
                    self.rng.offset()
                };
                let b = ReadIn {
                    fh,
                    offset: off,
                    size: self.rng.size(16384) as u32,
                    ..ReadIn::default()
                };
                let op = if self.rng.chance(50) { 28 } else { 44 };
                self.send(
                    op,
                    n,
                    b.as_bytes(),
                    true,
                    format!("fh={fh} off={off} size={}", b.size),
                );
            }
            67..=69 => {
                let (n, fh) = self.opened(false);
                let typ = *self.rng.pick(&[libc::F_RDLCK, libc::F_WRLCK, libc::F_UNLCK]) as u32;
                let start = self.rng.below(200);
                let b = LkIn {
                    fh,
                    owner: self.owner(),
                    lk: FileLock {
                        start,
                        end: if self.rng.chance(30) {
                            u64::MAX >> 1
                        } else {
                            start + self.rng.below(100)
                        },
                        r#type: typ,
                        pid: 4242,
                    },
                    lk_flags: if self.rng.chance(30) { 1 } else { 0 },
                    padding: 0,
                };
                let op = *self.rng.pick(&[31u32, 32, 33]);
                self.send(
                    op,
                    n,
                    b.as_bytes(),
                    true,
                    format!("fh={fh} owner={} type={typ} flock={}", b.owner, b.lk_flags),
                );
            }
            70 => {
                let n = self.node();
                let b = AccessIn {
                    mask: self.rng.below(8) as u32,
                    padding: 0,
                };
                self.send(34, n, b.as_bytes(), true, format!("mask={}", b.mask));
            }
            71..=75 => {
                let (p, n) = (self.dir(), self.cname());
                let flags = *self.rng.pick(&[
                    libc::O_CREAT | libc::O_RDWR,
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                    libc::O_CREAT | libc::O_TRUNC | libc::O_RDWR,
                ]) as u32;
                let b = CreateIn {
                    flags,
                    mode: libc::S_IFREG | self.mode(),
                    umask: 0o022,
                    open_flags: 0,
                };
                let body = [b.as_bytes(), &n].concat();
                self.send(
                    35,
                    p,
                    &body,
                    true,
                    format!("CREATE {} flags={flags:#o}", show(&n)),
                );
            }
            76 => {
                let p = self.dir();
                let b = CreateIn {
                    flags: libc::O_RDWR as u32,
                    mode: libc::S_IFREG | 0o600,
                    umask: 0,
                    open_flags: 0,
                };
                let body = [b.as_bytes(), b"\0"].concat();
                self.send(51, p, &body, true, String::new());
            }
            77 => {
                let n = self.node();
                let b = BmapIn {
                    block: self.rng.offset(),
                    blocksize: 4096,
                    padding: 0,
                };
                self.send(37, n, b.as_bytes(), true, String::new());
            }
            78 => {
                let (n, fh) = self.opened(false);
                // Harmless commands only: no FS_IOC_SETFLAGS on real files.
                let cmd = *self.rng.pick(&[0x541bu32, 0x8008_6601, 0x5401, 0x1234]);
                let in_size = self.rng.below(16) as u32;
                let b = IoctlIn {
                    fh,
                    flags: 0,
                    cmd,
                    arg: 0,
                    in_size,
                    out_size: self.rng.below(64) as u32,
                };
                let body = [b.as_bytes(), &vec![0u8; in_size as usize]].concat();
                self.send(39, n, &body, true, format!("cmd={cmd:#x}"));
            }
            79 => {
                let (n, fh) = self.opened(false);
                let b = PollIn {
                    fh,
                    kh: self.rng.next(),
                    flags: 0,
                    events: 1,
                };
                self.send(40, n, b.as_bytes(), true, String::new());
            }
            80..=82 => {
                let (n, fh) = self.opened(false);
                let mode = *self.rng.pick(&[0u32, 1, 3, 8, 16, 0x7f]);
                let b = FallocateIn {
                    fh,
                    offset: self.rng.offset(),
                    length: self.rng.size(1 << 20),
                    mode,
                    padding: 0,
                };
                self.send(
                    43,
                    n,
                    b.as_bytes(),
                    true,
                    format!("off={} len={} mode={mode}", b.offset, b.length),
                );
            }
            83 => {
                let (n, fh) = self.opened(false);
                let b = LseekIn {
                    fh,
                    offset: self.rng.offset(),
                    whence: self.rng.below(6) as u32,
                    padding: 0,
                };
                self.send(
                    46,
                    n,
                    b.as_bytes(),
                    true,
                    format!("off={} whence={}", b.offset, b.whence),
                );
            }
            84..=85 => {
                let (n, fh) = self.opened(false);
                let (out, fh_out) = self.opened(false);
                let b = CopyFileRangeIn {
                    fh_in: fh,
                    off_in: self.rng.offset(),
                    nodeid_out: out,
                    fh_out,
                    off_out: self.rng.offset(),
                    len: self.rng.size(1 << 20),
                    flags: if self.rng.chance(5) { 1 } else { 0 },
                };
                // COPY_FILE_RANGE or its 64-bit twin (same body).
                let op = if self.rng.chance(30) { 53 } else { 47 };
                self.send(op, n, b.as_bytes(), true, format!("-> {out} len={}", b.len));
            }
            86 => {
                let n = self.node();
                self.send(50, n, SyncfsIn::default().as_bytes(), true, String::new());
            }
            87 => {
                let (n, fh) = self.opened(false);
                let b = StatxIn {
                    getattr_flags: self.rng.below(2) as u32,
                    reserved: 0,
                    fh,
                    sx_flags: 0,
                    sx_mask: self.rng.next() as u32,
                };
                self.send(52, n, b.as_bytes(), true, String::new());
            }
            88 => {
                // Opcodes nobody serves here, and a second INIT.
                match self.rng.below(5) {
                    0 => {
                        self.send(OP_INIT, 0, &init_body(7, 45, 131072, 0), true, String::new());
                    }
                    1 => {
                        self.send(
                            48,
                            ROOT,
                            SetupmappingIn::default().as_bytes(),
                            true,
                            String::new(),
                        );
                    }
                    2 => {
                        let body = [
                            RemovemappingIn { count: 1 }.as_bytes(),
                            RemovemappingOne::default().as_bytes(),
                        ]
                        .concat();
                        self.send(49, ROOT, &body, true, String::new());
                    }
                    3 => {
                        self.send(4096, ROOT, CuseInitIn::default().as_bytes(), true, String::new());
                    }
                    _ => {
                        let op = *self.rng.pick(&[7u32, 19, 54, 999, 4097]);
                        self.send(op, ROOT, &[0u8; 16], true, String::new());
                    }
                }
            }
            89 => {
                // A NOTIFY_REPLY nobody asked for: no reply.
                let b = NotifyRetrieveIn {
                    size: 8,
                    ..NotifyRetrieveIn::default()
                };
                let body = [b.as_bytes(), &[0u8; 8][..]].concat();
                self.send(41, ROOT, &body, false, String::new());
            }
            90..=94 => self.forget_some(),
            _ => {
                // INTERRUPT of a pending request, an old one or nonsense.
                let target = match self.rng.below(3) {
                    0 if !self.pending.is_empty() => *self.pending.keys().next().unwrap_or(&0),
                    1 => self.unique.saturating_sub(self.rng.below(5)),
                    _ => self.rng.next(),
                };
                self.send(
                    36,
                    0,
                    InterruptIn { unique: target }.as_bytes(),
                    false,
                    format!("of #{target}"),
                );
            }
        }
    }

    /// FORGET or BATCH_FORGET part of what the kernel holds (never more).
    /// Nodes used by requests still pending keep at least one lookup.
    fn forget_some(&mut self) {
        let busy: Vec<u64> = self.pending.values().map(|p| p.nodeid).collect();
        let mut held: Vec<(u64, u64)> = self
            .lookups
            .iter()
            .filter(|(_, c)| **c > 0)
            .map(|(n, c)| (*n, *c))
            .collect();
        held.sort_unstable();
        if held.is_empty() {
            return;
        }
        let k = 1 + self.rng.below(4) as usize;
        let mut list = Vec::new();
        for _ in 0..k {
            let (n, c) = *self.rng.pick(&held);
            if list.iter().any(|(m, _)| *m == n) {
                continue;
            }
            let keep = if busy.contains(&n) || self.handles.iter().any(|h| h.nodeid == n) {
                1
            } else {
                0
            };
            if c <= keep {
                continue;
            }
            let drop = 1 + self.rng.below(c - keep);
            list.push((n, drop));
        }
        self.send_forgets(&list);
    }

    fn send_forgets(&mut self, list: &[(u64, u64)]) {
        if list.is_empty() {
            return;
        }
        for (n, d) in list {
            let c = self.lookups.entry(*n).or_default();
            *c -= d;
            if *c == 0 {
                self.forgotten.push(*n);
            }
        }
        if list.len() == 1 && self.rng.chance(50) {
            let (n, d) = list[0];
            self.send(
                2,
                n,
                ForgetIn { nlookup: d }.as_bytes(),
                false,
                format!("nlookup={d}"),
            );
        } else {
            let mut body = BatchForgetIn {
                count: list.len() as u32,
                dummy: 0,
            }
            .as_bytes()
            .to_vec();
            for (n, d) in list {
                body.extend_from_slice(
                    ForgetOne {
                        nodeid: *n,
                        nlookup: *d,
                    }
                    .as_bytes(),
                );
            }
            self.send(42, 0, &body, false, format!("{list:?}"));
        }
    }

    /// Fails the run if anything panicked since it started.
    fn check_panics(&self) {
        if PANIC_COUNT.load(Ordering::SeqCst) > 0 {
            let what = PANICS.lock().map(|p| p.join("\n")).unwrap_or_default();
            self.fail(&format!("a handler panicked:\n{what}"));
        }
    }

    /// Reads replies until nothing is pending; interrupts what waits long.
    fn drain(&mut self) {
        let start = Instant::now();
        let mut nudged = false;
        while !self.pending.is_empty() {
            match self.fake.kernel.recv(NUDGE) {
                Some(w) => self.check_reply(&w.bytes),
                None => {
                    if start.elapsed() > HANG {
                        let waiting: Vec<String> = self
                            .pending
                            .iter()
                            .map(|(u, p)| format!("#{u} {} node={} {}", op_name(p.op), p.nodeid, p.desc))
                            .collect();
                        self.fail(&format!("no reply within {HANG:?} to: {}", waiting.join("; ")));
                    }
                    if !nudged || start.elapsed() > HANG / 2 {
                        // Lock waits end when interrupted (EINTR).
                        let waiting: Vec<u64> = self.pending.keys().copied().collect();
                        for u in waiting {
                            self.send(
                                36,
                                0,
                                InterruptIn { unique: u }.as_bytes(),
                                false,
                                format!("of #{u} (waiting)"),
                            );
                        }
                        nudged = true;
                    }
                }
            }
        }
    }

    fn check_reply(&mut self, bytes: &[u8]) {
        let Ok((h, body)) = OutHeader::read_from_prefix(bytes) else {
            self.fail(&format!("a message shorter than a header: {bytes:?}"));
        };
        if h.len as usize != bytes.len() {
            self.fail(&format!(
                "reply #{} says {} bytes but has {}",
                h.unique,
                h.len,
                bytes.len()
            ));
        }
        if h.unique == 0 {
            return; // a notification
        }
        if self.interrupts.remove(&h.unique) {
            if h.error != -libc::EAGAIN || !body.is_empty() {
                self.fail(&format!(
                    "INTERRUPT #{} answered {} (only EAGAIN may answer one)",
                    h.unique, h.error
                ));
            }
            *self.report.errors.entry(libc::EAGAIN).or_default() += 1;
            return;
        }
        let Some(p) = self.pending.remove(&h.unique) else {
            self.fail(&format!(
                "reply to #{} which is not pending (a second reply, or never sent)",
                h.unique
            ));
        };
        if h.error > 0 || h.error < -4095 {
            self.fail(&format!("reply #{} has error {}", h.unique, h.error));
        }
        if h.error != 0 {
            if !body.is_empty() {
                self.fail(&format!(
                    "error reply #{} has a body of {} bytes",
                    h.unique,
                    body.len()
                ));
            }
            *self.report.errors.entry(-h.error).or_default() += 1;
            return;
        }
        self.account(&p, body);
    }

    /// What the kernel would count and keep from a successful reply.
    fn account(&mut self, p: &Pending, body: &[u8]) {
        match p.op {
            // LOOKUP, SYMLINK, MKNOD, MKDIR, LINK
            1 | 6 | 8 | 9 | 13 => {
                let Ok((e, _)) = EntryOut::read_from_prefix(body) else {
                    self.fail(&format!(
                        "entry reply to {} too short ({} bytes)",
                        op_name(p.op),
                        body.len()
                    ));
                };
                self.entry(&e, p);
            }
            // CREATE, TMPFILE
            35 | 51 => {
                let Ok((e, rest)) = EntryOut::read_from_prefix(body) else {
                    self.fail("create reply too short");
                };
                let Ok((o, _)) = OpenOut::read_from_prefix(rest) else {
                    self.fail("create reply without fuse_open_out");
                };
                if e.nodeid == 0 {
                    self.fail("CREATE answered with node id 0");
                }
                self.entry(&e, p);
                self.handles.push(Handle {
                    nodeid: e.nodeid,
                    fh: o.fh,
                    dir: false,
                });
            }
            14 | 27 => {
                let Ok((o, _)) = OpenOut::read_from_prefix(body) else {
                    self.fail("open reply too short");
                };
                self.handles.push(Handle {
                    nodeid: p.nodeid,
                    fh: o.fh,
                    dir: p.op == 27,
                });
            }
            28 => {
                let records = decode_dir(body).unwrap_or_else(|e| self.fail(&format!("READDIR reply: {e}")));
                for d in records {
                    self.learn_name(&d.name);
                }
            }
            44 => {
                let records =
                    decode_dir_plus(body).unwrap_or_else(|e| self.fail(&format!("READDIRPLUS reply: {e}")));
                for d in records {
                    self.learn_name(&d.dirent.name);
                    if d.counts_lookup() {
                        self.entry(&d.entry, p);
                    }
                }
            }
            _ => {}
        }
    }

    fn learn_name(&mut self, name: &[u8]) {
        if name != b"." && name != b".." && self.names.len() < 200 && !self.names.iter().any(|n| n == name) {
            self.names.push(name.to_vec());
        }
    }

    fn entry(&mut self, e: &EntryOut, p: &Pending) {
        if e.nodeid == 0 {
            if p.op != 1 {
                self.fail(&format!("{} answered with node id 0", op_name(p.op)));
            }
            return; // a negative entry: no lookup
        }
        if e.nodeid == ROOT {
            // "." of the root, or ".." of the root or of a child of it: the
            // kernel takes the root, which it never forgets.
            return;
        }
        *self.lookups.entry(e.nodeid).or_default() += 1;
        self.kinds.insert(e.nodeid, e.attr.mode & libc::S_IFMT);
        self.forgotten.retain(|n| *n != e.nodeid);
    }

    /// Sends a request as this process (see `me`) and returns its reply (error, body).
    fn call(&mut self, op: u32, nodeid: u64, body: &[u8], desc: String) -> (i32, Vec<u8>) {
        self.unique += 1;
        let unique = self.unique;
        let len = 40 + body.len();
        let h = InHeader {
            len: len as u32,
            opcode: op,
            unique,
            nodeid,
            uid: me().0,
            gid: me().1,
            pid: me().2,
            total_extlen: 0,
            padding: 0,
        };
        self.remember(format!(
            "#{unique} {} node={nodeid} {desc} (cleanup)",
            op_name(op)
        ));
        let p = Pending { op, nodeid, desc };
        self.pending.insert(unique, p.clone());
        self.fake.send([h.as_bytes(), body].concat());
        let deadline = Instant::now() + HANG;
        loop {
            let Some(w) = self
                .fake
                .kernel
                .recv(deadline.saturating_duration_since(Instant::now()))
            else {
                self.fail(&format!("no reply to cleanup request #{unique}"));
            };
            let Ok((oh, b)) = OutHeader::read_from_prefix(&w.bytes) else {
                self.fail("short reply");
            };
            if oh.unique != unique {
                self.check_reply(&w.bytes);
                continue;
            }
            self.pending.remove(&unique);
            if oh.error == 0 {
                self.account(&p, b);
            }
            return (oh.error, b.to_vec());
        }
    }

    /// Removes the extended attributes of `node` (the root keeps its own
    /// otherwise, and memfs counts their bytes).
    fn remove_xattrs(&mut self, node: u64) {
        let (e, list) = self.call(
            23,
            node,
            GetxattrIn {
                size: 1 << 16,
                padding: 0,
            }
            .as_bytes(),
            "cleanup".into(),
        );
        if e != 0 {
            return;
        }
        for name in list.split(|b| *b == 0).filter(|n| !n.is_empty()) {
            let cname = [name, b"\0"].concat();
            let (e, _) = self.call(24, node, &cname, show(&cname));
            if e != 0 {
                self.fail(&format!("cleanup: REMOVEXATTR {} failed with {e}", show(&cname)));
            }
        }
    }

    /// Removes everything under `dir` (a node the kernel holds, or the root).
    fn remove_tree(&mut self, dir: u64, depth: usize) {
        if depth > 64 {
            self.fail("directory tree deeper than 64 during cleanup");
        }
        // Make sure we may enter and change it.
        let sa = SetattrIn {
            valid: 1,
            mode: 0o777,
            ..SetattrIn::default()
        };
        if dir != ROOT {
            self.call(4, dir, sa.as_bytes(), "chmod 777".into());
        }
        let (e, b) = self.call(27, dir, OpenIn::default().as_bytes(), "cleanup".into());
        if e != 0 {
            self.fail(&format!("cleanup: OPENDIR {dir} failed with {e}"));
        }
        let fh = OpenOut::read_from_prefix(&b).map(|(o, _)| o.fh).unwrap_or(0);
        // The handle was recorded by `account`; drop that record.
        self.handles.retain(|h| !(h.dir && h.nodeid == dir && h.fh == fh));
        let mut names = Vec::new();
        let mut off = 0u64;
        for _ in 0..100_000 {
            let rd = ReadIn {
                fh,
                offset: off,
                size: 65536,
                ..ReadIn::default()
            };
            let (e, b) = self.call(28, dir, rd.as_bytes(), format!("off={off}"));
            if e != 0 {
                self.fail(&format!("cleanup: READDIR {dir} failed with {e}"));
            }
            if b.is_empty() {
                break;
            }
            let records =
                decode_dir(&b).unwrap_or_else(|e| self.fail(&format!("cleanup: READDIR reply: {e}")));
            for d in records {
                if d.name != b"." && d.name != b".." {
                    names.push(d.name);
                }
                off = d.offset;
            }
        }
        let rel = ReleaseIn {
            fh,
            ..ReleaseIn::default()
        };
        self.call(29, dir, rel.as_bytes(), "cleanup".into());
        for name in names {
            let cname = [&name[..], b"\0"].concat();
            let (e, b) = self.call(1, dir, &cname, show(&cname));
            if e != 0 {
                self.fail(&format!(
                    "cleanup: LOOKUP {} in {dir} failed with {e}",
                    show(&cname)
                ));
            }
            let Ok((ent, _)) = EntryOut::read_from_prefix(&b) else {
                self.fail("cleanup lookup")
            };
            let is_dir = ent.attr.mode & libc::S_IFMT == libc::S_IFDIR;
            if is_dir {
                self.remove_tree(ent.nodeid, depth + 1);
            }
            let (e, _) = self.call(if is_dir { 11 } else { 10 }, dir, &cname, show(&cname));
            if e != 0 {
                self.fail(&format!(
                    "cleanup: removing {} in {dir} failed with {e}",
                    show(&cname)
                ));
            }
            // The kernel evicts an unlinked inode at once (unless open):
            // forget it now, which keeps what the cleanup holds small.
            let held = self.lookups.get(&ent.nodeid).copied().unwrap_or(0);
            if held > 0 && !self.handles.iter().any(|h| h.nodeid == ent.nodeid) {
                self.send_forgets(&[(ent.nodeid, held)]);
            }
        }
    }

    /// Ends the run: releases, removes, forgets, and checks what is left.
    fn finish(&mut self, subject: &Subject<F>) {
        self.drain();
        for h in std::mem::take(&mut self.handles) {
            let rel = ReleaseIn {
                fh: h.fh,
                release_flags: 2,
                lock_owner: 1,
                ..ReleaseIn::default()
            };
            self.call(
                if h.dir { 29 } else { 18 },
                h.nodeid,
                rel.as_bytes(),
                format!("fh={}", h.fh),
            );
        }
        self.remove_tree(ROOT, 0);
        self.remove_xattrs(ROOT);
        let mut all: Vec<(u64, u64)> = self
            .lookups
            .iter()
            .filter(|(_, c)| **c > 0)
            .map(|(n, c)| (*n, *c))
            .collect();
        all.sort_unstable();
        for chunk in all.chunks(1 + self.rng.below(20) as usize) {
            self.send_forgets(chunk);
        }
        self.drain();
        // FORGETs have no reply; a STATFS behind them shows they were read,
        // then the workers finish them (bounded wait).
        self.call(17, ROOT, &[], "after the forgets".into());
        let deadline = Instant::now() + HANG;
        loop {
            let live = (subject.live)(&subject.fs);
            let settled = (subject.settled)(&subject.fs);
            if live == subject.baseline && settled.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                self.fail(&format!(
                    "after every FORGET the filesystem still holds {live} inodes (want {}); {}",
                    subject.baseline,
                    settled.err().unwrap_or_default()
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.check_panics();
        // DESTROY last: one reply, and the session ends.
        let (e, _) = self.call(38, 0, &[], String::new());
        if e != 0 {
            self.fail(&format!("DESTROY answered {e}"));
        }
    }
}

/// Raises the soft limit of open files to the hard one, as passthrough_ll's
/// `main` does (it keeps a descriptor per inode the kernel holds).
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// This process's ids: requests "from root" come from the test itself (root
/// on CI; unprivileged, passthrough_ll acts as this user).
fn me() -> (u32, u32, u32) {
    // SAFETY: geteuid and getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    (uid, gid, std::process::id())
}

fn show(b: &[u8]) -> String {
    let b = b.strip_suffix(b"\0").unwrap_or(b);
    if b.len() > 24 {
        format!("{:?}...({} bytes)", String::from_utf8_lossy(&b[..24]), b.len())
    } else {
        format!("{:?}", String::from_utf8_lossy(b))
    }
}

/// Offered at INIT: everything a filesystem may want, without what needs a
/// real kernel (io_uring, passthrough, DAX, idmap) or adds request
/// extensions the fuzzer does not write (security contexts, groups).
fn offered_flags() -> u64 {
    let low = 0x7fff_ffffu64;
    let high = (1u64 << 35) | (1 << 36) | (1 << 38) | (1 << 39) | (1 << 42);
    low | high
}

/// One run: `requests` random requests into `subject`, then the checks.
fn run<F: Filesystem>(subject: Subject<F>, seed: u64, requests: u64, progress: bool) -> Report {
    watch_panics();
    raise_fd_limit();
    let config = SessionConfig {
        workers: 4,
        ..SessionConfig::default()
    };
    let fake = Fake::start(subject.fs.clone(), config);
    let init = fake.init_ready(45, offered_flags());
    let mut fz = Fuzzer::new(&fake, seed, subject.target);
    if let Ok((h, body)) = OutHeader::read_from_prefix(&init[..])
        && h.error == 0
        && let Ok((out, _)) = InitOut::read_from_prefix(body)
    {
        fz.setxattr_ext = out.flags & (1 << 29) != 0;
    } else {
        fz.fail("INIT failed");
    }
    let start = Instant::now();
    let mut next_progress = 100_000;
    while fz.report.total < requests {
        let batch = 1 + fz.rng.below(8);
        for _ in 0..batch {
            fz.random_request();
        }
        fz.drain();
        fz.check_panics();
        if progress && fz.report.total >= next_progress {
            eprintln!(
                "  {:?}: {} requests, {:.0}/s",
                subject.target,
                fz.report.total,
                fz.report.total as f64 / start.elapsed().as_secs_f64()
            );
            next_progress += 100_000;
        }
    }
    fz.finish(&subject);
    std::mem::take(&mut fz.report)
}

fn print_report(target: Target, seed: u64, r: &Report, took: Duration) {
    eprintln!("{target:?} seed {seed:#x}: {} requests in {took:.2?}", r.total);
    eprintln!("  requests per opcode:");
    for (op, n) in &r.requests {
        eprintln!("    {op:<16} {n}");
    }
    eprintln!("  errors per errno:");
    for (e, n) in &r.errors {
        eprintln!("    {:<16} {n}", errno_name(*e));
    }
}

fn errno_name(e: i32) -> String {
    let s = std::io::Error::from_raw_os_error(e).to_string();
    format!("{e} ({})", s.split(" (os error").next().unwrap_or(&s))
}

fn fuzz(target: Target, seed: u64, requests: u64, progress: bool) -> Report {
    let start = Instant::now();
    let report = match target {
        Target::Memfs => run(memfs_subject(), seed, requests, progress),
        Target::Passthrough => {
            let scratch = Scratch::new(seed);
            run(passthrough_subject(&scratch.0, seed), seed, requests, progress)
        }
        Target::Nodefs => run(nodefs_subject(), seed, requests, progress),
        Target::Pathfs => {
            let scratch = Scratch::new(seed);
            run(pathfs_subject(&scratch.0), seed, requests, progress)
        }
    };
    if progress {
        print_report(target, seed, &report, start.elapsed());
    }
    report
}

/// Fixed seeds for CI (small budgets; every run ends with the full checks).
const SEEDS: &[u64] = &[1, 2, 3, 0x5eed, 0xdead_beef];
const CI_REQUESTS: u64 = 3_000;

/// Both targets in one test: the panic hook is process-wide, so a panic is
/// blamed on the run that was going when it happened.
#[test]
fn fuzz_fixed_seeds() {
    for &seed in SEEDS {
        fuzz(Target::Memfs, seed, CI_REQUESTS, false);
        fuzz(Target::Passthrough, seed, CI_REQUESTS, false);
    }
}

/// The layers' examples, on the same seeds.
#[test]
fn fuzz_fixed_seeds_layers() {
    for &seed in SEEDS {
        fuzz(Target::Nodefs, seed, CI_REQUESTS, false);
        fuzz(Target::Pathfs, seed, CI_REQUESTS, false);
    }
}

/// Seeds from the environment: `FUZZ_SEEDS=1,2,3` (for loops in scripts).
#[test]
fn fuzz_env_seeds() {
    let Ok(seeds) = std::env::var("FUZZ_SEEDS") else {
        return;
    };
    let requests = env_u64("FUZZ_REQUESTS").unwrap_or(CI_REQUESTS);
    for s in seeds.split(',').filter(|s| !s.is_empty()) {
        let seed = parse_u64(s).expect("FUZZ_SEEDS: numbers");
        for t in targets() {
            fuzz(t, seed, requests, false);
        }
    }
}

/// The long run of `scripts/fuzz-session`.
#[test]
#[ignore = "long; run by scripts/fuzz-session"]
fn fuzz_long() {
    let seed = env_u64("FUZZ_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        t ^ (std::process::id() as u64) << 32
    });
    let requests = env_u64("FUZZ_REQUESTS").unwrap_or(1_000_000);
    eprintln!("session fuzz: seed {seed:#x} (reproduce with SEED={seed:#x}), {requests} requests per target");
    for t in targets() {
        fuzz(t, seed, requests, true);
    }
}

fn targets() -> Vec<Target> {
    match std::env::var("FUZZ_TARGET").as_deref() {
        Ok("memfs") => vec![Target::Memfs],
        Ok("passthrough") => vec![Target::Passthrough],
        Ok("nodefs") => vec![Target::Nodefs],
        Ok("pathfs") => vec![Target::Pathfs],
        _ => vec![Target::Memfs, Target::Passthrough, Target::Nodefs, Target::Pathfs],
    }
}

fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn env_u64(k: &str) -> Option<u64> {
    std::env::var(k).ok().and_then(|v| parse_u64(&v))
}
