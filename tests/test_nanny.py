"""Step 4's end under a nanny (metacollect/steps/nanny.py) on real LocalClusters with
processes: a nanny that closes its worker lets the worker's collector take its final flush
first; the collection's end takes that plugin off the nannies."""

from __future__ import annotations

import os
import time

from distributed import Client, LocalCluster

from metacollect import collect, open_run
from metacollect.steps.nanny import nanny_plugin_name


def slow_inc(x, delay=0.05):
    time.sleep(delay)
    return x + 1


def _cluster(n):
    return LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0")


async def _busy_loop(seconds: float) -> None:
    """In the worker: hold its event loop (a loaded machine, a task holding the GIL)."""
    time.sleep(seconds)


def test_a_worker_scaled_down_while_busy_ends_its_record_before_its_nanny_kills_it(tmp_path):
    """A worker that ``cluster.scale`` or ``cluster.adapt`` retires closes itself as the
    scheduler drops it, and its nanny, which the cluster closes, kills the process 4 s after
    asking it to stop. A worker late to its plugins' teardowns (a loaded machine; its own
    close waiting on its nanny, which has stopped listening) lost its final flush. Here a
    freshly started worker's loop is held past that kill: its nanny must wait for the final
    flush, whose rows are what the test saw it run."""
    store = str(tmp_path / "scaled.zarr")
    with (
        _cluster(1) as cluster,
        Client(cluster) as client,
        collect(client, store, flush_interval="60s"),  # no flush but the final ones
    ):
        cluster.scale(2)
        client.wait_for_workers(2, timeout=60)
        # scale(1) retires the worker last added (SpecCluster drops the newest spec)
        (victim,) = [a for a, w in client.scheduler_info()["workers"].items() if w["name"] == 1]
        pid = client.run(os.getpid, workers=[victim])[victim]
        # what it ran (its collector set up before its first task): the final flush's rows
        futures = client.map(slow_inc, range(5), workers=[victim], pure=False)
        assert client.gather(futures) == list(range(1, 6))
        keys = {f.key for f in futures}
        del futures
        client.run(_busy_loop, 6.0, workers=[victim], wait=False)
        cluster.scale(1)
        deadline = time.time() + 60
        while len(cluster.workers) > 1 and time.time() < deadline:
            time.sleep(0.1)
        assert list(cluster.workers) == [0], "the scaled-down worker's nanny did not close"
    run = open_run(store)
    assert run.attrs["status"] == "complete", run.attrs["missing"]
    assert run.attrs["missing"] == []
    groups = {a["address"]: p for p, a in run.worker_groups().items()}
    assert run.groups[groups[victim]]["pid"] == pid
    assert isinstance(run.groups[groups[victim]]["ended"], float)
    ran = run.worker_table("tasks")
    mine = ran[ran.worker_group == groups[victim].rsplit("/", 1)[-1]]
    assert set(mine.key) == keys


def test_the_collections_end_takes_the_plugin_off_the_nannies(tmp_path):
    """Once the collection has ended, a nanny that closes its worker asks nothing of it: the
    plugin is gone from the scheduler (nannies to come) and from every nanny, and the run's
    errors table has nothing from it."""
    store = str(tmp_path / "ended.zarr")
    name = nanny_plugin_name(store)
    with _cluster(2) as cluster, Client(cluster) as client:
        with collect(client, store, flush_interval="60s"):
            assert client.gather(client.map(slow_inc, range(4), pure=False)) == [1, 2, 3, 4]
            assert name in cluster.scheduler.nanny_plugins
            assert all(name in n.plugins for n in cluster.workers.values())
        assert name not in cluster.scheduler.nanny_plugins
        assert not any(name in n.plugins for n in cluster.workers.values())
    run = open_run(store)
    assert run.attrs["status"] == "complete" and run.attrs["missing"] == []
    assert len(run.errors()) == 0
