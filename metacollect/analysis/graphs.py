"""The submitted graphs: their nodes with what happened to each task, and the critical path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from metacollect.analysis.memo import once
from metacollect.errors import StoreError

if TYPE_CHECKING:
    from metacollect.analysis.run import Run


def pick_graph(run: Run, graph: int | None, cluster: str | None = None) -> tuple[str, int]:
    graphs = run.graphs()
    if not len(graphs):
        raise StoreError(f"{run.path} holds no submitted graph (step 2 was not collected)")
    if cluster is not None:
        graphs = graphs[graphs["cluster"] == cluster]
    if graph is None:
        row = graphs.sort_values(["n_tasks", "time"]).iloc[-1]
        return str(row["cluster"]), int(row["graph"])
    sel = graphs[graphs["graph"] == graph]
    if not len(sel):
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
        state, and ``time``: when the scheduler learnt it). ``edges``: key, dependency
        (both in the graph).
    """
    nodes, deps, _ = once(run, _graph, *pick_graph(run, graph, cluster))
    return nodes.copy(), deps.copy()


def _graph(run: Run, cluster: str, graph: int) -> tuple[pd.DataFrame, pd.DataFrame, _Topology]:
    """:func:`graph_nodes` of a picked graph, and its topology (computed once for depths and
    paths, and once per report for the views that show the graph and its critical path)."""
    gt = run.graph_tasks()
    gt = gt[(gt["cluster"] == cluster) & (gt["graph"] == graph)]
    deps = run.dependencies()
    deps = deps[(deps["cluster"] == cluster) & (deps["graph"] == graph)]
    # the keys as integers once: the edges between them, and each node's key
    codes, keys = pd.factorize(gt["key"].to_numpy(), use_na_sentinel=False)
    index = pd.Index(keys)
    child = index.get_indexer(deps["key"])
    parent = index.get_indexer(deps["dependency"])
    inside = (child >= 0) & (parent >= 0)
    deps = deps[inside][["key", "dependency"]].reset_index(drop=True)
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
        "time",
    ]
    # each node's (last) execution, by the key's code: a left merge on the key without
    # hashing the key strings again (a missing execution reads as NaN, as in a merge)
    at = index.get_indexer(tasks["key"])
    row = np.full(len(index), -1, dtype=np.int64)
    row[at[at >= 0]] = np.flatnonzero(at >= 0)
    ran = tasks[cols[1:]].reset_index(drop=True).reindex(row[codes])
    nodes = gt.drop(columns=["cluster"]).reset_index(drop=True)
    nodes = pd.concat([nodes, ran.reset_index(drop=True)], axis=1)
    topology = _Topology.of_codes(index, child[inside], parent[inside])
    nodes["depth"] = topology.depth_array()[codes]
    return nodes.reset_index(drop=True), deps, topology


class _Topology:
    """A graph's keys as integers: their dependents (CSR arrays) and a topological order
    (dependencies first). Everything here is linear in keys + edges: a 200k-task chain
    takes a fraction of a second."""

    def __init__(self, keys: Any, deps: pd.DataFrame) -> None:
        index = pd.Index(keys).unique()
        child = index.get_indexer(deps["key"])
        parent = index.get_indexer(deps["dependency"])
        ok = (child >= 0) & (parent >= 0)
        self._build(index, child[ok], parent[ok])

    @classmethod
    def of_codes(cls, keys: pd.Index, child: np.ndarray, parent: np.ndarray) -> _Topology:
        """The topology of unique ``keys`` and edges given as their positions (each
        ``child`` depends on its ``parent``)."""
        topology = cls.__new__(cls)
        topology._build(keys, child, parent)
        return topology

    def _build(self, keys: pd.Index, child: np.ndarray, parent: np.ndarray) -> None:
        self.keys = keys
        n = len(keys)
        by_parent = np.argsort(parent, kind="stable")
        #: dependents of key i: kids[first[i]:first[i + 1]]
        self.kids: list[int] = child[by_parent].tolist()
        self.first: list[int] = np.searchsorted(parent[by_parent], np.arange(n + 1)).tolist()
        waiting = np.bincount(child, minlength=n).tolist()
        ready = np.flatnonzero(np.asarray(waiting) == 0).tolist()
        order: list[int] = []
        kids, first = self.kids, self.first
        while ready:  # Kahn's algorithm; keys in a cycle (a damaged record) are left out
            k = ready.pop()
            order.append(k)
            for c in kids[first[k] : first[k + 1]]:
                waiting[c] -= 1
                if waiting[c] == 0:
                    ready.append(c)
        self.order = order

    def depth_array(self) -> np.ndarray:
        """Each key's longest chain of dependencies, in the order of ``keys`` (0 for keys in
        a cycle)."""
        depth = [0] * len(self.keys)
        kids, first = self.kids, self.first
        for k in self.order:
            d = depth[k] + 1
            for c in kids[first[k] : first[k + 1]]:
                if d > depth[c]:
                    depth[c] = d
        out = np.zeros(len(self.keys), dtype=int)
        out[self.order] = np.asarray(depth, dtype=int)[self.order]
        return out

    def depths(self) -> pd.Series:
        """Each key's longest chain of dependencies (keys in a cycle left out)."""
        return pd.Series(self.depth_array()[self.order], index=self.keys[self.order], dtype=int)

    def longest_path(self, weight: Any) -> list[Any]:
        """The keys of the heaviest chain of dependencies, first to last; ``weight`` holds
        each key's weight in the order of ``keys``."""
        n = len(self.keys)
        w = np.nan_to_num(np.asarray(weight, dtype=float)).tolist()
        before = [-1] * n  # the heaviest dependency of each key
        reach = [float("-inf")] * n  # the heaviest chain that ends in that dependency
        finish = [0.0] * n
        kids, first = self.kids, self.first
        for k in self.order:
            f = w[k] + (reach[k] if before[k] >= 0 else 0.0)
            finish[k] = f
            for c in kids[first[k] : first[k + 1]]:
                if f > reach[c]:
                    reach[c], before[c] = f, k
        if not self.order:
            return []
        k = max(self.order, key=finish.__getitem__)
        path = []
        while k >= 0:
            path.append(k)
            k = before[k]
        return list(self.keys[path[::-1]])


def dependency_depths(keys: list[Any], deps: pd.DataFrame) -> dict[Any, int]:
    """Depth of each key: the length of its longest chain of dependencies."""
    return _Topology(keys, deps).depths().to_dict()


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
        duration. ``attrs`` holds ``length`` (sum of durations), ``wall`` (the graph's
        execution on the scheduler's clock, see below), ``fraction`` (length / wall) and
        ``graph``.

    A task's start and stop are its worker's clock shifted by that worker's estimate of its
    offset from the scheduler's (Dask's ``scheduler_delay``, from heartbeats: off by
    milliseconds, more on a loaded machine, and differently for each worker). A wall from
    the first start to the last stop mixes those estimates: a chain that alternates between
    two workers can come out longer than its wall. ``wall`` is measured on the scheduler's
    clock alone instead: from the earliest time a task of the graph can have started (the
    arrival of its result, ``time``, minus its duration, each on one clock) to the arrival
    of the last result. A serial chain then never exceeds it.

    Examples
    --------
    >>> cp = critical_path(run)   # doctest: +SKIP
    >>> share = cp.attrs["fraction"]   # doctest: +SKIP
    >>> print(f"{share:.0%} of the wall time is on the critical path")   # doctest: +SKIP
    """
    nodes, _, topology = once(run, _graph, *pick_graph(run, graph, cluster))
    duration = nodes.drop_duplicates("key").set_index("key")["duration"]
    path = topology.longest_path(duration.reindex(topology.keys).to_numpy())
    cols = ["key", "prefix", "worker", "start", "stop", "duration"]
    out = (
        nodes.drop_duplicates("key").set_index("key").loc[path].reset_index()[cols]
        if path
        else pd.DataFrame(columns=cols)
    )
    length = float(out["duration"].fillna(0).sum())
    ran = nodes[nodes["duration"].notna()]
    wall = (
        float(ran["time"].max() - (ran["time"] - ran["duration"]).min())
        if len(ran)
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
