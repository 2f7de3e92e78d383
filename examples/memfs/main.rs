//! memfs: an in-memory filesystem for tests and for benchmarking the
//! library without backing I/O (see `fs.rs` for what it supports and how
//! it locks).
//!
//! ```sh
//! memfs [-o threads=N,ttl=SECONDS,posix_lock,flock,allow_other,...] MOUNTPOINT
//! ```
//!
//! `posix_lock` and `flock` make memfs serve those locks itself; a blocking
//! wait for one runs on the session's helper threads, not on a worker, and
//! one uid may hold `max_waits_per_uid` such waits (beyond: `ENOLCK`; never
//! more than half of the session's, nor over io_uring half of those a
//! queue allows: see `fuse_session::deferred`).
//! `idle_timeout` is how long a worker above `threads` stays idle before it
//! ends; `uring` serves requests over FUSE-over-io_uring when the kernel
//! allows it.
//!
//! `size=BYTES` (with a `k`, `m`, `g` or `t` suffix, or `N%` of the RAM)
//! and `nr_inodes=N` bound what memfs holds, as on tmpfs: half of the RAM
//! and one inode per page of that by default, 0 for no limit. Past them,
//! writes, creations, links and xattrs fail with `ENOSPC` (a write that
//! partly fits writes that part), and statfs reports the limits and usage.
//!
//! Runs until the filesystem is unmounted or SIGINT/SIGTERM arrives (then
//! it unmounts), and prints the session's per-opcode statistics as JSON on
//! stderr at the end. Other `-o` options are mount options (see
//! `MountOptions`).

mod fs;

use fs::{MemFs, MemFsConfig};
use fuse_wire::session::mount::MountOptions;
use fuse_wire::session::{SessionConfig, Transport};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage: memfs [-o threads=N,ttl=SECONDS,posix_lock,flock,idle_timeout=SECONDS,\
max_waits_per_uid=N,size=BYTES[kmgt%],nr_inodes=N[kmg],uring,MOUNT_OPTIONS] MOUNTPOINT";

/// The mountpoint of a command line `PROG [-o OPTS] MOUNTPOINT`, and the
/// `-o` lists in order.
fn parse_args(usage: &str) -> Result<(PathBuf, Vec<String>), String> {
    let mut mountpoint = None;
    let mut opts = Vec::new();
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("-h" | "--help") => return Err(usage.to_string()),
            Some("-o") => match args.next().and_then(|o| o.into_string().ok()) {
                Some(o) => opts.push(o),
                None => return Err(format!("-o needs an option list\n{usage}")),
            },
            Some(s) if s.starts_with("-o") => opts.push(s[2..].to_string()),
            Some(s) if s.starts_with('-') => return Err(format!("unknown flag {s}\n{usage}")),
            _ if mountpoint.is_none() => mountpoint = Some(PathBuf::from(arg)),
            _ => return Err(format!("one mountpoint only\n{usage}")),
        }
    }
    mountpoint.map(|m| (m, opts)).ok_or_else(|| usage.to_string())
}

/// Splits the `-o` lists into mount options and memfs's own.
fn configure(lists: &[String]) -> Result<(MountOptions, MemFsConfig, SessionConfig), String> {
    let (mut mount, ours) = MountOptions::parse_known(&lists.join(",")).map_err(|e| e.to_string())?;
    mount.fsname.get_or_insert_with(|| "memfs".into());
    mount.subtype.get_or_insert_with(|| "memfs".into());
    let mut fs = MemFsConfig {
        default_permissions: mount.default_permissions,
        ..MemFsConfig::default()
    };
    let mut session = SessionConfig::default();
    for opt in ours {
        match opt.split_once('=') {
            Some(("threads", n)) => {
                session.workers = n
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("threads={n}: expected a positive number"))?;
            }
            Some(("ttl", s)) => {
                fs.ttl = s
                    .parse::<f64>()
                    .ok()
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .ok_or_else(|| format!("ttl={s}: expected seconds"))?;
            }
            Some(("idle_timeout", s)) => {
                session.idle_timeout = s
                    .parse::<f64>()
                    .ok()
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| format!("idle_timeout={s}: expected seconds"))?;
            }
            Some(("max_waits_per_uid", n)) => {
                session.max_deferred_per_uid = n
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("max_waits_per_uid={n}: expected a positive number"))?;
            }
            Some(("size", v)) => {
                fs.size = fs::capacity::parse_size(v)
                    .ok_or_else(|| format!("size={v}: expected bytes, k/m/g/t or %"))?;
            }
            Some(("nr_inodes", v)) => {
                fs.nr_inodes = fs::capacity::parse_count(v)
                    .ok_or_else(|| format!("nr_inodes={v}: expected a number, k/m/g"))?;
            }
            None if opt == "uring" => session.transport = Transport::Uring,
            None if opt == "posix_lock" => fs.posix_lock = true,
            None if opt == "flock" => fs.flock = true,
            _ => return Err(format!("unknown option {opt}\n{USAGE}")),
        }
    }
    Ok((mount, fs, session))
}

fn main() -> ExitCode {
    // Logs to stderr at the level RUST_LOG names (default: info).
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let (mountpoint, lists) = match parse_args(USAGE) {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let (mount, config, session) = match configure(&lists) {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("memfs: {msg}");
            return ExitCode::from(2);
        }
    };
    match fuse_wire::serve_with(MemFs::new(config), &mountpoint, &mount, session) {
        Ok(report) => {
            eprintln!("{}", report.stats.to_json());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("memfs: {e}");
            ExitCode::FAILURE
        }
    }
}
