//! FUSE over io_uring (protocol 7.42+, Linux 6.14+): whether it can be
//! used, and why not.
//!
//! This module sits below the transport seam ([`crate::transport`] names
//! [`Unavailable`] in its `TransportInfo`): the fuse module's switch, the
//! number of queues the kernel makes, the probe run before INIT, and the
//! reasons the session falls back to `/dev/fuse`. The ring mechanics
//! (rings, entries and their buffers, commands and completions) are in
//! `ring`; the threads that serve a queue and call the dispatcher are in
//! `crate::ring_worker`, above the dispatcher. See `docs/uring.md`.

use io_uring::{IoUring, cqueue, squeue};
use std::io;

pub(crate) mod ring;

/// Entries per queue unless configured otherwise.
pub const DEFAULT_QUEUE_DEPTH: usize = 8;

/// The fuse module's switch for io_uring.
pub const ENABLE_KNOB: &str = "/sys/module/fuse/parameters/enable_uring";
/// The sysctl that can forbid io_uring.
pub const DISABLED_SYSCTL: &str = "/proc/sys/kernel/io_uring_disabled";
const POSSIBLE_CPUS: &str = "/sys/devices/system/cpu/possible";
/// The first protocol minor with FUSE over io_uring.
pub const MIN_MINOR: u32 = 42;

/// Why the io_uring transport is not in use (the session then serves
/// everything over `/dev/fuse`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// `enable_uring` of the fuse module is `N`, so the kernel does not offer it.
    KnobOff,
    /// The kernel has no `enable_uring` parameter: built without `CONFIG_FUSE_IO_URING`.
    NotBuilt,
    /// The kernel's FUSE protocol predates 7.42.
    KernelTooOld {
        /// The kernel's minor.
        minor: u32,
    },
    /// Creating an io_uring failed and `kernel.io_uring_disabled` explains it.
    IoUringDisabled {
        /// The sysctl's value (1: only for a group, 2: for nobody).
        sysctl: u32,
        /// The errno `io_uring_setup` returned.
        errno: i32,
    },
    /// Setting up the rings failed.
    Setup {
        /// What was being done.
        what: String,
        /// The errno.
        errno: i32,
    },
    /// The kernel did not offer `FUSE_OVER_IO_URING` for a reason not seen here.
    NotOffered,
    /// The filesystem removed `OVER_IO_URING` from its wanted flags in `init`.
    RefusedByFilesystem,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::KnobOff => write!(
                f,
                "the kernel does not offer FUSE_OVER_IO_URING because {ENABLE_KNOB} is N \
                 (echo Y > {ENABLE_KNOB} before mounting)"
            ),
            Unavailable::NotBuilt => write!(
                f,
                "the kernel has no {ENABLE_KNOB}: it was built without CONFIG_FUSE_IO_URING"
            ),
            Unavailable::KernelTooOld { minor } => write!(
                f,
                "the kernel speaks FUSE 7.{minor}; io_uring needs 7.{MIN_MINOR} (Linux 6.14) or newer"
            ),
            Unavailable::IoUringDisabled { sysctl, errno } => write!(
                f,
                "io_uring_setup failed ({}) and sysctl kernel.io_uring_disabled = {sysctl}",
                io::Error::from_raw_os_error(*errno)
            ),
            Unavailable::Setup { what, errno } => {
                write!(f, "{what} failed: {}", io::Error::from_raw_os_error(*errno))
            }
            Unavailable::NotOffered => f.write_str("the kernel did not offer FUSE_OVER_IO_URING"),
            Unavailable::RefusedByFilesystem => {
                f.write_str("the filesystem removed OVER_IO_URING from its wanted flags")
            }
        }
    }
}

/// The fuse module's `enable_uring`: `Some(true)` for `Y`, `None` if absent.
pub fn knob() -> Option<bool> {
    let s = std::fs::read_to_string(ENABLE_KNOB).ok()?;
    Some(matches!(s.trim(), "Y" | "y" | "1"))
}

fn disabled_sysctl() -> Option<u32> {
    std::fs::read_to_string(DISABLED_SYSCTL).ok()?.trim().parse().ok()
}

/// The number of possible CPUs, which is the number of queues the kernel
/// makes (queue `q` serves requests submitted on CPU `q`).
pub fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string(POSSIBLE_CPUS)?;
    parse_cpu_list(s.trim())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("{POSSIBLE_CPUS}: {s:?}")))
}

fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in s.split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        n += b.checked_sub(a)? + 1;
    }
    (n > 0).then_some(n)
}

/// A ring with the 128-byte SQEs the FUSE commands need.
pub(crate) type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// Checks before INIT that this process can create a ring of the kind the
/// transport needs; returns the number of queues to build.
pub(crate) fn probe() -> Result<usize, Unavailable> {
    if let Err(e) = Ring::builder().build(2) {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        return Err(match disabled_sysctl() {
            Some(v) if v != 0 => Unavailable::IoUringDisabled { sysctl: v, errno },
            _ => Unavailable::Setup {
                what: "io_uring_setup with IORING_SETUP_SQE128".into(),
                errno,
            },
        });
    }
    possible_cpus().map_err(|e| Unavailable::Setup {
        what: format!("reading {POSSIBLE_CPUS}"),
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0-3,8-11"), Some(8));
        assert_eq!(parse_cpu_list("0,2,4"), Some(3));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
    }
}
