//! The twin on the node layer: `Node` for the store's inodes, `OpenFile`
//! for its open state. The library assigns node ids and counts lookups.

use crate::store::{Inode, OpenState};
use fuse_wire::node::{DirFill, Node, NodeRef, OpenFile, Opened};
use fuse_wire::reply::ReplyData;
use fuse_wire::{
    CreateRequest, Errno, FileAttr, FileKind, OpenFlags, ReadRequest, RequestContext, SetattrRequest,
    WriteRequest,
};
use std::ffi::CStr;

impl Node for Inode {
    fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
        Ok(self.attr())
    }

    fn setattr(
        &self,
        _: &RequestContext<'_>,
        req: &SetattrRequest,
        _: Option<&dyn OpenFile>,
    ) -> Result<FileAttr, Errno> {
        Inode::setattr(self, req)
    }

    fn open(&self, _: &RequestContext<'_>, flags: OpenFlags) -> Result<Opened, Errno> {
        Ok(Opened::new(Open(Inode::open(self, flags)?)))
    }

    fn lookup(&self, _: &RequestContext<'_>, name: &CStr) -> Result<NodeRef, Errno> {
        Ok(Inode::lookup(self, name.to_bytes())?)
    }

    fn readdir(&self, _: &RequestContext<'_>, offset: u64, out: &mut DirFill<'_, '_>) -> Result<(), Errno> {
        self.list(offset, |cookie, name, child| {
            !out.add(name, cookie, &(child.clone() as NodeRef)).is_full()
        })
    }

    fn create(
        &self,
        ctx: &RequestContext<'_>,
        name: &CStr,
        req: CreateRequest,
    ) -> Result<(NodeRef, Opened), Errno> {
        let node = self.add(
            (ctx.uid(), ctx.gid()),
            name.to_bytes(),
            FileKind::RegularFile,
            req.mode,
        )?;
        let open = Opened::new(Open(node.open(req.flags)?));
        Ok((node, open))
    }

    fn mkdir(&self, ctx: &RequestContext<'_>, name: &CStr, mode: u32) -> Result<NodeRef, Errno> {
        Ok(self.add((ctx.uid(), ctx.gid()), name.to_bytes(), FileKind::Directory, mode)?)
    }

    fn unlink(&self, _: &RequestContext<'_>, name: &CStr) -> Result<(), Errno> {
        self.remove(name.to_bytes(), false)
    }

    fn rmdir(&self, _: &RequestContext<'_>, name: &CStr) -> Result<(), Errno> {
        self.remove(name.to_bytes(), true)
    }
}

struct Open(OpenState);

impl OpenFile for Open {
    fn read(&self, _: &RequestContext<'_>, req: ReadRequest, reply: ReplyData) {
        self.0.read(req.offset, req.size, reply)
    }

    fn write(&self, _: &RequestContext<'_>, req: WriteRequest<'_>) -> Result<u32, Errno> {
        self.0.write(req.offset, req.data.fetch()?)
    }
}
