"""What the benchmark drivers read about processes and mounts and how they
stop: children, liveness, CPU time, context switches and status fields
from /proc, whether a daemon takes -o keeper, whether a path is mounted
and how to unmount it, and signals that unwind a run through its clean-up.

bench.py, recovery.py, layers.py, asyncfs.py and load.py use it; it
imports none of them (standard library only).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def mounted(mnt: Path) -> bool:
    """Whether something is mounted on `mnt`."""
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(mnt) for line in f)


def unmount(mnt: Path) -> None:
    """Unmounts `mnt`: twice politely, then lazily."""
    for lazy in (False, False, True):
        if not mounted(mnt):
            return
        subprocess.run(["umount", "-l", str(mnt)] if lazy else ["umount", str(mnt)], capture_output=True)
        time.sleep(0.2)


def status(pid: int, key: str) -> int:
    """A number of /proc/PID/status (`VmRSS:`, `Threads:`...); 0 if absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def build_slowfs(root: Path, tag: str) -> None:
    """Builds examples/slowfs in release mode, or exits with cargo's error."""
    print("building slowfs (release)", file=sys.stderr, flush=True)
    r = subprocess.run(["cargo", "build", "--release", "-p", "fuse-wire", "--example", "slowfs"],
                       cwd=root, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{tag}: building slowfs failed:\n" + r.stderr[-4000:])


def write_section(root: Path, name: str, md: list, result: dict | None = None) -> None:
    """Prints the section `md`, writes it to bench/NAME.md and, given one,
    the result to bench/results/NAME.json."""
    print("\n".join(md))
    if result is not None:
        out = root / "bench" / "results"
        out.mkdir(exist_ok=True)
        (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (root / "bench" / f"{name}.md").write_text("\n".join(md) + "\n")


def child_pids(pid: int) -> list[int]:
    """The children of pid (of all its threads)."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            out += [int(p) for p in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
        except OSError:
            pass
    return out


def alive(pid: int) -> bool:
    """Running, not a zombie its parent has yet to reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def supports_keeper(binary: str) -> bool:
    """Whether an example's build takes -o keeper: its --help lists the
    option (a line `keeper ...` or `-o keeper ...`)."""
    return takes_option(binary, "keeper")


def takes_option(binary: str, name: str) -> bool:
    """Whether an example's build takes `-o NAME`: its --help lists it at the
    start of a line (`NAME ...`, `-o NAME ...`) or after another option's name
    on it (`passthrough, NAME`)."""
    r = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    pattern = rf"^\s+(-o\s+)?([\w=|]+,\s+)*{re.escape(name)}(,|\s)"
    return re.search(pattern, r.stdout + r.stderr, re.MULTILINE) is not None


def cpu_seconds(pid: int | list[int]) -> float | None:
    """User plus system CPU time of a whole process (or the sum over a list
    of them): /proc/PID/stat's utime and stime, which cover all its threads,
    those that ended included."""
    total = 0.0
    for p in pid if isinstance(pid, list) else [pid]:
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            return None
        # Fields after the command name (which may hold spaces) start at state (3).
        fields = stat[stat.rindex(")") + 2:].split()
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def context_switches(pid: int | list[int]) -> dict[int, int]:
    """{thread id: voluntary + involuntary context switches so far}, of one
    process or of every process of a list."""
    out = {}
    for p in pid if isinstance(pid, list) else [pid]:
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                text = Path(f"/proc/{p}/task/{tid}/status").read_text()
            except OSError:
                continue  # ended meanwhile
            n = 0
            for line in text.splitlines():
                if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                    n += int(line.split()[1])
            out[int(tid)] = n
    return out


def switches_between(before: dict[int, int], after: dict[int, int]) -> int:
    """Context switches from one snapshot to the next. A thread that ended in
    between counts 1 (it woke at least to end); one that started counts all."""
    n = sum(v - before.get(tid, 0) for tid, v in after.items())
    return n + sum(1 for tid in before if tid not in after)


def raise_on_signals() -> None:
    """Makes Ctrl-C (even when started with SIGINT ignored), SIGTERM and
    SIGHUP raise KeyboardInterrupt, so that a run's clean-up in `finally`
    (daemons stopped, mounts freed) always runs."""
    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
