//! nodefs: an in-memory filesystem on the node layer (`fuse_wire::node`):
//! directories, regular files, symbolic links, fifos and device nodes,
//! extended attributes, hard links and renames. The library assigns node
//! ids, counts lookups, keeps open files (an unlinked open file keeps
//! working) and lists "." and "..".
//!
//! ```sh
//! nodefs [-f] [-d] [-o threads=N,uring,MOUNT_OPTIONS] [--stats FILE] MOUNTPOINT
//! ```
//!
//! Permission checks are the kernel's (`default_permissions` is always on).
//! With `--stats FILE` it writes the session's statistics as JSON at exit,
//! with `live_nodes` (node ids the kernel still held) and `open_files`.

#[path = "../common/cli.rs"]
mod cli; // -f, -d, -o and --help as passthrough_ll takes them; errors printed with their text
mod tree;

use fuse_wire::node::{NodeFs, NodeOptions};
use fuse_wire::serve_with;
use fuse_wire::session::SessionConfig;
use std::process::ExitCode;

const COMMAND: cli::Command = cli::Command {
    name: "nodefs",
    about: "Serves an in-memory filesystem on the node layer at MOUNTPOINT.

    -o threads=N    worker threads (default: the session's)
    -o uring        serve over FUSE-over-io_uring when the kernel allows it",
    own_options: true,
    stats: true,
};

fn main() -> ExitCode {
    COMMAND.run(|args| {
        let mut mount = args.mount;
        mount.default_permissions = true;
        mount.fsname.get_or_insert_with(|| "nodefs".into());
        let mut session = SessionConfig::default();
        if let Some(o) = args.options.iter().find(|o| !session.take_option(o)) {
            return Err(cli::UsageError(format!("unknown or invalid option `{o}`")).into());
        }
        let fs = NodeFs::with_options(tree::root(), NodeOptions::default());
        let counts = fs.clone();
        let report = serve_with(fs, &args.mountpoint, &mount, session)?;
        if let Some(path) = args.stats {
            let counts = [
                ("live_nodes", counts.live_nodes() as u64),
                ("open_files", counts.open_files() as u64),
            ];
            std::fs::write(&path, report.stats.to_json_with(&counts))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(())
    })
}
