"""What collecting cost the run, over its time: each flush of every collector as a series
per process, and the totals ``metacollect info`` prints. A flush whose cost grows with the
hours, or a process whose flushes fall behind their interval, shows here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from metacollect.analysis.tasks import origin
from metacollect.store.reader import StoreReader

if TYPE_CHECKING:
    from metacollect.analysis.run import Run


def flush_series(run: Run) -> pd.DataFrame:
    """:meth:`~metacollect.analysis.run.Run.flushes` with, for each flush, ``process`` (the
    worker's address, or ``scheduler``; the cluster's id before it when the run had
    several), ``t`` (seconds since the run's start) and ``cpu_ms``. ``rows`` is -1 for a
    write that failed before it could say what it wrote. Empty for a store written before
    flushes were recorded."""
    df = run.flushes()
    several = df["cluster"].nunique() > 1
    names = []
    for cluster, kind, group, address in zip(
        df["cluster"], df["kind"], df["group"], df["address"], strict=True
    ):
        name = "scheduler" if kind == "scheduler" else address or group.split("/")[-1]
        names.append(f"{cluster} {name}" if several else name)
    t0 = origin(run) if len(df) else 0.0
    return df.assign(process=names, t=df["time"] - t0, cpu_ms=df["cpu_s"] * 1000.0)


def collector_totals(run: Run) -> dict[str, Any]:
    """The run's collecting cost in numbers, over the processes that recorded theirs
    (``run.collector_cost(per="process")``: an in-process cluster's CPU counted once):
    ``flush_cpu_s`` against ``process_cpu_s`` (``share``, NaN without CPU), ``processes``,
    ``flushes``, ``slowest_cpu_s`` (one flush's, NaN where flushes were not recorded one by
    one), ``longest_gap_s``; and of those that did not say, ``killed`` (never ended) and
    ``older`` (ended in a store written before the cost was recorded)."""
    cost = run.collector_cost(per="process")
    said = cost[cost.process_cpu_s.notna()]
    unsaid = cost[cost.process_cpu_s.isna()]
    flush, process = float(said.flush_cpu_s.sum()), float(said.process_cpu_s.sum())
    each = run.flushes() if len(said) else pd.DataFrame({"cpu_s": []})
    return {
        "flush_cpu_s": flush,
        "process_cpu_s": process,
        "share": flush / process if process > 0 else np.nan,
        "processes": len(said),
        "flushes": int(said.flushes.sum()),
        "slowest_cpu_s": float(each.cpu_s.max()) if len(each) else np.nan,
        "longest_gap_s": float(said.longest_gap_s.max()) if len(said) else np.nan,
        "killed": int(unsaid.ended.isna().sum()),
        "older": int(unsaid.ended.notna().sum()),
    }


def collector_groups(
    run: StoreReader,
) -> Iterator[tuple[str, str, dict[str, Any], dict[str, Any], str]]:
    """``(path, cluster, attrs, own, address)`` of each scheduler's and worker's group:
    ``own`` are the attrs that say where the process ran and when it started and ended -
    the worker group's own, the cluster group's for a scheduler - and ``address`` is the
    process's from them (``""`` when not recorded, never "None")."""
    for path, a in run.groups.items():
        if a.get("kind") in ("scheduler", "worker"):
            cluster = path.split("/")[1]
            own = a if a["kind"] == "worker" else run.groups.get(f"clusters/{cluster}", {})
            yield path, cluster, a, own, str(own.get("address") or "")


def collector_cost(run: StoreReader, per: str = "group") -> pd.DataFrame:
    """What collecting cost each process it ran in (:meth:`Run.collector_cost`)."""
    if per not in ("group", "process"):
        raise ValueError(f"per={per!r}: pass per='group' or per='process'")
    fields = ["flushes", "flush_wall_s", "flush_cpu_s", "longest_gap_s", "process_cpu_s"]
    rows = []
    for path, cluster, a, own, address in collector_groups(run):
        ended = np.nan if own.get("ended") is None else float(own["ended"])
        cost = a.get("collector_cost") or {}
        said = (float(cost.get(f, np.nan)) for f in fields)
        where = (address, own.get("host", ""), own.get("pid"))
        rows.append((cluster, a["kind"], path, *where, *said, ended))
    columns = ["cluster", "kind", "group", "address", "host", "pid", *fields, "ended"]
    out = pd.DataFrame(rows, columns=columns)
    if per == "process":
        out = (
            out.groupby(["cluster", "host", "pid"], dropna=False, sort=False)
            .agg(
                groups=("group", "size"),
                kind=("kind", lambda k: "+".join(sorted(set(k)))),
                flushes=("flushes", lambda v: v.sum(min_count=1)),
                flush_wall_s=("flush_wall_s", lambda v: v.sum(min_count=1)),
                flush_cpu_s=("flush_cpu_s", lambda v: v.sum(min_count=1)),
                longest_gap_s=("longest_gap_s", "max"),
                process_cpu_s=("process_cpu_s", "max"),
                ended=("ended", "max"),
            )
            .reset_index()
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        out["flush_cpu_share"] = out["flush_cpu_s"] / out["process_cpu_s"]
    order = ["cluster", "kind", "group"] if per == "group" else ["cluster", "kind", "pid"]
    return out.sort_values(order, ignore_index=True)


def flushes(run: StoreReader) -> pd.DataFrame:
    """Each flush of every scheduler's and worker's collector (:meth:`Run.flushes`)."""
    spec = run.schema.groups["scheduler"].tables["flushes"]
    frames = []
    for path, cluster, a, own, address in collector_groups(run):
        df = run.table(path, "flushes").sort_values("time")
        began = own.get("started")
        before = df["time"].shift(1, fill_value=np.nan if began is None else float(began))
        where = {"cluster": cluster, "kind": a["kind"], "group": path, "address": address}
        frames.append(df.assign(**where, gap_s=df["time"] - before))
    columns = ["cluster", "kind", "group", "address", *spec.variables, "gap_s"]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    out = pd.concat(frames, ignore_index=True)[columns]
    return out.sort_values(["time", "group"], ignore_index=True)
