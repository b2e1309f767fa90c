"""Concurrency: two runs at once on one machine, two clients on one collected scheduler,
workers joining and leaving during a run, and the client's own refresh of what it knows of
the cluster racing the session's reads of it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import dask
import pytest
from distributed import Client, LocalCluster

from metacollect import collect, open_run
from metacollect.cli import main
from metacollect.steps.job import scheduler_identity


def slow(x, delay=0.02):
    time.sleep(delay)
    return x


RUN_SCRIPT = """
import sys, time
from distributed import Client
from metacollect import collect

def slow(x):
    time.sleep(0.02)
    return x

if __name__ == "__main__":
    tag, store = sys.argv[1], sys.argv[2]
    with Client(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as client:
        with collect(client, store, flush_interval="0.5s", run_id=tag):
            futures = [client.submit(slow, i, key=f"{tag}-{i}") for i in range(30)]
            assert sum(client.gather(futures)) == sum(range(30))
"""


@pytest.mark.slow
def test_two_runs_at_once(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(RUN_SCRIPT))
    stores = {tag: str(tmp_path / f"{tag}.zarr") for tag in ("alpha", "beta")}
    procs = [
        subprocess.Popen([sys.executable, str(script), tag, store]) for tag, store in stores.items()
    ]
    for p in procs:
        assert p.wait(timeout=180) == 0
    for tag, store in stores.items():
        run = open_run(store)
        assert run.attrs["status"] == "complete"
        assert run.attrs["run_id"] == tag
        assert len(run.clusters()) == 1
        tasks = run.tasks()
        assert set(tasks.prefix) == {tag}  # nothing of the other run
        assert len(tasks) == 30
        assert main(["validate", "-q", store]) == 0


@pytest.mark.slow
def test_two_clients_one_scheduler(tmp_path):
    store = str(tmp_path / "two.zarr")
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as a,
        Client(cluster.scheduler_address) as b,
        collect(a, store, flush_interval="0.5s"),
    ):
        fa = [a.submit(slow, i, key=f"froma-{i}") for i in range(20)]
        fb = [b.submit(slow, i, key=f"fromb-{i}") for i in range(20)]
        assert a.gather(fa) == b.gather(fb) == list(range(20))
        ids = {a.id, b.id}
    run = open_run(store)
    graphs = run.graphs()
    assert ids <= set(graphs.client)
    gt = run.graph_tasks().merge(graphs[["cluster", "graph", "client"]], on=["cluster", "graph"])
    by_client = gt.groupby("client").prefix.agg(set).to_dict()
    assert by_client[a.id] == {"froma"}
    assert by_client[b.id] == {"fromb"}
    clients = run.table(f"clusters/{run.clusters()[0]}/client", "clients")
    assert ids <= set(clients.client) or b.id in set(graphs.client)


def _wait_workers(client, n, timeout=90):
    deadline = time.time() + timeout
    while len(scheduler_identity(client)["workers"]) != n:
        assert time.time() < deadline, f"never reached {n} workers"
        time.sleep(0.1)


@pytest.mark.slow
def test_workers_join_and_leave(tmp_path):
    store = str(tmp_path / "adapt.zarr")
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        collect(client, store, flush_interval="0.3s"),
    ):
        seen = set(scheduler_identity(client)["workers"])
        cluster.scale(3)
        _wait_workers(client, 3)
        seen |= set(scheduler_identity(client)["workers"])
        assert len(client.gather(client.map(slow, range(60), pure=False))) == 60
        time.sleep(0.5)
        cluster.scale(1)
        _wait_workers(client, 1)
        remaining = set(scheduler_identity(client)["workers"])
        assert len(client.gather(client.map(slow, range(100, 110), pure=False))) == 10
    run = open_run(store)
    workers = run.workers()
    assert set(workers.address) == seen and len(seen) == 3
    left = workers[~workers.address.isin(remaining)]
    assert len(left) == 2 and left.removed.notna().all()
    assert (left.removed > left.added).all()
    assert workers[workers.address.isin(remaining)].removed.isna().all()
    # every worker, also those that left, wrote its own group
    assert workers.group.notna().all() and workers.group.nunique() == 3
    assert set(run.worker_table("tasks").worker_group) >= set(
        workers[workers.address.isin(remaining)].group
    )


@pytest.mark.slow
def test_the_cluster_recorded_at_each_start_has_its_workers_while_the_client_refreshes(
    tmp_path,
):
    """Step 1 records the cluster (its workers, their threads and memory) from the
    scheduler's own answer. ``Client.scheduler_info()`` returns what the client's periodic
    refresh last wrote, an identity without workers (distributed 2026.8): read there, a
    session whose start such a refresh overtook recorded a cluster of no workers. Here the
    client refreshes every millisecond: read through ``scheduler_info()``, 6 of 30 sessions
    recorded no workers (12-02), so 40 let that through once in ~7,000 runs; every one of
    them must record both."""
    with (
        dask.config.set({"distributed.client.scheduler-info-interval": "1ms"}),
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        # the ground truth, as each worker says it of itself: its name, threads and memory
        truth = client.run(
            lambda dask_worker: (
                str(dask_worker.name),
                dask_worker.state.nthreads,
                dask_worker.memory_manager.memory_limit,
            )
        ).values()
        threads = {name: n for name, n, _ in truth}
        memory = {name: limit for name, _, limit in truth}
        for i in range(40):
            store = str(tmp_path / f"s{i}.zarr")
            with collect(client, store):
                pass
            spec = open_run(store).groups["job"]["cluster_spec"]
            assert spec["n_workers"] == 2, f"session {i} recorded {spec}"
            assert spec["threads"] == threads and spec["memory_limit"] == memory, spec


def _transitions_of(run, prefix):
    t = run.transitions()
    t = t[t.key.astype(str).str.startswith(f"{prefix}-")]
    return sorted(zip(t.key.astype(str), t.start.astype(str), t.finish.astype(str), strict=True))


@pytest.mark.slow
def test_collections_nested_and_one_after_another_each_keep_a_whole_record(tmp_path, caplog):
    """``collect()`` inside ``collect()`` on one client: each store holds its own whole record
    (one collector per store, none replaces the other); one after another works too."""
    stores = {name: str(tmp_path / f"{name}.zarr") for name in ("outer", "inner", "next")}
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        with collect(client, stores["outer"], flush_interval="0.5s") as outer:
            assert sum(client.gather(client.map(slow, range(40), key=_keys("before", 40)))) == 780
            with collect(client, stores["inner"], flush_interval="0.5s") as inner:
                futures = client.map(slow, range(100), key=_keys("inner", 100))
                assert sum(client.gather(futures)) == 4950
            assert sum(client.gather(client.map(slow, range(40), key=_keys("after", 40)))) == 780
        with collect(client, stores["next"], flush_interval="0.5s") as after:
            assert sum(client.gather(client.map(slow, range(30), key=_keys("next", 30)))) == 435
        left = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
    assert not [name for name in left if name.startswith("metacollect")]
    assert "Could not find plugin" not in caplog.text
    assert (outer.status, inner.status, after.status) == ("complete",) * 3
    counts = {}
    for name, store in stores.items():
        run = open_run(store)
        assert run.attrs["status"] == "complete", run.attrs.get("missing")
        assert main(["validate", "-q", store]) == 0
        assert len(run.worker_groups()) == 2
        counts[name] = run.tasks().prefix.value_counts().to_dict()
    assert counts["outer"] == {"inner": 100, "before": 40, "after": 40}
    assert counts["inner"] == {"inner": 100}
    assert counts["next"] == {"next": 30}
    # the inner run's transitions are the same in both stores, row for row
    both = [_transitions_of(open_run(stores[name]), "inner") for name in ("outer", "inner")]
    assert both[0] == both[1] and len(both[0]) >= 100 * 4
    (cluster_id,) = open_run(stores["inner"]).clusters()
    shared = open_run(stores["inner"]).groups[f"clusters/{cluster_id}"]["shared_with"]
    assert shared == [stores["outer"]]


def test_a_nested_collection_leaves_yappi_to_the_first_and_says_so(tmp_path):
    """A process has one Yappi profiler: the first collection keeps it, and a collection
    nested in it that asked for Yappi too records why its store holds no profile."""
    outer_store, inner_store = str(tmp_path / "outer.zarr"), str(tmp_path / "inner.zarr")
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        collect(client, outer_store, yappi=True, flush_interval="0.5s"),
        collect(client, inner_store, yappi=True, flush_interval="0.5s") as inner,  # nested
    ):
        assert sum(client.gather(client.map(slow, range(20), key=_keys("inner", 20)))) == 190
    assert inner.status == "incomplete"
    (reason,) = inner.missing
    assert reason.startswith("yappi: not collected here") and outer_store in reason
    run = open_run(inner_store)
    assert run.attrs["status"] == "incomplete" and run.attrs["missing"] == [reason]
    assert len(run.tasks()) == 20
    assert len(open_run(outer_store).profile()) > 0


def _keys(prefix, n):
    return [f"{prefix}-{i}" for i in range(n)]
