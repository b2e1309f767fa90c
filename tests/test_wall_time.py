"""Where the wall time went (:func:`metacollect.analysis.wall_time_breakdown`) and the figures
it shares with the report (:mod:`metacollect.analysis.figures`), against a ground truth the
run's tasks record themselves: each sleeping or spinning task returns its own wall and CPU
seconds, one array of known size moves from one pinned worker to the other, and the test
times the session from outside."""

from __future__ import annotations

import time

import numpy as np
import pytest
from distributed import wait
from views_runs import collected

import metacollect
from metacollect import analysis
from metacollect.steps.job import scheduler_identity

NAPS, NAP = 4, 0.3
SPINS, SPIN = 2, 0.3
ARRAY = 1_000_000  # float64: 8,000,000 bytes moved once


def nap(i):
    w, c = time.perf_counter(), time.thread_time()
    time.sleep(NAP)
    return time.perf_counter() - w, time.thread_time() - c


def spin(i):
    w, c = time.perf_counter(), time.thread_time()
    n = 0
    while time.perf_counter() - w < SPIN:
        n += 1
    return time.perf_counter() - w, time.thread_time() - c


def make(n):
    return np.ones(n)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    store = str(tmp_path_factory.mktemp("wall") / "run.zarr")
    outer = time.time()
    with collected(store) as client:
        inner = time.time()
        own = client.gather(client.map(nap, range(NAPS), pure=False))
        own += client.gather(client.map(spin, range(SPINS), pure=False))
        a, b = sorted(scheduler_identity(client)["workers"])
        x = client.submit(make, ARRAY, workers=[a], pure=False)
        wait(x)
        assert client.submit(len, x, workers=[b], pure=False).result() == ARRAY
        inner = time.time() - inner
    outer = time.time() - outer
    return {
        "run": metacollect.open_run(store),
        "outer": outer,
        "inner": inner,
        "task_wall": sum(w for w, _ in own),
        "task_cpu": sum(c for _, c in own),
        "n_timed": len(own),
    }


def test_parts_add_up_to_the_threads_time(measured):
    wt = analysis.wall_time_breakdown(measured["run"])
    assert wt.threads == 4  # 2 workers x 2 threads, as the cluster was started
    assert measured["inner"] <= wt.wall_s <= measured["outer"]
    assert wt.capacity_s == pytest.approx(wt.threads * wt.wall_s)
    in_threads = wt.parts[wt.parts["where"] == "task threads"]
    assert wt.seconds("idle") > 0
    assert in_threads["seconds"].sum() == pytest.approx(wt.capacity_s)
    assert in_threads["share"].sum() == pytest.approx(1.0)
    assert list(wt.parts["part"]) == [*analysis.wall_time.IN_THREADS, *analysis.wall_time.BESIDE]


def test_compute_and_cpu_hold_what_the_tasks_measured(measured):
    run, wt = measured["run"], analysis.wall_time_breakdown(measured["run"])
    compute = wt.seconds("compute")
    slack = 0.05 * len(run.tasks())  # Dask's interval around each function call
    assert measured["task_wall"] <= compute <= measured["task_wall"] + slack
    assert wt.utilisation == pytest.approx(compute / wt.capacity_s)
    fm = analysis.prefix_times(run)
    cpu = float(fm.loc[["nap", "spin"], "thread_cpu_s"].sum())
    assert measured["task_cpu"] <= cpu + 1e-3 and cpu <= measured["task_cpu"] + slack
    assert [p for p, _ in wt.heaviest[:2]] == ["nap", "spin"]
    assert wt.heaviest[0][1] == pytest.approx(fm.loc["nap", "compute_s"])
    assert wt.seconds("scheduler and waiting") > 0  # executor + other, Dask's fine metrics
    assert wt.seconds("collecting") > 0


def test_one_transfer_between_workers_counted_once(measured):
    run = measured["run"]
    moved = analysis.transfers(run)
    assert moved.between_workers == moved.sent_to_workers == 1
    assert moved.between_workers_bytes >= ARRAY * 8
    assert moved.to_client >= 1  # the results the client gathered
    wt = analysis.wall_time_breakdown(run)
    assert wt.seconds("transfer") > 0
    s = analysis.summary(run)
    assert s["transfers"] == 1 and s["transfer_bytes"] == moved.between_workers_bytes
    assert s["compute_time"] == wt.seconds("compute")
    assert s["utilisation"] == wt.utilisation
