//! Requests matched to their replies: each request the kernel sends
//! waits for its answer, each message the filesystem writes is checked for
//! its size, its unique (one answer per request) and its error number,
//! then decoded against its request; INTERRUPT replies, requests the kit
//! gave up on, the epochs of racing requests and the log of answers.

use super::report::describe;
use super::{Answer, Checker, Outstanding, Pass, Rule};
use crate::testing::wire::{self, Malformed, ReplyBody};
use fuse_proto::abi::OutHeader;
use fuse_proto::consts::{INT_REQ_BIT, MAX_ERRNO};
use fuse_proto::flags::SetattrValid;
use fuse_proto::{Errno, Opcode, Operation, Request};
use zerocopy::FromBytes;

impl Checker {
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
}
