//! What the checker reports: the [`Rule`]s of the protocol, a
//! [`Violation`] of one with its `Display`, and how reports name a
//! request, a file type and a `d_type`.

use crate::attr::FileKind;
use fuse_proto::{Operation, Request};
use std::fmt;

/// A rule of the protocol the checker enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Rule {
    /// Lookup counts: a node id the kernel still holds is not reused for
    /// another node, a filesystem's own counts (when it shows them) equal
    /// the kernel's, nothing is held once everything is forgotten, and no
    /// FORGET exceeds what was looked up.
    LookupCount,
    /// Directory listings: no cookie 0 and no repeated cookie, every entry
    /// at most once per pass, none of the names that stayed skipped (also
    /// when others are unlinked during the listing), and an end.
    ReaddirCookie,
    /// Entries and attributes: a valid file type that never changes for a
    /// node, the same `st_ino` for a node, a nonzero node id and nlink in
    /// positive entries, a LINK answered with the linked node, a
    /// READDIRPLUS record whose `d_ino` and `d_type` agree with its entry.
    EntryAttr,
    /// Reply sizes: the fixed struct of the opcode at the negotiated minor,
    /// no more data than asked for, well-formed directory records, no body
    /// after an error.
    ReplySize,
    /// Error numbers: within `1..=511` and one Linux knows.
    Errno,
    /// One answer per request: no reply to an unknown or already answered
    /// request, none to a request that takes no reply, none missing.
    Answer,
    /// File handles: none used after its RELEASE (or never opened), and no
    /// `EBADF` for a handle the kernel still holds open.
    HandleAfterRelease,
    /// Attributes that move backwards: a size that shrinks without a
    /// truncate (or below what was written), a ctime that goes back.
    AttrBackwards,
    /// Results POSIX forbids, which the kernel passes on to callers:
    /// `ENOENT` for a name the kernel holds an entry for, RMDIR of a
    /// directory that holds names answered 0, a SETATTR whose reply
    /// ignores the change asked for, a short READ before the end of file,
    /// STATFS with block size 0, a symlink whose size is not its target's
    /// length.
    Posix,
    /// A handler panicked (the session answered `EIO` and went on).
    Panic,
    /// A step of the conformance [battery](crate::testing::battery) gave another
    /// result than POSIX expects.
    Battery,
}

impl Rule {
    /// Every rule.
    pub const ALL: &'static [Rule] = &[
        Rule::LookupCount,
        Rule::ReaddirCookie,
        Rule::EntryAttr,
        Rule::ReplySize,
        Rule::Errno,
        Rule::Answer,
        Rule::HandleAfterRelease,
        Rule::AttrBackwards,
        Rule::Posix,
        Rule::Panic,
        Rule::Battery,
    ];

    /// The rule's short name, as reports print it (`lookup-count`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Rule::LookupCount => "lookup-count",
            Rule::ReaddirCookie => "readdir-cookie",
            Rule::EntryAttr => "entry-attr",
            Rule::ReplySize => "reply-size",
            Rule::Errno => "errno",
            Rule::Answer => "answer",
            Rule::HandleAfterRelease => "handle-after-release",
            Rule::AttrBackwards => "attr-backwards",
            Rule::Posix => "posix",
            Rule::Panic => "panic",
            Rule::Battery => "battery",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One broken rule: which, the request that caused it, and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule.
    pub rule: Rule,
    /// The request the violation is about, e.g. `LOOKUP #12 on node 1 "f"`
    /// (empty for a check at the end, such as a leaked lookup count).
    pub request: String,
    /// What the filesystem did, and what the rule wanted.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.request.is_empty() {
            write!(f, "[{}] {}", self.rule, self.detail)
        } else {
            write!(f, "[{}] {}: {}", self.rule, self.request, self.detail)
        }
    }
}

/// A file type by name, from a mode (`S_IFMT` bits).
pub(crate) fn kind_name(mode: u32) -> String {
    match FileKind::from_mode(mode) {
        Some(FileKind::RegularFile) => "regular file".into(),
        Some(FileKind::Directory) => "directory".into(),
        Some(FileKind::Symlink) => "symlink".into(),
        Some(FileKind::CharDevice) => "character device".into(),
        Some(FileKind::BlockDevice) => "block device".into(),
        Some(FileKind::NamedPipe) => "fifo".into(),
        Some(FileKind::Socket) => "socket".into(),
        _ => format!("file of no type (mode {mode:o})"),
    }
}

/// A `d_type` by name.
pub(super) fn dt_name(d_type: u32) -> String {
    match d_type {
        0 => "DT_UNKNOWN".into(),
        t => kind_name(t << 12),
    }
}

/// A request as reports name it: `LOOKUP #12 on node 1 "f"`.
pub(super) fn describe(req: &Request<'_>) -> String {
    use Operation as O;
    let op = req.op.opcode();
    let head = format!("{op} #{} on node {}", req.header.unique, req.header.nodeid);
    let name = |n: &std::ffi::CStr| format!("{:?}", n.to_string_lossy());
    match req.op {
        O::Lookup { name: n }
        | O::Unlink { name: n }
        | O::Rmdir { name: n }
        | O::Mkdir { name: n, .. }
        | O::Mknod { name: n, .. }
        | O::Create { name: n, .. }
        | O::Symlink { name: n, .. } => format!("{head} {}", name(n)),
        O::Link { arg, name: n } => format!("{head} {} (node {})", name(n), arg.oldnodeid),
        O::Rename {
            arg,
            name: n,
            newname,
        } => format!("{head} {} to node {} {}", name(n), arg.newdir, name(newname)),
        O::Rename2 {
            arg,
            name: n,
            newname,
        } => format!("{head} {} to node {} {}", name(n), arg.newdir, name(newname)),
        O::Read { arg } | O::Readdir { arg } | O::Readdirplus { arg } => {
            format!("{head} (fh {}, offset {}, size {})", arg.fh, arg.offset, arg.size)
        }
        O::Write { arg, .. } => format!(
            "{head} (fh {}, offset {}, {} bytes)",
            arg.fh, arg.offset, arg.size
        ),
        O::Getxattr { name: n, .. } | O::Removexattr { name: n } | O::Setxattr { name: n, .. } => {
            format!("{head} {}", name(n))
        }
        _ => head,
    }
}
