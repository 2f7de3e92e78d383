//! The conformance battery: POSIX scenarios run through a [`TestKernel`]
//! with the results POSIX expects (create and read back, hard links,
//! rename over an existing name, unlink of an open file, readdir during
//! unlink, the inode numbers of a listing, truncate, sparse writes,
//! extended attributes, permissions as several callers). Each scenario passes, fails (a wrong result or a
//! protocol violation, saying which step), or is unsupported: the
//! filesystem answered `ENOSYS` to an operation it needs (`EROFS`: it is
//! read-only; `EOPNOTSUPP` to extended attributes), which is not a failure.
//!
//! Every scenario works in one directory (`battery` under the root, or
//! `battery.1`… when it exists, or the root itself where MKDIR is not
//! implemented), with names of its own.

use super::checker::Violation;
use super::kernel::TestKernel;
use super::wire::{Caller, Xattr, is_dot_or_dotdot};
use crate::filesystem::Filesystem;
use crate::types::{FileHandle, Inode};
use fuse_proto::Errno;
use fuse_proto::abi::{Attr, EntryOut};
use std::fmt;

/// How one scenario ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every step gave the expected result, with no protocol violation.
    Passed,
    /// The filesystem does not implement an operation the scenario needs.
    Unsupported(String),
    /// A step gave another result (or broke a rule of the protocol).
    Failed(String),
}

/// The outcome of one scenario, with the violations the checker saw in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScenarioResult {
    /// The scenario's name (`rename_over_existing`, …).
    pub name: &'static str,
    /// How it ended.
    pub outcome: Outcome,
    /// The protocol violations during the scenario (each fails it).
    pub violations: Vec<Violation>,
}

/// Every scenario's result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatteryReport {
    /// In the order they ran.
    pub results: Vec<ScenarioResult>,
}

impl BatteryReport {
    /// The scenarios that failed.
    pub fn failed(&self) -> impl Iterator<Item = &ScenarioResult> {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Failed(_)))
    }

    /// The scenarios the filesystem does not support.
    pub fn unsupported(&self) -> impl Iterator<Item = &ScenarioResult> {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Unsupported(_)))
    }

    /// The scenarios that passed.
    pub fn passed(&self) -> impl Iterator<Item = &ScenarioResult> {
        self.results.iter().filter(|r| r.outcome == Outcome::Passed)
    }

    /// The outcome of scenario `name`.
    pub fn outcome(&self, name: &str) -> Option<&Outcome> {
        self.results.iter().find(|r| r.name == name).map(|r| &r.outcome)
    }

    /// Panics, printing the report, if a scenario failed (unsupported ones
    /// do not fail).
    #[track_caller]
    pub fn assert_passed(&self) {
        if self.failed().next().is_some() {
            panic!("the conformance battery failed:\n{self}");
        }
    }
}

impl fmt::Display for BatteryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.results {
            match &r.outcome {
                Outcome::Passed => writeln!(f, "  passed       {}", r.name)?,
                Outcome::Unsupported(why) => writeln!(f, "  unsupported  {}: {why}", r.name)?,
                Outcome::Failed(why) => writeln!(f, "  FAILED       {}: {why}", r.name)?,
            }
            for v in &r.violations {
                writeln!(f, "               {v}")?;
            }
        }
        Ok(())
    }
}

/// Why a scenario stopped.
enum Stop {
    Unsupported(String),
    Failed(String),
}

type Step<T = ()> = Result<T, Stop>;

/// The battery's settings.
#[derive(Clone, Copy, Debug, Default)]
pub struct Battery {
    /// The caller who creates the files (default: the kernel's caller of
    /// the moment).
    pub owner: Option<Caller>,
    /// Another caller, who must be denied what the owner's modes deny
    /// (default: `nobody`, 65534/65534, or 65533/65533 when the owner is
    /// `nobody`).
    pub other: Option<Caller>,
    /// The kernel checks permissions itself (the mount's
    /// `default_permissions`): the battery then checks as the kernel would
    /// before sending OPEN, and the filesystem is only asked for right
    /// owners and modes.
    pub default_permissions: bool,
}

/// Runs every scenario with the default [`Battery`].
pub fn run<F: Filesystem>(k: &TestKernel<F>) -> BatteryReport {
    Battery::default().run(k)
}

type Scenario<F> = fn(&Ctx<'_, F>) -> Step;

struct Ctx<'k, F: Filesystem> {
    k: &'k TestKernel<F>,
    dir: Inode,
    battery: Battery,
    owner: Caller,
}

const REG: u32 = libc::S_IFREG;

impl Battery {
    /// Runs every scenario on `k` (the violations the checker had before
    /// are left to the test).
    pub fn run<F: Filesystem>(&self, k: &TestKernel<F>) -> BatteryReport {
        let mut before = k.take_violations();
        let owner = self.owner.unwrap_or_else(|| k.caller());
        let previous = k.set_caller(owner);
        // A directory of its own: `battery`, `battery.1`… for later runs.
        let mut dir = Inode::ROOT;
        for i in 0..100 {
            let name = match i {
                0 => "battery".to_string(),
                i => format!("battery.{i}"),
            };
            match k.mkdir(Inode::ROOT, &name, 0o755) {
                Ok(e) => dir = Inode(e.nodeid),
                Err(Errno::EEXIST) => continue,
                Err(_) => {}
            }
            break;
        }
        let scenarios: [(&'static str, Scenario<F>); 10] = [
            ("create_write_read", create_write_read),
            ("hard_link", hard_link),
            ("rename_over_existing", rename_over_existing),
            ("unlink_open_file", unlink_open_file),
            ("readdir_during_unlink", readdir_during_unlink),
            ("listing_inode_numbers", listing_inode_numbers),
            ("truncate", truncate),
            ("sparse_write", sparse_write),
            ("xattrs", xattrs),
            ("permissions", permissions),
        ];
        let mut report = BatteryReport::default();
        before.extend(k.take_violations());
        for (name, run) in scenarios {
            let cx = Ctx {
                k,
                dir,
                battery: *self,
                owner,
            };
            k.set_caller(owner);
            let r = run(&cx);
            let violations = k.take_violations();
            let outcome = match r {
                Err(Stop::Failed(why)) => Outcome::Failed(why),
                Err(Stop::Unsupported(why)) => Outcome::Unsupported(why),
                Ok(()) if !violations.is_empty() => {
                    Outcome::Failed(format!("{} protocol violation(s)", violations.len()))
                }
                Ok(()) => Outcome::Passed,
            };
            report.results.push(ScenarioResult {
                name,
                outcome,
                violations,
            });
        }
        k.set_caller(previous);
        for v in before {
            k.checker.borrow_mut().violate(v.rule, v.request, v.detail);
        }
        report
    }
}

/// The result of operation `op`: `ENOSYS` (or `EROFS`: a read-only
/// filesystem) means unsupported, another error a failure.
fn need<T>(op: &str, r: Result<T, Errno>) -> Step<T> {
    r.map_err(|e| match e {
        Errno::ENOSYS | Errno::EROFS => Stop::Unsupported(format!("{op}: {e}")),
        e => Stop::Failed(format!("{op}: {e}")),
    })
}

fn expect_err<T: fmt::Debug>(op: &str, r: Result<T, Errno>, want: &[Errno]) -> Step {
    match r {
        Err(e @ (Errno::ENOSYS | Errno::EROFS)) if !want.contains(&e) => {
            Err(Stop::Unsupported(format!("{op}: {e}")))
        }
        Err(e) if want.contains(&e) => Ok(()),
        other => Err(Stop::Failed(format!("{op}: {other:?}, expected {want:?}"))),
    }
}

fn check(what: &str, ok: bool, detail: impl FnOnce() -> String) -> Step {
    if ok {
        Ok(())
    } else {
        Err(Stop::Failed(format!("{what}: {}", detail())))
    }
}

impl<F: Filesystem> Ctx<'_, F> {
    fn create(&self, name: &str, data: &[u8], mode: u32) -> Step<(Inode, FileHandle)> {
        let (e, o) = need(
            &format!("CREATE {name}"),
            self.k.create(self.dir, name, REG | mode, libc::O_RDWR),
        )?;
        let (ino, fh) = (Inode(e.nodeid), FileHandle(o.fh));
        if !data.is_empty() {
            let n = need(&format!("WRITE {name}"), self.k.write(ino, fh, 0, data))?;
            check(&format!("WRITE {name}"), n as usize == data.len(), || {
                format!("{n} of {} bytes written", data.len())
            })?;
        }
        Ok((ino, fh))
    }

    fn created(&self, name: &str, data: &[u8]) -> Step<Inode> {
        let (ino, fh) = self.create(name, data, 0o644)?;
        need("RELEASE", self.k.release(ino, fh))?;
        Ok(ino)
    }

    /// CREATE `name` in `dir` with permission bits `mode`, then RELEASE.
    fn created_in(&self, dir: Inode, name: &str, mode: u32) -> Step<EntryOut> {
        let (e, o) = need(
            &format!("CREATE {name}"),
            self.k.create(dir, name, REG | mode, libc::O_RDWR),
        )?;
        need("RELEASE", self.k.release(Inode(e.nodeid), FileHandle(o.fh)))?;
        Ok(e)
    }

    fn read_all(&self, name: &str, ino: Inode, fh: FileHandle) -> Step<Vec<u8>> {
        need(&format!("READ {name}"), self.k.read(ino, fh, 0, 1 << 20))
    }

    /// Opens `ino`, reads it whole, releases it.
    fn contents(&self, name: &str, ino: Inode) -> Step<Vec<u8>> {
        let fh = FileHandle(need(&format!("OPEN {name}"), self.k.open(ino, libc::O_RDONLY))?.fh);
        let d = self.read_all(name, ino, fh);
        need("RELEASE", self.k.release(ino, fh))?;
        d
    }

    fn attr(&self, name: &str, ino: Inode) -> Step<Attr> {
        Ok(need(&format!("GETATTR {name}"), self.k.getattr(ino, None))?.attr)
    }
}

fn create_write_read<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let (ino, fh) = cx.create("cwr.f", b"hello, world", 0o640)?;
    let a = need("GETATTR", cx.k.getattr(ino, Some(fh)))?.attr;
    check("size after WRITE", a.size == 12, || format!("{}", a.size))?;
    check("mode after CREATE", a.mode == REG | 0o640, || {
        format!("{:o}", a.mode)
    })?;
    need("RELEASE", cx.k.release(ino, fh))?;
    let again = need("LOOKUP cwr.f", cx.k.lookup(cx.dir, "cwr.f"))?;
    check("LOOKUP after CREATE", again.nodeid == ino.0, || {
        format!("node {} for node {ino}", again.nodeid)
    })?;
    let d = cx.contents("cwr.f", ino)?;
    check("READ after WRITE", d == b"hello, world", || {
        format!("{:?}", String::from_utf8_lossy(&d))
    })?;
    expect_err(
        "CREATE of an existing name with O_EXCL",
        cx.k.create(cx.dir, "cwr.f", REG | 0o644, libc::O_RDWR | libc::O_EXCL),
        &[Errno::EEXIST],
    )
}

fn hard_link<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let f = cx.created("link.f", b"shared")?;
    let g = need("LINK link.g", cx.k.link(f, cx.dir, "link.g"))?;
    check("LINK's node", g.nodeid == f.0, || {
        format!("node {} for node {f}", g.nodeid)
    })?;
    check("nlink after LINK", g.attr.nlink == 2, || {
        format!("{}", g.attr.nlink)
    })?;
    need("UNLINK link.f", cx.k.unlink(cx.dir, "link.f"))?;
    let g = need("LOOKUP link.g", cx.k.lookup(cx.dir, "link.g"))?;
    check("nlink after UNLINK of the other name", g.attr.nlink == 1, || {
        format!("{}", g.attr.nlink)
    })?;
    let d = cx.contents("link.g", Inode(g.nodeid))?;
    check("contents through the other name", d == b"shared", || {
        format!("{d:?}")
    })?;
    expect_err(
        "LOOKUP of the unlinked name",
        cx.k.lookup(cx.dir, "link.f"),
        &[Errno::ENOENT],
    )
}

fn rename_over_existing<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let a = cx.created("mv.a", b"AAA")?;
    let b = cx.created("mv.b", b"B")?;
    need(
        "RENAME mv.a over mv.b",
        cx.k.rename(cx.dir, "mv.a", cx.dir, "mv.b", 0),
    )?;
    let e = need("LOOKUP mv.b", cx.k.lookup(cx.dir, "mv.b"))?;
    check("the target name's node after RENAME", e.nodeid == a.0, || {
        format!("node {} (the renamed file was {a}, the replaced {b})", e.nodeid)
    })?;
    let d = cx.contents("mv.b", a)?;
    check("contents after RENAME", d == b"AAA", || format!("{d:?}"))?;
    expect_err(
        "LOOKUP of the old name",
        cx.k.lookup(cx.dir, "mv.a"),
        &[Errno::ENOENT],
    )
}

fn unlink_open_file<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let (ino, fh) = cx.create("open.f", b"still here", 0o644)?;
    need("UNLINK open.f", cx.k.unlink(cx.dir, "open.f"))?;
    expect_err(
        "LOOKUP of the unlinked name",
        cx.k.lookup(cx.dir, "open.f"),
        &[Errno::ENOENT],
    )?;
    let d = cx.read_all("open.f", ino, fh)?;
    check("READ of the unlinked open file", d == b"still here", || {
        format!("{d:?}")
    })?;
    let n = need("WRITE to the unlinked open file", cx.k.write(ino, fh, 10, b"!"))?;
    check("WRITE to the unlinked open file", n == 1, || format!("{n} bytes"))?;
    let a = need("GETATTR of the unlinked open file", cx.k.getattr(ino, Some(fh)))?.attr;
    check("size of the unlinked open file", a.size == 11, || {
        format!("{}", a.size)
    })?;
    need("RELEASE", cx.k.release(ino, fh))
}

fn readdir_during_unlink<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let names: Vec<String> = (0..24).map(|i| format!("rd.{i:02}")).collect();
    for n in &names {
        cx.created(n, b"")?;
    }
    let fh = FileHandle(need("OPENDIR", cx.k.opendir(cx.dir))?.fh);
    // A small buffer: a few records a call, as a slow reader would get them.
    let mut seen: Vec<String> = Vec::new();
    let mut offset = 0;
    let mut calls = 0;
    let mut unlinked = false;
    loop {
        let batch = need("READDIR", cx.k.readdir(cx.dir, fh, offset, 128))?;
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
            return Err(Stop::Failed("the listing does not end".into()));
        }
        if !unlinked && seen.iter().filter(|n| n.starts_with("rd.")).count() >= 6 {
            // Unlink names already listed and names not listed yet.
            for n in ["rd.00", "rd.02", "rd.20", "rd.22"] {
                need("UNLINK", cx.k.unlink(cx.dir, n))?;
            }
            unlinked = true;
        }
    }
    need("RELEASEDIR", cx.k.releasedir(cx.dir, fh))?;
    check("the listing", unlinked, || "ended before the unlinks".into())?;
    let ours: Vec<&String> = seen.iter().filter(|n| n.starts_with("rd.")).collect();
    for n in &names {
        let count = ours.iter().filter(|s| **s == n).count();
        let gone = ["rd.00", "rd.02", "rd.20", "rd.22"].contains(&n.as_str());
        check(
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
fn listing_inode_numbers<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    // A directory of its own where MKDIR is implemented (with a
    // subdirectory in it), the battery's otherwise.
    let own_dir = cx.k.mkdir(cx.dir, "ino.d", 0o755).ok().map(|e| Inode(e.nodeid));
    let dir = own_dir.unwrap_or(cx.dir);
    let mut made = Vec::new();
    for name in ["ino.a", "ino.b"] {
        made.push(cx.created_in(dir, name, 0o644)?);
    }
    if own_dir.is_some() {
        made.push(need("MKDIR ino.sub", cx.k.mkdir(dir, "ino.sub", 0o755))?);
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
                    let e = need(&format!("LOOKUP {n}"), cx.k.lookup(dir, n))?;
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
        check(
            "d_ino of each entry",
            bad.is_empty() && seen == made.len(),
            || format!("{bad:?} in {listed:?}"),
        )
    };
    let plain = need("READDIR", cx.k.list_dir(dir, 4096))?;
    wrong(plain.iter().map(|e| (e.name_lossy(), e.ino)).collect())?;
    match cx.k.list_dir_plus(dir, 4096) {
        Err(Errno::ENOSYS) => {}
        r => {
            let plus = need("READDIRPLUS", r)?;
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
        need("UNLINK", cx.k.unlink(dir, name))?;
    }
    if own_dir.is_some() {
        need("RMDIR", cx.k.rmdir(dir, "ino.sub"))?;
        need("RMDIR", cx.k.rmdir(cx.dir, "ino.d"))?;
    }
    Ok(())
}

fn truncate<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let (ino, fh) = cx.create("trunc.f", b"0123456789", 0o644)?;
    let a = need("SETATTR size 4", cx.k.truncate(ino, 4, Some(fh)))?.attr;
    check("size after shrinking", a.size == 4, || format!("{}", a.size))?;
    let d = cx.read_all("trunc.f", ino, fh)?;
    check("contents after shrinking", d == b"0123", || format!("{d:?}"))?;
    let a = need("SETATTR size 8", cx.k.truncate(ino, 8, Some(fh)))?.attr;
    check("size after growing", a.size == 8, || format!("{}", a.size))?;
    let d = cx.read_all("trunc.f", ino, fh)?;
    check("contents after growing", d == b"0123\0\0\0\0", || {
        format!("{d:?}")
    })?;
    need("RELEASE", cx.k.release(ino, fh))?;
    let a = cx.attr("trunc.f", ino)?;
    check("size after RELEASE", a.size == 8, || format!("{}", a.size))
}

fn sparse_write<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    const FAR: u64 = 1 << 20;
    let (ino, fh) = cx.create("sparse.f", b"", 0o644)?;
    let n = need("WRITE at 1 MiB", cx.k.write(ino, fh, FAR, b"x"))?;
    check("WRITE at 1 MiB", n == 1, || format!("{n} bytes"))?;
    let a = need("GETATTR", cx.k.getattr(ino, Some(fh)))?.attr;
    check("size after a write past the end", a.size == FAR + 1, || {
        format!("{}", a.size)
    })?;
    let hole = need("READ of the hole", cx.k.read(ino, fh, 4096, 4096))?;
    check(
        "READ of the hole",
        hole.len() == 4096 && hole.iter().all(|&b| b == 0),
        || format!("{} bytes, not all zero", hole.len()),
    )?;
    let end = need("READ at the end", cx.k.read(ino, fh, FAR, 4096))?;
    check("READ at the end", end == b"x", || format!("{end:?}"))?;
    need("RELEASE", cx.k.release(ino, fh))
}

fn xattrs<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let ino = cx.created("xattr.f", b"")?;
    let optional = |op: &str, r: Result<(), Errno>| match r {
        Err(Errno::EOPNOTSUPP) => Err(Stop::Unsupported(format!("{op}: EOPNOTSUPP"))),
        r => need(op, r),
    };
    optional("SETXATTR", cx.k.setxattr(ino, "user.battery", b"value", 0))?;
    let size = need("GETXATTR size", cx.k.getxattr(ino, "user.battery", 0))?;
    check("GETXATTR size", size == Xattr::Size(5), || format!("{size:?}"))?;
    let v = need("GETXATTR", cx.k.getxattr(ino, "user.battery", 64))?;
    check("GETXATTR", v == Xattr::Data(b"value".to_vec()), || {
        format!("{v:?}")
    })?;
    expect_err(
        "GETXATTR into a buffer too small",
        cx.k.getxattr(ino, "user.battery", 2),
        &[Errno::ERANGE],
    )?;
    expect_err(
        "SETXATTR with XATTR_CREATE of an existing name",
        cx.k.setxattr(ino, "user.battery", b"x", libc::XATTR_CREATE as u32),
        &[Errno::EEXIST],
    )?;
    let list = need("LISTXATTR", cx.k.listxattr(ino, 4096))?;
    let has = matches!(&list, Xattr::Data(d) if d.split(|&b| b == 0).any(|n| n == b"user.battery"));
    check("LISTXATTR", has, || format!("{list:?}"))?;
    need("REMOVEXATTR", cx.k.removexattr(ino, "user.battery"))?;
    expect_err(
        "GETXATTR after REMOVEXATTR",
        cx.k.getxattr(ino, "user.battery", 64),
        &[Errno::ENODATA],
    )
}

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

fn permissions<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let other = cx.battery.other.unwrap_or(match cx.owner.uid {
        65534 => Caller::new(65533, 65533, 2),
        _ => Caller::new(65534, 65534, 2),
    });
    if other.uid == cx.owner.uid {
        return Err(Stop::Unsupported("the other caller is the owner".into()));
    }
    let e = need("MKDIR perm.d", cx.k.mkdir(cx.dir, "perm.d", 0o777))?;
    let d = Inode(e.nodeid);
    check("mode after MKDIR", e.attr.mode & 0o7777 == 0o777, || {
        format!("{:o}", e.attr.mode)
    })?;
    let e = cx.created_in(d, "secret", 0o600)?;
    let secret = Inode(e.nodeid);
    check(
        "owner after CREATE",
        (e.attr.uid, e.attr.gid) == (cx.owner.uid, cx.owner.gid),
        || {
            format!(
                "{}:{} for caller {}:{}",
                e.attr.uid, e.attr.gid, cx.owner.uid, cx.owner.gid
            )
        },
    )?;
    check("mode after CREATE", e.attr.mode == REG | 0o600, || {
        format!("{:o}", e.attr.mode)
    })?;
    let public = Inode(cx.created_in(d, "public", 0o644)?.nodeid);

    cx.k.as_caller(other, |k| -> Step {
        let open = |ino: Inode, what: &str, flags: i32, mask: u32| -> Step<Result<(), Errno>> {
            if cx.battery.default_permissions {
                let a = need(&format!("GETATTR {what}"), k.getattr(ino, None))?.attr;
                if !kernel_allows(&a, other, mask) {
                    return Ok(Err(Errno::EACCES));
                }
            }
            Ok(match k.open(ino, flags) {
                Ok(o) => {
                    need("RELEASE", k.release(ino, FileHandle(o.fh)))?;
                    Ok(())
                }
                Err(e) => Err(e),
            })
        };
        let r = open(secret, "secret", libc::O_RDONLY, 4)?;
        check(
            "another caller's OPEN of a 0600 file",
            r == Err(Errno::EACCES),
            || format!("{r:?}"),
        )?;
        let r = open(public, "public", libc::O_RDONLY, 4)?;
        check(
            "another caller's read-only OPEN of a 0644 file",
            r.is_ok(),
            || format!("{r:?}"),
        )?;
        let r = open(public, "public", libc::O_WRONLY, 2)?;
        check(
            "another caller's OPEN for writing of a 0644 file",
            r == Err(Errno::EACCES),
            || format!("{r:?}"),
        )
    })
}
