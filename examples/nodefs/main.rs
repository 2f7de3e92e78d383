//! nodefs: an in-memory filesystem on the node layer (`fuse_wire::node`):
//! directories, regular files, symbolic links, fifos and device nodes,
//! extended attributes, hard links and renames. The library assigns node
//! ids, counts lookups, keeps open files (an unlinked open file keeps
//! working) and lists "." and "..".
//!
//! ```sh
//! nodefs [-o threads=N,uring,MOUNT_OPTIONS] [--stats FILE] MOUNTPOINT
//! ```
//!
//! Permission checks are the kernel's (`default_permissions` is always on).
//! With `--stats FILE` it writes the session's statistics as JSON at exit,
//! with `live_nodes` (node ids the kernel still held) and `open_files`.

mod tree;

use fuse_wire::node::{NodeFs, NodeOptions};
use fuse_wire::session::SessionConfig;
use fuse_wire::{MountOptions, serve_with};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: nodefs [-o threads=N,uring,MOUNT_OPTIONS] [--stats FILE] MOUNTPOINT";

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let (mut mountpoint, mut opts, mut stats) = (None, Vec::new(), None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-o" => opts.extend(args.next()),
            "--stats" => stats = args.next().map(PathBuf::from),
            s if !s.starts_with('-') && mountpoint.is_none() => mountpoint = Some(PathBuf::from(s)),
            _ => return usage(),
        }
    }
    let Some(mountpoint) = mountpoint else {
        return usage();
    };
    let Ok((mut mount, ours)) = MountOptions::parse_known(&opts.join(",")) else {
        return usage();
    };
    mount.default_permissions = true;
    mount.fsname.get_or_insert_with(|| "nodefs".into());
    let mut session = SessionConfig::default();
    if !ours.iter().all(|o| session.take_option(o)) {
        return usage();
    }
    let fs = NodeFs::with_options(tree::root(), NodeOptions::default());
    let counts = fs.clone();
    match serve_with(fs, &mountpoint, &mount, session) {
        Ok(report) => {
            if let Some(path) = stats {
                let counts = [
                    ("live_nodes", counts.live_nodes() as u64),
                    ("open_files", counts.open_files() as u64),
                ];
                if let Err(e) = std::fs::write(&path, report.stats.to_json_with(&counts)) {
                    eprintln!("nodefs: {}: {e}", path.display());
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nodefs: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> ExitCode {
    eprintln!("{USAGE}");
    ExitCode::from(2)
}
