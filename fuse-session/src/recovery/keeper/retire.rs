//! Retiring a daemon: asking it to stop at a request boundary and hand
//! its state back, and calling the retirement off (or killing it, when
//! unmounting) when it does not by the deadline.

use super::messages::pump_messages;
use super::{RETIRED, Running, describe};
use crate::init::Negotiated;
use std::io::Write;
use std::time::{Duration, Instant};

/// How long a retiring daemon may take before the keeper calls the
/// retirement off ([`RETIRE_DEADLINE_ENV`] overrides it).
const RETIRE_DEADLINE: Duration = Duration::from_secs(30);

/// The environment variable that sets the retire deadline in milliseconds
/// (the tests shorten it).
pub const RETIRE_DEADLINE_ENV: &str = "FUSE_WIRE_RETIRE_DEADLINE_MS";

fn retire_deadline() -> Duration {
    std::env::var(RETIRE_DEADLINE_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(RETIRE_DEADLINE, Duration::from_millis)
}

/// What became of a retirement the keeper asked for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Retired {
    /// The daemon ended (retired, or otherwise: its exit says).
    Ended,
    /// It did not end by the deadline (a handler that does not return):
    /// the retirement was called off and the daemon serves on.
    CalledOff,
}

/// Asks the child to retire and waits for it. When `keep_serving` and the
/// child has not ended by the deadline (a wedged handler holds it), the
/// retirement is called off: the daemon holds the only copy of whatever
/// state a filesystem keeps in memory, so it serves on instead of being
/// killed. Otherwise (unmounting) a child past the deadline is killed.
pub(super) fn retire(
    run: &mut Running,
    negotiated: &mut Option<Negotiated>,
    state: &mut Vec<u8>,
    keep_serving: bool,
) -> Retired {
    let _ = run.sock.set_nonblocking(false);
    if (&run.sock).write_all(b"R").is_err() {
        log::debug!("keeper: the daemon is gone already");
    }
    let limit = retire_deadline();
    let deadline = Instant::now() + limit;
    loop {
        let _ = run.sock.set_nonblocking(true);
        pump_messages(&mut run.sock, negotiated, state, &mut run.refused);
        match run.child.try_wait() {
            Ok(Some(status)) => {
                pump_messages(&mut run.sock, negotiated, state, &mut run.refused);
                if status.code() != Some(RETIRED) {
                    log::warn!("keeper: the retiring daemon {}", describe(status));
                }
                return Retired::Ended;
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Ok(None) if keep_serving => {
                log::error!(
                    "keeper: daemon {} did not retire within {limit:?} (a request it serves does not end); \
                     calling the upgrade off: it serves on",
                    run.child.id()
                );
                let _ = run.sock.set_nonblocking(false);
                if (&run.sock).write_all(b"C").is_err() {
                    log::debug!("keeper: the daemon is gone already");
                }
                let _ = run.sock.set_nonblocking(true);
                return Retired::CalledOff;
            }
            _ => {
                log::warn!("keeper: the daemon did not retire within {limit:?}; killing it");
                let _ = run.child.kill();
                let _ = run.child.wait();
                return Retired::Ended;
            }
        }
    }
}
