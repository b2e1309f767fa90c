"""Run every benchmark, print one table (figure, target, measured, ok?), write
benchmarks/results.json and benchmarks/RESULTS.md.

    python benchmarks/run_all.py             # full sizes (see each script's defaults)
    python benchmarks/run_all.py --quick     # smaller sizes for a loaded or small box
    python benchmarks/run_all.py --table     # only rebuild the table from results.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results.json")

FULL = {
    "hook.py": [],
    "overhead.py": ["--repeats", "5"],
    "session.py": [],
    "store_size.py": [],
    "scale.py": ["--tasks", "1000000"],
    "scheduler_memory.py": [],
    "seal_memory.py": [],
    "yappi_overhead.py": ["--repeats", "3"],
}
QUICK = {
    "hook.py": [],
    "overhead.py": ["--repeats", "3"],
    "session.py": ["--sessions", "3", "--clusters", "2"],
    "store_size.py": [],
    "scale.py": ["--tasks", "60000", "--writer-rows", "500000"],
    "scheduler_memory.py": ["--tasks", "30000"],
    "seal_memory.py": ["--tasks", "100000"],
    "yappi_overhead.py": ["--repeats", "3", "--images", "4"],
}


def _newest(a: dict[str, Any], b: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    """Of two results of the same measurement (``key`` present: measured), the later one."""
    have = [r for r in (a, b) if r and (key is None or key in r)]
    return max(have, key=lambda r: r.get("when") or "", default={})


def _f(x: Any, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _host_normalized(r: dict[str, Any], target: float) -> tuple[Any, str, bool | None, str]:
    """The array pipeline's ratio with the host's speed divided out (overhead.py): value,
    format, met, note."""
    s = r.get("spread", {}).get("collected_host_normalized")
    if not s:
        return None, ".3f", None, ""
    note = (
        f"(wall time per second of the tasks' own CPU; 95% CI "
        f"{s['ci95_low']:.3f}-{s['ci95_high']:.3f}, n={s['n']})"
    )
    return s["median"], ".3f", s["median"] <= target, note


def rows(res: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    out = []

    def add(fig: str, target: str, value: Any, fmt: str, ok: bool | None, note: str = "") -> None:
        out.append(
            (
                fig,
                target,
                _f(value, fmt) + (f" {note}" if note else ""),
                "?" if ok is None or value is None else ("yes" if ok else "NO"),
            )
        )

    tiny, arr = res.get("overhead_tiny", {}), res.get("overhead_array", {})
    for label, r, target in (
        ("1a overhead, tiny tasks", tiny, 1.02),
        ("1b overhead, array >=10 ms", arr, 1.01),
    ):
        v, pr = r.get("ratio_collected"), r.get("ratio_performance_report")
        inner = r.get("ratio_collected_inner")
        cpu, cpu_pr = (
            r.get("ratio_cpu_collected"),
            r.get("ratio_cpu_performance_report"),
        )
        note = (
            f"({r.get('tasks_in_graph', '?')} tasks, {r.get('repeats', '?')} repeats"
            + (f"; workload alone in the session {inner:.3f}" if inner else "")
            + (f"; CPU time {cpu:.3f}, performance_report's {cpu_pr:.3f}" if cpu else "")
            + ")"
            if r
            else ""
        )
        add(label, f"<= {target}", v, ".3f", None if v is None else v <= target, note)
        add(
            label.replace("overhead", "performance_report"),
            "collector below it",
            pr,
            ".3f",
            None if v is None or pr is None else v < pr,
        )
    add("1b overhead, array >=10 ms, host-normalized", "<= 1.01", *_host_normalized(arr, 1.01))
    se = res.get("session", {})
    add(
        "1 session start + stop (s), trivial graph",
        "(reference)",
        (se["median_start_s"] + se["median_stop_s"]) if se else None,
        ".2f",
        None,
        f"(start {se['median_start_s']:.2f}, stop {se['median_stop_s']:.2f}; "
        f"medians of {se['sessions']})"
        if se
        else "",
    )
    if se.get("first_start_s"):
        add(
            "1 first session on a new cluster, start + stop (s)",
            "(reference)",
            se["median_first_start_s"] + se["median_first_stop_s"],
            ".2f",
            None,
            f"(start {se['median_first_start_s']:.2f}, stop {se['median_first_stop_s']:.2f}; "
            f"medians of {se['clusters']} clusters: its workers import the collector)",
        )
    h = res.get("hook", {})
    add(
        "2 hook cost (us/transition, CPU)",
        "<= 1",
        h.get("added_us_per_transition"),
        ".2f",
        None if not h else h["added_us_per_transition"] <= 1.0,
    )
    wh = res.get("worker_hook", {})
    add(
        "2 worker's hook cost (us/transition, CPU)",
        "(reference)",
        wh.get("added_us_per_transition"),
        ".2f",
        None,
        f"({wh['added_us_per_task']:.1f} us a task's six transitions, its execution row "
        "included; in a real worker)"
        if wh
        else "",
    )
    s = res.get("store_size", {})
    add(
        "3 store size (B/task)",
        "<= 100",
        s.get("store_bytes_per_task"),
        ".0f",
        None if not s else s["store_bytes_per_task"] <= 100,
        f"({s.get('tasks', '?')} tasks)" if s else "",
    )
    sd = res.get("store_size_demo", {})
    if sd:
        add(
            "3 store size, demo image pipeline (B/task)",
            "<= 100",
            sd.get("store_bytes_per_task"),
            ".0f",
            sd["store_bytes_per_task"] <= 100,
            f"({sd.get('tasks')} tasks, small run: fixed costs dominate)",
        )
    add(
        "3 performance_report HTML (B/task)",
        "(reference)",
        s.get("performance_report_bytes_per_task"),
        ".0f",
        True,
    )
    sc = res.get("scale", {})
    if sc:
        add(
            "4 lost transitions",
            "0",
            sc.get("lost_transitions"),
            "d",
            sc.get("lost_transitions") == 0,
            f"({sc.get('graph_tasks')} tasks, {sc.get('transitions_counted')} transitions)",
        )
        # the last three 1M-task runs kept (the target is for every run, three of them)
        runs = sorted(
            (v for k, v in res.items() if k.startswith("scale") and "extra_peak_rss_mb" in v),
            key=lambda v: str(v.get("when", "")),
        )[-3:]
        extra = [float(v["extra_peak_rss_mb"]) for v in runs]
        add(
            "4 extra peak memory (MB, RSS delta)",
            "<= 64 every run (3 runs)",
            sc.get("extra_peak_rss_mb"),
            ".1f",
            len(extra) == 3 and max(extra) <= 64,
            f"({sc.get('graph_tasks')} tasks; last {len(extra)} runs: "
            + ", ".join(
                f"{x:.1f} ({str(v.get('when'))[:10]})" for x, v in zip(extra, runs, strict=True)
            )
            + ")",
        )
        add(
            "4 open_run().tasks() (s)",
            "<= 2",
            sc.get("tasks_open_s"),
            ".2f",
            sc.get("tasks_open_s", 1e9) <= 2,
            f"({sc.get('tasks_rows')} rows)",
        )
    else:
        out.append(
            (
                "4 scale run (lost transitions, extra memory)",
                "0 lost, <= 64 MB",
                res.get("scale_partial", {}).get("status", "not measured"),
                "?",
            )
        )
    mem = res.get("scheduler_memory", {})
    if mem:
        add(
            "4 extra peak memory by allocation (MB, tracemalloc)",
            "(reference)",
            mem.get("extra_peak_traced_mb"),
            ".1f",
            None,
            f"({mem.get('graph_tasks')} tasks)",
        )
    for key, what in (
        (
            "seal_memory",
            "4 the scheduler group's seal, peak memory by allocation (MB, tracemalloc)",
        ),
        ("seal_memory_append", "4 the same rows appended to a sealed table (Array.append)"),
    ):
        sizes = res.get(key, {}).get("sizes", [])
        if sizes:
            big = max(sizes, key=lambda r: r["tasks"])
            add(
                what,
                "(reference)",
                big.get("peak_traced_mb"),
                ".0f",
                None,
                f"({big['tasks']} tasks, {big['transitions']} transitions; "
                f"seal {big['seal_s']:.1f} s)",
            )
    # scale.py measures these in a full run too (inside "scale"): show the newest
    syn = _newest(res.get("scale_synthetic", {}), sc, "synthetic_tasks_open_s")
    if syn:
        add(
            "4 open_run().tasks() (s), synthetic store",
            "<= 2",
            syn.get("synthetic_tasks_open_s"),
            ".1f",
            syn.get("synthetic_tasks_open_s", 1e9) <= 2,
            f"({syn.get('synthetic_rows')} rows, wall)",
        )
    w = _newest(
        res.get("writer", {}),
        {**sc.get("writer", {}), "when": sc.get("when")},
        "records_per_s",
    )
    if w:
        add(
            "4 writer (records/s, wall)",
            ">= 4M",
            w.get("records_per_s"),
            ".3g",
            w.get("records_per_s", 0) >= 4e6,
            f"({w.get('rows')} rows)",
        )
        add(
            "4 writer (records/CPU-s)",
            ">= 4M",
            w.get("records_per_cpu_s"),
            ".3g",
            w.get("records_per_cpu_s", 0) >= 4e6,
        )
    y = res.get("yappi", {})
    if y.get("status") == "measured":
        ip, cd = y.get("image_pipeline", {}), y.get("call_dense", {})
        add(
            "5 yappi on, image pipeline",
            "<= 1.5",
            ip.get("ratio_yappi"),
            ".3f",
            ip.get("ratio_yappi", 9) <= 1.5,
        )
        add(
            "5 yappi, tag per task, no event loop, image pipeline",
            "<= 1.5",
            ip.get("ratio_yappi_no_loop"),
            ".3f",
            ip.get("ratio_yappi_no_loop", 9) <= 1.5,
        )
        add(
            "5 yappi light (prefix tags, no event loop), image pipeline",
            "<= 1.5",
            ip.get("ratio_yappi_light"),
            ".3f",
            ip.get("ratio_yappi_light", 9) <= 1.5,
        )
        add(
            "5 yappi on, call-dense Python",
            "(report)",
            cd.get("ratio_yappi"),
            ".2f",
            None,
            f"({_f(cd.get('ns_per_call'), '.0f')} ns/call)",
        )
    else:
        out.append(("5 yappi on", "<= 1.5", y.get("status", "not measured"), "?"))
    return out


def table(res: dict[str, Any]) -> str:
    lines = ["| figure | target | measured | ok? |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows(res)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--table", action="store_true")
    a = p.parse_args(argv)
    if not a.table:
        for script, args in (QUICK if a.quick else FULL).items():
            t0 = time.perf_counter()
            print(f"== {script} {' '.join(args)}", file=sys.stderr, flush=True)
            rc = subprocess.call(
                [sys.executable, os.path.join(HERE, script), *args],
                stdout=subprocess.DEVNULL,
            )
            print(
                f"   rc={rc} in {time.perf_counter() - t0:.0f}s",
                file=sys.stderr,
                flush=True,
            )
    with open(RESULTS) as f:
        res = json.load(f)
    t = table(res)
    print(t)
    cmd = (
        "python benchmarks/run_all.py"
        + (" --quick" if a.quick else "")
        + (" --table" if a.table else "")
    )
    with open(os.path.join(HERE, "RESULTS.md"), "w") as f:
        f.write(
            f"# Benchmark results\n\nProduced by `{cmd}` (see benchmarks/results.json for the raw "
            f"numbers, per-repeat times and machine load).\n\n{t}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
