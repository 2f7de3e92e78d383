//! Whether regular files can be opened in kernel passthrough mode, the
//! default where it can be: the daemon's privileges ([`may_register`]) are
//! looked at before mounting (the options that exclude it, in `args.rs`;
//! the kernel's offer, at INIT in `fs.rs`), and an open whose backing file
//! cannot be had is served by the daemon, each reason logged once
//! ([`Fallback`], [`Fallbacks`]).

use fuse_wire::session::BackingError;
use std::sync::atomic::{AtomicU32, Ordering};

/// `CAP_SYS_ADMIN`'s bit in a capability set.
const CAP_SYS_ADMIN: u32 = 21;

/// Whether this process may register backing files: the kernel wants
/// `CAP_SYS_ADMIN` in the initial user namespace (`FUSE_DEV_IOC_BACKING_OPEN`
/// answers `EPERM` otherwise). `Err` says what is missing. Read from
/// `/proc/self`; a process in a user namespace that maps every id (only one
/// made from the initial namespace can) is taken for one in it, and the
/// kernel's `EPERM` at the first open is then the [`Fallback`].
pub fn may_register() -> Result<(), &'static str> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|_| "cannot read /proc/self/status")?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .ok_or("no CapEff in /proc/self/status")?;
    if eff & 1 << CAP_SYS_ADMIN == 0 {
        return Err("the daemon lacks CAP_SYS_ADMIN, which registering a backing file needs");
    }
    let map = std::fs::read_to_string("/proc/self/uid_map").map_err(|_| "cannot read /proc/self/uid_map")?;
    let whole: Vec<&str> = map.split_whitespace().collect();
    if whole != ["0", "0", "4294967295"] {
        return Err(
            "the daemon runs in a user namespace; registering a backing file needs CAP_SYS_ADMIN \
             in the initial one",
        );
    }
    Ok(())
}

/// Why one open is served by the daemon although passthrough is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// The daemon could not reopen the file for its backing file (or not
    /// for writing, where the caller opened it for writing).
    Reopen,
    /// The kernel refused the backing file: `EPERM` (no `CAP_SYS_ADMIN`).
    NeedsCapSysAdmin,
    /// `ELOOP`: the source file's filesystem is stacked (overlayfs,
    /// another passthrough FUSE mount) and this mount offers depth 1.
    StackTooDeep,
    /// Not negotiated, no device, no `CONFIG_FUSE_PASSTHROUGH`.
    Unavailable,
    /// Anything else the kernel answered.
    Other,
}

impl Fallback {
    /// The reason of a refused `FUSE_DEV_IOC_BACKING_OPEN`.
    pub fn of(e: &BackingError) -> Fallback {
        match e {
            BackingError::NeedsCapSysAdmin => Fallback::NeedsCapSysAdmin,
            BackingError::StackTooDeep => Fallback::StackTooDeep,
            BackingError::NotNegotiated | BackingError::NoDevice | BackingError::NotSupported => {
                Fallback::Unavailable
            }
            _ => Fallback::Other,
        }
    }

    /// Whether every later open would be refused the same way, so that
    /// none need ask the kernel again.
    pub fn is_connection_wide(self) -> bool {
        matches!(self, Fallback::NeedsCapSysAdmin | Fallback::Unavailable)
    }
}

/// The reasons already logged, so that each is said once, without a lock.
#[derive(Default)]
pub struct Fallbacks(AtomicU32);

impl Fallbacks {
    /// Whether `why` is seen for the first time (and marks it seen).
    pub fn first(&self, why: Fallback) -> bool {
        let bit = 1 << why as u32;
        self.0.fetch_or(bit, Ordering::Relaxed) & bit == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_is_first_once() {
        let f = Fallbacks::default();
        assert!(f.first(Fallback::StackTooDeep));
        assert!(!f.first(Fallback::StackTooDeep));
        assert!(f.first(Fallback::Reopen));
        assert!(f.first(Fallback::Other));
        assert!(!f.first(Fallback::Reopen));
    }

    #[test]
    fn connection_wide_refusals_stop_the_asking() {
        assert!(Fallback::of(&BackingError::NeedsCapSysAdmin).is_connection_wide());
        assert!(Fallback::of(&BackingError::NotNegotiated).is_connection_wide());
        assert!(!Fallback::of(&BackingError::StackTooDeep).is_connection_wide());
    }
}
