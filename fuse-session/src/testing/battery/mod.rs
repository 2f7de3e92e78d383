//! The conformance battery: POSIX scenarios run through a [`TestKernel`](super::TestKernel)
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
//! [`Rule::Battery`](super::Rule::Battery) violation, so that [`TestKernel::finish`](super::TestKernel::finish) reports it
//! even when the report is not looked at.
//!
//! Every scenario works in one directory (`battery` under the root, or
//! `battery.1`… when it exists, or the root itself where MKDIR is not
//! implemented), with names of its own.
//!
//! # The folder
//!
//! This module holds the battery's settings ([`Battery`], [`OWNER`]); one
//! file a concern beside it: the runner (`runner.rs`: the scenarios in the
//! order they run, [`Battery::run`], [`run`]), the report (`report.rs`:
//! [`BatteryReport`], [`ScenarioResult`], [`Outcome`]), the context a
//! scenario runs in and its steps (`context.rs`), and the scenarios by
//! group: names and directories (`names.rs`), file contents and
//! attributes (`files.rs`), permissions (`permissions.rs`) and races of
//! two threads (`races.rs`). It uses the test kit's kernel, checker and
//! wire types ([`TestKernel`](super::TestKernel), [`Rule`](super::Rule)).

mod context;
mod files;
mod names;
mod permissions;
mod races;
mod report;
mod runner;

pub use report::{BatteryReport, Outcome, ScenarioResult};
pub use runner::run;

use super::wire::Caller;
use crate::types::Inode;
use fuse_proto::{Errno, Opcode};

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
}
