//! The conformance battery: POSIX scenarios run through a [`TestKernel`]
//! with the results POSIX expects (the root, create and read back, hard
//! links, rename over an existing name, unlink of an open file, readdir
//! during unlink, the inode numbers of a listing, truncate, sparse writes, extended attributes,
//! permissions as several callers, and races of two threads: lookup
//! against rename, unlink against open, readdir against create, forget
//! against lookup). Each scenario runs every step it can and reports
//! each difference (a step stops it only when the next ones need its
//! result). It passes, fails, or is unsupported: the filesystem answered
//! `ENOSYS` to an operation it needs (`EROFS`: it is read-only;
//! `EOPNOTSUPP` to extended attributes), or an error it declared with
//! [`Battery::refuses`] (rename → `EOPNOTSUPP` on an object store),
//! which is not a failure; a declared refusal must be consistent (the
//! operation never succeeds).
//!
//! Every difference stays in the kernel's checker too, as a
//! [`Rule::Battery`] violation, so that [`TestKernel::finish`] reports it
//! even when the report is not looked at.
//!
//! Every scenario works in one directory (`battery` under the root, or
//! `battery.1`… when it exists, or the root itself where MKDIR is not
//! implemented), with names of its own.

use super::checker::{Rule, Violation};
use super::kernel::TestKernel;
use super::wire::{Caller, Xattr, is_dot_or_dotdot};
use crate::filesystem::Filesystem;
use crate::types::{FileHandle, Inode};
use fuse_proto::abi::{Attr, EntryOut};
use fuse_proto::{Errno, Opcode};
use std::cell::RefCell;
use std::fmt;

/// How one scenario ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every step gave the expected result, with no protocol violation.
    Passed,
    /// The filesystem does not implement an operation the scenario needs,
    /// or refused it as it declared.
    Unsupported(String),
    /// Steps gave other results (each difference), or broke rules of the
    /// protocol.
    Failed(Vec<String>),
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
#[must_use = "the report says which scenarios failed: call assert_passed()"]
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
                Outcome::Failed(why) => {
                    writeln!(f, "  FAILED       {}", r.name)?;
                    for d in why {
                        writeln!(f, "               {d}")?;
                    }
                }
            }
            for v in &r.violations {
                writeln!(f, "               {v}")?;
            }
        }
        Ok(())
    }
}

/// Why a scenario stopped before its end.
pub(super) enum Stop {
    Unsupported(String),
    /// A step failed whose result the next ones need (the difference is
    /// recorded already).
    Failed,
}

pub(super) type Step<T = ()> = Result<T, Stop>;

/// The battery's default owner of what it creates: not the test's own
/// uid (a filesystem that stamps its own uid on new files, rather than
/// the caller's, fails), nor root (which bypasses permissions).
pub const OWNER: Caller = Caller::new(4242, 4243, 4244);

/// The battery's settings.
#[derive(Clone, Debug, Default)]
pub struct Battery {
    /// The caller who creates the files (default [`OWNER`], or 4245 when
    /// the test runs as 4242; a filesystem that cannot give its files
    /// the caller's owner, such as one over a host directory run
    /// unprivileged, says `Some(Caller::current())`).
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
    /// Operations the filesystem refuses by design, with the error it
    /// answers ([`Battery::refuses`]).
    pub refused: Vec<(Opcode, Errno)>,
    /// The directory to work in (default: a new `battery` under the root,
    /// or the root where MKDIR is not implemented): a filesystem writable
    /// only below some directory names it.
    pub dir: Option<Inode>,
}

/// Runs every scenario with the default [`Battery`].
pub fn run<F: Filesystem>(k: &TestKernel<F>) -> BatteryReport {
    Battery::default().run(k)
}

type Scenario<F> = fn(&Ctx<'_, F>) -> Step;

pub(super) struct Ctx<'k, F: Filesystem> {
    pub(super) k: &'k TestKernel<F>,
    pub(super) dir: Inode,
    battery: &'k Battery,
    owner: Caller,
    /// Every difference so far.
    diffs: RefCell<Vec<String>>,
}

const REG: u32 = libc::S_IFREG;

/// The scenarios, in the order they run.
fn scenarios<F: Filesystem>() -> [(&'static str, Scenario<F>); 15] {
    [
        ("root", root),
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
        ("race_lookup_rename", races::lookup_rename),
        ("race_unlink_open", races::unlink_open),
        ("race_readdir_create", races::readdir_create),
        ("race_forget_lookup", races::forget_lookup),
    ]
}

impl Battery {
    /// Declares that the filesystem answers `op` with `errno` by design
    /// (`Opcode::Rename`, `Errno::EOPNOTSUPP`): the scenarios that need it
    /// are unsupported, not failed, and the battery checks that `op`
    /// never succeeds.
    pub fn refuses(mut self, op: Opcode, errno: Errno) -> Self {
        self.refused.push((op, errno));
        self
    }

    /// The owner of what the battery creates.
    fn owner(&self) -> Caller {
        self.owner.unwrap_or_else(|| {
            if Caller::current().uid == OWNER.uid {
                Caller::new(4245, 4246, 4247)
            } else {
                OWNER
            }
        })
    }

    /// Runs every scenario on `k`. Each difference and violation stays in
    /// the kernel's checker, for [`TestKernel::finish`] to report.
    pub fn run<F: Filesystem>(&self, k: &TestKernel<F>) -> BatteryReport {
        let owner = self.owner();
        let previous = k.caller();
        // A directory of its own: `battery`, `battery.1`… for later runs,
        // made by the test's caller (who may write in the root) for the
        // owner (given to the owner where the filesystem lets the caller,
        // open to all otherwise).
        let mut dir = self.dir.unwrap_or(Inode::ROOT);
        for i in 0..100 {
            let name = match i {
                0 => "battery".to_string(),
                i => format!("battery.{i}"),
            };
            match k.mkdir(dir, &name, 0o777) {
                Ok(e) => {
                    dir = Inode(e.nodeid);
                    let _ = k.chown(dir, Some(owner.uid), Some(owner.gid));
                }
                Err(Errno::EEXIST) => continue,
                Err(_) => {}
            }
            break;
        }
        let mut report = BatteryReport::default();
        // Per declared refusal: how often it was refused, and succeeded.
        let mut declared = vec![(0usize, 0usize); self.refused.len()];
        for (name, run) in scenarios::<F>() {
            let cx = Ctx {
                k,
                dir,
                battery: self,
                owner,
                diffs: RefCell::new(Vec::new()),
            };
            k.set_caller(owner);
            let before = k.violations().len();
            k.checker().log_answers(true);
            let r = run(&cx);
            for (op, e) in k.checker().log_answers(false) {
                for (i, &(dop, de)) in self.refused.iter().enumerate() {
                    match e {
                        _ if op != dop => {}
                        Some(e) if e == de => declared[i].0 += 1,
                        None => declared[i].1 += 1,
                        Some(_) => {}
                    }
                }
            }
            let violations: Vec<Violation> = k.violations().into_iter().skip(before).collect();
            let diffs = cx.diffs.into_inner();
            for d in &diffs {
                k.checker()
                    .violate(Rule::Battery, format!("battery scenario {name}"), d.clone());
            }
            let outcome = match r {
                Err(Stop::Unsupported(why)) if diffs.is_empty() => Outcome::Unsupported(why),
                _ if diffs.is_empty() && violations.is_empty() => Outcome::Passed,
                _ if diffs.is_empty() => {
                    Outcome::Failed(vec![format!("{} protocol violation(s)", violations.len())])
                }
                _ => Outcome::Failed(diffs),
            };
            report.results.push(ScenarioResult {
                name,
                outcome,
                violations,
            });
        }
        if !self.refused.is_empty() {
            let mut diffs = Vec::new();
            for (&(op, e), &(refused, succeeded)) in self.refused.iter().zip(&declared) {
                if succeeded > 0 {
                    diffs.push(format!(
                        "{op} was declared refused with {e}, but succeeded {succeeded} time(s) (and was refused {refused} time(s))"
                    ));
                }
            }
            for d in &diffs {
                k.checker()
                    .violate(Rule::Battery, "battery: declared refusals".into(), d.clone());
            }
            report.results.push(ScenarioResult {
                name: "declared_refusals",
                outcome: if diffs.is_empty() {
                    Outcome::Passed
                } else {
                    Outcome::Failed(diffs)
                },
                violations: Vec::new(),
            });
        }
        k.set_caller(previous);
        report
    }
}

impl<F: Filesystem> Ctx<'_, F> {
    /// Records a difference (the scenario goes on).
    pub(super) fn differs(&self, d: String) {
        self.diffs.borrow_mut().push(d);
    }

    /// Why `e` (the answer to the latest request) makes the scenario
    /// unsupported, if it does.
    fn unsupported(&self, op: &str, e: Errno) -> Option<String> {
        if matches!(e, Errno::ENOSYS | Errno::EROFS) {
            return Some(format!("{op}: {e}"));
        }
        let (code, _) = self.k.checker().last_answer()?;
        self.battery
            .refused
            .iter()
            .any(|&(o, d)| o == code && d == e)
            .then(|| format!("{op}: {e} (declared)"))
    }

    /// The result of operation `op`, which the next steps need: an error
    /// stops the scenario (unsupported, or a difference).
    pub(super) fn need<T>(&self, op: &str, r: Result<T, Errno>) -> Step<T> {
        r.map_err(|e| match self.unsupported(op, e) {
            Some(why) => Stop::Unsupported(why),
            None => {
                self.differs(format!("{op}: {e}"));
                Stop::Failed
            }
        })
    }

    /// An operation that must fail with one of `want`.
    pub(super) fn expect_err<T: fmt::Debug>(&self, op: &str, r: Result<T, Errno>, want: &[Errno]) -> Step {
        match r {
            Err(e) if want.contains(&e) => Ok(()),
            Err(e) if let Some(why) = self.unsupported(op, e) => Err(Stop::Unsupported(why)),
            other => {
                self.differs(format!("{op}: {other:?}, expected {want:?}"));
                Ok(())
            }
        }
    }

    /// A step's result: a difference if not `ok` (the scenario goes on).
    pub(super) fn check(&self, what: &str, ok: bool, detail: impl FnOnce() -> String) -> Step {
        if !ok {
            self.differs(format!("{what}: {}", detail()));
        }
        Ok(())
    }

    fn create(&self, name: &str, data: &[u8], mode: u32) -> Step<(Inode, FileHandle)> {
        let (e, o) = self.need(
            &format!("CREATE {name}"),
            self.k.create(self.dir, name, REG | mode, libc::O_RDWR),
        )?;
        let (ino, fh) = (Inode(e.nodeid), FileHandle(o.fh));
        if !data.is_empty() {
            let n = self.need(&format!("WRITE {name}"), self.k.write(ino, fh, 0, data))?;
            self.check(&format!("WRITE {name}"), n as usize == data.len(), || {
                format!("{n} of {} bytes written", data.len())
            })?;
        }
        Ok((ino, fh))
    }

    fn created(&self, name: &str, data: &[u8]) -> Step<Inode> {
        let (ino, fh) = self.create(name, data, 0o644)?;
        self.need("RELEASE", self.k.release(ino, fh))?;
        Ok(ino)
    }

    /// CREATE `name` in `dir` with permission bits `mode`, then RELEASE.
    fn created_in(&self, dir: Inode, name: &str, mode: u32) -> Step<EntryOut> {
        let (e, o) = self.need(
            &format!("CREATE {name}"),
            self.k.create(dir, name, REG | mode, libc::O_RDWR),
        )?;
        self.need("RELEASE", self.k.release(Inode(e.nodeid), FileHandle(o.fh)))?;
        Ok(e)
    }

    fn read_all(&self, name: &str, ino: Inode, fh: FileHandle) -> Step<Vec<u8>> {
        self.need(&format!("READ {name}"), self.k.read(ino, fh, 0, 1 << 20))
    }

    /// Opens `ino`, reads it whole, releases it.
    fn contents(&self, name: &str, ino: Inode) -> Step<Vec<u8>> {
        let fh = FileHandle(
            self.need(&format!("OPEN {name}"), self.k.open(ino, libc::O_RDONLY))?
                .fh,
        );
        let d = self.read_all(name, ino, fh);
        self.need("RELEASE", self.k.release(ino, fh))?;
        d
    }

    fn attr(&self, name: &str, ino: Inode) -> Step<Attr> {
        Ok(self
            .need(&format!("GETATTR {name}"), self.k.getattr(ino, None))?
            .attr)
    }
}

/// The root: a directory (GETATTR), listed with `.` and `..`.
fn root<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
    let a = cx
        .need("GETATTR of the root", cx.k.getattr(Inode::ROOT, None))?
        .attr;
    cx.check("the root's type", a.mode & libc::S_IFMT == libc::S_IFDIR, || {
        super::checker::kind_name(a.mode)
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

fn create_write_read<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
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

fn hard_link<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
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

fn rename_over_existing<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
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

fn unlink_open_file<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
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

fn readdir_during_unlink<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
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

fn truncate<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
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

fn sparse_write<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
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

fn xattrs<F: Filesystem>(cx: &Ctx<'_, F>) -> Step {
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

/// The race scenarios: two threads send requests at once through one
/// [`TestKernel`], as two processes do, while the checker watches both:
/// lookup against rename, unlink against open, readdir against create,
/// forget against lookup. Each checks what POSIX allows whatever the
/// interleaving (a name found names the right node, an open file reads
/// its data, a listing is whole, a node looked up again is the same
/// node).
mod races {
    use super::{Ctx, Step};
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
}
