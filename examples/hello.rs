//! The smallest useful filesystem: a read-only root directory holding one
//! file, `hello`, that contains "Hello, world!\n".
//!
//! ```sh
//! cargo run --example hello -- /mnt/hello     # as root; Ctrl-C unmounts
//! cat /mnt/hello/hello
//! ```

mod common;

use fuse_wire::proto::abi::Attr;
use fuse_wire::proto::flags::FopenFlags;
use fuse_wire::session::mount::MountOptions;
use fuse_wire::session::reply::{ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen};
use fuse_wire::session::types::dirent_type;
use fuse_wire::session::{
    Entry, Errno, FileHandle, Filesystem, Inode, LockOwner, RequestContext, SessionConfig,
};
use std::ffi::CStr;
use std::time::Duration;

const CONTENT: &[u8] = b"Hello, world!\n";
const HELLO: Inode = Inode(2);
/// Nothing here ever changes, so the kernel may cache names and attributes
/// for as long as it likes; an hour is plenty.
const TTL: Duration = Duration::from_secs(3600);

/// The filesystem has no state: everything is computed from two constants.
pub struct Hello;

impl Hello {
    fn attr(ino: Inode) -> Option<Attr> {
        let (mode, nlink, size) = match ino {
            Inode::ROOT => (libc::S_IFDIR | 0o555, 2, 0),
            HELLO => (libc::S_IFREG | 0o444, 1, CONTENT.len() as u64),
            _ => return None,
        };
        Some(Attr {
            ino: ino.0,
            mode,
            nlink,
            size,
            blocks: size.div_ceil(512),
            blksize: 4096,
            ..Attr::default()
        })
    }
}

impl Filesystem for Hello {
    fn lookup(&self, _ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        if parent != Inode::ROOT || name.to_bytes() != b"hello" {
            return reply.error(Errno::ENOENT);
        }
        // `hello` never goes away, so the lookup count the kernel keeps for
        // it (and the FORGET that lowers it) need no bookkeeping here.
        let attr = Hello::attr(HELLO).unwrap_or_default();
        reply.entry(&Entry {
            ino: HELLO,
            generation: 0,
            attr,
            entry_ttl: TTL,
            attr_ttl: TTL,
        });
    }

    fn getattr(&self, _ctx: &RequestContext<'_>, ino: Inode, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match Hello::attr(ino) {
            Some(attr) => reply.attr(TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _ctx: &RequestContext<'_>, ino: Inode, flags: i32, reply: ReplyOpen) {
        if ino != HELLO {
            reply.error(Errno::EISDIR)
        } else if flags & libc::O_ACCMODE != libc::O_RDONLY {
            reply.error(Errno::EACCES)
        } else {
            // KEEP_CACHE: the content never changes, keep cached pages across opens.
            reply.opened(FileHandle(0), FopenFlags::KEEP_CACHE)
        }
    }

    fn read(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != HELLO {
            return reply.error(Errno::EISDIR);
        }
        // A reply shorter than `size` tells the kernel the file ends there.
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(CONTENT.len());
        let end = start.saturating_add(size as usize).min(CONTENT.len());
        reply.data(&CONTENT[start..end]);
    }

    fn readdir(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != Inode::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        // Each entry carries the cookie of the entry after it; the kernel
        // hands the last cookie it used back as `offset` to continue.
        let entries = [
            (Inode::ROOT, libc::S_IFDIR, &b"."[..]),
            (Inode::ROOT, libc::S_IFDIR, &b".."[..]),
            (HELLO, libc::S_IFREG, &b"hello"[..]),
        ];
        for (i, (ino, mode, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(ino.0, i as u64 + 1, dirent_type(*mode), name) {
                break; // the kernel's buffer is full; it will ask again
            }
        }
        reply.ok();
    }
}

#[allow(dead_code)] // the tests include this file for `Hello` and never call main
fn main() -> std::process::ExitCode {
    common::init_logging();
    let (mountpoint, opts) = match common::parse_args("usage: hello [-o MOUNT_OPTIONS] MOUNTPOINT") {
        Ok(args) => args,
        Err(usage) => {
            eprintln!("{usage}");
            return std::process::ExitCode::from(2);
        }
    };
    let mut options = MountOptions {
        fsname: Some("hello".into()),
        subtype: Some("hello".into()),
        read_only: true,
        ..MountOptions::default()
    };
    if let Err(e) = opts.iter().try_for_each(|o| options.apply(o)) {
        eprintln!("hello: {e}");
        return std::process::ExitCode::from(2);
    }
    match common::mount_and_serve(Hello, &mountpoint, &options, SessionConfig::default()) {
        Ok(_) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hello: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
