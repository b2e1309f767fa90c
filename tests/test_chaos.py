"""Chaos: every fault at once in one run - a worker SIGKILLed, the store unwritable for a
while, the client killed - on a scheduler and workers of their own (``dask scheduler``,
``dask worker``). The store opens and validates, and it holds the ground truth (recorded by
the test's own scheduler plugin) minus exactly what it says it lost: the killed worker's
rows since its last flush, nothing else."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import textwrap
import time

import groundtruth
import pytest
from distributed import Client

from metacollect import open_run
from metacollect.check.validate import validate_store
from metacollect.steps.job import scheduler_identity

pytestmark = pytest.mark.slow  # a scheduler, workers and a client killed, in real processes

CLIENT = """
import sys, time
from distributed import Client
from metacollect import collect

def work(x):
    time.sleep(0.01)
    return x

if __name__ == "__main__":
    scheduler_file, store = sys.argv[1], sys.argv[2]
    client = Client(scheduler_file=scheduler_file)
    client.wait_for_workers(3)
    with collect(client, store, flush_interval="0.3s", flush_budget=1):
        for i in range(1_000_000):
            keys = [f"work-{j}" for j in range(i * 60, (i + 1) * 60)]
            client.gather(client.map(work, range(i * 60, (i + 1) * 60), key=keys))
            print(f"BATCH {i}", flush=True)
"""


def _point(link, target):
    """Point the symlink ``link`` at ``target`` in one atomic rename."""
    os.symlink(target, link + ".new")
    os.replace(link + ".new", link)


def _wait_for(path, timeout=60):
    deadline = time.time() + timeout
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.1)
    assert os.path.exists(path), path


def _collecting(client, workers):
    """Per worker: whether its metacollect collector has been set up."""
    return client.run(
        lambda dask_worker: any(n.startswith("metacollect-worker") for n in dask_worker.plugins),
        workers=list(workers),
    )


def _until_batch(proc, n):
    for line in proc.stdout:
        if line.strip() == f"BATCH {n}":
            return
    raise AssertionError(f"the client ended before batch {n}")


def test_a_worker_killed_the_store_unwritable_and_the_client_killed_in_one_run(tmp_path):
    truth = str(tmp_path / "truth")
    env = {**os.environ, **groundtruth.environment(truth)}
    sched_file = str(tmp_path / "scheduler.json")
    # the store's parent is a symlink: swapped to a directory where the store's name is a
    # file, no process can write the store (root writes anywhere, so chmod would not do)
    good, blocked, link = (str(tmp_path / n) for n in ("good", "blocked", "link"))
    os.makedirs(good)
    os.makedirs(blocked)
    with open(os.path.join(blocked, "chaos.zarr"), "w") as f:
        f.write("not a directory")
    os.symlink(good, link)
    store = os.path.join(link, "chaos.zarr")
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file",
         sched_file, "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    procs = [scheduler]
    try:
        _wait_for(sched_file)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                 sched_file, "--nworkers", "3", "--nthreads", "1", "--no-dashboard"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
        script = tmp_path / "client.py"
        script.write_text(textwrap.dedent(CLIENT))
        client_proc = subprocess.Popen(
            [sys.executable, str(script), sched_file, store],
            env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        procs.append(client_proc)
        with Client(scheduler_file=sched_file) as observer:
            _until_batch(client_proc, 1)
            pids = observer.run(os.getpid)
            victim, pid = sorted(pids.items())[0]
            _until_batch(client_proc, 3)
            _point(link, blocked)  # the store is unwritable for a while,
            os.kill(pid, signal.SIGKILL)  # a worker dies mid-batch, and the one its nanny
            deadline = time.time() + 60  # starts in its place joins while the store is out
            while time.time() < deadline:
                new = set(scheduler_identity(observer)["workers"]) - set(pids)
                if new and all(_collecting(observer, new).values()):
                    break
                time.sleep(0.1)
            _point(link, good)
            _until_batch(client_proc, 10)
            client_proc.kill()  # the client, with its collect() block, is gone
            client_proc.wait(timeout=30)
            time.sleep(1.0)
        scheduler.send_signal(signal.SIGINT)  # the scheduler closes: its final flush
        scheduler.wait(timeout=60)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in reversed(procs):
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=30)
        client_proc.stdout.close()

    run = open_run(store)
    assert run.attrs["status"] == "incomplete"  # the client never ended the collection
    assert validate_store(store) == []
    # every failed flush was reported, and what it held was written when the store came back
    errors = run.errors()
    assert (errors["where"].str.endswith("flush")).any()
    (sid,) = groundtruth.load(truth)
    (cluster,) = run.clusters()
    assert run.groups[f"clusters/{cluster}"]["scheduler_id"] == sid
    # the scheduler lived to the end: its record is the ground truth, transition for transition
    rows = groundtruth.load(truth)[sid]["transitions"]
    expected = collections.Counter(tuple(r[:4]) for r in rows)
    tr = run.transitions()
    got = collections.Counter(zip(tr.key, tr.start, tr.finish, tr.stimulus_id, strict=True))
    assert got == expected, (sum((expected - got).values()), sum((got - expected).values()))
    # the workers' own records: every execution is in the group of the worker that ran it
    # (the replacement's too, made once the store was back), but the killed worker's since
    # its last flush
    done = tr[(tr.start == "processing") & (tr.finish == "memory")]
    ran = collections.Counter(zip(done.key, done.worker, strict=True))
    address = {p.rsplit("/", 1)[-1]: a["address"] for p, a in run.worker_groups().items()}
    assert len(address) == 4  # three, and the one its nanny started in its place
    wt = run.worker_table("tasks")
    recorded = collections.Counter(zip(wt.key, wt.worker_group.map(address), strict=True))
    # nothing that did not happen. The killed worker may have run a task the scheduler never
    # heard of (finished and flushed, its report still unsent at the kill); and any worker one
    # whose end crossed its release: the client died while it ran, the scheduler released it
    # from processing on that worker and dropped the worker's late report (a loaded machine)
    placed = set(
        zip(tr[tr.finish == "processing"].key, tr[tr.finish == "processing"].worker, strict=True)
    )
    let_go = set(tr[(tr.start == "processing") & (tr.finish != "memory")].key)
    crossed = {(k, w) for k, w in placed if k in let_go}
    unheard = {(k, w) for k, w in recorded - ran if w != victim}
    assert unheard <= crossed, sorted(unheard - crossed)[:5]
    missing = ran - recorded
    assert {w for _, w in missing} <= {victim}, sorted(missing)[:5]
    # and the store says that worker was lost, and when
    workers = run.workers()
    gone = workers[workers.address == victim]
    assert len(gone) == 1 and gone.removed.notna().all()
    assert sum(ran.values()) >= 10 * 60
    # the replacement joined while the store was out: it could not make its group then,
    # said so in its errors table, and made it once the store was back
    (replacement,) = [p for p, a in run.worker_groups().items() if a["address"] not in pids]
    assert "make group" in set(errors[errors.group == replacement]["where"])
