//! Set-ID bits in the node and path layers: they ask for
//! `HANDLE_KILLPRIV_V2`, which leaves clearing set-user-ID and
//! set-group-ID bits to the filesystem, and do that for the filesystems
//! they serve, through those filesystems' own GETATTR and SETATTR (a
//! change of the permission bits alone). That is what lets the session
//! answer their `O_DIRECT` opens with `DIRECT_IO | PARALLEL_DIRECT_WRITES`
//! ([`crate::Negotiated::o_direct_flags`]): a `DIRECT_IO` write only flags
//! the request, it never goes through the kernel's own clearing.
//!
//! What the kernel flags, and the rule applied (the VFS's): a WRITE with
//! `FUSE_WRITE_KILL_SUIDGID`, a truncating SETATTR and an `O_TRUNC` OPEN
//! with `KILL_SUIDGID` (the caller lacks `CAP_FSETID`) drop S_ISUID, and
//! S_ISGID where it means set-group-ID (group execute set) or the caller is
//! not in the file's group; a chown (`FATTR_KILL_SUIDGID` with a new owner
//! or group) drops S_ISUID, and S_ISGID where it means set-group-ID or the
//! caller may keep it neither for the old group nor, when the mode is
//! rewritten, for the new one. FALLOCATE and COPY_FILE_RANGE come without a
//! flag: the layers clear the bits when the caller lacks `CAP_FSETID`.
//! Only regular files are touched. Setting the mode is the filesystem's
//! SETATTR; an error there fails the request (the write is not made with
//! the bits still set).

use crate::attr::{FileAttr, FileKind};
use crate::context::RequestContext;
use crate::credentials::cap;
use crate::init::InitConfig;
use crate::notify::NotifyError;
use crate::ops::SetattrRequest;
use crate::types::{FileHandle, Inode};
use fuse_proto::Errno;
use fuse_proto::abi::SetattrIn;
use fuse_proto::flags::{InitFlags, SetattrValid};

/// The change after which set-ID bits may have to go.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Change {
    /// Content or size changed by a caller without `CAP_FSETID`.
    Written,
    /// Owner or group changed; the file's group was `old_gid`.
    Chowned { old_gid: u32 },
    /// Content or size changed by a request the kernel sends without a
    /// kill flag (FALLOCATE, COPY_FILE_RANGE): as `Written` when the caller
    /// lacks `CAP_FSETID` (looked up only for a file with the bits).
    Modified,
}

/// Asks for `HANDLE_KILLPRIV_V2` when the kernel offers it: the layer then
/// clears the bits itself (see the module docs).
pub(crate) fn want(config: &mut InitConfig) {
    if config.offered().contains(InitFlags::HANDLE_KILLPRIV_V2) {
        config.want(InitFlags::HANDLE_KILLPRIV_V2);
    }
}

/// The permission bits a regular file with attributes `attr` keeps after
/// `change` by the caller of `ctx`, when the change drops any set-ID bit;
/// `None` when it keeps them all.
pub(crate) fn kept(ctx: &RequestContext<'_>, attr: &FileAttr, change: Change) -> Option<u16> {
    const SUID: u16 = libc::S_ISUID as u16;
    const SGID: u16 = libc::S_ISGID as u16;
    const XGRP: u16 = libc::S_IXGRP as u16;
    let perm = attr.perm & 0o7777;
    if attr.kind != FileKind::RegularFile || perm & (SUID | SGID) == 0 {
        return None;
    }
    let caller = ctx.caller();
    if matches!(change, Change::Modified) && caller.holds_capability(cap::FSETID) {
        return None;
    }
    let may_keep = |gid: u32| caller.in_group(gid) || caller.holds_capability(cap::FSETID);
    let kill_sgid = perm & XGRP != 0
        || match change {
            // The kernel said the caller lacks CAP_FSETID.
            Change::Written | Change::Modified => !caller.in_group(attr.gid),
            Change::Chowned { old_gid } => !may_keep(old_gid) || (perm & SUID != 0 && !may_keep(attr.gid)),
        };
    let mut kept = perm & !SUID;
    if kill_sgid {
        kept &= !SGID;
    }
    (kept != perm).then_some(kept)
}

/// A SETATTR of the permission bits alone, through `fh` when given.
pub(crate) fn chmod_request(perm: u16, fh: Option<FileHandle>) -> SetattrRequest {
    let mut valid = SetattrValid::MODE;
    if fh.is_some() {
        valid |= SetattrValid::FH;
    }
    SetattrRequest::from_raw(&SetattrIn {
        valid: valid.bits(),
        fh: fh.map_or(0, |f| f.0),
        mode: libc::S_IFREG | u32::from(perm),
        ..SetattrIn::default()
    })
}

/// Clears the set-ID bits `change` drops from the file `getattr` describes,
/// by `setattr`: the attributes after, if it changed anything.
pub(crate) fn clear(
    ctx: &RequestContext<'_>,
    change: Change,
    fh: Option<FileHandle>,
    getattr: impl FnOnce() -> Result<FileAttr, Errno>,
    setattr: impl FnOnce(&SetattrRequest) -> Result<FileAttr, Errno>,
) -> Result<Option<FileAttr>, Errno> {
    match kept(ctx, &getattr()?, change) {
        Some(perm) => setattr(&chmod_request(perm, fh)).map(Some),
        None => Ok(None),
    }
}

/// SETATTR `req` by `setattr`, then, when the kernel flagged it
/// (`FATTR_KILL_SUIDGID`: a truncate by a caller without `CAP_FSETID`, or a
/// chown), the set-ID bits it drops by a second, mode-only `setattr`: the
/// attributes after both. `getattr` gives a chown the group before.
pub(crate) fn setattr(
    ctx: &RequestContext<'_>,
    req: &SetattrRequest,
    getattr: impl FnOnce() -> Result<FileAttr, Errno>,
    setattr: impl Fn(&SetattrRequest) -> Result<FileAttr, Errno>,
) -> Result<FileAttr, Errno> {
    let change = if !req.kill_suidgid {
        None
    } else if req.uid.is_some() || req.gid.is_some() {
        Some(Change::Chowned {
            old_gid: getattr()?.gid,
        })
    } else {
        Some(Change::Written)
    };
    let attr = setattr(req)?;
    match change.and_then(|c| kept(ctx, &attr, c)) {
        Some(perm) => setattr(&chmod_request(perm, req.fh)),
        None => Ok(attr),
    }
}

/// Drops the kernel's cached attributes of `ino` after its bits were
/// cleared by a request whose answer carries none (FALLOCATE,
/// COPY_FILE_RANGE), so that a `stat` or an exec sees the new mode
/// (attributes only: no lock the request may hold is taken).
pub(crate) fn forget_cached_mode(ctx: &RequestContext<'_>, ino: Inode) {
    match ctx.notifier().inval_inode(ino, -1, 0).and_then(|t| t.wait()) {
        // An inode the kernel does not hold: nothing cached.
        Err(NotifyError::Kernel(e)) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => {
            log::warn!("dropping the cached attributes of ino {ino} after clearing its set-ID bits: {e}")
        }
        Ok(_) => {}
    }
}
