//! The session on real mounts: a small filesystem serves lookups, reads and
//! writes; workers really read from their own cloned fds; unmounting while
//! idle or busy, and `stop()`, end the loop cleanly with every thread joined;
//! kernel passthrough makes reads bypass userspace.

mod common;

use common::{TempMountpoint, fuse_mounted_at, require_mount_capability, wait_unmounted};
use fuse_wire::proto::Opcode;
use fuse_wire::proto::abi::Attr;
use fuse_wire::proto::flags::{FopenFlags, InitFlags};
use fuse_wire::session::ops::*;
use fuse_wire::session::reply::*;
use fuse_wire::session::*;
use std::collections::BTreeSet;
use std::ffi::CStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::Duration;

const FILE_INO: u64 = 2;
const SLOW_INO: u64 = 3;
const TTL: Duration = Duration::from_secs(0);

/// Root with two files: `data` (readable and writable, in memory) and `slow`
/// (whose reads wait on a barrier, to hold several workers at once).
/// A handler's gate: it sends on `entered`, then waits for `release`.
struct Gate {
    entered: Mutex<mpsc::Sender<()>>,
    release: Mutex<mpsc::Receiver<()>>,
}

struct TestFs {
    data: Mutex<Vec<u8>>,
    fds_seen: Mutex<BTreeSet<i32>>,
    workers_seen: Mutex<BTreeSet<usize>>,
    slow_barrier: Barrier,
    /// For the busy-unmount test: the slow READ says it has started, then
    /// waits (bounded) until the test opens the gate.
    slow_gate: Option<Gate>,
    backing: Option<PathBuf>,
    passthrough_opens: AtomicUsize,
    /// The backing file must outlive the open: the kernel looks its id up
    /// after reading our OPEN reply.
    held_backing: Mutex<Option<BackingFile>>,
}

impl TestFs {
    fn new(slow_parties: usize) -> Self {
        Self {
            data: Mutex::new(b"hello from fuse-wire\n".to_vec()),
            fds_seen: Mutex::new(BTreeSet::new()),
            workers_seen: Mutex::new(BTreeSet::new()),
            slow_barrier: Barrier::new(slow_parties),
            slow_gate: None,
            backing: None,
            passthrough_opens: AtomicUsize::new(0),
            held_backing: Mutex::new(None),
        }
    }

    fn attr(&self, ino: u64) -> FileAttr {
        FileAttr::from_abi(&self.attr_raw(ino)).expect("a valid mode")
    }

    fn attr_raw(&self, ino: u64) -> Attr {
        let now = 1_700_000_000;
        let (mode, size, nlink) = match ino {
            1 => (libc::S_IFDIR | 0o755, 0, 2),
            FILE_INO => {
                let size = match &self.backing {
                    Some(p) => std::fs::metadata(p).map(|m| m.len()).unwrap_or(0),
                    None => self.data.lock().unwrap().len() as u64,
                };
                (libc::S_IFREG | 0o644, size, 1)
            }
            _ => (libc::S_IFREG | 0o644, 4096, 1),
        };
        Attr {
            ino,
            mode,
            size,
            nlink,
            atime: now,
            mtime: now,
            ctime: now,
            blksize: 4096,
            ..Default::default()
        }
    }
}

impl Filesystem for TestFs {
    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        if self.backing.is_some() {
            config.want(InitFlags::PASSTHROUGH);
            config.max_stack_depth = 1;
        }
        Ok(())
    }

    fn lookup(&self, _ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        let ino = match (parent, name.to_bytes()) {
            (Inode::ROOT, b"data") => FILE_INO,
            (Inode::ROOT, b"slow") => SLOW_INO,
            _ => return reply.error(Errno::ENOENT),
        };
        reply.entry(&Entry {
            ino: Inode(ino),
            attr: self.attr(ino),
            ..Default::default()
        });
    }

    fn getattr(&self, _ctx: &RequestContext<'_>, ino: Inode, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino.0 {
            1 | FILE_INO | SLOW_INO => reply.attr(TTL, &self.attr(ino.0)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(&self, _ctx: &RequestContext<'_>, ino: Inode, req: &SetattrRequest, reply: ReplyAttr) {
        let attr = req.raw();
        if ino.0 == FILE_INO && attr.valid & fuse_wire::proto::flags::SetattrValid::SIZE.bits() != 0 {
            self.data.lock().unwrap().resize(attr.size as usize, 0);
        }
        reply.attr(TTL, &self.attr(ino.0));
    }

    fn open(&self, ctx: &RequestContext<'_>, ino: Inode, flags: OpenFlags, reply: ReplyOpen) {
        let flags = flags.bits();
        if let (FILE_INO, Some(path)) = (ino.0, &self.backing) {
            let f = match File::options()
                .read(true)
                .write(flags & libc::O_ACCMODE != libc::O_RDONLY)
                .open(path)
            {
                Ok(f) => f,
                Err(e) => return reply.io_error(&e),
            };
            match ctx.open_backing(f.as_fd()) {
                Ok(b) => {
                    self.passthrough_opens.fetch_add(1, Ordering::Relaxed);
                    reply.passthrough(FileHandle(0), FopenFlags::empty(), &b);
                    *self.held_backing.lock().unwrap() = Some(b);
                    return;
                }
                Err(e) => panic!("backing file refused: {e}"),
            }
        }
        // Direct I/O so that every read reaches the filesystem.
        reply.opened(FileHandle(0), FopenFlags::DIRECT_IO)
    }

    fn release(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        _req: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        if ino.0 == FILE_INO {
            self.held_backing.lock().unwrap().take();
        }
        reply.ok();
    }

    fn read(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        req: ReadRequest,
        reply: ReplyData,
    ) {
        let offset = req.offset;
        let size = req.size;
        if let Some(fd) = ctx.channel_fd() {
            self.fds_seen.lock().unwrap().insert(fd);
        }
        self.workers_seen.lock().unwrap().insert(ctx.worker());
        if ino.0 == SLOW_INO {
            if let Some(g) = &self.slow_gate {
                let _ = g.entered.lock().unwrap().send(());
                let _ = g.release.lock().unwrap().recv_timeout(Duration::from_secs(10));
            }
            // Wait (bounded) until the other parties are in their handlers too.
            let (tx, rx) = std::sync::mpsc::channel();
            let b: &Barrier = &self.slow_barrier;
            std::thread::scope(|s| {
                s.spawn(|| {
                    b.wait();
                    let _ = tx.send(());
                });
                if rx.recv_timeout(Duration::from_secs(10)).is_err() {
                    panic!("the other reader never arrived: requests were not served in parallel");
                }
            });
            return reply.data(&[b's'; 16]);
        }
        let d = self.data.lock().unwrap();
        let start = (offset as usize).min(d.len());
        let end = (start + size as usize).min(d.len());
        reply.data(&d[start..end]);
    }

    fn write(
        &self,
        _ctx: &RequestContext<'_>,
        _ino: Inode,
        _fh: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        let offset = req.offset;
        let Some(data) = req.data.bytes() else {
            return reply.error(Errno::EIO);
        };
        let mut d = self.data.lock().unwrap();
        let end = offset as usize + data.len();
        if d.len() < end {
            d.resize(end, 0);
        }
        d[offset as usize..end].copy_from_slice(data);
        reply.written(data.len() as u32);
    }
}

fn mount(fs: Arc<TestFs>, mnt: &TempMountpoint, workers: usize) -> RunningSession {
    let opts = MountOptions {
        subtype: Some("fwtest".into()),
        ..Default::default()
    };
    let cfg = SessionConfig {
        workers,
        max_workers: workers,
        ..Default::default()
    };
    let s = Session::mount_arc(fs, mnt.path(), &opts, cfg).expect("mount");
    let running = s.spawn().expect("spawn");
    // INIT completes asynchronously after mount(2).
    for _ in 0..500 {
        if running.handle().negotiated().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(running.handle().negotiated().is_some(), "INIT did not complete");
    running
}

#[test]
fn serves_lookup_read_write() {
    if !require_mount_capability() {
        return;
    }
    let mnt = TempMountpoint::new("session-rw");
    let fs = Arc::new(TestFs::new(1));
    let running = mount(fs.clone(), &mnt, 2);
    let p = mnt.path().join("data");
    let mut s = String::new();
    File::open(&p).unwrap().read_to_string(&mut s).unwrap();
    assert_eq!(s, "hello from fuse-wire\n");
    let f = File::options().write(true).open(&p).unwrap();
    f.write_all_at(b"HELLO", 0).unwrap();
    drop(f);
    let mut s = String::new();
    File::open(&p).unwrap().read_to_string(&mut s).unwrap();
    assert_eq!(s, "HELLO from fuse-wire\n");
    assert_eq!(
        std::fs::metadata(mnt.path().join("nope"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOENT)
    );

    let stats = running.handle().stats();
    assert!(stats.get(Opcode::Lookup).count >= 2, "{stats:?}");
    assert!(stats.get(Opcode::Lookup).errors >= 1, "{stats:?}");
    assert!(stats.get(Opcode::Write).count >= 1, "{stats:?}");
    assert!(stats.get(Opcode::Read).count >= 2, "{stats:?}");
    let report = running.stop().expect("session report");
    assert!(
        wait_unmounted(mnt.path(), Duration::from_secs(5)),
        "stop() left the mount behind"
    );
    assert_eq!(report.negotiated.minor, 45);
}

#[test]
fn two_workers_each_read_from_their_own_cloned_fd() {
    if !require_mount_capability() {
        return;
    }
    let mnt = TempMountpoint::new("session-clone");
    let fs = Arc::new(TestFs::new(2));
    let running = mount(fs.clone(), &mnt, 2);
    let p = mnt.path().join("slow");
    // Two concurrent reads: the first holds its worker in the handler until
    // the second arrives, which only the other worker can have read.
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut b = [0u8; 16];
                File::open(&p).unwrap().read_exact(&mut b).unwrap();
                b
            })
        })
        .collect();
    for r in readers {
        assert_eq!(r.join().unwrap(), [b's'; 16]);
    }
    let fds = fs.fds_seen.lock().unwrap().clone();
    let workers = fs.workers_seen.lock().unwrap().clone();
    assert_eq!(workers.len(), 2, "both workers served reads: {workers:?}");
    assert_eq!(fds.len(), 2, "each worker read from its own fd: {fds:?}");
    for fd in &fds {
        let target = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
        assert_eq!(target, PathBuf::from("/dev/fuse"));
    }
    let report = running.stop().unwrap();
    assert_eq!(report.cloned_channels, 1, "worker 1 should have a cloned fd");
}

#[test]
fn unmount_while_idle_ends_the_loop() {
    if !require_mount_capability() {
        return;
    }
    let mnt = TempMountpoint::new("session-idle");
    let running = mount(Arc::new(TestFs::new(1)), &mnt, 2);
    assert!(fuse_mounted_at(mnt.path()));
    fuse_wire::session::mount::unmount(mnt.path(), false).expect("umount");
    let report = running.join().expect("session ends cleanly after unmount");
    assert_eq!(report.workers_started, 2);
}

#[test]
fn unmount_while_busy_ends_the_loop() {
    if !require_mount_capability() {
        return;
    }
    let mnt = TempMountpoint::new("session-busy");
    let mut fs = TestFs::new(1);
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    fs.slow_gate = Some(Gate {
        entered: Mutex::new(entered_tx),
        release: Mutex::new(release_rx),
    });
    let running = mount(Arc::new(fs), &mnt, 2);
    let p = mnt.path().join("slow");
    let reader = std::thread::spawn(move || {
        let mut b = [0u8; 16];
        File::open(&p).and_then(|mut f| f.read(&mut b))
    });
    entered
        .recv_timeout(Duration::from_secs(10))
        .expect("the slow READ did not reach its handler within 10 s");
    // A lazy unmount while the read is being served; then the handler answers.
    fuse_wire::session::mount::unmount(mnt.path(), true).expect("umount -l");
    let _ = release.send(());
    let report = running.join().expect("session ends cleanly after a busy unmount");
    assert!(report.stats.get(Opcode::Read).count >= 1);
    let _ = reader.join().unwrap();
}

#[test]
fn passthrough_reads_bypass_userspace() {
    if !require_mount_capability() {
        return;
    }
    let mnt = TempMountpoint::new("session-pt");
    let dir = std::env::temp_dir().join(format!("fuse-wire-backing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let backing = dir.join("backing");
    let content: Vec<u8> = (0..(4 << 20)).map(|i: u32| (i % 251) as u8).collect();
    File::create(&backing).unwrap().write_all(&content).unwrap();
    let mut fs = TestFs::new(1);
    fs.backing = Some(backing.clone());
    let fs = Arc::new(fs);
    let running = mount(fs.clone(), &mnt, 2);
    let n = running.handle().negotiated().unwrap();
    assert!(
        n.flags.contains(InitFlags::PASSTHROUGH),
        "passthrough not granted: {:?}",
        n.refused
    );
    let mut got = Vec::new();
    File::open(mnt.path().join("data"))
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    assert!(got == content, "passthrough read returned different data");
    let stats = running.stop().unwrap().stats;
    assert_eq!(fs.passthrough_opens.load(Ordering::Relaxed), 1);
    assert_eq!(
        stats.get(Opcode::Read).count,
        0,
        "READ reached userspace: {stats:?}"
    );
    assert!(stats.get(Opcode::Open).count >= 1);
    let _ = std::fs::remove_dir_all(&dir);
}
