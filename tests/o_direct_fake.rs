//! Fake-kernel tests of the session's `O_DIRECT` default
//! (`SessionConfig::o_direct_parallel_writes`): an OPEN, CREATE or TMPFILE
//! whose flags carry `O_DIRECT` is answered with `DIRECT_IO |
//! PARALLEL_DIRECT_WRITES` added to what the filesystem chose, a buffered
//! one with the filesystem's flags alone, byte for byte, for
//! passthrough_ll (the raw trait) over a scratch directory. Not before
//! 7.38, where the flag means nothing, nor without `DIRECT_IO_ALLOW_MMAP`
//! (a shared mapping of the descriptor would fail), nor without
//! `HANDLE_KILLPRIV_V2` (nobody would clear set-ID bits on a `DIRECT_IO`
//! write; the path layer asks for it and clears the bits itself, so
//! pathfs gets the default, and a flagged WRITE or truncate through it
//! clears them); nor when the session turned the default off; passthrough_ll's
//! `parallel_direct_writes` still sets both on every open.

mod common_fake;

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
#[path = "../examples/passthrough_ll/openfds.rs"]
mod openfds;
#[allow(dead_code)]
#[path = "../examples/passthrough_ll/passthrough.rs"]
mod passthrough;
#[allow(dead_code)]
#[path = "../examples/passthrough_ll/fs.rs"]
mod passthrough_fs;
#[allow(dead_code)]
#[path = "../examples/pathfs.rs"]
mod pathfs;
#[allow(dead_code)]
#[path = "../examples/passthrough_ll/sys.rs"]
mod sys;

use common_fake::*;
use fuse_wire::path::PathFs;
use fuse_wire::proto::flags::{FopenFlags, InitFlags};
use fuse_wire::session::{Filesystem, SessionConfig};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

const LOOKUP: u32 = 1;
const OPEN: u32 = 14;
const RELEASE: u32 = 18;
const CREATE: u32 = 35;
const TMPFILE: u32 = 51;

/// What an `O_DIRECT` open gets added by default.
const PARALLEL: u32 = FopenFlags::DIRECT_IO.bits() | FopenFlags::PARALLEL_DIRECT_WRITES.bits();
/// What the path layer answers a buffered open of pathfs with (`PathOpened::file`).
const NOFLUSH: u32 = FopenFlags::NOFLUSH.bits();

/// What the kernel offers in INIT: `DIRECT_IO_ALLOW_MMAP` (and `INIT_EXT`,
/// which carries it) and `HANDLE_KILLPRIV_V2` (which passthrough_ll wants as
/// root), or less.
const MMAP: u64 = InitFlags::INIT_EXT.bits()
    | InitFlags::DIRECT_IO_ALLOW_MMAP.bits()
    | InitFlags::HANDLE_KILLPRIV_V2.bits();

/// A session on the fake kernel after INIT at `7.minor` offering `offer`,
/// and the next unique.
struct Kernel<F: Filesystem> {
    fake: Fake<F>,
    unique: std::cell::Cell<u64>,
}

impl<F: Filesystem> Kernel<F> {
    fn start(fs: F, minor: u32, offer: u64, config: SessionConfig) -> Self {
        let fake = Fake::start(Arc::new(fs), config);
        fake.init_ready(minor, offer);
        Kernel {
            fake,
            unique: std::cell::Cell::new(10),
        }
    }

    fn call(&self, opcode: u32, nodeid: u64, body: &[u8]) -> (u64, Vec<u8>) {
        self.unique.set(self.unique.get() + 2);
        let u = self.unique.get();
        (u, self.fake.roundtrip(request(opcode, u, nodeid, body)))
    }

    /// LOOKUP of `name` in the root: its node id.
    fn lookup(&self, name: &str) -> u64 {
        let (_, r) = self.call(LOOKUP, 1, &B::new().name(name).done());
        assert_eq!(i32_at(&r, 4), 0, "LOOKUP {name} failed");
        u64_at(&r, 16)
    }

    /// OPEN of `nodeid` with `flags`: checks the whole answer against
    /// `open_flags` (the handle is the filesystem's) and releases it.
    fn open(&self, nodeid: u64, flags: i32, open_flags: u32, what: &str) {
        let (u, r) = self.call(OPEN, nodeid, &B::new().u32(flags as u32).u32(0).done());
        assert_eq!(r.len(), 32, "{what}: not an open answer: {}", hex(&r));
        let fh = u64_at(&r, 16);
        assert_bytes(what, &r, &ok_reply(u, &open_out_bytes(fh, open_flags)));
        self.release(nodeid, fh, flags);
    }

    /// CREATE (or TMPFILE) in the root with `flags`: checks the
    /// `fuse_open_out` after the entry against `open_flags` and releases
    /// the file.
    fn create(&self, opcode: u32, name: &str, flags: i32, open_flags: u32, what: &str) {
        let body = B::new()
            .u32(flags as u32)
            .u32(libc::S_IFREG | 0o644)
            .u32(0o022)
            .u32(0)
            .name(name)
            .done();
        let (u, r) = self.call(opcode, 1, &body);
        assert_eq!(r.len(), 16 + 128 + 16, "{what}: not a create answer: {}", hex(&r));
        let (nodeid, fh) = (u64_at(&r, 16), u64_at(&r, 16 + 128));
        // The entry as answered (its checks are elsewhere), then the open.
        let body = [&r[16..16 + 128], &open_out_bytes(fh, open_flags)[..]].concat();
        assert_bytes(what, &r, &ok_reply(u, &body));
        self.release(nodeid, fh, flags);
    }

    fn release(&self, nodeid: u64, fh: u64, flags: i32) {
        let body = B::new().u64(fh).u32(flags as u32).u32(0).u64(0).done();
        let (_, r) = self.call(RELEASE, nodeid, &body);
        assert_eq!(i32_at(&r, 4), 0, "RELEASE failed");
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

/// A scratch directory with one file, `f`, removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch() -> Scratch {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("fuse-wire-o-direct-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    std::fs::write(dir.join("f"), b"content").expect("scratch file");
    // The fake kernel's caller is not the owner: let it open and create.
    use std::os::unix::fs::PermissionsExt;
    for (p, mode) in [(dir.join("f"), 0o666), (dir.clone(), 0o777)] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod scratch");
    }
    Scratch(dir)
}

/// passthrough_ll over `dir`. `posix_lock` keeps `NOFLUSH` out of its
/// answers, so that its buffered opens answer no flag at all.
fn passthrough(dir: &Path, parallel_direct_writes: bool) -> passthrough_fs::PassthroughFs {
    use std::os::unix::fs::OpenOptionsExt;
    let root: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(dir)
        .expect("open scratch")
        .into();
    let opts = passthrough_fs::FsOptions {
        posix_lock: true,
        parallel_direct_writes,
        ..passthrough_fs::FsOptions::default()
    };
    passthrough_fs::PassthroughFs::new(root, opts).expect("passthrough fs")
}

/// passthrough_ll over `dir` in kernel passthrough mode (its default where
/// the options allow it), otherwise as [`passthrough`].
fn passthrough_mode(dir: &Path) -> passthrough_fs::PassthroughFs {
    use std::os::unix::fs::OpenOptionsExt;
    let root: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(dir)
        .expect("open scratch")
        .into();
    let opts = passthrough_fs::FsOptions {
        posix_lock: true,
        passthrough: true,
        ..passthrough_fs::FsOptions::default()
    };
    passthrough_fs::PassthroughFs::new(root, opts).expect("passthrough fs")
}

fn pathfs(dir: &Path) -> PathFs<pathfs::Mirror> {
    PathFs::new(pathfs::Mirror::open(dir).expect("mirror"))
}

const RW: i32 = libc::O_RDWR;
const DIRECT: i32 = libc::O_RDWR | libc::O_DIRECT;

#[test]
fn passthrough_ll_o_direct_opens_write_in_parallel_buffered_ones_keep_the_cache() {
    let dir = scratch();
    let k = Kernel::start(passthrough(dir.path(), false), 45, MMAP, SessionConfig::default());
    let f = k.lookup("f");
    k.open(f, RW, 0, "buffered OPEN: the filesystem's flags alone");
    k.open(f, DIRECT, PARALLEL, "O_DIRECT OPEN");
    k.open(
        f,
        libc::O_RDONLY | libc::O_DIRECT,
        PARALLEL,
        "O_DIRECT read-only OPEN",
    );
    k.create(CREATE, "c1", RW | libc::O_CREAT, 0, "buffered CREATE");
    k.create(CREATE, "c2", DIRECT | libc::O_CREAT, PARALLEL, "O_DIRECT CREATE");
    k.create(TMPFILE, "", RW, 0, "buffered TMPFILE");
    k.create(TMPFILE, "", DIRECT, PARALLEL, "O_DIRECT TMPFILE");
    k.fake.expect_silence("nothing more");
}

/// The path layer clears set-ID bits itself (it asks for
/// `HANDLE_KILLPRIV_V2`), so pathfs gets the default as passthrough_ll
/// does: its `O_DIRECT` opens write in parallel, its buffered ones keep the
/// page cache.
#[test]
fn pathfs_o_direct_opens_write_in_parallel_buffered_ones_keep_the_cache() {
    let dir = scratch();
    let k = Kernel::start(pathfs(dir.path()), 45, MMAP, SessionConfig::default());
    let f = k.lookup("f");
    k.open(f, RW, NOFLUSH, "buffered OPEN");
    k.open(f, DIRECT, NOFLUSH | PARALLEL, "O_DIRECT OPEN");
    k.create(CREATE, "c1", RW | libc::O_CREAT, NOFLUSH, "buffered CREATE");
    k.create(
        CREATE,
        "c2",
        DIRECT | libc::O_CREAT,
        NOFLUSH | PARALLEL,
        "O_DIRECT CREATE",
    );
    k.fake.expect_silence("nothing more");
    let offer = MMAP & !InitFlags::HANDLE_KILLPRIV_V2.bits();
    let k = Kernel::start(pathfs(dir.path()), 45, offer, SessionConfig::default());
    let f = k.lookup("f");
    k.open(
        f,
        DIRECT,
        NOFLUSH,
        "O_DIRECT OPEN without HANDLE_KILLPRIV_V2, path layer",
    );
}

/// A WRITE or a truncating SETATTR that the kernel flags `KILL_SUIDGID`
/// (the caller, uid 1000 here, lacks `CAP_FSETID`; the file is root's)
/// clears the set-ID bits through the path layer, as a `DIRECT_IO` write
/// needs: S_ISUID, and S_ISGID where group execute is set. A WRITE without
/// the flag keeps them.
#[test]
fn pathfs_clears_set_id_bits_on_a_flagged_write_or_truncate() {
    use std::os::unix::fs::PermissionsExt;
    const WRITE: u32 = 16;
    const SETATTR: u32 = 4;
    let dir = scratch();
    let mode = |name: &str| {
        std::fs::metadata(dir.path().join(name))
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777
    };
    for (name, m) in [("w", 0o6777), ("t", 0o6777), ("kept", 0o6777)] {
        std::fs::write(dir.path().join(name), b"content").expect("scratch file");
        std::fs::set_permissions(dir.path().join(name), std::fs::Permissions::from_mode(m)).expect("chmod");
    }
    let k = Kernel::start(pathfs(dir.path()), 45, MMAP, SessionConfig::default());
    let write = |nodeid: u64, fh: u64, write_flags: u32| {
        let body = B::new()
            .u64(fh)
            .u64(0)
            .u32(3)
            .u32(write_flags)
            .u64(0)
            .u32(RW as u32)
            .u32(0)
            .bytes(b"xyz")
            .done();
        k.call(WRITE, nodeid, &body)
    };
    let open = |nodeid: u64| {
        // Buffered on the source (an O_DIRECT one would want aligned
        // writes); the kernel flags a DIRECT_IO write the same way.
        let (_, r) = k.call(OPEN, nodeid, &B::new().u32(RW as u32).u32(0).done());
        assert_eq!(i32_at(&r, 4), 0, "OPEN failed: {}", hex(&r));
        u64_at(&r, 16)
    };
    let written = |u: u64| ok_reply(u, &B::new().u32(3).u32(0).done());

    let kept = k.lookup("kept");
    let (u, r) = write(kept, open(kept), 0);
    assert_bytes("WRITE without the flag", &r, &written(u));
    assert_eq!(
        mode("kept"),
        0o6777,
        "a WRITE without KILL_SUIDGID keeps the bits"
    );

    let w = k.lookup("w");
    let (u, r) = write(w, open(w), 4); // FUSE_WRITE_KILL_SUIDGID
    // The session drops the kernel's cached attributes first (the answer
    // carries none), then answers.
    assert_bytes(
        "a flagged WRITE: the invalidation",
        &r,
        &notification(2, &B::new().u64(w).i64(-1).i64(0).done()),
    );
    assert_bytes("a flagged WRITE: then its answer", &k.fake.recv(), &written(u));
    assert_eq!(mode("w"), 0o777, "a flagged WRITE clears S_ISUID and S_ISGID");
    assert_eq!(std::fs::read(dir.path().join("w")).expect("read"), b"xyztent");

    let t = k.lookup("t");
    // FATTR_SIZE | FATTR_KILL_SUIDGID, size 2.
    let body = B::new()
        .u32((1 << 3) | (1 << 11))
        .u32(0)
        .u64(0)
        .u64(2)
        .bytes(&[0; 88 - 24])
        .done();
    let (_, r) = k.call(SETATTR, t, &body);
    assert_eq!(i32_at(&r, 4), 0, "SETATTR failed: {}", hex(&r));
    // fuse_attr_out: attr_valid, attr_valid_nsec, dummy, then fuse_attr
    // (mode at 60).
    let answered = u32::from_ne_bytes(r[16 + 16 + 60..16 + 16 + 64].try_into().unwrap());
    assert_eq!(
        answered,
        libc::S_IFREG | 0o777,
        "the SETATTR answers the mode after the kill"
    );
    assert_eq!(mode("t"), 0o777, "a flagged truncate clears S_ISUID and S_ISGID");
    assert_eq!(std::fs::metadata(dir.path().join("t")).expect("stat").len(), 2);
    k.fake.expect_silence("nothing more");
}

/// Without `HANDLE_KILLPRIV_V2` nobody would clear set-ID bits on a
/// `DIRECT_IO` write: no default then.
#[test]
fn no_parallel_direct_writes_without_killpriv() {
    let dir = scratch();
    let offer = MMAP & !InitFlags::HANDLE_KILLPRIV_V2.bits();
    let k = Kernel::start(
        passthrough(dir.path(), false),
        45,
        offer,
        SessionConfig::default(),
    );
    let f = k.lookup("f");
    k.open(f, DIRECT, 0, "O_DIRECT OPEN without HANDLE_KILLPRIV_V2");
}

#[test]
fn no_parallel_direct_writes_before_7_38() {
    let dir = scratch();
    let k = Kernel::start(passthrough(dir.path(), false), 37, MMAP, SessionConfig::default());
    let f = k.lookup("f");
    k.open(f, DIRECT, 0, "O_DIRECT OPEN at 7.37");
    let k = Kernel::start(pathfs(dir.path()), 37, MMAP, SessionConfig::default());
    let f = k.lookup("f");
    k.open(f, DIRECT, NOFLUSH, "O_DIRECT OPEN at 7.37, path layer");
}

/// Without `DIRECT_IO_ALLOW_MMAP` a `DIRECT_IO` descriptor could not be
/// mapped shared (ENODEV), where an `O_DIRECT` one can: no default then.
#[test]
fn no_parallel_direct_writes_without_shared_mmap_of_direct_io_files() {
    let dir = scratch();
    let offer = MMAP & !InitFlags::DIRECT_IO_ALLOW_MMAP.bits();
    let k = Kernel::start(
        passthrough(dir.path(), false),
        45,
        offer,
        SessionConfig::default(),
    );
    let f = k.lookup("f");
    k.open(f, DIRECT, 0, "O_DIRECT OPEN without DIRECT_IO_ALLOW_MMAP");
}

#[test]
fn the_default_can_be_turned_off() {
    let dir = scratch();
    let off = || SessionConfig {
        o_direct_parallel_writes: false,
        ..SessionConfig::default()
    };
    let k = Kernel::start(passthrough(dir.path(), false), 45, MMAP, off());
    let f = k.lookup("f");
    k.open(f, DIRECT, 0, "O_DIRECT OPEN, default off");
    k.create(
        CREATE,
        "c",
        DIRECT | libc::O_CREAT,
        0,
        "O_DIRECT CREATE, default off",
    );
    let k = Kernel::start(pathfs(dir.path()), 45, MMAP, off());
    let f = k.lookup("f");
    k.open(f, DIRECT, NOFLUSH, "O_DIRECT OPEN, default off, path layer");
}

#[test]
fn passthrough_ll_parallel_direct_writes_option_still_covers_every_open() {
    let dir = scratch();
    let k = Kernel::start(passthrough(dir.path(), true), 45, MMAP, SessionConfig::default());
    let f = k.lookup("f");
    k.open(f, RW, PARALLEL, "buffered OPEN with -o parallel_direct_writes");
    k.open(
        f,
        DIRECT,
        PARALLEL,
        "O_DIRECT OPEN with -o parallel_direct_writes",
    );
    k.create(
        CREATE,
        "c",
        RW | libc::O_CREAT,
        PARALLEL,
        "buffered CREATE with the option",
    );
}

/// `fuse_init_out.flags2` and `max_stack_depth` of an INIT answer.
fn passthrough_fields(init_reply: &[u8]) -> (u32, u32) {
    assert_eq!(
        init_reply.len(),
        16 + 64,
        "not a 7.45 INIT answer: {}",
        hex(init_reply)
    );
    let at = |o: usize| u32::from_ne_bytes(init_reply[16 + o..16 + o + 4].try_into().unwrap());
    (at(32), at(36))
}

/// passthrough_ll in passthrough mode asks for PASSTHROUGH with a stack
/// depth of 1 where the kernel offers it, and for neither where it does not
/// (its log says so). And an open whose backing file cannot be had (the
/// fake channel has no /dev/fuse descriptor to register one on; a real
/// kernel refuses for no CAP_SYS_ADMIN or a stacked source) is answered as
/// the daemon serves it, byte for byte, never EIO: a buffered one with no
/// flag, an `O_DIRECT` one with the session's DIRECT_IO |
/// PARALLEL_DIRECT_WRITES.
#[test]
fn passthrough_ll_asks_for_passthrough_only_where_offered_and_serves_what_it_cannot_pass() {
    let passthrough_bit = (InitFlags::PASSTHROUGH.bits() >> 32) as u32;
    let dir = scratch();
    let fake = Fake::start(Arc::new(passthrough_mode(dir.path())), SessionConfig::default());
    let r = fake.init_ready(45, MMAP);
    assert_eq!(
        passthrough_fields(&r).1,
        0,
        "max_stack_depth without PASSTHROUGH offered"
    );
    assert_eq!(
        passthrough_fields(&r).0 & passthrough_bit,
        0,
        "PASSTHROUGH not offered"
    );
    drop(fake);

    let fake = Fake::start(Arc::new(passthrough_mode(dir.path())), SessionConfig::default());
    let r = fake.init_ready(45, MMAP | InitFlags::PASSTHROUGH.bits());
    let (flags2, depth) = passthrough_fields(&r);
    assert_eq!(
        (flags2 & passthrough_bit, depth),
        (passthrough_bit, 1),
        "{}",
        hex(&r)
    );
    let k = Kernel {
        fake,
        unique: std::cell::Cell::new(10),
    };
    let f = k.lookup("f");
    k.open(f, RW, 0, "buffered OPEN without a backing file");
    k.open(f, DIRECT, PARALLEL, "O_DIRECT OPEN without a backing file");
    k.create(
        CREATE,
        "c1",
        RW | libc::O_CREAT,
        0,
        "buffered CREATE without a backing file",
    );
    k.fake.expect_silence("nothing more");
}
