#!/usr/bin/env python3
"""Another user's requests while one user saturates the mount: the price of
waiting in turn, measured on examples/slowfs.

uid 65534 starts READERS threads, each in a READ that waits
`read_latency_ms` (30 s by default) for a simulated remote: far more than
the daemon has handler slots or futures, so most of them wait, parked by
the library (docs/security.md, "Requests under load"). While they wait,
root stats names it never looked up before (each stat a LOOKUP, answered
without latency) and reads `.stats` (a READ answered at once). Measured per
trait (`-o api=sync`, `-o api=async`), per round:

- root's stat latency, median and worst of PROBES, with the readers in
  flight and with the mount idle (the same daemon, before they start); the
  ratio loaded / idle is the cost another user's load puts on root;
- the daemon's resident memory (VmRSS) idle and with the readers in
  flight, and what that comes to per waiting request;
- that no request of either user was answered an error (an EAGAIN or any
  other errno fails the run: a plain directory answers none).

    bench/load --quick       # under two minutes
    bench/load               # a few minutes
    bench/load --no-build    # use the release slowfs already built

Writes bench/results/load.json and bench/load.md (the section
docs/performance.md includes; `python3 bench/report.py docs/performance.json`
regenerates the page) and prints the table. Needs root (mounts, setuid).
"""
import argparse
import ast
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from procs import build_slowfs, mounted, status, unmount, write_section

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
APIS = ["sync", "async"]
NOBODY = 65534
FILES = 300

# The readers, run as uid 65534 in a process of their own: each thread
# preads 4 KiB of one of the generated files (slowfs opens them DIRECT_IO, so
# every pread is a READ) and reports its errno, if any, on stdout.
READERS = r"""
import os, sys, threading
mnt, n = sys.argv[1], int(sys.argv[2])
threading.stack_size(128 * 1024)
fds = [os.open(f"{mnt}/file-{i:03}", os.O_RDONLY) for i in range(min(n, 300))]
errors = {}
lock = threading.Lock()
def read(fd):
    try:
        os.pread(fd, 4096, 0)
    except OSError as e:
        with lock:
            errors[e.errno] = errors.get(e.errno, 0) + 1
threads = [threading.Thread(target=read, args=(fds[i % len(fds)],), daemon=True) for i in range(n)]
for t in threads:
    t.start()
print("started", flush=True)
for t in threads:
    t.join()
print("errors", repr(errors), flush=True)
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def counters(mnt: Path) -> dict:
    text = (mnt / ".stats").read_text()
    return {k: int(v) for k, v in (line.split() for line in text.splitlines())}


def probe(mnt: Path, first: int, count: int) -> list:
    """Stat `count` names from `first` on, each unseen so far: seconds each."""
    out = []
    for k in range(first, first + count):
        began = time.perf_counter()
        os.stat(mnt / f"file-{k:03}")
        out.append(time.perf_counter() - began)
    return out


def one_round(api: str, mnt: Path, readers: int, latency_ms: int, probes: int) -> dict:
    binary = TARGET / "release" / "examples" / "slowfs"
    # Enough generated names that every probe looks up a new one.
    files = FILES + 2 * probes + 10
    logf = open(mnt.parent / f"slowfs-{api}.log", "w")
    opts = f"api={api},latency_ms=0,read_latency_ms={latency_ms},files={files},size=4096,allow_other"
    proc = subprocess.Popen([str(binary), "-o", opts, str(mnt)], stdout=logf, stderr=logf,
                            stdin=subprocess.DEVNULL)
    loader = None
    try:
        deadline = time.time() + 15
        while not mounted(mnt):
            if proc.poll() is not None or time.time() > deadline:
                sys.exit(f"load: slowfs -o {opts} did not mount (see {logf.name})")
            time.sleep(0.02)
        # Names 0..FILES are the readers'; the probes take theirs above.
        idle = probe(mnt, FILES, probes)
        idle_rss = status(proc.pid, "VmRSS:")
        loader = subprocess.Popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             "python3", "-c", READERS, str(mnt), str(readers)],
            stdout=subprocess.PIPE, text=True,
            preexec_fn=lambda: __import__("resource").setrlimit(__import__("resource").RLIMIT_NOFILE,
                                                                 (4096, 4096)))
        if loader.stdout.readline().strip() != "started":
            sys.exit(f"load: the readers did not start (exit {loader.wait()})")
        # Every thread has been started; give the last of them time to be
        # read by the daemon and parked.
        deadline = time.time() + 20
        while counters(mnt).get("running", 0) == 0 and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(2)
        running = counters(mnt).get("running", 0)
        loaded_rss = status(proc.pid, "VmRSS:")
        began = time.monotonic()
        loaded = probe(mnt, FILES + probes, probes)
        stats_read = time.perf_counter()
        counters(mnt)
        stats_read = time.perf_counter() - stats_read
        spent = time.monotonic() - began
        if spent * 1000 >= latency_ms:
            log(f"load: the probes took {spent:.1f} s, longer than the readers' latency: "
                "the loaded figures are not under load")
        # Let the readers finish: a READ interrupted is answered EINTR, which
        # would be no failure of the daemon's, so they are not signalled.
        out, _ = loader.communicate(timeout=latency_ms / 1000 * (2 + readers // 1000) + 120)
        loader = None
        errors = {}
        for line in out.splitlines():
            if line.startswith("errors "):
                errors = ast.literal_eval(line[len("errors "):])
        if errors:
            sys.exit(f"load: api={api}: the readers got errors (errno: count) {errors}")
        return {"idle_stat_s": idle, "loaded_stat_s": loaded, "stats_read_s": stats_read,
                "idle_rss_kib": idle_rss, "loaded_rss_kib": loaded_rss, "running": running}
    finally:
        if loader is not None:
            loader.send_signal(signal.SIGKILL)
            loader.wait()
        unmount(mnt)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        logf.close()


def quantile(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarize(samples: dict, rounds: int, readers: int, latency_ms: int, probes: int) -> dict:
    med = {}
    for api in APIS:
        ss = samples[api]
        idle = [x for s in ss for x in s["idle_stat_s"]]
        loaded = [x for s in ss for x in s["loaded_stat_s"]]
        med[api] = {
            "idle_median_ms": quantile(idle, 0.5) * 1000, "idle_worst_ms": max(idle) * 1000,
            "loaded_median_ms": quantile(loaded, 0.5) * 1000, "loaded_worst_ms": max(loaded) * 1000,
            "idle_rss_kib": quantile([s["idle_rss_kib"] for s in ss], 0.5),
            "loaded_rss_kib": quantile([s["loaded_rss_kib"] for s in ss], 0.5),
            "stats_read_ms": quantile([s["stats_read_s"] for s in ss], 0.5) * 1000,
        }
    return {"rounds": rounds, "readers": readers, "latency_ms": latency_ms, "probes": probes,
            "samples": samples, "medians": med, "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}


def markdown(result: dict) -> list:
    med, readers = result["medians"], result["readers"]
    rows = []
    for api in APIS:
        m = med[api]
        per_request = (m["loaded_rss_kib"] - m["idle_rss_kib"]) * 1024 / readers
        rows.append([
            f"`api={api}`",
            f"{m['idle_median_ms']:.2f} / {m['idle_worst_ms']:.2f}",
            f"{m['loaded_median_ms']:.2f} / {m['loaded_worst_ms']:.2f}",
            f"{m['loaded_median_ms'] / m['idle_median_ms']:.2f} / {m['loaded_worst_ms'] / m['idle_worst_ms']:.2f}",
            f"{m['stats_read_ms']:.2f}",
            f"{m['idle_rss_kib'] / 1024:.1f} → {m['loaded_rss_kib'] / 1024:.1f}",
            f"{per_request:.0f}",
        ])
    md = [
        f"`bench/load` ({result['rounds']} rounds per trait, {result['cpus']} CPUs, {result['date']}): "
        f"`examples/slowfs` with `allow_other`; uid 65534 starts {readers} reads at once, each waiting "
        f"{result['latency_ms'] / 1000:g} s for a simulated remote, far more than the daemon's handler "
        f"slots and futures. Meanwhile root stats {result['probes']} names it never looked up (a LOOKUP "
        "each, answered without latency) and reads `.stats` (a READ answered at once). Stat latency is "
        "the median / worst over every round's probes, with the mount idle (the same daemon before the "
        "readers start) and loaded; the ratio is loaded over idle. Memory is the daemon's VmRSS "
        "(medians of the rounds); per waiting read is the difference over the reads. No request of "
        "either user was answered an error (the run fails otherwise).", "",
        "| trait | root's stat, idle, ms (median / worst) | root's stat, loaded, ms | loaded / idle "
        "| root's `.stats` read, loaded, ms | daemon VmRSS, MiB (idle → loaded) | bytes per waiting read |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 round, 2,000 readers at 10 s")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--readers", type=int)
    ap.add_argument("--latency-ms", type=int)
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--from", dest="saved", type=Path, help="only rewrite bench/load.md from a saved result")
    a = ap.parse_args()
    if a.saved:
        write_section(ROOT, "load", markdown(json.loads(a.saved.read_text())))
        return
    if os.geteuid() != 0:
        sys.exit("load: needs root (mounts, and readers run as another uid)")
    rounds = a.rounds or (1 if a.quick else 3)
    readers = a.readers or (2000 if a.quick else 10000)
    latency_ms = a.latency_ms or (10000 if a.quick else 30000)
    if not a.no_build:
        build_slowfs(ROOT, "load")
    samples = {api: [] for api in APIS}
    with tempfile.TemporaryDirectory(prefix="fuse-wire-load.") as tmp:
        os.chmod(tmp, 0o755)
        mnt = Path(tmp) / "mnt"
        mnt.mkdir()
        for r in range(rounds):
            for api in APIS[r % 2:] + APIS[:r % 2]:
                log(f"round {r + 1}/{rounds}: api={api}, {readers} readers at {latency_ms} ms")
                samples[api].append(one_round(api, mnt, readers, latency_ms, a.probes))

    result = summarize(samples, rounds, readers, latency_ms, a.probes)
    write_section(ROOT, "load", markdown(result), result)
    log("\nwritten: bench/results/load.json and bench/load.md")


if __name__ == "__main__":
    main()
