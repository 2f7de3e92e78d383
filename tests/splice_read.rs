//! READ replies spliced from a backing file (`ReplyData::splice_from`) on a
//! real mount return exactly the file's bytes, for sizes from 0 to 1 MiB, at
//! unaligned offsets, at and past end of file, and through the page cache.
//!
//! A READ of 1 MiB would not fit the 1 MiB pipes with its header and be read
//! into memory instead; the kernels we test on split even `DIRECT_IO` reads
//! into requests of 128 KiB, so that fallback is covered by the unit tests
//! of `fuse-session/src/wire/splice.rs` and by `tests/splice_fallback.rs`.

mod common;

use common::{TempMountpoint, require_mount_capability, wait_unmounted};
use fuse_wire::proto::Opcode;
use fuse_wire::proto::abi::Attr;
use fuse_wire::proto::flags::FopenFlags;
use fuse_wire::session::ops::*;
use fuse_wire::session::reply::*;
use fuse_wire::session::*;
use std::ffi::CStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

/// Opened with `DIRECT_IO`: every read reaches us with the caller's size.
const DIRECT_INO: u64 = 2;
/// Opened normally: reads go through the page cache (and readahead).
const CACHED_INO: u64 = 3;
/// Deliberately not a multiple of the page size.
const FILE_LEN: usize = 3 * 1024 * 1024 + 4321;

struct SpliceFs {
    backing: File,
}

impl SpliceFs {
    fn attr(&self, ino: u64) -> FileAttr {
        FileAttr::from_abi(&self.attr_raw(ino)).expect("a valid mode")
    }

    fn attr_raw(&self, ino: u64) -> Attr {
        let (mode, size, nlink) = match ino {
            1 => (libc::S_IFDIR | 0o755, 0, 2),
            _ => (libc::S_IFREG | 0o644, FILE_LEN as u64, 1),
        };
        Attr {
            ino,
            mode,
            size,
            nlink,
            blksize: 4096,
            ..Default::default()
        }
    }
}

impl Filesystem for SpliceFs {
    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        // max_pages follows max_write: READs of up to 1 MiB reach us whole.
        config.max_write = 1 << 20;
        Ok(())
    }

    fn lookup(&self, _ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        let ino = match (parent, name.to_bytes()) {
            (Inode::ROOT, b"direct") => DIRECT_INO,
            (Inode::ROOT, b"cached") => CACHED_INO,
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
            1 | DIRECT_INO | CACHED_INO => reply.attr(Duration::ZERO, &self.attr(ino.0)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _ctx: &RequestContext<'_>, ino: Inode, _flags: OpenFlags, reply: ReplyOpen) {
        match ino.0 {
            DIRECT_INO => reply.opened(FileHandle(0), FopenFlags::DIRECT_IO),
            CACHED_INO => reply.opened(FileHandle(0), FopenFlags::empty()),
            _ => reply.error(Errno::EISDIR),
        }
    }

    fn read(
        &self,
        _ctx: &RequestContext<'_>,
        _ino: Inode,
        _fh: FileHandle,
        req: ReadRequest,
        reply: ReplyData,
    ) {
        let offset = req.offset;
        let size = req.size;
        reply.splice_from(self.backing.as_fd(), offset, size as usize);
    }
}

/// Bytes that differ from page to page and within a page.
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn spliced_reads_return_exactly_the_files_bytes() {
    if !require_mount_capability() {
        return;
    }
    let mnt = TempMountpoint::new("splice-read");
    let backing_path = mnt.root().join("backing");
    let content = pattern(FILE_LEN);
    std::fs::write(&backing_path, &content).unwrap();
    let fs = Arc::new(SpliceFs {
        backing: File::open(&backing_path).unwrap(),
    });
    let opts = MountOptions {
        subtype: Some("fwsplice".into()),
        ..Default::default()
    };
    let cfg = SessionConfig {
        workers: 2,
        max_workers: 2,
        ..Default::default()
    };
    let running = Session::mount_arc(fs, mnt.path(), &opts, cfg)
        .expect("mount")
        .spawn()
        .expect("spawn");
    for _ in 0..500 {
        if running.handle().negotiated().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(running.handle().negotiated().is_some(), "INIT did not complete");

    let f = File::open(mnt.path().join("direct")).unwrap();
    let sizes = [0, 1, 4095, 4096, 128 * 1024, 1024 * 1024];
    let offsets = [0, 1, 4095, 4096, 65_536 + 17];
    let mut reads = 0;
    for &size in &sizes {
        for &off in &offsets {
            let mut buf = vec![0xa5u8; size];
            let n = f.read_at(&mut buf, off as u64).unwrap();
            let want = &content[off..(off + size).min(FILE_LEN)];
            assert_eq!(n, want.len(), "read of {size} at {off}");
            assert!(buf[..n] == *want, "read of {size} at {off}: wrong bytes");
            reads += usize::from(size > 0);
        }
        // Straddling, at and past end of file.
        for off in [FILE_LEN - 100, FILE_LEN, FILE_LEN + 10_000] {
            let mut buf = vec![0xa5u8; size];
            let n = f.read_at(&mut buf, off as u64).unwrap();
            let want = &content[off.min(FILE_LEN)..(off + size).min(FILE_LEN)];
            assert_eq!(n, want.len(), "read of {size} at {off} (end of file {FILE_LEN})");
            assert!(buf[..n] == *want, "read of {size} at {off}: wrong bytes");
        }
    }
    drop(f);

    // Through the page cache: whatever sizes readahead asks for.
    let mut all = Vec::new();
    File::open(mnt.path().join("cached"))
        .unwrap()
        .read_to_end(&mut all)
        .unwrap();
    assert!(all == content, "cached read: wrong bytes");

    let stats = running.handle().stats();
    let read = stats.get(Opcode::Read);
    assert!(read.count >= reads as u64, "{stats:?}");
    assert_eq!(read.errors, 0, "{stats:?}");
    running.stop().expect("session report");
    assert!(
        wait_unmounted(mnt.path(), Duration::from_secs(5)),
        "stop() left the mount behind"
    );
}
