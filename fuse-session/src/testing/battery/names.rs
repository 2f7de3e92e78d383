//! The scenarios about names and directories: the root, hard links,
//! rename over an existing name, readdir during unlink, and the inode
//! numbers of a listing.

use super::context::{Ctx, Step, Stop};
use crate::filesystem::Filesystem;
use crate::testing::wire::is_dot_or_dotdot;
use crate::types::{FileHandle, Inode};
use fuse_proto::Errno;

/// The root: a directory (GETATTR), listed with `.` and `..`.
pub(super) fn root<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let a = cx
        .need("GETATTR of the root", cx.k.getattr(Inode::ROOT, None))?
        .attr;
    cx.check("the root's type", a.mode & libc::S_IFMT == libc::S_IFDIR, || {
        crate::testing::checker::kind_name(a.mode)
    })?;
    let names: Vec<String> = cx
        .need("READDIR of the root", cx.k.list_dir(Inode::ROOT, 4096))?
        .iter()
        .map(|e| e.name_lossy())
        .collect();
    for dot in [".", ".."] {
        cx.check(
            &format!("{dot:?} in the root's listing"),
            names.iter().any(|n| n == dot),
            || format!("{names:?}"),
        )?;
    }
    Ok(())
}

pub(super) fn hard_link<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let f = cx.created("link.f", b"shared")?;
    let g = cx.need("LINK link.g", cx.k.link(f, cx.dir, "link.g"))?;
    cx.check("LINK's node", g.nodeid == f.0, || {
        format!("node {} for node {f}", g.nodeid)
    })?;
    cx.check("nlink after LINK", g.attr.nlink == 2, || {
        format!("{}", g.attr.nlink)
    })?;
    cx.need("UNLINK link.f", cx.k.unlink(cx.dir, "link.f"))?;
    let g = cx.need("LOOKUP link.g", cx.k.lookup(cx.dir, "link.g"))?;
    cx.check("nlink after UNLINK of the other name", g.attr.nlink == 1, || {
        format!("{}", g.attr.nlink)
    })?;
    let d = cx.contents("link.g", Inode(g.nodeid))?;
    cx.check("contents through the other name", d == b"shared", || {
        format!("{d:?}")
    })?;
    cx.expect_err(
        "LOOKUP of the unlinked name",
        cx.k.lookup(cx.dir, "link.f"),
        &[Errno::ENOENT],
    )
}

pub(super) fn rename_over_existing<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let a = cx.created("mv.a", b"AAA")?;
    let b = cx.created("mv.b", b"B")?;
    cx.need(
        "RENAME mv.a over mv.b",
        cx.k.rename(cx.dir, "mv.a", cx.dir, "mv.b", 0),
    )?;
    let e = cx.need("LOOKUP mv.b", cx.k.lookup(cx.dir, "mv.b"))?;
    cx.check("the target name's node after RENAME", e.nodeid == a.0, || {
        format!("node {} (the renamed file was {a}, the replaced {b})", e.nodeid)
    })?;
    let d = cx.contents("mv.b", a)?;
    cx.check("contents after RENAME", d == b"AAA", || format!("{d:?}"))?;
    cx.expect_err(
        "LOOKUP of the old name",
        cx.k.lookup(cx.dir, "mv.a"),
        &[Errno::ENOENT],
    )
}

pub(super) fn readdir_during_unlink<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let names: Vec<String> = (0..24).map(|i| format!("rd.{i:02}")).collect();
    for n in &names {
        cx.created(n, b"")?;
    }
    let fh = FileHandle(cx.need("OPENDIR", cx.k.opendir(cx.dir))?.fh);
    // A small buffer: a few records a call, as a slow reader would get them.
    let mut seen: Vec<String> = Vec::new();
    let mut offset = 0;
    let mut calls = 0;
    let mut unlinked = false;
    loop {
        let batch = cx.need("READDIR", cx.k.readdir(cx.dir, fh, offset, 128))?;
        let Some(last) = batch.last() else { break };
        offset = last.offset;
        seen.extend(
            batch
                .iter()
                .filter(|e| !is_dot_or_dotdot(&e.name))
                .map(|e| e.name_lossy()),
        );
        calls += 1;
        if calls > 10_000 {
            cx.differs("the listing does not end".into());
            return Err(Stop::Failed);
        }
        if !unlinked && seen.iter().filter(|n| n.starts_with("rd.")).count() >= 6 {
            // Unlink names already listed and names not listed yet.
            for n in ["rd.00", "rd.02", "rd.20", "rd.22"] {
                cx.need("UNLINK", cx.k.unlink(cx.dir, n))?;
            }
            unlinked = true;
        }
    }
    cx.need("RELEASEDIR", cx.k.releasedir(cx.dir, fh))?;
    cx.check("the listing", unlinked, || "ended before the unlinks".into())?;
    let ours: Vec<&String> = seen.iter().filter(|n| n.starts_with("rd.")).collect();
    for n in &names {
        let count = ours.iter().filter(|s| **s == n).count();
        let gone = ["rd.00", "rd.02", "rd.20", "rd.22"].contains(&n.as_str());
        cx.check(
            &format!("{n} in the listing"),
            count == 1 || (gone && count == 0),
            || format!("listed {count} times"),
        )?;
    }
    Ok(())
}

/// `d_ino` of every entry of a listing (READDIR, and READDIRPLUS where
/// implemented) is the `st_ino` a LOOKUP of the name gives, for names the
/// kernel holds and names it has forgotten; `.` (where listed) is the
/// directory's own.
pub(super) fn listing_inode_numbers<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    // A directory of its own where MKDIR is implemented (with a
    // subdirectory in it), the battery's otherwise.
    let own_dir = cx.k.mkdir(cx.dir, "ino.d", 0o755).ok().map(|e| Inode(e.nodeid));
    let dir = own_dir.unwrap_or(cx.dir);
    let mut made = Vec::new();
    for name in ["ino.a", "ino.b"] {
        made.push(cx.created_in(dir, name, 0o644)?);
    }
    if own_dir.is_some() {
        made.push(cx.need("MKDIR ino.sub", cx.k.mkdir(dir, "ino.sub", 0o755))?);
    }
    // Forget one name: its number must come from the filesystem, not from
    // what the layer remembers of it.
    cx.k.forget(Inode(made[1].nodeid), 1);
    let own = cx.attr("the listed directory", dir)?.ino;
    let wrong = |listed: Vec<(String, u64)>| -> Step {
        let mut bad = Vec::new();
        let mut seen = 0;
        for (name, d_ino) in &listed {
            let st_ino = match name.as_str() {
                "." => own,
                n if n.starts_with("ino.") => {
                    let e = cx.need(&format!("LOOKUP {n}"), cx.k.lookup(dir, n))?;
                    cx.k.forget(Inode(e.nodeid), 1);
                    seen += 1;
                    e.attr.ino
                }
                _ => continue,
            };
            if *d_ino != st_ino {
                bad.push(format!("{name}: d_ino {d_ino}, st_ino {st_ino}"));
            }
        }
        cx.check(
            "d_ino of each entry",
            bad.is_empty() && seen == made.len(),
            || format!("{bad:?} in {listed:?}"),
        )
    };
    let plain = cx.need("READDIR", cx.k.list_dir(dir, 4096))?;
    wrong(plain.iter().map(|e| (e.name_lossy(), e.ino)).collect())?;
    match cx.k.list_dir_plus(dir, 4096) {
        Err(Errno::ENOSYS) => {}
        r => {
            let plus = cx.need("READDIRPLUS", r)?;
            for e in &plus {
                if e.entry.nodeid != 0 && !is_dot_or_dotdot(&e.dirent.name) {
                    cx.k.forget(Inode(e.entry.nodeid), 1);
                }
            }
            wrong(
                plus.iter()
                    .map(|e| (e.dirent.name_lossy(), e.dirent.ino))
                    .collect(),
            )?;
        }
    }
    for name in ["ino.a", "ino.b"] {
        cx.need("UNLINK", cx.k.unlink(dir, name))?;
    }
    if own_dir.is_some() {
        cx.need("RMDIR", cx.k.rmdir(dir, "ino.sub"))?;
        cx.need("RMDIR", cx.k.rmdir(cx.dir, "ino.d"))?;
    }
    Ok(())
}
