//! memfs: an in-memory filesystem for tests and for benchmarking the
//! library without backing I/O (see `fs.rs` for what it supports and how
//! it locks).
//!
//! ```sh
//! memfs [-o threads=N,ttl=SECONDS,allow_other,default_permissions,...] MOUNTPOINT
//! ```
//!
//! Runs until the filesystem is unmounted or SIGINT/SIGTERM arrives (then
//! it unmounts), and prints the session's per-opcode statistics as JSON on
//! stderr at the end. Other `-o` options are mount options (see
//! `MountOptions`).

#[path = "../common/mod.rs"]
mod common;
mod fs;

use fs::{MemFs, MemFsConfig};
use fuse_wire::session::SessionConfig;
use fuse_wire::session::mount::MountOptions;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage: memfs [-o threads=N,ttl=SECONDS,MOUNT_OPTIONS] MOUNTPOINT";

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
            _ => return Err(format!("unknown option {opt}\n{USAGE}")),
        }
    }
    Ok((mount, fs, session))
}

fn main() -> ExitCode {
    common::init_logging();
    let (mountpoint, lists) = match common::parse_args(USAGE) {
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
    match common::mount_and_serve(MemFs::new(config), &mountpoint, &mount, session) {
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
