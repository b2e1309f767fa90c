"""Each use of distributed's private API (metacollect/dask_private.py) behaves as relied on.

A change in distributed that breaks one of them fails here, by name."""

from __future__ import annotations

import asyncio
import gc
import inspect

import dask_jobqueue
import pytest
from distributed import Client, LocalCluster, Scheduler
from distributed.deploy.spec import SpecCluster
from distributed.diagnostics.plugin import NannyPlugin, WorkerPlugin

from metacollect import dask_private


class Marker(WorkerPlugin):
    name = "metacollect-test-marker"

    def setup(self, worker):
        self.worker = worker


class NannyMarker(NannyPlugin):
    name = "metacollect-test-nanny-marker"


@pytest.fixture(scope="module")
def cluster():
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield cluster, client


def _forgotten(dask_scheduler, keys):
    return [k for k in keys if k not in dask_scheduler.tasks]


def test_wait_stream_handled_follows_every_release(cluster):
    """A release (``del future``) made just before is handled by the scheduler when the
    call returns: the RPC that follows finds its keys forgotten, every time."""
    _, client = cluster
    for i in range(30):
        futures = client.map(lambda x: x + 1, range(20), key=[f"inc-{i}-{j}" for j in range(20)])
        client.gather(futures)
        keys = [f.key for f in futures]
        del futures
        gc.collect()
        assert dask_private.wait_stream_handled(client, 30)
        assert client.run_on_scheduler(_forgotten, keys=keys) == keys


def test_wait_stream_handled_leaves_the_scheduler_as_it_was(cluster):
    _, client = cluster
    before = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.clients))
    assert dask_private.wait_stream_handled(client, 30)
    assert client.list_datasets() == []
    after = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.clients))
    assert after == before


def test_wait_stream_handled_relies_on_the_publish_flush():
    """``unpublish_dataset`` flushes the batched stream before its RPC (the mark's op is
    one the scheduler's publish extension handles)."""
    source = inspect.getsource(Client._unpublish_dataset)
    assert "publish_flush_batched_send" in source
    assert "callback_timeout" in inspect.signature(Client.sync).parameters


def test_submit_scaled_jobs_starts_the_workers_in_the_spec():
    with LocalCluster(
        n_workers=0, processes=False, threads_per_worker=1, dashboard_address=":0"
    ) as cluster:
        assert inspect.iscoroutinefunction(cluster._correct_state_internal)
        while len(cluster.worker_spec) < 2:
            cluster.worker_spec.update(cluster.new_worker_spec())
        dask_private.submit_scaled_jobs(cluster)
        assert len(cluster.workers) == 2
        assert len(cluster.scheduler_info["workers"]) == 2


def test_job_template_of_a_jobqueue_cluster():
    with dask_jobqueue.SLURMCluster(
        cores=2, memory="1GB", processes=1, scheduler_options={"dashboard_address": ":0"}
    ) as cluster:
        job = dask_private.job_template(cluster)
        assert job is not None
        assert job.worker_cores == 2 and job.worker_processes == 1
        assert job.config_name == "slurm"
        assert isinstance(getattr(job, "_job_script_prologue", None), list)
    assert dask_private.job_template(object()) is None


def test_process_instances_holds_what_this_process_made(cluster):
    local, client = cluster
    clients, schedulers, clusters = dask_private.process_instances()
    assert client in clients
    assert local.scheduler in schedulers
    assert local in clusters
    assert all(isinstance(s, Scheduler) for s in schedulers)
    assert all(isinstance(c, SpecCluster) for c in clusters)


def test_add_and_remove_worker_plugin_with_each_reply(cluster):
    local, client = cluster
    scheduler = local.scheduler
    name = Marker.name

    async def add():
        return await dask_private.add_worker_plugin(scheduler, Marker(), name)

    async def remove():
        return await dask_private.remove_worker_plugin(scheduler, name)

    replies = client.sync(add)
    assert set(replies) == set(scheduler.workers)
    assert all(r["status"] == "OK" for r in replies.values())
    assert all(name in w.plugins for w in local.workers.values())
    # one worker has lost it already: its reply says so, the others' are OK
    first = next(iter(local.workers.values()))
    asyncio.run_coroutine_threadsafe(first.plugin_remove(name), client.loop.asyncio_loop).result()
    replies = client.sync(remove)
    absent = [a for a, r in replies.items() if dask_private.removed_absent(r, name)]
    assert absent == [first.address]
    assert all(r["status"] == "OK" for a, r in replies.items() if a != first.address)
    assert not any(name in w.plugins for w in local.workers.values())
    assert client.sync(remove) is None  # the scheduler holds none such any more


def test_add_and_remove_nanny_plugin_with_each_reply():
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as local,
        Client(local) as client,
    ):
        scheduler, name = local.scheduler, NannyMarker.name
        nannies = list(local.workers.values())  # in this process, as the scheduler

        async def add():
            return await dask_private.add_nanny_plugin(scheduler, NannyMarker(), name)

        async def remove():
            return await dask_private.remove_nanny_plugin(scheduler, name)

        replies = client.sync(add)  # by the address of each nanny's worker
        assert set(replies) == {n.worker_address for n in nannies}
        assert all(r["status"] == "OK" for r in replies.values())
        assert all(name in n.plugins for n in nannies)
        assert name in scheduler.nanny_plugins  # what a nanny to come gets
        replies = client.sync(remove)
        assert set(replies) == {n.worker_address for n in nannies}
        assert all(r["status"] == "OK" for r in replies.values())
        assert not any(name in n.plugins for n in nannies)
        assert client.sync(remove) is None  # the scheduler holds none such any more
