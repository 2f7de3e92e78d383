//! Attributes: a valid file type and size, a type and `st_ino` that never
//! change for a node, sizes and ctimes that do not go back, the root's
//! attributes, a symlink's size, a SETATTR's reply against the change
//! asked for, and a short READ before the end of file.

use super::report::kind_name;
use super::{Checker, Rule};
use crate::attr::FileKind;
use fuse_proto::abi::{Attr, ReadIn, SetattrIn};
use fuse_proto::consts::ROOT_ID;
use fuse_proto::flags::SetattrValid;

impl Checker {
    /// A symlink's size against its target's length.
    pub(super) fn link_size(&mut self, node: u64, a: &Attr, what: &str) {
        let Some(s) = self.nodes.get(&node) else { return };
        if a.mode & libc::S_IFMT != libc::S_IFLNK {
            return;
        }
        if let Some(len) = s.link_len
            && a.size != len
        {
            self.violate(
                Rule::Posix,
                what.into(),
                format!(
                    "symlink node {node} has size {} but its target is {len} bytes (programs that size their readlink(2) buffer by st_size cut the target short)",
                    a.size
                ),
            );
        }
    }

    /// A SETATTR reply's attributes against the change asked for.
    pub(super) fn setattr_applied(&mut self, arg: &SetattrIn, a: &Attr, what: &str) {
        let valid = SetattrValid::from_bits_retain(arg.valid);
        let mut ignored = Vec::new();
        if valid.contains(SetattrValid::MODE) && a.mode & 0o777 != arg.mode & 0o777 {
            ignored.push(format!(
                "mode {:o} asked, {:o} answered",
                arg.mode & 0o7777,
                a.mode & 0o7777
            ));
        }
        if valid.contains(SetattrValid::SIZE) && a.size != arg.size {
            ignored.push(format!("size {} asked, {} answered", arg.size, a.size));
        }
        if valid.contains(SetattrValid::UID) && a.uid != arg.uid {
            ignored.push(format!("uid {} asked, {} answered", arg.uid, a.uid));
        }
        if valid.contains(SetattrValid::GID) && a.gid != arg.gid {
            ignored.push(format!("gid {} asked, {} answered", arg.gid, a.gid));
        }
        let now = SetattrValid::MTIME_NOW;
        if valid.contains(SetattrValid::MTIME) && !valid.contains(now) && a.mtime != arg.mtime {
            ignored.push(format!("mtime {} asked, {} answered", arg.mtime, a.mtime));
        }
        let now = SetattrValid::ATIME_NOW;
        if valid.contains(SetattrValid::ATIME) && !valid.contains(now) && a.atime != arg.atime {
            ignored.push(format!("atime {} asked, {} answered", arg.atime, a.atime));
        }
        if !ignored.is_empty() {
            self.violate(
                Rule::Posix,
                what.into(),
                format!(
                    "the reply ignores the change asked for ({}): the caller's chmod, truncate, chown or touch succeeded and did nothing",
                    ignored.join(", ")
                ),
            );
        }
    }

    /// A READ answered with fewer bytes than asked for, before the end
    /// of file the kernel knows: the kernel takes it for the end of file.
    pub(super) fn short_read(&mut self, node: u64, arg: &ReadIn, got: usize, what: &str) {
        let Some(s) = self.nodes.get(&node) else { return };
        let end = arg.offset.saturating_add(got as u64);
        if got < arg.size as usize
            && end < s.size
            && !s.truncated
            && !self.direct_io.contains(&(node, arg.fh))
        {
            let size = s.size;
            self.violate(
                Rule::Posix,
                what.into(),
                format!(
                    "{got} bytes, short of the {} asked for, ending at {end} before the end of file at {size}: the kernel takes a short read for the end of file (readers see the file cut at {end})",
                    arg.size
                ),
            );
        }
    }

    pub(super) fn valid_attr(&mut self, a: &Attr, node: u64, what: &str) -> bool {
        if FileKind::from_mode(a.mode).is_none() {
            self.violate(
                Rule::EntryAttr,
                what.into(),
                format!(
                    "node {node} has mode {:o}, which is no file type (the kernel answers EIO)",
                    a.mode
                ),
            );
            return false;
        }
        if a.size > i64::MAX as u64 {
            self.violate(
                Rule::EntryAttr,
                what.into(),
                format!(
                    "node {node} has size {}, beyond what the kernel accepts (EIO)",
                    a.size
                ),
            );
            return false;
        }
        true
    }

    /// Attributes of a node the kernel may know; false if a GETATTR
    /// answered so fails with `EIO` (invalid, or another file type).
    pub(super) fn attr(&mut self, node: u64, a: &Attr, what: &str) -> bool {
        if !self.valid_attr(a, node, what) {
            return false;
        }
        if node == ROOT_ID {
            return self.root_attr(a, what);
        }
        self.link_size(node, a, what);
        let Some(s) = self.nodes.get_mut(&node) else {
            return true;
        };
        let mut found = Vec::new();
        let same_type = a.mode & libc::S_IFMT == s.kind;
        if !same_type {
            found.push((Rule::EntryAttr, format!("node {node} changed its file type from {} to {} (the kernel marks the inode bad: EIO until it is forgotten)", kind_name(s.kind), kind_name(a.mode))));
            s.kind = a.mode & libc::S_IFMT;
        }
        if a.ino != s.ino {
            found.push((
                Rule::EntryAttr,
                format!(
                    "node {node} reports st_ino {} after {} (programs take it for another file)",
                    a.ino, s.ino
                ),
            ));
            s.ino = a.ino;
        }
        if a.size < s.size && !s.truncated {
            found.push((
                Rule::AttrBackwards,
                format!(
                    "node {node} shrank from {} to {} bytes without a truncate",
                    s.size, a.size
                ),
            ));
        }
        let ctime = (a.ctime, a.ctimensec);
        if ctime < s.ctime && !s.ctime_set {
            found.push((
                Rule::AttrBackwards,
                format!(
                    "node {node}'s ctime went back from {}.{:09} to {}.{:09}",
                    s.ctime.0, s.ctime.1, ctime.0, ctime.1
                ),
            ));
        }
        s.size = a.size;
        s.truncated = false;
        s.ctime = ctime;
        s.ctime_set = false;
        for (rule, d) in found {
            self.violate(rule, what.into(), d);
        }
        same_type
    }

    /// The root's attributes: a directory, of one `st_ino`.
    fn root_attr(&mut self, a: &Attr, what: &str) -> bool {
        if a.mode & libc::S_IFMT != libc::S_IFDIR {
            self.violate(
                Rule::EntryAttr,
                what.into(),
                format!(
                    "the root is a {}, not a directory (the kernel marks it bad: EIO on every path of the mount)",
                    kind_name(a.mode)
                ),
            );
            return false;
        }
        match self.root_ino {
            Some(ino) if ino != a.ino => self.violate(
                Rule::EntryAttr,
                what.into(),
                format!(
                    "the root reports st_ino {} after {ino} (programs take it for another directory)",
                    a.ino
                ),
            ),
            _ => self.root_ino = Some(a.ino),
        }
        true
    }
}
