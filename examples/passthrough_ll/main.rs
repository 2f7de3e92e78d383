//! passthrough_ll: mirrors a directory through FUSE, a drop-in for libfuse's
//! low-level passthrough example, served by fuse-wire.
//!
//! ```text
//! passthrough_ll [-f] [-d] [-s] [-o opt,...] [--stats FILE] [SOURCE] MOUNTPOINT
//! ```
//!
//! It runs in the foreground until the filesystem is unmounted or it gets
//! SIGINT, SIGTERM or SIGHUP; then it unmounts and, with `--stats FILE`,
//! writes the session's statistics and the number of inodes the kernel
//! still held (`"inodes"`) as JSON. See `args.rs` for the options and
//! `fs.rs` for how operations reach the source directory.
//!
//! With `-o keeper` this process keeps the mount and serves it from a child
//! (the same program and arguments), which a crash or `SIGUSR2` replaces;
//! the child keeps its node table and open files with the keeper
//! (`durable.rs`).

mod args;
#[cfg(test)]
mod battery_tests;
#[path = "../common/cli.rs"]
mod cli;
mod durable;
#[cfg(test)]
mod durable_tests;
mod fdcache;
mod fs;
mod handles;
#[cfg(test)]
mod inode_table_tests;
mod inodes;
mod openfds;
mod passthrough;
mod sys;

use fs::PassthroughFs;
use inodes::HandleMode;

use fuse_wire::session::keeper::{KeeperLink, Restore, run_keeper};
use fuse_wire::session::{Session, SessionConfig, SessionHandle, Transport};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

use std::sync::Arc;

const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn main() {
    std::process::exit(run());
}

fn run() -> i32 {
    // Started by a keeper (`-o keeper`): serve the connection it holds.
    let link = KeeperLink::from_env();
    let mut argv = Vec::new();
    for a in std::env::args_os().skip(1) {
        match a.into_string() {
            Ok(s) => argv.push(s),
            Err(a) => {
                eprintln!("passthrough_ll: argument {a:?} is not valid UTF-8");
                return 2;
            }
        }
    }
    let mut args = match args::parse(&argv) {
        Ok(args::Command::Run(a)) => a,
        Ok(args::Command::Help) => {
            print!("{}", args::USAGE);
            return 0;
        }
        Ok(args::Command::Version) => {
            println!("passthrough_ll (fuse-wire {})", env!("CARGO_PKG_VERSION"));
            return 0;
        }
        Err(e) => {
            eprintln!("passthrough_ll: {e}\n(passthrough_ll --help lists the options)");
            return 2;
        }
    };
    let level = if args.debug {
        log::LevelFilter::Debug
    } else {
        log::LevelFilter::Warn
    };
    env_logger::Builder::new()
        .filter_level(level)
        .parse_default_env()
        .init();

    if args.keeper && link.is_none() {
        return keep(&args, argv);
    }

    // Kernel passthrough by default where it can be, saying why not.
    if let Some(why) = args.passthrough_off {
        log::info!("kernel passthrough off: {why}");
    } else if args.fs.passthrough
        && !args.fs.passthrough_forced
        && let Err(why) = passthrough::may_register()
    {
        log::info!("kernel passthrough off: {why}");
        args.fs.passthrough = false;
    }

    // Before any thread exists, so that every thread inherits the mask and
    // only the signal thread below receives these.
    if let Err(e) = sys::block_signals(&STOP_SIGNALS) {
        log::error!("cannot block the stop signals: {e}");
        return 1;
    }
    // No umask of the daemon's own: each create applies the caller's (fs.rs).
    sys::set_umask(0);
    let nofile = match sys::raise_nofile_limit() {
        Ok(n) => {
            log::debug!("open file limit: {n}");
            Some(n)
        }
        Err(e) => {
            log::warn!("cannot raise the open file limit: {e}");
            None
        }
    };

    let defaults = SessionConfig::default();
    let config = SessionConfig {
        workers: args.threads,
        max_workers: args.max_threads,
        idle_timeout: args.idle_timeout.unwrap_or(defaults.idle_timeout),
        max_deferred_per_uid: args.max_waits_per_uid,
        uring_queue_depth: args.queue_depth,
        clone_fd: args.clone_fd,
        atomic_open: args.atomic_open,
        // The statistics file reports the peaks of requests in flight.
        track_inflight: args.stats.is_some(),
        splice_write: args.splice_write,
        splice_write_min: args.splice_write_min,
        o_direct_parallel_writes: !args.serial_o_direct,
        transport: if args.uring {
            Transport::Uring
        } else {
            Transport::DevFuse
        },
        ..defaults
    };

    // The descriptor cache (file-handle mode) within the open file limit,
    // beside the session's descriptors and the daemon's own.
    args.fs.fd_cache = args.fd_cache.unwrap_or(fdcache::DEFAULT_CAPACITY);
    if let Some(limit) = nofile
        && args.fs.inode_file_handles != HandleMode::Never
    {
        let reserved = config.max_descriptors() as u64 + fdcache::OWN_DESCRIPTORS;
        match fdcache::fit(limit, reserved, args.fd_cache) {
            Ok(n) => args.fs.fd_cache = n,
            Err(e) => {
                eprintln!("passthrough_ll: {e}");
                return 2;
            }
        }
        let left = limit.saturating_sub(reserved);
        if args.fs.fd_cache as u64 > left / 2 {
            log::warn!(
                "fd_cache={} leaves {} descriptors of the open file limit ({limit}) for open files",
                args.fs.fd_cache,
                left.saturating_sub(args.fs.fd_cache as u64)
            );
        }
    }

    // The open files' descriptors: what the session, the daemon's own
    // files and the node descriptors leave (without file handles each
    // live inode holds one, however many: half of what is left for them).
    if let Some(limit) = nofile {
        let left = limit.saturating_sub(config.max_descriptors() as u64 + fdcache::OWN_DESCRIPTORS);
        let nodes = match args.fs.inode_file_handles {
            HandleMode::Never => left / 2,
            _ => args.fs.fd_cache as u64,
        };
        args.fs.open_fds = usize::try_from(left.saturating_sub(nodes)).unwrap_or(usize::MAX);
    }
    let (idle, pool, share) = handles::Budget::sizes(args.fs.open_fds);
    log::info!(
        "open files: {idle} keep their descriptors while in use, {pool} more may be pinned (locked, \
         directories, ...), {share} of them by one user"
    );

    if args.fs.passthrough && args.fs.cache == fs::Cache::Never {
        log::warn!(
            "passthrough: cache=never does not set DIRECT_IO (it would route reads and writes back here)"
        );
    }
    if args.fs.passthrough && args.fs.parallel_direct_writes {
        log::warn!(
            "passthrough with parallel_direct_writes: DIRECT_IO sends reads and writes through the daemon; \
             only mmap is passed through"
        );
    }

    let source = match CString::new(args.source.as_os_str().as_bytes()) {
        Ok(s) => s,
        Err(_) => {
            log::error!("source path contains a NUL byte");
            return 2;
        }
    };
    let root = match sys::openat(sys::Dir::Cwd, &source, libc::O_PATH | libc::O_DIRECTORY, 0) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!(
                "passthrough_ll: source {} is not a usable directory: {e}",
                args.source.display()
            );
            return 1;
        }
    };
    if let Some(link) = link {
        // The keeper answers the stop signals (it retires this daemon);
        // they stay blocked here.
        return serve_kept(link, root, args.fs.clone(), config);
    }
    let fs = match PassthroughFs::new(root, args.fs.clone()) {
        Ok(fs) => Arc::new(fs),
        Err(e) => {
            eprintln!("passthrough_ll: {}: {e}", args.source.display());
            return 1;
        }
    };
    if fs.uses_file_handles() {
        log::info!(
            "inodes known by file handle; at most {} cached descriptors",
            fs.fd_cache_capacity()
        );
    } else {
        log::info!("one descriptor per inode (no file handles)");
    }

    // The session owns the mount: stop() unmounts it, and so does the end
    // of the session if it is still there; only our own mount, never one
    // placed over it or made on the path after an outside umount. With
    // allow_root it refuses other users' requests itself.
    let session = match Session::mount_arc(fs.clone(), &args.mountpoint, &args.mount, config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("passthrough_ll: {e}");
            return 1;
        }
    };
    let handle = session.handle();
    spawn_signal_thread(handle.clone());
    log::info!(
        "serving {} on {}",
        args.source.display(),
        args.mountpoint.display()
    );

    let result = session.run();

    let live = fs.live_inodes();
    log::info!(
        "exit: {live} inodes still looked up, {} handles open",
        fs.open_handles()
    );
    if let Some(path) = &args.stats {
        let ops = handle.stats().to_json();
        let body = ops.strip_prefix('{').unwrap_or(&ops);
        let json = format!("{{\"inodes\": {live}, {body}\n");
        if let Err(e) = std::fs::write(path, json) {
            log::error!("writing statistics to {}: {e}", path.display());
        }
    }
    match result {
        Ok(report) => {
            log::debug!(
                "session ended: {} workers ({} cloned fds)",
                report.workers_started,
                report.cloned_channels
            );
            0
        }
        Err(e) => {
            eprintln!("passthrough_ll: {e}");
            1
        }
    }
}

/// `-o keeper`: checks that the source can be served that way, then mounts
/// and keeps the mount, running this program with the same arguments as
/// the serving daemon, replaced when it dies.
fn keep(args: &args::Args, argv: Vec<String>) -> i32 {
    let source = match CString::new(args.source.as_os_str().as_bytes()) {
        Ok(s) => s,
        Err(_) => {
            eprintln!("passthrough_ll: source path contains a NUL byte");
            return 2;
        }
    };
    let usable = sys::openat(sys::Dir::Cwd, &source, libc::O_PATH | libc::O_DIRECTORY, 0)
        .and_then(|root| inodes::probe_handles(std::os::fd::AsFd::as_fd(&root)).map(drop));
    if let Err(e) = usable {
        eprintln!(
            "passthrough_ll: -o keeper: the source {} cannot be served by file handles \
             (name_to_handle_at/open_by_handle_at: {e}); a successor would not find the inodes again",
            args.source.display()
        );
        return 1;
    }
    let program = std::env::current_exe().unwrap_or_else(|_| "passthrough_ll".into());
    let child_args = argv.into_iter().map(Into::into).collect();
    match run_keeper(&args.mountpoint, &args.mount, program, child_args) {
        Ok(report) => {
            log::info!(
                "keeper: done ({} daemons started, {} crashes, {} upgrades)",
                report.started,
                report.crashes,
                report.upgrades
            );
            0
        }
        Err(e) => {
            eprintln!("passthrough_ll: {e}");
            1
        }
    }
}

/// Serves the connection of `link`'s keeper, taking up the node table and
/// the open files a predecessor kept there.
fn serve_kept(
    link: KeeperLink,
    root: std::os::fd::OwnedFd,
    opts: fs::FsOptions,
    config: SessionConfig,
) -> i32 {
    let restore = |r: Restore<'_>| {
        let per_shard = opts.keeper_nodes.div_ceil(inodes::SHARDS);
        // The region first: what is left after it are the open files.
        let region = r.vault.region(
            durable::REGION_KEY,
            durable::region_len(inodes::SHARDS, per_shard),
        )?;
        let deposits = r.vault.take_deposits();
        let takeover = r.state.is_some();
        let fs = PassthroughFs::kept(
            root,
            opts,
            Arc::new(region),
            Arc::new(r.vault),
            deposits,
            takeover,
        )?;
        log::info!(
            "serving under a keeper: {} inodes and {} open files taken up",
            fs.live_inodes(),
            fs.open_handles()
        );
        Ok(fs)
    };
    // Retiring: what lost its last name outside the mount is kept too.
    let save = |fs: &PassthroughFs| {
        fs.keep_removed_open_files();
        Vec::new()
    };
    match link.serve(restore, save, config) {
        Ok(true) => KeeperLink::exit_retired(),
        Ok(false) => 0,
        Err(e) => {
            eprintln!("passthrough_ll: {e}");
            1
        }
    }
}

/// Waits for SIGINT/SIGTERM/SIGHUP; then stops the session, which unmounts.
fn spawn_signal_thread(handle: SessionHandle) {
    let r = std::thread::Builder::new().name("signals".into()).spawn(move || {
        match sys::wait_signal(&STOP_SIGNALS) {
            Ok(sig) => log::info!("signal {sig}: unmounting"),
            Err(e) => {
                log::error!("waiting for signals: {e}");
                return;
            }
        }
        handle.stop();
    });
    if let Err(e) = r {
        log::error!("cannot start the signal thread: {e}");
    }
}
