#!/usr/bin/env python3
"""fuse-wire's benchmark driver (run it through `bench/run`; see bench/README.md).

Mounts each target over one fresh tmpfs source directory, runs the same fio and
mdtest workloads against each, interleaving targets round by round, and writes
bench/results/latest.json. bench/report.py turns that into tables, docs and SVG.

Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import resource
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from procs import (CLK_TCK, alive, child_pids, context_switches, cpu_seconds, raise_on_signals,  # noqa: F401
                   supports_keeper, switches_between, takes_option)

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
TARGET_DIR = Path(os.environ.get("CARGO_TARGET_DIR", str(REPO / "target")))
LIBFUSE_EXAMPLES = Path("/usr/share/doc/libfuse3-dev/examples")
APT_PACKAGES = ["libfuse3-dev", "fuse3", "fio", "pkg-config", "bonnie++"]

MiB = 1 << 20

# How long and how big. Every fio workload is bounded by `runtime`, every
# mdtest phase by `md_seconds` (and `md_max_files` per thread).
MODES = {
    "quick": dict(
        rounds=3,
        runtime=0.2,
        md_seconds=0.08,
        ls_runs=1,
        md_max_files=20_000,
        seq_mib=128,
        rand_mib=64,
        shared_mib=64,
        extend_mib=256,
        ls_entries=10_000,
        big_entries=15_000,
        tree_dirs=50,
        tmpfs_mib=4096,
        idle_settle=0.5,
        idle_seconds=0.5,
        bonnie_runs=1,
        bonnie_files=1,
    ),
    "full": dict(
        rounds=4,
        runtime=1.5,
        md_seconds=0.5,
        ls_runs=2,
        md_max_files=100_000,
        seq_mib=1024,
        rand_mib=256,
        shared_mib=256,
        extend_mib=1024,
        ls_entries=10_000,
        big_entries=30_000,
        tree_dirs=1000,
        tmpfs_mib=8192,
        idle_settle=1.0,
        idle_seconds=5.0,
        bonnie_runs=4,
        bonnie_files=10,
    ),
}

# Files per directory of the tree the `tree_walk` row walks (plus the directory).
TREE_FILES = 199

# Targets, in table order. `base` is the libfuse target with the same cache
# mode, the one a ratio "to libfuse" divides by. `fd_per_inode`: the daemon
# holds a descriptor for every inode the kernel knows (libfuse's example, ours
# without file handles), so a many-inodes row larger than the open-file limit
# is skipped for it (recorded in the result's `skipped`). `libfuse_again` is a
# control: libfuse's example once more, divided by the first, so that every run
# shows how far a ratio moves by chance alone on this machine. `passthrough`:
# regular files are opened in kernel passthrough mode (ours by default, as
# root, where the kernel offers it), so the daemon sees no READ or WRITE; the
# rows that measure how our daemon serves data pass `no_passthrough`.
TARGETS = [
    dict(id="native", label="native tmpfs", kind="native", cache="–", base=None),
    dict(id="libfuse", label="libfuse", kind="libfuse", opts=[], cache="auto", base=None, fd_per_inode=True),
    dict(id="libfuse_never", label="libfuse never", kind="libfuse", opts=["cache=never"], cache="never", base=None,
         fd_per_inode=True),
    # Our default: kernel passthrough where the kernel and privileges allow it.
    dict(id="ours", label="ours", kind="ours", opts=[], cache="auto", base="libfuse", passthrough=True),
    # The same with reads and writes served by the daemon.
    dict(id="ours_served", label="ours no passthrough", kind="ours", opts=["no_passthrough"], cache="auto",
         base="libfuse"),
    dict(id="ours_nofh", label="ours no fh", kind="ours", opts=["inode_file_handles=never", "no_passthrough"],
         cache="auto", base="libfuse", fd_per_inode=True),
    dict(id="ours_never", label="ours never", kind="ours", opts=["cache=never", "no_passthrough"], cache="never",
         base="libfuse_never"),
    dict(id="ours_pdw", label="ours pdw", kind="ours", opts=["parallel_direct_writes", "no_passthrough"], cache="auto",
         base="libfuse"),
    # Asked for (`-o passthrough`): the default's mode, or a refusal where it
    # cannot be had.
    dict(id="ours_passthrough", label="ours passthrough", kind="ours", opts=["passthrough"], cache="auto", base="libfuse",
         passthrough=True),
    # The transport: with passthrough the data rows would not reach it.
    dict(id="ours_uring", label="ours io_uring", kind="ours", opts=["uring", "no_passthrough"], cache="auto",
         base="libfuse"),
    # Under a keeper (`-o keeper`): the process started keeps the mount and its
    # child serves, journaling every request whose effect is not idempotent
    # (docs/recovery.md). `cost_of`: the target whose rows it is divided by to
    # give the keeper's cost (report.py's keeper section). Measured are the
    # keeper and its child together.
    # Under a keeper passthrough is off (its backing files would not outlive
    # the child), so its cost is measured against the daemon without it.
    dict(id="ours_keeper", label="ours keeper", kind="ours", opts=["keeper", "no_passthrough"], cache="auto",
         base="libfuse", cost_of="ours_served", keeper=True),
    dict(id="libfuse_again", label="libfuse again", kind="libfuse", opts=[], cache="auto", base="libfuse",
         fd_per_inode=True, control=True),
    # libfuse 3.18.2's example (the current release), built from the shared
    # anchors (build-libfuse.sh): direct I/O with parallel_direct_writes on
    # O_DIRECT opens. Run when asked (--targets, --base libfuse318); with
    # --base libfuse318 every ratio "to libfuse" divides by it, Debian's
    # libfuse row included (its ratio is then a second reference row).
    dict(id="libfuse318", label="libfuse 3.18", kind="libfuse318", opts=[], cache="auto", base=None,
         fd_per_inode=True, optional=True),
    dict(id="libfuse318_again", label="libfuse 3.18 again", kind="libfuse318", opts=[], cache="auto",
         base="libfuse318", fd_per_inode=True, control=True, optional=True),
    # Our O_DIRECT opens as before the session's default: the page cache's
    # direct path, writes to one file one at a time (`-o serial_o_direct`).
    dict(id="ours_serial", label="ours serial O_DIRECT", kind="ours", opts=["serial_o_direct", "no_passthrough"],
         cache="auto",
         base="libfuse", optional=True),
]

# The libfuse 3.18.2 example's builder, beside the repository.
ANCHORS = REPO.parent / "shared" / "anchors"

SHARED_BS = 64 * 1024
JOB_COUNTS = [1, 2, 4]
MD_THREADS = [1, 4]
# bonnie++'s file tests, in the order of its CSV line; it runs only against
# the targets in BONNIE_TARGETS (the daemons with cache=never, as in the
# measurement the issue quotes, and native).
BONNIE_OPS = ["create", "stat", "delete"]
BONNIE_TARGETS = {"native", "libfuse_never", "ours_never"}
MD_PHASES = ["create_private", "stat_private", "unlink_private", "create_shared", "stat_shared",
             "unlink_shared", "write_small", "read_small"]


def workloads(cfg: dict) -> list[dict]:
    """Every number the suite reports, in table order; higher is better for all."""
    w = [
        dict(id="seq_read", label="seq read 1M buffered", unit="MB/s", group="data"),
        dict(id="seq_write", label="seq write 1M buffered", unit="MB/s", group="data"),
        dict(id="rand_read", label="rand read 4k O_DIRECT", unit="kIOPS", group="data"),
        dict(id="rand_write", label="rand write 4k O_DIRECT", unit="kIOPS", group="data"),
    ]
    for kind, what in (("pre", "preallocated"), ("ext", "extending")):
        for n in JOB_COUNTS:
            w.append(dict(id=f"shared_{kind}_j{n}", label=f"shared file {what}, {n} job{'s' if n > 1 else ''}",
                          unit="MB/s", group="shared", jobs=n, kind=kind))
    for t in MD_THREADS:
        for p in MD_PHASES:
            w.append(dict(id=f"md_{p}_t{t}", label=f"{p.replace('_', ' ')}, {t} thr", unit="kops/s",
                          group=f"meta_t{t}", threads=t, phase=p))
    w.append(dict(id="ls_cold", label="ls -l 10k cold", unit="kentries/s", group="meta_t1"))
    if cfg["ls_runs"] == 2:
        w.append(dict(id="ls_warm", label="ls -l 10k warm", unit="kentries/s", group="meta_t1"))
    big, tree = cfg["big_entries"], tree_entries(cfg)
    w.append(dict(id="ls_big", label=f"ls -l {big / 1000:g}k cold", unit="kentries/s", group="inodes",
                  entries=big))
    w.append(dict(id="stat_many", label=f"stat {big / 1000:g}k files cold", unit="kops/s", group="inodes",
                  entries=big))
    w.append(dict(id="tree_walk", label=f"tree walk {tree / 1000:g}k entries", unit="kentries/s",
                  group="inodes", entries=tree))
    for order in ("seq", "rand"):
        for op in BONNIE_OPS:
            w.append(dict(id=f"bonnie_{order}_{op}", label=f"bonnie++ {order} {op}", unit="kops/s",
                          group="bonnie"))
    return w


def tree_entries(cfg: dict) -> int:
    """Entries below the tree's root: its directories and their files."""
    return cfg["tree_dirs"] * (TREE_FILES + 1)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


# ---------------------------------------------------------------- setup


def ensure_tools(allow_install: bool) -> None:
    """Installs Debian's packages the suite needs when one is missing."""
    def have_all() -> list[str]:
        missing = []
        for tool, pkg in (("fio", "fio"), ("pkg-config", "pkg-config"), ("fusermount3", "fuse3"),
                          ("bonnie++", "bonnie++")):
            if shutil.which(tool) is None:
                missing.append(pkg)
        if shutil.which("pkg-config") and subprocess.run(
                ["pkg-config", "--exists", "fuse3"]).returncode != 0:
            missing.append("libfuse3-dev")
        if not (LIBFUSE_EXAMPLES / "passthrough_ll.c").exists() and not (
                LIBFUSE_EXAMPLES / "passthrough_ll.c.gz").exists():
            missing.append("libfuse3-dev")
        if shutil.which("cc") is None:
            missing.append("gcc")
        return sorted(set(missing))

    missing = have_all()
    if not missing:
        return
    if not allow_install or os.geteuid() != 0 or shutil.which("apt-get") is None:
        sys.exit(f"bench: missing packages {missing}; install them (as root: apt-get install "
                 f"{' '.join(APT_PACKAGES)}) or run bench/run as root")
    log(f"installing {' '.join(missing)} (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", *sorted(set(APT_PACKAGES + missing))], env=env,
        stdout=subprocess.DEVNULL)
    still = have_all()
    if still:
        sys.exit(f"bench: still missing after apt-get: {still}")


def build_libfuse(out_dir: Path) -> dict:
    """Builds libfuse's own passthrough_ll from the examples libfuse3-dev ships."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # passthrough_ll.c includes passthrough_helpers.h from the same directory.
    for name in ("passthrough_ll.c", "passthrough_helpers.h"):
        plain, gz = LIBFUSE_EXAMPLES / name, LIBFUSE_EXAMPLES / (name + ".gz")
        if plain.exists():
            data = plain.read_bytes()
        else:  # some packagings compress the doc examples
            import gzip
            data = gzip.decompress(gz.read_bytes())
        (out_dir / name).write_bytes(data)
        if name.endswith(".c"):
            src, code = (plain if plain.exists() else gz), data
    c_file = out_dir / "passthrough_ll.c"
    flags = subprocess.run(["pkg-config", "fuse3", "--cflags", "--libs"], check=True, capture_output=True,
                           text=True).stdout.split()
    # The shipped example reads HAVE_FALLOCATE, HAVE_COPY_FILE_RANGE, ... from the
    # config.h of libfuse's own build. Compiled bare, it answers FALLOCATE with
    # EOPNOTSUPP and lacks copy_file_range: fio then lays out files differently for
    # it than for us. Define what libfuse's build would find on this system.
    flags = [*libfuse_config_defines(out_dir), *flags]
    binary = out_dir / "libfuse_passthrough_ll"
    cmd = ["cc", "-O2", "-Wall", str(c_file), *flags, "-o", str(binary)]
    run(cmd, stdout=subprocess.DEVNULL)
    version = subprocess.run(["pkg-config", "fuse3", "--modversion"], capture_output=True, text=True).stdout.strip()
    return dict(binary=str(binary), source=str(src), sha256=hashlib.sha256(code).hexdigest(),
                compile=" ".join(["cc", "-O2", "-Wall", "passthrough_ll.c", *flags]), version=version)


# The functions libfuse's build system probes for (meson's test_funcs), each
# giving a HAVE_<NAME> in its config.h when the C library links it.
LIBFUSE_PROBED_FUNCS = ("fork", "fstatat", "openat", "readlinkat", "pipe2", "splice", "vmsplice",
                        "posix_fallocate", "fdatasync", "utimensat", "copy_file_range", "fallocate")


def build_libfuse318(out_dir: Path) -> dict:
    """libfuse 3.18.2's passthrough_ll from the shared anchors (built once)."""
    dest = out_dir / "libfuse-3.18"
    binary = dest / "passthrough_ll-3.18"
    script = ANCHORS / "build-libfuse.sh"
    if not binary.exists():
        if not script.exists():
            return dict(binary=None, error=f"{script} is missing")
        r = subprocess.run(["bash", str(script), str(dest)], capture_output=True, text=True)
        if r.returncode != 0 or not binary.exists():
            return dict(binary=None, error=(r.stderr or r.stdout).strip()[-400:])
    tarball = ANCHORS / "libfuse-3.18.2.tar.gz"
    sha = hashlib.sha256(tarball.read_bytes()).hexdigest() if tarball.exists() else None
    return dict(binary=str(binary), error=None, version="3.18.2", source="libfuse-3.18.2.tar.gz",
                sha256=sha, compile="build-libfuse.sh (meson, release, static)")


def libfuse_config_defines(out_dir: Path) -> list[str]:
    """-DHAVE_<NAME> for every probed function that links here, found the way
    libfuse's build finds them: a program that takes the function's address."""
    defines = []
    probe = out_dir / "probe.c"
    for func in LIBFUSE_PROBED_FUNCS:
        probe.write_text("#define _GNU_SOURCE\n#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n"
                         "#include <fcntl.h>\n#include <sys/stat.h>\n"
                         f"int main(void) {{ void *volatile p = (void *)&{func}; return p == 0; }}\n")
        r = subprocess.run(["cc", str(probe), "-o", str(out_dir / "probe")], capture_output=True)
        if r.returncode == 0:
            defines.append(f"-DHAVE_{func.upper()}")
    for leftover in (probe, out_dir / "probe"):
        leftover.unlink(missing_ok=True)
    return defines


def cargo_build(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, CARGO_TARGET_DIR=str(TARGET_DIR))
    return subprocess.run(["cargo", "build", "--release", "--quiet", *args], cwd=REPO, env=env,
                          capture_output=True, text=True)


def build_ours() -> dict:
    r = cargo_build(["--example", "passthrough_ll"])
    binary = TARGET_DIR / "release" / "examples" / "passthrough_ll"
    if r.returncode != 0 or not binary.exists():
        tail = (r.stderr or "").strip().splitlines()[-3:]
        return dict(binary=None, error="cargo build --release --example passthrough_ll failed: " + " | ".join(tail))
    return dict(binary=str(binary), error=None)


def build_mdtest() -> str:
    r = cargo_build(["-p", "mdtest"])
    if r.returncode != 0:
        sys.exit("bench: cargo build --release -p mdtest failed:\n" + r.stderr)
    return str(TARGET_DIR / "release" / "mdtest")


def git_describe() -> str:
    r = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


# ---------------------------------------------------------------- mounts


def mounts_under(root: Path) -> list[tuple[str, str, str]]:
    """(mountpoint, fstype, major:minor) of every mount at or below root, deepest first."""
    out = []
    prefix = str(root)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            mp = parts[4].replace("\\040", " ")
            fstype = parts[parts.index("-") + 1]
            if mp == prefix or mp.startswith(prefix + "/"):
                out.append((mp, fstype, parts[2]))
    return sorted(out, key=lambda m: -len(m[0]))


def abort_fuse(devnum: str) -> None:
    """Aborts a FUSE connection whose daemon no longer answers."""
    minor = devnum.split(":")[1]
    try:
        Path(f"/sys/fs/fuse/connections/{minor}/abort").write_text("1")
    except OSError:
        pass


def raise_nofile() -> int:
    """Raises this process's open-file limit, which the daemons inherit; returns it.

    Both passthrough_ll daemons keep an O_PATH descriptor per inode the kernel
    knows. Raising the hard limit needs CAP_SYS_RESOURCE; without it the soft
    limit goes up to the hard one, and mdtest's file counts are capped below it
    (see Suite.md_files_per_thread) so that no daemon runs out.
    """
    try:
        n = int(Path("/proc/sys/fs/nr_open").read_text())
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    except (OSError, ValueError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Daemon:
    """One FUSE daemon mounted in the foreground (-f), on its own session.
    With keeper=True the process started is a keeper and its child serves."""

    def __init__(self, cmd: list[str], mnt: Path, logfile: Path, keeper: bool = False):
        self.cmd, self.mnt, self.logfile, self.keeper = cmd, mnt, logfile, keeper
        self.log = open(logfile, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.devnum = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for mp, fstype, dev in mounts_under(mnt):
                if mp == str(mnt) and fstype.startswith("fuse"):
                    self.devnum = dev
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"{' '.join(cmd)} did not mount: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return " | ".join(self.logfile.read_text(errors="replace").strip().splitlines()[-3:])
        except OSError:
            return ""

    def pid(self) -> int:
        """The serving process: under a keeper its child (waiting up to 10 s
        for it), else the one started."""
        if not self.keeper:
            return self.proc.pid
        deadline = time.monotonic() + 10
        while True:
            live = [p for p in child_pids(self.proc.pid) if alive(p)]
            if len(live) == 1:
                return live[0]
            if time.monotonic() > deadline:
                raise RuntimeError(f"no daemon serving under keeper {self.proc.pid} after 10 s")
            time.sleep(0.01)

    def pids(self) -> list[int]:
        """Every process of the daemon: a keeper and its child, or the one."""
        return [self.proc.pid, self.pid()] if self.keeper else [self.proc.pid]

    def stop(self) -> None:
        if any(mp == str(self.mnt) for mp, _, _ in mounts_under(self.mnt)):
            r = subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True)
            if r.returncode != 0:
                if self.devnum:
                    abort_fuse(self.devnum)
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def run_stepped(cmd: list[str], on_step, timeout: float) -> str:
    """Runs mdtest with `--step` in `cmd`: calls `on_step("before"|"after",
    PHASE)` at each handshake, then lets it go on. Returns its stdout; raises
    TimeoutExpired after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    # mdtest prints its JSON (a few KiB, well within a pipe) only at the end:
    # follow stderr until it closes, then read stdout.
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pending = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([p.stderr], [], [], left)[0]:
                raise subprocess.TimeoutExpired(cmd, timeout)
            chunk = os.read(p.stderr.fileno(), 4096)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                words = line.decode(errors="replace").split()
                if len(words) == 3 and words[0] == "mdtest-step":
                    on_step(words[1], words[2])
                    p.stdin.write(b"\n")
                    p.stdin.flush()
        out = p.stdout.read()
        p.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return out.decode(errors="replace")


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def reset_hwm(pid: int) -> None:
    """Resets the peak resident set size (VmHWM) of pid to its current RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def read_hwm_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


# ---------------------------------------------------------------- cost


TRACEFS = Path("/sys/kernel/tracing")
REQUEST_EVENT = "fuse:fuse_request_send"


def steal_seconds() -> float | None:
    """CPU time the hypervisor gave to others while this machine wanted it,
    all CPUs together: the `steal` column of /proc/stat's `cpu` line."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def request_counting() -> str | None:
    """Why FUSE requests cannot be counted here, or None when they can: with
    `perf stat` on the kernel's fuse_request_send tracepoint (Linux 6.15+),
    filtered to one connection, counted in the kernel."""
    if shutil.which("perf") is None:
        return "no perf"
    if not (TRACEFS / "events").exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True)
    if not (TRACEFS / "events" / "fuse" / "fuse_request_send").exists():
        return "this kernel has no fuse_request_send tracepoint"
    return None


class RequestCounter:
    """Counts the requests the kernel sends on one FUSE connection between
    start() and stop(): a `perf stat -a` started disabled, switched on and
    off through its control FIFO (each switch acknowledged, so nothing is
    missed at the edges). Every call is bounded in time."""

    def __init__(self, minor: str, tmp: Path):
        self.minor, self.tmp = minor, tmp
        self.proc: subprocess.Popen | None = None

    def _command(self, cmd: str) -> None:
        os.write(self.ctl, (cmd + "\n").encode())
        deadline = time.monotonic() + 10
        got = b""
        while b"ack" not in got:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.ack], [], [], left)[0]:
                raise RuntimeError(f"perf stat did not acknowledge {cmd!r}")
            chunk = os.read(self.ack, 64)
            if not chunk:
                # No writer (yet, or any more): perf opens its end after ours.
                if self.proc.poll() is not None:
                    raise RuntimeError("perf stat ended")
                time.sleep(0.01)
            got += chunk

    def start(self) -> None:
        for name in ("ctl", "ack"):
            f = self.tmp / f"perf-{name}"
            f.unlink(missing_ok=True)
            os.mkfifo(f)
        self.out = self.tmp / "perf-stat.out"
        self.proc = subprocess.Popen(
            ["perf", "stat", "-x,", "-o", str(self.out), "-a", "-D", "-1",
             "--control", f"fifo:{self.tmp / 'perf-ctl'},{self.tmp / 'perf-ack'}",
             "-e", REQUEST_EVENT, "--filter", f"connection == {self.minor}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # perf opens ctl for reading, then ack for writing: open ours to match,
        # without blocking on a perf that died.
        deadline = time.monotonic() + 10
        self.ctl = None
        while self.ctl is None:
            try:
                self.ctl = os.open(self.tmp / "perf-ctl", os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError("perf stat did not start")
                time.sleep(0.01)
        self.ack = os.open(self.tmp / "perf-ack", os.O_RDONLY | os.O_NONBLOCK)
        try:
            self._command("enable")
        except (RuntimeError, OSError):
            self.close()
            raise

    def stop(self) -> int:
        """The requests counted since start()."""
        try:
            self._command("disable")
        finally:
            self.close()
        for line in self.out.read_text().splitlines():
            parts = line.split(",")
            if len(parts) > 2 and parts[2] == REQUEST_EVENT and parts[0].isdigit():
                return int(parts[0])
        raise RuntimeError(f"perf stat printed no count: {self.out.read_text()[-200:]}")

    def close(self) -> None:
        for fd in (getattr(self, "ctl", None), getattr(self, "ack", None)):
            if fd is not None:
                os.close(fd)
        self.ctl = self.ack = None
        if self.proc:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


class Meter:
    """What a daemon spends over one workload: CPU seconds, context switches
    of all its threads and, when they can be counted, the requests it got."""

    def __init__(self, daemon: "Daemon", tmp: Path, count_requests: bool):
        # A keeper and its child together: what running under a keeper costs.
        self.pid = daemon.pids()
        self.counter = RequestCounter(daemon.devnum.split(":")[1], tmp) if count_requests else None

    def start(self) -> None:
        self.cpu0, self.cs0 = cpu_seconds(self.pid), context_switches(self.pid)
        self.steal0 = steal_seconds()
        self.counting = False
        if self.counter:
            try:
                self.counter.start()
                self.counting = True
            except (RuntimeError, OSError) as e:
                log(f"  could not count requests: {e}")

    def stop(self) -> dict:
        cpu, cs = cpu_seconds(self.pid), context_switches(self.pid)
        steal = steal_seconds()
        requests = None
        if self.counting:
            try:
                requests = self.counter.stop()
            except (RuntimeError, OSError) as e:
                log(f"  could not count requests: {e}")
        return dict(cpu_s=None if cpu is None or self.cpu0 is None else cpu - self.cpu0,
                    ctxsw=switches_between(self.cs0, cs), requests=requests,
                    steal_s=None if steal is None or self.steal0 is None else steal - self.steal0)


def idle_wakeups(pid: int | list[int], settle: float, seconds: float) -> float:
    """Context switches per second of all the daemon's threads while nothing
    uses the mount, after `settle` seconds of quiet."""
    time.sleep(settle)
    before = context_switches(pid)
    time.sleep(seconds)
    return switches_between(before, context_switches(pid)) / seconds


# ---------------------------------------------------------------- workloads


class Suite:
    def __init__(self, cfg: dict, work: Path, mdtest: str, nofile: int):
        self.cfg, self.work, self.mdtest, self.nofile = cfg, work, mdtest, nofile
        self.src = work / "src"
        self.mnt = work / "mnt"
        self.count_requests = False
        # The workload ids to run (--workloads); None: all.
        self.only: set[str] | None = None
        # Operations the last fio workload did (its I/Os), for the cost per operation.
        self.last_ops: int | None = None

    def prepare_source(self) -> None:
        """Mounts the tmpfs and writes the files the read and overwrite workloads use."""
        self.src.mkdir()
        self.mnt.mkdir()
        run(["mount", "-t", "tmpfs", "-o", f"size={self.cfg['tmpfs_mib']}m,mode=0755", "fuse-wire-bench",
             str(self.src)])
        data = self.src / "data"
        data.mkdir()
        chunk = os.urandom(MiB)
        for name, mib in (("seq.dat", self.cfg["seq_mib"]), ("seqw.dat", self.cfg["seq_mib"]),
                          ("rand.dat", self.cfg["rand_mib"]), ("randw.dat", self.cfg["rand_mib"]),
                          ("shared.dat", self.cfg["shared_mib"])):
            with open(data / name, "wb") as f:
                for _ in range(mib):
                    f.write(chunk)
        ls = self.src / "ls10k"
        ls.mkdir()
        for i in range(self.cfg["ls_entries"]):
            os.close(os.open(ls / f"e{i:05d}", os.O_CREAT | os.O_WRONLY, 0o644))
        # The many-inodes rows: one big directory, one tree.
        big = self.src / "big"
        big.mkdir()
        for i in range(self.cfg["big_entries"]):
            os.close(os.open(big / f"e{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
        tree = self.src / "tree"
        tree.mkdir()
        for d in range(self.cfg["tree_dirs"]):
            sub = tree / f"d{d:05d}"
            sub.mkdir()
            for i in range(TREE_FILES):
                os.close(os.open(sub / f"e{i:03d}", os.O_CREAT | os.O_WRONLY, 0o644))
        (self.src / "work").mkdir()

    def reset_work(self) -> None:
        """Empties src/work (directly on the tmpfs, never through a mount)."""
        w = self.src / "work"
        shutil.rmtree(w, ignore_errors=True)
        w.mkdir()

    def fio(self, root: Path, name: str, opts: dict, timeout: float) -> dict:
        cmd = ["fio", "--output-format=json", f"--name={name}", "--ioengine=psync"]
        cmd += [f"--{k}" if v is True else f"--{k}={v}" for k, v in opts.items()]
        r = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"fio {name} failed: {r.stderr.strip()[-300:]}")
        doc = json.loads(r.stdout[r.stdout.index("{"):])
        jobs = doc["jobs"]
        errs = [j["error"] for j in jobs if j.get("error")]
        if errs:
            raise RuntimeError(f"fio {name}: job error {errs[0]}")
        io_bytes = sum(j["read"]["io_bytes"] + j["write"]["io_bytes"] for j in jobs)
        ios = sum(j["read"]["total_ios"] + j["write"]["total_ios"] for j in jobs)
        secs = max(j["job_runtime"] for j in jobs) / 1000.0
        if secs <= 0:
            raise RuntimeError(f"fio {name}: no runtime")
        self.last_ops = ios
        return dict(mbps=io_bytes / secs / 1e6, kiops=ios / secs / 1e3)

    def wants(self, wid: str) -> bool:
        """Whether workload `wid` is to run (--workloads)."""
        return self.only is None or wid in self.only

    def wants_group(self, group: str) -> bool:
        """Whether any workload of `group` is to run."""
        return self.only is None or any(w["group"] == group and w["id"] in self.only
                                        for w in workloads(self.cfg))

    def run_target(self, root: Path, daemon: Daemon | None, tid: str) -> dict:
        """All workloads once against root. Returns values, errors, peak RSS KiB
        under 4-way load, the daemon's cost per workload and its idle wake-ups."""
        c = self.cfg
        rt = f"{int(c['runtime'] * 1000)}ms"
        timeout = c["runtime"] * 4 + 60
        timed = {"time_based": True, "runtime": rt}
        vals: dict[str, float] = {}
        errs: dict[str, str] = {}
        costs: dict[str, dict] = {}
        hwm: list[int] = []
        meter = Meter(daemon, self.work, self.count_requests) if daemon else None

        def attempt(wid: str, fn) -> None:
            if not self.wants(wid):
                return
            self.last_ops = None
            try:
                if meter:
                    meter.start()
                try:
                    vals[wid] = fn()
                finally:
                    if meter:
                        costs[wid] = meter.stop()
                        if self.last_ops:
                            costs[wid]["ops"] = self.last_ops
            except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
                costs.pop(wid, None)
                errs[wid] = str(e)[:400]
                log(f"  {wid}: FAILED {errs[wid]}")

        seq = f"{c['seq_mib']}m"
        rnd = f"{c['rand_mib']}m"
        attempt("seq_read", lambda: self.fio(root, "seq_read", dict(
            filename="data/seq.dat", rw="read", bs="1m", size=seq, **timed), timeout)["mbps"])
        attempt("seq_write", lambda: self.fio(root, "seq_write", dict(
            filename="data/seqw.dat", rw="write", bs="1m", size=seq, **timed), timeout)["mbps"])
        attempt("rand_read", lambda: self.fio(root, "rand_read", dict(
            filename="data/rand.dat", rw="randread", bs="4k", direct=1, size=rnd, **timed), timeout)["kiops"])
        attempt("rand_write", lambda: self.fio(root, "rand_write", dict(
            filename="data/randw.dat", rw="randwrite", bs="4k", direct=1, size=rnd, **timed), timeout)["kiops"])

        def shared(kind: str, n: int) -> float:
            # Job k writes blocks k, k+n, k+2n, ...: together they sweep the file
            # front to back, each block written once per sweep.
            o = dict(bs=SHARED_BS, direct=1, numjobs=n, offset_increment=SHARED_BS,
                     rw="write" if n == 1 else f"write:{(n - 1) * SHARED_BS}")
            if kind == "pre":
                # Within the preallocated file: never extends it.
                o.update(filename="data/shared.dat", size=c["shared_mib"] * MiB - 4 * SHARED_BS, **timed)
            else:
                # A new file for every run; bounded by size and runtime but not
                # time_based, so that no write lands below end of file by wrapping.
                # fallocate=none: fio would otherwise size the new file before
                # writing (fallocate mode 0), and no write would extend it.
                o.update(filename=f"work/extend_j{n}.dat", size=f"{c['extend_mib']}m", runtime=rt,
                         fallocate="none")
            return self.fio(root, f"shared_{kind}_j{n}", o, timeout)["mbps"]

        four_way = [(k, 4) for k in ("pre", "ext")]
        for kind in ("pre", "ext"):
            for n in JOB_COUNTS:
                if (kind, n) in four_way:
                    continue
                attempt(f"shared_{kind}_j{n}", lambda kind=kind, n=n: shared(kind, n))

        # The 4-way part: peak RSS of the daemon is measured over these.
        if daemon:
            reset_hwm(daemon.pid())
        for kind, n in four_way:
            attempt(f"shared_{kind}_j{n}", lambda kind=kind, n=n: shared(kind, n))
        if self.wants_group("meta_t4"):
            self.mdtest_run(root, 4, vals, errs, costs, meter, timeout)
        if daemon:
            v = read_hwm_kib(daemon.pid())
            if v is not None:
                hwm.append(v)
        if self.wants_group("meta_t1"):
            self.mdtest_run(root, 1, vals, errs, costs, meter, timeout)
        if tid in BONNIE_TARGETS and self.wants_group("bonnie"):
            self.bonnie_run(root, vals, errs, costs, meter)
        idle = idle_wakeups(daemon.pids(), c["idle_settle"], c["idle_seconds"]) if daemon else None
        return dict(vals=vals, errs=errs, hwm=(max(hwm) if hwm else None), costs=costs, idle=idle)

    def stepped(self, cmd: list[str], threads: int, costs: dict, meter: Meter | None, timeout: float) -> str:
        """Runs mdtest; with a meter, measures the daemon over each phase (mdtest's
        `--step` handshake on stderr/stdin). Returns mdtest's stdout."""
        if not meter:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout).stdout

        def on_step(when: str, name: str) -> None:
            wid = name if name.startswith("ls_") else f"md_{name}_t{threads}"
            if when == "before":
                meter.start()
            else:
                costs[wid] = meter.stop()
        try:
            return run_stepped(cmd, on_step, timeout * 4)
        finally:
            if meter.counter:
                meter.counter.close()

    def bonnie_run(self, root: Path, vals: dict, errs: dict, costs: dict, meter: Meter | None) -> None:
        """bonnie++'s file tests (no data tests: -s0): create, stat and delete
        `bonnie_files` x 1024 empty files in 10 directories, in order then at
        random; `bonnie_runs` runs, the median of each rate kept. The daemon's
        cost is measured over all of it ("bonnie" in costs)."""
        c = self.cfg
        d = root / "work" / "bonnie"
        d.mkdir()
        n = c["bonnie_files"]
        cmd = ["bonnie++", "-x", str(c["bonnie_runs"]), "-q", "-s0", "-d", str(d), "-n", f"{n}:0:0:10",
               "-r", "0", "-u", "0"]
        ids = [f"bonnie_{o}_{op}" for o in ("seq", "rand") for op in BONNIE_OPS]
        # The earlier workloads' files are still in the kernel's caches, and
        # libfuse's example keeps a descriptor per inode the kernel holds:
        # with bonnie++'s 10,240 files on top it ran out of descriptors
        # (EMFILE) in every round. Dropping the dentry and inode caches first
        # makes the kernel FORGET them, for every target alike.
        try:
            Path("/proc/sys/vm/drop_caches").write_text("2\n")
        except OSError as e:
            log(f"  bonnie++: cannot drop the kernel's caches first ({e})")
        try:
            if meter:
                meter.start()
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            finally:
                if meter:
                    costs["bonnie"] = meter.stop()
            rows = [l.split(",") for l in r.stdout.splitlines() if l.startswith("1.98,")]
            if r.returncode != 0 or not rows:
                raise RuntimeError(f"bonnie++ exited {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}")
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            costs.pop("bonnie", None)
            for wid in ids:
                errs[wid] = str(e)[:400]
            log(f"  bonnie++: FAILED {e}")
            return
        # CSV format 1.98: the six file-test rates (files/s) are fields 26, 28, ..., 36;
        # "+++++" means a test ended too fast to time (native tmpfs).
        for k, wid in enumerate(ids):
            rates = [float(row[26 + 2 * k]) for row in rows if row[26 + 2 * k].replace(".", "").isdigit()]
            if rates:
                vals[wid] = statistics.median(rates) / 1e3

    def run_inode_workloads(self, t: dict, samples: dict, errors: list, skipped: list, rnd: int) -> None:
        """The many-inodes rows, each on a fresh mount (nothing cached, no inode
        of the other workloads still held), for target t in round rnd."""
        c = self.cfg
        runs = (("ls_big", self.src / "big", c["big_entries"]),
                ("stat_many", self.src / "big", c["big_entries"]),
                ("tree_walk", self.src / "tree", tree_entries(c)))
        for wid, src_dir, entries in runs:
            if not self.wants(wid):
                continue
            if t.get("fd_per_inode") and entries > self.nofile - 2000:
                if rnd == 1:
                    skipped.append(dict(target=t["id"], workload=wid, reason=(
                        f"one descriptor per inode: {entries} entries need more than the open-file "
                        f"limit ({self.nofile}) allows")))
                    log(f"  {wid}: skipped ({entries} entries, limit {self.nofile})")
                continue
            daemon = None
            try:
                if t["kind"] == "native":
                    root = src_dir
                else:
                    opts = ",".join([f"source={self.src}", *t["opts"]])
                    daemon = Daemon([*t["cmd"], "-o", opts, str(self.mnt)], self.mnt,
                                    self.work / f"{t['id']}-{wid}.log", keeper=t.get("keeper", False))
                    root = self.mnt / src_dir.relative_to(self.src)
                cmd = [self.mdtest, "--inode-phase", wid, "--target", str(root), "--count", str(entries)]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                ph = json.loads(r.stdout)["phases"][0]
                if ph["errors"]:
                    raise RuntimeError(f"{ph['errors']} errors, first: {ph['first_error']}")
                if ph["ops"] == 0:
                    raise RuntimeError("no operation done")
                samples.setdefault(wid, []).append(ph["ops_per_sec"] / 1e3)
            except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError, IndexError) as e:
                errors.append(dict(target=t["id"], round=rnd, workload=wid, error=str(e)[:400]))
                log(f"  {wid}: FAILED {str(e)[:400]}")
            finally:
                if daemon:
                    daemon.stop()

    def md_files_per_thread(self, threads: int) -> int:
        """mdtest's file cap per thread: the mode's, or less so that the files of
        all threads plus the ls directory and a margin fit the daemons' open-file limit."""
        room = self.nofile - self.cfg["ls_entries"] - 2000
        return max(100, min(self.cfg["md_max_files"], room // threads))

    def mdtest_run(self, root: Path, threads: int, vals: dict, errs: dict, costs: dict,
                   meter: Meter | None, timeout: float) -> None:
        c = self.cfg
        cmd = [self.mdtest, "--dir", str(root / "work"), "--threads", str(threads), "--seconds",
               str(c["md_seconds"]), "--max-files", str(self.md_files_per_thread(threads))]
        if threads == 1:
            cmd += ["--ls", str(root / "ls10k"), "--ls-runs", str(c["ls_runs"])]
        if meter:
            cmd.append("--step")
        try:
            out = self.stepped(cmd, threads, costs, meter, timeout)
            doc = json.loads(out)
        except (subprocess.TimeoutExpired, ValueError, RuntimeError) as e:
            for p in MD_PHASES:
                errs[f"md_{p}_t{threads}"] = f"mdtest: {e}"
            log(f"  mdtest t{threads}: FAILED {e}")
            return
        for ph in doc["phases"]:
            wid = ph["name"] if ph["name"].startswith("ls_") else f"md_{ph['name']}_t{threads}"
            if wid in costs and ph["ops"]:
                costs[wid]["ops"] = ph["ops"]
            if ph["errors"]:
                errs[wid] = f"{ph['errors']} errors, first: {ph['first_error']}"
                log(f"  {wid}: FAILED {errs[wid]}")
            elif ph["ops"] == 0:
                errs[wid] = "no operation done"
            else:
                vals[wid] = ph["ops_per_sec"] / 1e3


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short run, under 3 minutes")
    ap.add_argument("--rounds", type=int, help="rounds (default: 3 quick, 4 full; at least 3 for docs)")
    ap.add_argument("--runtime", type=float, help="seconds per fio workload")
    ap.add_argument("--md-seconds", type=float, help="seconds per mdtest phase")
    ap.add_argument("--targets", help="comma-separated target ids (default: all but the optional ones)")
    ap.add_argument("--workloads", help="comma-separated workload ids or groups (data, shared, meta_t1, "
                    "meta_t4, inodes, bonnie; default: all)")
    ap.add_argument("--base", default="libfuse", choices=["libfuse", "libfuse318"],
                    help="the libfuse target ratios divide by (libfuse318: 3.18.2 from the anchors; "
                    "Debian's libfuse is then a row of its own)")
    ap.add_argument("--workdir", help="empty directory for the tmpfs and mountpoints (default: a new temp dir)")
    ap.add_argument("--out", default=str(BENCH / "results" / "latest.json"))
    ap.add_argument("--no-install", action="store_true", help="never apt-get install")
    ap.add_argument("--no-docs", action="store_true", help="do not regenerate docs/performance.md and docs/img")
    ap.add_argument("--ours-bin", help="use this passthrough_ll binary instead of building ours")
    ap.add_argument("--ours-opts", default="",
                    help="extra -o options for our daemon's targets (e.g. splice_write)")
    ap.add_argument("--no-recovery", action="store_true",
                    help="leave out the crash-recovery and upgrade rows (bench/recovery.py)")
    ap.add_argument("--list-targets", action="store_true")
    a = ap.parse_args()

    if a.list_targets:
        for t in TARGETS:
            print(f"{t['id']:18} {t['label']:22} {' '.join(t.get('opts', []))}"
                  + ("  (optional)" if t.get("optional") else ""))
        return 0
    mode = "quick" if a.quick else "full"
    cfg = dict(MODES[mode])
    for k in ("rounds", "runtime", "md_seconds"):
        if getattr(a, k) is not None:
            cfg[k] = getattr(a, k)
    wanted = set(a.targets.split(",")) if a.targets else {t["id"] for t in TARGETS if not t.get("optional")}
    unknown = wanted - {t["id"] for t in TARGETS}
    if unknown:
        ap.error(f"unknown targets {sorted(unknown)} (see --list-targets)")
    if a.base == "libfuse318":
        wanted.add("libfuse318")
    all_w = workloads(dict(cfg, big_entries=cfg["big_entries"]))
    only = None
    if a.workloads:
        asked = set(a.workloads.split(","))
        only = {w["id"] for w in all_w if w["id"] in asked or w["group"] in asked}
        unknown_w = asked - {w["id"] for w in all_w} - {w["group"] for w in all_w}
        if unknown_w or not only:
            ap.error(f"unknown workloads {sorted(unknown_w)}")
    if os.geteuid() != 0:
        sys.exit("bench: needs root (mount -t tmpfs, FUSE mounts, /proc/PID/clear_refs)")
    if not Path("/dev/fuse").exists():
        sys.exit("bench: /dev/fuse is missing")

    started = time.time()
    nofile = raise_nofile()
    # The big directory must fit the fd-per-inode daemons' limit, so that its
    # rows compare every target; the tree (200k entries in full runs) need not.
    cfg["big_entries"] = min(cfg["big_entries"], max(1000, nofile - 3000))
    ensure_tools(not a.no_install)
    bins = TARGET_DIR / "bench"
    log("building libfuse's passthrough_ll, our passthrough_ll and mdtest (release)")
    libfuse = build_libfuse(bins)
    libfuse318 = (build_libfuse318(bins) if any(t["kind"] == "libfuse318" for t in TARGETS if t["id"] in wanted)
                  else None)
    if libfuse318 and libfuse318["error"]:
        log(f"libfuse 3.18.2 did not build: {libfuse318['error']}")
    ours = dict(binary=a.ours_bin, error=None) if a.ours_bin else build_ours()
    mdtest = build_mdtest()
    if ours["error"]:
        log(f"our passthrough_ll is not available: {ours['error']}")
    ours_keeper = bool(ours["binary"]) and supports_keeper(ours["binary"])
    if ours["binary"] and not ours_keeper and "ours_keeper" in wanted:
        log("our passthrough_ll has no -o keeper: the ours_keeper rows are left out")
    # A build from before kernel passthrough was the default serves reads and
    # writes itself unless told, and knows no `no_passthrough`.
    ours_pt_default = bool(ours["binary"]) and takes_option(ours["binary"], "no_passthrough")

    targets = []
    for t in TARGETS:
        t = dict(t)
        if t["id"] not in wanted:
            continue
        if a.base == "libfuse318" and (t["id"] == "libfuse" or (t["base"] == "libfuse" and not t.get("control"))):
            # Ours divided by 3.18, and Debian's libfuse too: a second reference row.
            t["base"] = "libfuse318"
        if t["kind"] == "libfuse":
            t["cmd"] = [libfuse["binary"], "-f"]
        elif t["kind"] == "libfuse318":
            if libfuse318 and libfuse318["binary"]:
                t["cmd"] = [libfuse318["binary"], "-f"]
            else:
                t["status"] = "not built"
        elif t["kind"] == "ours":
            if not ours["binary"]:
                t["status"] = "not built"
            elif t.get("keeper") and not ours_keeper:
                t["status"] = "no -o keeper in this build"
            else:
                t["cmd"] = [ours["binary"], "-f"]
                if not ours_pt_default:
                    t["opts"] = [o for o in t["opts"] if o != "no_passthrough"]
                    t["passthrough"] = "passthrough" in t["opts"]
        targets.append(t)
    runnable = [t for t in targets if t["kind"] == "native" or "cmd" in t]
    # The io_uring target needs the kernel's knob on for the run; it is put
    # back as it was in the `finally` below.
    knob = Path("/sys/module/fuse/parameters/enable_uring")
    knob_old = None
    if any(t["id"] == "ours_uring" for t in runnable):
        if knob.exists():
            knob_old = knob.read_text().strip()
            knob.write_text("Y\n")
        else:
            log("ours_uring: this kernel has no FUSE over io_uring; that row will show /dev/fuse")

    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="fuse-wire-bench."))
    work.mkdir(parents=True, exist_ok=True)
    suite = Suite(cfg, work, mdtest, nofile)
    suite.only = only
    why_not = request_counting()
    suite.count_requests = why_not is None
    if why_not:
        log(f"requests per workload will not be counted: {why_not}")
    samples = {t["id"]: {} for t in targets}
    rss = {t["id"]: [] for t in targets}
    costs: dict[str, dict] = {t["id"]: {} for t in targets}
    idle: dict[str, list] = {t["id"]: [] for t in targets}
    daemon_stats: dict[str, list] = {t["id"]: [] for t in targets if t["kind"] == "ours"}
    errors: list[dict] = []
    skipped: list[dict] = []
    loads = [os.getloadavg()[0]]
    daemon: Daemon | None = None
    recovery_result = None

    raise_on_signals()
    try:
        suite.prepare_source()
        n = len(runnable)
        for rnd in range(cfg["rounds"]):
            # Rotate the order each round so no target always runs first or last.
            order = runnable[rnd % n:] + runnable[:rnd % n] if n else []
            for t in order:
                log(f"round {rnd + 1}/{cfg['rounds']}: {t['id']}")
                suite.reset_work()
                try:
                    if t["kind"] == "native":
                        root, daemon = suite.src, None
                    else:
                        ours_extra = [a.ours_opts] if t["kind"] == "ours" and a.ours_opts else []
                        opts = ",".join([f"source={suite.src}", *t["opts"], *ours_extra])
                        extra = []
                        if t["kind"] == "ours":
                            # Our example writes its session statistics (requests per opcode) at exit.
                            stats_file = work / f"{t['id']}-r{rnd + 1}.stats.json"
                            extra = ["--stats", str(stats_file)]
                        daemon = Daemon([*t["cmd"], *extra, "-o", opts, str(suite.mnt)], suite.mnt,
                                        work / f"{t['id']}.log", keeper=t.get("keeper", False))
                        root = suite.mnt
                    got = suite.run_target(root, daemon, t["id"])
                    vals, errs, hwm = got["vals"], got["errs"], got["hwm"]
                    for wid, cost in got["costs"].items():
                        costs[t["id"]].setdefault(wid, []).append(cost)
                    if got["idle"] is not None:
                        idle[t["id"]].append(got["idle"])
                except RuntimeError as e:
                    vals, errs, hwm = {}, {"mount": str(e)[:400]}, None
                    log(f"  {t['id']}: {e}")
                finally:
                    if daemon:
                        daemon.stop()
                        daemon = None
                        if t["kind"] == "ours":
                            daemon_stats[t["id"]].append(read_json(stats_file))
                if t["kind"] == "native" or "cmd" in t:
                    suite.reset_work()
                    suite.run_inode_workloads(t, samples[t["id"]], errors, skipped, rnd + 1)
                for wid, v in vals.items():
                    samples[t["id"]].setdefault(wid, []).append(v)
                for wid, e in errs.items():
                    errors.append(dict(target=t["id"], round=rnd + 1, workload=wid, error=e))
                if hwm is not None:
                    rss[t["id"]].append(hwm / 1024)
            loads.append(os.getloadavg()[0])
        if not a.no_recovery:
            recovery_result = run_recovery(mode, work / "recovery", ours["binary"])
            errors += [dict(target=e["daemon"], round=0, workload=f"recovery {e['row']}", error=e["error"])
                       for e in recovery_result["errors"]]
    finally:
        if daemon:
            daemon.stop()
        cleanup(work, created=not a.workdir)
        if knob_old is not None:
            knob.write_text(knob_old + "\n")

    result = dict(
        meta=dict(
            date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            mode=mode, config=cfg, kernel=platform.release(), cpus=os.cpu_count(),
            loadavg_1min=loads, wall_seconds=round(time.time() - started, 1), commit=git_describe(),
            fio=subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip(),
            libfuse=dict((k, v) for k, v in libfuse.items() if k != "binary"),
            libfuse318=dict((k, v) for k, v in libfuse318.items() if k != "binary") if libfuse318 else None,
            base=a.base, workloads_only=sorted(only) if only else None,
            ours_error=ours["error"], shared_bs=SHARED_BS, daemon_nofile=nofile,
            md_files_per_thread={t: suite.md_files_per_thread(t) for t in MD_THREADS},
            request_counting=why_not or f"perf stat -e {REQUEST_EVENT}", clk_tck=CLK_TCK,
        ),
        targets=[{k: v for k, v in t.items() if k != "cmd"} for t in targets],
        workloads=[w for w in workloads(cfg) if only is None or w["id"] in only], samples=samples, rss_mib=rss, errors=errors, skipped=skipped,
        daemon_stats=daemon_stats, costs=costs, idle_wakeups=idle,
    )
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")

    sys.path.insert(0, str(BENCH))
    import report
    if recovery_result is not None:
        import recovery
        recovery.write(recovery_result, docs=not a.no_docs, regenerate=False)
        print(recovery.render(recovery_result))
    print(report.console_tables(result))
    if not a.no_docs:
        report.write_docs(result, REPO / "docs")
        log("regenerated docs/performance.md and docs/img/*.svg")
    log(f"done in {time.time() - started:.0f} s, {len(errors)} errors")
    return 1 if errors else 0


def run_recovery(mode: str, work: Path, ours_bin: str | None) -> dict:
    """The crash-recovery and upgrade rows (bench/recovery.py) on hello and on
    our passthrough_ll, which is left out there while it has no -o keeper."""
    sys.path.insert(0, str(BENCH))
    import recovery
    log("crash recovery and upgrades (bench/recovery.py)")
    err = recovery.build(["hello"])
    if err:
        log(f"  hello: {err}")
    bins = {"hello": TARGET_DIR / "release" / "examples" / "hello",
            "passthrough_ll": Path(ours_bin) if ours_bin else None}
    work.mkdir(parents=True, exist_ok=True)
    return recovery.measure(mode, work, list(recovery.DAEMONS), bins)


def cleanup(work: Path, created: bool) -> None:
    """Unmounts everything below work (FUSE mounts first, then the tmpfs) and removes it."""
    for mp, fstype, dev in mounts_under(work):
        r = subprocess.run(["umount", mp], capture_output=True)
        if r.returncode != 0:
            if fstype.startswith("fuse"):
                abort_fuse(dev)
            subprocess.run(["umount", "-l", mp], capture_output=True)
    if mounts_under(work):
        log(f"warning: could not unmount everything below {work}")
        return
    if created:
        shutil.rmtree(work, ignore_errors=True)
    else:
        for p in ("src", "mnt"):
            shutil.rmtree(work / p, ignore_errors=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        log(f"interrupted ({e or 'Ctrl-C'}); cleaned up")
        sys.exit(130)
