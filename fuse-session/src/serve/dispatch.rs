//! Operation → [`Filesystem`] method, in one match.
//!
//! `dispatch` parses one received buffer (no copy), handles what the session
//! itself answers (INTERRUPT, NOTIFY_REPLY, a second INIT, DESTROY, DAX
//! mappings, CUSE), and calls the filesystem for the rest with a typed reply
//! handle. A malformed request gets an error reply and a log line; a
//! panicking handler is caught and its dropped handle answers EIO.

use crate::conn::WorkerCore;
use crate::context::RequestContext;
use crate::filesystem::Filesystem;
use crate::journal::{Begin, Replay};
use crate::ops::*;
use crate::payload::PipePayload;
use crate::reply::*;
use crate::types::{FileHandle, Inode, LockOwner, PollHandle};
use fuse_proto::flags::{
    FsyncFlags, GetattrFlags, IoctlFlags, LkFlags, PollFlags, ReadFlags, ReleaseFlags, SetxattrFlags,
    WriteFlags,
};
use fuse_proto::request::peek_unique;
use fuse_proto::{Errno, Opcode, Operation, ParseError, Reply, Request};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Serves one request that arrived in one piece on `worker`'s channel
/// (a `/dev/fuse` read).
pub(crate) fn dispatch<F: Filesystem>(fs: &F, worker: &Arc<WorkerCore>, buf: &[u8]) {
    match Request::parse_with(buf, &worker.shared.parse) {
        Ok(req) => serve(fs, worker, req),
        Err(e) => malformed(
            worker,
            fuse_proto::request::peek_opcode(buf),
            peek_unique(buf),
            buf.len(),
            e,
        ),
    }
}

/// Serves one parsed request, whichever transport delivered it; the reply
/// goes back on `worker`'s channel.
pub(crate) fn serve<F: Filesystem>(fs: &F, worker: &Arc<WorkerCore>, req: Request<'_>) {
    serve_with(fs, worker, req, None)
}

/// Serves a WRITE whose header and `fuse_write_in` are `head` and whose
/// payload waits in `payload`'s pipe ([`crate::recv_pipe`]).
pub(crate) fn serve_write_in_pipe<'a, F: Filesystem>(
    fs: &F,
    worker: &Arc<WorkerCore>,
    head: &[u8],
    payload: &'a PipePayload<'a>,
) {
    use zerocopy::FromBytes;
    let parsed = fuse_proto::abi::InHeader::read_from_prefix(head)
        .ok()
        .and_then(|(header, rest)| {
            let (arg, _) = fuse_proto::abi::WriteIn::read_from_prefix(rest).ok()?;
            Some((header, arg))
        });
    let Some((header, arg)) = parsed else {
        // Checked by the receive path before it left the payload.
        log::error!("internal: a WRITE left in the pipe without its header");
        if let Some(unique) = peek_unique(head) {
            worker.shared.stats.count_error(worker.index, Opcode::Write);
            worker.send_reply(Opcode::Write, unique, &Reply::error(unique, Errno::EIO));
        }
        return;
    };
    worker.shared.stats.count_spliced(worker.index);
    let req = Request {
        header,
        op: Operation::Write { arg, data: &[] },
        extensions: Default::default(),
    };
    serve_with(fs, worker, req, Some(payload))
}

/// [`serve`], with the payload of a WRITE in a pipe rather than in `req`.
fn serve_with<'a, F: Filesystem>(
    fs: &F,
    worker: &Arc<WorkerCore>,
    req: Request<'a>,
    piped: Option<&'a PipePayload<'a>>,
) {
    let unique = req.header.unique;
    let opcode = req.op.opcode();
    let all = &worker.shared.stats;
    match req.op {
        Operation::Interrupt { arg } => {
            all.count_only(worker.index, opcode);
            let op_of = |job: &crate::conn::Job| {
                fuse_proto::request::peek_opcode(job.msg())
                    .and_then(|n| Opcode::from_u32(n).ok())
                    .unwrap_or(Opcode::Init)
            };
            // RELEASE and RELEASEDIR are never cancelled: the kernel does not
            // send them again, so the filesystem would keep the file open
            // for good. They stay parked (the INTERRUPT gets EAGAIN below).
            let cancellable =
                |job: &crate::conn::Job| !matches!(op_of(job), Opcode::Release | Opcode::Releasedir);
            if let Some(job) = worker.shared.pool.remove_job_if(arg.unique, cancellable) {
                // Still parked for a worker: it never started, so it ends here.
                let op = op_of(&job);
                all.count_error(job.core.index, op);
                job.core
                    .send_reply(op, job.unique, &Reply::error(job.unique, Errno::EINTR));
                return;
            }
            if !worker.shared.pending.interrupt(&worker.shared.tables, arg.unique) {
                // Target not (yet) in flight: ask the kernel to send the
                // INTERRUPT again later.
                worker.send_reply(opcode, unique, &Reply::error(unique, Errno::EAGAIN));
            }
            return;
        }
        Operation::NotifyReply { arg, data } => {
            all.count_only(worker.index, opcode);
            if !worker.shared.notifier.deliver_retrieve(unique, arg.offset, data) {
                log::warn!("NOTIFY_REPLY {unique} matches no RETRIEVE in progress");
            }
            return;
        }
        Operation::Forget { arg } => {
            all.count_only(worker.index, opcode);
            let ctx = RequestContext::new(
                req.header,
                None,
                req.extensions,
                worker,
                crate::interrupt::Slot::NONE,
            );
            guarded(worker, opcode, unique, || {
                fs.forget(&ctx, Inode(req.header.nodeid), arg.nlookup)
            });
            return;
        }
        Operation::BatchForget { forgets, .. } => {
            all.count_only(worker.index, opcode);
            let ctx = RequestContext::new(
                req.header,
                None,
                req.extensions,
                worker,
                crate::interrupt::Slot::NONE,
            );
            let mut it = forgets.iter().map(|f| (Inode(f.nodeid), f.nlookup));
            guarded(worker, opcode, unique, || fs.batch_forget(&ctx, &mut it));
            return;
        }
        _ => {}
    }

    if let Some(owner) = worker.shared.deny_others {
        let uid = req.header.uid;
        if uid != owner && uid != 0 && !open_file_op(opcode) {
            count_refused(worker, opcode);
            worker.send_reply(opcode, unique, &Reply::error(unique, Errno::EACCES));
            return;
        }
    }

    let mut replay = Replay::Fresh;
    let mut journal = None;
    // Under a keeper, a request that changes state gets a journal slot: one
    // sent again after a crash must not be carried out twice.
    if let Some(j) = worker.shared.journal.as_deref()
        && opcode.changes_state()
    {
        match j.begin(unique, opcode) {
            Begin::New(i) => journal = Some((i, None)),
            Begin::Started(i, note) => {
                replay = Replay::MaybeDone;
                journal = Some((i, note));
            }
            Begin::Answered(error, body) => {
                // The predecessor answered it and died before the kernel
                // had the answer: the same answer again, not the effect.
                log::debug!("{opcode} {unique:#x}: answered from the journal");
                all.count_only(worker.index, opcode);
                let msg = match Errno::new(-error) {
                    Ok(e) if error < 0 => Reply::error(unique, e),
                    _ => Reply::data(unique, &body).unwrap_or_else(|_| Reply::error(unique, Errno::EIO)),
                };
                worker.send_reply(opcode, unique, &msg);
                return;
            }
            Begin::Untracked => {}
        }
    }

    let table = worker.table();
    let slot = table.register(unique);
    worker.shared.pending.check_new(table, &slot, unique);
    all.start(worker.index, opcode);
    let mut core = ReplyCore::new(unique, opcode, worker.clone(), slot);
    if let Some((i, _)) = journal {
        core.set_journal(i);
    }
    if req.op.is_atomic_open() {
        core.set_atomic_open();
    }
    if kills_setid(&req.op) {
        core.set_mode_stale(req.header.nodeid);
    }
    let umask = match req.op {
        Operation::Mknod { arg, .. } => Some(arg.umask),
        Operation::Mkdir { arg, .. } => Some(arg.umask),
        Operation::Create { arg, .. }
        | Operation::Tmpfile { arg, .. }
        | Operation::AtomicOpen { arg, .. } => Some(arg.umask),
        _ => None,
    };
    if umask.is_some() {
        // What the filesystem creates gets the mode asked for, not less
        // the daemon's own umask too.
        crate::umask::clear_for_this_thread();
    }
    let open_in = match req.op {
        Operation::Open { arg } => arg.open_flags,
        Operation::Create { arg, .. }
        | Operation::Tmpfile { arg, .. }
        | Operation::AtomicOpen { arg, .. } => arg.open_flags,
        _ => 0,
    };
    let ctx = RequestContext::new(req.header, umask, req.extensions, worker, slot)
        .with_open_in(fuse_proto::flags::OpenInFlags::from_bits_retain(open_in))
        .with_journal(replay, journal);
    let ino = Inode(req.header.nodeid);
    guarded(worker, opcode, unique, || {
        call(fs, &ctx, ino, req.op, core, piped)
    });
}

/// The RELEASE or RELEASEDIR `arg` as the traits get it.
fn release_request(arg: &fuse_proto::abi::ReleaseIn) -> ReleaseRequest {
    let rf = ReleaseFlags::from_bits_retain(arg.release_flags);
    ReleaseRequest {
        flags: open_flags(arg.flags),
        lock_owner: Some(LockOwner(arg.lock_owner)),
        flush: rf.contains(ReleaseFlags::FLUSH),
        flock_release: rf.contains(ReleaseFlags::FLOCK_UNLOCK),
    }
}

/// Operations on files the caller already holds open, which `allow_root`
/// does not restrict (the open itself was checked).
fn open_file_op(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Read
            | Opcode::Write
            | Opcode::Fsync
            | Opcode::Release
            | Opcode::Readdir
            | Opcode::Readdirplus
            | Opcode::Fsyncdir
            | Opcode::Releasedir
            | Opcode::Getlk
            | Opcode::Setlk
            | Opcode::Setlkw
            | Opcode::Ioctl
            | Opcode::Poll
            | Opcode::Flush
            | Opcode::Destroy
    )
}

fn count_refused(worker: &WorkerCore, op: Opcode) {
    worker.shared.stats.count_error(worker.index, op);
}

/// Runs a handler, turning a panic into a log line and an entry of the
/// session's [handler panics](crate::stats::HandlerPanic) (its reply
/// handle, dropped while unwinding, answers EIO).
fn guarded(worker: &WorkerCore, opcode: Opcode, unique: u64, f: impl FnOnce()) {
    if let Err(p) = catch_unwind(AssertUnwindSafe(f)) {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic".into());
        log::error!("{opcode} handler for request {unique} panicked: {what}");
        worker.shared.panics.record(crate::stats::HandlerPanic {
            opcode,
            unique,
            message: what,
        });
    }
}

/// Answers a request that could not be parsed (`len` bytes; its opcode
/// number and unique as far as they could be read).
pub(crate) fn malformed(
    worker: &WorkerCore,
    opcode: Option<u32>,
    unique: Option<u64>,
    len: usize,
    e: ParseError,
) {
    let opcode = opcode.and_then(|n| Opcode::from_u32(n).ok());
    log::error!("malformed request ({len} bytes): {e}");
    if let Some(op) = opcode {
        worker.shared.stats.count_error(worker.index, op);
        if !op.expects_reply() {
            return;
        }
    }
    let Some(unique) = unique else { return };
    let errno = match e {
        ParseError::UnknownOpcode { .. } => Errno::ENOSYS,
        _ => Errno::EIO,
    };
    worker.send_reply(
        opcode.unwrap_or(Opcode::Init),
        unique,
        &Reply::error(unique, errno),
    );
}

/// Whether the kernel asks the filesystem to clear set-ID bits with this
/// request (`HANDLE_KILLPRIV_V2`) and answers it without new attributes,
/// so that it would go on showing (and exec honouring) the bits it cached:
/// a WRITE with `FUSE_WRITE_KILL_SUIDGID`, an OPEN with O_TRUNC and
/// `FUSE_OPEN_KILL_SUIDGID`. SETATTR and CREATE answer with the new mode.
fn kills_setid(op: &Operation<'_>) -> bool {
    use fuse_proto::flags::{OpenInFlags, WriteFlags};
    match op {
        Operation::Write { arg, .. } => {
            WriteFlags::from_bits_retain(arg.write_flags).contains(WriteFlags::KILL_SUIDGID)
        }
        Operation::Open { arg } => {
            arg.flags & libc::O_TRUNC as u32 != 0
                && OpenInFlags::from_bits_retain(arg.open_flags).contains(OpenInFlags::KILL_SUIDGID)
        }
        _ => false,
    }
}

fn open_flags(flags: u32) -> OpenFlags {
    OpenFlags::from_bits(flags as i32)
}

/// `core` of an open with `flags`, marked if the caller asked for `O_DIRECT`.
fn o_direct(mut core: ReplyCore, flags: OpenFlags) -> ReplyCore {
    core.set_o_direct(flags.direct());
    core
}

fn owner_if(set: bool, owner: u64) -> Option<LockOwner> {
    set.then_some(LockOwner(owner))
}

fn call<'a, F: Filesystem>(
    fs: &F,
    ctx: &RequestContext<'_>,
    ino: Inode,
    op: Operation<'a>,
    core: ReplyCore,
    piped: Option<&'a PipePayload<'a>>,
) {
    use Operation as O;
    match op {
        O::Lookup { name } => fs.lookup(ctx, ino, name, ReplyEntry::new(core)),
        O::Getattr { arg } => {
            let fh = GetattrFlags::from_bits_retain(arg.getattr_flags)
                .contains(GetattrFlags::FH)
                .then_some(FileHandle(arg.fh));
            fs.getattr(ctx, ino, fh, ReplyAttr::new(core))
        }
        O::Setattr { arg } => fs.setattr(ctx, ino, &SetattrRequest::from_raw(&arg), ReplyAttr::new(core)),
        O::Readlink => fs.readlink(ctx, ino, ReplyData::new(core)),
        O::Symlink { name, target } => fs.symlink(ctx, ino, name, target, ReplyEntry::new(core)),
        O::Mknod { arg, name } => {
            let req = MknodRequest {
                mode: arg.mode,
                rdev: arg.rdev,
            };
            fs.mknod(ctx, ino, name, req, ReplyEntry::new(core))
        }
        O::Mkdir { arg, name } => fs.mkdir(ctx, ino, name, arg.mode, ReplyEntry::new(core)),
        O::Unlink { name } => fs.unlink(ctx, ino, name, ReplyEmpty::new(core)),
        O::Rmdir { name } => fs.rmdir(ctx, ino, name, ReplyEmpty::new(core)),
        O::Rename { arg, name, newname } => {
            let req = RenameRequest {
                parent: ino,
                name,
                newparent: Inode(arg.newdir),
                newname,
                flags: RenameFlags::empty(),
            };
            fs.rename(ctx, &req, ReplyEmpty::new(core))
        }
        O::Rename2 { arg, name, newname } => {
            let req = RenameRequest {
                parent: ino,
                name,
                newparent: Inode(arg.newdir),
                newname,
                flags: RenameFlags::from_bits_retain(arg.flags),
            };
            fs.rename(ctx, &req, ReplyEmpty::new(core))
        }
        O::Link { arg, name } => fs.link(ctx, Inode(arg.oldnodeid), ino, name, ReplyEntry::new(core)),
        O::Open { arg } => {
            let flags = open_flags(arg.flags);
            fs.open(ctx, ino, flags, ReplyOpen::new(o_direct(core, flags)))
        }
        O::Read { arg } => {
            let req = ReadRequest {
                offset: arg.offset,
                size: arg.size,
                flags: open_flags(arg.flags),
                lock_owner: owner_if(
                    ReadFlags::from_bits_retain(arg.read_flags).contains(ReadFlags::LOCKOWNER),
                    arg.lock_owner,
                ),
            };
            fs.read(ctx, ino, FileHandle(arg.fh), req, ReplyData::new(core))
        }
        O::Write { arg, data } => {
            let write_flags = WriteFlags::from_bits_retain(arg.write_flags);
            let data = match piped {
                Some(p) => WriteData::in_pipe(p),
                None => WriteData::from(data),
            };
            let req = WriteRequest {
                offset: arg.offset,
                data,
                write_flags,
                flags: open_flags(arg.flags),
                lock_owner: owner_if(write_flags.contains(WriteFlags::LOCKOWNER), arg.lock_owner),
            };
            fs.write(ctx, ino, FileHandle(arg.fh), req, ReplyWrite::new(core))
        }
        O::Statfs => fs.statfs(ctx, ino, ReplyStatfs::new(core)),
        O::Release { arg } => fs.release(
            ctx,
            ino,
            FileHandle(arg.fh),
            release_request(&arg),
            ReplyEmpty::new(core),
        ),
        O::Fsync { arg } => {
            let ds = FsyncFlags::from_bits_retain(arg.fsync_flags).contains(FsyncFlags::FDATASYNC);
            fs.fsync(ctx, ino, FileHandle(arg.fh), ds, ReplyEmpty::new(core))
        }
        O::Setxattr { arg, name, value } => {
            let req = SetxattrRequest {
                value,
                flags: arg.flags as i32,
                setxattr_flags: SetxattrFlags::from_bits_retain(arg.setxattr_flags),
            };
            fs.setxattr(ctx, ino, name, req, ReplyEmpty::new(core))
        }
        O::Getxattr { arg, name } => fs.getxattr(ctx, ino, name, arg.size, ReplyXattr::new(core)),
        O::Listxattr { arg } => fs.listxattr(ctx, ino, arg.size, ReplyXattr::new(core)),
        O::Removexattr { name } => fs.removexattr(ctx, ino, name, ReplyEmpty::new(core)),
        O::Flush { arg } => fs.flush(
            ctx,
            ino,
            FileHandle(arg.fh),
            LockOwner(arg.lock_owner),
            ReplyEmpty::new(core),
        ),
        O::Opendir { arg } => fs.opendir(ctx, ino, open_flags(arg.flags), ReplyOpen::new(core)),
        O::Readdir { arg } => fs.readdir(
            ctx,
            ino,
            FileHandle(arg.fh),
            arg.offset,
            ReplyDirectory::new(core, arg.size),
        ),
        O::Readdirplus { arg } => fs.readdirplus(
            ctx,
            ino,
            FileHandle(arg.fh),
            arg.offset,
            ReplyDirectoryPlus::new(core, arg.size),
        ),
        O::Releasedir { arg } => fs.releasedir(
            ctx,
            ino,
            FileHandle(arg.fh),
            release_request(&arg),
            ReplyEmpty::new(core),
        ),
        O::Fsyncdir { arg } => {
            let ds = FsyncFlags::from_bits_retain(arg.fsync_flags).contains(FsyncFlags::FDATASYNC);
            fs.fsyncdir(ctx, ino, FileHandle(arg.fh), ds, ReplyEmpty::new(core))
        }
        O::Getlk { arg } => {
            let req = LockRequest {
                owner: LockOwner(arg.owner),
                lock: arg.lk.into(),
                sleep: false,
                flock: LkFlags::from_bits_retain(arg.lk_flags).contains(LkFlags::FLOCK),
            };
            fs.getlk(ctx, ino, FileHandle(arg.fh), req, ReplyLock::new(core))
        }
        O::Setlk { arg } | O::Setlkw { arg } => {
            let req = LockRequest {
                owner: LockOwner(arg.owner),
                lock: arg.lk.into(),
                sleep: matches!(op, O::Setlkw { .. }),
                flock: LkFlags::from_bits_retain(arg.lk_flags).contains(LkFlags::FLOCK),
            };
            fs.setlk(ctx, ino, FileHandle(arg.fh), req, ReplyEmpty::new(core))
        }
        O::Access { arg } => fs.access(ctx, ino, arg.mask as i32, ReplyEmpty::new(core)),
        O::Create { arg, name } => {
            let req = CreateRequest {
                mode: arg.mode,
                flags: open_flags(arg.flags),
            };
            fs.create(ctx, ino, name, req, ReplyCreate::new(o_direct(core, req.flags)))
        }
        O::AtomicOpen { arg, name } => {
            let req = CreateRequest {
                mode: arg.mode,
                flags: open_flags(arg.flags),
            };
            fs.atomic_open(ctx, ino, name, req, ReplyCreate::new(o_direct(core, req.flags)))
        }
        O::Tmpfile { arg, .. } => {
            let req = CreateRequest {
                mode: arg.mode,
                flags: open_flags(arg.flags),
            };
            fs.tmpfile(ctx, ino, req, ReplyCreate::new(o_direct(core, req.flags)))
        }
        O::Bmap { arg } => fs.bmap(ctx, ino, arg.blocksize, arg.block, ReplyBmap::new(core)),
        O::Ioctl { arg, data } => {
            let req = IoctlRequest {
                flags: IoctlFlags::from_bits_retain(arg.flags),
                cmd: arg.cmd,
                arg: arg.arg,
                in_data: data,
                out_size: arg.out_size,
            };
            fs.ioctl(ctx, ino, FileHandle(arg.fh), req, ReplyIoctl::new(core))
        }
        O::Poll { arg } => {
            let req = PollRequest {
                kh: PollFlags::from_bits_retain(arg.flags)
                    .contains(PollFlags::SCHEDULE_NOTIFY)
                    .then_some(PollHandle(arg.kh)),
                events: arg.events,
            };
            fs.poll(ctx, ino, FileHandle(arg.fh), req, ReplyPoll::new(core))
        }
        O::Fallocate { arg } => {
            let req = FallocateRequest {
                offset: arg.offset,
                length: arg.length,
                mode: arg.mode as i32,
            };
            fs.fallocate(ctx, ino, FileHandle(arg.fh), req, ReplyEmpty::new(core))
        }
        O::Lseek { arg } => {
            let req = LseekRequest {
                offset: arg.offset,
                whence: arg.whence as i32,
            };
            fs.lseek(ctx, ino, FileHandle(arg.fh), req, ReplyLseek::new(core))
        }
        O::CopyFileRange { arg } | O::CopyFileRange64 { arg } => {
            let req = CopyFileRangeRequest {
                ino_in: ino,
                fh_in: FileHandle(arg.fh_in),
                off_in: arg.off_in,
                ino_out: Inode(arg.nodeid_out),
                fh_out: FileHandle(arg.fh_out),
                off_out: arg.off_out,
                len: arg.len,
                flags: arg.flags,
            };
            fs.copy_file_range(ctx, &req, ReplyCopy::new(core))
        }
        O::Statx { arg } => {
            let fh = GetattrFlags::from_bits_retain(arg.getattr_flags)
                .contains(GetattrFlags::FH)
                .then_some(FileHandle(arg.fh));
            let req = StatxRequest {
                flags: arg.sx_flags,
                mask: arg.sx_mask,
            };
            fs.statx(ctx, ino, fh, req, ReplyStatx::new(core))
        }
        O::Syncfs { .. } => fs.syncfs(ctx, ino, ReplyEmpty::new(core)),
        O::Destroy => {
            let w = core.worker();
            if !w.shared.destroyed.swap(true, Ordering::AcqRel) {
                fs.destroy();
            }
            w.shared.shutdown.store(true, Ordering::Release);
            ReplyEmpty::new(core).ok()
        }
        O::Init { arg } if ctx.is_resent() => answer_resent_init(fs, core, &arg),
        O::Init { .. } => {
            log::error!("INIT received on a session that is already initialised; answering EIO");
            ReplyEmpty::new(core).error(Errno::EIO)
        }
        O::Setupmapping { .. } | O::Removemapping { .. } => {
            // DAX windows exist only for virtio-fs devices, never on /dev/fuse.
            ReplyEmpty::new(core).error(Errno::ENOSYS)
        }
        O::CuseInit { .. } => {
            log::error!("CUSE_INIT on a FUSE session; answering ENOSYS");
            ReplyEmpty::new(core).error(Errno::ENOSYS)
        }
        O::Interrupt { .. } | O::NotifyReply { .. } | O::Forget { .. } | O::BatchForget { .. } => {
            // Handled in `dispatch` before a reply handle exists.
            unreachable_reply(core)
        }
        _ => ReplyEmpty::new(core).error(Errno::ENOSYS),
    }
}

/// An INIT sent again to a session that took its connection over: the
/// predecessor reported what it negotiated and died before its answer
/// reached the kernel. The filesystem negotiates again from the same offer;
/// the same program gives the same answer, which is sent.
fn answer_resent_init<F: Filesystem>(fs: &F, core: ReplyCore, arg: &fuse_proto::abi::InitIn) {
    let w = core.worker();
    let had = w.negotiated();
    let mut cfg = crate::init::InitConfig::new(arg);
    cfg.default_permissions = had.default_permissions;
    if let Err(e) = fs.init(&mut cfg) {
        return ReplyEmpty::new(core).error(e);
    }
    let (n, out) = crate::init::negotiate(&cfg, false, w.shared.parse.atomic_open);
    if n.flags != had.flags || n.minor != had.minor || n.max_write != had.max_write {
        log::error!(
            "INIT sent again negotiates otherwise than the predecessor reported ({:?} against {:?}); answering as now",
            n.flags,
            had.flags
        );
    } else {
        log::info!("INIT sent again after the predecessor died before answering it; answered as negotiated");
    }
    let unique = core.unique();
    core.send_raw(&Reply::init(unique, &out, arg.minor));
}

fn unreachable_reply(core: ReplyCore) {
    log::error!("internal: no-reply opcode reached the reply path");
    ReplyEmpty::new(core).error(Errno::EIO)
}
