"""The run's records that the steps' tables make together: tasks, workers, losses, jobs.

Each function reads the tables of a store (:class:`~metacollect.store.reader.StoreReader`,
which knows no step) and joins them as the steps wrote them: a task's execution numbered and
put in its graph and span, a worker's adds and removals with its group and batch job, the
tasks a removed worker took with it. :class:`~metacollect.analysis.run.Run` offers each as
a method (``open_run(path).tasks()``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from metacollect.analysis import clock
from metacollect.store.reader import StoreReader


def worker_metrics(run: StoreReader) -> pd.DataFrame:
    """Each worker's resource timeline on the scheduler's clock (:meth:`Run.worker_metrics`)."""
    df = run.concat("worker", "metrics")
    if "clock_delay" not in df:  # stores written before the offset was recorded
        df["clock_delay"] = 0.0
    df.insert(df.columns.get_loc("time") + 1, "worker_time", df["time"])
    df.insert(
        df.columns.get_loc("time") + 2, "time_dask", df["time"] + df["clock_delay"].fillna(0.0)
    )
    df = clock.to_scheduler(df, ("time",), clock.models(run), suffix="_own")
    # a worker without round trips: Dask's clock, as before they were taken
    raw = (df["clock"] != "scheduler").to_numpy()
    df.loc[raw, "time"] = df.loc[raw, "time_dask"]
    df.loc[raw, "clock"] = "dask"
    attrs = df.attrs
    df = df.drop(columns=["time_own"])
    df.attrs = {"clock": attrs["clock"].replace("worker", "dask")}
    return df


def losses(run: StoreReader) -> pd.DataFrame:
    """Tasks lost with a worker (:meth:`Run.losses`)."""
    cols = [
        "cluster",
        "worker",
        "removed",
        "removal_stimulus",
        "key",
        "lost",
        "recomputed",
    ]
    w = workers(run)
    w = w[w["removed"].notna()] if "removed" in w else w.iloc[:0]
    if not len(w):
        return pd.DataFrame({c: [] for c in cols})
    tr = run.concat("scheduler", "transitions")
    tr = tr[tr["start"].isin(["memory", "processing"])].drop(columns=["worker"])
    m = tr.merge(
        w[["cluster", "address", "removed", "removal_stimulus"]],
        left_on=["cluster", "stimulus_id"],
        right_on=["cluster", "removal_stimulus"],
    )
    m = m.rename(columns={"address": "worker", "start": "lost"})
    executions = tasks(run)
    last = executions.groupby(["cluster", "key"])["time"].max().rename("last_done").reset_index()
    m = m.merge(last, on=["cluster", "key"], how="left")
    m["recomputed"] = m["last_done"] > m["removed"]
    return m[cols].sort_values(["removed", "key"], ignore_index=True)


def workers(run: StoreReader) -> pd.DataFrame:
    """One row per worker ever seen (:meth:`Run.workers`)."""
    ev = run.concat("scheduler", "workers")
    adds = (
        ev[ev.event == "add"]
        .drop(columns=["event", "stimulus_id"])
        .rename(columns={"time": "added"})
    )
    adds = adds.drop_duplicates(["cluster", "address", "pid"], keep="first")
    rem = ev[ev.event == "remove"][["cluster", "address", "time", "stimulus_id"]]
    rem = rem.rename(columns={"time": "removed", "stimulus_id": "removal_stimulus"})
    adds = (
        pd.merge_asof(
            adds.sort_values("added"),
            rem.sort_values("removed"),
            left_on="added",
            right_on="removed",
            by=["cluster", "address"],
            direction="forward",
        )
        if len(rem) and len(adds)
        else adds.assign(removed=np.nan, removal_stimulus="")
    )
    groups = pd.DataFrame(
        [
            (
                p.split("/")[1],
                a.get("address"),
                a.get("pid"),
                p.split("/")[-1],
                np.nan if a.get("ended") is None else a["ended"],
                a.get("terminated") or "",
                a.get("batch_job_id") or "",
            )
            for p, a in run.worker_groups().items()
        ],
        columns=["cluster", "address", "pid", "group", "ended", "terminated", "batch_job"],
    )
    out = adds.merge(groups, on=["cluster", "address", "pid"], how="left")
    for column in ("terminated", "batch_job"):  # a worker without a group
        out[column] = out[column].fillna("")
    out["batch_job_end"] = _text_of(out["batch_job"], job_ends(run)["state"])
    return out.sort_values("added", ignore_index=True)


def jobs(run: StoreReader) -> pd.DataFrame:
    """One row per batch job, with how it ended (:meth:`Run.jobs`)."""
    jobs = run.table("job/batch", "jobs").drop_duplicates("job_id", keep="last")
    ends = job_ends(run)
    ids = jobs["job_id"]
    jobs["end_state"] = _text_of(ids, ends["state"])
    jobs["end_reason"] = _text_of(ids, ends["reason"])
    jobs["exit_code"] = _text_of(ids, ends["exit_code"])
    jobs["end_time"] = ids.map(ends["end_time"]).astype(float).fillna(jobs["end_time"])
    jobs["elapsed"] = jobs["end_time"] - jobs["start_time"]
    return jobs.reset_index(drop=True)


def job_ends(run: StoreReader) -> pd.DataFrame:
    """``job/batch``'s ``ends`` by job id (the last row of a job, if written twice)."""
    ends = run.table("job/batch", "ends")
    return ends.drop_duplicates("job_id", keep="last").set_index("job_id")


def tasks(run: StoreReader) -> pd.DataFrame:
    """One row per execution of a task, as the scheduler learnt it (:meth:`Run.tasks`)."""
    df = run.concat("scheduler", "tasks")
    df = df.sort_values(["time"], kind="stable", ignore_index=True)
    by = ["key"] if df["cluster"].nunique() <= 1 else ["cluster", "key"]
    ids = df[by[0]].to_numpy() if len(by) == 1 else pd.MultiIndex.from_frame(df[by])
    codes, _ = pd.factorize(ids)
    df.insert(
        2,
        "execution",
        pd.Series(codes).groupby(codes, sort=False).cumcount().to_numpy(),
    )
    df["duration"] = df["stop"] - df["start"]
    df = clock.tasks_on_scheduler(run, df)
    if not len(df):
        df.insert(5, "graph", np.full(0, -1, dtype=np.int64))
        df.insert(6, "span", np.full(0, "", dtype=object))
        return df
    # which graph and span each task group was submitted in: one read of the client's
    # tasks serves both (decoding a million rows' group strings is not free); the
    # span is looked up by graph, so the graph column goes in first
    submitted = run.concat("client", "tasks", columns=["graph", "group", "span"], distinct=True)
    df.insert(5, "graph", _graph_of(run, df, submitted))
    df.insert(6, "span", _span_of(df, submitted))
    return df


def _span_of(df: pd.DataFrame, submitted: pd.DataFrame) -> np.ndarray:
    """Span id of each execution, from the graph it was submitted in (a task group has
    one span within a graph: the first of its tasks the scheduler saw decided it).
    ``submitted``: the client's distinct (cluster, graph, group, span) rows."""
    pairs = submitted.drop_duplicates(["cluster", "graph", "group"])
    m = df[["cluster", "graph", "group"]].merge(pairs, on=["cluster", "graph", "group"], how="left")
    return m["span"].fillna("").to_numpy(dtype=object)


def _graph_of(run: StoreReader, df: pd.DataFrame, submitted: pd.DataFrame) -> np.ndarray:
    """Graph number of each execution: the first graph that submitted its key after the
    key's previous execution (since the run's start for its first), so that a graph that
    sends again keys an earlier graph submitted (in memory, or still running) is not
    credited with them; the latest submission before it ran when there is none.
    ``submitted``: the client's distinct (cluster, graph, group, span) rows.

    Fast path: when every task group was submitted in one graph, map by group (a small
    table) instead of joining millions of keys.
    """
    pairs = submitted[["cluster", "graph", "group"]].drop_duplicates()
    if not len(pairs):
        return np.full(len(df), -1, dtype=np.int64)
    if not pairs.duplicated(["cluster", "group"]).any():
        m = df[["cluster", "group"]].merge(pairs, on=["cluster", "group"], how="left")
        return m["graph"].fillna(-1).to_numpy(dtype=np.int64)
    gt = run.concat("client", "tasks", columns=["graph", "key"])
    g = run.concat("client", "graphs")[["cluster", "graph", "time"]]
    gt = gt.merge(g, on=["cluster", "graph"], how="left")
    left = df[["cluster", "key", "time"]].reset_index().sort_values("time", kind="stable")
    before = left.groupby(["cluster", "key"], sort=False)["time"].shift(1)
    left["after"] = before.fillna(-np.inf).to_numpy(dtype=float)
    right = gt.rename(columns={"time": "gtime"}).sort_values("gtime")
    by = ["cluster", "key"]
    latest = pd.merge_asof(left, right, left_on="time", right_on="gtime", by=by)
    first = pd.merge_asof(
        left.sort_values("after", kind="stable"),
        right,
        left_on="after",
        right_on="gtime",
        by=by,
        direction="forward",
    ).set_index("index")
    graph = latest.set_index("index")["graph"]
    # a recomputation after a worker's loss may run with no new submission: the first
    # submission after the previous execution then comes later, and does not count
    first = first.reindex(graph.index)
    took = first["graph"].notna() & (first["gtime"] <= first["time"])
    graph = first["graph"].where(took, graph)
    return graph.sort_index().fillna(-1).to_numpy(dtype=np.int64)


def _text_of(keys: pd.Series, values: pd.Series) -> pd.Series:
    """``values`` looked up by ``keys`` (a text column; ``""`` where none)."""
    found = keys.map(values).astype(object)
    return found.where(found.notna(), "")
