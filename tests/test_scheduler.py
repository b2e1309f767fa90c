"""Step 3 (and 2) collected on a real LocalCluster, checked against a reference plugin."""

from __future__ import annotations

import pathlib
import time

import dask
import dask.array as da
import dask.bag as db
import pytest
from distributed import wait
from reference import TransitionRecorder, recorded_log, wait_idle

from metacollect import collect, open_run
from metacollect.check.validate import validate_store
from metacollect.steps.scheduler import collectors


def boom(x):
    raise ValueError(f"boom {x}")


def test_every_transition_and_task_is_in_the_store(client, store):
    client.register_plugin(TransitionRecorder())
    with collect(client, store, flush_interval="0.5s"):
        x = da.random.random((400, 400), chunks=(100, 100))
        assert (x + x.T).sum().compute() > 0
        assert (
            db.from_sequence(range(50), npartitions=5).map(lambda v: v + 1).sum().compute() == 1275
        )
        futures = client.map(lambda v: v * 2, range(30))
        assert sum(client.gather(futures)) == 870
        bad = client.submit(boom, 1)
        wait(bad)
        assert bad.status == "error"
        with dask.annotate(priority=5, retries=1):
            y = da.ones(10, chunks=5) + 1
        y.compute(optimize_graph=False)
        del futures, bad, y, x
        wait_idle(client)
        reference = recorded_log(client)
    run = open_run(store)
    tr = run.transitions()
    got = list(zip(tr.key, tr.start, tr.finish, tr.stimulus_id, strict=False))
    assert got == reference

    tasks = run.tasks()
    done = tr[(tr.start == "processing") & tr.finish.isin(["memory", "erred"])]
    assert len(tasks) == len(done)
    assert tasks.worker.notna().all() and (tasks.thread > 0).all()
    assert (tasks.stop >= tasks.start).all() and tasks.start.notna().all()
    assert set(tasks.state) == {"memory", "erred"}
    erred = tasks[tasks.state == "erred"]
    assert len(erred) == 1 and "boom 1" in erred.exception.iloc[0]
    assert (tasks.execution == 0).all()
    assert set(tasks.prefix) >= {
        "random_sample",
        "add",
        "sum",
        "lambda",
        "boom",
        "from_sequence",
    } - {"from_sequence"}
    assert (tasks.graph >= 0).all()

    graphs = run.graphs()
    assert len(graphs) >= 5 and graphs.n_tasks.sum() >= len(set(tasks.key))
    assert graphs.client.nunique() == 1
    gt = run.graph_tasks()
    assert set(tasks.key) <= set(gt.key)
    deps = run.dependencies()
    assert len(deps) == graphs.n_dependencies.sum() > 0
    annotated = [a for a in [*graphs.annotations, *gt.annotations] if a]
    assert any('"retries":1' in a and '"priority":5' in a for a in annotated)

    workers = run.workers()
    assert len(workers) == 2 and workers.pid.gt(0).all() and workers.nthreads.eq(2).all()
    assert workers.group.notna().all()
    assert (workers.batch_job == "").all() and (workers.batch_job_end == "").all()
    jobs = run.jobs()  # no batch system: no jobs, and the columns a batch run would have
    assert jobs.empty and {"end_state", "exit_code", "end_time", "elapsed"} <= set(jobs.columns)
    states = run.worker_states()
    assert len(states) >= 2 and set(states.worker) == set(workers.address)
    assert run.errors().empty
    assert run.attrs["status"] == "complete"
    assert validate_store(store) == []


def flaky(counter: str, failures: int) -> int:
    """Fail the first ``failures`` calls (counted in a file, so across worker processes),
    then return the number of the attempt that succeeded."""
    path = pathlib.Path(counter)
    attempt = int(path.read_text()) if path.exists() else 0
    path.write_text(str(attempt + 1))
    if attempt < failures:
        raise OSError(f"attempt {attempt} failed")
    return attempt


def test_retries_count_the_retries_made(client, store, tmp_path):
    """``tasks().retries`` is the number of retries Dask made, as a user means it, not the
    retries left that Dask's TaskState holds."""
    counters = {name: str(tmp_path / name) for name in ("twice", "once", "doomed", "annotated")}
    with collect(client, store, flush_interval="0.5s"):
        twice = client.submit(flaky, counters["twice"], 2, retries=2, key="twice")
        once = client.submit(flaky, counters["once"], 1, retries=3, key="once")
        doomed = client.submit(flaky, counters["doomed"], 5, retries=1, key="doomed")
        plain = client.submit(flaky, str(tmp_path / "plain"), 0, key="plain")
        with dask.annotate(retries=4):
            annotated = dask.delayed(flaky)(counters["annotated"], 3, dask_key_name="annotated")
        assert twice.result() == 2 and once.result() == 1 and plain.result() == 0
        assert annotated.compute() == 3
        wait(doomed)
        assert doomed.status == "error"
    attempts = {name: int(pathlib.Path(c).read_text()) for name, c in counters.items()}
    assert attempts == {"twice": 3, "once": 2, "doomed": 2, "annotated": 4}
    tasks = open_run(store).tasks().set_index("key")
    assert tasks.loc[["twice", "once", "doomed", "plain", "annotated"], "retries"].to_dict() == {
        "twice": 2,
        "once": 1,
        "doomed": 1,
        "plain": 0,
        "annotated": 3,
    }
    assert tasks.loc["doomed", "state"] == "erred" and tasks.loc["twice", "state"] == "memory"
    assert (tasks.retries >= 0).all()


def test_custom_event_topics_are_recorded(client, store):
    with collect(client, store, flush_interval="0.5s"):
        client.log_event("my-topic", {"stage": "load", "n": 3})
        client.submit(lambda: 1).result()
    ev = open_run(store).events()
    mine = ev[ev.topic == "my-topic"]
    assert len(mine) == 1 and '"stage":"load"' in mine.msg.iloc[0]


def test_events_off_records_no_events(client, store):
    with collect(client, store, flush_interval="0.5s", capture={"events": False}):
        client.log_event("my-topic", {"stage": "load"})
        client.submit(lambda: 1).result()
    run = open_run(store)
    assert run.events().empty
    assert len(run.transitions()) > 0  # the rest is still collected


def collector_of(dask_scheduler):
    """The scheduler's one collector (these tests collect into one store at a time)."""
    (plugin,) = collectors(dask_scheduler)
    return plugin


def hold_the_loop(dask_scheduler, n, seconds):
    """Run on the scheduler's event loop and keep it: make ``n`` transitions through the
    collector's own hook, as one long step does (a big graph submitted), and wait until
    they are written or ``seconds`` pass. Returns the rows written meanwhile."""
    plugin = collector_of(dask_scheduler)
    before = plugin.n_transitions
    for i in range(n):
        plugin.transition(("held", i), "released", "waiting", stimulus_id="held-loop")
    deadline = time.monotonic() + seconds
    while plugin.n_transitions < before + n and time.monotonic() < deadline:
        time.sleep(0.05)  # blocks the event loop: this function runs on it
    return plugin.n_transitions - before


def test_transitions_are_flushed_while_the_event_loop_is_held(client, store):
    """The scheduler's flushes do not wait for its event loop: the transitions of one long
    step are written while it runs (memory and durability bounded by the interval)."""
    with collect(client, store, flush_interval="0.2s"):
        assert client.submit(inc, 1).result() == 2
        written = client.run_on_scheduler(hold_the_loop, n=5000, seconds=10)
        assert written >= 5000  # (and the rows of the task before, if not yet written)
    tr = open_run(store).transitions()
    held = tr[tr.stimulus_id == "held-loop"]
    assert held.key.tolist() == [str(("held", i)) for i in range(5000)]


def inc(x):
    return x + 1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_100k_task_graph_flushes_during_the_run(client, store):
    client.register_plugin(TransitionRecorder())
    flushed_during_run = []

    def rows_written(dask_scheduler):
        return collector_of(dask_scheduler).n_transitions

    with collect(client, store, flush_interval="0.5s"):
        n = 100_000
        dsk = {("inc", i): (inc, i) for i in range(n)}
        dsk["total"] = (sum, list(dsk))
        fut = client.get(dsk, "total", sync=False)
        while not fut.done():
            flushed_during_run.append(client.run_on_scheduler(rows_written))
            time.sleep(1)
        assert fut.result() == n * (n + 1) // 2
        del fut
        wait_idle(client)
        reference = recorded_log(client)
    run = open_run(store)
    tasks = run.tasks()
    assert len(tasks) >= 100_000
    tr = run.transitions()  # every one of the ~700k, in order, as the scheduler made them
    assert list(zip(tr.key, tr.start, tr.finish, tr.stimulus_id, strict=True)) == reference
    # the collector flushed while the graph ran, not only at the end: memory stays bounded
    assert max(flushed_during_run) > 0


def test_dependencies_stay_with_their_tasks_across_slices(client, store, monkeypatch):
    """A big graph is converted in slices: every task keeps exactly its own edges."""
    from metacollect.steps import client as client_step

    monkeypatch.setattr(client_step, "_SLICE", 7)  # the scheduler runs in this process
    x = da.ones(60, chunks=1).sum(split_every=4)
    with collect(client, store, flush_interval="0.5s"):
        assert x.compute() == 60
    run = open_run(store)
    gt, deps = run.graph_tasks(), run.dependencies()
    assert len(gt) > 7 * 3 and len(deps) == gt.n_dependencies.sum()
    per_key = deps.groupby("key").size()
    counted = gt.set_index("key").n_dependencies
    assert per_key.to_dict() == counted[counted > 0].to_dict()
    leaves = set(gt.key[gt.n_dependencies == 0])  # the 60 chunks (fused with ones)
    assert len(leaves) == 60
    assert sorted(deps.dependency[deps.dependency.isin(leaves)]) == sorted(leaves)


@pytest.mark.slow
def test_the_session_end_keeps_what_the_released_results_set_off(client, store):
    """A session ended right after ``dask.compute`` returns: the client has just released
    the results, and the scheduler forgets every task of the graph on those messages. The
    end must wait until the scheduler has handled them (a 1M-task run once lost every
    ``released -> forgotten``: the end overtook the client's releases)."""
    client.register_plugin(TransitionRecorder())
    x = da.ones((400, 400), chunks=(4, 4))  # 10,000 chunks
    with collect(client, store, flush_interval="30s"):
        total = client.compute((x + 1).sum())
        assert total.result() == 2 * 400 * 400
        del total  # released now; the graph's tasks are forgotten on that message
    wait_idle(client)  # everything the graph set off has happened
    reference = recorded_log(client)
    client.unregister_scheduler_plugin(TransitionRecorder.name)
    run = open_run(store)
    assert run.attrs["status"] == "complete", run.attrs.get("missing")
    tr = run.transitions()
    got = list(zip(tr.key, tr.start, tr.finish, tr.stimulus_id, strict=False))
    assert len(got) == len(reference)
    assert got == reference
    forgotten = tr[tr.finish == "forgotten"]
    assert set(forgotten.key) == set(tr.key)  # every task of the graph, to its end
