//! The race scenarios: two threads send requests at once through one
//! [`TestKernel`](crate::testing::TestKernel), as two processes do, while the checker watches both:
//! lookup against rename, unlink against open, readdir against create,
//! forget against lookup. Each checks what POSIX allows whatever the
//! interleaving (a name found names the right node, an open file reads
//! its data, a listing is whole, a node looked up again is the same
//! node).

use super::context::{Ctx, Step};
use crate::filesystem::Filesystem;
use crate::types::{FileHandle, Inode};
use fuse_proto::Errno;

/// How many rounds each racing thread makes.
const ROUNDS: usize = 40;

/// Runs `a` and `b` at once, each on its own thread.
fn both<F: Filesystem>(cx: &Ctx<'_, F>, a: impl FnOnce() + Send, b: impl FnOnce() + Send) {
    let _ = cx;
    std::thread::scope(|s| {
        s.spawn(a);
        s.spawn(b);
    });
}

/// Messages of the racing threads, gathered.
type Found = std::sync::Mutex<Vec<String>>;

fn report<F: Filesystem>(cx: &Ctx<'_, F>, found: Found) {
    for d in found.into_inner().unwrap_or_else(|e| e.into_inner()) {
        cx.differs(d);
    }
}

fn note(found: &Found, d: String) {
    found.lock().unwrap_or_else(|e| e.into_inner()).push(d);
}

/// A file renamed back and forth between two names while another thread
/// looks both up: each lookup finds the file or nothing, never another
/// node nor an error.
pub(super) fn lookup_rename<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let (k, dir) = (cx.k, cx.dir);
    let e = cx.need(
        "CREATE race.a",
        k.create(dir, "race.a", libc::S_IFREG | 0o644, libc::O_RDWR),
    )?;
    cx.need("RELEASE", k.release(Inode(e.0.nodeid), FileHandle(e.1.fh)))?;
    let node = e.0.nodeid;
    // Once alone, so that a filesystem without RENAME is unsupported here.
    cx.need(
        "RENAME race.a to race.b",
        k.rename(dir, "race.a", dir, "race.b", 0),
    )?;
    cx.need(
        "RENAME race.b to race.a",
        k.rename(dir, "race.b", dir, "race.a", 0),
    )?;
    let found = Found::default();
    both(
        cx,
        || {
            for i in 0..ROUNDS {
                let (from, to) = if i % 2 == 0 {
                    ("race.a", "race.b")
                } else {
                    ("race.b", "race.a")
                };
                if let Err(e) = k.rename(dir, from, dir, to, 0) {
                    note(&found, format!("RENAME {from} to {to}: {e}"));
                }
            }
        },
        || {
            for i in 0..ROUNDS * 2 {
                let name = if i % 2 == 0 { "race.a" } else { "race.b" };
                match k.lookup(dir, name) {
                    Ok(e) if e.nodeid == node => {}
                    Ok(e) => note(
                        &found,
                        format!(
                            "LOOKUP {name} during renames: node {}, not the renamed {node}",
                            e.nodeid
                        ),
                    ),
                    Err(Errno::ENOENT) => {}
                    Err(e) => note(&found, format!("LOOKUP {name} during renames: {e}")),
                }
            }
        },
    );
    report(cx, found);
    // An even number of renames: the file is back at race.a.
    let e = cx.need("LOOKUP race.a after the renames", k.lookup(dir, "race.a"))?;
    cx.check("race.a after the renames", e.nodeid == node, || {
        format!("node {}, not {node}", e.nodeid)
    })?;
    cx.expect_err(
        "LOOKUP race.b after the renames",
        k.lookup(dir, "race.b"),
        &[Errno::ENOENT],
    )
}

/// Files unlinked while another thread opens and reads them through the
/// node the kernel holds: an open either works and reads the data, or
/// fails as for a removed file (`ENOENT`, `ESTALE`); a file opened before
/// its unlink reads its data to the end.
pub(super) fn unlink_open<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let (k, dir) = (cx.k, cx.dir);
    let mut files = Vec::new();
    for i in 0..8 {
        let name = format!("race.u{i}");
        let (e, o) = cx.need(
            &format!("CREATE {name}"),
            k.create(dir, &name, libc::S_IFREG | 0o644, libc::O_RDWR),
        )?;
        let (ino, fh) = (Inode(e.nodeid), FileHandle(o.fh));
        cx.need("WRITE", k.write(ino, fh, 0, name.as_bytes()))?;
        cx.need("RELEASE", k.release(ino, fh))?;
        files.push((name, ino));
    }
    let found = Found::default();
    both(
        cx,
        || {
            for (name, _) in &files {
                if let Err(e) = k.unlink(dir, name) {
                    note(&found, format!("UNLINK {name}: {e}"));
                }
            }
        },
        || {
            for (name, ino) in &files {
                match k.open(*ino, libc::O_RDONLY) {
                    Ok(o) => {
                        let fh = FileHandle(o.fh);
                        match k.read(*ino, fh, 0, 4096) {
                            Ok(d) if d == name.as_bytes() => {}
                            other => note(
                                &found,
                                format!("READ of {name} opened during its unlink: {other:?}"),
                            ),
                        }
                        if let Err(e) = k.release(*ino, fh) {
                            note(&found, format!("RELEASE of {name}: {e}"));
                        }
                    }
                    Err(Errno::ENOENT | Errno::ESTALE) => {}
                    Err(e) => note(&found, format!("OPEN of {name} during its unlink: {e}")),
                }
            }
        },
    );
    report(cx, found);
    for (name, _) in &files {
        cx.expect_err(
            &format!("LOOKUP {name} after its unlink"),
            k.lookup(dir, name),
            &[Errno::ENOENT],
        )?;
    }
    Ok(())
}

/// A directory listed again and again while another thread creates files
/// in it: each listing holds every name that was there before it began,
/// once (the checker checks each pass), and the last one every file.
pub(super) fn readdir_create<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let (k, dir) = (cx.k, cx.dir);
    let e = cx.need("MKDIR race.d", k.mkdir(dir, "race.d", 0o755))?;
    let d = Inode(e.nodeid);
    let found = Found::default();
    both(
        cx,
        || {
            for i in 0..ROUNDS {
                let name = format!("c{i:02}");
                match k.create(d, &name, libc::S_IFREG | 0o644, libc::O_RDWR) {
                    Ok((e, o)) => {
                        let _ = k.release(Inode(e.nodeid), FileHandle(o.fh));
                    }
                    Err(e) => note(&found, format!("CREATE {name} during listings: {e}")),
                }
            }
        },
        || {
            for _ in 0..ROUNDS / 4 {
                if let Err(e) = k.list_dir(d, 256) {
                    note(&found, format!("a listing during creates: {e}"));
                }
            }
        },
    );
    report(cx, found);
    let listed = cx.need("READDIR after the creates", k.list_dir(d, 4096))?;
    let n = listed.iter().filter(|e| e.name.starts_with(b"c")).count();
    cx.check("the listing after the creates", n == ROUNDS, || {
        format!("{n} of {ROUNDS} files")
    })
}

/// One file looked up and forgotten by two threads at once: the lookups
/// the kernel holds keep the node alive (the same node id and
/// generation, its attributes readable), however FORGETs of other
/// lookups interleave.
pub(super) fn forget_lookup<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let (k, dir) = (cx.k, cx.dir);
    let (e, o) = cx.need(
        "CREATE race.f",
        k.create(dir, "race.f", libc::S_IFREG | 0o644, libc::O_RDWR),
    )?;
    cx.need("RELEASE", k.release(Inode(e.nodeid), FileHandle(o.fh)))?;
    let (node, generation) = (e.nodeid, e.generation);
    let found = Found::default();
    let worker = || {
        for _ in 0..ROUNDS {
            match k.lookup(dir, "race.f") {
                Ok(e) if (e.nodeid, e.generation) == (node, generation) => {
                    if let Err(err) = k.getattr(Inode(node), None) {
                        note(
                            &found,
                            format!("GETATTR of node {node}, looked up and held: {err}"),
                        );
                    }
                    k.forget(Inode(node), 1);
                }
                Ok(e) => {
                    note(
                        &found,
                        format!(
                            "LOOKUP race.f: node {} generation {}, not node {node} generation {generation}",
                            e.nodeid, e.generation
                        ),
                    );
                    k.forget(Inode(e.nodeid), 1);
                }
                Err(e) => note(&found, format!("LOOKUP race.f: {e}")),
            }
        }
    };
    both(cx, worker, worker);
    report(cx, found);
    let e = cx.need("LOOKUP race.f after the race", k.lookup(dir, "race.f"))?;
    cx.check(
        "race.f after the race",
        (e.nodeid, e.generation) == (node, generation),
        || format!("node {} generation {}", e.nodeid, e.generation),
    )
}
