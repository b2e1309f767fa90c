"""The Dask profile tab: flame views of the workers' statistical profiler, merged by call path."""

from __future__ import annotations

import numpy as np
import pandas as pd
from bokeh.layouts import column

from metacollect.report.views.base import (
    MAX_ROWS,
    Context,
    Layout,
    data_table,
    heading,
    heaviest,
    note,
    selectable,
)
from metacollect.report.views.flame import flame_figure


def dask_profile(ctx: Context) -> Layout:
    """Flame views of Dask's statistical profiler, and its functions by own time."""
    nodes = ctx.run.dask_profile(nodes=True)
    if not len(nodes):
        return note(
            "No Dask profile samples: the workers' statistical profiler saw no task thread."
        )
    selections = [("every worker and prefix", nodes)]
    for w in heaviest(nodes.groupby("worker")["count"].sum(), 8):
        selections.append((f"worker {w}", nodes[nodes["worker"] == w]))
    for pfx in heaviest(nodes.groupby("prefix")["count"].sum(), 8):
        selections.append((f"task prefix {pfx}", nodes[nodes["prefix"] == pfx]))
    interval = float(
        np.median(
            [float(a.get("profile_interval") or 0.01) for a in ctx.run.worker_groups().values()]
            or [0.01]
        )
    )
    options = []
    for label, n in selections:
        boxes, total, where = _merged_tree(n, interval)
        options.append(
            (
                label,
                flame_figure(
                    boxes,
                    total,
                    f"Dask statistical profile: {label} (samples x {interval:g} s)",
                    "time on the stack (s)",
                    where,
                ),
            )
        )
    table = ctx.run.dask_profile().head(MAX_ROWS)
    return column(
        selectable(options, "profile of"),
        heading("Functions by own time (Dask's sampler)"),
        data_table(table, height=300),
    )


def _merged_tree(
    nodes: pd.DataFrame, interval: float, max_depth: int = 40, min_fraction: float = 0.003
) -> tuple[list[tuple[float, int, float, str]], float, dict[str, str]]:
    """The stored trees (one per worker, prefix and cycle) merged by call path, as icicle boxes."""
    path_of: dict[tuple[int, int], int] = {}
    ids: dict[tuple[int, str, str], int] = {}
    weight: list[float] = []
    parent_of: list[int] = []
    names: list[str] = []
    where: dict[str, str] = {}
    rows = zip(
        nodes["tree"],
        nodes["node"],
        nodes["parent"],
        nodes["name"],
        nodes["file"],
        nodes["line"],
        nodes["total"],
        strict=True,
    )
    for tree, node, parent, name, file, line, total in rows:
        if parent < 0:
            path_of[(tree, node)] = -1  # the root: not a function
            continue
        up = path_of.get((tree, parent), -1)
        k = (up, str(name), str(file))
        pid = ids.get(k)
        if pid is None:
            pid = ids[k] = len(weight)
            weight.append(0.0)
            parent_of.append(up)
            names.append(str(name))
            where[str(name)] = f"{file}:{line}"
        weight[pid] += float(total) * interval
        path_of[(tree, node)] = pid
    kids: dict[int, list[int]] = {}
    for pid, up in enumerate(parent_of):
        kids.setdefault(up, []).append(pid)
    roots = kids.get(-1, [])
    total = sum(weight[r] for r in roots)
    boxes: list[tuple[float, int, float, str]] = []
    stack = [(r, 0) for r in sorted(roots, key=lambda r: weight[r])]
    xs = {}
    x0 = 0.0
    for r in sorted(roots, key=lambda r: -weight[r]):
        xs[r] = x0
        x0 += weight[r]
    while stack:
        pid, depth = stack.pop()
        if total <= 0 or weight[pid] / total < min_fraction:
            continue
        boxes.append((xs[pid], depth, weight[pid], names[pid]))
        if depth >= max_depth:
            continue
        x = xs[pid]
        for c in sorted(kids.get(pid, []), key=lambda c: -weight[c]):
            xs[c] = x
            x += weight[c]
            stack.append((c, depth + 1))
    return boxes, total, where
