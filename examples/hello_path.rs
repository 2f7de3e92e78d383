//! hello on the path layer: one read-only file, `/hello`. `hello_path MOUNTPOINT`; Ctrl-C unmounts.
#[path = "common/cli.rs"]
mod cli; // -f, -d, -o and --help as passthrough_ll takes them; errors printed with their text

use fuse_wire::path::{PathDirFill as Dir, PathFilesystem, PathFs, PathOpened};
use fuse_wire::session::keeper::{KeeperLink, run_keeper};
use fuse_wire::{Errno, FileAttr, FileKind::*, OpenFlags, ReadRequest, RequestContext as Ctx};
use std::path::Path;
use std::process::ExitCode;

const TEXT: &[u8] = b"Hello, world!\n";

struct Hello;

impl PathFilesystem for Hello {
    type File = ();
    fn getattr(&self, _: &Ctx<'_>, path: Option<&Path>, _: Option<&()>) -> Result<FileAttr, Errno> {
        match path.and_then(Path::to_str) {
            Some("/") => Ok(FileAttr::fixed(1, Directory, 0o555)),
            Some("/hello") => Ok(FileAttr::fixed(2, RegularFile, 0o444).with_size(TEXT.len() as u64)),
            _ => Err(Errno::ENOENT),
        }
    }
    fn open(&self, _: &Ctx<'_>, _: &Path, _: OpenFlags) -> Result<PathOpened<()>, Errno> {
        Ok(PathOpened::new(()))
    }
    fn read(&self, _: &Ctx<'_>, _: &(), req: ReadRequest, reply: fuse_wire::reply::ReplyData) {
        let start = (req.offset as usize).min(TEXT.len());
        reply.data(&TEXT[start..start.saturating_add(req.size as usize).min(TEXT.len())]);
    }
    fn readdir(&self, _: &Ctx<'_>, _: &Path, offset: u64, out: &mut Dir<'_>) -> Result<(), Errno> {
        // One entry, cookie 1: listed unless the kernel continues after it.
        for (cookie, name) in [(1, b"hello")].into_iter().skip(offset as usize) {
            if out.add(name, RegularFile, cookie).is_full() {
                break;
            }
        }
        Ok(())
    }
}

const COMMAND: cli::Command = cli::Command {
    name: "hello_path",
    about: "Serves a read-only directory holding one file, hello, at MOUNTPOINT, on the path layer.

    -o keeper   run under a keeper: the daemon is replaced when it dies (SIGUSR2:
                upgraded), the path layer's node table kept for it (docs/recovery.md)",
    own_options: true,
    stats: false,
};

fn main() -> ExitCode {
    // Started by a keeper: the path layer keeps its node table where the
    // keeper holds it, so a successor's node ids mean the same files.
    if let Some(link) = KeeperLink::from_env() {
        cli::init_logging(std::env::args().any(|a| a == "-d"));
        let ttl = std::time::Duration::from_secs(1);
        let served = link.serve(
            |r| PathFs::kept(Hello, ttl, &r),
            |_| Vec::new(),
            Default::default(),
        );
        return match served {
            Ok(true) => KeeperLink::exit_retired(),
            r => COMMAND.finish(r.map(drop).map_err(Into::into)),
        };
    }
    COMMAND.run(|args| {
        let keeper = match args.options.as_slice() {
            [] => false,
            [o] if o == "keeper" => true,
            [o, ..] => return Err(cli::UsageError(format!("unknown option `{o}`")).into()),
        };
        let mut opts = args.mount;
        opts.read_only = true;
        if keeper {
            let program = std::env::current_exe().unwrap_or_else(|_| "hello_path".into());
            let child_args = if args.debug { vec!["-d".into()] } else { Vec::new() };
            run_keeper(&args.mountpoint, &opts, program, child_args)?;
        } else {
            opts.auto_unmount = true;
            fuse_wire::serve(PathFs::new(Hello), &args.mountpoint, &opts)?;
        }
        Ok(())
    })
}
