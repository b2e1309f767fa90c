"""Step 4 on a real LocalCluster: executions, startstops, transfers, metrics per worker."""

from __future__ import annotations

import math

import dask.array as da
import numpy as np
import pytest
from reference import wait_idle

from metacollect import collect, open_run
from metacollect.cli import main
from metacollect.steps.job import scheduler_identity


def test_worker_groups_hold_their_executions(client, store):
    with collect(client, store, flush_interval="0.5s", snapshot_interval="0.2s"):
        x = da.random.random((600, 600), chunks=(100, 100))
        (x @ x.T).sum().compute()
        wait_idle(client)
    run = open_run(store)
    sched = run.tasks()
    wt = run.worker_table("tasks")
    assert len(wt) == len(sched)
    assert set(map(tuple, wt[["key", "thread"]].values)) == set(
        map(tuple, sched[["key", "thread"]].values)
    )
    assert (wt.stop >= wt.start).all() and wt.nbytes.gt(0).all()
    assert set(wt.typename) >= {"ndarray"}
    workers = run.workers().set_index("group")
    # each worker group executed exactly what the scheduler says that worker ran
    for group, rows in wt.groupby("worker_group"):
        addr = workers.loc[group, "address"]
        assert sorted(rows.key) == sorted(sched[sched.worker == addr].key)
    ss = run.worker_table("startstops")
    assert {"compute"} <= set(ss.action)
    assert "transfer" in set(ss.action)  # matmul moves blocks between the two workers
    tf = run.worker_table("transfers")
    assert set(tf.direction) == {"in", "out"} and tf.total.gt(0).all()
    metrics = run.worker_table("metrics")
    assert metrics.groupby("worker_group").size().min() >= 2
    assert metrics.memory.gt(0).all()
    # the timeline on Dask's clock is the worker's plus the offset it had then
    timeline = run.worker_metrics()
    assert timeline.clock_delay.notna().all()  # its size is distributed's estimate (load)
    assert np.allclose(timeline.time_dask - timeline.worker_time, timeline.clock_delay, atol=1e-9)
    # one clock: ``time`` on the scheduler's, the worker's plus its estimated offset
    assert (timeline.clock == "scheduler").all()
    offsets = run.clock_offsets().set_index("worker_group")
    moved = timeline.time - timeline.worker_time
    # to the float resolution of epoch seconds (2.4e-7 s): time - worker_time rounds
    assert np.allclose(moved, timeline.worker_group.map(offsets.offset), atol=5e-7)
    assert (offsets.uncertainty < 0.05).all() and (offsets.samples >= 5).all()
    assert timeline.time.min() <= wt.stop.max() <= timeline.time.max() + 1
    wtr = run.worker_table("transitions")
    assert {"executing", "memory"} <= set(wtr.finish)
    for _path, attrs in run.worker_groups().items():
        assert attrs["pid"] > 0 and attrs["nthreads"] == 2 and attrs["level"] == "worker"
    # start/stops and transfers on the scheduler's clock too, Dask's kept: a compute with
    # its execution's delay (so where its task is), the rest with the delay of their end
    ss = run.worker_table("startstops", clock="scheduler")
    assert (ss.clock == "scheduler").all() and ss.clock_delay.notna().all()
    compute = ss[ss.action == "compute"]
    assert (compute.clock_delay_source == "execution").all()
    assert set(ss.clock_delay_source) <= {"execution", "dask_delays", "nearest"}
    tasks = run.worker_table("tasks", clock="scheduler")
    on = ["cluster", "worker_group", "key", "start_dask"]
    same = compute.merge(tasks, on=on, suffixes=("", "_task"), validate="one_to_one")
    assert len(same) == len(tasks) and np.allclose(same.start, same.start_task, atol=1e-9)
    tf = run.worker_table("transfers", clock="scheduler")
    assert len(tf) and (tf.clock == "scheduler").all()
    assert set(tf.clock_delay_source) <= {"dask_delays", "nearest"}
    exact = tf.clock_delay_source == "dask_delays"
    assert (tf.clock_delay_error[exact] == 0).all() and tf.clock_delay_error.notna().all()
    np.testing.assert_allclose(tf.stop_dask - tf.start_dask, tf.stop - tf.start, atol=1e-6)
    assert len(run.worker_table("dask_delays")) >= 2  # each worker's value at its start


class _HeartbeatAtExecute:
    """A worker plugin, registered after the collector, that moves the worker's
    ``scheduler_delay`` to ``+jump`` or ``-jump`` (away from what it was) as each task
    begins executing: what a heartbeat answered between the collector's hook and
    distributed's read of the delay does. The collector sees the change as it sees a
    heartbeat's, the moment it is made (its wrapped heartbeat's ``observe``): a change it
    did not see, which distributed never makes, would be taken for one made at the next
    real heartbeat."""

    name = "heartbeat-at-execute"

    def __init__(self, jump: float) -> None:
        self.jump = jump

    def setup(self, worker):
        self.worker = worker

    def transition(self, key, start, finish, **kwargs):
        if finish == "executing":
            w = self.worker
            w.scheduler_delay = -self.jump if w.scheduler_delay > 0 else self.jump
            for plugin in list(w.plugins.values()):
                log = getattr(plugin, "delay_log", None)
                if log is not None:
                    log.observe()


def _started_on_worker_clock(i):
    import time

    return time.time()


def test_clock_delay_is_the_one_distributed_used_when_a_heartbeat_moves_it(client, store):
    """Task times carry the worker's scheduler_delay as distributed read it, a moment after
    the collector saw the task begin. Here the delay jumps by 0.3 s or more in that moment
    for every task: the delay stored is still the one added to the task's times (to within the run's
    overhead), so Darshan's times, on the worker's clock, meet the right task."""
    from distributed.diagnostics.plugin import WorkerPlugin

    plugin = type("Jump", (_HeartbeatAtExecute, WorkerPlugin), {})(0.3)
    with collect(client, store, flush_interval="0.5s"):
        client.register_plugin(plugin)
        try:
            futures = client.map(_started_on_worker_clock, range(20), pure=False)
            began = dict(zip([f.key for f in futures], client.gather(futures), strict=True))
            del futures
        finally:
            client.unregister_worker_plugin(plugin.name)
        wait_idle(client)
    wt = open_run(store).worker_table("tasks").set_index("key")
    wt = wt.loc[[k for k in began if k in wt.index]]
    assert len(wt) == 20
    # the delay distributed added: the task's reported start minus its own first clock read
    used = wt["start"] - wt.index.map(began)
    off = (used - wt["clock_delay"]).abs()
    assert off.max() < 0.05, (used, wt["clock_delay"])
    # read again at the task's end, the delay is exact but where two changes came during
    # the task (the other thread's jump): median 30 us, against 0.9 ms from the clamp alone
    assert off.median() < 3e-4, off.describe()
    # the jump landed before distributed read the delay (a heartbeat may undo one meanwhile)
    assert (used.abs() > 0.25).sum() >= 10


def test_the_delay_is_told_by_both_reads_when_a_heartbeat_came_before_distributeds():
    """The case of a Darshan run on a loaded machine (11-29): the delay seen as the task began
    was stale by 0.74 ms, distributed added the new one, and the clamp alone kept the stale
    one within the run's overhead, 0.5 ms off: the task's last write fell outside it. Read
    again at the finish, the delay that fits the run's bounds is the one used."""
    from metacollect.steps.worker import used_delay

    true, stale = -0.24938, -0.24864
    began, start_time, run_start, run_stop, finished = 100.0, 100.0004, 100.0005, 100.0025, 100.003
    compute = [{"action": "compute", "start": run_start + true, "stop": run_stop + true}]
    assert used_delay((stale, began, finished, true, start_time), compute) == true
    # without the second read (or the same value): moved into the bounds, not exact
    assert used_delay((stale, began, finished, stale, start_time), compute) == pytest.approx(
        true + 0.0001
    )
    # the change came during the run, after distributed's read: the first read was the one
    later = [{"action": "compute", "start": run_start + stale, "stop": run_stop + stale}]
    assert used_delay((stale, began, finished, true, start_time), later) == stale
    # a change smaller than the bounds: both fit, and the longer span decides where it came
    near = true + 0.0001
    short = [{"action": "compute", "start": run_start + true, "stop": 100.0007 + true}]
    assert used_delay((near, began, 100.0008, true, start_time), short) == true
    long_run = [{"action": "compute", "start": run_start + near, "stop": 100.9999 + near}]
    assert used_delay((near, began, 101.0, true, start_time), long_run) == near
    # unchanged: exact; never executed here (no compute): the delay as seen
    assert used_delay((true, began, finished, true, start_time), compute) == true
    assert used_delay((stale, math.nan, finished, true, None), []) == stale


def test_a_second_session_holds_only_its_own_transfers(client, tmp_path):
    """Dask's transfer logs outlive a session: the second store on the same cluster has the
    transfers of its own computation, none of the first's (checked by key)."""
    import numpy as np

    workers = sorted(scheduler_identity(client)["workers"])
    stores = [str(tmp_path / f"run{i}.zarr") for i in range(2)]
    keys = []
    for i, store in enumerate(stores):
        with collect(client, store, flush_interval="0.5s"):
            a = client.submit(np.ones, 100_000, workers=[workers[0]], key=f"data-{i}")
            b = client.submit(np.sum, a, workers=[workers[1]], key=f"use-{i}")
            assert b.result() == 100_000
            del a, b
            wait_idle(client)
        keys.append(f"data-{i}")
    for store, key, other in ((stores[0], keys[0], keys[1]), (stores[1], keys[1], keys[0])):
        tf = open_run(store).worker_table("transfers")
        moved = " ".join(map(str, tf["keys"]))
        assert key in moved and other not in moved, (store, list(tf["keys"]))
        assert (tf.start >= open_run(store).attrs["started"]).all()


def _spin_cpu(seconds):
    """Burn ``seconds`` of this thread's CPU; this process's pid and the CPU it burnt."""
    import os
    import time

    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        pass
    return os.getpid(), time.thread_time() - t0


def _process_cpu(dask_worker=None):
    import os
    import time

    return os.getpid(), time.process_time()


def test_each_process_records_what_collecting_cost_it(client, store, capsys):
    """The scheduler's and each worker's group say what collecting cost their process (its
    flushes' count, wall and CPU time, and the process's CPU while collected), checked
    against what the test measures itself: the CPU the tasks burnt (inside the window) and
    each process's CPU around the whole session (outside it)."""
    import time

    before = client.run(_process_cpu)
    test_cpu = time.process_time()  # the scheduler runs in this process
    session_began = time.time()
    with collect(client, store, flush_interval="0.3s"):
        burnt = client.gather(client.map(_spin_cpu, [0.15] * 8, pure=False))
        x = da.random.random((400, 400), chunks=(100, 100))
        (x @ x.T).sum().compute()
        time.sleep(0.7)  # a few ticks of the flush thread
    session_ended = time.time()
    test_cpu = time.process_time() - test_cpu
    after = client.run(_process_cpu)
    outside = {pid: after[w][1] - before[w][1] for w, (pid, _) in before.items()}
    by_task: dict[int, float] = {}
    for pid, cpu in burnt:
        by_task[pid] = by_task.get(pid, 0.0) + cpu

    run = open_run(store)
    cost = run.collector_cost()
    assert sorted(cost.kind) == ["scheduler", "worker", "worker"]
    assert cost.flushes.ge(3).all()  # the ticks and the final one
    assert (cost.flush_cpu_s > 0).all() and (cost.flush_wall_s > 0).all()
    assert (cost.flush_cpu_s < cost.process_cpu_s).all()
    assert cost.flush_cpu_share.between(0, 1, inclusive="neither").all()
    # the interval, stretched by slow flushes (flush-budget) at most 6 times
    assert cost.longest_gap_s.between(0.3, 6 * 0.3 + 1e-3).all()  # rounded to ms
    workers = cost[cost.kind == "worker"].set_index("pid")
    assert sorted(workers.index) == sorted(outside)
    for pid, row in workers.iterrows():
        # the window holds the tasks' own CPU and lies inside the test's measurement
        assert by_task.get(pid, 0.0) <= row.process_cpu_s <= outside[pid]
    assert sum(by_task.values()) >= 8 * 0.15
    (scheduler,) = cost[cost.kind == "scheduler"].itertuples()
    assert 0 < scheduler.process_cpu_s <= test_cpu
    # each flush's own row, the final one's included, adds up to the totals
    flushes = run.flushes()
    assert flushes.time.is_monotonic_increasing
    address_of = {pid: address for address, (pid, _) in before.items()}  # client.run's own
    for row in cost.itertuples():
        mine = flushes[flushes.group == row.group]
        assert len(mine) == row.flushes
        # labelled by the process's address, the worker's or the scheduler's
        expected = address_of[row.pid] if row.kind == "worker" else client.scheduler.address
        assert (mine.address == expected).all(), (mine.address.unique(), expected)
        assert row.address == expected  # the cost's row names the same process
        assert mine.cpu_s.sum() == pytest.approx(row.flush_cpu_s, abs=1e-5)
        assert mine.wall_s.sum() == pytest.approx(row.flush_wall_s, abs=1e-5)
        assert (mine.cpu_s <= mine.wall_s + 1e-3).all()
        # a tick comes an interval after the last began (or later); the final flush, any time
        assert (mine.gap_s.iloc[:-1] >= 0.3 - 0.01).all() and mine.gap_s.iloc[-1] > 0
        assert mine.time.between(session_began, session_ended).all()
    for group in cost[cost.kind == "worker"].group:
        # a worker's flushes wrote every row of its group: each table's (its strings
        # apart), but the final flush's own row, written after it
        tables = set(run.schema.groups["worker"].tables) - {"strings"}
        held = sum(len(run.table(group, t)) for t in tables)
        assert flushes[flushes.group == group].rows.sum() == held - 1
    # and `metacollect info` says it in one line
    assert main(["info", store]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "collecting cost" in ln]
    flush, process = cost.flush_cpu_s.sum(), cost.process_cpu_s.sum()
    assert f"flushes {flush:.2f} CPU-s of {process:.1f} " in line and "in 3 processes" in line
