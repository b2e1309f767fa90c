"""How two runs of the same graph were scheduled differently, task by task (matched by key).

For each task executed in both runs: the worker it ran on (by worker name, which a
LocalCluster or a jobqueue cluster gives the same in every run), how long it waited between
becoming ready (leaving ``waiting``: its dependencies in memory) and its compute start, and
why: the time it spent queued on the scheduler, the time on its worker before it ran, the
transfers it needed there, the event that made it ready (the dependency whose
``task-finished`` stimulus moved it to ``processing`` or ``queued``) and its transitions
with their stimuli. Then both runs' critical paths and where they part.

A key is matched by its text alone, its last execution: a store of several clusters that ran
the same keys has each key once, from the cluster that ran it last.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from metacollect.analysis.graphs import critical_path
from metacollect.errors import StoreError

if TYPE_CHECKING:
    from metacollect.analysis.run import Run

#: a stimulus id without the time Dask appends to it (``task-finished-1733.25``)
_STIMULUS_TIME = re.compile(r"-[0-9][0-9.e+]*$")
#: tasks whose transitions are told in full in :attr:`ScheduleDiff.waits` (``chain_a/b``)
MAX_CHAINS = 50


def stimulus_kind(stimulus_id: str) -> str:
    """``task-finished-1733.25`` -> ``task-finished``."""
    return _STIMULUS_TIME.sub("", str(stimulus_id))


@dataclass
class ScheduleDiff:
    """The scheduling of two runs of the same graph, task by task.

    Attributes
    ----------
    matched, only_a, only_b
        Keys executed in both runs, and in one of them only.
    placement
        One row per matched key: key, prefix, worker_a, worker_b (worker names), moved.
    waits
        One row per matched key, longest added wait first: key, prefix, worker_a/b,
        ready_a/b (s since the run's first ready task), wait_a/b (ready to compute start),
        delta, queued_a/b (ready to ``processing`` on the scheduler), fetch_a/b (seconds of
        the transfers the task needed on its worker), fetched_a/b (their count),
        readied_by_a/b (the dependency whose end made it ready), and for the first
        :data:`MAX_CHAINS` rows ``chain_a/b``, its transitions and their stimuli.
    critical_a, critical_b
        :func:`~metacollect.analysis.graphs.critical_path` of each run's largest graph.
    common_path
        Tasks the two critical paths share from their first task on; ``len`` of a path when
        one is the other.
    """

    matched: int
    only_a: int
    only_b: int
    placement: pd.DataFrame
    waits: pd.DataFrame
    critical_a: pd.DataFrame = field(default_factory=pd.DataFrame)
    critical_b: pd.DataFrame = field(default_factory=pd.DataFrame)
    common_path: int = 0

    @property
    def moved(self) -> int:
        """Matched tasks that ran on another worker in B than in A."""
        return int(self.placement["moved"].sum()) if len(self.placement) else 0

    def lines(self, top: int = 5) -> list[str]:
        """The scheduling diff as text lines (``top`` tasks of each list)."""
        out = [
            f"{self.matched} tasks in both runs ({self.only_a} only in A, {self.only_b} only in B)"
        ]
        if not self.matched:
            return out
        out.append(f"ran on another worker: {self.moved} of {self.matched}")
        moved = self.placement[self.placement["moved"]]
        if len(moved):
            flows = moved.groupby(["worker_a", "worker_b"]).size().sort_values(ascending=False)
            out.append(
                "  most moved: "
                + ", ".join(f"{a} -> {b}: {n}" for (a, b), n in flows.head(top).items())
            )
        longer = self.waits[self.waits["delta"] > 0]
        out.append(f"waited longer in B: {len(longer)} tasks, {longer['delta'].sum():.3f} s in all")
        for _, r in longer.head(top).iterrows():
            ready = (
                f"ready when {r.readied_by_b} ended" if r.readied_by_b else "ready at submission"
            )
            out.append(
                f"  {r.key}: waited {r.wait_a:.3f} s -> {r.wait_b:.3f} s (+{r.delta:.3f} s) on "
                f"worker {r.worker_a} -> {r.worker_b}: queued on the scheduler "
                f"{r.queued_a:.3f} -> {r.queued_b:.3f} s, on its worker "
                f"{r.wait_a - r.queued_a:.3f} -> {r.wait_b - r.queued_b:.3f} s, "
                f"{int(r.fetched_b)} transfers needed in B ({r.fetch_b:.3f} s); {ready}"
            )
            if isinstance(r.get("chain_b"), str) and r.chain_b:
                out.append(f"    B: {r.chain_b}")
                out.append(f"    A: {r.chain_a}")
        out.extend(self._path_lines())
        return out

    def _path_lines(self) -> list[str]:
        a, b = self.critical_a, self.critical_b
        if not len(a) or not len(b):
            return ["critical path: not in both runs"]
        la, lb = a.attrs.get("length", np.nan), b.attrs.get("length", np.nan)
        out = [
            f"critical path: {len(a)} tasks, {la:.3f} s -> {len(b)} tasks, {lb:.3f} s "
            f"({b.attrs.get('fraction', np.nan):.0%} of the graph's wall in B)"
        ]
        n = self.common_path
        if n == len(a) == len(b):
            out.append("  the same tasks in both runs")
            return out
        where = f"after {a.iloc[n - 1].key}" if n else "from its first task"
        ka = a.iloc[n].key if n < len(a) else "(end)"
        kb = b.iloc[n].key if n < len(b) else "(end)"
        out.append(f"  diverged {where}: A went on to {ka}, B to {kb}")
        return out


def schedule_diff(
    a: Run,
    b: Run,
    names_a: dict[str, str],
    names_b: dict[str, str],
    tasks_a: pd.DataFrame | None = None,
    tasks_b: pd.DataFrame | None = None,
) -> ScheduleDiff:
    """The scheduling of ``b`` against ``a`` (see :class:`ScheduleDiff`); ``names_*``:
    worker address -> name of each run; ``tasks_*``: their :meth:`Run.tasks`, when read."""
    ta = _last_execution(a.tasks() if tasks_a is None else tasks_a, names_a)
    tb = _last_execution(b.tasks() if tasks_b is None else tasks_b, names_b)
    keys = ta.index.intersection(tb.index)
    placement = pd.DataFrame(
        {
            "key": keys,
            "prefix": ta.loc[keys, "prefix"].to_numpy(),
            "worker_a": ta.loc[keys, "worker"].to_numpy(),
            "worker_b": tb.loc[keys, "worker"].to_numpy(),
        }
    )
    placement["moved"] = placement["worker_a"] != placement["worker_b"]
    tr_a, tr_b = a.transitions(), b.transitions()  # read once: the largest tables read here
    wa, wb = _waits(a, tr_a, ta.loc[keys]), _waits(b, tr_b, tb.loc[keys])
    waits = wa.merge(wb, left_index=True, right_index=True, suffixes=("_a", "_b"))
    waits.insert(0, "prefix", ta.loc[keys, "prefix"])
    waits["delta"] = waits["wait_b"] - waits["wait_a"]
    waits = waits.sort_values("delta", ascending=False, kind="stable")
    top = waits.index[:MAX_CHAINS]
    waits["chain_a"] = pd.Series(_chains(tr_a, top), dtype=object)
    waits["chain_b"] = pd.Series(_chains(tr_b, top), dtype=object)
    waits = waits.reset_index(names="key")
    out = ScheduleDiff(
        matched=len(keys),
        only_a=len(ta.index.difference(keys)),
        only_b=len(tb.index.difference(keys)),
        placement=placement,
        waits=waits,
    )
    if len(keys):
        out.critical_a, out.critical_b = _critical(a), _critical(b)
        out.common_path = _common(out.critical_a, out.critical_b)
    return out


def _last_execution(tasks: pd.DataFrame, names: dict[str, str]) -> pd.DataFrame:
    """Each key's last execution (tasks on the scheduler's clock), indexed by key, with
    its worker's name."""
    t = tasks.drop_duplicates("key", keep="last").set_index("key")
    t["address"] = t["worker"]
    t["worker"] = renamed(t["worker"], names)
    return t


def renamed(values: pd.Series, names: dict[str, str]) -> np.ndarray:
    """``values`` (worker addresses) by their names, the value itself where it has none;
    looked up once per distinct value (a million rows hold a handful of workers)."""
    codes, uniques = pd.factorize(values)
    mapped = np.array([str(names.get(u, u)) for u in uniques] + [""], dtype=object)
    return mapped[codes]  # a missing value (code -1) is ""


def _waits(run: Run, transitions: pd.DataFrame, tasks: pd.DataFrame) -> pd.DataFrame:
    """Per key: ready (since the run's first ready), wait, queued, fetch, fetched, readied_by,
    worker."""
    tr = transitions[transitions["key"].isin(tasks.index)]
    start = tasks["start"]
    ready = _last_before(tr[tr["start"] == "waiting"], start)
    processing = _last_before(tr[tr["finish"] == "processing"], start)
    ready = ready.reindex(tasks.index)
    processing = processing.reindex(tasks.index)
    ready_time = ready["time"].fillna(processing["time"])
    out = pd.DataFrame(index=tasks.index)
    out["worker"] = tasks["worker"]
    out["ready"] = ready_time - ready_time.min()
    out["wait"] = (start - ready_time).clip(lower=0.0)
    out["queued"] = (processing["time"] - ready_time).clip(lower=0.0).fillna(0.0)
    fetch = _fetches(run, tasks)
    out["fetch"] = fetch["seconds"].reindex(tasks.index).fillna(0.0)
    out["fetched"] = fetch["n"].reindex(tasks.index).fillna(0).astype(int)
    by = _readied_by(transitions, ready["stimulus_id"]).reindex(tasks.index).fillna("")
    where = by.map(tasks["worker"])
    out["readied_by"] = by.where(where.isna(), by + " (on worker " + where.astype(str) + ")")
    return out


def _last_before(tr: pd.DataFrame, start: pd.Series) -> pd.DataFrame:
    """Each key's last transition of ``tr`` at or before its compute start (its first when
    none is: a clock's uncertainty), indexed by key."""
    tr = tr.assign(limit=tr["key"].map(start)).sort_values("time", kind="stable")
    before = tr[tr["time"] <= tr["limit"] + 1e-3]
    rest = tr[~tr["key"].isin(before["key"])].drop_duplicates("key", keep="first")
    both = pd.concat([before.drop_duplicates("key", keep="last"), rest])
    return both.set_index("key")[["time", "stimulus_id"]]


def _fetches(run: Run, tasks: pd.DataFrame) -> pd.DataFrame:
    """Per key: the transfers its worker made for it (``startstops``' ``transfer`` rows,
    which Dask records on the task that needed the data): seconds and count."""
    ss = run.worker_table("startstops")
    ss = ss[(ss["action"] == "transfer") & ss["key"].isin(tasks.index)]
    g = (ss["stop"] - ss["start"]).groupby(ss["key"])
    return pd.DataFrame({"seconds": g.sum(), "n": g.size()})


def _readied_by(tr: pd.DataFrame, stimuli: pd.Series) -> pd.Series:
    """For each key's ready stimulus: the key whose end (``-> memory`` or ``-> erred``)
    came with that stimulus."""
    ends = tr[tr["finish"].isin(["memory", "erred"]) & tr["stimulus_id"].isin(stimuli.dropna())]
    ends = ends.drop_duplicates("stimulus_id", keep="last").set_index("stimulus_id")["key"]
    return stimuli.map(ends).astype(object).fillna("")


def _chains(transitions: pd.DataFrame, keys: pd.Index) -> dict[str, str]:
    """Each key's transitions as ``state -> state (stimulus, +t s)``, t from its first."""
    if not len(keys):
        return {}
    tr = transitions[transitions["key"].isin(keys)].sort_values("time", kind="stable")
    out = {}
    for key, g in tr.groupby("key", sort=False):
        t0 = float(g["time"].iloc[0])
        steps = [f"{g['start'].iloc[0]}"] + [
            f"{f} ({stimulus_kind(s)}, +{t - t0:.3f} s)"
            for f, s, t in zip(g["finish"], g["stimulus_id"], g["time"], strict=True)
        ]
        out[str(key)] = " -> ".join(steps)
    return out


def _critical(run: Run) -> pd.DataFrame:
    try:
        return critical_path(run)
    except StoreError:  # a run without its graph (step 2 not collected): no path to compare
        return pd.DataFrame(columns=["key", "prefix", "worker", "start", "stop", "duration"])


def _common(a: pd.DataFrame, b: pd.DataFrame) -> int:
    """How many tasks two paths share from their first on."""
    n = min(len(a), len(b))
    same = a["key"].to_numpy(dtype=object)[:n] != b["key"].to_numpy(dtype=object)[:n]
    return int(np.argmax(same)) if same.any() else n
