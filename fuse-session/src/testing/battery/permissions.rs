//! The permissions scenario: what the owner's modes allow and deny to
//! the owner and to another caller, as the kernel's
//! `generic_permission` would decide.

use super::context::{Ctx, REG, Step, Stop};
use crate::filesystem::Filesystem;
use crate::testing::wire::Caller;
use crate::types::{FileHandle, Inode};
use fuse_proto::Errno;
use fuse_proto::abi::Attr;

/// What the kernel's `generic_permission` allows `who` on `a` (`mask`:
/// `R_OK`, `W_OK`; no supplementary groups, no capabilities but root's).
fn kernel_allows(a: &Attr, who: Caller, mask: u32) -> bool {
    if who.uid == 0 {
        return true;
    }
    let bits = if a.uid == who.uid {
        (a.mode >> 6) & 7
    } else if a.gid == who.gid {
        (a.mode >> 3) & 7
    } else {
        a.mode & 7
    };
    bits & mask == mask
}

pub(super) fn permissions<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let other = cx.battery.other.unwrap_or(match cx.owner.uid {
        65534 => Caller::new(65533, 65533, 2),
        _ => Caller::new(65534, 65534, 2),
    });
    if other.uid == cx.owner.uid {
        return Err(Stop::Unsupported("the other caller is the owner".into()));
    }
    let e = cx.need("MKDIR perm.d", cx.k.mkdir(cx.dir, "perm.d", 0o777))?;
    let d = Inode(e.nodeid);
    cx.check("mode after MKDIR", e.attr.mode & 0o7777 == 0o777, || {
        format!("{:o}", e.attr.mode)
    })?;
    let e = cx.created_in(d, "secret", 0o600)?;
    let secret = Inode(e.nodeid);
    cx.check(
        "owner after CREATE",
        (e.attr.uid, e.attr.gid) == (cx.owner.uid, cx.owner.gid),
        || {
            format!(
                "{}:{} for caller {}:{}",
                e.attr.uid, e.attr.gid, cx.owner.uid, cx.owner.gid
            )
        },
    )?;
    cx.check("mode after CREATE", e.attr.mode == REG | 0o600, || {
        format!("{:o}", e.attr.mode)
    })?;
    let public = Inode(cx.created_in(d, "public", 0o644)?.nodeid);

    cx.k.as_caller(other, |k| -> Step {
        let open = |ino: Inode, what: &str, flags: i32, mask: u32| -> Step<Result<(), Errno>> {
            if cx.battery.default_permissions {
                let a = cx.need(&format!("GETATTR {what}"), k.getattr(ino, None))?.attr;
                if !kernel_allows(&a, other, mask) {
                    return Ok(Err(Errno::EACCES));
                }
            }
            Ok(match k.open(ino, flags) {
                Ok(o) => {
                    cx.need("RELEASE", k.release(ino, FileHandle(o.fh)))?;
                    Ok(())
                }
                Err(e) => Err(e),
            })
        };
        let r = open(secret, "secret", libc::O_RDONLY, 4)?;
        cx.check(
            "another caller's OPEN of a 0600 file",
            r == Err(Errno::EACCES),
            || format!("{r:?}"),
        )?;
        let r = open(public, "public", libc::O_RDONLY, 4)?;
        cx.check(
            "another caller's read-only OPEN of a 0644 file",
            r.is_ok(),
            || format!("{r:?}"),
        )?;
        let r = open(public, "public", libc::O_WRONLY, 2)?;
        cx.check(
            "another caller's OPEN for writing of a 0644 file",
            r == Err(Errno::EACCES),
            || format!("{r:?}"),
        )
    })
}
