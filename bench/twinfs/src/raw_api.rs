//! The twin on the raw `Filesystem` trait, written as a careful user would
//! without the node layer: node id = the inode's serial number, a sharded
//! table of (inode, lookup count) that entry replies count up and FORGET
//! counts down, and a sharded table of open files.

use crate::store::{Inode, OpenState, lock};
use fuse_wire::reply::{
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite,
};
use fuse_wire::{
    CreateRequest, DirAdd, Entry, Errno, FileHandle, FileKind, Filesystem, FopenFlags, Inode as Ino,
    OpenFlags, ReadRequest, ReleaseRequest, RequestContext, SetattrRequest, WriteRequest,
};
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SHARDS: usize = 64;
const TTL: Duration = Duration::from_secs(1);

struct Slot {
    node: Arc<Inode>,
    lookups: u64,
}

pub struct RawFs {
    root: Arc<Inode>,
    nodes: [Mutex<HashMap<u64, Slot>>; SHARDS],
    files: [Mutex<HashMap<u64, Arc<OpenState>>>; SHARDS],
    next_fh: AtomicU64,
}

fn shard(n: u64) -> usize {
    (n as usize) % SHARDS
}

impl RawFs {
    pub fn new(root: Arc<Inode>) -> RawFs {
        RawFs {
            root,
            nodes: std::array::from_fn(|_| Mutex::default()),
            files: std::array::from_fn(|_| Mutex::default()),
            next_fh: AtomicU64::new(1),
        }
    }

    pub(crate) fn node(&self, ino: Ino) -> Result<Arc<Inode>, Errno> {
        if ino == Ino::ROOT {
            return Ok(self.root.clone());
        }
        lock(&self.nodes[shard(ino.0)])
            .get(&ino.0)
            .map(|s| s.node.clone())
            .ok_or(Errno::ESTALE)
    }

    /// The entry of `node`, counting the lookup the reply gives the kernel.
    pub(crate) fn enter(&self, node: Arc<Inode>) -> Entry {
        let attr = node.attr();
        let ino = node.ino;
        lock(&self.nodes[shard(ino)])
            .entry(ino)
            .or_insert(Slot { node, lookups: 0 })
            .lookups += 1;
        Entry {
            ino: Ino(ino),
            generation: 0,
            attr,
            entry_ttl: TTL,
            attr_ttl: TTL,
        }
    }

    pub(crate) fn keep_open(&self, st: OpenState) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.files[shard(fh)]).insert(fh, Arc::new(st));
        FileHandle(fh)
    }

    /// FORGET: drops `nlookup` lookups of `ino`, and the node at 0.
    pub(crate) fn forget_node(&self, ino: Ino, nlookup: u64) {
        let mut shard = lock(&self.nodes[shard(ino.0)]);
        if let Some(slot) = shard.get_mut(&ino.0) {
            slot.lookups = slot.lookups.saturating_sub(nlookup);
            if slot.lookups == 0 {
                shard.remove(&ino.0);
            }
        }
    }

    /// RELEASE: whether `fh` was open.
    pub(crate) fn close(&self, fh: FileHandle) -> bool {
        lock(&self.files[shard(fh.0)]).remove(&fh.0).is_some()
    }

    pub(crate) fn file(&self, fh: FileHandle) -> Result<Arc<OpenState>, Errno> {
        lock(&self.files[shard(fh.0)])
            .get(&fh.0)
            .cloned()
            .ok_or(Errno::EBADF)
    }
}

impl Filesystem for RawFs {
    fn lookup(&self, _: &RequestContext<'_>, parent: Ino, name: &CStr, reply: ReplyEntry) {
        reply.result(
            self.node(parent)
                .and_then(|p| p.lookup(name.to_bytes()))
                .map(|n| self.enter(n)),
        )
    }

    fn forget(&self, _: &RequestContext<'_>, ino: Ino, nlookup: u64) {
        self.forget_node(ino, nlookup)
    }

    fn getattr(&self, _: &RequestContext<'_>, ino: Ino, _: Option<FileHandle>, reply: ReplyAttr) {
        reply.result(self.node(ino).map(|n| (TTL, n.attr())))
    }

    fn setattr(&self, _: &RequestContext<'_>, ino: Ino, req: &SetattrRequest, reply: ReplyAttr) {
        reply.result(self.node(ino).and_then(|n| n.setattr(req)).map(|a| (TTL, a)))
    }

    fn mkdir(&self, ctx: &RequestContext<'_>, parent: Ino, name: &CStr, mode: u32, reply: ReplyEntry) {
        reply.result(
            self.node(parent)
                .and_then(|p| p.add((ctx.uid(), ctx.gid()), name.to_bytes(), FileKind::Directory, mode))
                .map(|n| self.enter(n)),
        )
    }

    fn unlink(&self, _: &RequestContext<'_>, parent: Ino, name: &CStr, reply: ReplyEmpty) {
        reply.result(self.node(parent).and_then(|p| p.remove(name.to_bytes(), false)))
    }

    fn rmdir(&self, _: &RequestContext<'_>, parent: Ino, name: &CStr, reply: ReplyEmpty) {
        reply.result(self.node(parent).and_then(|p| p.remove(name.to_bytes(), true)))
    }

    fn open(&self, _: &RequestContext<'_>, ino: Ino, flags: OpenFlags, reply: ReplyOpen) {
        reply.result(
            self.node(ino)
                .and_then(|n| n.open(flags))
                .map(|st| (self.keep_open(st), FopenFlags::empty())),
        )
    }

    fn read(&self, _: &RequestContext<'_>, _: Ino, fh: FileHandle, req: ReadRequest, reply: ReplyData) {
        match self.file(fh) {
            Ok(f) => f.read(req.offset, req.size, reply),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _: &RequestContext<'_>,
        _: Ino,
        fh: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        reply.result(self.file(fh).and_then(|f| f.write(req.offset, req.data.fetch()?)))
    }

    fn release(&self, _: &RequestContext<'_>, _: Ino, fh: FileHandle, _: ReleaseRequest, reply: ReplyEmpty) {
        reply.result(if self.close(fh) { Ok(()) } else { Err(Errno::EBADF) })
    }

    fn readdir(
        &self,
        _: &RequestContext<'_>,
        ino: Ino,
        _: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Cookies: 1 and 2 for "." and "..", the children's own shifted by 2.
        let r = self.node(ino).and_then(|dir| {
            for (cookie, name) in [(1, &b"."[..]), (2, b"..")] {
                if offset < cookie && reply.add(ino, cookie, FileKind::Directory, name) == DirAdd::Full {
                    return Ok(());
                }
            }
            dir.list(offset.saturating_sub(2), |cookie, name, child| {
                reply.add(Ino(child.ino), cookie + 2, child.kind(), name) != DirAdd::Full
            })
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        ctx: &RequestContext<'_>,
        parent: Ino,
        name: &CStr,
        req: CreateRequest,
        reply: ReplyCreate,
    ) {
        let r = self.node(parent).and_then(|p| {
            let node = p.add(
                (ctx.uid(), ctx.gid()),
                name.to_bytes(),
                FileKind::RegularFile,
                req.mode,
            )?;
            let st = node.open(req.flags)?;
            Ok((self.enter(node), self.keep_open(st)))
        });
        match r {
            Ok((entry, fh)) => reply.created(&entry, fh, FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }
}
