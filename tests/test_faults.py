"""Faults on real processes: the store stays readable and says what happened.

- a worker SIGKILLed mid-run: the run completes, the loss is recorded (which worker, when, which
  tasks were lost and recomputed);
- the client process killed mid-run (scheduler alive), and the scheduler's process group killed
  mid-run: the store opens, status is "incomplete", what was flushed is there, `info` says so;
- a flush that fails (the store directory replaced by a file): reported once, rows kept within
  the buffer bound, Dask keeps running, and the kept rows land once the store is back;
- an exception inside a collector hook is recorded in the errors table; Dask keeps running.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster

from metacollect import collect, open_run
from metacollect.check.validate import validate_store
from metacollect.cli import main
from metacollect.cli.info import describe
from metacollect.errors import MetacollectError
from metacollect.steps.job import scheduler_identity
from metacollect.steps.scheduler import SchedulerCollector, collectors
from metacollect.steps.worker import WorkerCollector, unended_workers
from metacollect.store.local import GATHERED_ATTR, LOCAL_ATTR


def slow_inc(x, delay=0.05):
    time.sleep(delay)
    return x + 1


def _cluster(n=2):
    return LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0")


# -- a worker killed ----------------------------------------------------------------------------


@pytest.mark.slow
def test_worker_sigkilled_mid_run(tmp_path):
    store = str(tmp_path / "kill.zarr")
    with (
        _cluster(2) as cluster,
        Client(cluster) as client,
        collect(client, store, flush_interval="0.5s"),
    ):
        futures = client.map(slow_inc, range(40), pure=False)
        total = client.submit(sum, futures)
        # wait until both workers hold results, then kill one of them
        deadline = time.time() + 60
        while time.time() < deadline:
            done = sum(f.status == "finished" for f in futures)
            held = {w for ws in client.who_has(futures).values() for w in ws}
            if done >= 10 and len(held) == 2:
                break
            time.sleep(0.05)
        victim = sorted(held)[0]
        pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        assert total.result(timeout=120) == sum(range(1, 41))  # the run completes
        killed_at = time.time()
    run = open_run(store)
    # the killed worker never took its final flush: its own rows since its last flush are
    # lost, and the store says so (and nothing else)
    assert run.attrs["status"] == "incomplete"
    (said,) = run.attrs["missing"]
    assert f"worker {victim} " in said and f"pid {pid})" in said and "final flush" in said
    ends = {a["address"]: a["ended"] for a in run.worker_groups().values()}
    assert ends[victim] is None
    assert all(isinstance(t, float) for w, t in ends.items() if w != victim)
    # what collecting cost a process is set with its end: the killed one has none to say
    cost = run.collector_cost().set_index("address")
    assert np.isnan(cost.loc[victim, "flush_cpu_s"])
    assert cost.drop(index=victim).flushes.ge(1).all()
    assert "1 process did not say (killed before the collection's end)" in "\n".join(
        describe(store)
    )
    workers = run.workers()
    gone = workers[workers.address == victim]
    assert len(gone) == 1
    assert gone.removed.iloc[0] <= killed_at and gone.removed.iloc[0] > gone.added.iloc[0]
    assert gone.removal_stimulus.iloc[0]
    losses = run.losses()
    assert len(losses) >= 1
    assert set(losses.worker) == {victim}
    assert losses.recomputed.all()
    tasks = run.tasks()
    recomputed = tasks[tasks.execution > 0]
    assert set(losses[losses.lost == "memory"].key) <= set(recomputed.key)
    # every recomputed execution ran on a surviving worker, after the loss
    assert (recomputed.worker != victim).all()
    assert (recomputed.time > gone.removed.iloc[0]).all()
    # everything else is intact: every task finished, the killed worker's flushed data is there
    assert set(tasks.prefix) >= {"slow_inc", "sum"}
    assert main(["validate", "-q", store]) == 0


def test_info_tells_a_process_killed_from_a_store_older_than_its_cost(tmp_path):
    """A process without ``collector_cost`` either never ended (killed: no ``ended``) or
    ended in a store written before the cost was recorded: ``collector_cost()`` says which
    through ``ended``, and ``info`` names each cause, never an older store's as killed."""
    from tests.test_store import store_of_groups

    # an older store's scheduler: its cluster ended, its group has no cost
    cost = {"flushes": 4, "flush_wall_s": 0.02, "flush_cpu_s": 0.01, "longest_gap_s": 5.0}
    workers = {
        "older": {"ended": 2.0},
        "killed": {"ended": None},
        "said": {"ended": 2.5, "collector_cost": {**cost, "process_cpu_s": 2.0}},
    }
    store = store_of_groups(str(tmp_path / "run.zarr"), {"ended": 3.0}, workers)

    got = open_run(store).collector_cost().set_index("pid")
    assert got.loc[10, "ended"] == 2.0 and np.isnan(got.loc[10, "flush_cpu_s"])
    assert np.isnan(got.loc[11, "ended"]) and np.isnan(got.loc[11, "process_cpu_s"])
    assert got.loc[12, "flush_cpu_share"] == pytest.approx(0.005)
    (scheduler,) = got[got.kind == "scheduler"].itertuples()
    assert scheduler.ended == 3.0 and np.isnan(scheduler.flushes)
    (line,) = [ln for ln in describe(store) if ln.startswith("collecting cost: ")]
    assert line == (
        "collecting cost: flushes 0.01 CPU-s of 2.0 (0.50 %) in 1 process, 4 flushes, "
        "longest gap 5.0 s; 1 process did not say (killed before the collection's end); "
        "2 processes did not say (not recorded: a store written before collector_cost)"
    )


def sigterm_a_worker_mid_run(client: Client) -> tuple[str, int, set[str]]:
    """Run 40 tasks, SIGTERM a worker once 10 are done, wait for all 40; the worker's
    address, pid and the keys whose results it held then (the ground truth: it ran them)."""
    futures = client.map(slow_inc, range(40), pure=False)
    while sum(f.status == "finished" for f in futures) < 10:
        time.sleep(0.05)
    ran_on: dict[str, set[str]] = {}
    for key, holders in client.who_has(futures).items():
        for w in holders:
            ran_on.setdefault(w, set()).add(key)
    victim = sorted(ran_on)[0]
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGTERM)
    assert client.gather(futures) == list(range(1, 41))
    return victim, pid, ran_on[victim]


@pytest.mark.slow
def test_worker_sigtermed_mid_run_takes_its_final_flush(tmp_path):
    """SIGTERM (a batch job's walltime, ``kill``): the worker flushes what it did since its
    last flush, then dies of the signal; its nanny starts another, as it would have."""
    store = str(tmp_path / "term.zarr")
    # no flush but the final ones; its Yappi profile too goes with its final flush
    with (
        _cluster(2) as cluster,
        Client(cluster) as client,
        collect(client, store, flush_interval="60s", yappi=True),
    ):
        _, pid, ran = sigterm_a_worker_mid_run(client)
    run = open_run(store)
    assert run.attrs["status"] == "complete" and run.attrs["missing"] == []
    workers = run.workers().set_index("pid")
    assert workers.loc[pid, "terminated"] == "SIGTERM" and workers.ended.notna().all()
    # its end under the signal sets what collecting cost it, as a worker that closed does
    cost = run.collector_cost().set_index("pid")
    assert cost.loc[pid, "flushes"] >= 1 and cost.loc[pid, "process_cpu_s"] > 0
    # and each of its flushes' rows, the final one's written under the signal too
    flushes = run.flushes()
    assert (flushes.group == cost.loc[pid, "group"]).sum() == cost.loc[pid, "flushes"]
    assert (workers.drop(index=pid).terminated == "").all()  # the others closed
    own = run.worker_table("tasks")
    mine = set(own[own.worker_group == workers.loc[pid, "group"]].key)
    assert ran <= mine  # every result it held, it had run and its group says so
    profiled = run.profile(task="slow_inc")
    assert (profiled[profiled.pid == pid].ttot > 0).any()
    assert main(["validate", "-q", store]) == 0


def test_a_worker_retired_mid_run_ends_its_record(tmp_path):
    """A worker that leaves on purpose takes its final flush: nothing is missing."""
    store = str(tmp_path / "retire.zarr")
    with (
        _cluster(2) as cluster,
        Client(cluster) as client,
        collect(client, store, flush_interval="10s"),  # no flush but the final ones
    ):
        first = client.gather(client.map(slow_inc, range(10), pure=False))
        victim = sorted(scheduler_identity(client)["workers"])[0]
        client.retire_workers([victim], close_workers=True)
        then = client.gather(client.map(slow_inc, range(10, 20), pure=False))
    assert first + then == list(range(1, 21))
    run = open_run(store)
    assert run.attrs["status"] == "complete" and run.attrs["missing"] == []
    groups = {a["address"]: p for p, a in run.worker_groups().items()}
    assert victim in groups and all(
        isinstance(run.groups[p]["ended"], float) for p in groups.values()
    )
    # the retired worker's own record holds what it ran before it left
    ran = run.worker_table("tasks")
    assert (ran.worker_group == groups[victim].rsplit("/", 1)[-1]).any()


def _sigterm_as_the_end_begins(dask_worker) -> None:
    """In the worker: SIGTERM just before its collector's end holds the signal, as a
    ``scancel`` right after adapt retired the worker can land on a busy machine."""
    from metacollect.steps import terminate

    held = terminate.held

    @contextlib.contextmanager
    def late():
        terminate.held = held
        signal.raise_signal(signal.SIGTERM)  # handled before the next line
        with held():
            yield

    terminate.held = late


@pytest.mark.slow
def test_a_sigterm_as_a_retired_workers_end_begins_still_takes_its_final_flush(tmp_path):
    """11-29, a full run on Slurm: adapt retired a worker and cancelled its job; the SIGTERM
    was handled as its collector's end began, after the end had marked the collector as
    stopped but before it held the signal. The signal's final flush then found nothing to
    do, the process died of it, and the group never ended. Either the end or the signal's
    own final flush must take it."""
    store = str(tmp_path / "late.zarr")
    with (
        _cluster(2) as cluster,
        Client(cluster) as client,
        collect(client, store, flush_interval="60s"),  # no flush but the final ones
    ):
        first = client.gather(client.map(slow_inc, range(10), pure=False))
        victim = sorted(scheduler_identity(client)["workers"])[0]
        pid = client.run(os.getpid, workers=[victim])[victim]
        client.run(_sigterm_as_the_end_begins, workers=[victim])
        client.retire_workers([victim], close_workers=True)
        then = client.gather(client.map(slow_inc, range(10, 20), pure=False))
    assert first + then == list(range(1, 21))
    run = open_run(store)
    assert run.attrs["status"] == "complete" and run.attrs["missing"] == []
    workers = run.workers().set_index("pid")
    assert workers.loc[pid, "terminated"] == "SIGTERM", workers
    assert workers.ended.notna().all()


@pytest.mark.parametrize("whose", ["worker", "scheduler"])
def test_a_failed_final_flush_is_named(tmp_path, whose):
    """A final flush that fails (the group's stream directory unusable: a filesystem that
    broke under it) loses its rows: a worker's dies with its process, the scheduler's stay
    in a memory the seal cannot read. The worker's group must not say it ended and the seal
    names it; the scheduler's end names its group. Before, both went unsaid and the run
    was ``complete`` without those rows."""
    store = str(tmp_path / "broken.zarr")
    with (
        _cluster(2) as cluster,
        Client(cluster) as client,
        collect(client, store, flush_interval="60s") as session,  # the final flush only
    ):
        assert sum(client.gather(client.map(slow_inc, range(10), pure=False))) == 55
        groups = sorted(
            dirpath
            for dirpath, _, files in os.walk(os.path.join(store, "clusters"))
            if "zarr.json" in files
            and (os.path.basename(os.path.dirname(dirpath)) == "workers") == (whose == "worker")
            and (whose == "worker" or os.path.basename(dirpath) == "scheduler")
        )
        victim = os.path.join(groups[0], ".streams")
        assert not os.path.exists(victim)  # no flush yet: the final one makes it
        with open(victim, "w") as f:  # a file where its streams go
            f.write("not a directory")
    assert session.status == "incomplete"
    group = os.path.relpath(groups[0], store)
    if whose == "worker":
        (line,) = [m for m in session.missing if "never took its final flush" in m]
        assert line.startswith(group)
        assert len(open_run(store).worker_table("tasks")) < 10  # its executions died with it
    else:
        assert f"{group}: the scheduler's final flush failed" in " ".join(session.missing)
    assert open_run(store).attrs["status"] == "incomplete"


def test_which_groups_the_seal_names_as_unended():
    """Only a worker group that says it has not ended: not one written before workers said
    so, not one kept on node-local disk and never gathered (named as such), and not a
    cluster group without its end (the scheduler's, named by unended_clusters)."""
    w = "clusters/c0/workers/"
    base = {"address": "tcp://h:1", "host": "h", "pid": 7}

    def group(kind="worker", **attrs):
        return {"node_type": "group", "attributes": {"kind": kind, **base, **attrs}}

    nodes = {
        f"{w}killed": group(ended=None),
        f"{w}ended": group(ended=1.5),
        f"{w}older": group(),
        f"{w}on-node": group(ended=None, **{LOCAL_ATTR: "h:/scratch/x"}),
        f"{w}gathered": group(ended=None, **{LOCAL_ATTR: "h:/scratch/y", GATHERED_ATTR: 2.0}),
        "clusters/c0": group("cluster", ended=None),
        f"{w}killed/threads": group("threads", ended=None),  # a worker's Yappi group
    }
    said = unended_workers(nodes)
    assert [m.split(":", 1)[0] for m in said] == [f"{w}gathered", f"{w}killed"]
    assert all("tcp://h:1 (host h, pid 7) never took its final flush" in m for m in said)


def test_an_unended_worker_is_named_with_how_its_batch_job_ended(tmp_path):
    """A worker that never took its final flush is named in ``missing`` with how its batch
    job ended, as the run recorded it (``job/batch``'s ends): a walltime or an out-of-memory
    kill is most often why. A worker whose job has no recorded end is named as before."""
    from metacollect.session import init_root
    from metacollect.session.end import finalize
    from metacollect.store.lifecycle import prepare_store
    from metacollect.store.writer import StoreWriter
    from tests.test_store import CLUSTER_ATTRS

    store = str(tmp_path / "run.zarr")
    prepare_store(store)
    w = StoreWriter(store)
    init_root(w, "r1")
    w.group("cluster", attrs={**CLUSTER_ATTRS, "ended": 3.0}, cluster="c1")
    for name, job in (("w-1", "1604"), ("w-2", "1605")):
        attrs = {"address": f"tcp://h:{name}", "host": "h", "pid": 7, "ended": None}
        w.group("worker", attrs={**attrs, "batch_job_id": job}, cluster="c1", worker=name)
    ends = w.group("batch", attrs={"batch_system": "slurm"})
    ends.append(
        "ends",
        {
            "job_id": ["1604", "1604"],  # asked twice: the last row is how it ended
            "state": ["COMPLETING", "TIMEOUT"],
            "reason": ["None", "TimeLimit"],
            "exit_code": ["", "0:15"],
            "end_time": [1.7e9, 1.7e9],
            "captured": [1.7e9, 1.7e9 + 1],
            "details": ["{}", "{}"],
        },
    )
    w.flush()
    status, missing = finalize(store)

    assert status == "incomplete"
    by_worker = {m.split(":", 1)[0].rsplit("/", 1)[-1]: m for m in missing}
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1.7e9))
    assert by_worker["w-1"].endswith(
        f"Its batch job 1604 ended TIMEOUT (TimeLimit) at {at}, exit code 0:15."
    )
    assert "never took its final flush" in by_worker["w-2"]
    assert "batch job" not in by_worker["w-2"]
    assert open_run(store).attrs["missing"] == missing


# -- client / scheduler processes killed -------------------------------------------------------

CLIENT_SCRIPT = """
import sys, time
from distributed import Client
from metacollect import collect

def slow(x):
    time.sleep(0.05)
    return x

if __name__ == "__main__":
    address, store = sys.argv[1], sys.argv[2]
    client = Client(address) if address != "local" else Client(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0")
    with collect(client, store, flush_interval="0.3s"):
        client.gather(client.map(slow, range(20)))
        time.sleep(1.0)  # two flushes at least
        print("FLUSHED", flush=True)
        client.gather(client.map(slow, range(100, 100000)))
"""


def _start_and_kill(tmp_path, address, store, whole_group):
    script = tmp_path / "victim.py"
    script.write_text(textwrap.dedent(CLIENT_SCRIPT))
    proc = subprocess.Popen(
        [sys.executable, str(script), address, store],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == "FLUSHED", line
        # wait until the store shows the first 20 tasks (a loaded machine flushes late), so the
        # kill comes after a flush: what a reader saw before the kill must be there after it
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if (open_run(store).tasks().prefix == "slow").sum() >= 20:
                    break
            except MetacollectError:  # a half-created store while the first flush runs
                pass
            time.sleep(0.2)
        time.sleep(0.3)
    finally:
        if whole_group:
            os.killpg(proc.pid, signal.SIGKILL)  # like a batch system ending the job
        else:
            proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()


def _check_incomplete(store, capsys):
    run = open_run(store)
    assert run.attrs["status"] == "incomplete"
    tasks = run.tasks()
    assert (tasks.prefix == "slow").sum() >= 20  # everything flushed before the kill is there
    assert len(run.graphs()) >= 1
    assert main(["info", store]) == 0
    out = capsys.readouterr().out
    assert "status: incomplete" in out and "did not finish" in out
    assert main(["validate", "-q", store]) == 0
    return run


@pytest.mark.slow
def test_client_killed_mid_run(tmp_path, capsys):
    store = str(tmp_path / "client.zarr")
    with _cluster(1) as cluster, Client(cluster) as observer:
        _start_and_kill(tmp_path, cluster.scheduler_address, store, whole_group=False)
        # the scheduler and workers survive the client
        assert observer.submit(slow_inc, 1).result(timeout=30) == 2
        time.sleep(0.5)
        run = _check_incomplete(store, capsys)
        assert run.attrs["ended"] is None


def test_scheduler_killed_mid_run(tmp_path, capsys):
    store = str(tmp_path / "sched.zarr")
    _start_and_kill(tmp_path, "local", store, whole_group=True)
    run = _check_incomplete(store, capsys)
    cluster = run.groups[f"clusters/{run.clusters()[0]}"]
    assert cluster["ended"] is None  # the scheduler never said goodbye


# -- a failing flush ----------------------------------------------------------------------------


def _flush_state(plugin):
    """Per group: flush errors recorded, tables over their bound, and whether flushes fail."""
    out = {}
    for path, g in plugin.writer.groups.items():
        if "errors" not in g.tables:
            continue
        with g._flush_lock:  # not while a flush holds the rows
            errors = [c for _, c in g.tables["errors"]._chunks]
            flush_errors = sum(1 for c in errors for w in c["where"] if w == "flush")
            over = [n for n, t in g.tables.items() if t.pending > t.limit and len(t._chunks) > 1]
            out[path] = (flush_errors, over, g._failed)
    return out


def _scheduler_flush_state(dask_scheduler):
    (plugin,) = collectors(dask_scheduler)
    return _flush_state(plugin)


def _worker_flush_state(dask_worker):
    (plugin,) = [p for p in dask_worker.plugins.values() if isinstance(p, WorkerCollector)]
    return _flush_state(plugin)


def _point(link: str, target: str) -> None:
    """Point the symlink ``link`` at ``target`` in one atomic rename."""
    os.symlink(target, link + ".new")
    os.replace(link + ".new", link)


def test_failing_flush_reported_once_and_bounded(tmp_path):
    # the store's parent is a symlink, swapped in one rename (no flush can slip in) to a
    # directory where the store's name is a file: root can write anywhere, so a file it is
    good, blocked, link = (str(tmp_path / n) for n in ("good", "blocked", "link"))
    os.makedirs(good)
    os.makedirs(blocked)
    with open(os.path.join(blocked, "flaky.zarr"), "w") as f:
        f.write("not a directory")
    os.symlink(good, link)
    store = os.path.join(link, "flaky.zarr")
    # flushes on a fixed 0.2 s schedule (budget 1): the first ones create every array
    # and would otherwise stretch the interval past the test's few seconds
    with (
        _cluster(2) as cluster,
        Client(cluster) as client,
        collect(client, store, flush_interval="0.2s", flush_budget=1, buffer_limit=1000),
    ):
        assert sum(client.gather(client.map(slow_inc, range(10), delay=0))) == 55
        time.sleep(0.5)
        _point(link, blocked)
        # Dask keeps running through many failing flushes, with >1000 transitions pending
        for i in range(3):
            assert (
                len(client.gather(client.map(slow_inc, range(i * 1000, i * 1000 + 300), delay=0)))
                == 300
            )
            time.sleep(0.3)
        sched = client.run_on_scheduler(_scheduler_flush_state)
        workers = client.run(_worker_flush_state)
        for state in [sched, *workers.values()]:
            failing = {p: s for p, s in state.items() if s[2]}
            assert failing, state
            for path, (flush_errors, over, _) in failing.items():
                assert flush_errors == 1, (path, flush_errors)  # reported once
                assert not over, (path, over)  # bounded
        _point(link, good)  # the filesystem is back: kept rows land
        time.sleep(1.0)
        assert sum(client.gather(client.map(slow_inc, range(5), delay=0))) == 15
    run = open_run(store)
    assert run.attrs["status"] == "complete"
    errors = run.errors()
    flush = errors[errors["where"].str.endswith("flush")]
    assert len(flush) >= 1
    assert flush.groupby("group").size().max() == 1
    assert "rows dropped while flushes failed" in " ".join(errors.what)  # the bound was hit
    assert (run.tasks().prefix == "slow_inc").sum() >= 300  # kept rows were written after all


# -- an exception inside a hook ----------------------------------------------------------------


class _BrokenTasks:
    """A scheduler task mapping whose lookups fail: the transition hook's real code path."""

    def get(self, key):
        raise RuntimeError("broken task lookup")


class _BrokenRecorder:
    def __getattr__(self, name):
        raise RuntimeError(f"broken graph recorder: {name}")


class FailingCollector(SchedulerCollector):
    """The real collector, with state that makes its hooks fail."""

    async def start(self, scheduler):
        await super().start(scheduler)
        self._tasks = _BrokenTasks()
        self.graphs = _BrokenRecorder()

    def _swap(self):
        graphs = self.graphs
        self.graphs = type("G", (), {"swap": staticmethod(lambda: ([], []))})()
        try:
            return super()._swap()
        finally:
            self.graphs = graphs


def test_hook_exception_recorded_and_dask_keeps_running(tmp_path):
    store = str(tmp_path / "hooks.zarr")
    with (
        _cluster(1) as cluster,
        Client(cluster) as client,
        collect(client, store, flush_interval="0.3s") as session,
    ):
        failing = FailingCollector(session.store, {})
        client.unregister_scheduler_plugin(failing.name)
        client.register_plugin(failing)
        assert client.submit(slow_inc, 1, delay=0).result() == 2
        assert sum(client.gather(client.map(slow_inc, range(50), delay=0))) == sum(range(1, 51))
        with Client(cluster.scheduler_address) as other:  # add_client / remove_client hooks
            assert other.submit(slow_inc, 10, delay=0).result() == 11
        time.sleep(0.6)
    errors = open_run(store).errors()
    where = set(errors["where"])
    assert {
        "scheduler.transition",
        "scheduler.update_graph",
        "scheduler.add_client",
    } <= where, where
    tr = errors[errors["where"] == "scheduler.transition"]
    counted = tr.what.str.startswith("failed ")
    full = tr[~counted]
    assert full.what.str.contains("broken task lookup").all()
    assert len(full) == 10  # the first ten in full, not flooded
    assert "Traceback" in full.why.iloc[0]
    # the rest counted, and the counts written: nothing silent
    more = tr[counted].what.str.extract(r"failed (\d+) more times")[0].astype(int)
    assert len(more) >= 1 and more.sum() > 0


class _ReprRaises:
    def __repr__(self) -> str:
        raise RuntimeError("repr of this annotation fails")


def test_annotations_that_cannot_be_encoded_lose_no_row(tmp_path, client):
    """Annotations JSON cannot hold as they are (a dict with tuple keys, a value whose repr
    raises, a circular value) are stored as what JSON can hold (keys and values by their
    repr) or, when nothing can be encoded, as a placeholder naming their type with the
    failure recorded; every task of the run is still in the store (before: the whole flush
    batch failed and a quarter of the tasks went missing with status complete)."""
    import dask
    import dask.array as da

    store = str(tmp_path / "odd.zarr")
    with collect(client, store, flush_interval="50ms"):
        with dask.annotate(foo={(1, 2): "x"}):
            a = (da.ones(40, chunks=4) + 1).persist()
        with dask.annotate(bar=_ReprRaises()):
            b = (a * 2).sum().persist()
        assert b.compute() == 160
        with dask.annotate(odd=float("nan"), more=[{1j: b"x"}]):
            c = (da.ones(20, chunks=5) - 1).sum().compute()
        assert c == 0
    run = open_run(store)
    tasks, graph_tasks = run.tasks(), run.graph_tasks()
    assert run.attrs["status"] == "complete", run.attrs.get("missing")
    # every task the scheduler ran is there, with its transitions
    assert set(tasks.key) == set(graph_tasks.key) and len(tasks) >= 10 + 10 + 4 + 4
    # annotations every task of a graph shares are stored once, on the graph's row
    notes = " ".join([*run.graphs().annotations, *graph_tasks.annotations])
    assert '"foo":{"(1, 2)":"x"}' in notes
    assert "<_ReprRaises: repr failed>" in notes
    assert '"more":[{"1j":"b\'x\'"}]' in notes


def test_a_value_nothing_can_encode_becomes_a_placeholder_and_its_failure_is_told():
    """What even the slow path cannot encode (a circular value) is a placeholder naming
    its type, and the failure goes to the caller's recorder; JSON-able values are as
    ``json.dumps`` writes them."""
    import json

    from metacollect.steps.base import encode_json

    told: list[tuple[str, str]] = []
    circular: dict[str, object] = {}
    circular["self"] = circular
    placeholder = json.loads(encode_json(circular, lambda kind, why: told.append((kind, why))))
    assert placeholder["unencodable"] == "dict" and told[0][0] == "dict"
    assert "Recursion" in told[0][1] or "Circular" in told[0][1]
    assert encode_json({"a": [1, 2.5, None]}) == '{"a":[1,2.5,null]}'
    assert (
        encode_json({(1, 2): {3: _ReprRaises()}}) == '{"(1, 2)":{"3":"<_ReprRaises: repr failed>"}}'
    )


def test_a_column_of_priorities_is_encoded_as_each_value_alone():
    """encode_json_each, which encodes a column of tuples in one call and cuts it at its
    values, gives what encode_json gives each value, also where a value holds the cut's
    own ``],[`` (nested lists, a string), is empty, or cannot be encoded at all."""
    import json

    from metacollect.steps.base import encode_json, encode_json_each

    def kind(text: str) -> object:  # a placeholder's error text depends on the stack's depth
        return json.loads(text)["unencodable"] if text.startswith('{"unencodable"') else text

    circular: list[object] = []
    circular.append(circular)
    columns: list[list[object]] = [
        [(0, 1, i) for i in range(1000)],  # Dask's priorities
        [(-1, 2.5, float("nan"))],
        [(), [], (1,), ()],
        [(0, [[1], [2]]), (3,)],  # "],[" inside the first value
        [("a],[b",), (1, 2)],
        [(1, 2), None, (3,)],  # not all arrays
        [(1, {(2, 3): 4}), (5,)],  # a key JSON cannot hold: the slow path
        [(1, _ReprRaises()), (2,)],
        [(1, circular), (2,)],
        [],
    ]
    for values in columns:
        told_each: list[tuple[str, str]] = []
        told_alone: list[tuple[str, str]] = []
        alone = [encode_json(v, lambda k, w, t=told_alone: t.append((k, w))) for v in values]
        each = encode_json_each(values, lambda k, w, t=told_each: t.append((k, w)))
        assert list(map(kind, each)) == list(map(kind, alone)), values[:3]
        assert [k for k, _ in told_each] == [k for k, _ in told_alone]


def test_a_store_removed_mid_run_is_reported_and_never_remade_piecemeal(tmp_path, client, caplog):
    """The store's directory deleted while collect() runs: the flushes fail and keep their
    rows (reported once per group), the end says the record is lost in one logged line and
    on the session, nothing raises into the user's block, and no store is made anew there
    (before: Zarr recreated directories on write, and the path held a store without its
    run's attributes that open_run refused, with nothing said)."""
    import logging
    import shutil

    import dask.array as da

    store = str(tmp_path / "gone.zarr")
    with (
        caplog.at_level(logging.WARNING, logger="metacollect"),
        collect(client, store, flush_interval="50ms") as session,
    ):
        assert (da.ones(100, chunks=10) + 1).sum().compute() == 200
        time.sleep(0.3)
        os.rename(store, store + ".trash")  # at once, whatever a flush writes meanwhile
        shutil.rmtree(store + ".trash")
        assert (da.ones(100, chunks=10) + 2).sum().compute() == 300
        time.sleep(0.3)
    assert session.status == "incomplete", (session.status, session.missing)
    assert any("removed or replaced during the run" in m for m in session.missing)
    lost = [r for r in caplog.records if "record is not complete" in r.getMessage()]
    assert len(lost) == 1 and lost[0].levelname == "ERROR"
    # no store is made anew (a write in flight at the moment of the removal may still land
    # its chunk under the path: that is no store, and nothing opens it as one)
    assert not os.path.exists(os.path.join(store, "zarr.json"))


def test_metacollect_run_says_in_one_line_when_its_store_was_removed(tmp_path, capsys):
    """The script removes the run's own store: ``metacollect run`` ends with one line that
    says the record is lost and exit code 3, no traceback; the script's output is whole."""
    store = str(tmp_path / "gone.zarr")
    script = tmp_path / "removes_its_store.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, shutil, sys
            from distributed import Client

            store = STORE
            client = Client(processes=False, n_workers=1, dashboard_address=":0")
            print(client.submit(sum, [1, 2]).result())
            os.rename(store, store + ".trash")
            shutil.rmtree(store + ".trash")
            print(client.submit(sum, [3, 4]).result())
            """
        ).replace("STORE", repr(store))
    )
    code = main(["run", "--store", store, str(script)])
    _, err = capsys.readouterr()
    assert code == 3, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert "removed or replaced during the run" in last and store in last
    assert not os.path.exists(os.path.join(store, "zarr.json"))


# -- an external scheduler killed ---------------------------------------------------------------


def _external_cluster(tmp_path, sched_file):
    """A scheduler and a worker in processes of their own, as `dask scheduler`/`dask worker`."""
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file",
         sched_file, "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 60
    while not os.path.exists(sched_file) and time.time() < deadline:
        time.sleep(0.1)
    worker = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", sched_file,
         "--nthreads", "1", "--no-dashboard"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return scheduler, worker


def _files(store):
    """Every file of a store, with its size and modification time."""
    return {
        os.path.join(d, f): (
            os.stat(os.path.join(d, f)).st_size,
            os.stat(os.path.join(d, f)).st_mtime_ns,
        )
        for d, _, files in os.walk(store)
        for f in files
    }


@pytest.mark.slow
def test_an_external_scheduler_killed_while_collect_runs_is_told(tmp_path, caplog):
    """The scheduler (another process) dies while ``collect()`` runs: the store keeps what was
    flushed, and the status and ``missing`` say the scheduler was lost and what that costs.
    Its worker, still alive, writes nothing into the sealed store."""
    store, sched_file = str(tmp_path / "lost.zarr"), str(tmp_path / "scheduler.json")
    scheduler, worker = _external_cluster(tmp_path, sched_file)
    try:
        client = Client(scheduler_file=sched_file, timeout="20s")
        client.wait_for_workers(1, timeout=60)
        with collect(client, store, flush_interval="0.3s") as session:
            # a builtin: the worker cannot import this test module
            assert sum(client.gather(client.map(abs, range(-20, 0)))) == sum(range(1, 21))
            deadline = time.time() + 60
            while time.time() < deadline and (open_run(store).tasks().prefix == "abs").sum() < 20:
                time.sleep(0.2)
            scheduler.kill()
            scheduler.wait(timeout=30)
            killed_at = time.time()
            time.sleep(1.0)
        ended_after = time.time() - killed_at
        sealed = _files(store)
        time.sleep(2.0)  # the worker lives on, sampling and flushing every 0.3 s
        assert _files(store) == sealed  # but writes nothing into the sealed store
        client.close(timeout=5)
    finally:
        for proc in (worker, scheduler):
            proc.kill()
            proc.wait(timeout=30)
    assert session.status == "incomplete", (session.status, session.missing)
    (lost,) = [m for m in session.missing if "scheduler" in m and "lost" in m]
    assert "not in the store" in lost
    run = open_run(store)
    assert run.attrs["status"] == "incomplete" and lost in run.attrs["missing"]
    assert (run.tasks().prefix == "abs").sum() == 20  # what was flushed before the kill
    assert main(["validate", "-q", store]) == 0
    assert ended_after < 60, ended_after


# -- the durability promise, under kill -9 at a random time --------------------------------------

KILLED_AT_RANDOM = """
import os, sys, time
from distributed import Client
from distributed.diagnostics.plugin import SchedulerPlugin
from metacollect import collect

class TruthLog(SchedulerPlugin):
    '''The test's ground truth: one line per transition, written to the kernel at once
    (os.write), so it survives the SIGKILL that ends the scheduler's process.'''
    name = "truth-log"

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def transition(self, key, start, finish, *args, **kwargs):
        os.write(self.fd, f"{key}\\t{start}\\t{finish}\\t{time.time()!r}\\n".encode())

def slow(x):
    time.sleep(0.002)
    return x

if __name__ == "__main__":
    store, truth = sys.argv[1], sys.argv[2]
    client = Client(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0")
    client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.add_plugin(TruthLog(truth)))
    with collect(client, store, flush_interval="0.5s"):
        for i in range(1_000_000):
            client.gather(client.map(slow, range(i * 100, (i + 1) * 100)))
            if i == 5:
                print("RUNNING", flush=True)
"""


@pytest.mark.slow
def test_a_kill_at_a_random_time_loses_at_most_what_the_durability_promise_says(tmp_path):
    """kill -9 of the whole job (scheduler, client and workers) at a random moment: every
    transition older than the promised window (the flush interval, stretched at most
    MAX_STRETCH times, plus a flush in flight) is in the store."""
    import random

    from metacollect.store.flush import MAX_STRETCH

    seed = random.randrange(1_000_000)
    wait = random.Random(seed).uniform(1.0, 4.0)
    script = tmp_path / "victim.py"
    script.write_text(textwrap.dedent(KILLED_AT_RANDOM))
    store, truth = str(tmp_path / "killed.zarr"), str(tmp_path / "truth.tsv")
    proc = subprocess.Popen(
        [sys.executable, str(script), store, truth],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout.readline().strip() == "RUNNING"
        time.sleep(wait)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        killed_at = time.time()
        proc.wait(timeout=30)
        proc.stdout.close()
    with open(truth) as f:
        happened = [line.rstrip("\n").split("\t") for line in f if line.endswith("\n")]
    run = open_run(store)
    assert run.attrs["status"] == "incomplete"
    tr = run.transitions()
    stored = set(zip(tr.key.astype(str), tr.start.astype(str), tr.finish.astype(str), strict=True))
    missing = [float(t) for key, start, finish, t in happened if (key, start, finish) not in stored]
    window = MAX_STRETCH * 0.5 + 1.0  # the stretched interval, and a flush in flight
    oldest = killed_at - min(missing) if missing else 0.0
    print(f"kill at {wait:.2f} s: {len(missing)} of {len(happened)} lost, oldest {oldest:.2f} s")
    assert oldest <= window, f"seed {seed}: lost a transition {oldest:.2f} s old (> {window} s)"
    assert len(happened) - len(missing) > 100, f"seed {seed}"
    # a kill mid-flush leaves at most one torn stream a group, which validate names (its rows
    # are among those lost above, inside the window); nothing else may be wrong with the store
    problems = validate_store(store)
    torn = [p for p in problems if re.match(r"^\S+: stream \w+\.\d+\.arrows is torn \(", p)]
    assert problems == torn, f"seed {seed}: {problems}"
    groups = [p.split(": stream ")[0] for p in torn]
    assert len(groups) == len(set(groups)), f"seed {seed}: {torn}"
    assert main(["validate", "-q", store]) == (4 if torn else 0)


def _flush_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name == "metacollect-flush" and t.is_alive()]


def test_a_collector_removed_from_the_scheduler_stops_and_the_store_says_so(tmp_path):
    """A user's unregister_scheduler_plugin drops our collector without ending it (Dask has
    no hook for that): it writes what it has, stops its flushes, ends the workers'
    collectors, is still ended with the run, and the store says where the scheduler's record
    stops (before: its flush thread ran on for the life of the process, the run said
    nothing, and the store was sealed under a flush still in flight)."""
    store = str(tmp_path / "removed.zarr")
    with _cluster(1) as cluster, Client(cluster) as client:
        before = _flush_threads()
        with collect(client, store, flush_interval="0.2s") as session:
            assert sum(client.gather(client.map(slow_inc, range(10), delay=0))) == 55
            (name,) = client.run_on_scheduler(
                lambda dask_scheduler: [p.name for p in collectors(dask_scheduler)]
            )
            client.unregister_scheduler_plugin(name)
            time.sleep(1.0)  # a few flush intervals
            # nothing but us holds a dropped collector now: a garbage collection must not
            # take it away before it is ended (the scheduler runs in this process)
            gc.collect()
            assert client.submit(slow_inc, 100, delay=0).result() == 101
        assert session.status == "incomplete"
        assert any("removed from the scheduler" in m for m in session.missing), session.missing
        assert _flush_threads() == before  # nothing left flushing in this process
        left = client.run(
            lambda dask_worker: [n for n in dask_worker.plugins if "metacollect" in n]
        )
        assert all(v == [] for v in left.values()), left
    run = open_run(store)
    assert run.attrs["status"] == "incomplete"
    errors = run.errors()
    assert (errors["where"] == "scheduler.removed").sum() == 1
    assert len(run.tasks()) == 10  # the record up to the removal, whole
    assert len(run.worker_table("tasks")) == 10


def test_a_collector_removed_before_its_first_flush_is_found_dropped_all_the_same(tmp_path):
    """The scheduler holds the collector from the moment its ``start`` returns, not from
    its first flush: one removed before any flush is still found dropped (before: it was
    taken for one not yet held, and the store said nothing of the removal)."""
    store = str(tmp_path / "removed-early.zarr")
    with _cluster(1) as cluster, Client(cluster) as client:
        with collect(client, store, flush_interval="0.5s") as session:
            (name,) = client.run_on_scheduler(
                lambda dask_scheduler: [p.name for p in collectors(dask_scheduler)]
            )
            client.unregister_scheduler_plugin(name)
            time.sleep(1.5)  # a few flush intervals
        assert session.status == "incomplete"
        assert any("removed from the scheduler" in m for m in session.missing), session.missing
    run = open_run(store)
    assert run.attrs["status"] == "incomplete"
    assert (run.errors()["where"] == "scheduler.removed").sum() == 1
