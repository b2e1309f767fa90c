"""Issue 62's targets in one table: two source trees alternated in one run, medians.

The store of one tree (before the change) against another's (after it). Each measurement
runs in a subprocess with ``PYTHONPATH`` set to the tree it measures (its LocalCluster's
workers inherit it), so one checkout of the benchmarks measures two checkouts of the
package. ``--before`` and ``--after`` are each a tree or a git ref (defaults: ``main``, and
the tree this script is in); a ref is exported with ``git archive`` into a temporary
directory (nothing is registered in the repository's git directory, nothing is left
behind), and a tree whose ``pyproject.toml`` declares C extensions has them built in place
first. Every measurement runs ``--rounds`` times per tree, the two trees taking turns (the
order rotates each round), and the table gives the median of each tree's rounds.

Rows (the scripts they reuse):

- files created per process per flush after its first, and CPU per flush of 707 rows: a
  worker group's flushes traced with ``strace`` and timed as ``metadata_ops.py`` does;
- the demo's session end (its final flushes and seal): the ``metacollect demo`` pipeline
  inside ``collect`` on a 2-worker LocalCluster, the time from the end of its work to the
  end of the ``with collect`` block;
- a ``--tasks`` run's seal time and traced peak memory: ``seal_memory.py``'s child;
- overhead host-normalized (wall seconds per second of the tasks' own CPU) on both of
  ``overhead.py``'s workloads, beside ``performance_report``'s, and the store's bytes per
  task of the tiny-task run: ``overhead.run_workload``;
- ``store/`` line count, whether the tree builds C, files naming ``zarr.json`` outside
  zarr-python: read from the tree.

    python benchmarks/store_targets.py [--before REF_OR_TREE] [--after TREE] [--rounds 3]
        [--tasks 1000000] [--tiny 30000] [--array-size 8000] [--repeats 5]
        [--demo-images 16] [--demo-size 512] [--only files cpu demo seal overhead]

Quick check of the script itself (minutes): ``--rounds 1 --tasks 50000 --tiny 3000
--array-size 2000 --repeats 2 --demo-images 4 --demo-size 256``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from typing import Any

import _common

HERE = _common.HERE
REPO = os.path.dirname(HERE)
KINDS = ("files", "cpu", "demo", "seal", "overhead")


# -- children: run with PYTHONPATH=<tree>, print one RESULT line ------------------------------
def _group(store: str) -> Any:
    """A worker group of a new store, as a worker's collector makes it (the writer's API)."""
    from metacollect.store.writer import StoreWriter

    writer = StoreWriter(store)
    return writer.group(
        "worker", attrs={"name": "0", "pid": os.getpid()}, cluster="bench", worker="w0"
    )


def files_driver(store: str, flushes: int, tasks: int) -> None:
    """Traced: one worker group, ``flushes`` flushes of ``tasks`` tasks' rows, each flush
    between two of ``metadata_ops``' phase markers."""
    from metadata_ops import _mark, worker_rows

    _mark("setup-start-0")
    group = _group(store)
    _mark("setup-end-0")
    for f in range(flushes):
        for table, cols in worker_rows(0, f, tasks).items():
            group.append(table, cols)
        _mark(f"flush-start-{f}")
        group.flush()
        _mark(f"flush-end-{f}")


def child_files(flushes: int, tasks: int) -> dict[str, Any]:
    """Files created, and other metadata operations, per flush after the first, as strace
    sees them (``metadata_ops``' trace and counting)."""
    from metadata_ops import KINDS as OPS
    from metadata_ops import STRACE, TRACE, _count

    if not os.path.exists(STRACE):
        raise SystemExit("store_targets: strace not found; install it (apt-get install strace)")
    work = tempfile.mkdtemp(prefix="mc-targets-files-")
    try:
        trace = os.path.join(work, "trace.txt")
        cmd = [STRACE, "-f", "-qq", "-e", TRACE, "-o", trace, sys.executable, __file__]
        cmd += ["--files-driver", os.path.join(work, "s.zarr"), str(flushes), str(tasks)]
        subprocess.run(cmd, check=True)
        phases = _count(trace)[0]
        later = [c for ph, c in phases.items() if ph.startswith("flush-") and ph != "flush-0"]
        return {
            "flushes": flushes,
            "first_flush": phases.get("flush-0", {}),
            "per_later_flush": {k: statistics.mean(c[k] for c in later) for k in OPS},
            "created_max": max(c["created"] for c in later),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def child_cpu(flushes: int, tasks: int) -> dict[str, Any]:
    """CPU per flush of a worker group with ``tasks`` tasks' rows (100: 707 rows)."""
    from metadata_ops import flush_cpu

    work = tempfile.mkdtemp(prefix="mc-targets-cpu-")
    try:
        return flush_cpu(work, flushes, tasks)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def child_demo(images: int, size: int) -> dict[str, Any]:
    """The demo pipeline collected on a 2-worker LocalCluster (2 threads each, as
    ``metacollect demo``): the session's end, from the end of the work to the end of the
    ``with collect`` block (final flushes, each process's seal, the run's seal)."""
    from distributed import Client, LocalCluster

    from metacollect import collect, open_run
    from metacollect.demo import run_demo

    work = tempfile.mkdtemp(prefix="mc-targets-demo-")
    store = os.path.join(work, "demo.zarr")
    try:
        with (
            LocalCluster(
                n_workers=2,
                threads_per_worker=2,
                processes=True,
                dashboard_address=None,
                silence_logs=40,
            ) as cluster,
            Client(cluster) as client,
        ):
            with collect(client, store):
                t_work = time.perf_counter()
                run_demo(work, n_images=images, size=size)
                t0 = time.perf_counter()
            end = time.perf_counter() - t0
        run = open_run(store)
        tasks = len(run.tasks())
        return {
            "end_s": end,
            "work_s": t0 - t_work,
            "tasks": tasks,
            "status": run.attrs.get("status"),
            "store_bytes": _common.du(store),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def child_seal(tasks: int, traced: bool) -> dict[str, Any]:
    """``seal_memory.py``'s measurement: a ``tasks``-task run's transitions sealed."""
    from seal_memory import child

    return child(tasks, traced)


def child_overhead(workload: str, size: int, repeats: int) -> dict[str, Any]:
    """``overhead.py``'s measurement of one workload, its host-normalized figures kept."""
    import overhead

    graph = overhead.tiny_graph(size) if workload == "tiny" else overhead.array_graph(size)
    work = tempfile.mkdtemp(prefix="mc-targets-overhead-")
    try:
        r = overhead.run_workload(workload, graph, repeats, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    s = r["spread"]
    return {
        "tasks": r["tasks_in_graph"],
        "collected_host_normalized": s["collected_host_normalized"]["median"],
        "performance_report_host_normalized": s["performance_report_host_normalized"]["median"],
        "ratio_collected": r["ratio_collected"],
        "ratio_performance_report": r["ratio_performance_report"],
        "store_bytes_per_task": r["store_bytes_per_task"],
        "flush_cpu_ms_per_flush": r["flush_cpu_ms_per_flush"],
    }


CHILDREN = {
    "files": child_files,
    "cpu": child_cpu,
    "demo": child_demo,
    "seal": child_seal,
    "overhead": child_overhead,
}


# -- the trees --------------------------------------------------------------------------------
def static_facts(tree: str) -> dict[str, Any]:
    """What the tree says without running: ``store/``'s lines (Python, C and stubs), whether
    it builds C, and the package's files outside zarr-python that name ``zarr.json``."""
    store = os.path.join(tree, "metacollect", "store")
    lines, c_sources = 0, []
    for root, _, files in os.walk(store):
        for f in files:
            if f.endswith((".py", ".c", ".h", ".pyi")):
                with open(os.path.join(root, f), errors="replace") as fh:
                    lines += sum(1 for _ in fh)
            if f.endswith((".c", ".h")):
                c_sources.append(f)
    with open(os.path.join(tree, "pyproject.toml")) as fh:
        ext_modules = "ext-modules" in fh.read()
    naming = []
    for root, _, files in os.walk(os.path.join(tree, "metacollect")):
        for f in files:
            if f.endswith((".py", ".c")):
                path = os.path.join(root, f)
                with open(path, errors="replace") as fh:
                    if "zarr.json" in fh.read():
                        naming.append(os.path.relpath(path, tree))
    return {
        "store_lines": lines,
        "c_sources": c_sources,
        "builds_c": ext_modules or bool(c_sources),
        "files_naming_zarr_json": sorted(naming),
    }


@contextlib.contextmanager
def tree_of(ref: str) -> Iterator[str]:
    """A directory holding ``ref``: itself if it is a directory, else the commit exported
    from this repository with ``git archive`` into a temporary directory (removed after);
    its C extensions, if it declares any, built in place."""
    if os.path.isdir(ref):
        yield os.path.abspath(ref)
        return
    tmp = tempfile.mkdtemp(prefix="mc-targets-tree-")
    try:
        archive = subprocess.run(
            ["git", "-C", REPO, "archive", "--format=tar", ref],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        if static_facts(tmp)["builds_c"]:
            _common.log(f"store_targets: building {ref}'s C extensions")
            build_extensions(tmp)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_extensions(tree: str) -> None:
    """The tree's compiled modules put beside their sources: built into a wheel by pip (its
    build backend, in an isolated environment, as an install builds them), then taken
    out of it."""
    dist = tempfile.mkdtemp(prefix="mc-targets-wheel-")
    try:
        cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, tree]
        subprocess.run(cmd, check=True, capture_output=True)
        (wheel,) = (os.path.join(dist, f) for f in os.listdir(dist) if f.endswith(".whl"))
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tree, [n for n in z.namelist() if n.endswith(".so")])
    finally:
        shutil.rmtree(dist, ignore_errors=True)


def run_child(tree: str, kind: str, **kwargs: Any) -> dict[str, Any]:
    """One measurement in a subprocess that imports ``tree``'s package; its error's last
    line if it failed (a tree may not have what a measurement uses)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, HERE])}
    cmd = [sys.executable, __file__, "--child", kind, json.dumps(kwargs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return {"error": err[-1] if err else f"exit status {proc.returncode}"}
    return json.loads(lines[-1][len("RESULT ") :])


def alternated(
    trees: dict[str, str], rounds: int, kind: str, **kwargs: Any
) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` runs of one measurement per tree, the trees taking turns."""
    names = list(trees)
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            out[n].append(run_child(trees[n], kind, **kwargs))
            _common.log(f"  {kind} {kwargs} round {r + 1}/{rounds} {n}: {out[n][-1]}")
    return out


def med(runs: list[dict[str, Any]], *path: str) -> float | None:
    """Median over the runs of the value at ``path`` (runs that failed left out)."""
    vals = []
    for r in runs:
        v: Any = r
        for p in path:
            v = v.get(p) if isinstance(v, dict) else None
        if isinstance(v, int | float):
            vals.append(float(v))
    return statistics.median(vals) if vals else None


def measure(trees: dict[str, str], labels: dict[str, str], a: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of ``a.only`` (all by default), each saved in results.json as soon
    as it is done (a run cut short keeps what it measured: ``--table`` prints it)."""
    res = Partial({"static": {n: static_facts(t) for n, t in trees.items()}})
    res["trees"] = labels
    res["args"] = vars(a)
    kinds = a.only or KINDS
    if "files" in kinds:
        res["files"] = alternated(trees, a.rounds, "files", flushes=a.flushes, tasks=100)
    if "cpu" in kinds:
        res["cpu"] = alternated(trees, a.rounds, "cpu", flushes=a.cpu_flushes, tasks=100)
    if "demo" in kinds:
        res["demo"] = alternated(trees, a.rounds, "demo", images=a.demo_images, size=a.demo_size)
    if "seal" in kinds:
        for mode in ("timed", "traced"):
            res[f"seal_{mode}"] = alternated(
                trees, a.rounds, "seal", tasks=a.tasks, traced=mode == "traced"
            )
    if "overhead" in kinds:
        res["overhead_tiny"] = alternated(
            trees, a.rounds, "overhead", workload="tiny", size=a.tiny, repeats=a.repeats
        )
        res["overhead_array"] = alternated(
            trees, a.rounds, "overhead", workload="array", size=a.array_size, repeats=a.repeats
        )
    return dict(res)


class Partial(dict[str, Any]):
    """The results so far: each measurement added is saved at once."""

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        _common.save("store_targets", dict(self), echo=False)


# -- the table --------------------------------------------------------------------------------
def _fmt(v: Any, fmt: str) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return format(v, fmt)


def _errors(res: dict[str, Any], key: str, name: str) -> str:
    errs = {r["error"] for r in res.get(key, {}).get(name, []) if "error" in r}
    return f" (failed: {'; '.join(sorted(errs))})" if errs else ""


def rows(res: dict[str, Any], names: list[str], a: argparse.Namespace) -> list[list[str]]:
    """``[target, goal, <one cell per tree>, met by the last tree]`` per row."""
    out: list[list[str]] = []

    def add(label: str, goal: str, key: str, path: tuple[str, ...], fmt: str, ok: Any) -> None:
        if key not in res and key != "static":
            return
        vals = [
            (res["static"][n].get(path[0]) if key == "static" else med(res[key][n], *path))
            for n in names
        ]
        cells = [
            _fmt(v, fmt) + ("" if key == "static" else _errors(res, key, n))
            for v, n in zip(vals, names, strict=True)
        ]
        last = vals[-1]
        met = "?" if last is None or ok is None else ("yes" if ok(last, res, names) else "NO")
        out.append([label, goal, *cells, met])

    add(
        "`store/` lines (.py, .c, .pyi)",
        "<= 3,500",
        "static",
        ("store_lines",),
        ",d",
        lambda v, *_: v <= 3500,
    )
    add("C built at install", "no", "static", ("builds_c",), "", lambda v, *_: not v)
    naming = [len(res["static"][n]["files_naming_zarr_json"]) for n in names]
    out.append(
        ["package files naming `zarr.json` (a pointer: readers too)", "(0 written)"]
        + [str(k) for k in naming]
        + ["?"]
    )
    add(
        "files created per process per flush after its first",
        "0",
        "files",
        ("per_later_flush", "created"),
        ".1f",
        lambda v, *_: v == 0,
    )
    add(
        "  other metadata ops per later flush (stats)",
        "(reference)",
        "files",
        ("per_later_flush", "stats"),
        ".1f",
        None,
    )
    add(
        "CPU per flush of 707 rows (ms)",
        "<= 1",
        "cpu",
        ("cpu_ms_median",),
        ".2f",
        lambda v, *_: v <= 1,
    )
    add(
        f"demo ({a.demo_images} images of {a.demo_size}px): session's end (s)",
        "<= 0.3",
        "demo",
        ("end_s",),
        ".3f",
        lambda v, *_: v <= 0.3,
    )
    add(
        f"{a.tasks:,}-task run's seal (s)",
        "no slower than before",
        "seal_timed",
        ("seal_s",),
        ".2f",
        _no_more(res, "seal_timed", ("seal_s",), names),
    )
    add(
        f"{a.tasks:,}-task run's seal, traced peak (MB)",
        "no larger than before",
        "seal_traced",
        ("peak_traced_mb",),
        ".0f",
        _no_more(res, "seal_traced", ("peak_traced_mb",), names),
    )
    add(
        "  its peak in Arrow's memory pool (MB, which tracemalloc does not see)",
        "(reference)",
        "seal_traced",
        ("arrow_peak_mb",),
        ".0f",
        None,
    )
    add(
        "  its growth of the process's peak RSS (MB, untraced run)",
        "(reference)",
        "seal_timed",
        ("rss_growth_mb",),
        ".0f",
        None,
    )
    for key, label, limit in (
        ("overhead_array", f"overhead, array {a.array_size}² (>= 10 ms tasks)", 1.02),
        ("overhead_tiny", f"overhead, {a.tiny:,} tiny tasks", 1.03),
    ):
        add(
            f"{label}, host-normalized",
            f"<= {limit} and <= performance_report's",
            key,
            ("collected_host_normalized",),
            ".3f",
            _overhead_ok(key, limit, names),
        )
        add(
            "  performance_report's, host-normalized",
            "(reference)",
            key,
            ("performance_report_host_normalized",),
            ".3f",
            None,
        )
    add(
        f"store bytes per task ({a.tiny:,} tiny tasks)",
        "<= 100",
        "overhead_tiny",
        ("store_bytes_per_task",),
        ".1f",
        lambda v, *_: v <= 100,
    )
    return out


def _no_more(res: dict[str, Any], key: str, path: tuple[str, ...], names: list[str]) -> Any:
    def ok(v: float, *_: Any) -> bool:
        first = med(res[key][names[0]], *path) if key in res else None
        return first is None or v <= first

    return ok


def _overhead_ok(key: str, limit: float, names: list[str]) -> Any:
    def ok(v: float, res: dict[str, Any], _: Any) -> bool:
        pr = med(res[key][names[-1]], "performance_report_host_normalized")
        return v <= limit and (pr is None or v <= pr)

    return ok


def table(
    res: dict[str, Any], names: list[str], labels: dict[str, str], a: argparse.Namespace
) -> str:
    head = ["target", "goal", *(f"{n}: {labels[n]}" for n in names), f"met ({names[-1]})?"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(res, names, a)]
    lines.append(
        f"\nmedians of {a.rounds} round(s) per tree, the trees alternated; host: "
        f"{os.cpu_count()} cores, load average "
        f"{res.get('load_avg_1min', os.getloadavg()[0]):.1f} at the end"
    )
    return "\n".join(lines)


def describe(ref: str, tree: str) -> str:
    """The commit a tree is at (and whether its work tree has changes), or the ref."""
    if not os.path.isdir(ref):
        rev = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "--short", ref], capture_output=True, text=True
        ).stdout.strip()
        return f"{ref} ({rev})" if rev else ref
    rev = subprocess.run(
        ["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", tree, "status", "--porcelain", "--", "metacollect"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{tree} at {rev or '?'}{' + changes' if dirty else ''}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default="main", help="a tree, or a git ref (default main)")
    p.add_argument("--after", default=REPO, help="a tree, or a git ref (default: this tree)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--flushes", type=int, default=6, help="traced flushes (files row)")
    p.add_argument("--cpu-flushes", type=int, default=60)
    p.add_argument("--demo-images", type=int, default=16)
    p.add_argument("--demo-size", type=int, default=512)
    p.add_argument("--tasks", type=int, default=1_000_000, help="the seal's run size")
    p.add_argument("--tiny", type=int, default=30_000)
    p.add_argument("--array-size", type=int, default=8000)
    p.add_argument("--repeats", type=int, default=5, help="overhead.py's repeats per round")
    p.add_argument("--only", nargs="+", choices=KINDS)
    p.add_argument(
        "--table", action="store_true", help="only print the table of the last run's results"
    )
    a = p.parse_args(argv)
    if a.table:
        res = _common.load()["store_targets"]
        labels = res["trees"]
        print(table(res, list(labels), labels, argparse.Namespace(**res["args"])))
        return res
    with tree_of(a.before) as before, tree_of(a.after) as after:
        trees = {"before": before, "after": after}
        labels = {"before": describe(a.before, before), "after": describe(a.after, after)}
        _common.log(f"store_targets: {labels}")
        res = measure(trees, labels, a)
    print(table(res, list(trees), labels, a))
    return res


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        result = CHILDREN[sys.argv[2]](**json.loads(sys.argv[3]))
        print("RESULT " + json.dumps(result), flush=True)
    elif len(sys.argv) > 1 and sys.argv[1] == "--files-driver":
        files_driver(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
