//! The names of each directory: the names known and the dentries the
//! kernel holds, added, removed, renamed and exchanged; `ENOENT` for a
//! name the kernel holds, and RMDIR of a directory that holds names.

use super::{Checker, Rule};

impl Checker {
    /// Says that names changed outside the conversation (a file created
    /// or removed behind the filesystem's back, in its backing store):
    /// the checker forgets the names it knew, so that it blames no reply
    /// for them.
    pub fn names_changed_outside(&mut self) {
        self.names.clear();
        self.entered.clear();
        for p in self.passes.values_mut() {
            p.expected.clear();
        }
    }

    /// A LOOKUP of `name` in `dir` found nothing (an error or a negative
    /// entry): wrong if the kernel holds an entry for it that no request
    /// removed.
    pub(super) fn missing(&mut self, dir: u64, name: &[u8], what: &str) {
        if self.quiet
            && let Some((node, by)) = self.entered.get(&dir).and_then(|m| m.get(name))
        {
            let detail = format!(
                "ENOENT for {:?}, which the kernel holds as node {node} from {by} and no request removed since (the file vanishes for callers whose cache expired, and is there for the others)",
                String::from_utf8_lossy(name)
            );
            self.violate(Rule::Posix, what.into(), detail);
        }
        if let Some(n) = self.names.get_mut(&dir) {
            n.remove(name);
        }
        if let Some(n) = self.entered.get_mut(&dir) {
            n.remove(name);
        }
    }

    /// RMDIR of `name` in `dir` answered 0: wrong if the directory holds
    /// names the kernel knows and no request removed.
    pub(super) fn rmdir_of_nonempty(&mut self, dir: u64, name: &[u8], what: &str) {
        if !self.quiet {
            return;
        }
        let Some(&(child, _)) = self.entered.get(&dir).and_then(|m| m.get(name)) else {
            return;
        };
        let Some(inside) = self.names.get(&child).filter(|n| !n.is_empty()) else {
            return;
        };
        let mut inside: Vec<String> = inside
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        inside.sort();
        inside.truncate(4);
        self.violate(
            Rule::Posix,
            what.into(),
            format!(
                "RMDIR answered 0 for node {child}, which still holds {inside:?} (rmdir(2) must fail with ENOTEMPTY: the files in it are lost)"
            ),
        );
    }

    pub(super) fn add_name(&mut self, dir: u64, name: &[u8], created: bool) {
        self.names.entry(dir).or_default().insert(name.to_vec());
        if created {
            for ((d, _), p) in self.passes.iter_mut() {
                if *d == dir {
                    p.created.insert(name.to_vec());
                }
            }
        }
    }

    pub(super) fn remove_name(&mut self, dir: u64, name: &[u8]) {
        if let Some(n) = self.names.get_mut(&dir) {
            n.remove(name);
        }
        if let Some(n) = self.entered.get_mut(&dir) {
            n.remove(name);
        }
        for ((d, _), p) in self.passes.iter_mut() {
            if *d == dir {
                p.expected.remove(name);
            }
        }
    }

    pub(super) fn rename(&mut self, dir: u64, name: &[u8], newdir: u64, newname: &[u8], flags: u32) {
        let moved = self.entered.get_mut(&dir).and_then(|m| m.remove(name));
        if flags & libc::RENAME_EXCHANGE != 0 {
            // Both names stay, each naming the other's node.
            let other = self.entered.get_mut(&newdir).and_then(|m| m.remove(newname));
            if let Some(o) = other {
                self.enter(dir, name, o.0, &o.1);
            }
            if let Some(m) = moved {
                self.enter(newdir, newname, m.0, &m.1);
            }
            return;
        }
        self.remove_name(dir, name);
        self.remove_name(newdir, newname);
        self.add_name(newdir, newname, true);
        if let Some(m) = moved
            && self.quiet
        {
            self.enter(newdir, newname, m.0, &m.1);
        }
    }

    /// The kernel holds a dentry `name` in `dir` for `node`.
    pub(super) fn enter(&mut self, dir: u64, name: &[u8], node: u64, by: &str) {
        if let Some(s) = self.nodes.get_mut(&node)
            && s.kind == libc::S_IFDIR
        {
            s.parent = Some(dir);
        }
        self.entered
            .entry(dir)
            .or_default()
            .insert(name.to_vec(), (node, by.to_string()));
    }
}
