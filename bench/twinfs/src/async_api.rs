//! The twin on the async trait (`fuse_wire::asyncfs`), on a Tokio runtime
//! with its default settings: the raw twin's tables and storage, each
//! operation a future that completes at once, so that bench/layers measures
//! what the async path itself costs per request.

use crate::raw_api::RawFs;
use fuse_wire::asyncfs::{AsyncContext, AsyncFilesystem, Created, Data, DirEntry, Open};
use fuse_wire::{
    CreateRequest, Entry, Errno, FileAttr, FileHandle, FileKind, Inode as Ino, OpenFlags, ReadRequest,
    ReleaseRequest, SetattrRequest, WriteRequest,
};
use std::ffi::CStr;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(1);

pub struct AsyncTwin(pub RawFs);

impl AsyncFilesystem for AsyncTwin {
    fn forget(&self, ino: Ino, nlookup: u64) {
        self.0.forget_node(ino, nlookup)
    }

    async fn lookup(&self, _: &AsyncContext, parent: Ino, name: &CStr) -> Result<Entry, Errno> {
        let node = self.0.node(parent)?.lookup(name.to_bytes())?;
        Ok(self.0.enter(node))
    }

    async fn getattr(
        &self,
        _: &AsyncContext,
        ino: Ino,
        _: Option<FileHandle>,
    ) -> Result<(Duration, FileAttr), Errno> {
        Ok((TTL, self.0.node(ino)?.attr()))
    }

    async fn setattr(
        &self,
        _: &AsyncContext,
        ino: Ino,
        req: &SetattrRequest,
    ) -> Result<(Duration, FileAttr), Errno> {
        Ok((TTL, self.0.node(ino)?.setattr(req)?))
    }

    async fn mkdir(&self, ctx: &AsyncContext, parent: Ino, name: &CStr, mode: u32) -> Result<Entry, Errno> {
        let owner = (ctx.uid(), ctx.gid());
        let node = self
            .0
            .node(parent)?
            .add(owner, name.to_bytes(), FileKind::Directory, mode)?;
        Ok(self.0.enter(node))
    }

    async fn unlink(&self, _: &AsyncContext, parent: Ino, name: &CStr) -> Result<(), Errno> {
        self.0.node(parent)?.remove(name.to_bytes(), false)
    }

    async fn rmdir(&self, _: &AsyncContext, parent: Ino, name: &CStr) -> Result<(), Errno> {
        self.0.node(parent)?.remove(name.to_bytes(), true)
    }

    async fn open(&self, _: &AsyncContext, ino: Ino, flags: OpenFlags) -> Result<Open, Errno> {
        let st = self.0.node(ino)?.open(flags)?;
        Ok(Open::new(self.0.keep_open(st)))
    }

    async fn read(&self, _: &AsyncContext, _: Ino, fh: FileHandle, req: ReadRequest) -> Result<Data, Errno> {
        let f = self.0.file(fh)?;
        Ok(f.with_range(req.offset, req.size, |b| b.to_vec()).into())
    }

    async fn write(
        &self,
        _: &AsyncContext,
        _: Ino,
        fh: FileHandle,
        req: WriteRequest<'_>,
    ) -> Result<u32, Errno> {
        self.0.file(fh)?.write(req.offset, req.data.fetch()?)
    }

    async fn release(
        &self,
        _: &AsyncContext,
        _: Ino,
        fh: FileHandle,
        _: ReleaseRequest,
    ) -> Result<(), Errno> {
        if self.0.close(fh) {
            Ok(())
        } else {
            Err(Errno::EBADF)
        }
    }

    async fn readdir(
        &self,
        _: &AsyncContext,
        ino: Ino,
        _: FileHandle,
        offset: u64,
    ) -> Result<Vec<DirEntry>, Errno> {
        // Cookies as the raw twin's: 1 and 2 for "." and "..", the
        // children's own shifted by 2. One reply's worth at most.
        let dir = self.0.node(ino)?;
        let mut out: Vec<DirEntry> = [(1, "."), (2, "..")]
            .into_iter()
            .filter(|&(cookie, _)| offset < cookie)
            .map(|(cookie, name)| DirEntry::new(ino, cookie, FileKind::Directory, name))
            .collect();
        dir.list(offset.saturating_sub(2), |cookie, name, child| {
            out.push(DirEntry::new(Ino(child.ino), cookie + 2, child.kind(), name));
            out.len() < 256
        })?;
        Ok(out)
    }

    async fn create(
        &self,
        ctx: &AsyncContext,
        parent: Ino,
        name: &CStr,
        req: CreateRequest,
    ) -> Result<Created, Errno> {
        let owner = (ctx.uid(), ctx.gid());
        let node = self
            .0
            .node(parent)?
            .add(owner, name.to_bytes(), FileKind::RegularFile, req.mode)?;
        let st = node.open(req.flags)?;
        Ok(Created::new(self.0.enter(node), Open::new(self.0.keep_open(st))))
    }
}
