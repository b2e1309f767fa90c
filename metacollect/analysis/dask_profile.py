"""Dask's own statistical profile of a run, per function, and beside Yappi's exact one.

The store keeps Dask's call trees as they were (one per worker, task prefix and 1 s cycle);
here they become what profilers show: per function, the samples taken in it (``self``) and
in it or below it (``total``), in seconds (samples times the worker's sampling interval).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from metacollect.analysis import dask_clock
from metacollect.analysis.tasks import worker_addresses
from metacollect.errors import StoreError

if TYPE_CHECKING:
    from metacollect.analysis.run import Run

KINDS = ("compute", "administrative")


def profile_nodes(
    run: Run, worker: str | None = None, prefix: str | None = None, kind: str = "compute"
) -> pd.DataFrame:
    """The stored call-tree nodes (``Run.dask_profile(..., nodes=True)``), with a ``tree``
    number (one per worker, kind, prefix and cycle) and what each node's samples mean.
    Each cycle's end ``time`` is on the scheduler's clock, Dask's kept as ``time_dask``
    (:mod:`metacollect.analysis.dask_clock`: distributed stamped it with the delay of
    that moment).

    Dask's sampler counts a sample on every frame of the stack *except the innermost*
    (``profile.process`` is called with ``child=True``): a node's ``count`` is the samples
    that went on into one of its callees. So the samples a function spent in itself (in its
    own lines or in C code it called) are where its caller's count exceeds its callees'. A
    node with one callee gives them to it exactly (``self`` of the callee); a node with
    several cannot say which (``unresolved``, kept on the node, never guessed).
    """
    if kind not in KINDS:
        raise StoreError(f"dask_profile(kind={kind!r}): use one of {', '.join(KINDS)}")
    df = run.worker_table("dask_profile")
    addr = worker_addresses(run)
    df.insert(
        2,
        "worker",
        [addr.get((c, g), g) for c, g in zip(df["cluster"], df["worker_group"], strict=True)],
    )
    df = df[df["kind"] == kind]
    if worker is not None:
        df = df[(df["worker"] == worker) | (df["worker_group"] == worker)]
    if prefix is not None:
        df = df[df["prefix"] == prefix]
    df = dask_clock.moved(run, df.reset_index(drop=True), ("time",))
    # a tree starts at each root (node 0); rows are stored tree by tree in preorder
    tree = np.cumsum(df["node"].to_numpy() == 0) - 1
    df.insert(0, "tree", tree)
    n = len(df)
    row_of = {(t, node): i for i, (t, node) in enumerate(zip(tree, df["node"], strict=True))}
    parent_row = np.array(
        [row_of[(t, p)] if p >= 0 else -1 for t, p in zip(tree, df["parent"], strict=True)],
        dtype=np.int64,
    )
    count = df["count"].to_numpy(dtype=np.int64)
    has = parent_row >= 0
    n_children = np.bincount(parent_row[has], minlength=n)
    below = np.bincount(parent_row[has], weights=count[has], minlength=n).astype(np.int64)
    residual = count - below  # samples whose innermost frame is one of the node's callees
    only_child = has & (n_children[np.maximum(parent_row, 0)] == 1)
    own = np.zeros(n, dtype=np.int64)
    own[only_child] = residual[parent_row[only_child]]
    df["self"] = own
    df["unresolved"] = np.where(n_children > 1, residual, 0)
    df["total"] = count + own  # samples with this node on the stack
    return df


def dask_profile(
    run: Run, worker: str | None = None, prefix: str | None = None, kind: str = "compute"
) -> pd.DataFrame:
    """Dask's sampled profile per function (``Run.dask_profile``).

    Returns
    -------
    pandas.DataFrame
        name, file, self, total and unresolved (samples: see :func:`profile_nodes`),
        self_seconds, total_seconds and unresolved_seconds (samples times the worker's
        sampling interval), heaviest self time first. ``total`` counts a function once per
        sample however deep it recurses.
    """
    full = profile_nodes(run, worker, prefix, kind)
    cols = ["name", "file", "self", "total", "unresolved"]
    secs = [f"{c}_seconds" for c in cols[2:]]
    full["total"] = _once_per_stack(full)
    nodes = full[full["parent"] >= 0]  # the roots are not functions
    if not len(nodes):
        return pd.DataFrame({c: [] for c in cols + secs})
    weight = _intervals(run, nodes)
    nodes = nodes.assign(**{s: nodes[c] * weight for s, c in zip(secs, cols[2:], strict=True)})
    out = nodes.groupby(["name", "file"], sort=False)[cols[2:] + secs].sum()
    return out.reset_index().sort_values("self_seconds", ascending=False, ignore_index=True)


def _intervals(run: Run, nodes: pd.DataFrame) -> np.ndarray:
    """Each node's sample weight: its worker's ``profile_interval`` attr."""
    groups = run.worker_groups()
    by_group = {
        p.split("/")[-1]: float(a.get("profile_interval") or 0.01) for p, a in groups.items()
    }
    return np.array([by_group.get(g, 0.01) for g in nodes["worker_group"]], dtype=float)


def _once_per_stack(nodes: pd.DataFrame) -> np.ndarray:
    """Per node, its ``total`` unless an ancestor is the same function (then 0): summed per
    function it counts each sample once, however deep the function recurses."""
    out = np.zeros(len(nodes), dtype=np.int64)
    path: list[tuple[str, str]] = []
    depth_of: dict[tuple[int, int], int] = {}
    rows = zip(
        nodes["tree"], nodes["node"], nodes["parent"], nodes["name"], nodes["file"],
        nodes["total"], strict=True,
    )  # fmt: skip
    for i, (t, n, parent, name, file, total) in enumerate(rows):
        depth = 0 if parent < 0 else depth_of[(t, parent)] + 1
        depth_of[(t, n)] = depth
        del path[depth:]
        fn = (name, file)
        out[i] = 0 if fn in path else total
        path.append(fn)
    return out


def compare_profiles(
    run: Run, prefix: str | None = None, worker: str | None = None
) -> pd.DataFrame:
    """Dask's sampled profile beside Yappi's exact one, per function of the task threads.

    Returns
    -------
    pandas.DataFrame
        name, file, dask_self, dask_total (seconds from samples), yappi_self (``tsub``),
        yappi_total (``ttot``), yappi_calls; a function one of them did not see has NaN on
        that side. Sampling sees where time goes at a 10 ms grain, with no cost; Yappi sees
        every call, exactly, at a price: where both exist they should agree on the heavy
        functions.
    """
    dask = dask_profile(run, worker=worker, prefix=prefix)
    dask = dask.rename(columns={"self_seconds": "dask_self", "total_seconds": "dask_total"})
    dask = dask[["name", "file", "dask_self", "dask_total"]]
    prof = run.profile(worker=worker)
    if len(prof):
        prof = prof[prof["key"].notna() & (prof["level"] == "thread")]
        if prefix is not None:
            from dask.utils import key_split

            prof = prof[[key_split(k) == prefix for k in prof["key"]]]
        # Yappi names methods Class.method, Dask by the code object's name
        prof = prof.assign(name=[str(n).rsplit(".", 1)[-1] for n in prof["name"]])
        yappi = (
            prof.groupby(["name", "file"])
            .agg(
                yappi_self=("tsub", "sum"),
                yappi_total=("ttot", "sum"),
                yappi_calls=("ncall", "sum"),
            )
            .reset_index()
        )
    else:
        yappi = pd.DataFrame(
            {c: [] for c in ("name", "file", "yappi_self", "yappi_total", "yappi_calls")}
        )
    out = dask.merge(yappi, on=["name", "file"], how="outer")
    order = out[["dask_self", "yappi_self"]].max(axis=1)
    return out.iloc[np.argsort(-order.fillna(0).to_numpy(), kind="stable")].reset_index(drop=True)
