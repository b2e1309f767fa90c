"""Dask's spans, fine performance metrics and statistical profile: the store against the live
scheduler and workers of the same run.

One workload covers what the metrics are about: nested spans, unannotated work (Dask's
default span), results spilled to disk and read back, transfers between workers and a failing
task. The ground truth is read from Dask itself at the end of the run, once the workers'
heartbeats have carried everything to the scheduler.
"""

from __future__ import annotations

import json
import math
import time

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster, span, wait
from distributed.diagnostics.plugin import SchedulerPlugin
from views_runs import spin

from metacollect import collect, open_run
from metacollect.check.validate import validate_store
from metacollect.steps.finemetrics import CONTEXTS_WITH_SPAN
from metacollect.steps.job import scheduler_identity


class SpanTruth(SchedulerPlugin):
    """Each execution's span as the scheduler has it when the task finishes."""

    name = "span-truth"

    async def start(self, scheduler):
        self.scheduler = scheduler
        self.executed = []

    def transition(self, key, start, finish, *args, **kwargs):
        if start == "processing" and finish in ("memory", "erred"):
            ts = self.scheduler.tasks.get(key)
            self.executed.append((str(key), ts.group.span_id if ts is not None else None))


def boom(x):
    raise ValueError(f"task failed on purpose ({x})")


def make(n):
    return np.ones(n)


def length(a):
    return len(a)


def scheduler_truth(dask_scheduler):
    ext = dask_scheduler.extensions["spans"]
    spans = {
        sid: {
            "name": "/".join(s.name),
            "parent": s.parent.id if s.parent is not None else "",
            "start": s.start,
            "stop": s.stop,
            "done": s.done,
            "own": dict(s._cumulative_worker_metrics),
        }
        for sid, s in ext.spans.items()
    }
    metrics = {
        k: v for k, v in dask_scheduler.cumulative_worker_metrics.items() if isinstance(k, tuple)
    }
    return spans, metrics, dask_scheduler.plugins["span-truth"].executed


def settled_truth(client, timeout=20.0):
    """The scheduler's view once two reads a heartbeat apart agree (it lags the workers
    by one heartbeat, 0.5 s on a small cluster)."""
    deadline = time.time() + timeout
    before = client.run_on_scheduler(scheduler_truth)
    while True:
        time.sleep(1.2)
        now = client.run_on_scheduler(scheduler_truth)
        if now[1] == before[1] or time.time() > deadline:
            return now
        before = now


def close_enough(a, b, unit):
    if unit == "seconds":
        return abs(a - b) <= max(0.005, 0.02 * max(abs(a), abs(b)))
    return a == b


def workload(client):
    """Nested spans, default spans, spilling, transfers and a failure; returns what it holds."""
    with span("load"):
        x = da.random.random((4000, 1000), chunks=(1000, 1000)).persist()  # 4 x 8 MB
        wait(x)
        with span("clean"):
            y = (x * 2).persist()
            wait(y)
    total = (y + x).sum().compute()  # no span: Dask's default span; reads spilled chunks
    with span("fails"):
        f = client.submit(boom, 1, pure=False)
        wait(f)
    workers = sorted(scheduler_identity(client)["workers"])
    a = client.submit(make, 2_000_000, workers=[workers[0]], pure=False)
    b = client.submit(length, a, workers=[workers[1]], pure=False)  # a transfer for sure
    assert b.result() == 2_000_000
    assert total > 0
    return x, y, f, a, b


@pytest.fixture
def spilling_cluster():
    # results beyond 20 MiB a worker go to disk at once (execute's disk-write), and are
    # read back by their dependents (disk-read); the memory monitor stays out of it
    with (
        dask.config.set(
            {"distributed.worker.memory.target": 0.05, "distributed.worker.memory.spill": False}
        ),
        LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            memory_limit="400MiB",
            dashboard_address=":0",
            processes=True,
        ) as cluster,
    ):
        yield cluster


def test_spans_tasks_and_fine_metrics_equal_the_live_scheduler(spilling_cluster, store):
    with Client(spilling_cluster) as client:
        client.register_plugin(SpanTruth())
        with collect(client, store):
            held = workload(client)
            spans_truth, metrics_truth, executed = settled_truth(client)
        del held

    run = open_run(store)
    assert run.attrs["status"] == "complete"
    assert validate_store(store) == []

    # the workload did what it is for
    names = {s["name"] for s in spans_truth.values()}
    assert {"load", "load/clean", "fails", "default"} <= names
    contexts = {(k[0], k[-2]) for k in metrics_truth}
    assert {("execute", "disk-write"), ("execute", "disk-read"), ("execute", "failed")} <= contexts
    assert ("gather-dep", "network") in contexts and ("get-data", "network") in contexts

    # every span: name, parent, start, stop, done
    sp = run.spans().set_index("id")
    assert set(sp.index) == set(spans_truth)
    for sid, t in spans_truth.items():
        row = sp.loc[sid]
        assert (row["name"], row["parent"], bool(row["done"])) == (
            t["name"],
            t["parent"],
            t["done"],
        )
        if t["start"] == 0.0:  # Dask's "no task finished" (the failed span): NaN in ours
            assert math.isnan(row["start"]), t["name"]
        else:
            assert abs(row["start"] - t["start"]) <= 0.005, (t["name"], row["start"], t["start"])
        assert abs(row["stop"] - t["stop"]) <= 0.005, (t["name"], row["stop"], t["stop"])
    assert sp.loc[sp["name"] == "load/clean", "depth"].tolist() == [2]

    # every execution's span
    tasks = run.tasks()
    assert sorted(zip(tasks["key"].astype(str), tasks["span"], strict=True)) == sorted(executed)

    # every fine-metric key, summed over workers and time, equals the scheduler's
    fm = run.fine_metrics(by=["context", "prefix", "activity", "unit"])
    ours = {}
    for ctx, prefix, activity, unit, value in fm.itertuples(index=False):
        key = (
            (ctx, prefix, activity, unit)
            if ctx in CONTEXTS_WITH_SPAN or prefix
            else (ctx, activity, unit)
        )
        ours[key] = value
    assert set(ours) == set(metrics_truth)
    for key, value in metrics_truth.items():
        assert close_enough(ours[key], value, key[-1]), (key, ours[key], value)

    # and each span's own totals equal the scheduler's per-span totals
    per_span = run.fine_metrics(by=["span", "context", "prefix", "activity", "unit"])
    for sid, t in spans_truth.items():
        mine = per_span[per_span["span"] == sid]
        got = {
            (c, p, a, u): v
            for c, p, a, u, v in mine[
                ["context", "prefix", "activity", "unit", "value"]
            ].itertuples(index=False)
        }
        assert set(got) == set(t["own"]), t["name"]
        for key, value in t["own"].items():
            assert close_enough(got[key], value, key[-1]), (t["name"], key, got[key], value)
        assert set(mine["span_name"]) <= {t["name"]}

    # over time: the deltas of each worker add up to the same totals
    over_time = run.fine_metrics(time=True)
    assert over_time["time"].is_monotonic_increasing or over_time["time"].notna().all()
    assert math.isclose(over_time["value"].sum(), fm["value"].sum(), rel_tol=1e-9)

    # the span summary: the execute seconds by activity of each span add up
    summary = run.span_summary().set_index("name")
    secs: dict[str, float] = {}
    for key, value in spans_truth[sp.index[sp["name"] == "load/clean"][0]]["own"].items():
        if key[0] == "execute" and key[-1] == "seconds":
            secs[key[2]] = secs.get(key[2], 0.0) + value
    row = summary.loc["load/clean"]
    assert math.isclose(row["execute"], sum(secs.values()), rel_tol=0.02, abs_tol=0.005)
    assert math.isclose(row["thread-cpu"], secs.get("thread-cpu", 0.0), rel_tol=0.02, abs_tol=0.005)
    assert summary.loc["fails", "failed"] > 0
    assert (summary["idle"] >= 0).all()


def test_dask_statistical_profile_equals_the_workers_own(client, store):
    """Every run has Dask's sampled profile: per prefix and cycle, the same samples the
    workers hold, and the busy function on top."""
    with collect(client, store):
        futures = client.map(spin, [0.6] * 4, pure=False)
        wait(futures)

        def samples(dask_worker):
            cycles = sum(
                d["spin"]["count"] for _, d in dask_worker.profile_keys_history if "spin" in d
            )
            return cycles + dask_worker.profile_keys.get("spin", {}).get("count", 0)

        truth = client.run(samples)

    run = open_run(store)
    nodes = run.dask_profile(prefix="spin", nodes=True)
    roots = nodes[nodes["parent"] < 0]
    stored = roots.groupby("worker")["count"].sum().to_dict()
    assert stored == {w: n for w, n in truth.items() if n}
    top = run.dask_profile(prefix="spin")
    assert top.iloc[0]["name"] == "spin"
    interval = run.worker_groups()[next(iter(run.worker_groups()))]["profile_interval"]
    assert top.iloc[0]["self_seconds"] == pytest.approx(top.iloc[0]["self"] * interval)
    # 2.4 s of spinning over four threads, sampled at most every 10 ms (the event loop
    # that samples competes for the GIL with the spinning threads: fewer, never more)
    assert 0.3 <= top.iloc[0]["total_seconds"] <= 2.6
    assert top.iloc[0]["self"] >= 0.9 * top["self"].sum()
    # each sample ends in one node: its self, or its caller's unresolved
    for _, tree in nodes.groupby("tree"):
        root = tree.loc[tree["parent"] < 0, "count"].iloc[0]
        assert tree["self"].sum() + tree["unresolved"].sum() == root


def test_yappi_and_dask_profiles_side_by_side(client, store):
    with collect(client, store, yappi=True):
        wait(client.map(spin, [0.5, 0.5], pure=False))
    both = open_run(store).compare_profiles(prefix="spin")
    row = both[both["name"] == "spin"].iloc[0]
    assert row["yappi_calls"] == 2
    assert row["yappi_total"] == pytest.approx(1.0, rel=0.2)
    assert row["dask_self"] > 0 and row["dask_total"] <= 1.1
    assert both.iloc[0]["name"] == "spin"  # the heaviest for both


def test_code_frames_records_the_calling_code_per_span(client, store):
    with collect(client, store, capture={"code-frames": 1}), span("with-code"):
        client.submit(spin, 0.01, pure=False).result()  # the calling line
    assert dask.config.get("distributed.diagnostics.computations.nframes") == 0
    sp = open_run(store).spans().set_index("name")
    code = json.loads(sp.loc["with-code", "code"])
    assert any("the calling line" in c["code"] for c in code)
    assert any(c["filename"] == __file__ for c in code)


def test_capture_switches_leave_fine_metrics_and_profile_out(client, store):
    with collect(client, store, capture={"fine-metrics": False, "dask-profile": False}):
        wait(client.map(spin, [0.2, 0.2], pure=False))
    run = open_run(store)
    assert len(run.fine_metrics()) == 0
    assert len(run.dask_profile()) == 0
    assert len(run.tasks()) == 2 and set(run.tasks()["span"]) != {""}


class Unreadable(dict):
    """Dask state that cannot be read (a fault the real worker does not produce)."""

    def items(self):
        raise RuntimeError("digests unreadable")

    def __iter__(self):
        raise RuntimeError("digests unreadable")

    def keys(self):
        raise RuntimeError("digests unreadable")


def test_a_failing_fine_metrics_read_is_recorded_and_costs_nothing_else(client, store):
    """A reader of Dask's state that fails costs only its own part of the flush: every task
    is still stored, the failure is in the errors table and the status says what is lost."""
    from metacollect.steps.worker import worker_plugin_name

    with collect(client, store, flush_interval="0.2s"):

        def break_digests(dask_worker, name):
            dask_worker.plugins[name].digests._digests = Unreadable({("x",): 1})

        client.run(break_digests, name=worker_plugin_name(store))
        wait(client.map(spin, [0.05] * 20, pure=False))
    run = open_run(store)
    assert len(run.tasks()) == 20
    assert len(run.worker_table("tasks")) == 20
    errors = run.errors()
    where = errors[errors["where"].str.contains("take fine metrics")]
    assert len(where) >= 2 and set(where["what"]) == {"RuntimeError: digests unreadable"}
    # the metrics never became readable again: the store says what it lacks
    assert run.attrs["status"] == "incomplete"
    assert any(
        "fine metrics could not be read at its final flush" in m for m in run.attrs["missing"]
    )


def test_metacollect_spans_prints_the_tree_with_its_activities(client, store, capsys):
    from metacollect.cli import main

    # task groups of their own: a group's first task fixes its span for every later task
    # of the group (Dask's rule), so tasks of one function in two spans could share one
    with collect(client, store), span("outer"):
        client.submit(spin, 0.1, key="outer-0").result()
        with span("inner"):
            wait(client.map(spin, [0.05] * 3, key=[f"inner-{i}" for i in range(3)]))
    assert main(["spans", store]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["span", "wall", "s", "tasks"]
    rows = {line.split()[0]: line for line in out[1:3]}
    assert rows["outer"].startswith("outer") and rows["inner"].startswith("  inner")
    summary = open_run(store).span_summary().set_index("name")
    assert rows["inner"].split()[2] == "3"  # its own tasks
    assert float(rows["outer"].split()[3]) == pytest.approx(
        summary.loc["outer", "thread-cpu"], abs=0.01
    )
    assert main(["spans", store + ".missing"]) != 0
