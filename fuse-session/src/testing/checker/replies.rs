//! Each reply, by opcode, handed to the rules that check it: what an
//! error reply and what a success reply teach the checker (entries made,
//! handles opened and released, sizes written, names removed and moved,
//! listings) and which checks they get.

use super::handles::handle_of;
use super::report::{dt_name, kind_name};
use super::{Checker, Rule};
use crate::testing::wire::{DirEntry, ReplyBody, is_dot_or_dotdot};
use fuse_proto::abi::Attr;
use fuse_proto::{Errno, Operation, Request};

impl Checker {
    pub(super) fn after_error(&mut self, req: &Request<'_>, errno: Errno, what: &str) {
        let node = req.header.nodeid;
        if errno == Errno::EBADF
            && let Some(key) = handle_of(req)
            && self.open.contains_key(&key)
        {
            self.violate(
                Rule::HandleAfterRelease,
                what.into(),
                format!(
                    "EBADF for handle {} of node {}, which the kernel holds open (not released)",
                    key.1, key.0
                ),
            );
        }
        if let Operation::Lookup { name } = req.op
            && errno == Errno::ENOENT
        {
            self.missing(node, name.to_bytes(), what);
        }
    }

    /// Learns from a success reply and checks it; false if the kernel
    /// would fail the request with `EIO` instead (attributes it refuses).
    pub(super) fn after_success(&mut self, req: &Request<'_>, body: &ReplyBody, what: &str) -> bool {
        use Operation as O;
        let node = req.header.nodeid;
        let mut accepted = true;
        match (&req.op, body) {
            (O::Lookup { name }, ReplyBody::Entry(e)) => {
                if e.nodeid == 0 {
                    self.missing(node, name.to_bytes(), what);
                } else if self.quiet {
                    self.add_name(node, name.to_bytes(), false);
                }
                accepted = self.entry(e, what, true, Some((node, name.to_bytes())));
            }
            (O::Mknod { name, arg }, ReplyBody::Entry(e)) => {
                accepted = self.created(node, name.to_bytes(), e, arg.mode & libc::S_IFMT, what);
            }
            (O::Mkdir { name, .. }, ReplyBody::Entry(e)) => {
                accepted = self.created(node, name.to_bytes(), e, libc::S_IFDIR, what);
            }
            (O::Symlink { name, target }, ReplyBody::Entry(e)) => {
                accepted = self.created(node, name.to_bytes(), e, libc::S_IFLNK, what);
                let len = target.to_bytes().len() as u64;
                if accepted && let Some(s) = self.nodes.get_mut(&e.nodeid) {
                    s.link_len = Some(len);
                }
                self.link_size(e.nodeid, &e.attr, what);
            }
            (O::Link { arg, name }, ReplyBody::Entry(e)) => {
                self.add_name(node, name.to_bytes(), true);
                if e.nodeid != arg.oldnodeid {
                    self.violate(
                        Rule::EntryAttr,
                        what.into(),
                        format!(
                            "LINK answered node {}, not the linked node {}",
                            e.nodeid, arg.oldnodeid
                        ),
                    );
                } else if e.attr.nlink < 2 {
                    self.violate(
                        Rule::EntryAttr,
                        what.into(),
                        format!("nlink {} after a LINK (a second name)", e.attr.nlink),
                    );
                }
                accepted = self.entry(e, what, false, Some((node, name.to_bytes())));
            }
            (O::Create { name, .. } | O::AtomicOpen { name, .. }, ReplyBody::Created(e, o)) => {
                accepted = self.created(node, name.to_bytes(), e, libc::S_IFREG, what);
                if accepted {
                    self.opened(e.nodeid, o);
                }
            }
            (O::Tmpfile { .. }, ReplyBody::Created(e, o)) => {
                accepted = self.entry(e, what, false, None);
                if accepted {
                    self.opened(e.nodeid, o);
                }
            }
            (O::Getattr { .. }, ReplyBody::Attr(a)) => {
                accepted = self.attr(node, &a.attr, what);
            }
            (O::Setattr { arg }, ReplyBody::Attr(a)) => {
                accepted = self.attr(node, &a.attr, what);
                self.setattr_applied(arg, &a.attr, what);
            }
            (O::Open { .. } | O::Opendir { .. }, ReplyBody::Open(o)) => self.opened(node, o),
            (O::Release { arg } | O::Releasedir { arg }, _) => {
                let key = (node, arg.fh);
                if let Some(n) = self.open.get_mut(&key) {
                    *n -= 1;
                    if *n == 0 {
                        self.open.remove(&key);
                        self.released.insert(key);
                        self.passes.remove(&key);
                        self.direct_io.remove(&key);
                    }
                }
            }
            (O::Write { arg, .. }, ReplyBody::Written(n)) => {
                if let Some(s) = self.nodes.get_mut(&node) {
                    s.size = s.size.max(arg.offset.saturating_add(u64::from(*n)));
                }
            }
            (O::Read { arg }, ReplyBody::Data(d)) => self.short_read(node, arg, d.len(), what),
            (O::Readlink, ReplyBody::Data(d)) => {
                if let Some(s) = self.nodes.get_mut(&node) {
                    s.link_len = Some(d.len() as u64);
                    let attr = Attr {
                        size: s.size,
                        mode: s.kind,
                        ..Attr::default()
                    };
                    self.link_size(node, &attr, what);
                }
            }
            (O::Statfs, ReplyBody::Statfs(st)) if st.st.bsize == 0 => {
                self.violate(
                    Rule::Posix,
                    what.into(),
                    "block size 0: df and statvfs(3) callers divide by it (a crash, or sizes of 0)".into(),
                );
            }
            (O::Unlink { name }, _) => self.remove_name(node, name.to_bytes()),
            (O::Rmdir { name }, _) => {
                self.rmdir_of_nonempty(node, name.to_bytes(), what);
                self.remove_name(node, name.to_bytes());
            }
            (O::Rename { arg, name, newname }, _) => {
                self.rename(node, name.to_bytes(), arg.newdir, newname.to_bytes(), 0)
            }
            (O::Rename2 { arg, name, newname }, _) => {
                self.rename(node, name.to_bytes(), arg.newdir, newname.to_bytes(), arg.flags)
            }
            (O::Readdir { arg }, ReplyBody::Dir(d)) => {
                let records: Vec<&DirEntry> = d.iter().collect();
                self.listing(node, arg.fh, &records, what);
            }
            (O::Readdirplus { arg }, ReplyBody::DirPlus(d)) => {
                for p in d {
                    if is_dot_or_dotdot(&p.dirent.name) || p.entry.nodeid == 0 {
                        continue;
                    }
                    if p.dirent.ino != p.entry.attr.ino {
                        self.violate(
                            Rule::EntryAttr,
                            what.into(),
                            format!(
                                "the record {:?} has d_ino {} but its entry st_ino {}",
                                p.dirent.name_lossy(),
                                p.dirent.ino,
                                p.entry.attr.ino
                            ),
                        );
                    }
                    if p.dirent.kind != (p.entry.attr.mode & libc::S_IFMT) >> 12 {
                        self.violate(
                            Rule::EntryAttr,
                            what.into(),
                            format!(
                                "the record {:?} has d_type {} but its entry says {}",
                                p.dirent.name_lossy(),
                                dt_name(p.dirent.kind),
                                kind_name(p.entry.attr.mode)
                            ),
                        );
                    }
                    // A record the kernel refuses is skipped, not the listing.
                    let _ = self.entry(&p.entry, what, true, Some((node, &p.dirent.name)));
                }
                let records: Vec<&DirEntry> = d.iter().map(|p| &p.dirent).collect();
                self.listing(node, arg.fh, &records, what);
            }
            _ => {}
        }
        accepted
    }
}
