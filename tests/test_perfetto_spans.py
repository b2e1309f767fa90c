"""Dask's spans and fine performance metrics in the Perfetto trace, on a real run with nested,
default, failing and concurrent spans (views_runs.spans_store)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from views_runs import spans_store

import metacollect
from metacollect import analysis
from metacollect.analysis.clock import models
from metacollect.analysis.spans import tree_order
from metacollect.export import perfetto


@pytest.fixture(scope="module")
def run():
    return metacollect.open_run(spans_store())


@pytest.fixture(scope="module")
def doc(run, tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    perfetto.write(run, path)
    with open(path) as f:
        return json.load(f)


def named(doc, what, pid=None):
    """{pid (or tid within ``pid``): name} of the metadata events ``what``."""
    return {
        (e["pid"] if pid is None else e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == what and (pid is None or e["pid"] == pid)
    }


def us(t, t0):
    return (t - t0) * 1e6


def test_spans_are_slices_of_their_own_process(run, doc):
    t0 = doc["metadata"]["time_origin_epoch_s"]
    assert t0 == analysis.origin(run)
    processes = named(doc, "process_name")
    (pid,) = [p for p, n in processes.items() if n == "spans"]
    events = [e for e in doc["traceEvents"] if e.get("cat") == "span"]
    assert {e["pid"] for e in events} == {pid}
    sp = run.spans()
    assert sorted(e["name"] for e in events) == sorted(sp["name"])
    by_id = {e["args"]["id"]: e for e in events}
    assert set(by_id) == set(sp["id"])
    for r in sp.itertuples(index=False):
        e = by_id[r.id]
        if np.isnan(r.start):  # no task finished: an instant where the scheduler saw it
            assert (e["ph"], e["s"], e["args"]["note"]) == ("i", "t", "no task finished")
            assert e["ts"] == pytest.approx(us(r.enqueued, t0), abs=1e-3)
            continue
        assert e["ph"] == "X"
        assert e["ts"] == pytest.approx(us(r.start, t0), abs=1e-3)
        assert e["dur"] == pytest.approx((r.stop - r.start) * 1e6, abs=2e-3)
        assert e["args"]["tasks"] == r.n_tasks and e["args"]["parent_id"] == r.parent
    assert {by_id[i]["args"]["note"] for i in sp.loc[sp["name"] == "fails", "id"]} == {
        "no task finished"
    }
    # every track the spans use is named
    assert set(named(doc, "thread_name", pid)) == {e["tid"] for e in events}


def test_spans_nest_inside_their_parents_and_never_overlap_on_a_track(run, doc):
    events = [e for e in doc["traceEvents"] if e.get("cat") == "span"]
    by_name = {e["name"]: e for e in events if e["name"] != "default"}
    parent_of = {e["args"]["id"]: e["args"]["parent_id"] for e in events}

    def ancestors(sid):
        while parent_of.get(sid):
            sid = parent_of[sid]
            yield sid

    def interval(e):
        """In integer ns, as Perfetto reads microseconds (``llround(us * 1000)``)."""
        start = round(e["ts"] * 1000)
        return start, start + round(e.get("dur", 0.0) * 1000)

    # a child on its parent's track, inside it
    load, clean = by_name["load"], by_name["load/clean"]
    assert clean["tid"] == load["tid"]
    assert interval(load)[0] <= interval(clean)[0] <= interval(clean)[1] <= interval(load)[1]
    # the twins ran at once: one nests in "twins", the other goes to a track of its own
    left, right, twins = by_name["twins/left"], by_name["twins/right"], by_name["twins"]
    (a, b), (c, d) = interval(left), interval(right)
    assert max(a, c) < min(b, d), "the workload's twins did not overlap"
    assert left["tid"] != right["tid"] and twins["tid"] in (left["tid"], right["tid"])
    # the Chrome trace format's rule for slices of one thread: nested or apart; and here,
    # nested only inside an ancestor
    for i, e in enumerate(events):
        for f in events[i + 1 :]:
            if e["tid"] != f["tid"]:
                continue
            (a, b), (c, d) = interval(e), interval(f)
            if max(a, c) < min(b, d) or (a == b and c < a < d) or (c == d and a < c < b):
                outer, inner = (e, f) if (a <= c and d <= b) else (f, e)
                (oa, ob), (ia, ib) = interval(outer), interval(inner)
                assert oa <= ia <= ib <= ob, (e["name"], f["name"])
                assert outer["args"]["id"] in set(ancestors(inner["args"]["id"]))
    # in tree order, as the run's spans: parents first
    order = tree_order(run.spans())["id"].tolist()
    assert [e["args"]["id"] for e in events] == order


def test_fine_metrics_are_each_workers_cumulative_execute_seconds(run, doc):
    t0 = doc["metadata"]["time_origin_epoch_s"]
    worker_of = {p: n.removeprefix("worker ") for p, n in named(doc, "process_name").items()}
    counters = [e for e in doc["traceEvents"] if e.get("cat") == "fine-metric"]
    assert counters and {e["ph"] for e in counters} == {"C"}
    assert {e["name"] for e in counters} == {perfetto.EXECUTE_COUNTER}
    fm = run.fine_metrics(by=["worker", "context", "activity", "unit"], time=True)
    ex = fm[(fm["context"] == "execute") & (fm["unit"] == "seconds")]
    # each worker's collector start, on the scheduler's clock as its flush times are
    found = models(run)
    started = {
        a["address"]: float(
            found[p.split("/")[1], p.split("/")[-1]].to_scheduler(np.array([a["started"]]))[0]
        )
        for p, a in run.worker_groups().items()
    }
    assert fm.attrs["clock"] == "scheduler"
    assert {worker_of[e["pid"]] for e in counters} == set(ex["worker"]) == set(started)
    for worker, truth in ex.groupby("worker"):
        mine = sorted((e for e in counters if worker_of[e["pid"]] == worker), key=lambda e: e["ts"])
        # zeros when the worker's collector took the snapshot the deltas count from
        assert mine[0]["ts"] == pytest.approx(us(started[worker], t0), abs=1e-3)
        assert set(mine[0]["args"].values()) == {0.0}
        # then a sample per flush, at the flush's time
        flushes = sorted(truth["time"].unique())
        assert [e["ts"] for e in mine[1:]] == pytest.approx([us(t, t0) for t in flushes], abs=1e-3)
        # cumulative: never down, and the last is the worker's total per activity
        for activity in mine[0]["args"]:
            series = [e["args"][activity] for e in mine]
            assert series == sorted(series)
        total = truth.groupby("activity")["value"].sum()
        assert mine[-1]["args"] == pytest.approx(total.to_dict())
        assert {"thread-cpu", "thread-noncpu", "executor", "other"} <= set(total.index)
    # the failed task's seconds are under "failed", on the worker that ran it
    assert any(e["args"].get("failed", 0) > 0 for e in counters)


def test_spans_and_fine_metrics_count_against_max_events(run):
    full = perfetto.trace(run, max_events=None)["metadata"]
    n_tasks = len(run.tasks())
    n_spans = len(run.spans())
    events = [e for e in perfetto.trace(run)["traceEvents"] if e.get("cat") == "fine-metric"]
    # room for the tasks only: every span and counter sample is dropped, and counted
    meta = perfetto.trace(run, max_events=n_tasks)["metadata"]
    assert meta["dropped"]["span"] == n_spans
    assert meta["dropped"]["fine-metric"] == len(events)
    assert meta["events_total"] == full["events_total"] and meta["truncated"] is True
    # the tasks, then the spans in tree order: three more events keep the first three spans
    doc = perfetto.trace(run, max_events=n_tasks + 3)
    kept = [e["args"]["id"] for e in doc["traceEvents"] if e.get("cat") == "span"]
    assert kept == tree_order(run.spans())["id"].tolist()[:3]
    assert doc["metadata"]["dropped"]["span"] == n_spans - 3
