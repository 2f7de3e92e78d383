//! Lookup counts and entries: what each entry adds to the kernel's count
//! of a node and each FORGET takes away, a node id reused too early or
//! with its old generation, the entries of requests that create a name,
//! and the kernel's counts compared with the filesystem's own.

use super::report::kind_name;
use super::{Checker, Node, Rule};
use crate::attr::FileKind;
use crate::testing::wire::is_dot_or_dotdot;
use crate::types::Inode;
use fuse_proto::abi::EntryOut;
use fuse_proto::consts::ROOT_ID;
use std::collections::BTreeMap;

/// How many requests a lookup-count difference names as its cause.
const BLAMED: usize = 8;

impl Checker {
    /// The lookup counts the kernel holds, by node id (the root is never
    /// counted).
    pub fn lookup_counts(&self) -> Vec<(Inode, u64)> {
        let mut v: Vec<_> = self
            .nodes
            .iter()
            .map(|(&n, s)| (Inode(n), s.lookups))
            .filter(|&(_, c)| c > 0)
            .collect();
        v.sort();
        v
    }

    /// Compares the filesystem's own lookup counts with the kernel's
    /// (rule [`Rule::LookupCount`]); `what` names the moment, e.g. `after
    /// the test`.
    pub fn compare_lookup_counts(&mut self, fs: &[(Inode, u64)], what: &str) {
        let mut fs: Vec<_> = fs
            .iter()
            .copied()
            .filter(|&(i, c)| i != Inode::ROOT && c > 0)
            .collect();
        fs.sort();
        let kernel = self.lookup_counts();
        let fsm: BTreeMap<_, _> = fs.into_iter().collect();
        let km: BTreeMap<_, _> = kernel.into_iter().collect();
        let all: std::collections::BTreeSet<u64> = fsm.keys().chain(km.keys()).map(|n| n.0).collect();
        for n in all {
            let (a, b) = (
                km.get(&Inode(n)).copied().unwrap_or(0),
                fsm.get(&Inode(n)).copied().unwrap_or(0),
            );
            let blamed = self.blame.remove(&n).unwrap_or_default();
            if a == b {
                continue;
            }
            // The requests that moved the kernel's count since the
            // filesystem's last agreed: one of them it counted wrong.
            let (request, since) = match blamed.split_last() {
                Some((last, [])) => (last.clone(), String::new()),
                Some((last, earlier)) => (
                    last.clone(),
                    format!(
                        " (or one of the requests before it that moved the count: {})",
                        earlier.join(", ")
                    ),
                ),
                None => (String::new(), String::new()),
            };
            self.violate(
                Rule::LookupCount,
                request,
                format!("{what}: node {n}: the kernel holds {a}, the filesystem counts {b}{since}"),
            );
        }
        self.blame.clear();
    }

    /// Notes that `what` moved the kernel's count of `node`.
    fn moved(&mut self, node: u64, what: &str) {
        let b = self.blame.entry(node).or_default();
        if b.len() == BLAMED {
            b.remove(0);
        }
        b.push(what.to_string());
    }

    pub(super) fn forget(&mut self, node: u64, n: u64, what: &str) {
        self.moved(node, what);
        match self.nodes.get_mut(&node) {
            Some(s) if s.lookups >= n => {
                s.lookups -= n;
                if s.lookups == 0 {
                    self.drop_node(node);
                }
            }
            Some(s) => {
                let held = s.lookups;
                self.drop_node(node);
                self.violate(
                    Rule::LookupCount,
                    what.into(),
                    format!("FORGET of {n} references to node {node}, which the kernel holds {held} times"),
                );
            }
            None => self.violate(
                Rule::LookupCount,
                what.into(),
                format!("FORGET of node {node}, which the kernel does not hold"),
            ),
        }
    }

    /// The kernel no longer holds `node`: its id may name another node
    /// next, with other names in it.
    fn drop_node(&mut self, node: u64) {
        if let Some(n) = self.nodes.remove(&node) {
            self.forgotten.insert(node, (n.generation, n.ino));
        }
        self.names.remove(&node);
        self.entered.remove(&node);
        for names in self.entered.values_mut() {
            names.retain(|_, (n, _)| *n != node);
        }
    }

    /// The entry of a request that creates `name` in `dir` as a file of
    /// type `kind` (`S_IFREG`, …).
    pub(super) fn created(&mut self, dir: u64, name: &[u8], e: &EntryOut, kind: u32, what: &str) -> bool {
        self.add_name(dir, name, true);
        if e.nodeid != 0 && e.attr.mode & libc::S_IFMT != kind && FileKind::from_mode(e.attr.mode).is_some() {
            self.violate(
                Rule::EntryAttr,
                what.into(),
                format!(
                    "the new node {} is a {}, not the {} asked for (the kernel answers EIO)",
                    e.nodeid,
                    kind_name(e.attr.mode),
                    kind_name(kind)
                ),
            );
            return false;
        }
        if let Some(s) = self.nodes.get(&e.nodeid)
            && s.generation == e.generation
        {
            self.violate(
                Rule::LookupCount,
                what.into(),
                format!(
                    "the new file got node {}, which the kernel holds as another file (the two become one inode for callers)",
                    e.nodeid
                ),
            );
        }
        self.entry(e, what, false, Some((dir, name)))
    }

    /// A positive or negative entry of a reply, for `name` in `dir` if
    /// it names one; false if the kernel would refuse it (`EIO`).
    pub(super) fn entry(&mut self, e: &EntryOut, what: &str, lookup: bool, at: Option<(u64, &[u8])>) -> bool {
        if e.nodeid == 0 {
            if !lookup {
                self.violate(
                    Rule::EntryAttr,
                    what.into(),
                    "node id 0 in an entry that creates a name (the kernel fails it with EIO)".into(),
                );
            }
            return lookup;
        }
        if e.attr.nlink == 0 {
            self.violate(
                Rule::EntryAttr,
                what.into(),
                format!("node {} reached by a name has nlink 0", e.nodeid),
            );
        }
        if !self.valid_attr(&e.attr, e.nodeid, what) {
            return false;
        }
        let dots = at.is_some_and(|(_, n)| is_dot_or_dotdot(n));
        if e.nodeid == ROOT_ID {
            if dots {
                return true; // the kernel holds the root itself
            }
            let name = at.map_or_else(String::new, |(_, n)| {
                format!(" for {:?}", String::from_utf8_lossy(n))
            });
            self.violate(
                Rule::EntryAttr,
                what.into(),
                format!("node id 1, the root's, in an entry{name} (the kernel answers EIO, or makes the name an alias of the root)"),
            );
            return false;
        }
        match self.nodes.get(&e.nodeid) {
            Some(s) if s.generation != e.generation => {
                let (old, held) = (s.generation, s.lookups);
                self.violate(
                    Rule::LookupCount,
                    what.into(),
                    format!("node {} came back with generation {} while the kernel still holds it {held} times with generation {old}: the filesystem forgot it too early", e.nodeid, e.generation),
                );
                self.drop_node(e.nodeid);
            }
            Some(_) => {}
            None => {
                if let Some((generation, ino)) = self.forgotten.remove(&e.nodeid)
                    && generation == e.generation
                    && (!lookup || ino != e.attr.ino)
                {
                    self.violate(
                        Rule::LookupCount,
                        what.into(),
                        format!("node id {} names another file with the generation {generation} it had before the kernel forgot it: an NFS file handle of the old file now opens this one (a reused node id needs a new generation)", e.nodeid),
                    );
                }
            }
        }
        // A changed type makes the kernel drop its old inode and take a
        // new one: the entry itself is accepted.
        let _ = self.attr(e.nodeid, &e.attr, what);
        if let Some(s) = self.nodes.get_mut(&e.nodeid) {
            s.lookups += 1;
        } else {
            self.nodes.insert(
                e.nodeid,
                Node {
                    lookups: 1,
                    generation: e.generation,
                    ino: e.attr.ino,
                    kind: e.attr.mode & libc::S_IFMT,
                    size: e.attr.size,
                    truncated: false,
                    ctime: (e.attr.ctime, e.attr.ctimensec),
                    ctime_set: false,
                    link_len: None,
                    parent: None,
                },
            );
        }
        self.moved(e.nodeid, what);
        if let Some((dir, name)) = at
            && !dots
        {
            if self.quiet {
                self.enter(dir, name, e.nodeid, what);
            } else if let Some(m) = self.entered.get_mut(&dir) {
                m.remove(name);
            }
        }
        true
    }
}
