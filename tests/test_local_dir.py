"""Worker groups on node-local disk (``metacollect.store.local-dir``), gathered at the end.

During the run the run's store holds only a placeholder per worker (where its rows are); each
worker copies its group in at its end. A worker killed before that is named by the seal
(status incomplete), and ``metacollect gather`` adds what it left on the node.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import time

import pytest
from distributed import Client
from test_faults import _cluster, sigterm_a_worker_mid_run, slow_inc

from metacollect import collect, open_run
from metacollect.cli import main
from metacollect.store import streams
from metacollect.store.schema import load_schema


def noted_inc(x, notes):
    """``slow_inc`` that first notes its key in a file named after its process: the test's
    own record of what ran where, which a worker killed mid-run cannot take back."""
    from distributed import get_worker

    with open(os.path.join(notes, str(os.getpid())), "a") as f:
        f.write(f"{get_worker().get_current_task()}\n")
    return slow_inc(x)


def _files(path):
    return [f for _, _, files in os.walk(path) for f in files]


def _committed_tasks(store, address, least=3, timeout=60):
    """Rows of the ``tasks`` table that the worker at ``address`` has flushed to its spool
    on its node (where its group's placeholder in the store says), once there are at least
    ``least``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for doc in glob.glob(os.path.join(store, "clusters/*/workers/*/zarr.json")):
            with open(doc) as f:
                attrs = json.load(f)["attributes"]
            if attrs.get("address") != address or "local_store" not in attrs:
                continue
            # its flushes are in its streams until the seal writes them into Zarr
            spool = attrs["local_store"].split(":", 1)[1]
            group = os.path.relpath(os.path.dirname(doc), store)
            spec = load_schema().groups["worker"].tables
            tasks = streams.load(spool, group, spec).rows("tasks")
            rows = 0 if tasks is None else len(tasks["key"])
            if rows >= least:
                return rows
        time.sleep(0.1)


def test_workers_write_node_local_and_gather_at_their_end(tmp_path, monkeypatch):
    store, node = str(tmp_path / "run.zarr"), tmp_path / "node"
    monkeypatch.setenv("NODE_SCRATCH", str(node))  # expanded on the node, like $TMPDIR
    with (
        _cluster(2) as cluster,
        Client(cluster) as client,
        collect(client, store, flush_interval="0.2s", local_dir="$NODE_SCRATCH/mc") as session,
    ):
        futures = client.map(slow_inc, range(30), pure=False)
        assert sum(client.gather(futures)) == sum(range(1, 31))
        time.sleep(0.6)  # a few flushes
        # mid-run: the rows are on the node; the store has one placeholder per worker
        local_stores = glob.glob(str(node / "mc" / "metacollect-*" / "*.zarr"))
        assert len(local_stores) == 2
        assert all(
            glob.glob(os.path.join(s, "clusters/*/workers/*/.streams/*.arrows"))
            for s in local_stores
        )
        placeholders = glob.glob(os.path.join(store, "clusters/*/workers/*/zarr.json"))
        assert len(placeholders) == 2
        for p in placeholders:
            with open(p) as f:
                attrs = json.load(f)["attributes"]
            assert attrs["local_store"].split(":", 1)[1] in local_stores
            assert _files(os.path.dirname(p)) == ["zarr.json"]  # no table written there
    assert session.status == "complete", session.missing
    run = open_run(store)
    assert run.attrs["status"] == "complete" and run.attrs["missing"] == []
    # every execution the scheduler saw is in the worker groups, gathered from the node
    sched = run.tasks()
    wt = run.worker_table("tasks")
    assert sorted(wt.key) == sorted(sched.key) and len(wt) == 30
    for attrs in run.worker_groups().values():
        assert attrs["gathered"] >= attrs["started"]
    assert len(run.worker_table("transitions")) > 0 and len(run.worker_metrics()) > 0
    assert not os.listdir(node / "mc")  # the node's copies are removed once gathered
    assert main(["validate", "-q", store]) == 0


@pytest.mark.slow
def test_a_killed_worker_is_named_and_gather_adds_its_rows(tmp_path, capsys):
    store, node = str(tmp_path / "kill.zarr"), str(tmp_path / "node")
    with (
        _cluster(2) as cluster,
        Client(cluster) as client,
        collect(client, store, flush_interval="0.2s", local_dir=node) as session,
    ):
        notes = tmp_path / "ran"
        notes.mkdir()
        futures = client.map(noted_inc, range(40), notes=str(notes), pure=False)
        deadline = time.time() + 60
        while time.time() < deadline:
            done = [f for f in futures if f.status == "finished"]
            held = {w for ws in client.who_has(done).values() for w in ws}
            if len(done) >= 10 and len(held) == 2:
                break
            time.sleep(0.05)
        victim = sorted(held)[0]
        flushed = _committed_tasks(store, victim)  # the victim's rows on its node, so far
        pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        assert sum(client.gather(futures)) == sum(range(1, 41))
    # what ran on the victim up to its kill, as its tasks noted it (who_has, asked task by
    # task before the kill, missed one the victim finished and flushed meanwhile)
    ran_on_victim = set((notes / str(pid)).read_text().split())
    assert session.status == "incomplete"
    lines = [m for m in session.missing if "node-local disk" in m]
    assert len(lines) == 1 and "never gathered" in lines[0] and "metacollect gather" in lines[0]
    run = open_run(store)
    assert run.attrs["missing"] == session.missing
    (victim_group,) = [p for p, a in run.worker_groups().items() if a["address"] == victim]
    assert victim_group in lines[0]
    victim_id = victim_group.rsplit("/", 1)[1]  # noqa: F841  (the queries' @victim_id)
    assert len(run.worker_table("tasks").query("worker_group == @victim_id")) == 0
    # on the node, after the job: gather what the killed worker left
    left = glob.glob(os.path.join(node, "metacollect-*"))
    assert len(left) == 1
    capsys.readouterr()
    assert main(["gather", store, left[0]]) == 0
    assert f"gathered {victim_group}" in capsys.readouterr().out
    run = open_run(store)
    assert not [m for m in run.attrs["missing"] if "node-local" in m]
    # what it did after its last flush on its node is gone with it, and still said
    (said,) = [m for m in run.attrs["missing"] if m.startswith(f"{victim_group}:")]
    assert "never took its final flush" in said and run.attrs["status"] == "incomplete"
    got = run.worker_table("tasks").query("worker_group == @victim_id")
    # what it had flushed on its node before the kill, now in the store
    assert len(got) >= flushed and set(got.key) <= ran_on_victim
    assert main(["validate", "-q", store]) == 0


def test_local_dir_naming_an_unset_variable_is_said_and_the_run_goes_on(tmp_path):
    store = str(tmp_path / "unset.zarr")
    os.environ.pop("NO_SUCH_SCRATCH_VAR", None)
    with (
        _cluster(1) as cluster,
        Client(cluster) as client,
        collect(client, store, local_dir="$NO_SUCH_SCRATCH_VAR/x"),
    ):
        assert client.submit(slow_inc, 1).result() == 2
    run = open_run(store)
    assert len(run.worker_table("tasks")) == 1  # written to the run's store directly
    errors = run.errors()
    (why,) = errors[errors["where"].str.contains("node-local")].why
    assert "NO_SUCH_SCRATCH_VAR" in why and "does not set" in why


UNCLOSED = """
from dask.distributed import Client
import dask.array as da

if __name__ == "__main__":
    client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
    print((da.ones((200, 200), chunks=(20, 20)) + 1).sum().compute())
"""


@pytest.mark.slow
def test_run_node_local_on_a_script_that_never_closes_its_client(tmp_path, monkeypatch):
    script, store = tmp_path / "flow.py", str(tmp_path / "flow.zarr")
    script.write_text(UNCLOSED)
    monkeypatch.setenv("NODE_SCRATCH", str(tmp_path / "node"))
    code = main(["run", "--store", store, "--node-local", "$NODE_SCRATCH", str(script)])
    assert code == 0
    run = open_run(store)
    assert run.attrs["status"] == "complete", run.attrs["missing"]
    groups = run.worker_groups()
    assert len(groups) == 2 and all("gathered" in a for a in groups.values())
    # every execution the scheduler saw, in the workers' gathered groups
    assert sorted(run.worker_table("tasks").key) == sorted(run.tasks().key)
    assert len(run.tasks()) >= 100
    assert not os.listdir(tmp_path / "node")


@pytest.mark.slow
def test_a_sigtermed_worker_gathers_its_group_before_it_dies(tmp_path):
    """SIGTERM (a batch job's walltime: the node's scratch is wiped next): the worker takes
    its final flush on its node and copies its group into the run's store, then dies of the
    signal. Nothing is left to gather and nothing is missing."""
    store, node = str(tmp_path / "term.zarr"), str(tmp_path / "node")
    with (
        _cluster(2) as cluster,
        Client(cluster) as client,
        collect(client, store, flush_interval="60s", local_dir=node) as session,
    ):
        _, pid, ran = sigterm_a_worker_mid_run(client)
    assert session.status == "complete" and session.missing == []
    run = open_run(store)
    (group,) = [p for p, a in run.worker_groups().items() if a["pid"] == pid]
    attrs = run.groups[group]
    assert attrs["terminated"] == "SIGTERM" and "gathered" in attrs
    own = run.worker_table("tasks")
    assert ran <= set(own[own.worker_group == group.rsplit("/", 1)[1]].key)
    assert main(["validate", "-q", store]) == 0
