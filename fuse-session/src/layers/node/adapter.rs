//! The node layer's answers to the kernel: [`NodeFs`] implementing
//! [`Filesystem`], request by request, calling the nodes.

use crate::context::RequestContext;
use crate::filesystem::Filesystem;
use crate::init::InitConfig;
use crate::layers::core::{Answer, SizedXattr, check_name, hide_trusted, lock, on_open_file};
use crate::layers::setid::{self, Change};
use crate::layers::values::Created;
use crate::ops::*;
use crate::reply::*;
use crate::types::{Entry, FileHandle, Inode, LockOwner};
use fuse_proto::Errno;
use fuse_proto::flags::{FopenFlags, InitFlags, OpenInFlags, WriteFlags};
use std::ffi::CStr;
use std::time::Duration;

use super::dir_fill::{DirFill, Out};
use super::{NodeFs, OpenEntry, key_of};

impl Filesystem for NodeFs {
    fn recovery(&self) -> crate::Recovery {
        crate::Recovery::Unsupported(
            "the node layer keeps its node table and open files in this process only: a successor would \
             give the node ids the kernel holds to other nodes (not yet supported under a keeper)",
        )
    }

    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        config.wanted |= self.opts.wanted;
        // The layer clears set-ID bits itself (`setid`).
        setid::want(config);
        if self.opts.readdirplus {
            config.wanted |= InitFlags::DO_READDIRPLUS;
        }
        if self.opts.passthrough {
            config.wanted |= InitFlags::PASSTHROUGH;
            // Backing files on filesystems that are not themselves stacked.
            config.max_stack_depth = config.max_stack_depth.max(1);
        }
        Ok(())
    }

    fn lookup(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        self.remember_notifier(ctx);
        if let Err(e) = check_name(name) {
            return reply.error(e);
        }
        self.new_entry(ctx, parent, reply, |p| p.lookup(ctx, name))
    }

    fn forget(&self, _: &RequestContext<'_>, ino: Inode, nlookup: u64) {
        self.forget_one(ino, nlookup)
    }

    fn getattr(&self, ctx: &RequestContext<'_>, ino: Inode, _: Option<FileHandle>, reply: ReplyAttr) {
        self.remember_notifier(ctx);
        let ttl = self.opts.attr_ttl;
        reply.result(
            self.node(ino)
                .and_then(|n| self.attr_of(&n, ctx))
                .map(|a| (ttl, a)),
        )
    }

    fn setattr(&self, ctx: &RequestContext<'_>, ino: Inode, req: &SetattrRequest, reply: ReplyAttr) {
        let r = (|| {
            let node = self.node(ino)?;
            let file = match req.fh {
                Some(fh) => self.shared.files.get(fh.0),
                None => None,
            };
            let file = file.as_deref().map(|f| &*f.file);
            let mut attr = setid::setattr(ctx, req, || node.getattr(ctx), |r| node.setattr(ctx, r, file))?;
            if attr.ino == 0 {
                attr.ino = self.shared.st_ino(key_of(&node));
            }
            Ok::<_, Errno>((self.opts.attr_ttl, attr))
        })();
        reply.result(r)
    }

    fn readlink(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyData) {
        reply.result(self.node(ino).and_then(|n| n.readlink(ctx)))
    }

    fn symlink(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        target: &CStr,
        reply: ReplyEntry,
    ) {
        if let Err(e) = check_name(name) {
            return reply.error(e);
        }
        self.new_entry(ctx, parent, reply, |p| p.symlink(ctx, name, target))
    }

    fn mknod(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: MknodRequest,
        reply: ReplyEntry,
    ) {
        if let Err(e) = check_name(name) {
            return reply.error(e);
        }
        self.new_entry(ctx, parent, reply, |p| p.mknod(ctx, name, req))
    }

    fn mkdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, mode: u32, reply: ReplyEntry) {
        if let Err(e) = check_name(name) {
            return reply.error(e);
        }
        self.new_entry(ctx, parent, reply, |p| p.mkdir(ctx, name, mode))
    }

    fn unlink(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        reply.result(
            check_name(name)
                .and_then(|()| self.node(parent))
                .and_then(|p| p.unlink(ctx, name)),
        )
    }

    fn rmdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        reply.result(
            check_name(name)
                .and_then(|()| self.node(parent))
                .and_then(|p| p.rmdir(ctx, name)),
        )
    }

    fn rename(&self, ctx: &RequestContext<'_>, req: &RenameRequest<'_>, reply: ReplyEmpty) {
        let r = (|| {
            check_name(req.name)?;
            check_name(req.newname)?;
            let from = self.node(req.parent)?;
            let to = self.node(req.newparent)?;
            from.rename(ctx, req.name, &to, req.newname, req.flags)
        })();
        reply.result(r)
    }

    fn link(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        newparent: Inode,
        newname: &CStr,
        reply: ReplyEntry,
    ) {
        let r = (|| {
            check_name(newname)?;
            let node = self.node(ino)?;
            self.node(newparent)?.link(ctx, newname, &node)?;
            self.enter(ctx, node)
        })();
        reply.result(r)
    }

    fn open(&self, ctx: &RequestContext<'_>, ino: Inode, flags: OpenFlags, reply: ReplyOpen) {
        self.remember_notifier(ctx);
        let r = self.held(ino).and_then(|held| {
            let opened = held.node.open(ctx, flags)?;
            if flags.bits() & libc::O_TRUNC != 0 && ctx.open_in_flags().contains(OpenInFlags::KILL_SUIDGID) {
                let file = Some(&*opened.file);
                let cleared = setid::clear(
                    ctx,
                    Change::Written,
                    None,
                    || held.node.getattr(ctx),
                    |r| held.node.setattr(ctx, r, file),
                );
                if let Err(e) = cleared {
                    opened.file.release(ctx);
                    return Err(e);
                }
            }
            Ok(self.store_open(held, opened))
        });
        reply.answer(r)
    }

    fn read(&self, ctx: &RequestContext<'_>, _: Inode, fh: FileHandle, req: ReadRequest, reply: ReplyData) {
        match self.file(fh) {
            Ok(f) => f.file.read(ctx, req, reply),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        ctx: &RequestContext<'_>,
        _: Inode,
        fh: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        on_open_file(&self.shared.files, fh, reply, |f| {
            if req.write_flags.contains(WriteFlags::KILL_SUIDGID) {
                clear_setid(ctx, Change::Written, fh, &f)?;
            }
            f.file.write(ctx, req)
        })
    }

    fn flush(&self, ctx: &RequestContext<'_>, _: Inode, fh: FileHandle, owner: LockOwner, reply: ReplyEmpty) {
        on_open_file(&self.shared.files, fh, reply, |f| f.file.flush(ctx, owner))
    }

    fn release(
        &self,
        ctx: &RequestContext<'_>,
        _: Inode,
        fh: FileHandle,
        _: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        match self.shared.files.remove(fh.0) {
            Some(f) => {
                f.file.release(ctx);
                lock(&f.held.io).detach(f.passthrough);
                reply.ok()
            }
            None => reply.error(Errno::EBADF),
        }
    }

    fn fsync(&self, ctx: &RequestContext<'_>, _: Inode, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        on_open_file(&self.shared.files, fh, reply, |f| f.file.fsync(ctx, datasync))
    }

    fn fallocate(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: FallocateRequest,
        reply: ReplyEmpty,
    ) {
        on_open_file(&self.shared.files, fh, reply, |f| {
            f.file.fallocate(ctx, req)?;
            if clear_setid(ctx, Change::Modified, fh, &f)? {
                setid::forget_cached_mode(ctx, ino);
            }
            Ok(())
        })
    }

    fn lseek(
        &self,
        ctx: &RequestContext<'_>,
        _: Inode,
        fh: FileHandle,
        req: LseekRequest,
        reply: ReplyLseek,
    ) {
        on_open_file(&self.shared.files, fh, reply, |f| f.file.lseek(ctx, req))
    }

    fn opendir(&self, ctx: &RequestContext<'_>, ino: Inode, _: OpenFlags, reply: ReplyOpen) {
        self.remember_notifier(ctx);
        match self.node(ino) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        _: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = (|| {
            let dir = self.node(ino)?;
            let me = self.attr_of(&dir, ctx)?.ino;
            if crate::layers::core::add_dots(&mut reply, Inode(me), offset).is_full() {
                return Ok(());
            }
            let mut fill = DirFill {
                ctx,
                fs: self,
                out: Out::Plain(&mut reply),
                full: false,
            };
            dir.readdir(ctx, offset.saturating_sub(2), &mut fill)
        })();
        reply.result(r)
    }

    fn readdirplus(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        _: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = (|| {
            let dir = self.node(ino)?;
            let attr = self.attr_of(&dir, ctx)?;
            let me = Entry {
                ino,
                generation: 0,
                attr,
                entry_ttl: Duration::ZERO,
                attr_ttl: Duration::ZERO,
            };
            for (i, name) in [".", ".."].into_iter().enumerate().skip(offset as usize) {
                // Never counted by the kernel.
                if reply.add(&me, i as u64 + 1, name).is_full() {
                    return Ok(());
                }
            }
            let mut fill = DirFill {
                ctx,
                fs: self,
                out: Out::Plus(&mut reply),
                full: false,
            };
            dir.readdir(ctx, offset.saturating_sub(2), &mut fill)
        })();
        reply.result(r)
    }

    fn statfs(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyStatfs) {
        reply.result(self.node(ino).and_then(|n| n.statfs(ctx)))
    }

    fn getxattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, size: u32, reply: ReplyXattr) {
        SizedXattr(reply, size).answer(self.node(ino).and_then(|n| n.getxattr(ctx, name)))
    }

    fn listxattr(&self, ctx: &RequestContext<'_>, ino: Inode, size: u32, reply: ReplyXattr) {
        let admin = || ctx.caller().holds_capability(crate::credentials::cap::SYS_ADMIN);
        let v = self.node(ino).and_then(|n| n.listxattr(ctx));
        SizedXattr(reply, size).answer(v.map(|l| hide_trusted(admin, l)))
    }

    fn setxattr(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        name: &CStr,
        req: SetxattrRequest<'_>,
        reply: ReplyEmpty,
    ) {
        reply.result(
            self.node(ino)
                .and_then(|n| n.setxattr(ctx, name, req.value, req.flags)),
        )
    }

    fn removexattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, reply: ReplyEmpty) {
        reply.result(self.node(ino).and_then(|n| n.removexattr(ctx, name)))
    }

    fn create(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: CreateRequest,
        reply: ReplyCreate,
    ) {
        self.remember_notifier(ctx);
        let r = (|| {
            check_name(name)?;
            let (node, opened) = self.node(parent)?.create(ctx, name, req)?;
            let entry = self.enter(ctx, node.clone())?;
            let held = self.held(entry.ino)?;
            Ok::<_, Errno>((entry, self.store_open(held, opened)))
        })();
        reply.answer(r.map(|(entry, open)| Created::new(entry, open)))
    }
}

/// Clears the set-ID bits `change` drops from the node of the open file
/// `f` (handle `fh`), through the node's getattr and setattr; whether it
/// changed the mode.
fn clear_setid(
    ctx: &RequestContext<'_>,
    change: Change,
    fh: FileHandle,
    f: &OpenEntry,
) -> Result<bool, Errno> {
    let node = &f.held.node;
    let cleared = setid::clear(
        ctx,
        change,
        Some(fh),
        || node.getattr(ctx),
        |r| node.setattr(ctx, r, Some(&*f.file)),
    )?;
    Ok(cleared.is_some())
}
