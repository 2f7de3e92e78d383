#!/usr/bin/env python3
"""The node, path and async layers against the raw Filesystem trait:
metadata rates and memory per live inode.

Pairs, one on a layer, one on the raw trait:

  twinfs --api node  vs  twinfs --api raw   the same in-memory filesystem,
                         the same storage code (bench/twinfs), on the node
                         layer and on the raw trait: what the layer costs
  twinfs --api async vs  twinfs --api raw   the same, on the async trait
                         (Tokio, default settings) with futures that
                         complete at once: what the async path costs
  pathfs (path layer) vs passthrough_ll     two mirrors of the same tmpfs
                         source (different code: an indication only)
  nodefs (node layer) vs memfs              with --all: two in-memory
                         examples (different code and features)
 Every target runs mdtest's create,
stat and unlink phases with 1 and 4 threads, in private and shared
directories, round by round (targets rotate), and then "memory per live
inode": the daemon's resident set grows by how much while N files are
created and kept looked up (the kernel holds their entries), divided by N.
It is the whole daemon's cost per file (the filesystem's own data included),
so compare within a pair.

    bench/layers --quick     # about a minute
    bench/layers             # a few minutes
    bench/layers --no-build  # use the release binaries already built

Writes bench/results/layers.json, bench/layers.md (the section
docs/performance.md includes; `python3 bench/report.py` regenerates the page)
and prints the tables.
Needs root (mounts). memfs and nodefs get -o default_permissions, so the
kernel checks permissions for all four.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
from procs import mounted  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
PHASES = ["create_private", "stat_private", "unlink_private", "create_shared", "stat_shared", "unlink_shared"]
PAIRS = [("twinfs-node", "twinfs-raw"), ("twinfs-async", "twinfs-raw"), ("pathfs", "passthrough_ll")]
MORE_PAIRS = [("nodefs", "memfs")]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build() -> None:
    examples = [x for name in ("nodefs", "memfs", "pathfs", "passthrough_ll") for x in ("--example", name)]
    for cmd in (["cargo", "build", "--release", "-p", "mdtest", "-p", "twinfs"],
                ["cargo", "build", "--release", "-p", "fuse-wire", *examples]):
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"layers: {' '.join(cmd)} failed:\n" + r.stderr[-4000:])


class Daemon:
    """One target mounted on `mnt` (source `src` for the mirrors)."""

    def __init__(self, name: str, mnt: Path, src: Path):
        binary = TARGET / "release" / "examples" / name
        if name.startswith("twinfs-"):
            binary = TARGET / "release" / "twinfs"
        opts = {
            "twinfs-node": ["--api", "node"],
            "twinfs-raw": ["--api", "raw"],
            "twinfs-async": ["--api", "async"],
            "nodefs": ["-o", "default_permissions"],
            "memfs": ["-o", "default_permissions"],
            "pathfs": ["-o", f"source={src}"],
            "passthrough_ll": ["-f", "-o", f"source={src},default_permissions"],
        }[name]
        self.name, self.mnt = name, mnt
        self.log = open(mnt.parent / f"{name}.log", "w")
        self.proc = subprocess.Popen([str(binary), *opts, str(mnt)], stdout=self.log, stderr=self.log,
                                     stdin=subprocess.DEVNULL)
        deadline = time.time() + 15
        while not mounted(mnt):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                sys.exit(f"layers: {name} did not mount (see {self.log.name})")
            time.sleep(0.02)

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self) -> None:
        for lazy in (False, False, False, True):
            if not mounted(self.mnt):
                break
            subprocess.run(["umount", "-l", str(self.mnt)] if lazy else ["umount", str(self.mnt)],
                           capture_output=True)
            time.sleep(0.1)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def mdtest(mnt: Path, pid: int, threads: int, seconds: float, max_files: int) -> tuple[dict, dict]:
    """Rates of the phases, and the daemon's CPU seconds over each (mdtest's
    --step handshake brackets every phase)."""
    work = mnt / f"work{threads}"
    work.mkdir()
    cmd = [str(TARGET / "release" / "mdtest"), "--dir", str(work), "--threads", str(threads),
           "--seconds", str(seconds), "--max-files", str(max_files), "--step"]
    cpu, started = {}, [0.0]

    def on_step(when: str, name: str) -> None:
        if when == "before":
            started[0] = bench.cpu_seconds(pid) or 0.0
        else:
            cpu[name] = (bench.cpu_seconds(pid) or 0.0) - started[0]
    try:
        doc = json.loads(bench.run_stepped(cmd, on_step, 120 + 20 * seconds))
    except subprocess.TimeoutExpired:
        sys.exit(f"layers: mdtest on {mnt} did not finish in time")
    rates, costs = {}, {}
    for ph in doc["phases"]:
        if ph["name"] in PHASES:
            ok = not ph["errors"] and ph["ops"] > 0
            rates[f"{ph['name']}_t{threads}"] = ph["ops_per_sec"] if ok else None
            if ok and ph["name"] in cpu:
                costs[f"{ph['name']}_t{threads}"] = cpu[ph["name"]] / ph["ops"] * 1e6
    return rates, costs


def memory_per_inode(d: Daemon, n: int) -> float:
    """Bytes of daemon RSS per file while `n` files are live."""
    top = d.mnt / "mem"
    top.mkdir()
    before = d.rss_kib()
    for i in range(n):
        os.close(os.open(top / f"f{i:06}", os.O_CREAT | os.O_WRONLY, 0o644))
    for i in range(n):
        os.stat(top / f"f{i:06}")
    after = d.rss_kib()
    return (after - before) * 1024 / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short phases, 2 rounds")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--seconds", type=float, help="seconds per mdtest phase")
    ap.add_argument("--inodes", type=int, help="files for the memory measurement")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--all", action="store_true", help="also nodefs against memfs")
    a = ap.parse_args()
    pairs = PAIRS + (MORE_PAIRS if a.all else [])
    if os.geteuid() != 0:
        sys.exit("layers: needs root (mounts)")
    rounds = a.rounds or (2 if a.quick else 4)
    seconds = a.seconds or (0.5 if a.quick else 2.0)
    inodes = a.inodes or (20000 if a.quick else 100000)
    max_files = 5000 if a.quick else 50000
    if not a.no_build:
        log("building the examples and mdtest (release)")
        build()
    targets = list(dict.fromkeys(t for pair in pairs for t in pair))
    rates = {t: {} for t in targets}
    memory = {t: [] for t in targets}
    cpu = {t: {} for t in targets}
    with tempfile.TemporaryDirectory(prefix="fuse-wire-layers.") as tmp:
        tmp = Path(tmp)
        src = tmp / "src"
        src.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(src)], check=True)
        try:
            for r in range(rounds):
                for t in targets[r % len(targets):] + targets[:r % len(targets)]:
                    mnt = tmp / f"mnt-{t}"
                    mnt.mkdir(exist_ok=True)
                    log(f"round {r + 1}/{rounds}: {t}")
                    d = Daemon(t, mnt, src)
                    try:
                        # Memory first, on a fresh daemon (after mdtest its
                        # allocator would hand freed memory back out).
                        memory[t].append(memory_per_inode(d, inodes))
                        subprocess.run(["rm", "-rf", str(mnt / "mem")], check=False)
                        for threads in (1, 4):
                            got, spent = mdtest(mnt, d.proc.pid, threads, seconds, max_files)
                            for k, v in got.items():
                                rates[t].setdefault(k, []).append(v)
                            for k, v in spent.items():
                                cpu[t].setdefault(k, []).append(v)
                    except Exception:
                        d.log.flush()
                        log(f"layers: {t} failed; its log ends with:\n"
                            + Path(d.log.name).read_text()[-3000:])
                        raise
                    finally:
                        d.stop()
                    subprocess.run(["find", str(src), "-mindepth", "1", "-delete"], check=False)
        finally:
            subprocess.run(["umount", "-l", str(src)], capture_output=True)

    def median(xs):
        xs = sorted(x for x in xs if x is not None)
        return xs[len(xs) // 2] if xs else None

    def spread(xs):
        xs = [x for x in xs if x is not None]
        return (min(xs), max(xs)) if xs else (None, None)

    result = {"rounds": rounds, "seconds": seconds, "inodes": inodes, "pairs": pairs,
              "samples": rates, "memory_samples": memory, "cpu_us_samples": cpu,
              "cpu_us_per_op": {t: {k: median(v) for k, v in cpu[t].items()} for t in targets},
              "ops_per_sec": {t: {k: median(v) for k, v in rates[t].items()} for t in targets},
              "bytes_per_live_inode": {t: median(memory[t]) for t in targets}}
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "layers.json").write_text(json.dumps(result, indent=2) + "\n")
    rows = [f"{p}_t{n}" for n in (1, 4) for p in PHASES]
    md = [
        f"`bench/layers` ({rounds} rounds, {seconds:g} s per mdtest phase, targets rotating "
        f"between rounds, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}). Rates are medians "
        "over the rounds in thousands of operations per second, the range is the rounds' lowest "
        "and highest; a ratio above 1 means the layer was faster. mdtest's create phase is "
        "`open(O_CREAT|O_EXCL)` + `close`, stat is `lstat`, unlink is `unlink`, each thread in "
        "its own directory (private) or all in one (shared).", ""]
    for layer, raw in pairs:
        title = f"{layer} (layer) vs {raw} (raw trait), kops/s, median of {rounds}"
        print(f"\n{title}")
        print(f"{'workload':<22}{layer:>12}{raw:>16}{'ratio':>8}{'cpu µs/op':>20}")
        md += [f"| {layer} against {raw} | {layer} | {raw} | ratio | daemon CPU µs per operation, "
               f"{layer} / {raw} |", "|---|---:|---:|---:|---:|"]
        ratios = []
        for row in rows:
            x, y = result["ops_per_sec"][layer].get(row), result["ops_per_sec"][raw].get(row)
            ratio = f"{x / y:.2f}" if x and y else "-"
            if x and y:
                ratios.append((x / y, row))
            fx = f"{x / 1e3:.1f}" if x else "FAIL"
            fy = f"{y / 1e3:.1f}" if y else "FAIL"
            cx, cy = result["cpu_us_per_op"][layer].get(row), result["cpu_us_per_op"][raw].get(row)
            cost = f"{cx:.1f} / {cy:.1f}" if cx is not None and cy is not None else "-"
            print(f"{row:<22}{fx:>12}{fy:>16}{ratio:>8}{cost:>20}")
            (lx, hx), (ly, hy) = spread(rates[layer].get(row, [])), spread(rates[raw].get(row, []))
            rx = f" ({lx / 1e3:.1f}–{hx / 1e3:.1f})" if x else ""
            ry = f" ({ly / 1e3:.1f}–{hy / 1e3:.1f})" if y else ""
            label = row.replace("_t", ", ").replace("_", " ") + (" thread" if row.endswith("_t1") else " threads")
            md.append(f"| {label} | {fx}{rx} | {fy}{ry} | {ratio} | {cost} |")
        mx, my = result["bytes_per_live_inode"][layer], result["bytes_per_live_inode"][raw]
        print(f"{'bytes per live inode':<22}{mx:>12.0f}{my:>16.0f}")
        md.append(f"| daemon memory per live inode, bytes ({inodes:,} files) | {mx:.0f} | {my:.0f} | "
                  f"{mx / my:.2f} | |")
        if ratios:
            low = min(ratios)
            within = sum(1 for r, _ in ratios if r >= 0.95)
            md += ["", f"{within} of {len(ratios)} rows within 5% of the raw trait or faster; "
                   f"lowest ratio {low[0]:.2f} ({low[1]}); geometric mean "
                   f"{math.prod(r for r, _ in ratios) ** (1 / len(ratios)):.2f}.", ""]
    (ROOT / "bench" / "layers.md").write_text("\n".join(md).rstrip("\n") + "\n")
    log(f"\nwritten: {out / 'layers.json'} and bench/layers.md")


if __name__ == "__main__":
    main()
