//! The protocol checker: watches every request the kernel sends and every
//! message the filesystem writes back, keeps what the kernel would know
//! (lookup counts, open handles, each node's identity and attributes, the
//! names of each directory), and reports each reply that breaks one of the
//! protocol's rules as a [`Violation`] naming the [`Rule`] and the request.
//!
//! It is the one place where replies are decoded against their requests:
//! [`TestKernel`](super::TestKernel) feeds it both directions and takes its
//! decoded [`Answer`]s. It can also check another server's conversation
//! (a filesystem speaking the protocol with [`fuse_proto`] directly): feed
//! it the bytes with [`Checker::request`] and [`Checker::reply`].
//!
//! `docs/testing.md` lists each rule with the kernel behaviour it protects
//! and what a violation does to a user in production.

use super::wire::{self, DirEntry, Malformed, ReplyBody, is_dot_or_dotdot};
use crate::attr::FileKind;
use crate::types::Inode;
use fuse_proto::abi::{Attr, EntryOut, OpenOut, OutHeader, ReadIn, SetattrIn};
use fuse_proto::consts::{INT_REQ_BIT, MAX_ERRNO, ROOT_ID};
use fuse_proto::flags::{FopenFlags, GetattrFlags, SetattrValid};
use fuse_proto::request::ParseConfig;
use fuse_proto::{Errno, Opcode, Operation, Request};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use zerocopy::FromBytes;

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
    /// A step of the conformance [battery](super::battery) gave another
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

/// A reply the checker matched to its request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The request's unique.
    pub unique: u64,
    /// The decoded body, or the error (a malformed reply is `EIO`, as the
    /// kernel gives the caller).
    pub result: Result<ReplyBody, Errno>,
}

/// What the kernel knows of one node id.
#[derive(Clone, Debug)]
struct Node {
    lookups: u64,
    generation: u64,
    ino: u64,
    /// `mode & S_IFMT`.
    kind: u32,
    /// The size the kernel believes: the last reported, grown by writes.
    size: u64,
    /// A truncate was sent since the size was last seen.
    truncated: bool,
    ctime: (u64, u32),
    /// A SETATTR of ctime was sent since it was last seen.
    ctime_set: bool,
    /// A symlink's target length, once SYMLINK or READLINK said it.
    link_len: Option<u64>,
    /// The directory whose entry named it (for `..`).
    parent: Option<u64>,
}

/// One pass over a directory through one open handle.
#[derive(Default)]
struct Pass {
    seen: HashSet<Vec<u8>>,
    cookies: HashSet<u64>,
    /// Names the listing must hold (known when the pass began, removed
    /// from this set when they are unlinked or renamed away meanwhile).
    expected: HashSet<Vec<u8>>,
    /// Names created during the pass (they may appear once more).
    created: HashSet<Vec<u8>>,
    /// The pass broke a rule already: no more reports about it.
    broken: bool,
}

/// A request waiting for its reply.
struct Outstanding {
    bytes: Vec<u8>,
    /// The epochs of the directories whose names it reads or changes, as
    /// they were when it was sent (after its own change).
    epochs: [(u64, u64); 2],
}

/// How many requests a lookup-count difference names as its cause.
const BLAMED: usize = 8;

/// Watches a conversation and reports what breaks the protocol's rules.
pub struct Checker {
    cfg: ParseConfig,
    outstanding: HashMap<u64, Outstanding>,
    answered: HashSet<u64>,
    /// Requests the kit stopped waiting for: a late reply is taken quietly
    /// (the kernel would still be waiting for it).
    abandoned: HashSet<u64>,
    nodes: HashMap<u64, Node>,
    /// Open files and directories the kernel holds: (node, fh) → how many.
    open: HashMap<(u64, u64), usize>,
    released: HashSet<(u64, u64)>,
    /// The names known in each directory.
    names: HashMap<u64, HashSet<Vec<u8>>>,
    passes: HashMap<(u64, u64), Pass>,
    /// The dentries the kernel holds: directory → name → node, and the
    /// request whose entry made it.
    entered: HashMap<u64, HashMap<Vec<u8>, (u64, String)>>,
    /// Per directory, how many requests that change its names were sent
    /// or answered: a reply about a name is believed only if none was
    /// meanwhile (requests racing in one directory).
    epochs: HashMap<u64, u64>,
    /// Node ids the kernel forgot: the generation and `st_ino` they had.
    forgotten: HashMap<u64, (u64, u64)>,
    /// The root's `st_ino`, once an attribute reply said it.
    root_ino: Option<u64>,
    /// Open handles whose OPEN answered `FOPEN_DIRECT_IO` (short reads
    /// are allowed there).
    direct_io: HashSet<(u64, u64)>,
    /// Every request sent, as reports name it, by unique.
    history: HashMap<u64, String>,
    /// Per node, the requests that moved the kernel's lookup count since
    /// the filesystem's count last agreed with it.
    blame: HashMap<u64, Vec<String>>,
    /// While on: the opcode and error of each answer, in order.
    answers: Option<Vec<(Opcode, Option<Errno>)>>,
    /// The reply being checked raced no request that changed the names
    /// it is about.
    quiet: bool,
    violations: Vec<Violation>,
}

impl Checker {
    /// A checker for a connection that negotiated `cfg` (minor, and
    /// whether SETXATTR_EXT is in use).
    pub fn new(cfg: ParseConfig) -> Self {
        Checker {
            cfg,
            outstanding: HashMap::new(),
            answered: HashSet::new(),
            abandoned: HashSet::new(),
            nodes: HashMap::new(),
            open: HashMap::new(),
            released: HashSet::new(),
            names: HashMap::new(),
            passes: HashMap::new(),
            entered: HashMap::new(),
            epochs: HashMap::new(),
            forgotten: HashMap::new(),
            root_ino: None,
            direct_io: HashSet::new(),
            history: HashMap::new(),
            blame: HashMap::new(),
            answers: None,
            quiet: true,
            violations: Vec::new(),
        }
    }

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

    /// Starts (or stops, and returns) a log of each answer's opcode and
    /// error, in order.
    pub(crate) fn log_answers(&mut self, on: bool) -> Vec<(Opcode, Option<Errno>)> {
        let log = std::mem::replace(&mut self.answers, on.then(Vec::new));
        log.unwrap_or_default()
    }

    /// The opcode and error of the latest answer, while answers are logged.
    pub(crate) fn last_answer(&self) -> Option<(Opcode, Option<Errno>)> {
        self.answers.as_ref().and_then(|l| l.last().copied())
    }

    /// A handler panicked on request `unique` (the session answered it
    /// `EIO`).
    pub(crate) fn panicked(&mut self, unique: u64, opcode: Opcode, message: &str) {
        let what = self
            .history
            .get(&unique)
            .cloned()
            .unwrap_or_else(|| format!("{opcode} #{unique}"));
        self.violate(
            Rule::Panic,
            what,
            format!("the handler panicked ({message:?}): the caller got EIO"),
        );
    }

    /// The violations so far.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// Takes the violations so far (the checker goes on).
    pub fn take_violations(&mut self) -> Vec<Violation> {
        std::mem::take(&mut self.violations)
    }

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

    /// The files and directories the kernel holds open: (node, handle).
    pub fn open_handles(&self) -> Vec<(Inode, u64)> {
        let mut v: Vec<_> = self.open.keys().map(|&(n, fh)| (Inode(n), fh)).collect();
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

    /// The epoch of `dir` (see `epochs`).
    fn epoch(&self, dir: u64) -> u64 {
        self.epochs.get(&dir).copied().unwrap_or(0)
    }

    /// The directories whose names `op` changes.
    fn changes_names(op: &Operation<'_>, node: u64) -> [Option<u64>; 2] {
        use Operation as O;
        match op {
            O::Create { .. }
            | O::Mknod { .. }
            | O::Mkdir { .. }
            | O::Symlink { .. }
            | O::Link { .. }
            | O::Unlink { .. }
            | O::Rmdir { .. }
            | O::AtomicOpen { .. } => [Some(node), None],
            O::Rename { arg, .. } => [Some(node), Some(arg.newdir)],
            O::Rename2 { arg, .. } => [Some(node), Some(arg.newdir)],
            _ => [None, None],
        }
    }

    fn bump(&mut self, dirs: [Option<u64>; 2]) {
        for d in dirs.into_iter().flatten() {
            *self.epochs.entry(d).or_default() += 1;
        }
    }

    /// Records a violation found by the kit itself (a request that got no
    /// reply in time, a listing that does not end).
    pub(crate) fn violate(&mut self, rule: Rule, request: String, detail: String) {
        self.violations.push(Violation {
            rule,
            request,
            detail,
        });
    }

    fn describe_bytes(&self, bytes: &[u8]) -> String {
        match Request::parse_with(bytes, &self.cfg) {
            Ok(r) => describe(&r),
            Err(e) => format!("an unparsable request ({e})"),
        }
    }

    /// A request the kernel sends (whole, header included). Requests that
    /// expect a reply wait for it; FORGETs take effect at once.
    pub fn request(&mut self, bytes: &[u8]) {
        let req = match Request::parse_with(bytes, &self.cfg) {
            Ok(r) => r,
            Err(e) => {
                self.violate(
                    Rule::ReplySize,
                    String::new(),
                    format!("the kit sent a request the parser refuses: {e}"),
                );
                return;
            }
        };
        let what = describe(&req);
        let node = req.header.nodeid;
        self.history.insert(req.header.unique, what.clone());
        let changes = Self::changes_names(&req.op, node);
        self.bump(changes);
        let dirs = [changes[0].unwrap_or(node), changes[1].unwrap_or(node)];
        let epochs = dirs.map(|d| (d, self.epoch(d)));
        self.check_handle_use(&req, &what);
        match req.op {
            Operation::Forget { arg } => self.forget(node, arg.nlookup, &what),
            Operation::BatchForget { forgets, .. } => {
                for f in forgets.iter() {
                    self.forget(f.nodeid, f.nlookup, &what);
                }
            }
            Operation::Setattr { arg } => {
                let valid = SetattrValid::from_bits_retain(arg.valid);
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.truncated |= valid.contains(SetattrValid::SIZE);
                    n.ctime_set |= valid.contains(SetattrValid::CTIME);
                }
            }
            Operation::Open { arg } if arg.flags & libc::O_TRUNC as u32 != 0 => {
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.truncated = true;
                }
            }
            Operation::Fallocate { arg } if arg.mode & (libc::FALLOC_FL_COLLAPSE_RANGE as u32) != 0 => {
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.truncated = true;
                }
            }
            Operation::Readdir { arg } | Operation::Readdirplus { arg } if arg.offset == 0 => {
                let expected = self.names.get(&node).cloned().unwrap_or_default();
                self.passes.insert(
                    (node, arg.fh),
                    Pass {
                        expected,
                        ..Pass::default()
                    },
                );
            }
            _ => {}
        }
        if req.op.opcode().expects_reply() {
            self.outstanding.insert(
                req.header.unique,
                Outstanding {
                    bytes: bytes.to_vec(),
                    epochs,
                },
            );
        }
    }

    /// A message the filesystem wrote (whole, header included). Returns
    /// the answer to a request, or `None` for a notification or a reply
    /// that answers nothing (reported).
    pub fn reply(&mut self, bytes: &[u8]) -> Option<Answer> {
        let Ok((h, body)) = OutHeader::read_from_prefix(bytes) else {
            self.violate(
                Rule::ReplySize,
                String::new(),
                format!("a message of {} bytes, shorter than fuse_out_header", bytes.len()),
            );
            return None;
        };
        if h.len as usize != bytes.len() {
            self.violate(
                Rule::ReplySize,
                format!("reply #{}", h.unique),
                format!(
                    "fuse_out_header.len says {} bytes, the message has {}",
                    h.len,
                    bytes.len()
                ),
            );
        }
        if h.unique == 0 {
            return None; // a notification
        }
        if h.unique & INT_REQ_BIT != 0 {
            return self.interrupt_reply(&h, body);
        }
        let Some(out) = self.outstanding.remove(&h.unique) else {
            if self.abandoned.remove(&h.unique) {
                self.answered.insert(h.unique);
                return None;
            }
            let detail = if self.answered.contains(&h.unique) {
                "a second reply to a request already answered (the kernel drops it, or answers another request if the unique was reused)"
            } else {
                "a reply to a request the kernel never sent or that takes no reply"
            };
            self.violate(Rule::Answer, format!("reply #{}", h.unique), detail.into());
            return None;
        };
        self.answered.insert(h.unique);
        let Ok(req) = Request::parse_with(&out.bytes, &self.cfg) else {
            return None; // reported when it was sent
        };
        let what = describe(&req);
        self.quiet = out.epochs.iter().all(|&(d, e)| self.epoch(d) == e);
        self.bump(Self::changes_names(&req.op, req.header.nodeid));
        if let Some(log) = &mut self.answers {
            let e = (h.error != 0).then(|| Errno::new_or_eio(h.error.saturating_neg()));
            log.push((req.op.opcode(), e));
        }
        if h.error > 0 || h.error <= -(MAX_ERRNO + 1) {
            self.violate(
                Rule::Errno,
                what,
                format!("error {} is outside -511..=-1: the kernel refuses the reply and the caller waits until the connection ends", h.error),
            );
            return Some(Answer {
                unique: h.unique,
                result: Err(Errno::EIO),
            });
        }
        if h.error != 0 {
            let errno = Errno::new_or_eio(-h.error);
            if errno.name().is_none() {
                self.violate(
                    Rule::Errno,
                    what.clone(),
                    format!(
                        "error {} is no errno Linux knows (callers see \"Unknown error {}\")",
                        -h.error, -h.error
                    ),
                );
            }
            if !body.is_empty() {
                self.violate(
                    Rule::ReplySize,
                    what,
                    format!("an error reply with {} bytes of body", body.len()),
                );
                return Some(Answer {
                    unique: h.unique,
                    result: Err(Errno::EIO),
                });
            }
            self.after_error(&req, errno, &what);
            return Some(Answer {
                unique: h.unique,
                result: Err(errno),
            });
        }
        match wire::decode(&req.op, self.cfg.minor, body) {
            Ok(b) => {
                // Attributes the kernel refuses fail the request with EIO.
                let accepted = self.after_success(&req, &b, &what);
                Some(Answer {
                    unique: h.unique,
                    result: if accepted { Ok(b) } else { Err(Errno::EIO) },
                })
            }
            Err(Malformed(m)) => {
                self.violate(Rule::ReplySize, what, m);
                Some(Answer {
                    unique: h.unique,
                    result: Err(Errno::EIO),
                })
            }
        }
    }

    fn interrupt_reply(&mut self, h: &OutHeader, body: &[u8]) -> Option<Answer> {
        let target = h.unique & !INT_REQ_BIT;
        let what = format!("INTERRUPT of #{target}");
        if !body.is_empty() {
            self.violate(
                Rule::ReplySize,
                what,
                format!("a reply to INTERRUPT with {} bytes of body", body.len()),
            );
        } else if h.error != -libc::EAGAIN && h.error != -libc::ENOSYS {
            self.violate(
                Rule::Answer,
                what,
                format!(
                    "a reply to INTERRUPT with error {} (only EAGAIN and ENOSYS mean something)",
                    h.error
                ),
            );
        }
        Some(Answer {
            unique: h.unique,
            result: match h.error {
                0 => Ok(ReplyBody::Empty),
                e => Err(Errno::new_or_eio(-e)),
            },
        })
    }

    /// The kit waited in vain for the reply to `unique`.
    pub(crate) fn unanswered(&mut self, unique: u64) {
        if let Some(o) = self.outstanding.remove(&unique) {
            let what = self.describe_bytes(&o.bytes);
            self.violate(
                Rule::Answer,
                what,
                "no reply came: the caller waits until the connection ends".into(),
            );
            self.abandoned.insert(unique);
        }
    }

    fn forget(&mut self, node: u64, n: u64, what: &str) {
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

    fn check_handle_use(&mut self, req: &Request<'_>, what: &str) {
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

    /// A LOOKUP of `name` in `dir` found nothing (an error or a negative
    /// entry): wrong if the kernel holds an entry for it that no request
    /// removed.
    fn missing(&mut self, dir: u64, name: &[u8], what: &str) {
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

    fn after_error(&mut self, req: &Request<'_>, errno: Errno, what: &str) {
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
    fn after_success(&mut self, req: &Request<'_>, body: &ReplyBody, what: &str) -> bool {
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

    fn opened(&mut self, node: u64, o: &OpenOut) {
        *self.open.entry((node, o.fh)).or_default() += 1;
        if FopenFlags::from_bits_retain(o.open_flags).contains(FopenFlags::DIRECT_IO) {
            self.direct_io.insert((node, o.fh));
        }
    }

    /// The entry of a request that creates `name` in `dir` as a file of
    /// type `kind` (`S_IFREG`, …).
    fn created(&mut self, dir: u64, name: &[u8], e: &EntryOut, kind: u32, what: &str) -> bool {
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

    /// A symlink's size against its target's length.
    fn link_size(&mut self, node: u64, a: &Attr, what: &str) {
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
    fn setattr_applied(&mut self, arg: &SetattrIn, a: &Attr, what: &str) {
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
    fn short_read(&mut self, node: u64, arg: &ReadIn, got: usize, what: &str) {
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

    /// RMDIR of `name` in `dir` answered 0: wrong if the directory holds
    /// names the kernel knows and no request removed.
    fn rmdir_of_nonempty(&mut self, dir: u64, name: &[u8], what: &str) {
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

    fn add_name(&mut self, dir: u64, name: &[u8], created: bool) {
        self.names.entry(dir).or_default().insert(name.to_vec());
        if created {
            for ((d, _), p) in self.passes.iter_mut() {
                if *d == dir {
                    p.created.insert(name.to_vec());
                }
            }
        }
    }

    fn remove_name(&mut self, dir: u64, name: &[u8]) {
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

    fn rename(&mut self, dir: u64, name: &[u8], newdir: u64, newname: &[u8], flags: u32) {
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
    fn enter(&mut self, dir: u64, name: &[u8], node: u64, by: &str) {
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

    /// A positive or negative entry of a reply, for `name` in `dir` if
    /// it names one; false if the kernel would refuse it (`EIO`).
    fn entry(&mut self, e: &EntryOut, what: &str, lookup: bool, at: Option<(u64, &[u8])>) -> bool {
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

    fn valid_attr(&mut self, a: &Attr, node: u64, what: &str) -> bool {
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
    fn attr(&mut self, node: u64, a: &Attr, what: &str) -> bool {
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

    fn listing(&mut self, dir: u64, fh: u64, records: &[&DirEntry], what: &str) {
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
fn dt_name(d_type: u32) -> String {
    match d_type {
        0 => "DT_UNKNOWN".into(),
        t => kind_name(t << 12),
    }
}

/// The (node, handle) a request uses, if it carries one.
fn handle_of(req: &Request<'_>) -> Option<(u64, u64)> {
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

/// A request as reports name it: `LOOKUP #12 on node 1 "f"`.
fn describe(req: &Request<'_>) -> String {
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
