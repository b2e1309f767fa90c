"""Two "nodes" on one machine (network and UTS namespaces, ``tests/nodes.py``), their workers
under the real Darshan runtime, their records on their own node-local directories, one of
them on a clock 1.5 s ahead: the store's view per node. Ground truths the test takes itself:
each node's host name and address, the skew it set, the files its tasks wrote and their
sizes."""

from __future__ import annotations

import glob
import os
import socket
import time

import pytest
from distributed import Client

from metacollect import collect, open_run
from metacollect.steps import darshan as dsh
from tests import nodes as nodes_fixture
from tests.test_clock_skew import FAKETIME, _sent_and_heard, faketime_env
from tests.test_darshan_live import darshan_library  # noqa: F401  (the fixture)

#: host name -> its clock's skew (seconds ahead of the scheduler's)
SKEWS = {"node-a": 0.0, "node-b": 1.5}
#: files per node and way of writing
FILES = 4

pytestmark = [pytest.mark.slow, pytest.mark.darshan]


@pytest.fixture(autouse=True)
def _nodes_can_be_made() -> None:
    """Namespaces and libfaketime, which CI has (.ci/run): there their absence fails."""
    why = nodes_fixture.usable()
    if why is None and not os.path.exists(FAKETIME):
        why = f"libfaketime is not installed ({FAKETIME}; apt-get install faketime)"
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"several nodes on one machine cannot be made in CI: {why}")
        pytest.skip(why)


def _node_env(store: str, host: str, library: str) -> dict[str, str]:
    """Darshan's variables for ``host`` (its own log directory), libfaketime beside them
    on a skewed node."""
    env = dsh.darshan_environment(store, host=host, library=library, dxt=True, environ={})
    if SKEWS[host]:
        env.update({k: v for k, v in faketime_env(SKEWS[host]).items() if k != "LD_PRELOAD"})
        env["LD_PRELOAD"] += f":{FAKETIME}"
    return env


def _write(client: Client, nodes: dict, data) -> dict[str, str]:
    """On each node, files written by ``numpy.save`` and ``open().write`` in tasks of
    known keys; each task's key -> its file. The results are released before the session's
    end restarts the workers (for their logs): a result still wanted would be computed
    again, its file written again."""
    written: dict[str, str] = {}
    futures = []
    for host, node in nodes.items():
        for i in range(FILES):
            for how, task in (("npy", nodes_fixture.save_array), ("bin", nodes_fixture.write_open)):
                key = f"{how}-{host}-{i}"
                written[key] = str(data / f"{key}.{how}")
                n = 1000 * (i + 1) + 37 * len(written)
                futures.append(
                    client.submit(task, written[key], n, key=key, workers=[node.address])
                )
    client.gather(futures)
    del futures
    return written


def _run(tmp_path, library: str) -> tuple[str, dict, dict[str, str]]:
    """The cluster, a session over the writes; the store, the nodes and each file's node."""
    store = str(tmp_path / "run.zarr")
    data = tmp_path / "data"
    data.mkdir()
    envs = {host: _node_env(store, host, library) for host in SKEWS}
    with (
        nodes_fixture.cluster(str(tmp_path), envs) as (address, nodes),
        Client(address, timeout=60) as client,
    ):
        client.wait_for_workers(len(nodes), timeout=120)
        now, clocks = time.time(), client.run(time.time)
        hosts = {a.split("://")[-1].rsplit(":", 1)[0] for a in clocks}  # each worker answered
        assert hosts == {n.address for n in nodes.values()}
        darshan = {"enabled": True, "library": library}
        with collect(client, store, darshan=darshan, local_dir="$TMPDIR"):
            written = _write(client, nodes, data)
    for host, node in nodes.items():  # the preload took: each clock is off as asked
        worker = next(a for a in clocks if a.startswith(f"tcp://{node.address}:"))
        assert abs(clocks[worker] - now - SKEWS[host]) < 0.5
    return store, nodes, written


def test_the_store_per_node(tmp_path, darshan_library):  # noqa: F811
    store, nodes, written = _run(tmp_path, darshan_library)
    run = open_run(store)
    assert run.attrs["status"] == "complete"
    address = {host: f"tcp://{node.address}:" for host, node in nodes.items()}

    # the worker groups: each node's own host name (its UTS namespace) and address
    groups = {a["host"]: (p, a) for p, a in run.worker_groups().items()}
    assert set(groups) == set(SKEWS)
    for host, (_, attrs) in groups.items():
        assert attrs["name"] == host and attrs["address"].startswith(address[host]), attrs
        # written on the node's own disk under its own name, then copied into the store
        assert attrs["local_store"].startswith(f"{host}:{nodes[host].local_dir}/"), attrs
        assert "gathered" in attrs, attrs
        left = glob.glob(os.path.join(nodes[host].local_dir, "metacollect-*", "*.zarr"))
        assert left == [], left
    # the job and the cluster: launched from the root namespace, both nodes in the spec
    job, (cluster,) = run.groups["job"], run.clusters()
    assert job["host"] == socket.gethostname() and job["cluster_type"] == "external"
    assert job["cluster_spec"]["scheduler"].startswith(f"tcp://{nodes_fixture.SUBNET}.1:")
    assert job["cluster_spec"]["n_workers"] == 2 and set(job["cluster_spec"]["threads"]) == {*SKEWS}
    assert run.groups[f"clusters/{cluster}"]["address"] == job["cluster_spec"]["scheduler"]
    workers = run.workers().set_index("name")
    assert set(workers.index) == set(SKEWS)
    for host, node in nodes.items():  # Dask's own "host" of a worker is its address's
        assert workers.loc[host, "host"] == node.address
        assert workers.loc[host, "group"] == groups[host][0].rsplit("/", 1)[-1]

    _one_clock(run, groups, written)
    _darshan_per_node(run, groups, written)


def _one_clock(run, groups: dict, written: dict[str, str]) -> None:
    """Each node's offset to the scheduler (the skewed one's -1.5 s); causality."""
    offsets = run.clock_offsets().set_index("worker_group")
    print(offsets[["address", "offset", "uncertainty", "round_trip_min", "samples"]].to_string())
    for host, (path, _) in groups.items():
        row = offsets.loc[path.rsplit("/", 1)[-1]]
        assert abs(row["offset"] + SKEWS[host]) <= max(0.005, row["uncertainty"]), row
    # on the scheduler's clock every task ran after it was sent, before it was heard done
    tasks = run.tasks()
    m = _sent_and_heard(run, tasks[tasks["key"].isin(written)])
    assert len(m) == len(written) and m["sent"].notna().all()
    unc = m["worker"].map(offsets.set_index("address")["uncertainty"]).to_numpy(float)
    assert (m["sent"] <= m["start"] + unc).all() and (m["stop"] - unc <= m["time"]).all(), m


def _darshan_per_node(run, groups: dict, written: dict[str, str]) -> None:
    """Each node's logs in its own directory, its worker's log in its worker group; bytes
    per file and DXT segments per task."""
    logs = run.table("darshan", "logs")
    print(logs[["host", "pid", "kind", "role", "group", "status"]].to_string())
    assert (logs["status"] == "ingested").all(), logs
    assert (logs["path"].map(lambda p: os.path.basename(os.path.dirname(p))) == logs["host"]).all()
    mine = logs[logs["role"] == "worker"].set_index("host")
    assert sorted(mine.index) == sorted(SKEWS)
    for host, (path, attrs) in groups.items():
        assert mine.loc[host, "group"] == f"{path}/process"
        assert mine.loc[host, "pid"] == attrs["pid"] and mine.loc[host, "kind"] == "final"

    # bytes per file: every file once, in the worker of the node that wrote it, exact
    io = run.io(by="file")
    io = io[io["file"].isin(written.values())].set_index("file")
    assert io.index.is_unique and sorted(io.index) == sorted(written.values()), io
    for key, path in written.items():
        host = key.split("-", 1)[1].rsplit("-", 1)[0]
        row = io.loc[path]
        assert row["host"] == host and row["worker_group"] == groups[host][0].rsplit("/", 1)[-1]
        assert row["bytes_written"] == os.path.getsize(path), (key, row)
        assert row["name_verified"], (key, row)
    print(io[["host", "interfaces", "bytes_written"]].to_string())

    # DXT's segments joined to the tasks that wrote them, on the skewed node too
    tasks = run.io(by="task").dropna(subset=["key"]).set_index("key")
    seg = run.io(by="segment")
    print(
        "DXT segments of the files per node:",
        seg[seg["file"].isin(written.values())].groupby("host").size().to_dict(),
    )
    for key, path in written.items():
        assert set(seg[seg["file"] == path]["key"]) == {key}, seg[seg["file"] == path]
        assert tasks.loc[key, "bytes_written"] == os.path.getsize(path), key
        assert not tasks.loc[key, "ambiguous"], key
