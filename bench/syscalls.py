#!/usr/bin/env python3
"""What each daemon does per request, counted rather than timed.

    bench/syscalls.py [--creates N] [--targets libfuse,ours] [--opts OPTS] [--strace]

Mounts libfuse's passthrough_ll and ours (as bench/run builds them; run
bench/run once first, or give --libfuse-bin / --ours-bin) in turn over a fresh
tmpfs, runs three single-threaded workloads, and prints for each daemon:
the requests the kernel sent (fuse_request_send tracepoint), the daemon's
system calls (raw_syscalls:sys_enter, all its threads), context switches of
its threads and its CPU time, per request and per operation of the workload.
With --strace, also `strace -c -f` of the daemon: which system calls (strace
slows the daemon down, so those runs are for the breakdown, not the totals).
Counts barely depend on the machine's load; CPU time does somewhat.

Workloads: `creates` (N empty files made with open(O_CREAT|O_EXCL) + close in
one directory), `unlinks` (the same N files, made through the mount
before counting starts, then unlinked), `write64k` (fio, 1 job, 64 KiB O_DIRECT writes over a
preallocated 64 MiB file, 4 passes) and `extend64k` (the same into a new file,
256 MiB, every write extending it). Needs root and perf.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402

CREATES = """
import os, sys
d = sys.argv[1]
os.mkdir(d)
for i in range(int(sys.argv[2])):
    os.close(os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
"""

UNLINKS = """
import os, sys
d = sys.argv[1]
for i in range(int(sys.argv[2])):
    os.unlink(f"{d}/f{i}")
"""


def workloads(mnt: Path, creates: int) -> list[tuple[str, int, list[str] | None, list[str]]]:
    """(name, operations, setup command run first and not counted, command)."""
    fio = ["fio", "--ioengine=psync", "--bs=64k", "--direct=1", "--rw=write", "--output=/dev/null"]
    make = [sys.executable, "-c", CREATES, str(mnt / "work" / "u"), str(creates)]
    return [
        ("creates", creates, None, [sys.executable, "-c", CREATES, str(mnt / "work" / "c"), str(creates)]),
        ("unlinks", creates, make, [sys.executable, "-c", UNLINKS, str(mnt / "work" / "u"), str(creates)]),
        ("write64k", 4 * 1024, None,
         fio + ["--name=pre", f"--filename={mnt / 'pre.dat'}", "--size=64m", "--loops=4"]),
        ("extend64k", 4 * 1024, None, fio + ["--name=ext", f"--filename={mnt / 'work' / 'ext.dat'}", "--size=256m",
                                               "--fallocate=none"]),
    ]


def syscalls_during(pid: int, cmd: list[str], out: Path) -> int:
    """Runs cmd; returns the system calls all threads of pid made meanwhile."""
    subprocess.run(["perf", "stat", "-x,", "-o", str(out), "-e", "raw_syscalls:sys_enter", "-p", str(pid),
                    "--", *cmd], check=True, stdout=subprocess.DEVNULL, timeout=600)
    for line in out.read_text().splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[2] == "raw_syscalls:sys_enter" and parts[0].isdigit():
            return int(parts[0])
    raise RuntimeError(f"perf stat printed no count: {out.read_text()[-200:]}")


def strace_during(pid: int, cmd: list[str], out: Path) -> dict[str, int]:
    """Runs cmd under `strace -c -f -p pid`; returns {syscall: calls}."""
    st = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", str(out)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)  # attached to every thread
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=600)
        time.sleep(0.3)
    finally:
        st.send_signal(signal.SIGINT)
        st.wait(timeout=30)
    calls = {}
    for line in out.read_text().splitlines():
        f = line.split()
        # % time, seconds, usecs/call, calls, [errors,] syscall
        if len(f) >= 5 and f[3].isdigit() and f[-1] != "total":
            calls[f[-1]] = int(f[3])
    return calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--creates", type=int, default=5000)
    ap.add_argument("--targets", default="libfuse,ours")
    ap.add_argument("--opts", default="", help="extra -o options for both daemons")
    ap.add_argument("--strace", action="store_true", help="also break the system calls down with strace -c")
    ap.add_argument("--libfuse-bin", default=str(bench.TARGET_DIR / "bench" / "libfuse_passthrough_ll"))
    ap.add_argument("--ours-bin", default=str(bench.TARGET_DIR / "release" / "examples" / "passthrough_ll"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("syscalls.py: needs root")
    why = bench.request_counting()
    if why:
        sys.exit(f"syscalls.py: cannot count requests: {why}")
    bins = {"libfuse": a.libfuse_bin, "ours": a.ours_bin}
    work = Path(tempfile.mkdtemp(prefix="fuse-wire-syscalls."))
    src, mnt = work / "src", work / "mnt"
    src.mkdir()
    mnt.mkdir()
    daemon = None
    rows = []
    try:
        bench.run(["mount", "-t", "tmpfs", "-o", "size=1g", "fuse-wire-syscalls", str(src)])
        with open(src / "pre.dat", "wb") as f:
            f.write(b"\0" * (64 << 20))
        for target in a.targets.split(","):
            for name, ops, setup, cmd in workloads(mnt, a.creates):
                subprocess.run(["rm", "-rf", str(src / "work")], check=True)
                (src / "work").mkdir()
                opts = ",".join(o for o in [f"source={src}", a.opts] if o)
                daemon = bench.Daemon([bins[target], "-f", "-o", opts, str(mnt)], mnt, work / f"{target}.log")
                if setup:
                    subprocess.run(setup, check=True, timeout=600)
                meter = bench.Meter(daemon, work, True)
                meter.start()
                sys_n = syscalls_during(daemon.pid(), cmd, work / "sys.out")
                cost = meter.stop()
                breakdown = {}
                if a.strace:
                    # Emptied through the mount: the kernel still caches "work".
                    subprocess.run(["rm", "-rf", *map(str, (mnt / "work").iterdir())], check=True)
                    if setup:
                        subprocess.run(setup, check=True, timeout=600)
                    breakdown = strace_during(daemon.pid(), cmd, work / "strace.out")
                daemon.stop()
                daemon = None
                rows.append((target, name, ops, cost, sys_n, breakdown))
    finally:
        if daemon:
            daemon.stop()
        bench.cleanup(work, created=True)

    print(f"| daemon | workload | requests/op | syscalls/op | syscalls/req | ctx sw/req | CPU µs/req |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for target, name, ops, c, sys_n, _ in rows:
        req = c["requests"] or 0
        per = (lambda v: f"{v / req:.2f}") if req else (lambda v: "–")
        cpu = f"{c['cpu_s'] * 1e6 / req:.1f}" if req and c["cpu_s"] is not None else "–"
        print(f"| {target} | {name} | {req / ops:.2f} | {sys_n / ops:.2f} | {per(sys_n)} | {per(c['ctxsw'])} | {cpu} |")
    if a.strace:
        print("\nstrace -c, calls per operation of the workload (calls under 0.05/op left out):")
        for target, name, ops, _, _, calls in rows:
            top = sorted(((n / ops, s) for s, n in calls.items() if n / ops >= 0.05), reverse=True)
            print(f"- {target} {name}: " + ", ".join(f"{s} {v:.2f}" for v, s in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
