"""A store written again (``overwrite=True``) with the REAL Darshan runtime: the first
run's logs must not pass for the second's, and metacollect's and Dask's own files stay
out of the user's view (recorded apart, not lost).

One LocalCluster (2 worker processes x 1 thread), two ``collect`` sessions into the same
store path, each writing its own files. Ground truth recorded here: the worker pids of
each session, ``os.path.getsize`` of every file written.
"""

from __future__ import annotations

import os
import sys

import cloudpickle
import pytest
from distributed import Client, LocalCluster

from metacollect import collect, open_run
from metacollect.steps import darshan as dsh
from tests.test_darshan_live import darshan_library  # noqa: F401  (the fixture)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

pytestmark = pytest.mark.darshan  # the real runtime: /opt/darshan, built by .ci/run


def write_file(path: str, n: int) -> int:
    with open(path, "wb") as f:
        f.write(os.urandom(n))
    return n


def _session(client, store, lib, data, names, **kw) -> set[int]:
    with collect(client, store, darshan={"enabled": True, "library": lib}, **kw):
        client.gather(
            [
                client.submit(write_file, str(data / n), 10_000 + 7 * i, pure=False)
                for i, n in enumerate(names)
            ]
        )
        return set(client.run(os.getpid).values())


@pytest.fixture(scope="module")
def twice(darshan_library, tmp_path_factory):  # noqa: F811
    data = tmp_path_factory.mktemp("overwrite-data")
    store = str(tmp_path_factory.mktemp("overwrite") / "run.zarr")
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0")
    with cluster, Client(cluster) as client:
        first = _session(client, store, darshan_library, data, ["one-a", "one-b"])
        first_logs = {lg.path for lg in dsh.find_logs(store + ".darshan")}
        notes = os.path.join(store + ".darshan", "notes.txt")  # a user's file, not ours
        with open(notes, "w") as f:
            f.write("mine")
        second = _session(
            client, store, darshan_library, data, ["two-a", "two-b", "two-c"], overwrite=True
        )
    return {
        "store": store,
        "data": str(data),
        "first": first,
        "second": second,
        "first_logs": first_logs,
        "notes": notes,
    }


def test_overwrite_ingests_only_the_new_runs_logs(twice):
    assert twice["first"] and not twice["first"] & twice["second"]
    assert twice["first_logs"]  # the first run did leave logs
    run = open_run(twice["store"])
    logs = run.table("darshan", "logs")
    assert not set(logs["path"]) & twice["first_logs"]
    assert set(logs["status"]) == {"ingested"}, logs[["path", "status", "reason"]]
    workers = logs[logs["role"] == "worker"]
    assert set(workers["pid"]) == twice["second"]
    files = set(run.io(scope="all")["file"].astype(str))
    for name in ("one-a", "one-b"):
        assert os.path.join(twice["data"], name) not in files
    for name in ("two-a", "two-b", "two-c"):
        path = os.path.join(twice["data"], name)
        assert run.io().set_index("file").loc[path, "bytes_written"] == os.path.getsize(path)
    with open(twice["notes"]) as f:  # what is not ours stays
        assert f.read() == "mine"


def test_our_own_files_are_recorded_apart_from_the_users(twice):
    run = open_run(twice["store"])
    every = run.io(scope="all")
    user = run.io()
    names = set(user["file"].astype(str))
    # the user's view: the task's files and the standard streams, nothing of Dask's
    # scratch space, of metacollect's store and logs, of Python's packages
    data = {n for n in names if n.startswith(twice["data"])}
    assert data == {os.path.join(twice["data"], n) for n in ("two-a", "two-b", "two-c")}
    assert not [n for n in names if "dask-scratch-space" in n]
    assert not [n for n in names if n.startswith(twice["store"])]
    dask = every[every["scope"] == "dask"]
    assert dask["file"].str.contains("/dask-scratch-space").all() and len(dask)
    assert dask["file"].str.endswith(".dirlock").any()  # the workers' lock files
    ours = every[every["scope"] == "metacollect"]
    assert ours["file"].str.startswith(twice["store"]).all() and len(ours)
    assert ours["file"].str.contains("clock-mark-").any()  # our timed write, in the logs
    assert set(run.io(scope="dask")["file"]) == set(dask["file"])
    assert len(every) == sum(len(run.io(scope=s)) for s in dsh.SCOPES)  # nothing lost
