//! The smallest useful filesystem: a read-only root holding one file, `hello`. Run it (as root;
//! Ctrl-C unmounts): `cargo run --example hello -- /mnt/hello; cat /mnt/hello/hello`.
#[path = "common/cli.rs"]
mod cli; // -f, -d, -o and --help as passthrough_ll takes them; errors printed with their text

use fuse_wire::reply::{ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry};
use fuse_wire::session::fdstore::FdStore;
use fuse_wire::session::keeper::{KeeperLink, run_keeper};
use fuse_wire::session::service::{ServiceEnd, serve_with_fdstore};
use fuse_wire::{
    Entry, Errno, FileAttr, FileHandle, FileKind, Filesystem, Inode, ReadRequest, Recovery, RequestContext,
};
use std::{ffi::CStr, process::ExitCode, sync::Arc, time::Duration};

const CONTENT: &[u8] = b"Hello, world!\n";
const HELLO: Inode = Inode(2);
const TTL: Duration = Duration::from_secs(3600); // nothing changes: let the kernel cache it all

pub struct Hello;
fn attr(ino: Inode) -> Result<FileAttr, Errno> {
    match ino {
        Inode::ROOT => Ok(FileAttr::fixed(ino.0, FileKind::Directory, 0o555)),
        HELLO => Ok(FileAttr::fixed(ino.0, FileKind::RegularFile, 0o444).with_size(CONTENT.len() as u64)),
        _ => Err(Errno::ENOENT),
    }
}

impl Filesystem for Hello {
    // Its node ids are fixed: any daemon of it resolves them alike.
    fn recovery(&self) -> Recovery {
        Recovery::Durable
    }

    fn lookup(&self, _: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        if parent != Inode::ROOT || name.to_bytes() != b"hello" {
            return reply.error(Errno::ENOENT);
        }
        reply.result(attr(HELLO).map(|a| Entry::new(HELLO, a, TTL))); // never freed: no lookup count
    }

    fn getattr(&self, _: &RequestContext<'_>, ino: Inode, _: Option<FileHandle>, reply: ReplyAttr) {
        reply.result(attr(ino).map(|a| (TTL, a)));
    }

    fn read(&self, _: &RequestContext<'_>, _: Inode, _: FileHandle, req: ReadRequest, reply: ReplyData) {
        let rest = CONTENT.get(req.offset as usize..).unwrap_or_default(); // default open: any open is fine
        reply.data(&rest[..rest.len().min(req.size as usize)]); // shorter than asked: end of file
    }

    fn readdir(&self, _: &RequestContext<'_>, _: Inode, _: FileHandle, off: u64, mut reply: ReplyDirectory) {
        let entries = [
            (Inode::ROOT, FileKind::Directory, "."),
            (Inode::ROOT, FileKind::Directory, ".."),
            (HELLO, FileKind::RegularFile, "hello"),
        ];
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(off as usize) {
            if reply.add(ino, i as u64 + 1, kind, name).is_full() {
                break; // the kernel will ask again from the cookie it got last
            }
        }
        reply.ok();
    }
}

const COMMAND: cli::Command = cli::Command {
    name: "hello",
    about: "Serves a read-only directory holding one file, hello, at MOUNTPOINT.

    -o keeper       keep the mount in this process and serve it from a child,
                    replaced when it dies (SIGUSR2: upgrade to the binary on disk)
    -o fdstore      run as a systemd service that keeps the mount in systemd's
                    file-descriptor store across crashes and upgrades
                    (SIGUSR2: retire, exit 75 and be restarted)
    -o uring        ask for FUSE-over-io_uring (not used with keeper or
                    fdstore: the log says why)",
    own_options: true,
    stats: false,
};

fn main() -> ExitCode {
    // Read before any thread starts: it takes variables out of the environment.
    let fd_store = FdStore::from_env();
    // Started by a keeper (`-o keeper`): serve the connection it holds.
    if let Some(link) = KeeperLink::from_env() {
        cli::init_logging(std::env::args().any(|a| a == "-d"));
        let mut config = fuse_wire::SessionConfig::default();
        if std::env::args().any(|a| a == "uring") {
            config.transport = fuse_wire::session::Transport::Uring;
        }
        return match link.serve(|_| Ok(Hello), |_| Vec::new(), config) {
            Ok(true) => KeeperLink::exit_retired(),
            r => COMMAND.finish(r.map(drop).map_err(Into::into)),
        };
    }
    COMMAND.run(|args| {
        let (mut keeper, mut fdstore, mut uring) = (false, false, false);
        for o in &args.options {
            match o.as_str() {
                "keeper" => keeper = true,
                "fdstore" => fdstore = true,
                "uring" => uring = true,
                _ => return Err(cli::UsageError(format!("unknown option `{o}`")).into()),
            }
        }
        let mut opts = args.mount; // what -o asked for, and:
        opts.read_only = true;
        opts.fsname.get_or_insert_with(|| "hello".into());
        let config = fuse_wire::SessionConfig {
            transport: if uring {
                fuse_wire::session::Transport::Uring
            } else {
                fuse_wire::session::Transport::DevFuse
            },
            ..Default::default()
        };
        if fdstore {
            // systemd keeps the connection while this daemon comes and goes.
            let Some(store) = fd_store? else {
                return Err(cli::UsageError(
                    "-o fdstore: not run by systemd ($NOTIFY_SOCKET is unset)".into(),
                )
                .into());
            };
            let end = serve_with_fdstore(
                Arc::new(store),
                &args.mountpoint,
                &opts,
                |_| Ok(Hello),
                |_| Vec::new(),
                config,
            )?;
            if end == ServiceEnd::Retired {
                std::process::exit(fuse_wire::session::service::RETIRED);
            }
        } else if keeper {
            // This process keeps the mount; a child serves it, and is replaced
            // when it dies (SIGUSR2: a graceful upgrade to the binary on disk).
            let program = std::env::current_exe().unwrap_or_else(|_| "hello".into());
            let mut child_args = Vec::new();
            if args.debug {
                child_args.push("-d".into());
            }
            if uring {
                child_args.push("uring".into());
            }
            run_keeper(&args.mountpoint, &opts, program, child_args)?;
        } else {
            fuse_wire::serve_with(Hello, &args.mountpoint, &opts, config)?;
        }
        Ok(())
    })
}
