//! Fault injection for recovery tests: a daemon that kills itself at a
//! chosen point of a request, to prove that a crash there loses nothing.
//!
//! `FUSE_WIRE_FAULT=<point>:<OPCODE>[,<point>:<OPCODE>...]`, read once when
//! a journaled session starts ([`crate::journal`]), with `<point>` one of
//! - `effect`: the filesystem carried the request out and answered, and
//!   the journal has not recorded the answer yet (for `INIT`: negotiated,
//!   the keeper not told yet);
//! - `reply`: the journal recorded the answer, which is not written yet
//!   (for `INIT`: the keeper was told, the kernel not answered).
//!
//! The process sends itself `SIGKILL` at the first request (not one sent
//! again) that matches. With `FUSE_WIRE_FAULT_STALL_MS=N` set too, the
//! first matching request stalls for N ms there instead (a handler that
//! does not return, for the tests of a retirement's deadline). Nothing happens when the variable is unset, which
//! costs one load per journaled reply.

use fuse_proto::Opcode;
use std::sync::OnceLock;

/// Where a journaled reply is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Point {
    /// Carried out, answer not recorded.
    Effect,
    /// Answer recorded, not written.
    Reply,
}

/// The environment variable.
pub const FAULT_ENV: &str = "FUSE_WIRE_FAULT";

/// The environment variable that turns the kill into a stall of this many
/// milliseconds.
pub const STALL_ENV: &str = "FUSE_WIRE_FAULT_STALL_MS";

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// `SIGKILL` to the process (the environment's plan).
    Kill,
    /// The worker stops for good, as if its process had died, while the
    /// rest of the process goes on: tests on the fake kernel.
    Freeze,
    /// The first matching request waits this long, then goes on.
    Stall(std::time::Duration),
}

/// A stall happened already.
static STALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

static PLAN: OnceLock<(Action, Vec<(Point, Opcode)>)> = OnceLock::new();

/// Sets the plan for this process, before any session reads the
/// environment's, with workers that stop for good instead of killing the
/// process (for tests on the fake kernel: a later session on the same
/// journal plays the successor). `points` are as in the variable:
/// `"effect:MKDIR"`. Returns false if a plan was set already.
#[doc(hidden)]
pub fn freeze_at(points: &str) -> bool {
    PLAN.set((Action::Freeze, parse(points))).is_ok()
}

/// Reads the plan from the environment (once per process).
pub(crate) fn arm() {
    PLAN.get_or_init(|| {
        let Some(v) = std::env::var_os(FAULT_ENV) else {
            return (Action::Kill, Vec::new());
        };
        let v = v.to_string_lossy();
        let plan = parse(&v);
        let stall = std::env::var(STALL_ENV).ok().and_then(|ms| ms.parse().ok());
        if let Some(ms) = stall {
            log::warn!("{FAULT_ENV}: the first request at {plan:?} will stall for {ms} ms");
            return (Action::Stall(std::time::Duration::from_millis(ms)), plan);
        }
        if plan.is_empty() {
            log::warn!("{FAULT_ENV}={v}: nothing understood (want effect:OPCODE or reply:OPCODE)");
        } else {
            log::warn!("{FAULT_ENV}: this daemon will kill itself at {plan:?}");
        }
        (Action::Kill, plan)
    });
}

fn parse(v: &str) -> Vec<(Point, Opcode)> {
    v.split(',')
        .filter_map(|item| {
            let (p, op) = item.trim().split_once(':')?;
            let p = match p {
                "effect" => Point::Effect,
                "reply" => Point::Reply,
                _ => return None,
            };
            let op = Opcode::ALL.iter().find(|o| o.name().eq_ignore_ascii_case(op))?;
            Some((p, *op))
        })
        .collect()
}

/// Kills the process if the plan names this point of this request.
pub(crate) fn point(opcode: Opcode, at: Point, resent: bool) {
    let Some((action, plan)) = PLAN.get() else { return };
    if resent || plan.is_empty() || !plan.contains(&(at, opcode)) {
        return;
    }
    match action {
        Action::Kill => {
            log::warn!("{FAULT_ENV}: killing this daemon at {at:?} of {}", opcode.name());
            // SAFETY: kill(2) of our own process; SIGKILL cannot be caught.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        Action::Stall(d) => {
            if !STALLED.swap(true, std::sync::atomic::Ordering::SeqCst) {
                log::warn!("{FAULT_ENV}: stalling {d:?} at {at:?} of {}", opcode.name());
                std::thread::sleep(*d);
            }
        }
        Action::Freeze => loop {
            log::warn!("fault: a worker stops for good at {at:?} of {}", opcode.name());
            std::thread::park();
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_is_read_as_written() {
        assert_eq!(
            parse("effect:MKDIR, reply:create,bogus,effect:NOPE"),
            vec![(Point::Effect, Opcode::Mkdir), (Point::Reply, Opcode::Create)]
        );
    }
}
