"""Scaling studies: how a workflow's time, per-prefix time, transfers, I/O and memory change
with the workers, threads or nodes it ran on, from a series of runs of it.

Strong scaling (the same work on more resources): the ideal time falls as ``1/n``, so the
efficiency at ``n`` is ``T(ref) * ref / (T(n) * n)`` and totals (compute seconds, bytes moved,
bytes read) should stay as they are. Weak scaling (the work grows with the resources): the
ideal time stays, the efficiency is ``T(ref) / T(n)`` and totals grow as ``n``. ``ref`` is
the smallest ``n`` of the series.

Time is the run's makespan (its first task's start to its last task's stop, on the
scheduler's clock): the run's ``wall_time`` also holds the collection's start and end, the
same at every size. A prefix's time is its span (its first start to its last stop).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from metacollect.analysis.campaign import find_stores
from metacollect.analysis.run import Run, open_run
from metacollect.analysis.tasks import prefix_summary, wall_time
from metacollect.errors import UsageError

__all__ = ["RESOURCES", "Scaling", "scaling"]

#: what a series can be scaled against: a column of :attr:`Scaling.runs`
AXES = ("workers", "threads", "nodes")
#: the totals checked for growth: column, what it is, unit
RESOURCES = (
    ("compute_time", "compute seconds (all tasks)", "s"),
    ("transfer_bytes", "bytes transferred between workers", "B"),
    ("io_bytes", "bytes read and written (Darshan)", "B"),
    ("memory_peak", "the peak memory of a worker (its process's RSS)", "B"),
)


@dataclass
class Scaling:
    """A scaling study of a series of runs (see :func:`scaling`).

    Attributes
    ----------
    kind, by, threshold, growth
        As passed to :func:`scaling`.
    runs
        One row per size ``n`` (runs of the same size: their median), by ``n``: label,
        path, repeats, workers, threads, nodes, makespan, wall_time, speedup, efficiency,
        the totals of :data:`RESOURCES`, and the seconds spent on transfers
        (``transfer_time``, summed over them) and on I/O (``io_time``, Darshan).
    prefixes
        One row per (prefix, n): tasks, total (compute seconds), span, share (of the
        makespan), efficiency (of its span), growth (of its compute seconds against the
        ideal).
    resources
        One row per (resource, n): value, ideal, growth (value over the ideal).
    limits
        What stops scaling, most telling first: what (``makespan``, ``prefix X`` or a
        resource), stops_at (the first size where it fails), value (the efficiency, or the
        growth),
        detail (one sentence). A total is named when it exceeds its ideal by ``growth``:
        the same at every size (strong) or growing as ``n`` (weak); a worker's peak memory
        (its process's resident size) stays the same in both.
    """

    kind: str
    by: str
    threshold: float
    growth: float
    runs: pd.DataFrame
    prefixes: pd.DataFrame
    resources: pd.DataFrame
    limits: pd.DataFrame = field(default_factory=pd.DataFrame)

    def verdict(self) -> str:
        """One sentence: where the series stops scaling and the first reason, or that it
        scales over the whole series."""
        runs = self.runs
        top = runs.index.max()
        eff = float(runs.loc[top, "efficiency"])
        head = self.limits[self.limits["what"] == "makespan"]
        if not len(head):
            return (
                f"{self.kind} scaling holds from {runs.index.min()} to {top} {self.by}: "
                f"efficiency {eff:.2f} at {top} (threshold {self.threshold:.2f})"
            )
        at = int(head["stops_at"].iloc[0])
        why = self.limits[self.limits["what"] != "makespan"]
        cause = f"; first cause: {why['detail'].iloc[0]}" if len(why) else ""
        return (
            f"{self.kind} scaling stops at {at} {self.by}: makespan efficiency "
            f"{float(head['value'].iloc[0]):.2f} < {self.threshold:.2f}{cause}"
        )

    def table(self) -> str:
        """The study as text: the runs, then what stops scaling."""
        cols = ["label", "makespan", "speedup", "efficiency", "compute_time",
                "transfer_bytes", "io_bytes", "memory_peak"]  # fmt: skip
        runs = self.runs[[c for c in cols if c in self.runs]]
        lines = [f"{self.kind} scaling against {self.by}", runs.to_string(float_format=_fmt), ""]
        lines.append(self.verdict())
        lines += [f"  - {d}" for d in self.limits["detail"]] if len(self.limits) else []
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _fmt(x: float) -> str:
    if abs(x) >= 1e6:
        return f"{x:.3g}"
    return f"{x:.3f}"


def _as_runs(series: Any, labels: Sequence[str] | None) -> tuple[list[Run], list[str]]:
    """Runs and their labels from runs, store paths, a directory of stores or a catalog."""
    if isinstance(series, pd.DataFrame):
        if "path" not in series:
            raise UsageError("the table has no 'path' column; pass a catalog() or store paths")
        ok = series["problem"] == "" if "problem" in series else slice(None)
        items: list[Any] = list(series.loc[ok, "path"])
    elif isinstance(series, str | os.PathLike):
        path = os.fspath(series)
        if os.path.isfile(os.path.join(path, "zarr.json")):
            raise UsageError(
                f"{path} is one store; give two stores or more, or the directory of a series"
            )
        items = list(find_stores(path))
    elif isinstance(series, Iterable):
        items = list(series)
    else:
        raise UsageError("pass runs, store paths, a directory of stores or a catalog()")
    runs = [r if isinstance(r, Run) else open_run(r) for r in items]
    if len(runs) < 2:
        raise UsageError(
            f"a scaling study needs two runs or more (got {len(runs)}): give the stores of "
            "a series, or the directory that holds them"
        )
    if labels is None:
        labels = [os.path.basename(os.path.normpath(r.path)) for r in runs]
    elif len(labels) != len(runs):
        raise UsageError(f"got {len(labels)} labels for {len(runs)} runs; give one per run")
    return runs, list(labels)


def _io(run: Run) -> tuple[float, float]:
    """Bytes the workload read and wrote, and the seconds it spent at it (Darshan: reads,
    writes and metadata); NaN for a run without Darshan data."""
    try:
        io = run.io(by="worker")
    except Exception:  # no Darshan record in this run
        return float("nan"), float("nan")
    if not len(io):
        return float("nan"), float("nan")

    def total(*cols: str) -> float:
        return float(sum(io[c].sum() for c in cols if c in io))

    return total("bytes_read", "bytes_written"), total("read_time", "write_time", "meta_time")


def _figures(run: Run) -> tuple[dict[str, Any], pd.DataFrame]:
    """One run's row of :attr:`Scaling.runs` (before the efficiencies) and its prefixes."""
    tasks = run.tasks()
    workers = run.workers().drop_duplicates("address")
    transfers = run.worker_table("transfers")
    if len(transfers) and "direction" in transfers:
        transfers = transfers[transfers["direction"] == "in"]  # each is recorded twice
    metrics = run.worker_metrics()
    io_bytes, io_time = _io(run)
    row = {
        "path": run.path,
        "workers": len(workers),
        "threads": int(workers["nthreads"].sum()) if len(workers) else 0,
        "nodes": int(workers["host"].nunique()) if len(workers) else 0,
        "makespan": float(tasks["stop"].max() - tasks["start"].min()) if len(tasks) else 0.0,
        "wall_time": wall_time(run),
        "tasks": len(tasks),
        "compute_time": float(tasks["duration"].sum()) if len(tasks) else 0.0,
        "transfer_bytes": float(transfers["total"].sum()) if len(transfers) else 0.0,
        "transfer_time": (
            float((transfers["stop"] - transfers["start"]).sum()) if len(transfers) else 0.0
        ),
        "io_bytes": io_bytes,
        "io_time": io_time,
        "memory_peak": (
            float(metrics.groupby(["cluster", "worker_group"])["memory"].max().max())
            if len(metrics) and "memory" in metrics
            else float("nan")
        ),
    }
    per = prefix_summary(run)
    prefixes = pd.DataFrame(
        {
            "tasks": per["n"],
            "total": per["total"],
            "span": per["last_stop"] - per["first_start"],
        }
    )
    prefixes.index.name = "prefix"
    return row, prefixes


def _efficiency(t_ref: Any, t: Any, n_ref: float, n: Any, kind: str) -> Any:
    if kind == "strong":
        return (t_ref * n_ref) / (t * n)
    return t_ref / t


def _ideal(v_ref: Any, n_ref: float, n: Any, kind: str) -> Any:
    """The ideal total at ``n``: the same (strong), or growing as ``n`` (weak)."""
    return v_ref if kind == "strong" else v_ref * n / n_ref


def scaling(
    series: Any,
    *,
    kind: str = "strong",
    by: str = "workers",
    threshold: float = 0.8,
    growth: float = 1.25,
    min_share: float = 0.05,
    labels: Sequence[str] | None = None,
) -> Scaling:
    """A scaling study of a series of runs of one workflow.

    Parameters
    ----------
    series
        Runs, store paths, a directory holding the stores, or a :func:`catalog`.
    kind
        ``"strong"`` (the same work at every size) or ``"weak"`` (work per worker fixed).
    by
        The size: ``"workers"``, ``"threads"`` or ``"nodes"`` (hosts the workers ran on).
    threshold
        The efficiency under which a time stops scaling.
    growth
        How far a total may exceed its ideal (1.25: by a quarter) before it is named.
    min_share
        Prefixes whose span is under this share of the makespan at every size are left
        out of the limits (still in :attr:`Scaling.prefixes`).
    labels
        One label per run (default: the store's directory name).

    Returns
    -------
    Scaling

    Examples
    --------
    >>> study = metacollect.scaling(["w1.zarr", "w2.zarr", "w4.zarr"])   # doctest: +SKIP
    >>> print(study.verdict())                                           # doctest: +SKIP
    >>> study.prefixes.xs(4, level="n").sort_values("efficiency")        # doctest: +SKIP
    """
    if kind not in ("strong", "weak"):
        raise UsageError(f"kind={kind!r}: use 'strong' or 'weak'")
    if by not in AXES:
        raise UsageError(f"by={by!r}: use one of {', '.join(AXES)}")
    runs, labs = _as_runs(series, labels)
    rows, per_prefix = [], []
    for run, lab in zip(runs, labs, strict=True):
        row, pre = _figures(run)
        row["label"] = lab
        rows.append(row)
        per_prefix.append(pre.assign(n=row[by]))
    table = _by_size(pd.DataFrame(rows), by)
    if len(table) < 2:
        raise UsageError(
            f"every run has {table.index[0]} {by}: give runs of two sizes or more, or use "
            f"another size: {' or '.join(f'by={a!r}' for a in AXES if a != by)}"
        )
    n_ref = float(table.index.min())
    ref = table.loc[table.index.min()]
    n = table.index.to_numpy(dtype=float)
    table["speedup"] = ref["makespan"] / table["makespan"]
    table["efficiency"] = _efficiency(ref["makespan"], table["makespan"], n_ref, n, kind)
    prefixes = _prefixes(per_prefix, table, n_ref, kind)
    resources = _resources(table, n_ref, kind)
    study = Scaling(kind, by, threshold, growth, table, prefixes, resources)
    study.limits = _limits(study, min_share)
    return study


def _by_size(df: pd.DataFrame, by: str) -> pd.DataFrame:
    """The runs of each size as one row: the median of repeated runs."""
    g = df.groupby(by)
    numeric = [c for c in df.columns if c not in ("path", "label", by) and df[c].dtype.kind in "if"]
    out = g[numeric].median()
    out.insert(0, "repeats", g.size())
    out.insert(0, "path", g["path"].agg(lambda s: ", ".join(s)))
    out.insert(0, "label", g["label"].agg(lambda s: ", ".join(s)))
    out[by] = out.index
    out.index.name = "n"
    return out.sort_index()


def _prefixes(
    per_prefix: list[pd.DataFrame], table: pd.DataFrame, n_ref: float, kind: str
) -> pd.DataFrame:
    """Per (prefix, n): tasks, total, span (medians over repeats), share, efficiency."""
    long = pd.concat([p.reset_index() for p in per_prefix], ignore_index=True)
    out = long.groupby(["prefix", "n"])[["tasks", "total", "span"]].median()
    makespan = out.index.get_level_values("n").map(table["makespan"]).to_numpy(dtype=float)
    out["share"] = out["span"] / makespan
    first = out.reset_index().groupby("prefix").first().set_index("n", append=True)
    n0 = first.index.get_level_values("n").to_numpy(dtype=float)
    span0 = pd.Series(first["span"].to_numpy(), index=first.index.get_level_values("prefix"))
    total0 = pd.Series(first["total"].to_numpy(), index=span0.index)
    n0s = pd.Series(n0, index=span0.index)
    prefix = out.index.get_level_values("prefix")
    n = out.index.get_level_values("n").to_numpy(dtype=float)
    ref_span = span0.reindex(prefix).to_numpy()
    ref_n = n0s.reindex(prefix).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        out["efficiency"] = _efficiency(ref_span, out["span"].to_numpy(), ref_n, n, kind)
        ideal = _ideal(total0.reindex(prefix).to_numpy(), ref_n, n, kind)
        out["growth"] = out["total"].to_numpy() / ideal
    return out


def _resources(table: pd.DataFrame, n_ref: float, kind: str) -> pd.DataFrame:
    """Per (resource, n): value, ideal and growth against the smallest size."""
    rows = []
    ref = table.iloc[0]
    for col, _, _ in RESOURCES:
        for n, value in table[col].items():
            # a worker's peak memory, its process's baseline in it, should stay as it was
            same = col == "memory_peak"
            ideal = ref[col] if same else _ideal(ref[col], n_ref, float(n), kind)
            g = value / ideal if ideal and ideal == ideal else float("nan")
            if not ideal and value > 0:
                g = float("inf")
            rows.append((col, n, value, ideal, g))
    out = pd.DataFrame(rows, columns=["resource", "n", "value", "ideal", "growth"])
    return out.set_index(["resource", "n"])


def _limits(study: Scaling, min_share: float) -> pd.DataFrame:
    """What stops scaling: the makespan, the prefixes, the totals that grow."""
    rows: list[tuple[str, int, float, str, float]] = []
    by, thr, table = study.by, study.threshold, study.runs
    below = table[table["efficiency"] < thr]
    if len(below):
        n = below.index[0]
        e = float(below["efficiency"].iloc[0])
        rows.append(("makespan", n, e, f"makespan efficiency {e:.2f} at {n} {by}", np.inf))
    for prefix, pre in study.prefixes.groupby(level="prefix"):
        pre = pre.droplevel("prefix")
        if pre["share"].max() < min_share or len(pre) < 2:
            continue
        low = pre[pre["efficiency"] < thr]
        if len(low):
            n, e, s = low.index[0], float(low["efficiency"].iloc[0]), float(low["share"].iloc[0])
            rows.append((
                f"prefix {prefix}", n, e,
                f"prefix {prefix!r} stops scaling at {n} {by}: its span's efficiency is "
                f"{e:.2f}, {s:.0%} of the makespan", s,
            ))  # fmt: skip
        grew = pre[pre["growth"] > study.growth]
        if len(grew):
            n, g = grew.index[0], float(grew["growth"].iloc[0])
            rows.append((
                f"prefix {prefix} compute", n, g,
                f"prefix {prefix!r}'s compute seconds grow to {g:.2f}x their ideal at {n} {by} "
                "(its tasks run slower: contention for CPU, memory or I/O)",
                float(pre["share"].max()) * 0.5,
            ))  # fmt: skip
    labels = {col: (what, unit) for col, what, unit in RESOURCES}
    # how much of the makespan a total's growth costs: the seconds spent moving the bytes
    spent = {"transfer_bytes": "transfer_time", "io_bytes": "io_time"}
    for resource, res in study.resources.groupby(level="resource"):
        res = res.droplevel("resource")
        grew = res[res["growth"] > study.growth]
        if not len(grew):
            continue
        n, g = grew.index[0], float(grew["growth"].iloc[0])
        what, unit = labels[str(resource)]
        ref = res["value"].iloc[0]
        ratio = "from none" if not np.isfinite(g) else f"to {g:.2f}x the ideal"
        seconds = table.at[n, spent[resource]] if resource in spent else float("nan")
        took = f", {seconds:.2f} s spent at it" if seconds == seconds else ""
        rows.append((
            str(resource), n, g,
            f"{what}: grows {ratio} at {n} {by} ({_amount(ref, unit)} at "
            f"{res.index[0]}, {_amount(float(grew['value'].iloc[0]), unit)} at {n}{took})",
            seconds / table.at[n, "makespan"] if seconds == seconds else 0.05,
        ))  # fmt: skip
    out = pd.DataFrame(rows, columns=["what", "stops_at", "value", "detail", "weight"])
    # the makespan first, then the causes: earliest size, then largest share of the
    # makespan (a prefix's span; the seconds spent moving a total's bytes)
    out["first"] = out["what"] != "makespan"
    out = out.sort_values(["first", "stops_at", "weight"], ascending=[True, True, False])
    out = out.drop(columns="first")
    return out.drop(columns="weight").reset_index(drop=True)


def _amount(value: float, unit: str) -> str:
    if value != value:
        return "n/a"
    if unit == "B":
        for div, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if value >= div:
                return f"{value / div:.1f} {name}"
        return f"{value:.0f} B"
    return f"{value:.2f} {unit}"
