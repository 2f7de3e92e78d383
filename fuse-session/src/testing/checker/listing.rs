//! Directory listings: each pass over a directory through one handle
//! (cookies, names seen once, names that stayed and must appear, an
//! end), and the `d_ino` of the records against what the kernel knows.

use super::{Checker, Rule};
use crate::testing::wire::{DirEntry, is_dot_or_dotdot};
use fuse_proto::consts::ROOT_ID;

impl Checker {
    /// The `st_ino` the kernel knows for `node`.
    fn ino_of(&self, node: u64) -> Option<u64> {
        if node == ROOT_ID {
            return self.root_ino;
        }
        self.nodes.get(&node).map(|s| s.ino)
    }

    /// `d_ino` of directory records against what the kernel knows of the
    /// names: `.` is the directory, `..` its parent, a name the node the
    /// kernel holds for it.
    fn record_inos(&mut self, dir: u64, records: &[&DirEntry], what: &str) {
        if !self.quiet {
            return;
        }
        let mut found = Vec::new();
        for r in records {
            let (want, whose) = match r.name.as_slice() {
                b"." => (self.ino_of(dir), format!("the directory's (node {dir})")),
                b".." if dir == ROOT_ID => (None, String::new()),
                b".." => match self.nodes.get(&dir).and_then(|s| s.parent) {
                    Some(p) => (self.ino_of(p), format!("the parent's (node {p})")),
                    None => (None, String::new()),
                },
                name => match self.entered.get(&dir).and_then(|m| m.get(name)) {
                    Some(&(n, _)) => (self.ino_of(n), format!("node {n}'s")),
                    None => (None, String::new()),
                },
            };
            // A layer that does not know a directory's parent lists `..`
            // as the directory itself (the kernel never reads it): that
            // is tolerated, another node is not.
            let own = r.name == b".." && self.ino_of(dir) == Some(r.ino);
            if let Some(want) = want
                && r.ino != want
                && !own
            {
                found.push(format!(
                    "the record {:?} has d_ino {}, but st_ino {want} is {whose} (find, ls -i, du and pwd's walk up see another file)",
                    r.name_lossy(),
                    r.ino
                ));
            }
        }
        for d in found {
            self.violate(Rule::EntryAttr, what.into(), d);
        }
    }

    pub(super) fn listing(&mut self, dir: u64, fh: u64, records: &[&DirEntry], what: &str) {
        self.record_inos(dir, records, what);
        if self.quiet {
            for r in records {
                if !is_dot_or_dotdot(&r.name) {
                    self.names.entry(dir).or_default().insert(r.name.clone());
                }
            }
        }
        let Some(pass) = self.passes.get_mut(&(dir, fh)) else {
            return;
        };
        if pass.broken {
            return;
        }
        let mut found = Vec::new();
        if records.is_empty() {
            let mut missing: Vec<String> = pass
                .expected
                .difference(&pass.seen)
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect();
            missing.sort();
            if !missing.is_empty() {
                found.push(format!(
                    "the listing ended without {missing:?}, which were there all along"
                ));
            }
        }
        for r in records {
            if r.offset == 0 {
                found.push(format!(
                    "{:?} has cookie 0: continuing from it starts the listing over (ls never ends)",
                    r.name_lossy()
                ));
            } else if !pass.cookies.insert(r.offset) {
                found.push(format!("cookie {} given twice in one listing", r.offset));
            }
            if !pass.seen.insert(r.name.clone()) && !pass.created.contains(&r.name) {
                found.push(format!("{:?} listed twice in one pass", r.name_lossy()));
            }
        }
        if !found.is_empty() {
            pass.broken = true;
        }
        for d in found {
            self.violate(Rule::ReaddirCookie, what.into(), d);
        }
    }

    /// Whether the current pass over `(dir, fh)` broke a rule (the kit
    /// stops listing it).
    pub(crate) fn pass_broken(&self, dir: u64, fh: u64) -> bool {
        self.passes.get(&(dir, fh)).is_some_and(|p| p.broken)
    }
}
