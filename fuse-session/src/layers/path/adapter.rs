//! The path layer's answers to the kernel: [`PathFs`] implementing
//! [`Filesystem`], request by request, turning node ids into paths.

use crate::attr::FileAttr;
use crate::context::RequestContext;
use crate::filesystem::Filesystem;
use crate::init::InitConfig;
use crate::journal::Replay;
use crate::layers::core::{Answer, SizedXattr, hide_trusted, lock, on_open_file};
use crate::layers::setid::{self, Change};
use crate::layers::values::Created;
use crate::ops::*;
use crate::reply::*;
use crate::types::{Entry, FileHandle, Inode, LockOwner};
use fuse_proto::Errno;
use fuse_proto::flags::{InitFlags, OpenInFlags, WriteFlags};
use std::ffi::{CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::PathFs;
use super::dir_fill::{PathDirFill, UNKNOWN_INO};
use super::filesystem::PathFilesystem;

impl<F: PathFilesystem> Filesystem for PathFs<F> {
    fn recovery(&self) -> crate::Recovery {
        match self.shared.kept {
            Some(_) => crate::Recovery::Durable,
            None => crate::Recovery::Unsupported(
                "this path layer keeps its node table (node ids to paths) and open files in this process \
                 only: a successor would give the node ids the kernel holds to other files (build it with \
                 PathFs::kept to run under a keeper)",
            ),
        }
    }

    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        self.shared.fs.init(config)?;
        // The layer clears set-ID bits itself (`setid`).
        setid::want(config);
        if config.wanted.contains(InitFlags::DO_READDIRPLUS) {
            // Listings here carry names only.
            log::warn!("the path layer serves READDIR, not READDIRPLUS; not asking for DO_READDIRPLUS");
            config
                .wanted
                .remove(InitFlags::DO_READDIRPLUS | InitFlags::READDIRPLUS_AUTO);
        }
        Ok(())
    }

    fn lookup(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        self.remember_notifier(ctx);
        self.new_entry(ctx, parent, name, reply, |p| {
            self.shared.fs.getattr(ctx, Some(p), None)
        })
    }

    fn forget(&self, _: &RequestContext<'_>, ino: Inode, nlookup: u64) {
        let _tree = self.shared.tree.read();
        self.forget_one(ino, nlookup)
    }

    fn batch_forget(&self, _: &RequestContext<'_>, nodes: &mut dyn Iterator<Item = (Inode, u64)>) {
        let _tree = self.shared.tree.read();
        for (ino, n) in nodes {
            self.forget_one(ino, n)
        }
    }

    fn getattr(&self, ctx: &RequestContext<'_>, ino: Inode, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.remember_notifier(ctx);
        if let Some(fh) = fh {
            self.revive(ctx, fh);
        }
        let _tree = self.shared.tree.read();
        let path = self.path(ino);
        let file = self.file_for(ino, fh, path.is_ok());
        let r = match (&path, &file) {
            // Removed and not open as a file (an open directory, say): what
            // it was, without links.
            (Err(Errno::ENOENT), None) => self
                .shared
                .table
                .get(ino)
                .and_then(|n| *lock(&n.last))
                .map(|a| FileAttr { nlink: 0, ..a })
                .ok_or(Errno::ENOENT),
            (Err(e), None) => Err(*e),
            _ => self
                .shared
                .fs
                .getattr(ctx, path.as_deref().ok(), file.as_deref().map(|f| &f.file)),
        };
        reply.result(r.map(|a| self.fix_attr(ino, a)))
    }

    fn setattr(&self, ctx: &RequestContext<'_>, ino: Inode, req: &SetattrRequest, reply: ReplyAttr) {
        if let Some(fh) = req.fh {
            self.revive(ctx, fh);
        }
        let _tree = self.shared.tree.read();
        let path = self.path(ino);
        let file = self.file_for(ino, req.fh, path.is_ok());
        self.show_node(ctx, ino);
        let r = match (&path, &file) {
            (Err(e), None) => Err(*e),
            _ => {
                let (fs, path, file) = (
                    &self.shared.fs,
                    path.as_deref().ok(),
                    file.as_deref().map(|f| &f.file),
                );
                setid::setattr(
                    ctx,
                    req,
                    || fs.getattr(ctx, path, file),
                    |r| fs.setattr(ctx, path, file, r),
                )
            }
        };
        reply.result(r.map(|a| self.fix_attr(ino, a)))
    }

    fn readlink(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyData) {
        let _tree = self.shared.tree.read();
        reply.result(self.path(ino).and_then(|p| self.shared.fs.readlink(ctx, &p)))
    }

    fn symlink(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        target: &CStr,
        reply: ReplyEntry,
    ) {
        self.new_entry(ctx, parent, name, reply, |p| {
            self.shared.fs.symlink(ctx, p, target)
        })
    }

    fn mknod(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: MknodRequest,
        reply: ReplyEntry,
    ) {
        self.new_entry(ctx, parent, name, reply, |p| self.shared.fs.mknod(ctx, p, req))
    }

    fn mkdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, mode: u32, reply: ReplyEntry) {
        self.new_entry(ctx, parent, name, reply, |p| self.shared.fs.mkdir(ctx, p, mode))
    }

    fn unlink(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        let _tree = self.shared.tree.read();
        let r = self
            .child_path(parent, name)
            .and_then(|p| match self.removed_already(ctx, &p) {
                true => Ok(()),
                false => self.shared.fs.unlink(ctx, &p),
            });
        if r.is_ok() {
            self.unname(parent, name.to_bytes());
        }
        reply.result(r)
    }

    fn rmdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        let _tree = self.shared.tree.read();
        let r = self
            .child_path(parent, name)
            .and_then(|p| match self.removed_already(ctx, &p) {
                true => Ok(()),
                false => self.shared.fs.rmdir(ctx, &p),
            });
        if r.is_ok() {
            self.unname(parent, name.to_bytes());
        }
        reply.result(r)
    }

    fn rename(&self, ctx: &RequestContext<'_>, req: &RenameRequest<'_>, reply: ReplyEmpty) {
        let _tree = self.shared.tree.write();
        let mut from = None;
        let r = (|| {
            let from = from.insert(self.child_path(req.parent, req.name)?);
            let to = self.child_path(req.newparent, req.newname)?;
            // Resent after a crash: done if the source is gone and the
            // target is there (the kernel holds both directories' locks).
            // An exchange leaves both names: carried out again, it would
            // swap back, so it is checked by nothing and not covered.
            if !req.flags.contains(RenameFlags::EXCHANGE)
                && self.removed_already(ctx, from)
                && self.shared.fs.getattr(ctx, Some(&to), None).is_ok()
            {
                return Ok(());
            }
            self.shared.fs.rename(ctx, from, &to, req.flags)
        })();
        // A source name the tree does not hold: the predecessor moved the
        // names already (it died after that, before answering), or the
        // name is a hard link's the kept tree did not keep. Either way the
        // target is not replaced when the source name still exists or is a
        // resent request's (renaming one link of a file onto another does
        // nothing): its node keeps its names.
        let moved_already = |ctx: &RequestContext<'_>| {
            ctx.replay() == Replay::MaybeDone
                || from
                    .as_ref()
                    .is_some_and(|f| self.shared.fs.getattr(ctx, Some(f), None).is_ok())
        };
        if r.is_ok()
            && !req.flags.contains(RenameFlags::EXCHANGE)
            && self
                .shared
                .table
                .get(req.parent)
                .is_some_and(|d| !lock(&d.children).contains_key(req.name.to_bytes()))
            && moved_already(ctx)
        {
            return reply.result(r);
        }
        if r.is_ok() {
            // Alone in the tree now: move the names.
            let (p, q) = (req.parent, req.newparent);
            let (name, newname) = (req.name.to_bytes(), req.newname.to_bytes());
            let take = |dir: Inode, n: &[u8]| {
                let d = self.shared.table.get(dir)?;
                lock(&d.children).remove(n)
            };
            let put = |dir: Inode, n: &[u8], child: (u64, u64), from: (Inode, &[u8])| {
                if let (Some(d), Some(node)) = (self.shared.table.get(dir), self.live(child)) {
                    node.rename(from.0.0, from.1, Some((dir.0, n)));
                    self.keep_name(child.0, child.1, &node);
                    lock(&d.children).insert(n.into(), child);
                }
            };
            let src = take(p, name);
            let dst = take(q, newname);
            match (src, dst) {
                // Two names of one file: rename did nothing.
                (Some(s), Some(d)) if s == d => {
                    put(p, name, s, (p, name));
                    put(q, newname, d, (q, newname));
                }
                (src, dst) => {
                    if req.flags.contains(RenameFlags::EXCHANGE) {
                        if let Some(d) = dst {
                            put(p, name, d, (q, newname));
                        }
                    } else if let Some((d, node)) = dst.and_then(|d| Some((d, self.live(d)?))) {
                        node.rename(q.0, newname, None);
                        self.keep_name(d.0, d.1, &node);
                    }
                    if let Some(s) = src {
                        put(q, newname, s, (p, name));
                    }
                }
            }
        }
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
        let _tree = self.shared.tree.read();
        let r = (|| {
            let from = self.path(ino)?;
            let to = self.child_path(newparent, newname)?;
            self.show_node(ctx, ino);
            let mut attr = match self.made_already(ctx, &to) {
                Some(a) => a,
                None => self.shared.fs.link(ctx, &from, &to)?,
            };
            // The new name leads to the same node (the kernel's inode, with
            // its cached pages and link count).
            let dir = self.node(newparent)?;
            let mut children = lock(&dir.children);
            let (node, generation) = self.shared.table.acquire_ino(ino).ok_or(Errno::ESTALE)?;
            let newname = newname.to_bytes();
            node.rename(newparent.0, newname, Some((newparent.0, newname)));
            self.keep_name(ino.0, generation, &node);
            children.insert(newname.into(), (ino.0, generation));
            drop(children);
            if attr.ino == 0 {
                attr.ino = ino.0;
            }
            self.remember(ino, &attr);
            Ok::<_, Errno>(Entry {
                ino,
                generation,
                attr,
                entry_ttl: self.ttl,
                attr_ttl: self.ttl,
            })
        })();
        reply.result(r)
    }

    fn open(&self, ctx: &RequestContext<'_>, ino: Inode, flags: OpenFlags, reply: ReplyOpen) {
        self.remember_notifier(ctx);
        let _tree = self.shared.tree.read();
        let r = (|| {
            let node = self.node(ino)?;
            let path = self.path(ino)?;
            let fs = &self.shared.fs;
            let opened = fs.open(ctx, &path, flags)?;
            if flags.bits() & libc::O_TRUNC != 0 && ctx.open_in_flags().contains(OpenInFlags::KILL_SUIDGID) {
                let (path, file) = (Some(path.as_path()), Some(&opened.file));
                let cleared = setid::clear(
                    ctx,
                    Change::Written,
                    None,
                    || fs.getattr(ctx, path, file),
                    |r| fs.setattr(ctx, path, file, r),
                );
                if let Err(e) = cleared {
                    fs.release(ctx, opened.file);
                    return Err(e);
                }
            }
            Ok::<_, Errno>(self.store(ino, flags, node, opened))
        })();
        reply.answer(r)
    }

    fn create(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: CreateRequest,
        reply: ReplyCreate,
    ) {
        let _tree = self.shared.tree.read();
        let r = (|| {
            let path = self.child_path(parent, name)?;
            let (attr, opened) = match ctx.replay() {
                // Resent after a crash: a file the dead daemon made is
                // opened as it is (the kernel holds the directory's lock,
                // so the name is the one the request made).
                Replay::MaybeDone if self.shared.fs.getattr(ctx, Some(&path), None).is_ok() => {
                    let flags = OpenFlags::from_bits(
                        req.flags.bits() & !(libc::O_EXCL | libc::O_TRUNC | libc::O_CREAT),
                    );
                    let opened = self.shared.fs.open(ctx, &path, flags)?;
                    (
                        self.shared.fs.getattr(ctx, Some(&path), Some(&opened.file))?,
                        opened,
                    )
                }
                _ => self.shared.fs.create(ctx, &path, req)?,
            };
            let entry = self.enter(parent, name.to_bytes(), attr)?;
            let node = self.node(entry.ino)?;
            Ok::<_, Errno>((entry, self.store(entry.ino, req.flags, node, opened)))
        })();
        reply.answer(r.map(|(entry, open)| Created::new(entry, open)))
    }

    fn read(&self, ctx: &RequestContext<'_>, _: Inode, fh: FileHandle, req: ReadRequest, reply: ReplyData) {
        self.revive(ctx, fh);
        match self.file(fh) {
            Ok(f) => self.shared.fs.read(ctx, &f.file, req, reply),
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
        self.revive(ctx, fh);
        on_open_file(&self.shared.files, fh, reply, |f| {
            if req.write_flags.contains(WriteFlags::KILL_SUIDGID) {
                self.clear_setid(ctx, Change::Written, fh, &f.file)?;
            }
            if self.shared.kept.is_some()
                && req.flags.bits() & libc::O_APPEND != 0
                && self.appended_already(ctx, &f.file, req.data.len() as u64)
            {
                return Ok(req.data.len() as u32);
            }
            self.shared.fs.write(ctx, &f.file, req)
        })
    }

    fn flush(&self, ctx: &RequestContext<'_>, _: Inode, fh: FileHandle, owner: LockOwner, reply: ReplyEmpty) {
        self.revive(ctx, fh);
        on_open_file(&self.shared.files, fh, reply, |f| {
            self.shared.fs.flush(ctx, &f.file, owner)
        })
    }

    fn fsync(&self, ctx: &RequestContext<'_>, _: Inode, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        self.revive(ctx, fh);
        on_open_file(&self.shared.files, fh, reply, |f| {
            self.shared.fs.fsync(ctx, &f.file, datasync)
        })
    }

    fn fallocate(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: FallocateRequest,
        reply: ReplyEmpty,
    ) {
        self.revive(ctx, fh);
        on_open_file(&self.shared.files, fh, reply, |f| {
            self.shared.fs.fallocate(ctx, &f.file, req)?;
            if self.clear_setid(ctx, Change::Modified, fh, &f.file)? {
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
        self.revive(ctx, fh);
        on_open_file(&self.shared.files, fh, reply, |f| {
            self.shared.fs.lseek(ctx, &f.file, req)
        })
    }

    fn copy_file_range(&self, ctx: &RequestContext<'_>, req: &CopyFileRangeRequest, reply: ReplyCopy) {
        self.revive(ctx, req.fh_in);
        self.revive(ctx, req.fh_out);
        let r = (|| {
            let (from, to) = (self.file(req.fh_in)?, self.file(req.fh_out)?);
            let n = self.shared.fs.copy_file_range(
                ctx,
                &from.file,
                req.off_in,
                &to.file,
                req.off_out,
                req.len,
            )?;
            if n > 0 && self.clear_setid(ctx, Change::Modified, req.fh_out, &to.file)? {
                setid::forget_cached_mode(ctx, req.ino_out);
            }
            Ok::<_, Errno>(n)
        })();
        reply.result(r)
    }

    fn release(
        &self,
        ctx: &RequestContext<'_>,
        _: Inode,
        fh: FileHandle,
        _: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        let Some(entry) = self.shared.files.remove(fh.0) else {
            // A file a predecessor left open and nobody used since.
            let left = if self.shared.any_pending.load(Ordering::Acquire)
                && let Some(rec) = lock(&self.shared.pending).remove(&fh.0)
                && let Some(t) = &self.shared.kept
            {
                t.closed(rec.slot);
                true
            } else {
                false
            };
            return if left {
                reply.ok()
            } else {
                reply.error(Errno::EBADF)
            };
        };
        if let Some(t) = &self.shared.kept {
            let slot = entry.record.load(Ordering::Acquire);
            if slot != usize::MAX {
                t.closed(slot);
            }
        }
        lock(&entry.node.open).retain(|&f| f != fh.0);
        lock(&entry.node.io).detach(entry.passthrough);
        reply.ok();
        // Requests still running with this file hold their own reference;
        // the last one out hands the file back.
        if let Ok(e) = Arc::try_unwrap(entry) {
            self.shared.fs.release(ctx, e.file);
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
        let _tree = self.shared.tree.read();
        let r = (|| {
            let path = self.path(ino)?;
            let dir = self.node(ino)?;
            let me = match self.shared.table.get(ino).and_then(|n| *lock(&n.last)) {
                Some(_) => self.st_ino(ino),
                None => match self.shared.fs.getattr(ctx, Some(&path), None) {
                    Ok(a) => self.fix_attr(ino, a).1.ino,
                    Err(_) => ino.0,
                },
            };
            if crate::layers::core::add_dots(&mut reply, Inode(me), offset).is_full() {
                return Ok(());
            }
            let mut ino_of = |name: &[u8]| {
                let known = lock(&dir.children).get(name).copied();
                if let Some(k) = known.filter(|&k| self.live(k).is_some()) {
                    return self.st_ino(Inode(k.0));
                }
                let child = path.join(OsStr::from_bytes(name));
                match self.shared.fs.getattr(ctx, Some(&child), None) {
                    Ok(a) if a.ino != 0 => a.ino,
                    _ => UNKNOWN_INO,
                }
            };
            let mut fill = PathDirFill {
                reply: &mut reply,
                full: false,
                ino_of: &mut ino_of,
            };
            self.shared
                .fs
                .readdir(ctx, &path, offset.saturating_sub(2), &mut fill)
        })();
        reply.result(r)
    }

    fn getxattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, size: u32, reply: ReplyXattr) {
        let _tree = self.shared.tree.read();
        let v = self
            .path(ino)
            .and_then(|p| self.shared.fs.getxattr(ctx, &p, name));
        SizedXattr(reply, size).answer(v)
    }

    fn listxattr(&self, ctx: &RequestContext<'_>, ino: Inode, size: u32, reply: ReplyXattr) {
        let _tree = self.shared.tree.read();
        let v = self.path(ino).and_then(|p| self.shared.fs.listxattr(ctx, &p));
        let admin = || ctx.caller().holds_capability(crate::credentials::cap::SYS_ADMIN);
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
        let _tree = self.shared.tree.read();
        self.show_node(ctx, ino);
        let r = self.path(ino).and_then(|p| {
            let fs = &self.shared.fs;
            match fs.setxattr(ctx, &p, name, req.value, req.flags) {
                // Resent after a crash, an exclusive set that finds the
                // attribute holding its value was done by the dead daemon
                // (the kernel holds the inode's lock through the request).
                Err(Errno::EEXIST)
                    if req.flags & libc::XATTR_CREATE != 0
                        && ctx.replay() == Replay::MaybeDone
                        && fs.getxattr(ctx, &p, name).is_ok_and(|v| v == req.value) =>
                {
                    Ok(())
                }
                r => r,
            }
        });
        reply.result(r)
    }

    fn removexattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, reply: ReplyEmpty) {
        let _tree = self.shared.tree.read();
        self.show_node(ctx, ino);
        let r = self
            .path(ino)
            .and_then(|p| match self.shared.fs.removexattr(ctx, &p, name) {
                // Resent after a crash and gone: the dead daemon removed it.
                Err(Errno::ENODATA) if ctx.replay() == Replay::MaybeDone => Ok(()),
                r => r,
            });
        reply.result(r)
    }

    fn statfs(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyStatfs) {
        let _tree = self.shared.tree.read();
        let path = self.path(ino).unwrap_or_else(|_| PathBuf::from("/"));
        reply.result(self.shared.fs.statfs(ctx, &path))
    }
}
