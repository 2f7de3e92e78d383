#!/usr/bin/env python3
"""Crash recovery and live upgrade under a keeper, as a client sees them.

A client process (the probe) reads one file through the mount in a tight
loop with O_DIRECT, so that every read is a READ the daemon answers, and
records the CLOCK_MONOTONIC time each read completed (and each error). The
driver records, on the same clock, when it killed or upgraded the daemon.
For each daemon (`--daemons`, the same for all: hello, passthrough_ll):

- crash: the daemon a keeper runs (`-o keeper`) is SIGKILLed 20 times; for
  each kill, the time from the kill to the first read answered after the
  longest gap that follows it, that gap itself, and the client's errors.
  Against the same daemon without a keeper, killed and brought back the
  quickest way a supervisor can (wait for it, detach the dead mount, start
  it again, wait for the mount): the outage there is no keeper to avoid.
- upgrade: SIGUSR2 to the keeper 5 times; the longest gap between two
  answered reads from the signal until the new daemon answers, against the
  longest gap in windows of the same length with nothing happening (the
  same probe, the same mount, the same run).
- steady rate: reads per second (O_DIRECT pread of an open file; and
  open+read+close, whose OPEN the keeper's journal records) with the keeper
  and without, mounts alternating over rounds; and the daemons' CPU time per
  read (the keeper's and its child's together).

    bench/run recovery            # both daemons, about a minute each
    bench/run recovery --quick    # shorter rate windows
    bench/recovery.py --help

Writes bench/results/recovery.json and bench/recovery.md (the section
docs/performance.md includes); regenerates docs/performance.md from
docs/performance.json unless --no-docs. Needs root (mounts). Standard
library only.
"""

from __future__ import annotations

import argparse
import array
import bisect
import contextlib
import ctypes
import datetime
import json
import mmap
import os
import platform
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import (alive, child_pids as children, context_switches, cpu_seconds, raise_on_signals,  # noqa: E402
                   supports_keeper, switches_between)

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
TARGET_DIR = Path(os.environ.get("CARGO_TARGET_DIR", str(REPO / "target")))

# What each daemon needs: the example's name, whether it mirrors a source
# directory (-o source=), the file the probe reads below the mountpoint.
DAEMONS = {
    "hello": dict(example="hello", source=False, file="hello", writable=False),
    "passthrough_ll": dict(example="passthrough_ll", source=True, file="probe.dat", writable=True),
}

MODES = {
    # kills and upgrades as the issue asks; rate windows shorter when quick.
    "quick": dict(kills=20, upgrades=5, quiet_windows=5, rate_slices=16, rate_seconds=0.2, idle_seconds=1.0),
    "full": dict(kills=20, upgrades=5, quiet_windows=5, rate_slices=40, rate_seconds=0.25, idle_seconds=3.0),
}

# After an error the probe sleeps this long before it tries again, so that a
# dead mount does not take a CPU from the daemon being started: the
# resolution of "first answer" when the client saw errors.
ERROR_PAUSE_S = 100e-6
# Control block the probe and the driver share (a file both map): byte 0 is
# "stop", byte 1 "pause", bytes 8..16 the probe's count of answered reads.
CTL_BYTES = 64
# How often a paused probe looks whether it may go on.
PAUSED_POLL_S = 0.001
MNT_DETACH = 2
# The shortest gap between two answered reads taken for the outage after a
# kill: starting a daemon (fork, exec, taking over or mounting) takes longer.
OUTAGE_MIN_NS = 1_000_000


_libc = ctypes.CDLL(None, use_errno=True)


def log(msg: str) -> None:
    print(f"[recovery {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# ---------------------------------------------------------------- the probe


def probe_main(path: str, op: str, ctl: str, out: str) -> int:
    """The client: reads `path` until the driver sets the stop byte (op
    "create": makes, writes, closes and removes a file beside it instead);
    writes the completion times of the answered operations (`out`.ok, int64
    ns) and the errors (`out`.err, JSON [[ns, errno], ...])."""
    parent = os.getppid()
    # Dies with the driver, however the driver ends (it spins otherwise).
    PR_SET_PDEATHSIG = 1
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        return 1
    cfd = os.open(ctl, os.O_RDWR)
    mm = mmap.mmap(cfd, CTL_BYTES)
    buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT may want
    ok, errs = array.array("q"), []
    fd, n = -1, 0
    clock, mono = time.clock_gettime_ns, time.CLOCK_MONOTONIC
    flags = os.O_RDONLY | os.O_DIRECT
    while not mm[0]:
        if mm[1]:  # paused: the other side's slice
            time.sleep(PAUSED_POLL_S)
            continue
        try:
            if op == "create":
                made = f"{path}.{n}"
                f = os.open(made, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                try:
                    os.write(f, buf)
                finally:
                    os.close(f)
                os.unlink(made)
                ok.append(clock(mono))
                n += 1
                struct.pack_into("<q", mm, 8, n)
                continue
            if fd < 0:
                fd = os.open(path, flags)
            got = os.preadv(fd, [buf], 0)
            if op == "open":
                f, fd = fd, -1
                os.close(f)
            if got <= 0:
                raise OSError(0, "empty read")
        except OSError as e:
            errs.append((clock(mono), e.errno or 0))
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
                fd = -1
            time.sleep(ERROR_PAUSE_S)
            continue
        ok.append(clock(mono))
        n += 1
        struct.pack_into("<q", mm, 8, n)
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass
    with open(out + ".ok", "wb") as f:
        ok.tofile(f)
    Path(out + ".err").write_text(json.dumps(errs))
    return 0


class Probe:
    """A probe process reading `path` (op "pread": one open file; "open":
    open, read, close each time; "create": create, write, close and remove
    a file beside it each time)."""

    def __init__(self, path: Path, op: str, work: Path, name: str, mnt: Path, paused: bool = False):
        self.out = str(work / f"probe-{name}")
        self.mnt = mnt
        ctl = work / f"probe-{name}.ctl"
        ctl.write_bytes(b"\0" + (b"\1" if paused else b"\0") + b"\0" * (CTL_BYTES - 2))
        self.cfd = os.open(ctl, os.O_RDWR)
        self.mm = mmap.mmap(self.cfd, CTL_BYTES)
        self.proc = subprocess.Popen([sys.executable, __file__, "--probe", str(path), op, str(ctl), self.out],
                                     stdin=subprocess.DEVNULL)
        self.started = now_ns()
        self.finished = False

    def count(self) -> int:
        return struct.unpack_from("<q", self.mm, 8)[0]

    def pause(self, paused: bool) -> None:
        self.mm[1] = 1 if paused else 0

    def wait_answers(self, more: int, after: int | None = None, timeout: float = 10.0) -> None:
        """Waits until `more` reads were answered after count `after` (now if None)."""
        base = self.count() if after is None else after
        deadline = time.monotonic() + timeout
        while self.count() < base + more:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the probe ended (status {self.proc.returncode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the client got no answer for {timeout:.0f} s")
            time.sleep(0.001)

    def finish(self) -> tuple[array.array, list]:
        """Stops the probe; its answered reads' times and its errors. A probe
        blocked on a request nobody answers has the connection aborted under it."""
        self.finished = True
        self.mm[0] = 1
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            abort_mount(self.mnt)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            raise RuntimeError("the client hung on an unanswered request; connection aborted")
        finally:
            self.mm.close()
            os.close(self.cfd)
        if self.proc.returncode != 0:
            raise RuntimeError(f"the probe exited with status {self.proc.returncode}")
        ok = array.array("q")
        with open(self.out + ".ok", "rb") as f:
            ok.frombytes(f.read())
        errs = json.loads(Path(self.out + ".err").read_text())
        return ok, errs

    def abandon(self) -> None:
        """Stops the probe if nothing did, its results not wanted (a run that
        failed on the way)."""
        if not self.finished:
            try:
                self.finish()
            except RuntimeError:
                pass


# ---------------------------------------------------------------- mounts and daemons


def mount_of(mnt: Path) -> str | None:
    """major:minor of the FUSE mount at mnt, or None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if parts[4].replace("\\040", " ") == str(mnt) and parts[parts.index("-") + 1].startswith("fuse"):
                return parts[2]
    return None


def abort_mount(mnt: Path) -> None:
    dev = mount_of(mnt)
    if dev:
        try:
            Path(f"/sys/fs/fuse/connections/{dev.split(':')[1]}/abort").write_text("1")
        except OSError:
            pass


def detach(mnt: Path) -> None:
    """umount2(MNT_DETACH): what a supervisor must do to a dead mount a
    client still holds files of."""
    if _libc.umount2(str(mnt).encode(), MNT_DETACH) != 0:
        e = ctypes.get_errno()
        raise RuntimeError(f"umount2({mnt}, MNT_DETACH): {os.strerror(e)}")


class Daemon:
    """One daemon on mnt: with keeper=True the process started is the keeper
    and its child serves."""

    def __init__(self, binary: Path, spec: dict, mnt: Path, src: Path, keeper: bool, logfile: Path):
        opts = ([f"source={src}"] if spec["source"] else []) + (["keeper"] if keeper else [])
        self.cmd = [str(binary), "-f", *(["-o", ",".join(opts)] if opts else []), str(mnt)]
        self.mnt, self.keeper = mnt, keeper
        self.log = open(logfile, "ab")
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while mount_of(self.mnt) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{' '.join(self.cmd)} did not mount")
            time.sleep(0.001)

    def serving(self, gone: list[int] = ()) -> int:
        """The pid of the serving daemon (under a keeper: its one live child
        not in `gone`, waiting up to 10 s for it)."""
        if not self.keeper:
            return self.proc.pid
        deadline = time.monotonic() + 10
        while True:
            live = [p for p in children(self.proc.pid) if p not in gone and alive(p)]
            if len(live) == 1:
                return live[0]
            if time.monotonic() > deadline:
                raise RuntimeError(f"no daemon serving under keeper {self.proc.pid} after 10 s")
            time.sleep(0.001)

    def pids(self) -> list[int]:
        return [self.proc.pid, *children(self.proc.pid)] if self.keeper else [self.proc.pid]

    def stop(self) -> None:
        """SIGTERM (a keeper retires its child and unmounts; a plain daemon
        unmounts), bounded: a daemon that does not end has its connection
        aborted and is killed; a mount left behind is detached."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                abort_mount(self.mnt)
                self.proc.kill()
                self.proc.wait()
        if mount_of(self.mnt) is not None:
            subprocess.run(["umount", self.mnt], capture_output=True)
        if mount_of(self.mnt) is not None:
            abort_mount(self.mnt)
            subprocess.run(["umount", "-l", self.mnt], capture_output=True)


# ---------------------------------------------------------------- analysis


def longest_gap(ok: array.array, start: int, end: int) -> int | None:
    """The longest gap between two consecutive answered reads over [start,
    end], counting from the last read answered before `start` to the first
    answered after `end` (the pause a client in that window sat through)."""
    i = max(bisect.bisect_left(ok, start) - 1, 0)
    j = min(bisect.bisect_left(ok, end), len(ok) - 1)
    return max((ok[k] - ok[k - 1] for k in range(i + 1, j + 1)), default=None)


def outage_after(ok: array.array, kill: int) -> tuple[int, int] | None:
    """(gap, kill to answer) in ns: the first gap of at least OUTAGE_MIN_NS
    between two answered reads from the last read answered before `kill`
    on, and the time from the kill to the read that ended it. A killed
    daemon answers nothing more (at most the reply it was writing, at once),
    and a new one takes longer than that to start, so that read is the
    first one the new daemon answered."""
    i = max(bisect.bisect_left(ok, kill) - 1, 0)
    for k in range(i + 1, len(ok)):
        if ok[k] - ok[k - 1] >= OUTAGE_MIN_NS:
            return ok[k] - ok[k - 1], ok[k] - kill
    return None


def process_start_ns(binary: Path, runs: int = 20) -> float:
    """Median time to fork, exec and end `binary --help`: the part of a new
    daemon's start that no takeover avoids."""
    times = []
    for _ in range(runs):
        t = now_ns()
        subprocess.run([str(binary), "--help"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
        times.append(now_ns() - t)
    return statistics.median(times)


def errors_between(errs: list, start: int, end: int) -> int:
    return sum(1 for t, _ in errs if start <= t < end)


def ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


def med_max(xs: list[float]) -> dict:
    xs = [x for x in xs if x is not None]
    return dict(median=statistics.median(xs), worst=max(xs), n=len(xs)) if xs else dict(median=None, worst=None,
                                                                                         n=0)


# ---------------------------------------------------------------- the rows


class Bench:
    def __init__(self, cfg: dict, work: Path, name: str, binary: Path):
        self.cfg, self.work, self.name, self.binary = cfg, work, name, binary
        self.spec = DAEMONS[name]
        self.mnt = work / f"mnt-{name}"
        self.src = work / f"src-{name}"
        self.mnt.mkdir()
        self.src.mkdir()
        (self.src / "probe.dat").write_bytes(os.urandom(4096))
        self.file = self.mnt / self.spec["file"]

    def daemon(self, keeper: bool, mnt: Path | None = None) -> Daemon:
        return Daemon(self.binary, self.spec, mnt or self.mnt, self.src, keeper,
                      self.work / f"{self.name}{'-keeper' if keeper else ''}.log")

    def quiet_windows(self, probe: Probe, length_s: float) -> list[tuple[int, int]]:
        """`quiet_windows` windows of `length_s` with nothing happening."""
        out = []
        for _ in range(self.cfg["quiet_windows"]):
            a = now_ns()
            time.sleep(length_s)
            out.append((a, now_ns()))
        return out

    @contextlib.contextmanager
    def probed(self, keeper: bool, tag: str):
        """This filesystem's daemon (under a keeper or not) and a probe
        reading through its mount, 100 reads answered; whatever happens, the
        probe ends (quietly if the body did not end it) and the daemon stops."""
        d = self.daemon(keeper=keeper)
        probe = None
        try:
            probe = Probe(self.file, "pread", self.work, f"{self.name}-{tag}", self.mnt)
            probe.wait_answers(100)
            yield d, probe
        finally:
            if probe:
                probe.abandon()
            d.stop()

    def crash_with_keeper(self) -> dict:
        with self.probed(True, "kill") as (d, probe):
            kills, killed = [], []
            for i in range(self.cfg["kills"]):
                pid = d.serving(killed)
                probe.wait_answers(50)  # this daemon answers
                time.sleep((20 + (i * 37) % 90) / 1000)  # varied moments, mostly mid-request
                t = now_ns()
                os.kill(pid, signal.SIGKILL)
                kills.append(t)
                killed.append(pid)
                probe.wait_answers(1, after=probe.count())
            d.serving(killed)
            probe.wait_answers(50)
            end = now_ns()
            quiet = self.quiet_windows(probe, 0.2)
            ok, errs = probe.finish()
        rec, gaps, nerr = self.outages(ok, errs, kills, end)
        return dict(recovery_ns=rec, gap_ns=gaps, errors=nerr, total_errors=len(errs),
                    quiet_gap_ns=[longest_gap(ok, a, b) for a, b in quiet], answered=len(ok),
                    median_read_ns=self.median_interval(ok))

    def crash_without_keeper(self) -> dict:
        """The same daemon, no keeper: killed, then brought back as quickly as
        a supervisor can (reap it, detach the dead mount, start it again)."""
        with self.probed(False, "remount") as (d, probe):
            kills = []
            for i in range(self.cfg["kills"]):
                probe.wait_answers(50)
                time.sleep((20 + (i * 37) % 90) / 1000)
                t = now_ns()
                os.kill(d.proc.pid, signal.SIGKILL)
                kills.append(t)
                d.proc.wait()
                detach(self.mnt)
                d.start()
                probe.wait_answers(1, after=probe.count())
            probe.wait_answers(50)
            end = now_ns()
            ok, errs = probe.finish()
        rec, gaps, nerr = self.outages(ok, errs, kills, end)
        return dict(recovery_ns=rec, gap_ns=gaps, errors=nerr, total_errors=len(errs), answered=len(ok),
                    median_read_ns=self.median_interval(ok))

    def upgrades(self) -> dict:
        with self.probed(True, "upgrade") as (d, probe):
            windows, seen = [], []
            old = d.serving()
            for _ in range(self.cfg["upgrades"]):
                seen.append(old)
                probe.wait_answers(50)
                time.sleep(0.1)
                t0 = now_ns()
                os.kill(d.proc.pid, signal.SIGUSR2)
                deadline = time.monotonic() + 40
                while alive(old) and old in children(d.proc.pid):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the daemon did not retire 40 s after SIGUSR2")
                    time.sleep(0.001)
                old = d.serving(seen)
                probe.wait_answers(1, after=probe.count())
                windows.append((t0, now_ns()))
            # Windows of the same lengths with nothing happening: the longest
            # gap a client sees anyway.
            quiet = []
            for a, b in windows:
                probe.wait_answers(50)
                q0 = now_ns()
                time.sleep((b - a) / 1e9)
                quiet.append((q0, now_ns()))
            ok, errs = probe.finish()
        return dict(pause_ns=[longest_gap(ok, a, b) for a, b in windows],
                    window_ns=[b - a for a, b in windows],
                    quiet_gap_ns=[longest_gap(ok, a, b) for a, b in quiet],
                    errors=[errors_between(errs, a, b) for a, b in windows], total_errors=len(errs),
                    answered=len(ok))

    def rates(self) -> dict:
        """Reads per second and daemon CPU per read, keeper against none: both
        mounted at once (two mountpoints), a client on each, only one of them
        reading at a time, taking turns slice by slice, for each probe op."""
        other = self.work / f"mnt-{self.name}-keeper"
        other.mkdir(exist_ok=True)
        out = {}
        plain = keeper = None
        try:
            plain = self.daemon(keeper=False)
            keeper = self.daemon(keeper=True, mnt=other)
            sides = {"plain": (plain, self.file), "keeper": (keeper, other / self.spec["file"])}
            ops = ("pread", "open", "create") if self.spec["writable"] else ("pread", "open")
            for op in ops:
                probes = {}
                try:
                    for kind, (d, path) in sides.items():
                        probes[kind] = Probe(path, op, self.work, f"{self.name}-rate-{kind}", d.mnt, paused=True)
                    for kind, p in probes.items():
                        p.pause(False)
                        p.wait_answers(100)
                        p.pause(True)
                    per = {"plain": [], "keeper": []}
                    reads = {"plain": 0, "keeper": 0}
                    cpu = {"plain": 0.0, "keeper": 0.0}
                    for r in range(self.cfg["rate_slices"]):
                        for kind in ("plain", "keeper") if r % 2 == 0 else ("keeper", "plain"):
                            d, p = sides[kind][0], probes[kind]
                            pids = d.pids()
                            p.pause(False)
                            c0, n0, t0 = cpu_seconds(pids), p.count(), now_ns()
                            time.sleep(self.cfg["rate_seconds"])
                            c1, n1, t1 = cpu_seconds(pids), p.count(), now_ns()
                            p.pause(True)
                            if c0 is None or c1 is None:
                                raise RuntimeError(f"a process of the daemon ended during the slice ({pids})")
                            per[kind].append((n1 - n0) / ((t1 - t0) / 1e9))
                            reads[kind] += n1 - n0
                            cpu[kind] += c1 - c0
                finally:
                    errs = []
                    for p in probes.values():
                        errs += p.finish()[1]
                if errs:
                    raise RuntimeError(f"{len(errs)} client errors, first errno {errs[0][1]}")
                out[op] = dict(reads_per_s=per,
                               cpu_us_per_read={k: cpu[k] / max(reads[k], 1) * 1e6 for k in cpu})
            # With nothing to do: wake-ups per second of all the daemon's
            # threads (under a keeper, the keeper's too), both measured at once.
            time.sleep(0.5)
            before = {k: context_switches(d.pids()) for k, (d, _) in sides.items()}
            time.sleep(self.cfg["idle_seconds"])
            out["idle_wakeups_per_s"] = {
                k: switches_between(before[k], context_switches(d.pids())) / self.cfg["idle_seconds"]
                for k, (d, _) in sides.items()}
        finally:
            for d in (plain, keeper):
                if d:
                    d.stop()
        return out

    @staticmethod
    def outages(ok: array.array, errs: list, kills: list[int], end: int) -> tuple[list, list, list]:
        """Per kill: kill to answer, the gap, the client's errors until the next kill."""
        rec, gaps, nerr = [], [], []
        for k, t in enumerate(kills):
            o = outage_after(ok, t)
            rec.append(None if o is None else o[1])
            gaps.append(None if o is None else o[0])
            nerr.append(errors_between(errs, t, kills[k + 1] if k + 1 < len(kills) else end))
        return rec, gaps, nerr

    @staticmethod
    def median_interval(ok: array.array) -> float | None:
        if len(ok) < 3:
            return None
        step = max(1, len(ok) // 20000)
        return statistics.median(ok[k] - ok[k - 1] for k in range(1, len(ok), step))


# ---------------------------------------------------------------- report


def fmt_ms(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def fmt_ratio(r: float | None) -> str:
    return "–" if r is None else f"{r:.2f}×" if r < 100 else f"{r:.0f}×"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def render(result: dict) -> str:
    """bench/recovery.md: the section docs/performance.md includes."""
    m = result["meta"]
    out = [f"<!-- Generated by bench/recovery.py: edit that, not this file. -->", "",
           f"`bench/recovery.py` ({m['date']}, mode `{m['mode']}`, commit `{m['commit']}`, Linux {m['kernel']}, "
           f"{m['cpus']} CPUs, 1-minute load average {m['loadavg_1min']:.1f} at the end, {m['wall_seconds']:.0f} s wall; "
           "release builds). A client process reads one file "
           "through the mount in a tight loop, `O_DIRECT` so that every read is a READ the daemon answers, and "
           "notes on `CLOCK_MONOTONIC` when each read was answered and each error; the driver notes on the same "
           "clock when it kills or upgrades the daemon. Times in milliseconds.", ""]
    rows, skipped = [], []
    for name, r in result["daemons"].items():
        if r.get("skipped"):
            skipped.append(f"**{name}**: {r['skipped']}")
    crash = [(n, r) for n, r in result["daemons"].items() if r.get("crash")]
    if crash:
        out += ["**Crash (SIGKILL of the serving daemon).** With `-o keeper` the keeper starts another daemon, "
                "which takes the connection over and has the kernel send the unanswered requests again. *Kill → "
                "answer*: from the kill to the first read the new daemon answered, which is the first read "
                f"answered after a gap of {OUTAGE_MIN_NS / 1e6:g} ms or more from the kill on (a killed daemon "
                "answers nothing more, and starting one takes longer); *gap*: that gap, from the last read "
                "answered before it, the outage as the client saw it. *Without keeper*: the same daemon, no keeper, "
                "killed and brought back as quickly as a supervisor can (reap it, detach the dead mount with "
                "`umount2(MNT_DETACH)`, start it again: it mounts and answers INIT): the outage a keeper is there "
                f"to avoid. Median and worst of {m['config']['kills']} kills each; ratio of the medians. *Process "
                "start*: the same binary run with `--help` (fork, exec, exit), median of 20, for what a new "
                "daemon's start alone takes here.", ""]
        header = ["daemon", "keeper: kill → answer (median / worst)", "keeper: gap (median / worst)",
                  "keeper: client errors", "no keeper: kill → answer (median / worst)", "no keeper: client errors",
                  "keeper ÷ no keeper (median)", "a read, steady (median)", "process start (median)"]
        rows = []
        for n, r in crash:
            k, p = r["crash"]["keeper"], r["crash"]["remount"]
            rk, gk = med_max([ms(x) for x in k["recovery_ns"]]), med_max([ms(x) for x in k["gap_ns"]])
            rp = med_max([ms(x) for x in p["recovery_ns"]])
            rows.append([n, f"{fmt_ms(rk['median'])} / {fmt_ms(rk['worst'])}",
                         f"{fmt_ms(gk['median'])} / {fmt_ms(gk['worst'])}", str(k["total_errors"]),
                         f"{fmt_ms(rp['median'])} / {fmt_ms(rp['worst'])}", str(p["total_errors"]),
                         fmt_ratio(ratio(rk["median"], rp["median"])),
                         f"{fmt_ms(ms(k['median_read_ns']))}", fmt_ms(ms(r["crash"].get("start_ns")))])
        out += [table(header, rows), ""]
    upg = [(n, r) for n, r in result["daemons"].items() if r.get("upgrade")]
    if upg:
        out += ["**Graceful upgrade (SIGUSR2 to the keeper).** The longest gap between two answered reads from "
                "the signal until a read is answered by the new daemon; against the longest gap in windows of the "
                "same lengths right after, on the same mount, with nothing happening (the pauses a client sees "
                f"anyway: scheduling on a shared machine). {m['config']['upgrades']} upgrades.", ""]
        rows = []
        for n, r in upg:
            u = r["upgrade"]
            p, q = med_max([ms(x) for x in u["pause_ns"]]), med_max([ms(x) for x in u["quiet_gap_ns"]])
            rows.append([n, f"{fmt_ms(p['median'])} / {fmt_ms(p['worst'])}",
                         f"{fmt_ms(q['median'])} / {fmt_ms(q['worst'])}", str(u["total_errors"]),
                         fmt_ratio(ratio(p["median"], q["median"])), fmt_ratio(ratio(p["worst"], q["worst"]))])
        out += [table(["daemon", "upgrade: longest pause (median / worst)", "no upgrade: longest gap (median / worst)",
                       "client errors", "ratio of medians", "ratio of worst"], rows), ""]
    rate = [(n, r) for n, r in result["daemons"].items() if r.get("rates")]
    if rate:
        out += ["**Steady state, keeper against none.** Operations per second of the same client (one thread), "
                "and the daemons' CPU time per operation (`utime` + `stime`; under a keeper the keeper's and its "
                "child's), "
                f"both mounted side by side, a client process on each, taking turns: {m['config']['rate_slices']} "
                f"slices of {m['config']['rate_seconds']:g} s each, the other client paused. Operations per second are "
                "the median of the slices, ± their spread (max − min) / median, and the ratio is the median of "
                "the ratios of slices run back to back (which share the load of the moment); CPU per operation is "
                "over all slices (the clock ticks 100 times a second). *pread*: `pread` of a file kept open (READ, which the journal does not record: "
                "idempotent); *open*: open, read, close each time (OPEN, whose file handle the journal records, "
                "READ, FLUSH, RELEASE; under passthrough_ll's keeper the open file is also recorded in memory "
                "the keeper holds, and the record cleared at release); *create* (where the filesystem is writable): "
                "create a new file exclusively, write 4 KiB, close and remove it each time (LOOKUP, CREATE, WRITE, "
                "FLUSH, RELEASE, UNLINK, FORGET: the journal, the node table's records and the open file's). "
                "Under a keeper the workers read clones of `/dev/fuse` that the keeper "
                "made and holds. The journal's cost on every row of the benchmark "
                "is in \"The keeper's cost\" (a full `bench/run`: passthrough_ll with `-o keeper` against "
                "without).", ""]
        rows = []
        for n, r in rate:
            for op, v in r["rates"].items():
                if op == "idle_wakeups_per_s":
                    continue
                pk, pp = v["reads_per_s"]["keeper"], v["reads_per_s"]["plain"]
                ek, ep = v["cpu_us_per_read"]["keeper"], v["cpu_us_per_read"]["plain"]
                mk, mp = (statistics.median(x) if x else None for x in (pk, pp))
                rows.append([n, op, f"{mp / 1e3:.1f} ±{spread(pp)}" if mp else "–",
                             f"{mk / 1e3:.1f} ±{spread(pk)}" if mk else "–", fmt_ratio(paired(pk, pp)),
                             f"{ep:.1f}" if ep else "–", f"{ek:.1f}" if ek else "–", fmt_ratio(ratio(ek, ep))])
        out += [table(["daemon", "client op", "no keeper, kops/s", "keeper, kops/s", "keeper ÷ none",
                       "CPU µs/op, none", "CPU µs/op, keeper", "keeper ÷ none"], rows), ""]
        idle = [(n, r["rates"]["idle_wakeups_per_s"]) for n, r in rate if "idle_wakeups_per_s" in r["rates"]]
        if idle:
            out += [f"With the mounts idle (after the slices, {m['config']['idle_seconds']:g} s, both at once), the "
                    "daemons' threads woke (context switches per second, `/proc/PID/task/*/status`; under a keeper "
                    "the keeper's and its child's): " + "; ".join(
                        f"{n} {v['plain']:.0f} without a keeper, {v['keeper']:.0f} with" for n, v in idle) + ".", ""]
    if skipped:
        out += ["Not measured: " + "; ".join(skipped) + ".", ""]
    errors = result.get("errors", [])
    if errors:
        out += ["Failures in this run: " + "; ".join(f"{e['daemon']} {e['row']}: `{e['error'][:160]}`"
                                                     for e in errors) + ".", ""]
    out += ["What these rest on: the kill and the answers are timed on one clock by two processes; the client "
            "learns of an answer when its `preadv` returns, so a time is late by at most one read (*a read, "
            f"steady*), and after an error the client waits {ERROR_PAUSE_S * 1e6:.0f} µs before it tries again. The "
            f"client spins on one CPU of {m['cpus']}, so the keeper, the new daemon's start (fork, exec, handover, "
            "`FUSE_NOTIFY_RESEND`) and the no-keeper remount all share the rest with whatever else runs: on a "
            "shared machine the worst cases carry its scheduling. Kill → answer counts a request the dead daemon "
            "held as answered when the new one answers it (sent again), which is what the client waits for."]
    return "\n".join(out).rstrip("\n") + "\n"


def paired(a: list[float], b: list[float]) -> float | None:
    """The median of a[i] / b[i]: slices run back to back share the machine's
    load of the moment, which a ratio of two medians would not cancel."""
    rs = [x / y for x, y in zip(a, b) if y]
    return statistics.median(rs) if rs else None


def spread(xs: list[float]) -> str:
    med = statistics.median(xs)
    return f"{(max(xs) - min(xs)) / med * 100:.0f}%" if med else "–"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


# ---------------------------------------------------------------- main


def build(names: list[str]) -> str | None:
    args = [x for n in names for x in ("--example", DAEMONS[n]["example"])]
    env = dict(os.environ, CARGO_TARGET_DIR=str(TARGET_DIR))
    r = subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "fuse-wire", *args], cwd=REPO, env=env,
                       capture_output=True, text=True)
    return None if r.returncode == 0 else "cargo build failed: " + " | ".join(r.stderr.strip().splitlines()[-3:])


def measure(mode: str, work: Path, names: list[str], bins: dict[str, Path]) -> dict:
    """Every row for every daemon in `names`; the result (also for bench.py)."""
    cfg = dict(MODES[mode])
    started = time.time()
    daemons, errors = {}, []
    for name in names:
        binary = bins.get(name)
        if binary is None or not binary.exists():
            daemons[name] = dict(skipped="not built")
            continue
        if not supports_keeper(str(binary)):
            daemons[name] = dict(skipped=f"this build's {name} has no `-o keeper`")
            log(f"{name}: no -o keeper in this build; skipped")
            continue
        b = Bench(cfg, work, name, binary)
        r = daemons[name] = {}
        for row, fn in (("crash", lambda: dict(keeper=b.crash_with_keeper(), remount=b.crash_without_keeper(),
                                               start_ns=process_start_ns(binary))),
                        ("upgrade", b.upgrades), ("rates", b.rates)):
            log(f"{name}: {row}")
            try:
                r[row] = fn()
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                errors.append(dict(daemon=name, row=row, error=str(e)[:400]))
                log(f"  {name} {row}: FAILED {e}")
    r = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True)
    return dict(meta=dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                          mode=mode, config=cfg, kernel=platform.release(), cpus=os.cpu_count(),
                          commit=r.stdout.strip() or "unknown", wall_seconds=round(time.time() - started, 1),
                          loadavg_1min=os.getloadavg()[0]),
                daemons=daemons, errors=errors)


def write(result: dict, docs: bool, regenerate: bool) -> None:
    """Writes bench/results/recovery.json; with `docs`, bench/recovery.md too,
    and with `regenerate` docs/performance.md around it (its other sections
    from docs/performance.json, the last full run's numbers)."""
    out = BENCH / "results" / "recovery.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    log("wrote bench/results/recovery.json")
    if not docs:
        return
    (BENCH / "recovery.md").write_text(render(result))
    log("wrote bench/recovery.md")
    saved = REPO / "docs" / "performance.json"
    if regenerate and saved.exists():
        sys.path.insert(0, str(BENCH))
        import report
        report.write_docs(json.loads(saved.read_text()), REPO / "docs")
        log("regenerated docs/performance.md (its other sections from docs/performance.json)")


def main() -> int:
    if len(sys.argv) == 6 and sys.argv[1] == "--probe":
        return probe_main(*sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter steady-rate windows")
    ap.add_argument("--daemons", default=",".join(DAEMONS), help=f"comma-separated, of {', '.join(DAEMONS)}")
    ap.add_argument("--workdir", help="empty directory for the mountpoints (default: a new temp dir)")
    ap.add_argument("--no-build", action="store_true", help="use the release examples already built")
    ap.add_argument("--no-docs", action="store_true", help="leave bench/recovery.md and docs/ alone")
    a = ap.parse_args()
    names = a.daemons.split(",")
    unknown = set(names) - set(DAEMONS)
    if unknown:
        ap.error(f"unknown daemons {sorted(unknown)}")
    if os.geteuid() != 0:
        sys.exit("recovery: needs root (mounts)")
    if not a.no_build:
        log(f"building {', '.join(names)} (release)")
        err = build(names)
        if err:
            sys.exit(f"recovery: {err}")
    bins = {n: TARGET_DIR / "release" / "examples" / DAEMONS[n]["example"] for n in names}
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="fuse-wire-recovery."))
    work.mkdir(parents=True, exist_ok=True)

    raise_on_signals()
    try:
        result = measure("quick" if a.quick else "full", work, names, bins)
    finally:
        for p in sorted(work.glob("mnt-*"), reverse=True):
            if mount_of(p):
                abort_mount(p)
                subprocess.run(["umount", "-l", str(p)], capture_output=True)
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    write(result, docs=not a.no_docs, regenerate=True)
    print(render(result))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        log(f"interrupted ({e or 'Ctrl-C'}); cleaned up")
        sys.exit(130)
