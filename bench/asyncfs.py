#!/usr/bin/env python3
"""The async trait against the sync trait on a slow backend: examples/slowfs
served through each (`-o api=sync`, `-o api=async`, everything else at its
default), every operation waiting for a simulated remote round trip.

64 reader threads, each with its own open file (slowfs opens them
`DIRECT_IO`, so every pread(2) is a READ that waits the round trip), read
4 KiB blocks for a fixed time. Measured per round: reads per second, the
daemon's most threads (sampled every 20 ms) and its peak resident memory
(VmHWM). The bound set by latency alone is readers / latency: each reader
waits one round trip per read, whatever serves it.

    bench/asyncfs --quick     # under a minute
    bench/asyncfs             # a few minutes
    bench/asyncfs --no-build  # use the release slowfs already built

Writes bench/results/asyncfs.json and bench/asyncfs.md (the section
docs/performance.md includes; `python3 bench/report.py docs/performance.json`
regenerates the page) and prints the table. Needs root (mounts).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from procs import build_slowfs, mounted, status, unmount, write_section

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
APIS = ["sync", "async"]
BLOCK = 4096


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def one_round(api: str, mnt: Path, readers: int, latency_ms: int, seconds: float) -> dict:
    binary = TARGET / "release" / "examples" / "slowfs"
    logf = open(mnt.parent / f"slowfs-{api}.log", "w")
    proc = subprocess.Popen([str(binary), "-o", f"api={api},latency_ms={latency_ms}", str(mnt)],
                            stdout=logf, stderr=logf, stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 15
        while not mounted(mnt):
            if proc.poll() is not None or time.time() > deadline:
                sys.exit(f"asyncfs: slowfs -o api={api} did not mount (see {logf.name})")
            time.sleep(0.02)
        fds = [os.open(mnt / f"file-{i % 300:03}", os.O_RDONLY) for i in range(readers)]
        counts = [0] * readers
        stop = threading.Event()
        start = threading.Barrier(readers + 1)

        def reader(i: int) -> None:
            start.wait()
            off, n = 0, 0
            while not stop.is_set():
                os.pread(fds[i], BLOCK, off)
                off = (off + BLOCK) % 65536
                n += 1
            counts[i] = n

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
        for t in threads:
            t.start()
        start.wait()
        began = time.monotonic()
        most_threads = 0
        while time.monotonic() - began < seconds:
            most_threads = max(most_threads, status(proc.pid, "Threads:"))
            time.sleep(0.02)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - began
        for fd in fds:
            os.close(fd)
        return {"reads_per_sec": sum(counts) / elapsed, "threads": most_threads,
                "peak_rss_kib": status(proc.pid, "VmHWM:")}
    finally:
        unmount(mnt)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        logf.close()


def summarize(samples: dict, rounds: int, seconds: float, readers: int, latency_ms: int) -> dict:
    def median(api: str, key: str) -> float:
        xs = sorted(s[key] for s in samples[api])
        return xs[len(xs) // 2]

    med = {api: {k: median(api, k) for k in ("reads_per_sec", "threads", "peak_rss_kib")} for api in APIS}
    return {"rounds": rounds, "seconds": seconds, "readers": readers, "latency_ms": latency_ms,
            "bound_reads_per_sec": readers * 1000 / latency_ms, "samples": samples, "medians": med,
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}


def markdown(result: dict) -> list:
    samples, med = result["samples"], result["medians"]
    rounds, seconds = result["rounds"], result["seconds"]
    readers, latency_ms, bound = result["readers"], result["latency_ms"], result["bound_reads_per_sec"]

    def spread(api: str, key: str) -> str:
        xs = [s[key] for s in samples[api]]
        return f"{min(xs):.0f}–{max(xs):.0f}"

    s, y = med["sync"], med["async"]
    rows = [
        ("reads per second", f"{s['reads_per_sec']:.0f} ({spread('sync', 'reads_per_sec')})",
         f"{y['reads_per_sec']:.0f} ({spread('async', 'reads_per_sec')})",
         f"{y['reads_per_sec'] / s['reads_per_sec']:.2f}"),
        ("share of the latency bound", f"{s['reads_per_sec'] / bound:.2f}", f"{y['reads_per_sec'] / bound:.2f}",
         ""),
        ("daemon threads, most at once", f"{s['threads']:.0f}", f"{y['threads']:.0f}",
         f"{y['threads'] / s['threads']:.2f}"),
        ("daemon peak memory (VmHWM), MiB", f"{s['peak_rss_kib'] / 1024:.1f}", f"{y['peak_rss_kib'] / 1024:.1f}",
         f"{y['peak_rss_kib'] / s['peak_rss_kib']:.2f}"),
    ]
    md = [
        f"`bench/asyncfs` ({rounds} rounds of {seconds:g} s, APIs alternating, {result['cpus']} CPUs, "
        f"{result['date']}): `examples/slowfs` with `-o api=sync` and `-o api=async` (Tokio), every "
        f"operation waiting {latency_ms} ms for a simulated remote, everything else at its default (the "
        f"pool's threads, the bound on futures in flight). {readers} threads each read 4 KiB blocks of their "
        "own file (opened `DIRECT_IO`: every read is a READ) for the whole round. Medians of the rounds, "
        "their range in brackets; the ratio is async over sync. The latency bound is readers / latency = "
        f"{bound:.0f} reads per second.", "",
        f"| {readers} readers, {latency_ms} ms per operation | sync trait | async trait | async / sync |",
        "|---|---:|---:|---:|",
    ]
    md += [f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} |" for r in rows]
    if latency_ms < 20:
        md += ["", "With the sync trait each READ holds a worker for the whole round trip, and the pool "
               "does not grow past its floor: it starts a thread only when every worker has been busy for "
               "`grow_after` (20 ms), and a worker whose handler waits less than that is back reading "
               "before. The async trait's threads only read requests and run the runtime."]
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 3 s")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--seconds", type=float, help="seconds of reading per round and API")
    ap.add_argument("--readers", type=int, default=64)
    ap.add_argument("--latency-ms", type=int, default=10)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--from", dest="saved", type=Path, help="only rewrite bench/asyncfs.md from a saved result")
    a = ap.parse_args()
    if a.saved:
        write_section(ROOT, "asyncfs", markdown(json.loads(a.saved.read_text())))
        return
    if os.geteuid() != 0:
        sys.exit("asyncfs: needs root (mounts)")
    rounds = a.rounds or (2 if a.quick else 4)
    seconds = a.seconds or (3.0 if a.quick else 10.0)
    if not a.no_build:
        build_slowfs(ROOT, "asyncfs")
    samples = {api: [] for api in APIS}
    with tempfile.TemporaryDirectory(prefix="fuse-wire-asyncfs.") as tmp:
        mnt = Path(tmp) / "mnt"
        mnt.mkdir()
        for r in range(rounds):
            for api in APIS[r % 2:] + APIS[:r % 2]:
                log(f"round {r + 1}/{rounds}: api={api}")
                samples[api].append(one_round(api, mnt, a.readers, a.latency_ms, seconds))

    result = summarize(samples, rounds, seconds, a.readers, a.latency_ms)
    write_section(ROOT, "asyncfs", markdown(result), result)
    log("\nwritten: bench/results/asyncfs.json and bench/asyncfs.md")


if __name__ == "__main__":
    main()
