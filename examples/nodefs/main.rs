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
use fuse_wire::session::keeper::{KeeperLink, run_keeper};
use std::process::ExitCode;

const COMMAND: cli::Command = cli::Command {
    name: "nodefs",
    about: "Serves an in-memory filesystem on the node layer at MOUNTPOINT.

    -o threads=N    worker threads (default: the session's)
    -o max_threads=N  most workers running handlers at once (default: the session's)
    -o uring        serve over FUSE-over-io_uring when the kernel allows it
    -o keeper       run under a keeper: refused for now, the node layer keeps its
                    table in the daemon only (docs/recovery.md)",
    own_options: true,
    stats: true,
};

fn main() -> ExitCode {
    // Started by a keeper: the library refuses to serve the node layer
    // there, and says why (its node ids would mean other nodes to a successor).
    if let Some(link) = KeeperLink::from_env() {
        cli::init_logging(std::env::args().any(|a| a == "-d"));
        let fs = |_: fuse_wire::session::keeper::Restore<'_>| {
            Ok(NodeFs::with_options(tree::root(), NodeOptions::default()))
        };
        let served = link.serve(fs, |_| Vec::new(), SessionConfig::default());
        return COMMAND.finish(served.map(drop).map_err(Into::into));
    }
    COMMAND.run(|args| {
        let mut mount = args.mount;
        mount.default_permissions = true;
        mount.fsname.get_or_insert_with(|| "nodefs".into());
        let mut session = SessionConfig::default();
        let keeper = args.options.iter().any(|o| o == "keeper");
        if let Some(o) = args
            .options
            .iter()
            .find(|o| *o != "keeper" && !session.take_option(o))
        {
            return Err(cli::UsageError(format!("unknown or invalid option `{o}`")).into());
        }
        if keeper {
            let program = std::env::current_exe().unwrap_or_else(|_| "nodefs".into());
            let child_args = if args.debug { vec!["-d".into()] } else { Vec::new() };
            run_keeper(&args.mountpoint, &mount, program, child_args)?;
            return Ok(());
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

/// The test kit's conformance battery through the fake kernel (no mount),
/// the kernel checking permissions as `default_permissions` makes it; the
/// layer's lookup counts equal the kernel's all along and are gone once it
/// forgot every node.
#[cfg(test)]
mod tests {
    use fuse_wire::node::NodeFs;
    use fuse_wire::testing::TestKernel;
    use fuse_wire::testing::battery::Battery;

    #[test]
    fn the_conformance_battery_passes() {
        let k = TestKernel::start(NodeFs::new(super::tree::root())).expect("the kit starts");
        let battery = Battery {
            default_permissions: true,
            ..Battery::default()
        };
        let report = battery.run(&k);
        report.assert_passed();
        assert_eq!(report.unsupported().count(), 0, "{report}");
        if let Err(f) = fuse_wire::testing::explorer::Explorer::default().run(&k) {
            panic!("{f}");
        }
        k.compare_lookup_counts(|fs| fs.lookup_counts());
        if let Err(r) = k.finish_with(Some(&|fs: &NodeFs| fs.lookup_counts())) {
            panic!("{r}");
        }
    }
}
