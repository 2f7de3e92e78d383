//! The command line the small examples share with `passthrough_ll`:
//!
//! ```text
//! NAME [-f] [-d] [-o opt,...] [--stats FILE] [-h|--help] [-V|--version] MOUNTPOINT
//! ```
//!
//! - `-f` (foreground) changes nothing: the examples always run in the
//!   foreground, until the filesystem is unmounted or the process gets
//!   Ctrl-C, SIGTERM or SIGHUP. It is accepted because `mount.fuse3` and
//!   habits from libfuse pass it.
//! - `-d` (or `-o debug`) logs at debug level; `RUST_LOG` still decides when
//!   it is set. Without either, the examples log at info level.
//! - `-o` lists may repeat and stand anywhere, also as `-oLIST`. Mount
//!   options (`MountOptions`) are taken out; an example that has options of
//!   its own gets the others, any other example refuses them.
//! - `--stats FILE` only where the example offers it; `--` ends the flags.
//!
//! [`Command::run`] also gives every example the same ending: an error is
//! printed with its `Display` text after the program's name (`hello:
//! mountpoint /mnt/x does not exist`), with exit status 1, or 2 for a bad
//! command line.
#![allow(dead_code)] // each example uses the part it needs

use fuse_wire::MountOptions;
use std::error::Error;
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;

/// One example's command line.
pub struct Command {
    /// The program's name, also the prefix of its error messages.
    pub name: &'static str,
    /// What it does and the `-o` options of its own, shown by `--help`
    /// between the usage line and the common flags.
    pub about: &'static str,
    /// Whether it interprets `-o` options that are not mount options
    /// ([`Args::options`]); without, they are refused.
    pub own_options: bool,
    /// Whether it takes `--stats FILE`.
    pub stats: bool,
}

/// What a command line asks the example to do.
#[derive(Debug)]
pub struct Args {
    pub mountpoint: PathBuf,
    /// The mount options of the `-o` lists.
    pub mount: MountOptions,
    /// The other `-o` options in order (only with [`Command::own_options`]).
    pub options: Vec<String>,
    /// `--stats FILE` (only with [`Command::stats`]).
    pub stats: Option<PathBuf>,
    /// `-d` or `-o debug`.
    pub debug: bool,
}

/// A command line that cannot be served, or an option the example refuses:
/// exit status 2 and a pointer to `--help`.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for UsageError {}

/// Logs to stderr at debug level with `debug`, else at info level;
/// `RUST_LOG` decides when it is set.
pub fn init_logging(debug: bool) {
    let level = if debug { "debug" } else { "info" };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
}

impl Command {
    /// Reads the process's arguments, installs the logger and calls
    /// `serve` with them; returns the exit status, having printed what went
    /// wrong, if anything, as `NAME: ERROR` on stderr.
    pub fn run(&self, serve: impl FnOnce(Args) -> Result<(), Box<dyn Error>>) -> ExitCode {
        let args = match self.parse(std::env::args_os().skip(1)) {
            Ok(Parsed::Run(args)) => args,
            Ok(Parsed::Help) => {
                print!("{}", self.help());
                return ExitCode::SUCCESS;
            }
            Ok(Parsed::Version) => {
                println!("{} (fuse-wire {})", self.name, env!("CARGO_PKG_VERSION"));
                return ExitCode::SUCCESS;
            }
            Err(e) => return self.usage_error(&e),
        };
        init_logging(args.debug);
        self.finish(serve(args))
    }

    /// The exit status of `result`, printing its error as `NAME: ERROR`
    /// (with a pointer to `--help` for a [`UsageError`]).
    pub fn finish(&self, result: Result<(), Box<dyn Error>>) -> ExitCode {
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => match e.downcast_ref::<UsageError>() {
                Some(e) => self.usage_error(e),
                None => {
                    eprintln!("{}: {e}", self.name);
                    ExitCode::FAILURE
                }
            },
        }
    }

    fn usage_error(&self, e: &UsageError) -> ExitCode {
        eprintln!("{}: {e}\n({} --help lists the options)", self.name, self.name);
        ExitCode::from(2)
    }

    /// The `--help` text.
    fn help(&self) -> String {
        let (stats, stats_line) = if self.stats {
            (
                "[--stats FILE] ",
                "    --stats FILE    write the session's statistics as JSON to FILE at exit\n",
            )
        } else {
            ("", "")
        };
        format!(
            "usage: {name} [-f] [-d] [-o opt,...] {stats}MOUNTPOINT\n\n{about}\n\n\
             \x20   -f              foreground (always: it runs until unmounted, Ctrl-C,\n\
             \x20                   SIGTERM or SIGHUP, then unmounts)\n\
             \x20   -d              debug logging (also -o debug; RUST_LOG wins when set)\n\
             \x20   -o opt,...      mount options (ro, allow_other, default_permissions,\n\
             \x20                   auto_unmount, fsname=... as for mount.fuse3; the\n\
             \x20                   MountOptions documentation lists them){own}\n\
             {stats_line}\
             \x20   -h, --help      this help\n\
             \x20   -V, --version   version\n",
            name = self.name,
            about = self.about.trim_end(),
            own = if self.own_options {
                ",\n                    or one of the options above"
            } else {
                ""
            },
        )
    }

    /// Parses the arguments after the program's name.
    fn parse(&self, argv: impl IntoIterator<Item = OsString>) -> Result<Parsed<Args>, UsageError> {
        let mut lists = Vec::new();
        let mut positional = Vec::new();
        let (mut debug, mut stats, mut only_positional) = (false, None, false);
        let mut it = argv.into_iter();
        while let Some(arg) = it.next() {
            let flag = match arg.to_str() {
                Some(s) if !only_positional && s.starts_with('-') && s != "-" => s,
                _ => {
                    positional.push(arg);
                    continue;
                }
            };
            match flag {
                "--" => only_positional = true,
                "-h" | "--help" => return Ok(Parsed::Help),
                "-V" | "--version" => return Ok(Parsed::Version),
                "-f" => {}
                "-d" => debug = true,
                "-o" => {
                    let list = it
                        .next()
                        .ok_or_else(|| UsageError("-o needs an option list".into()))?;
                    let list = list
                        .into_string()
                        .map_err(|l| UsageError(format!("-o {l:?}: not UTF-8")))?;
                    lists.push(list);
                }
                s if s.starts_with("-o") => lists.push(s[2..].to_string()),
                "--stats" if self.stats => {
                    stats = Some(PathBuf::from(
                        it.next()
                            .ok_or_else(|| UsageError("--stats needs a file name".into()))?,
                    ));
                }
                s if self.stats && s.starts_with("--stats=") => {
                    stats = Some(PathBuf::from(&s["--stats=".len()..]))
                }
                s => return Err(UsageError(format!("unknown argument `{s}`"))),
            }
        }
        let mountpoint = match positional.len() {
            0 => return Err(UsageError("no mountpoint given".into())),
            1 => PathBuf::from(positional.remove(0)),
            _ => {
                let extra: Vec<_> = positional[1..].iter().map(|a| a.to_string_lossy()).collect();
                return Err(UsageError(format!(
                    "one mountpoint only; extra arguments: {}",
                    extra.join(" ")
                )));
            }
        };
        let (mount, rest) =
            MountOptions::parse_known(&lists.join(",")).map_err(|e| UsageError(e.to_string()))?;
        let mut options = Vec::new();
        for o in rest {
            match o.as_str() {
                "debug" => debug = true,
                _ if self.own_options => options.push(o),
                _ => return Err(UsageError(format!("unknown option `{o}`"))),
            }
        }
        Ok(Parsed::Run(Args {
            mountpoint,
            mount,
            options,
            stats,
            debug,
        }))
    }
}

/// What the arguments ask for (here, and in the parsers of their own of
/// memfs and pathfs).
#[derive(Debug)]
pub enum Parsed<A> {
    /// Serve with these.
    Run(A),
    /// `-h`, `--help`.
    Help,
    /// `-V`, `--version`.
    Version,
}

/// The start such programs share: the arguments as UTF-8, `--help` (the
/// program's `usage`) and `-V` answered, a bad command line reported with
/// status 2, and the logger set: debug level when `debug` says so, else
/// `quiet` (`RUST_LOG` decides when it is set). `Err` is the exit status
/// to return at once.
pub fn start<A>(
    name: &str,
    usage: &str,
    parse: impl FnOnce(&[String]) -> Result<Parsed<A>, String>,
    debug: impl FnOnce(&A) -> bool,
    quiet: log::LevelFilter,
) -> Result<A, ExitCode> {
    let mut argv = Vec::new();
    for a in std::env::args_os().skip(1) {
        match a.into_string() {
            Ok(s) => argv.push(s),
            Err(a) => {
                eprintln!("{name}: argument {a:?} is not valid UTF-8");
                return Err(ExitCode::from(2));
            }
        }
    }
    let args = match parse(&argv) {
        Ok(Parsed::Run(a)) => a,
        Ok(Parsed::Help) => {
            print!("{usage}");
            return Err(ExitCode::SUCCESS);
        }
        Ok(Parsed::Version) => {
            println!("{name} (fuse-wire {})", env!("CARGO_PKG_VERSION"));
            return Err(ExitCode::SUCCESS);
        }
        Err(e) => {
            eprintln!("{name}: {e}\n({name} --help lists the options)");
            return Err(ExitCode::from(2));
        }
    };
    let level = if debug(&args) {
        log::LevelFilter::Debug
    } else {
        quiet
    };
    env_logger::Builder::new()
        .filter_level(level)
        .parse_default_env()
        .init();
    Ok(args)
}

/// The flags of passthrough_ll's command line, as the programs with
/// parsers of their own (passthrough_ll, memfs, pathfs) take them:
/// `[-f] [-d] [-s] [-o LIST]... [--stats FILE] [--] [SOURCE] MOUNTPOINT`.
#[derive(Debug)]
pub struct Flags {
    /// The `-o` lists, in order (`-o LIST` or `-oLIST`).
    pub opts: Vec<String>,
    /// `SOURCE`, when two positional arguments were given.
    pub source: Option<PathBuf>,
    /// `MOUNTPOINT`.
    pub mountpoint: PathBuf,
    /// `-d`.
    pub debug: bool,
    /// `-s`: one worker thread.
    pub single: bool,
    /// `--stats FILE` or `--stats=FILE`, where the program takes it.
    pub stats: Option<PathBuf>,
}

/// Splits `argv` (after the program name) into [`Flags`]; `-h` and `-V`
/// answer at once. `--stats` is refused unless `stats` is allowed.
pub fn lex(argv: &[String], stats: bool) -> Result<Parsed<Flags>, String> {
    let (mut opts, mut positional) = (Vec::new(), Vec::new());
    let (mut debug, mut single, mut stats_file) = (false, false, None);
    let mut only_positional = false;
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        if only_positional || !a.starts_with('-') || a == "-" {
            positional.push(a.as_str());
            continue;
        }
        match a.as_str() {
            "--" => only_positional = true,
            "-h" | "--help" => return Ok(Parsed::Help),
            "-V" | "--version" => return Ok(Parsed::Version),
            "-f" => {}
            "-d" => debug = true,
            "-s" => single = true,
            "-o" => opts.push(it.next().ok_or("-o needs an option list")?.clone()),
            "--stats" if stats => {
                stats_file = Some(PathBuf::from(it.next().ok_or("--stats needs a file name")?))
            }
            s if stats && s.starts_with("--stats=") => {
                stats_file = Some(PathBuf::from(&s["--stats=".len()..]))
            }
            s if s.starts_with("-o") => opts.push(s[2..].to_string()),
            s => return Err(format!("unknown argument `{s}`")),
        }
    }
    let (source, mountpoint) = match positional[..] {
        [] => return Err("no mountpoint given".into()),
        [m] => (None, PathBuf::from(m)),
        [s, m] => (Some(PathBuf::from(s)), PathBuf::from(m)),
        [_, _, ref more @ ..] => return Err(format!("too many arguments: {}", more.join(" "))),
    };
    Ok(Parsed::Run(Flags {
        opts,
        source,
        mountpoint,
        debug,
        single,
        stats: stats_file,
    }))
}
