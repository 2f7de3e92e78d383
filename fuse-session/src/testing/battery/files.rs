//! The scenarios about file contents and attributes: create, write and
//! read back, unlink of an open file, truncate, sparse writes and
//! extended attributes.

use super::context::{Ctx, REG, Step, Stop};
use crate::filesystem::Filesystem;
use crate::testing::wire::Xattr;
use fuse_proto::Errno;

pub(super) fn create_write_read<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let (ino, fh) = cx.create("cwr.f", b"hello, world", 0o640)?;
    let a = cx.need("GETATTR", cx.k.getattr(ino, Some(fh)))?.attr;
    cx.check("size after WRITE", a.size == 12, || format!("{}", a.size))?;
    cx.check("mode after CREATE", a.mode == REG | 0o640, || {
        format!("{:o}", a.mode)
    })?;
    cx.check(
        "owner after CREATE",
        (a.uid, a.gid) == (cx.owner.uid, cx.owner.gid),
        || format!("{}:{} for caller {}:{}", a.uid, a.gid, cx.owner.uid, cx.owner.gid),
    )?;
    cx.need("RELEASE", cx.k.release(ino, fh))?;
    let again = cx.need("LOOKUP cwr.f", cx.k.lookup(cx.dir, "cwr.f"))?;
    cx.check("LOOKUP after CREATE", again.nodeid == ino.0, || {
        format!("node {} for node {ino}", again.nodeid)
    })?;
    let d = cx.contents("cwr.f", ino)?;
    cx.check("READ after WRITE", d == b"hello, world", || {
        format!("{:?}", String::from_utf8_lossy(&d))
    })?;
    cx.expect_err(
        "CREATE of an existing name with O_EXCL",
        cx.k.create(cx.dir, "cwr.f", REG | 0o644, libc::O_RDWR | libc::O_EXCL),
        &[Errno::EEXIST],
    )
}

pub(super) fn unlink_open_file<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let (ino, fh) = cx.create("open.f", b"still here", 0o644)?;
    cx.need("UNLINK open.f", cx.k.unlink(cx.dir, "open.f"))?;
    cx.expect_err(
        "LOOKUP of the unlinked name",
        cx.k.lookup(cx.dir, "open.f"),
        &[Errno::ENOENT],
    )?;
    let d = cx.read_all("open.f", ino, fh)?;
    cx.check("READ of the unlinked open file", d == b"still here", || {
        format!("{d:?}")
    })?;
    let n = cx.need("WRITE to the unlinked open file", cx.k.write(ino, fh, 10, b"!"))?;
    cx.check("WRITE to the unlinked open file", n == 1, || format!("{n} bytes"))?;
    let a = cx
        .need("GETATTR of the unlinked open file", cx.k.getattr(ino, Some(fh)))?
        .attr;
    cx.check("size of the unlinked open file", a.size == 11, || {
        format!("{}", a.size)
    })?;
    cx.need("RELEASE", cx.k.release(ino, fh))
}

pub(super) fn truncate<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let (ino, fh) = cx.create("trunc.f", b"0123456789", 0o644)?;
    let a = cx.need("SETATTR size 4", cx.k.truncate(ino, 4, Some(fh)))?.attr;
    cx.check("size after shrinking", a.size == 4, || format!("{}", a.size))?;
    let d = cx.read_all("trunc.f", ino, fh)?;
    cx.check("contents after shrinking", d == b"0123", || format!("{d:?}"))?;
    let a = cx.need("SETATTR size 8", cx.k.truncate(ino, 8, Some(fh)))?.attr;
    cx.check("size after growing", a.size == 8, || format!("{}", a.size))?;
    let d = cx.read_all("trunc.f", ino, fh)?;
    cx.check("contents after growing", d == b"0123\0\0\0\0", || {
        format!("{d:?}")
    })?;
    cx.need("RELEASE", cx.k.release(ino, fh))?;
    let a = cx.attr("trunc.f", ino)?;
    cx.check("size after RELEASE", a.size == 8, || format!("{}", a.size))
}

pub(super) fn sparse_write<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    const FAR: u64 = 1 << 20;
    let (ino, fh) = cx.create("sparse.f", b"", 0o644)?;
    let n = cx.need("WRITE at 1 MiB", cx.k.write(ino, fh, FAR, b"x"))?;
    cx.check("WRITE at 1 MiB", n == 1, || format!("{n} bytes"))?;
    let a = cx.need("GETATTR", cx.k.getattr(ino, Some(fh)))?.attr;
    cx.check("size after a write past the end", a.size == FAR + 1, || {
        format!("{}", a.size)
    })?;
    let hole = cx.need("READ of the hole", cx.k.read(ino, fh, 4096, 4096))?;
    cx.check(
        "READ of the hole",
        hole.len() == 4096 && hole.iter().all(|&b| b == 0),
        || format!("{} bytes, not all zero", hole.len()),
    )?;
    let end = cx.need("READ at the end", cx.k.read(ino, fh, FAR, 4096))?;
    cx.check("READ at the end", end == b"x", || format!("{end:?}"))?;
    cx.need("RELEASE", cx.k.release(ino, fh))
}

pub(super) fn xattrs<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let ino = cx.created("xattr.f", b"")?;
    let optional = |op: &str, r: Result<(), Errno>| match r {
        Err(Errno::EOPNOTSUPP) => Err(Stop::Unsupported(format!("{op}: EOPNOTSUPP"))),
        r => cx.need(op, r),
    };
    optional("SETXATTR", cx.k.setxattr(ino, "user.battery", b"value", 0))?;
    let size = cx.need("GETXATTR size", cx.k.getxattr(ino, "user.battery", 0))?;
    cx.check("GETXATTR size", size == Xattr::Size(5), || format!("{size:?}"))?;
    let v = cx.need("GETXATTR", cx.k.getxattr(ino, "user.battery", 64))?;
    cx.check("GETXATTR", v == Xattr::Data(b"value".to_vec()), || {
        format!("{v:?}")
    })?;
    cx.expect_err(
        "GETXATTR into a buffer too small",
        cx.k.getxattr(ino, "user.battery", 2),
        &[Errno::ERANGE],
    )?;
    cx.expect_err(
        "SETXATTR with XATTR_CREATE of an existing name",
        cx.k.setxattr(ino, "user.battery", b"x", libc::XATTR_CREATE as u32),
        &[Errno::EEXIST],
    )?;
    let list = cx.need("LISTXATTR", cx.k.listxattr(ino, 4096))?;
    let has = matches!(&list, Xattr::Data(d) if d.split(|&b| b == 0).any(|n| n == b"user.battery"));
    cx.check("LISTXATTR", has, || format!("{list:?}"))?;
    cx.need("REMOVEXATTR", cx.k.removexattr(ino, "user.battery"))?;
    cx.expect_err(
        "GETXATTR after REMOVEXATTR",
        cx.k.getxattr(ino, "user.battery", 64),
        &[Errno::ENODATA],
    )
}
