//! The runner: one mount per configuration, every check run on a plain
//! directory of the same tmpfs and then through the mount (each in a fresh
//! subdirectory), and one report listing, per check, every step whose
//! outcome differs, followed by the daemon's last output lines.

use super::daemon::{Daemon, Scratch};
use crate::common;
use crate::posix_support::Log;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// How long one check may take through the mount before the connection is
/// aborted and the configuration given up.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// One way of running the daemon.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// `-o` options besides `source=`, `allow_other`, `xattr` and `default_permissions`.
    pub opts: &'static str,
    /// With `default_permissions` (the kernel checks permissions itself).
    pub default_permissions: bool,
    /// With the daemon in a pid namespace of its own (`unshare --pid --fork`):
    /// callers outside it arrive with pid 0.
    pub own_pid_ns: bool,
}

impl Config {
    /// Every `-o` option given to the daemon except `source=` and `allow_other`.
    pub fn options(&self) -> String {
        // xattr: the suite checks extended attributes too (off by default).
        let mut o = vec!["xattr"];
        if !self.opts.is_empty() {
            o.push(self.opts);
        }
        // With allow_other passthrough_ll turns default_permissions on
        // unless told otherwise.
        o.push(if self.default_permissions {
            "default_permissions"
        } else {
            "no_default_permissions"
        });
        o.join(",")
    }

    /// A short label: the options, the pid namespace and the transport.
    pub fn label(&self) -> String {
        format!(
            "passthrough_ll -o {}{}{}",
            self.options(),
            if self.own_pid_ns {
                " (own pid namespace)"
            } else {
                ""
            },
            if common::over_uring() {
                " over io_uring"
            } else {
                ""
            }
        )
    }
}

/// What a check needs of a configuration to be meaningful there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Runs everywhere.
    Nothing,
    /// The caller's supplementary groups must be knowable: a caller outside
    /// the daemon's pid namespace arrives with pid 0 and nothing in the
    /// request names its groups, so not there.
    CallerGroups,
    /// The caller's capabilities must be knowable: with pid 0 only the
    /// kernel can tell (`default_permissions`).
    CallerCaps,
    /// A daemon in its own pid namespace (callers inside it).
    OwnPidNs,
}

impl Needs {
    fn met_by(self, cfg: &Config) -> bool {
        match self {
            Needs::Nothing => true,
            Needs::CallerGroups => !cfg.own_pid_ns,
            Needs::CallerCaps => !cfg.own_pid_ns || cfg.default_permissions,
            Needs::OwnPidNs => cfg.own_pid_ns,
        }
    }
}

/// Where a check runs.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// An empty directory (mode 0755, root's) to work in.
    pub root: PathBuf,
    /// The same directory as the backing filesystem holds it: `root` itself
    /// for the plain directory, the daemon's source for the mount.
    pub backing_root: PathBuf,
    /// Whether this is the plain directory.
    pub plain: bool,
    /// The configuration under test (also for the plain run).
    pub cfg: Config,
    /// The daemon's pid namespace (`/proc/<pid>/ns/pid`), when it has its own.
    pub pid_ns: Option<PathBuf>,
}

impl Ctx {
    /// `root/<name>`.
    pub fn p(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// `p` as the backing filesystem holds it (past the daemon and the
    /// kernel's caches).
    pub fn backing(&self, p: &Path) -> PathBuf {
        match p.strip_prefix(&self.root) {
            Ok(rel) => self.backing_root.join(rel),
            Err(_) => p.to_path_buf(),
        }
    }
}

/// A check: records each step's outcome; runs once per target.
pub struct Check {
    /// Its name (also its subdirectory's).
    pub name: &'static str,
    /// The steps.
    pub run: fn(&Ctx, &mut Log),
    /// Where it is meaningful.
    pub needs: Needs,
}

/// Runs `check` on its own thread: `Err` with the panic message if it panics,
/// `Err` after `timeout` (then calls `on_timeout` and waits a little more).
fn run_one(
    ctx: &Ctx,
    check: fn(&Ctx, &mut Log),
    timeout: Duration,
    on_timeout: &dyn Fn(),
) -> Result<Log, String> {
    let (tx, rx) = mpsc::channel();
    let c = ctx.clone();
    let h = std::thread::Builder::new()
        .name("check".into())
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // Made as root (through the mount for the mount), like
                // everything a check sets up.
                fresh_dir(&c.root);
                let mut log = Log::default();
                check(&c, &mut log);
                log
            }));
            let _ = tx.send(r);
        })
        .expect("spawn check thread");
    let r = match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => {
            on_timeout();
            return match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(_) => Err(format!("timed out after {timeout:?}; the connection was aborted")),
                Err(_) => Err(format!(
                    "timed out after {timeout:?} and still hangs after aborting the connection"
                )),
            };
        }
    };
    let _ = h.join();
    r.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into())
    })
}

fn fresh_dir(p: &Path) {
    fs::create_dir(p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
    crate::posix_support::set_mode(p, 0o755);
}

/// Mounts `cfg` once, runs every check of `checks` that is meaningful there
/// on a plain tmpfs directory and through the mount, and panics with every
/// differing step (plain vs mount), per check, and the daemon's output tail.
/// Without the ability to mount it skips loudly, or fails under `CI=true`.
pub fn run_config(cfg: Config, checks: &[Check]) {
    if !common::require_mount_capability() {
        return;
    }
    let label = cfg.label();
    let scratch = Scratch::new("security");
    let plain = scratch.dir("plain");
    let source = scratch.dir("source");
    let mnt = scratch.dir("mnt");
    let daemon = Daemon::start(
        &cfg.options(),
        cfg.own_pid_ns,
        &source,
        &mnt,
        scratch.outside(),
        &label,
    );
    let pid_ns = cfg.own_pid_ns.then(|| daemon.pid_ns_path());

    let mut failures: Vec<String> = Vec::new();
    let mut ran = 0;
    for check in checks.iter().filter(|c| c.needs.met_by(&cfg)) {
        ran += 1;
        let plain_ctx = Ctx {
            root: plain.join(check.name),
            backing_root: plain.join(check.name),
            plain: true,
            cfg,
            pid_ns: pid_ns.clone(),
        };
        let reference = match run_one(&plain_ctx, check.run, CHECK_TIMEOUT, &|| {}) {
            Ok(l) => l,
            Err(e) => panic!(
                "{label}: check {} failed on the plain directory itself: {e}",
                check.name
            ),
        };
        assert!(
            !reference.steps().is_empty(),
            "check {} recorded nothing",
            check.name
        );
        let ctx = Ctx {
            root: mnt.join(check.name),
            backing_root: source.join(check.name),
            plain: false,
            ..plain_ctx
        };
        let mounted = run_one(&ctx, check.run, CHECK_TIMEOUT, &|| {
            if let Err(e) = daemon.abort() {
                eprintln!("{label}: {e}");
            }
        });
        match mounted {
            Ok(log) => {
                let diff = log.diff(&reference);
                if !diff.is_empty() {
                    failures.push(format!("{}:\n      {}", check.name, diff.join("\n      ")));
                }
            }
            Err(e) => {
                failures.push(format!("{}: {e}", check.name));
                if e.contains("timed out") {
                    failures.push("(the remaining checks were not run: the connection is aborted)".into());
                    break;
                }
            }
        }
    }
    let exit = daemon.finish();
    if !exit.status.is_some_and(|s| s.success()) {
        failures.push(format!(
            "the daemon did not exit cleanly after unmount: {:?}",
            exit.status
        ));
    }
    failures.extend(exit.problems.iter().cloned());
    if !failures.is_empty() {
        let names: Vec<&str> = failures
            .iter()
            .filter_map(|f| f.split(':').next())
            .filter(|n| !n.contains(' '))
            .collect();
        panic!(
            "{label}: {} of {ran} checks differ from a plain directory ({})\n  (each line: step: plain dir = outcome there, here = outcome through the mount)\n  {}\n--- daemon output (last lines) ---\n{}",
            names.len(),
            names.join(", "),
            failures.join("\n  "),
            if exit.output_tail.is_empty() {
                "(nothing)"
            } else {
                &exit.output_tail
            }
        );
    }
}
