"""``metacollect info STORE``: the run's tree by level and step, with row counts and sizes."""

from __future__ import annotations

import argparse
import datetime
import math
import os
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("info", help="show a store's tree by level and step", description=__doc__)
    p.add_argument("store", help="path of the store")
    return p


def _size(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, f))
            except OSError:
                continue
    return total


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _when(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "-"
    return datetime.datetime.fromtimestamp(t).isoformat(sep=" ", timespec="seconds")


def _status(a: dict[str, Any]) -> list[str]:
    """The status line and what it means, how the script ended when it did not succeed, and
    what the record is missing."""
    status = str(a.get("status"))
    why = {
        "complete": "",
        "failed": "the script failed; everything up to then is recorded",
        "interrupted": "a signal ended the script; everything up to then is recorded",
    }.get(status)
    if why is None:  # incomplete: sealed with what is missing, or never sealed
        why = "the record is missing something" if a.get("missing") else ""
        why = why or "collection did not finish: data up to the last flush"
    lines = [f"run {a.get('run_id')}  status: {status}" + (f"  ({why})" if why else "")]
    error = a.get("script_exception") or a.get("workflow_error")
    code = a.get("script_exit_code")
    if error or a.get("script_signal") or code:
        end = error or a.get("script_signal") or f"exit code {code}"
        lines.append(f"  ended by: {end}" + (f" (exit code {code})" if code and error else ""))
    lines += [f"  missing: {m}" for m in a.get("missing") or []]
    return lines


#: tables whose rows are joins and leaves (``add``/``remove``), with the column naming who
#: joined: counted as who joined, not as rows
JOINS = {"workers": ("address", "pid"), "clients": ("client",)}


def _joins(run: Any, path: str, table: str) -> str:
    """``workers=2 (joined 2, left 2)``: who joined, then the joins and leaves."""
    df = run.table(path, table, columns=["event", *JOINS[table]])
    adds = df[df.event == "add"]
    who = len(adds.drop_duplicates(list(JOINS[table])))
    return f"{table}={who} (joined {len(adds)}, left {int((df.event == 'remove').sum())})"


def _batch_jobs(run: Any) -> list[str]:
    """``batch jobs (slurm): 4 - COMPLETED 2, CANCELLED 1, running at the end 1``: how the
    jobs ended (``run.jobs()``)."""
    batch = run.groups.get("job/batch")
    if batch is None:
        return []
    jobs = run.jobs()
    states = jobs.end_state.where(jobs.end_state != "", "running at the end").value_counts()
    how = ", ".join(f"{state} {n}" for state, n in states.items())
    return [f"batch jobs ({batch.get('batch_system')}): {len(jobs)}" + (f" - {how}" if how else "")]


def _processes(n: int) -> str:
    return f"{n} {'process' if n == 1 else 'processes'}"


def _collector_cost(run: Any) -> list[str]:
    """``collecting cost: flushes 0.21 CPU-s of 31.4 (0.7 %) in 3 processes, 30 flushes
    (slowest 26 ms CPU), ...``: the collector's own flushing against the CPU of the
    processes it ran in (:func:`~metacollect.analysis.collector.collector_totals`), and why
    the processes that did not say did not: killed before their end, or a store written
    before the cost was recorded."""
    # imported here, off the CLI's start-up: the analysis (xarray, pandas)
    from metacollect.analysis.collector import collector_totals

    if not len(run.collector_cost()):
        return []
    c = collector_totals(run)
    line = "collecting cost: "
    if c["processes"]:
        share = f" ({100 * c['share']:.2f} %)" if c["process_cpu_s"] > 0 else ""
        slowest = c["slowest_cpu_s"]
        each = "" if math.isnan(slowest) else f" (slowest {1000 * slowest:.0f} ms CPU)"
        line += (
            f"flushes {c['flush_cpu_s']:.2f} CPU-s of {c['process_cpu_s']:.1f}{share} in "
            f"{_processes(c['processes'])}, {c['flushes']} flushes{each}, "
            f"longest gap {c['longest_gap_s']:.1f} s"
        )
    why = {
        "killed before the collection's end": c["killed"],
        "not recorded: a store written before collector_cost": c["older"],
    }
    for reason, n in why.items():
        if n:
            line += ("" if line.endswith(": ") else "; ") + (
                f"{_processes(n)} did not say ({reason})"
            )
    return [line]


def describe(store: str) -> list[str]:
    """Lines of the ``info`` output."""
    # imported here, off the CLI's start-up: the store reader (xarray, pandas)
    from metacollect.analysis.run import open_run

    run = open_run(store)
    a = run.attrs
    clusters = len(run.clusters())  # first: a damaged group is named by its path
    seen, recorded = len(run.workers()), len(run.worker_groups())
    workers = f"{seen}" + (f" ({recorded} with a record of their own)" if recorded != seen else "")
    lines = [
        *_status(a),
        f"started {_when(a.get('started'))}  ended {_when(a.get('ended'))}  "
        f"metacollect {a.get('metacollect_version')}  schema {a.get('schema_version')}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in (a.get("versions") or {}).items()),
        f"clusters: {clusters}  workers: {workers}  "
        f"size: {_human(_size(store)) if os.path.isdir(store) else '?'}",
        *_batch_jobs(run),
        *_collector_cost(run),
        "",
    ]
    levels = run.levels()
    by_step: dict[int, list[tuple[str, str]]] = {}
    for level, paths in levels.items():
        for p in paths:
            by_step.setdefault(run.groups.get(p, {}).get("step", 0) if p else 0, []).append(
                (level, p)
            )
    for step in sorted(by_step):
        lines.append(f"step {step}: {run.schema.steps.get(step, '')}")
        for level, path in sorted(by_step[step], key=lambda t: t[1]):
            spec = run.schema.match(path)
            tables = []
            for t in spec.tables if spec else {}:
                try:
                    n = run.committed(path, t)
                except Exception:  # damaged metadata: say so, keep describing the rest
                    tables.append(f"{t}=DAMAGED")
                    continue
                if n is None:
                    continue
                if t in JOINS and n:
                    tables.append(_joins(run, path, t))
                elif n or t != "errors":
                    tables.append(f"{t}={n}")
            lines.append(f"  [{level}] /{path}" + (f"  {' '.join(tables)}" if tables else ""))
    errors = run.errors()
    if len(errors):
        lines += [
            "",
            f"{len(errors)} collector error(s) recorded; "
            f"first: {errors.iloc[0]['where']}: {errors.iloc[0]['what']}",
        ]
    return lines


def run(args: argparse.Namespace) -> int:
    for line in describe(args.store):
        print(line)
    return 0
