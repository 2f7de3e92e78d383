//! File handles: the handles the kernel holds open, a handle used after
//! its RELEASE or never opened, and the handle a request carries.

use super::{Checker, Rule};
use crate::types::Inode;
use fuse_proto::abi::OpenOut;
use fuse_proto::flags::{FopenFlags, GetattrFlags, SetattrValid};
use fuse_proto::{Operation, Request};

/// The (node, handle) a request uses, if it carries one.
pub(super) fn handle_of(req: &Request<'_>) -> Option<(u64, u64)> {
    use Operation as O;
    let node = req.header.nodeid;
    let fh = match req.op {
        O::Read { arg } | O::Readdir { arg } | O::Readdirplus { arg } => arg.fh,
        O::Write { arg, .. } => arg.fh,
        O::Flush { arg } => arg.fh,
        O::Fsync { arg } | O::Fsyncdir { arg } => arg.fh,
        O::Release { arg } | O::Releasedir { arg } => arg.fh,
        O::Lseek { arg } => arg.fh,
        O::Fallocate { arg } => arg.fh,
        O::Getlk { arg } | O::Setlk { arg } | O::Setlkw { arg } => arg.fh,
        O::Getattr { arg }
            if GetattrFlags::from_bits_retain(arg.getattr_flags).contains(GetattrFlags::FH) =>
        {
            arg.fh
        }
        O::Setattr { arg } if SetattrValid::from_bits_retain(arg.valid).contains(SetattrValid::FH) => arg.fh,
        _ => return None,
    };
    Some((node, fh))
}

impl Checker {
    /// The files and directories the kernel holds open: (node, handle).
    pub fn open_handles(&self) -> Vec<(Inode, u64)> {
        let mut v: Vec<_> = self.open.keys().map(|&(n, fh)| (Inode(n), fh)).collect();
        v.sort();
        v
    }

    pub(super) fn check_handle_use(&mut self, req: &Request<'_>, what: &str) {
        let Some(key) = handle_of(req) else { return };
        if self.open.contains_key(&key) {
            return;
        }
        let detail = if self.released.contains(&key) {
            format!(
                "handle {} of node {} was released: the kernel never uses a handle after RELEASE",
                key.1, key.0
            )
        } else {
            format!("handle {} of node {} was never opened", key.1, key.0)
        };
        self.violate(Rule::HandleAfterRelease, what.into(), detail);
    }

    pub(super) fn opened(&mut self, node: u64, o: &OpenOut) {
        *self.open.entry((node, o.fh)).or_default() += 1;
        if FopenFlags::from_bits_retain(o.open_flags).contains(FopenFlags::DIRECT_IO) {
            self.direct_io.insert((node, o.fh));
        }
    }
}
