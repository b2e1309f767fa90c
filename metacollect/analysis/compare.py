"""Runs side by side: one-line summaries, per-prefix, I/O and profile comparisons (the
catalog of the stores under a directory is :mod:`metacollect.analysis.campaign`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from metacollect.analysis import figures
from metacollect.analysis.tasks import prefix_summary
from metacollect.analysis.wall_time import wall_time_breakdown
from metacollect.errors import UsageError

if TYPE_CHECKING:
    from metacollect.analysis.run import Run


def summary(run: Run) -> dict[str, Any]:
    """The main figures of a run as one flat dict (a row of :func:`catalog`).

    Each figure comes from the function the report's tabs show it with
    (:mod:`metacollect.analysis.figures`, :mod:`metacollect.analysis.wall_time`):
    ``compute_time`` is thread-seconds (the task stream), ``utilisation`` the fraction of
    the threads' capacity (threads x wall time) it used, ``transfers`` the transfers
    between workers counted once (at the receiver), ``transfers_to_client`` the results
    sent to a client.
    """
    a = run.attrs
    tasks = run.tasks()
    workers = run.workers()
    wt = wall_time_breakdown(run)
    moved = figures.transfers(run)
    row: dict[str, Any] = {
        "run_id": a.get("run_id"),
        "status": a.get("status"),
        "started": pd.to_datetime(a.get("started"), unit="s") if a.get("started") else pd.NaT,
        "wall_time": wt.wall_s,
        "clusters": len(run.clusters()),
        "workers": len(workers),
        "threads": wt.threads,
        "graphs": len(run.graphs()),
        "tasks": len(tasks),
        "erred": int((tasks["state"] == "erred").sum()) if len(tasks) else 0,
        "compute_time": figures.compute_seconds(run),
        "prefixes": int(tasks["prefix"].nunique()) if len(tasks) else 0,
        "transfers": moved.between_workers,
        "transfer_bytes": moved.between_workers_bytes,
        "transfers_to_client": moved.to_client,
        "errors": len(run.errors()),
        "utilisation": wt.utilisation,
    }
    script = run.groups.get("script")
    row["script"] = os.path.basename(script.get("path", "")) if script else ""
    row["path"] = run.path
    return row


def _labels(runs: Sequence[Run], labels: Sequence[str] | None) -> list[str]:
    if labels is not None:
        if len(labels) != len(runs):
            raise UsageError(
                f"got {len(labels)} labels for {len(runs)} runs; give one label per run"
            )
        return list(labels)
    names = [os.path.basename(os.path.normpath(r.path)) for r in runs]
    return names if len(set(names)) == len(names) else [f"{i}:{n}" for i, n in enumerate(names)]


def compare(runs: Sequence[Run], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Main figures of several runs side by side (one row per run, see :func:`summary`)."""
    rows = [summary(r) for r in runs]
    return pd.DataFrame(rows, index=pd.Index(_labels(runs, labels), name="run"))


def compare_prefixes(
    runs: Sequence[Run], labels: Sequence[str] | None = None, stat: str = "total"
) -> pd.DataFrame:
    """Per-prefix compute time of several runs: index prefix, one column per run.

    ``stat`` is a column of :func:`prefix_summary` (total, mean, median, max, n).
    """
    cols = {
        lab: prefix_summary(r)[stat] for lab, r in zip(_labels(runs, labels), runs, strict=False)
    }
    out = pd.DataFrame(cols)
    out.index.name = "prefix"
    return out.fillna(0).sort_values(next(iter(cols)), ascending=False)


def compare_io(runs: Sequence[Run], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Darshan I/O totals of several runs (POSIX + STDIO): one row per run.

    Columns bytes_read, bytes_written, reads, writes, opens, read_time, write_time,
    meta_time; zeros for a run collected without Darshan (its ``has_io`` is False).
    """
    cols = ("bytes_read", "bytes_written", "reads", "writes", "opens", "read_time",
            "write_time", "meta_time")  # fmt: skip
    rows = []
    for r in runs:
        try:
            io = r.io(by="worker")
        except Exception:  # a run without Darshan data
            io = pd.DataFrame()
        row = {c: float(io[c].sum()) if c in io else 0.0 for c in cols}
        row["has_io"] = bool(len(io))
        rows.append(row)
    return pd.DataFrame(rows, index=pd.Index(_labels(runs, labels), name="run"))


def compare_profiles(
    runs: Sequence[Run], labels: Sequence[str] | None = None, top: int | None = 20
) -> pd.DataFrame:
    """Yappi self time per function in several runs, and its change against the first run.

    Index ``module:name``; one ``tsub`` column per run (seconds, summed over processes and
    threads), then ``delta_<label>`` (that run minus the first) for the others; the ``top``
    functions by their largest self time in any run (``None``: all of them). Idle waits
    (``Run.profile``'s ``idle`` rows: threads waiting for work) are left out.
    """
    labs = _labels(runs, labels)
    per_run = {}
    for lab, r in zip(labs, runs, strict=True):
        prof = r.profile()
        if "idle" in prof.columns:
            prof = prof[~prof["idle"].astype(bool)]
        if len(prof):
            name = prof["module"].astype(str) + ":" + prof["name"].astype(str)
            per_run[lab] = prof["tsub"].groupby(name).sum()
        else:
            per_run[lab] = pd.Series(dtype=float)
    out = pd.DataFrame(per_run).fillna(0.0)
    out.index.name = "function"
    for lab in labs[1:]:
        out[f"delta_{lab}"] = out[lab] - out[labs[0]]
    if not len(out):
        return out
    order = out[labs].max(axis=1).sort_values(ascending=False).index
    return out.loc[order if top is None else order[:top]]
