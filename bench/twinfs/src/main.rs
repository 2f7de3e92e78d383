//! twinfs: one in-memory filesystem (directories and regular files) served
//! on the node layer (`--api node`), on the raw `Filesystem` trait
//! (`--api raw`) or on the async trait on a Tokio runtime (`--api async`),
//! over the same storage code, so that bench/layers measures what the layer
//! itself costs. A benchmark instrument, not an example: no
//! links, renames, symlinks or extended attributes.
//!
//! ```sh
//! twinfs --api node|raw|async [--threads N] [--uring] MOUNTPOINT
//! ```
//!
//! The kernel checks permissions (`default_permissions`); names and
//! attributes are cached for 1 s either way, listings are plain READDIR.

mod async_api;
mod node_api;
mod raw_api;
mod store;

use fuse_wire::asyncfs::{AsyncFs, TokioSpawner};
use fuse_wire::node::{NodeFs, NodeOptions};
use fuse_wire::session::{SessionConfig, Transport};
use fuse_wire::{MountOptions, serve_with};
use std::process::ExitCode;

const USAGE: &str = "usage: twinfs --api node|raw|async [--threads N] [--uring] MOUNTPOINT";

fn main() -> ExitCode {
    let (mut api, mut mountpoint, mut session) = (None, None, SessionConfig::default());
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), mountpoint.is_none()) {
            ("--api", _) => api = args.next(),
            ("--threads", _) => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) if n > 0 => session.workers = n,
                _ => return usage(),
            },
            ("--uring", _) => session.transport = Transport::Uring,
            (s, true) if !s.starts_with('-') => mountpoint = Some(a),
            _ => return usage(),
        }
    }
    let Some(mountpoint) = mountpoint else {
        return usage();
    };
    let mount = MountOptions {
        default_permissions: true,
        fsname: Some(format!("twinfs-{}", api.as_deref().unwrap_or("?"))),
        ..MountOptions::default()
    };
    let served = match api.as_deref() {
        Some("node") => {
            let opts = NodeOptions {
                readdirplus: false,
                ..NodeOptions::default()
            };
            serve_with(
                NodeFs::with_options(store::Inode::root(), opts),
                &mountpoint,
                &mount,
                session,
            )
        }
        Some("async") => {
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("twinfs: starting the Tokio runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let twin = async_api::AsyncTwin(raw_api::RawFs::new(store::Inode::root()));
            let fs = AsyncFs::new(twin, TokioSpawner::new(runtime.handle().clone()));
            serve_with(fs, &mountpoint, &mount, session)
        }
        Some("raw") => serve_with(
            raw_api::RawFs::new(store::Inode::root()),
            &mountpoint,
            &mount,
            session,
        ),
        _ => return usage(),
    };
    match served {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("twinfs: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> ExitCode {
    eprintln!("{USAGE}");
    ExitCode::from(2)
}
