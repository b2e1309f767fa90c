"""The submitted graphs: their nodes with what happened to each task, and the critical path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from metacollect.analysis.run import Run


def pick_graph(run: Run, graph: int | None, cluster: str | None = None) -> tuple[str, int]:
    graphs = run.graphs()
    if not len(graphs):
        from metacollect.errors import StoreError

        raise StoreError(f"{run.path} holds no submitted graph (step 2 was not collected)")
    if cluster is not None:
        graphs = graphs[graphs["cluster"] == cluster]
    if graph is None:
        row = graphs.sort_values(["n_tasks", "time"]).iloc[-1]
        return str(row["cluster"]), int(row["graph"])
    sel = graphs[graphs["graph"] == graph]
    if not len(sel):
        from metacollect.errors import StoreError

        raise StoreError(
            f"no graph {graph} in {run.path}; "
            f"graphs are {sorted(graphs['graph'].unique().tolist())}"
        )
    return str(sel.iloc[0]["cluster"]), int(graph)


def graph_nodes(
    run: Run, graph: int | None = None, cluster: str | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Nodes and edges of one submitted graph (default: the largest), with task attributes.

    Returns
    -------
    (nodes, edges)
        ``nodes``: key, prefix, group, depth (longest chain of dependencies below it), and
        the outcome of its last execution (worker, start, stop, duration, nbytes, typename,
        state). ``edges``: key, dependency (both in the graph).
    """
    cluster, graph = pick_graph(run, graph, cluster)
    gt = run.graph_tasks()
    gt = gt[(gt["cluster"] == cluster) & (gt["graph"] == graph)]
    deps = run.dependencies()
    deps = deps[(deps["cluster"] == cluster) & (deps["graph"] == graph)]
    keys = set(gt["key"])
    deps = deps[deps["key"].isin(keys) & deps["dependency"].isin(keys)][
        ["key", "dependency"]
    ].reset_index(drop=True)
    tasks = run.tasks()
    tasks = tasks[(tasks["cluster"] == cluster)].drop_duplicates("key", keep="last")
    cols = [
        "key",
        "worker",
        "thread",
        "start",
        "stop",
        "duration",
        "nbytes",
        "typename",
        "state",
    ]
    nodes = gt.drop(columns=["cluster"]).merge(tasks[cols], on="key", how="left")
    depth = dependency_depths(list(nodes["key"]), deps)
    nodes["depth"] = nodes["key"].map(depth).fillna(0).astype(int)
    return nodes.reset_index(drop=True), deps


def _order(keys: list[Any], deps: pd.DataFrame) -> tuple[list[Any], dict[Any, list[Any]]]:
    """Topological order (dependencies first) and ``{key: [dependencies]}``."""
    parents: dict[Any, list[Any]] = {k: [] for k in keys}
    children: dict[Any, list[Any]] = {k: [] for k in keys}
    for k, d in zip(deps["key"], deps["dependency"], strict=False):
        parents[k].append(d)
        children[d].append(k)
    remaining = {k: len(v) for k, v in parents.items()}
    ready = [k for k, n in remaining.items() if n == 0]
    order = []
    while ready:
        k = ready.pop()
        order.append(k)
        for c in children[k]:
            remaining[c] -= 1
            if remaining[c] == 0:
                ready.append(c)
    return order, parents


def dependency_depths(keys: list[Any], deps: pd.DataFrame) -> dict[Any, int]:
    """Depth of each key: the length of its longest chain of dependencies."""
    order, parents = _order(keys, deps)
    depth: dict[Any, int] = {}
    for k in order:
        depth[k] = 1 + max((depth[d] for d in parents[k]), default=-1)
    return depth


def critical_path(run: Run, graph: int | None = None, cluster: str | None = None) -> pd.DataFrame:
    """The longest chain of dependent tasks of a graph, weighted by compute time.

    Parameters
    ----------
    run
        The run.
    graph
        Graph number (see :meth:`Run.graphs`); default the largest graph.
    cluster
        Cluster id, when the run has several.

    Returns
    -------
    DataFrame
        One row per task on the path, first to last: key, prefix, worker, start, stop,
        duration. ``attrs`` holds ``length`` (sum of durations), ``wall`` (first start to
        last stop of the graph's tasks), ``fraction`` (length / wall) and ``graph``.

    Examples
    --------
    >>> cp = critical_path(run)   # doctest: +SKIP
    >>> share = cp.attrs["fraction"]   # doctest: +SKIP
    >>> print(f"{share:.0%} of the wall time is on the critical path")   # doctest: +SKIP
    """
    nodes, deps = graph_nodes(run, graph, cluster)
    dur = dict(zip(nodes["key"], nodes["duration"].fillna(0.0), strict=False))
    order, parents = _order(list(nodes["key"]), deps)
    finish: dict[Any, float] = {}
    best: dict[Any, Any] = {}
    for k in order:
        prev = max(parents[k], key=lambda d: finish[d], default=None)
        finish[k] = dur[k] + (finish[prev] if prev is not None else 0.0)
        best[k] = prev
    path = []
    k = max(finish, key=lambda x: finish[x], default=None)
    while k is not None:
        path.append(k)
        k = best[k]
    path.reverse()
    cols = ["key", "prefix", "worker", "start", "stop", "duration"]
    out = (
        nodes.set_index("key").loc[path].reset_index()[cols] if path else pd.DataFrame(columns=cols)
    )
    length = float(out["duration"].fillna(0).sum())
    wall = (
        float(nodes["stop"].max() - nodes["start"].min())
        if nodes["start"].notna().any()
        else float("nan")
    )
    out.attrs.update(
        {
            "graph": int(nodes["graph"].iloc[0]) if len(nodes) else -1,
            "length": length,
            "wall": wall,
            "fraction": length / wall if wall and wall > 0 else float("nan"),
        }
    )
    return out
