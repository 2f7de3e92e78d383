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
//!
//! # The folder
//!
//! This module holds the [`Checker`] with what it keeps of the
//! conversation (nodes, handles, names, passes over directories, requests
//! waiting), the [`Answer`] it returns and the violations it collects; one
//! file a concern beside it: the rules and how reports name things
//! (`report.rs`: [`Rule`], [`Violation`]), requests matched to their
//! replies (`conversation.rs`: one answer per request, reply sizes, error
//! numbers, INTERRUPT), each reply handed by opcode to the rules that check
//! it (`replies.rs`), lookup counts and entries (`lookups.rs`), attributes
//! (`attrs.rs`), file handles (`handles.rs`), the names of each directory
//! (`names.rs`) and directory listings (`listing.rs`). It uses the test
//! kit's wire decoding (`testing::wire`), fuse-proto's ABI, and the
//! crate's attribute and inode types.

mod attrs;
mod conversation;
mod handles;
mod listing;
mod lookups;
mod names;
mod replies;
mod report;

pub(crate) use report::kind_name;
pub use report::{Rule, Violation};

use super::wire::ReplyBody;
use fuse_proto::request::ParseConfig;
use fuse_proto::{Errno, Opcode};
use std::collections::{HashMap, HashSet};

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

    /// Records a violation found by the kit itself (a request that got no
    /// reply in time, a listing that does not end).
    pub(crate) fn violate(&mut self, rule: Rule, request: String, detail: String) {
        self.violations.push(Violation {
            rule,
            request,
            detail,
        });
    }
}
