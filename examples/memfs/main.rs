//! memfs: an in-memory filesystem for tests and for benchmarking the
//! library without backing I/O (see `fs.rs` for what it supports and how
//! it locks).
//!
//! ```text
//! memfs [-f] [-d] [-s] [-o size=BYTES,nr_inodes=N,posix_lock,flock,...] [SOURCE] MOUNTPOINT
//! ```
//!
//! The command line follows passthrough_ll's conventions (`args.rs` lists
//! the options): memfs always runs in the foreground, so `-f` is accepted
//! and changes nothing; `-d` logs at debug level (`RUST_LOG` still wins).
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
//! and one inode per page of that by default, 0 for no limit. `size=` is
//! charged the memory memfs really takes (pages of contents, inodes,
//! directory entries, xattrs, symlink targets, lock records: see
//! `capacity.rs`), and bounds the daemon's memory but for the overhead `fs.rs`
//! describes. Past the limits, writes, creations, links and xattrs fail
//! with `ENOSPC` (a write that partly fits writes the pages that fit),
//! locks with `ENOLCK`, and statfs reports the limits and usage.
//!
//! Runs until the filesystem is unmounted or SIGINT/SIGTERM arrives (then
//! it unmounts), and prints the session's per-opcode statistics as JSON on
//! stderr at the end. Other `-o` options are mount options (see
//! `MountOptions`).
//!
//! `-o keeper`: this process mounts and keeps the connection, and a child
//! (this program again) serves it. `SIGUSR2` to the keeper is a graceful
//! upgrade that keeps every file, node id, open file and lock; a child
//! that dies is replaced by one that starts empty (see `keep.rs`).

mod args;
#[path = "../common/cli.rs"]
mod cli;
mod fs;

use fs::MemFs;
use std::process::ExitCode;

fn main() -> ExitCode {
    // Read before any thread starts: it takes a variable out of the environment.
    let link = fuse_wire::session::keeper::KeeperLink::from_env();
    // Logs to stderr: info, debug with -d; RUST_LOG overrides both.
    let args = match cli::start(
        "memfs",
        args::USAGE,
        args::parse,
        |a| a.debug,
        log::LevelFilter::Info,
    ) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let args::Args {
        mountpoint,
        mount,
        fs: config,
        session,
        keeper,
        ..
    } = *args;
    // Started by a keeper (`-o keeper`): serve the connection it holds.
    if let Some(link) = link {
        return match fs::keep::serve(link, config, session) {
            Ok(true) => fuse_wire::session::keeper::KeeperLink::exit_retired(),
            Ok(false) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("memfs: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if keeper {
        // This process keeps the mount; a child, started with the same
        // command line, serves it.
        let program = std::env::current_exe().unwrap_or_else(|_| "memfs".into());
        let child_args = std::env::args_os().skip(1).collect();
        return match fuse_wire::session::keeper::run_keeper(&mountpoint, &mount, program, child_args) {
            Ok(report) => {
                log::info!(
                    "memfs: keeper done: {} daemons started, {} crashes, {} upgrades",
                    report.started,
                    report.crashes,
                    report.upgrades
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("memfs: {e}");
                ExitCode::FAILURE
            }
        };
    }
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
