//! The battery's runner: the scenarios in the order they run, each run
//! in its own context as the owner, its differences and the violations
//! the checker saw gathered into its result, and the declared refusals
//! checked at the end ([`Battery::run`], [`run`]).

use super::context::{Ctx, Step, Stop};
use super::files::{create_write_read, sparse_write, truncate, unlink_open_file, xattrs};
use super::names::{hard_link, listing_inode_numbers, readdir_during_unlink, rename_over_existing, root};
use super::permissions::permissions;
use super::races;
use super::{Battery, BatteryReport, Outcome, ScenarioResult};
use crate::filesystem::Filesystem;
use crate::testing::checker::{Rule, Violation};
use crate::testing::kernel::TestKernel;
use crate::types::Inode;
use fuse_proto::Errno;
use std::cell::RefCell;

/// Runs every scenario with the default [`Battery`].
pub fn run<F: Filesystem>(k: &TestKernel<F>) -> BatteryReport {
    Battery::default().run(k)
}

type Scenario<F> = fn(&Ctx<'_, F>) -> Step;

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
