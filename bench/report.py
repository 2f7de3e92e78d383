#!/usr/bin/env python3
"""Tables, docs/performance.md and docs/img/*.svg from a bench/bench.py result.

    python3 bench/report.py [bench/results/latest.json]   # rewrites the docs

Standard library only: the charts are SVG written by hand.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from xml.sax.saxutils import escape

REPO = Path(__file__).resolve().parent.parent

COLORS = {
    "native": "#7f7f7f",
    "libfuse": "#1f77b4",
    "libfuse_never": "#9ecae1",
    "ours": "#d62728",
    "ours_served": "#8c564b",
    "ours_never": "#ff9896",
    "ours_pdw": "#2ca02c",
    "ours_passthrough": "#9467bd",
    "ours_uring": "#bcbd22",
}
FONT = "font-family='sans-serif' font-size='11'"


# ---------------------------------------------------------------- numbers


def summary(result: dict) -> dict:
    """{target: {workload: {median, min, max, n, spread_pct}}}."""
    out = {}
    for tid, per in result["samples"].items():
        out[tid] = {}
        for wid, vals in per.items():
            if not vals:
                continue
            med = statistics.median(vals)
            out[tid][wid] = dict(median=med, min=min(vals), max=max(vals), n=len(vals),
                                 spread_pct=(max(vals) - min(vals)) / med * 100 if med else 0.0)
    return out


def ratio(s: dict, tid: str, base: str | None, wid: str) -> float | None:
    a = s.get(tid, {}).get(wid)
    b = s.get(base, {}).get(wid) if base else None
    if not a or not b or not b["median"]:
        return None
    return a["median"] / b["median"]


def nice_ceiling(v: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is >= v (axis tops)."""
    if v <= 0:
        return 1.0
    p = 10 ** math.floor(math.log10(v))
    return next(m * p for m in (1, 2, 2.5, 5, 10) if m * p >= v)


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def fmt(v: float | None) -> str:
    if v is None:
        return "–"
    if v == 0:
        return "0"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fmt_ratio(r: float | None) -> str:
    return "–" if r is None else f"{r:.2f}×"


def unavailable(t: dict) -> str | None:
    return t.get("status")


def passed_through(t: dict) -> bool:
    """Whether the target opens regular files in kernel passthrough mode (older
    results name it only in the options)."""
    return bool(t.get("passthrough")) or "passthrough" in t.get("opts", [])


# ---------------------------------------------------------------- tables


def md_table(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    """A Markdown table; the first `left` columns align left, the rest (numbers) right."""
    align = ["---"] * left + ["---:"] * (len(header) - left)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def measured(result: dict, s: dict) -> list[dict]:
    """Targets that have numbers in this run."""
    return [t for t in result["targets"] if not unavailable(t) and s.get(t["id"])]


def medians_table(result: dict, s: dict) -> str:
    targets = measured(result, s)
    header = ["workload", "unit"] + [t["label"] for t in targets]
    rows = []
    for w in result["workloads"]:
        row = [w["label"], w["unit"]]
        for t in targets:
            st = s.get(t["id"], {}).get(w["id"])
            if unavailable(t):
                row.append(f"_{unavailable(t)}_")
            elif st is None:
                row.append("–")
            else:
                row.append(f"{fmt(st['median'])} ±{st['spread_pct']:.0f}%")
        rows.append(row)
    return md_table(header, rows, left=2)


def ratio_table(result: dict, s: dict, to_native: bool) -> str | None:
    if to_native:
        cols = [t for t in measured(result, s) if t["kind"] != "native"]
    else:
        cols = [t for t in measured(result, s) if t.get("base") and s.get(t["base"])]
    if not cols or (to_native and not s.get("native")):
        return None
    header = ["workload"] + [t["label"] for t in cols]
    rows = []
    for w in result["workloads"]:
        row = [w["label"]]
        for t in cols:
            if unavailable(t):
                row.append(f"_{unavailable(t)}_")
            else:
                row.append(fmt_ratio(ratio(s, t["id"], "native" if to_native else t["base"], w["id"])))
        rows.append(row)
    geo = ["**geometric mean**"]
    for t in cols:
        base = "native" if to_native else t["base"]
        g = geomean([ratio(s, t["id"], base, w["id"]) for w in result["workloads"]])
        geo.append("" if unavailable(t) else f"**{fmt_ratio(g)}**")
    rows.append(geo)
    return md_table(header, rows)


def overview_table(result: dict, s: dict) -> str:
    """One row per target: what it is, its geometric-mean ratios, its memory, or why it has no numbers."""
    rows = []
    for t in result["targets"]:
        opts = " ".join(f"`-o {o}`" for o in t.get("opts", [])) or ("–" if t["kind"] == "native" else "defaults")
        vals = result["rss_mib"].get(t["id"], [])
        rss = f"{statistics.median(vals):.1f}" if vals else "–"
        if unavailable(t) or not s.get(t["id"]):
            rows.append([t["label"], opts, t["cache"], "–", "–", "–", f"**{unavailable(t) or 'no numbers'}**"])
            continue
        base = t.get("base")
        g_lib = geomean([ratio(s, t["id"], base, w["id"]) for w in result["workloads"]]) if base else None
        g_nat = geomean([ratio(s, t["id"], "native", w["id"]) for w in result["workloads"]]) \
            if t["kind"] != "native" else None
        baseline = "–" if t["kind"] == "native" else "(baseline)"
        rows.append([t["label"], opts, t["cache"], fmt_ratio(g_lib) if base else baseline,
                     fmt_ratio(g_nat) if t["kind"] != "native" else "(limit)", rss, "measured"])
    return md_table(["target", "options", "cache", "vs libfuse, same cache (geomean)", "vs native (geomean)",
                     "peak RSS MiB (4-way load)", "status"], rows, left=3)


def rss_table(result: dict) -> str:
    rows = []
    for t in result["targets"]:
        if t["kind"] == "native":
            continue
        vals = result["rss_mib"].get(t["id"], [])
        if unavailable(t):
            rows.append([t["label"], f"_{unavailable(t)}_", ""])
        elif not vals:
            rows.append([t["label"], "–", ""])
        else:
            rows.append([t["label"], f"{statistics.median(vals):.1f}", f"{min(vals):.1f} – {max(vals):.1f}"])
    return md_table(["daemon", "peak RSS under 4-way load, MiB (median)", "min – max"], rows)


STAT_OPS = ["LOOKUP", "GETATTR", "CREATE", "OPEN", "READ", "WRITE", "READDIRPLUS", "UNLINK"]


def requests_table(result: dict) -> str | None:
    """Requests our daemon served per round (median), from its --stats file."""
    rows = []
    for tid, per_round in result.get("daemon_stats", {}).items():
        rounds = [r for r in per_round if r and "ops" in r]
        if not rounds:
            continue
        label = next(t["label"] for t in result["targets"] if t["id"] == tid)
        row = [label]
        for op in STAT_OPS:
            row.append(f"{statistics.median(r['ops'].get(op, {}).get('count', 0) for r in rounds):.0f}")
        rows.append(row)
    return md_table(["daemon"] + STAT_OPS, rows) if rows else None


def per_request(result: dict, tid: str, key: str, scale: float, per: str = "requests") -> dict[str, float]:
    """{workload: median over rounds of the daemon's `key` (cpu_s or ctxsw) per
    request (or per workload operation, with per="ops"), times scale}, for
    the workloads where those were counted."""
    out = {}
    for wid, rounds in result.get("costs", {}).get(tid, {}).items():
        vals = [r[key] / r[per] * scale for r in rounds
                if r.get(per) and r.get(key) is not None]
        if vals:
            out[wid] = statistics.median(vals)
    return out


def cost_rows(result: dict) -> list[tuple[str, str]]:
    """(id, label) of the rows of the cost tables: the workloads, then bonnie++ as a whole."""
    rows = [(w["id"], w["label"]) for w in result["workloads"] if not w["id"].startswith("bonnie_")]
    return rows + [("bonnie", "bonnie++, whole run (all six tests)")]


def cost_table(result: dict, key: str, scale: float, idle_row: bool, unit: str = "requests") -> str | None:
    """Daemon cost per request (or per workload operation, unit="ops"; median
    over rounds) per workload and daemon, then ours ÷ libfuse with the same
    cache mode (< 1: ours spends less)."""
    daemons = [t for t in result["targets"] if t["kind"] != "native" and not unavailable(t)
               and result.get("costs", {}).get(t["id"])]
    per = {t["id"]: per_request(result, t["id"], key, scale, unit) for t in daemons}
    if not any(per.values()):
        return None
    # Not passthrough: the kernel serves its READs and WRITEs, so what is left
    # per request is another mix of requests, not a cheaper way to serve them.
    pairs = [t for t in daemons if t.get("base") and per.get(t["base"]) and not passed_through(t)]
    header = ["workload"] + [t["label"] for t in daemons] + [f"{t['label']} ÷ {t['base'].replace('_', ' ')}"
                                                             for t in pairs]
    rows = []
    ratios: dict[str, list[float]] = {t["id"]: [] for t in pairs}
    for wid, label in cost_rows(result):
        if not any(wid in per[t["id"]] for t in daemons):
            continue
        row = [label] + [fmt(per[t["id"]].get(wid)) for t in daemons]
        for t in pairs:
            a, b = per[t["id"]].get(wid), per[t["base"]].get(wid)
            r = a / b if a is not None and b else None
            if r:
                ratios[t["id"]].append(r)
            row.append(fmt_ratio(r))
        rows.append(row)
    rows.append(["**geometric mean**"] + [""] * len(daemons) +
                [f"**{fmt_ratio(geomean(ratios[t['id']]))}**" for t in pairs])
    if idle_row:
        idle = result.get("idle_wakeups", {})
        med = {t["id"]: statistics.median(idle[t["id"]]) for t in daemons if idle.get(t["id"])}
        row = ["_idle: wake-ups per second_"] + [fmt(med.get(t["id"])) for t in daemons]
        row += [fmt_ratio(med[t["id"]] / med[t["base"]]) if med.get(t["id"]) is not None and med.get(t["base"])
                else "–" for t in pairs]
        rows.append(row)
    return md_table(header, rows)


def keeper_cost(result: dict, s: dict) -> str | None:
    """The journal's cost: every row of a target run under a keeper (one with
    `cost_of`) divided by the same daemon without, throughput and CPU per
    request; None when no such target was in the run."""
    t = next((t for t in result["targets"] if t.get("cost_of")), None)
    if t is None:
        return None
    base = next((b for b in result["targets"] if b["id"] == t["cost_of"]), None)
    if unavailable(t) or not s.get(t["id"]) or base is None or not s.get(base["id"]):
        why = unavailable(t) or (f"{t['cost_of']} was not measured" if not base or not s.get(t["cost_of"])
                                 else "no numbers")
        return f"Not measured in this run: {why}."
    cpu_k = per_request(result, t["id"], "cpu_s", 1e6)
    cpu_b = per_request(result, base["id"], "cpu_s", 1e6)
    # The control (libfuse's example against itself) row by row: how far a
    # ratio moved by chance in this run.
    control = next((c for c in measured(result, s) if c.get("control")), None)
    rows, rs, cs = [], [], []
    for w in result["workloads"]:
        r = ratio(s, t["id"], base["id"], w["id"])
        c = cpu_k[w["id"]] / cpu_b[w["id"]] if cpu_k.get(w["id"]) and cpu_b.get(w["id"]) else None
        if r is None and c is None:
            continue
        if r is not None:
            rs.append((r, w["label"]))
        if c is not None:
            cs.append(c)
        flag = "" if r is None or r >= 0.95 else " ⚠"
        row = [w["label"], fmt(s[base["id"]].get(w["id"], {}).get("median")),
               fmt(s[t["id"]].get(w["id"], {}).get("median")), fmt_ratio(r) + flag, fmt_ratio(c)]
        if control:
            row.append(fmt_ratio(ratio(s, control["id"], control["base"], w["id"])))
        rows.append(row)
    rows.append(["**geometric mean**", "", "", f"**{fmt_ratio(geomean([r for r, _ in rs]))}**",
                 f"**{fmt_ratio(geomean(cs))}**"] + ([""] if control else []))
    within = sum(1 for r, _ in rs if r >= 0.95)
    low = min(rs) if rs else None
    text = (f"{within} of {len(rs)} rows within 5% of {base['label']} or faster (⚠: more than 5% slower)"
            + (f"; lowest {fmt_ratio(low[0])} ({low[1]})." if low else "."))
    header = ["workload", f"{base['label']}", f"{t['label']}", "throughput, keeper ÷ none",
              "CPU per request, keeper ÷ none"]
    if control:
        header.append(f"control: {control['label']} ÷ {control['base'].replace('_', ' ')}")
    return "\n".join([md_table(header, rows), "", text])


def console_tables(result: dict) -> str:
    s = summary(result)
    parts = ["", "Targets (geometric means of the per-workload ratios):", overview_table(result, s), "",
             "Medians over rounds (± is (max-min)/median):", medians_table(result, s), ""]
    for title, table in (("Ratio to libfuse with the same cache mode (>1: ours is faster):",
                          ratio_table(result, s, False)),
                         ("Ratio to native tmpfs:", ratio_table(result, s, True))):
        parts += [title, table or "(no pair measured in this run)", ""]
    keeper = keeper_cost(result, s)
    if keeper:
        parts += ["The keeper's cost (ours keeper ÷ ours no passthrough, > 1: the keeper is faster):", keeper, ""]
    parts += ["FUSE daemon memory:", rss_table(result), ""]
    for title, table in (("Daemon CPU per request, µs (< 1 in the ÷ columns: ours spends less):",
                          cost_table(result, "cpu_s", 1e6, True)),
                         ("Daemon context switches per request:", cost_table(result, "ctxsw", 1.0, False))):
        if table:
            parts += [title, table, ""]
    if result["errors"]:
        parts.append(f"{len(result['errors'])} errors, first: {result['errors'][0]}")
    return "\n".join(parts)


# ---------------------------------------------------------------- SVG


def svg_doc(width: int, height: int, body: list[str], title: str) -> str:
    return "\n".join([
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' {FONT}>",
        f"<title>{escape(title)}</title>",
        f"<rect width='{width}' height='{height}' fill='white'/>",
        f"<text x='10' y='20' font-size='14' font-weight='bold'>{escape(title)}</text>",
        *body, "</svg>", ""])


def legend(targets: list[dict], y: int, width: int) -> list[str]:
    out, x = [], 10
    for t in targets:
        label = escape(t["label"])
        w = 18 + 6.5 * len(t["label"]) + 14
        if x + w > width:
            x, y = 10, y + 16
        out.append(f"<rect x='{x}' y='{y - 9}' width='10' height='10' fill='{COLORS.get(t['id'], '#333')}'/>")
        out.append(f"<text x='{x + 14}' y='{y}'>{label}</text>")
        x += int(w)
    return out


def bars_svg(result: dict, s: dict, group: str, title: str) -> str | None:
    """One small panel per workload of `group`: a bar per target (median), whisker min–max."""
    ws = [w for w in result["workloads"] if w["group"] == group]
    targets = [t for t in result["targets"] if not unavailable(t) and s.get(t["id"])]
    if not ws or not targets:
        return None
    cols, pw, label_w, bar_h = 2, 380, 110, 14
    ph = 34 + bar_h * len(targets) + 10
    rows = math.ceil(len(ws) / cols)
    width, top = cols * pw + 20, 52
    body = legend(targets, 38, width)
    for i, w in enumerate(ws):
        x0, y0 = 10 + (i % cols) * pw, top + (i // cols) * ph
        vmax = max((s[t["id"]][w["id"]]["max"] for t in targets if w["id"] in s[t["id"]]), default=0) or 1
        scale = (pw - label_w - 60) / vmax
        body.append(f"<text x='{x0}' y='{y0 + 16}' font-weight='bold'>{escape(w['label'])} "
                    f"<tspan font-weight='normal' fill='#555'>({escape(w['unit'])})</tspan></text>")
        for j, t in enumerate(targets):
            y = y0 + 26 + j * bar_h
            body.append(f"<text x='{x0 + label_w - 4}' y='{y + 10}' text-anchor='end'>{escape(t['label'])}</text>")
            st = s[t["id"]].get(w["id"])
            if st is None:
                body.append(f"<text x='{x0 + label_w + 2}' y='{y + 10}' fill='#999'>no data</text>")
                continue
            bx, bw = x0 + label_w, st["median"] * scale
            body.append(f"<rect x='{bx}' y='{y + 1}' width='{bw:.1f}' height='{bar_h - 3}' "
                        f"fill='{COLORS.get(t['id'], '#333')}'/>")
            lo, hi = bx + st["min"] * scale, bx + st["max"] * scale
            cy = y + bar_h / 2
            body.append(f"<path d='M{lo:.1f} {cy:.1f}H{hi:.1f}M{lo:.1f} {cy - 3:.1f}V{cy + 3:.1f}"
                        f"M{hi:.1f} {cy - 3:.1f}V{cy + 3:.1f}' stroke='black' stroke-width='1'/>")
            body.append(f"<text x='{hi + 4:.1f}' y='{y + 10}'>{fmt(st['median'])}</text>")
    return svg_doc(width, top + rows * ph + 10, body, title)


def lines_svg(result: dict, s: dict, panels: list[tuple[str, str, list[tuple[int, str]]]], title: str) -> str | None:
    """Panels of (title, unit, [(x, workload id)]): a line per target through its medians."""
    # Native is left out: on its scale the FUSE targets' lines would lie flat.
    targets = [t for t in result["targets"] if not unavailable(t) and s.get(t["id"]) and t["kind"] != "native"]
    if not targets:
        return None
    cols, pw, ph = 2, 380, 230
    width, top = cols * pw + 20, 52
    rows = math.ceil(len(panels) / cols)
    body = legend(targets, 38, width)
    for i, (ptitle, unit, pts) in enumerate(panels):
        x0, y0 = 10 + (i % cols) * pw, top + (i // cols) * ph
        left, right, ptop, bottom = x0 + 55, x0 + pw - 20, y0 + 28, y0 + ph - 30
        vals = [s[t["id"]][w]["median"] for t in targets for _, w in pts if w in s[t["id"]]]
        vmax = nice_ceiling(max(vals) if vals else 1)
        body.append(f"<text x='{x0}' y='{y0 + 14}' font-weight='bold'>{escape(ptitle)} "
                    f"<tspan font-weight='normal' fill='#555'>({escape(unit)})</tspan></text>")
        for k in range(5):
            v = vmax * k / 4
            y = bottom - (bottom - ptop) * k / 4
            body.append(f"<line x1='{left}' x2='{right}' y1='{y:.1f}' y2='{y:.1f}' stroke='#ddd'/>")
            body.append(f"<text x='{left - 4}' y='{y + 4:.1f}' text-anchor='end' fill='#555'>{fmt(v)}</text>")
        xs = {x: left + (right - left) * (k / max(1, len(pts) - 1)) for k, (x, _) in enumerate(pts)}
        for x, px in xs.items():
            body.append(f"<text x='{px:.1f}' y='{bottom + 16}' text-anchor='middle'>{x}</text>")
        for t in targets:
            coords = [(xs[x], bottom - (bottom - ptop) * s[t["id"]][w]["median"] / vmax)
                      for x, w in pts if w in s[t["id"]]]
            if not coords:
                continue
            c = COLORS.get(t["id"], "#333")
            d = " ".join(f"{'M' if k == 0 else 'L'}{px:.1f} {py:.1f}" for k, (px, py) in enumerate(coords))
            body.append(f"<path d='{d}' fill='none' stroke='{c}' stroke-width='2'/>")
            body.extend(f"<circle cx='{px:.1f}' cy='{py:.1f}' r='3' fill='{c}'/>" for px, py in coords)
    return svg_doc(width, top + rows * ph + 10, body, title)


def charts(result: dict) -> dict[str, str]:
    s = summary(result)
    out = {}
    for name, group, title in (
            ("bars-data", "data", "Sequential and random I/O (median of rounds, whisker: min–max)"),
            ("bars-shared", "shared", "One shared file, O_DIRECT, N jobs (median, whisker: min–max)"),
            ("bars-meta-t1", "meta_t1", "Metadata, 1 thread (median, whisker: min–max)"),
            ("bars-meta-t4", "meta_t4", "Metadata, 4 threads (median, whisker: min–max)")):
        svg = bars_svg(result, s, group, title)
        if svg:
            out[name] = svg
    panels = [
        ("shared file, preallocated", "MB/s", [(n, f"shared_pre_j{n}") for n in (1, 2, 4)]),
        ("shared file, extending", "MB/s", [(n, f"shared_ext_j{n}") for n in (1, 2, 4)]),
        ("create, own directories", "kops/s", [(t, f"md_create_private_t{t}") for t in (1, 4)]),
        ("create, one shared directory", "kops/s", [(t, f"md_create_shared_t{t}") for t in (1, 4)]),
        ("stat, own directories", "kops/s", [(t, f"md_stat_private_t{t}") for t in (1, 4)]),
        ("small-file read", "kops/s", [(t, f"md_read_small_t{t}") for t in (1, 4)]),
    ]
    svg = lines_svg(result, s, panels, "Scaling of the FUSE targets: x is fio jobs or mdtest threads (medians)")
    if svg:
        out["scaling"] = svg
    return out


# ---------------------------------------------------------------- docs


def doc(result: dict, images: list[str]) -> str:
    m, cfg = result["meta"], result["meta"]["config"]
    s = summary(result)
    targets = result["targets"]
    quick = m["mode"] == "quick"
    out = ["# Performance", "",
           "<!-- Generated by bench/run (bench/report.py): edit those, not this file. -->", ""]
    if quick:
        out += ["> **This is a `--quick` run on a loaded, shared 2-core machine** (other builds were running: "
                f"1-minute load average {', '.join(f'{x:.1f}' for x in m['loadavg_1min'])} over the run). "
                "Each workload ran for a fraction of a second, so the numbers are noisy. They show that the "
                "suite works and roughly where things stand; they will be refreshed by a full run "
                "(`bench/run`) on a quiet machine.", ""]
    out += [f"Run: {m['date']}, mode `{m['mode']}`, {cfg['rounds']} rounds, commit `{m['commit']}`, "
            f"Linux {m['kernel']}, {m['cpus']} CPUs, {m['fio']}, libfuse {m['libfuse']['version']}, "
            f"{m['wall_seconds']:.0f} s wall.", ""]
    missing = [t for t in targets if unavailable(t)]
    if missing and m.get("ours_error"):
        out += [f"Our example did not build on this commit (`{m['ours_error'][:160]}`), so the rows of our "
                "targets are empty in this run.", ""]

    out += ["## At a glance", "",
            "Ratios, not absolute speeds: the absolute numbers depend on this machine and its load. "
            "A ratio above 1 means faster (every workload here is \"higher is better\"). A geometric mean "
            "weighs every workload the same; the tables below give each one.", "",
            overview_table(result, s), ""]
    out += [f"![{name}](img/{name}.svg)" for name in images]
    out += [""]
    t_lib, t_nat = ratio_table(result, s, False), ratio_table(result, s, True)
    out += ["## Ratio to libfuse with the same cache mode", "",
            t_lib or "No pair of ours and libfuse was measured in this run.", ""]
    control = control_summary(result, s)
    if control:
        out += [control, ""]
    keeper = keeper_cost(result, s)
    if keeper:
        out += ["## The keeper's cost: `-o keeper` against without", "",
                "Our passthrough_ll run under a keeper (`-o keeper`, docs/recovery.md): the process started "
                "keeps the mount and its child serves, reading requests from `/dev/fuse` clones the keeper "
                "holds, recording each request that changes state in the journal the keeper holds, and its "
                "node table and open files in memory the keeper holds. Each row divides its median by that of "
                "the same daemon without a keeper in the same run (> 1: the keeper is faster); the CPU time is "
                "the keeper's and its child's together. The target is within 5% on every row; the last column, "
                "the control (libfuse's example against itself, when it ran), shows how far the same row moved "
                "by chance in this run. The two targets run minutes apart; the steady-state rows of \"Crash "
                "recovery and live upgrade\" below measure the same cost with both mounts side by side, taking "
                "turns slice by slice, which cancels most of the machine's drift.", "",
                keeper, ""]
    out += ["## Ratio to native tmpfs", "", t_nat or "Native was not measured in this run.", "",
            "## Medians", "",
            "Median over rounds; ± is the spread (max − min) / median of the rounds.", "",
            medians_table(result, s), "",
            "## Memory of the FUSE daemons", "",
            "Peak resident set size (`VmHWM` in `/proc/PID/status`) of the daemon over the 4-way part of "
            "each round (4-job shared-file writes, then mdtest with 4 threads). The peak is reset just before "
            "that part by writing `5` to `/proc/PID/clear_refs`, so start-up and earlier workloads don't count.",
            "", rss_table(result), ""]
    cpu = cost_table(result, "cpu_s", 1e6, True)
    pt = [t["label"] for t in result["targets"] if t["kind"] == "ours" and passed_through(t)]
    no_ratio = (" and ".join(pt) + (" have" if len(pt) > 1 else " has")) if pt else "No target has"
    if cpu:
        out += ["## Cost per request", "",
                "What each daemon spends per FUSE request, a figure that depends much less on the machine's "
                "load than throughput: the CPU time of the whole daemon (user + system, `utime` + `stime` of "
                "`/proc/PID/stat`, all its threads, those that ended included) over the workload, divided by "
                "the requests the kernel sent it meanwhile. Requests are counted by the kernel: "
                f"`{m.get('request_counting')}` (a tracepoint, Linux 6.15+) filtered to the mount's connection, "
                "counted in the kernel by `perf stat -a` switched on and off around each workload; FORGETs are "
                "not requests there and are not counted. mdtest phases are measured one by one (its `--step` "
                "handshake); bonnie++ as a whole. The CPU clock ticks "
                f"{m.get('clk_tck', 100)} times a second, so a workload that keeps a daemon busy for less than "
                "a second or so carries a few percent of quantisation (quick runs: much more). Median over rounds, in "
                f"microseconds. {no_ratio} no ratio: the kernel serves {'their' if len(pt) > 1 else 'its'} "
                "reads and writes (kernel passthrough), so what is left is a different mix of requests.", "",
                "The last row is not per request: the context switches per second of all the daemon's threads "
                f"(`voluntary_ctxt_switches` + `nonvoluntary_ctxt_switches` of `/proc/PID/task/*/status`) over "
                f"{cfg.get('idle_seconds', '?')} s with the mount unused, after the round's workloads and "
                f"{cfg.get('idle_settle', 1.0)} s of quiet.", "", cpu, ""]
        cs = cost_table(result, "ctxsw", 1.0, False)
        if cs:
            out += ["Context switches of the daemon's threads per request, counted the same way (a thread that "
                    "ended during a workload counts one):", "", cs, ""]
        per_op = cost_table(result, "cpu_s", 1e6, False, "ops")
        if per_op:
            out += ["The same CPU time per operation of the workload instead of per request (fio: its I/Os; "
                    "mdtest: the files or entries its phase handled), in microseconds. A daemon that spares "
                    "the kernel a cheap request (a FLUSH on close, a LOOKUP after CREATE) raises its average "
                    "per request while it lowers its cost per operation: where the two tables disagree, this "
                    "one says what a user pays.", "", per_op, ""]
        steal = steal_summary(result)
        if steal:
            out += [steal, ""]
    elif "costs" in result:
        out += ["## Cost per request", "",
                f"Not measured in this run: requests could not be counted ({m.get('request_counting')}).", ""]
    req = requests_table(result)
    if req:
        out += ["## Requests our daemon served", "",
                "Per round (median), from the statistics our example writes with `--stats FILE`. With "
                "`passthrough` the kernel reads and writes the backing files itself, so READ and WRITE "
                "should stay near zero there; with `cache=never` every lookup and getattr reaches the daemon.",
                "", req, ""]
    out += method(result)
    if result["errors"]:
        out += ["## Errors in this run", ""]
        out += [f"- round {e['round']}, {e['target']}, {e['workload']}: `{e['error'][:200]}`"
                for e in result["errors"][:30]]
        out.append("")
    return "\n".join(out)


def control_summary(result: dict, s: dict) -> str | None:
    """How far libfuse's example moved against itself in this run: the
    spread a ratio shows by chance alone."""
    control = next((t for t in measured(result, s) if t.get("control")), None)
    if control is None:
        return None
    rs = sorted((r, w["label"]) for w in result["workloads"]
                if (r := ratio(s, control["id"], control["base"], w["id"])) is not None)
    if not rs:
        return None
    low = [label for r, label in rs if r < 0.95]
    high = [label for r, label in rs if r > 1.05]
    g = geomean([r for r, _ in rs])
    return (f"**Chance, measured.** The control, libfuse's example run a second time in every round and "
            f"divided by the first, ranged from {fmt_ratio(rs[0][0])} ({rs[0][1]}) to {fmt_ratio(rs[-1][0])} "
            f"({rs[-1][1]}) over {len(rs)} rows, geometric mean {fmt_ratio(g)}: {len(low)} rows below 0.95×, "
            f"{len(high)} above 1.05×. A row of ours within that band of 1.0× is not told apart from libfuse "
            "by this run.")


def steal_summary(result: dict) -> str:
    """A paragraph on the hypervisor's steal time over the measured workloads
    (`steal_s` in each cost sample), or "" if the run did not record it."""
    per: dict[tuple[str, str], float] = {}
    for tid, wls in result.get("costs", {}).items():
        for wid, samples in wls.items():
            for c in samples:
                if isinstance(c, dict) and c.get("steal_s") is not None:
                    per[(tid, wid)] = per.get((tid, wid), 0.0) + c["steal_s"]
    if not per:
        return ""
    total = sum(per.values())
    labels = {w["id"]: w["label"] for w in result["workloads"]}
    labels.update({t["id"]: t["label"] for t in result["targets"]})
    labels.setdefault("bonnie", "bonnie++ (whole run)")
    worst = sorted(((v, t, w) for (t, w), v in per.items() if v >= 0.05), reverse=True)[:5]
    text = (f"Steal time (the `steal` column of `/proc/stat`: CPU time the host gave to other guests while this "
            f"machine's CPUs wanted it) over the daemons' measured workloads, all rounds: {total:.2f} s in all.")
    if worst:
        text += " Most of it during " + ", ".join(
            f"{labels.get(w, w)} on {labels.get(t, t)} ({v:.2f} s)" for v, t, w in worst) + ": read those samples with care."
    else:
        text += " No workload saw 0.05 s or more."
    return text


def ours_targets_line(result: dict) -> str:
    """What our targets are; a run from before kernel passthrough was our
    default (its `ours` target not marked `passthrough`) is told as it ran."""
    ours = next((t for t in result["targets"] if t["id"] == "ours"), {})
    head = "- **ours**: our `passthrough_ll` example (`cargo build --release --example passthrough_ll`) with the same options"
    tail = ("**ours never** with `-o cache=never`; **ours pdw** adds `-o parallel_direct_writes`; **ours io_uring** "
            "adds `-o uring` (FUSE over io_uring, one ring per CPU; `bench/run` turns the kernel's `enable_uring` "
            "knob on for the run and restores it after).")
    if passed_through(ours):
        return (f"{head}: its default, which opens regular files in kernel passthrough mode where the kernel and "
                "privileges allow it (the kernel does reads and writes on the backing file); **ours no "
                "passthrough** adds `-o no_passthrough` (the daemon serves reads and writes), and so do the rows "
                "that measure how it serves them (no fh, never, pdw, io_uring, keeper); **ours passthrough** "
                f"asks for passthrough with `-o passthrough`; {tail}")
    return (f"{head} (in this run its default served reads and writes itself); **ours passthrough** adds "
            f"`-o passthrough` (the kernel does reads and writes on the backing file); {tail}")


def method(result: dict) -> list[str]:
    m, cfg = result["meta"], result["meta"]["config"]
    rt = cfg["runtime"]
    lines = [
        "## What is measured, and how", "",
        "`bench/run` (details in [bench/README.md](../bench/README.md)) mounts a fresh tmpfs as the source "
        "directory, writes the input files into it directly, then for every round mounts each target over that "
        "same source in turn and runs every workload against the mountpoint. Between targets it unmounts and "
        "empties the scratch directory on the tmpfs itself. Target order rotates every round, so slow drifts of "
        "the machine's load spread over all targets instead of landing on one.", "",
        "Targets:", "",
        "- **native tmpfs**: the workloads run on the tmpfs itself, no FUSE: the upper limit.",
        f"- **libfuse**: libfuse's own `passthrough_ll` example ({m['libfuse']['version']}, from "
        f"`{m['libfuse']['source']}`, built with `{m['libfuse']['compile']}`), `-f -o source=SRC`; "
        "**libfuse never** adds `-o cache=never` (no page cache: every read and write goes to the daemon); "
        "**libfuse again** is the same daemon as libfuse once more, a control: its ratio to libfuse shows how "
        "far a row moves by chance alone in this run.",
        ours_targets_line(result), "",
        "Our `parallel_direct_writes` opens every file with `DIRECT_IO | PARALLEL_DIRECT_WRITES`, so its buffered "
        "data rows bypass the page cache like `cache=never` while its entry and attribute timeouts stay those of "
        "the default mode; its ratios divide by libfuse's default all the same, so read its data rows against "
        "the medians of libfuse never too.", "",
        "Each daemon runs with its default worker threads: libfuse's example starts threads on demand (at most "
        "10 idle), ours runs two workers per CPU, each on its own cloned `/dev/fuse` descriptor. Daemons and load "
        "generators share the machine's CPUs.", "",
        "Workloads (fio, `ioengine=psync`, one file per workload, JSON output):", "",
        f"- **seq read / seq write**: one job, 1 MiB blocks, buffered, over a {cfg['seq_mib']} MiB file, "
        f"`--time_based --runtime={rt}s`. fio drops the file's cached pages before reading (its default "
        "`invalidate=1`), and again each time it wraps around to the start, so buffered reads through FUSE "
        "go to the daemon (with kernel readahead) rather than being served from the page cache; on tmpfs that "
        "drop does nothing, so native reads come from memory. The write file exists already (an overwrite).",
        f"- **rand read / rand write**: one job, 4 KiB blocks, `O_DIRECT`, uniform random offsets over a "
        f"{cfg['rand_mib']} MiB file, `--time_based --runtime={rt}s`.",
        f"- **shared file**: N = 1, 2, 4 jobs writing one file with `O_DIRECT`, {m['shared_bs'] // 1024} KiB "
        "blocks; job k writes blocks k, k+N, k+2N… so together they sweep the file. *Preallocated*: a "
        f"{cfg['shared_mib']} MiB file that exists, no write extends it (`--time_based`). *Extending*: a new empty "
        "file that fio does not size first (`--fallocate=none`), every write lands at or past end of file; bounded by `--runtime` and a size cap but not "
        "`--time_based` (that would wrap around and stop extending). The rate is the bytes of all jobs "
        "divided by the longest job's runtime.",
        f"- **metadata** (`bench/mdtest`, ours): T = 1 and 4 threads; each phase stops after {cfg['md_seconds']} s or "
        f"{cfg['md_max_files']} files per thread. Create, stat and unlink empty files in one directory per "
        "thread, then the same with all threads in one shared directory; then create+write+close and "
        "open+read+close of 4 KiB files. Stat, unlink and read visit the files the phase before made. The "
        "rate is operations divided by the phase's wall time. The file count is also capped so that the "
        "daemons, which hold a descriptor per known inode, stay below their open-file limit "
        f"({m.get('daemon_nofile', '?')} here; caps per thread: "
        f"{', '.join(f'{v} at T={k}' for k, v in m.get('md_files_per_thread', {}).items()) or '?'}).",
        f"- **bonnie++** (native, libfuse never and ours never only): `bonnie++ -x {cfg.get('bonnie_runs', '?')} "
        f"-q -s0 -d DIR -n {cfg.get('bonnie_files', '?')}:0:0:10 -r 0 -u 0`, its file tests only: create, stat "
        "and delete that many thousand (×1024) empty files spread over 10 directories, first in name order, "
        "then in random order; the median of its runs, in thousands of files per second. bonnie++ prints "
        "`+++++` for a test that ended too quickly to time (native tmpfs does), shown as –.",
        f"- **ls -l 10k**: `ls -l` of a directory of {cfg['ls_entries']} empty files made on the tmpfs before the "
        "mount: *cold* is the first listing through this mount, *warm* (full runs only) the one right after "
        "(attributes may come from the kernel's cache, depending on the cache mode); entries per second.", "",
        f"Every configuration runs once per round, {cfg['rounds']} rounds; the tables give the median and the "
        "spread of the rounds. A ratio divides medians. The geometric means weigh every workload the same, "
        "which is a choice, not a law: read the rows that matter to you.", "",
        "What this does not show: disks (tmpfs takes the device out so the FUSE overhead stands out), "
        "writeback caching (neither daemon enables it here), latency percentiles (fio "
        "records them; see `bench/results/latest.json` after a run for the raw per-round samples).", "",
    ]
    # Our reading of the numbers, written by hand after a full run and kept
    # next to the generator so that a regenerated page keeps it.
    analysis = Path(__file__).with_name("analysis.md")
    if analysis.exists():
        lines += ["## Reading the results", ""] + analysis.read_text().rstrip("\n").split("\n") + [""]
    # Counts per request, measured with bench/syscalls.py and written by hand
    # (they barely depend on the machine's load, unlike the tables above).
    per_request = Path(__file__).with_name("per-request.md")
    if per_request.exists():
        lines += ["## Per request: system calls and wake-ups, ours against libfuse", ""] + \
            per_request.read_text().rstrip("\n").split("\n") + [""]
    fh_idle = Path(__file__).with_name("fh-idle.md")
    if fh_idle.exists():
        lines += ["## File-handle mode and idle wake-ups", ""] + \
            fh_idle.read_text().rstrip("\n").split("\n") + [""]
    # Spliced WRITE payloads (opt-in): measured with bench/splice_write.sh
    # and bench/syscalls.py, written by hand.
    splice_write = Path(__file__).with_name("splice-write.md")
    if splice_write.exists():
        lines += ["## Spliced WRITE payloads (`splice_write`)", ""] + \
            splice_write.read_text().rstrip("\n").split("\n") + [""]
    # Crash recovery and upgrades under a keeper: written by bench/recovery.py
    # (bench/run recovery, or at the end of a full bench/run).
    recovery = Path(__file__).with_name("recovery.md")
    if recovery.exists():
        lines += ["## Crash recovery and live upgrade", ""] + \
            recovery.read_text().rstrip("\n").split("\n") + [""]
    # The node, path and async layers against the raw trait: written by bench/layers.
    layers = Path(__file__).with_name("layers.md")
    if layers.exists():
        lines += ["## Node, path and async layers against the raw trait", ""] + \
            layers.read_text().rstrip("\n").split("\n") + [""]
    # The async trait against the sync trait on a slow backend: written by bench/asyncfs.
    asyncfs = Path(__file__).with_name("asyncfs.md")
    if asyncfs.exists():
        lines += ["## Async trait against the sync trait, on a slow backend", ""] + \
            asyncfs.read_text().rstrip("\n").split("\n") + [""]
    # Another user's requests while one user saturates the mount: written by bench/load.
    load = Path(__file__).with_name("load.md")
    if load.exists():
        lines += ["## Another user's requests while one user saturates the mount", ""] + \
            load.read_text().rstrip("\n").split("\n") + [""]
    lines += [
        "## Reproduce", "",
        "```sh",
        "bench/run           # full run, about 30 minutes",
        "bench/run --quick   # under 3 minutes, noisy",
        "bench/syscalls.py   # counts per request (after a bench/run built both daemons)",
        "bench/splice_write.sh   # CPU per WRITE with and without splice_write",
        "bench/layers        # the node, path and async layers against the raw trait",
        "bench/asyncfs       # the async trait against the sync trait on a slow backend",
        "bench/load          # another user's stat while one user saturates the mount",
        "bench/run recovery  # crash recovery and upgrades under a keeper only",
        "```", "",
    ]
    return lines


def write_docs(result: dict, docs: Path) -> None:
    img = docs / "img"
    img.mkdir(parents=True, exist_ok=True)
    svgs = charts(result)
    for name, svg in svgs.items():
        (img / f"{name}.svg").write_text(svg)
    (docs / "performance.md").write_text(doc(result, list(svgs)))
    # The numbers behind the doc, without the raw fio output, for anyone checking them.
    (docs / "performance.json").write_text(json.dumps(dict(
        meta=result["meta"], targets=result["targets"], workloads=result["workloads"],
        samples=result["samples"], rss_mib=result["rss_mib"], errors=result["errors"],
        daemon_stats=result.get("daemon_stats", {}), costs=result.get("costs", {}),
        idle_wakeups=result.get("idle_wakeups", {})), indent=1) + "\n")


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "bench" / "results" / "latest.json"
    result = json.loads(path.read_text())
    print(console_tables(result))
    write_docs(result, REPO / "docs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
