"""``metacollect run --darshan`` with the REAL Darshan runtime on an unmodified script.

The script starts its own LocalCluster (2 worker processes x 1 thread) under the main
guard and never closes its client. Its tasks write files (``open().write``,
``os.write``, ``numpy.save``) and read files the test made (``open().read()``,
``os.read``, ``numpy.load``), one task at a time, each under a key the script names.
The test records the ground truth itself: ``os.path.getsize`` of every written file
after the run, the exact size of every file read, and where ``numpy.load``'s bytes come
from (its header through Python's buffered reader, its data through STDIO, see
:func:`npy_read_bytes`).

Two sessions: DXT on (per file, per worker and per task exact) and DXT off (per file
and per worker exact; ``by="task"`` from the records' windows: POSIX first to last operation, STDIO
open-close).
"""

from __future__ import annotations

import io
import os
import textwrap
import time

import dask.config
import numpy as np
import pytest

from metacollect import open_run
from metacollect.check.validate import validate_store
from metacollect.cli import main
from tests.test_darshan_live import darshan_library  # noqa: F401  (the fixture)

pytestmark = pytest.mark.darshan  # the real runtime: /opt/darshan, built by .ci/run

SCRIPT = """
    import os, sys
    import numpy as np
    from distributed import Client, LocalCluster

    def write_open(path, n):
        with open(path, "wb") as f:
            f.write(os.urandom(n))

    def write_os(path, n):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for i in range(0, n, 65536):
            os.write(fd, b"x" * min(65536, n - i))
        os.close(fd)

    def write_npy(path, n):
        np.save(path, np.arange(n, dtype=np.float64))

    def read_open(path):
        with open(path, "rb") as f:
            return len(f.read())

    def read_os(path):
        fd, total = os.open(path, os.O_RDONLY), 0
        while chunk := os.read(fd, 50_000):
            total += len(chunk)
        os.close(fd)
        return total

    def read_npy(path):
        return int(np.load(path).size)

    if __name__ == "__main__":
        data = sys.argv[1]
        client = Client(LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0"))
        jobs = [
            ("w-open", write_open, "out-open.bin", 100_000),
            ("w-os", write_os, "out-os.bin", 150_001),
            ("w-npy", write_npy, "out.npy", 30_000),
            ("r-open", read_open, "in-a.bin", None),
            ("r-os", read_os, "in-b.bin", None),
            ("r-npy", read_npy, "in.npy", None),
        ]
        for i, (key, fn, name, n) in enumerate(jobs):
            args = (os.path.join(data, name),) + ((n,) if n is not None else ())
            w = sorted(client.nthreads())[i % 2]
            print(key, client.submit(fn, *args, key=key, workers=[w]).result())
"""

INPUTS = {"in-a.bin": 123_457, "in-b.bin": 70_001}
NPY_IN = 20_000  # float64 elements of in.npy
WRITTEN = ("out-open.bin", "out-os.bin", "out.npy")
TASK_FILES = {
    "w-open": "out-open.bin",
    "w-os": "out-os.bin",
    "w-npy": "out.npy",
    "r-open": "in-a.bin",
    "r-os": "in-b.bin",
    "r-npy": "in.npy",
}


def npy_read_bytes(path: str) -> dict[str, int]:
    """What ``numpy.load(path)`` reads, by interface: NumPy reads the header through
    Python's buffered reader (one POSIX ``read`` of a full buffer - ``st_blksize``, as
    ``io.open`` sizes it - or the whole file when smaller), then the data with
    ``fromfile`` on a ``dup`` of the fd through STDIO (exactly the data bytes). So the
    file's bytes read are more than its size: the buffer's bytes past the header are
    read twice (the process did read them twice), and Darshan counts both."""
    with open(path, "rb") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        header = f.tell()
    st = os.stat(path)
    buffer = st.st_blksize if st.st_blksize > 1 else io.DEFAULT_BUFFER_SIZE  # as io.open
    return {"POSIX": min(buffer, st.st_size), "STDIO": st.st_size - header}


def _session(tmp_path, lib: str, dxt: bool) -> dict:
    data = tmp_path / "data"
    data.mkdir()
    for name, n in INPUTS.items():
        (data / name).write_bytes(os.urandom(n))
    np.save(data / "in.npy", np.arange(NPY_IN, dtype=np.float64))
    script = tmp_path / "flow.py"
    script.write_text(textwrap.dedent(SCRIPT))
    store = str(tmp_path / "run.zarr")
    t0 = time.perf_counter()
    with dask.config.set({"metacollect.darshan.library": lib, "metacollect.darshan.dxt": dxt}):
        code = main(["run", str(script), "--darshan", "--store", store, "--", str(data)])
    seconds = time.perf_counter() - t0
    truth_written = {str(data / n): os.path.getsize(data / n) for n in WRITTEN}
    truth_read = {str(data / n): s for n, s in INPUTS.items()}
    npy = str(data / "in.npy")
    return {
        "code": code,
        "store": store,
        "data": str(data),
        "written": truth_written,
        "read": truth_read,
        "npy": (npy, npy_read_bytes(npy)),
        "seconds": seconds,
    }


@pytest.fixture(scope="module")
def dxt_on(darshan_library, tmp_path_factory):  # noqa: F811
    return _session(tmp_path_factory.mktemp("run-dxt"), darshan_library, True)


@pytest.fixture(scope="module")
def dxt_off(darshan_library, tmp_path_factory):  # noqa: F811
    return _session(tmp_path_factory.mktemp("run-nodxt"), darshan_library, False)


def _user_files(run, live) -> object:
    io_ = run.io()
    return io_[io_["file"].astype(str).str.startswith(live["data"])]


def _check_files_exact(live) -> None:
    run = open_run(live["store"])
    mine = _user_files(run, live)
    assert mine["process"].str.contains("/workers/").all()  # only the workers did I/O there
    per_file = mine.groupby("file")[["bytes_written", "bytes_read"]].sum()
    for path, size in live["written"].items():
        assert per_file.loc[path, "bytes_written"] == size, path
    for path, size in live["read"].items():
        assert per_file.loc[path, "bytes_read"] == size, path
        assert per_file.loc[path, "bytes_written"] == 0, path
    npy, parts = live["npy"]
    assert per_file.loc[npy, "bytes_read"] == parts["POSIX"] + parts["STDIO"]
    every = run.io(scope="all")
    by_iface = every[every["file"] == npy]
    if "interfaces" in by_iface:
        assert set(by_iface["interfaces"]) == {"POSIX+STDIO"}
    assert set(per_file.index) == set(live["written"]) | set(live["read"]) | {npy}
    # per worker: the sum of its files
    workers = run.io(by="worker").set_index("process")
    for proc, rows in mine.groupby("process"):
        assert workers.loc[proc, "bytes_written"] >= rows["bytes_written"].sum()
    users = run.io().groupby("process")[["bytes_written", "bytes_read"]].sum()
    for proc in users.index:
        assert workers.loc[proc, "bytes_written"] == users.loc[proc, "bytes_written"]
        assert workers.loc[proc, "bytes_read"] == users.loc[proc, "bytes_read"]


def _check_record_whole(live) -> None:
    assert live["code"] == 0
    run = open_run(live["store"])
    assert run.attrs["status"] == "complete", run.attrs.get("missing")
    darshan = run.groups["darshan"]
    assert darshan["enabled"] is True
    assert darshan["delivery"] == "script-environment"
    assert darshan["method"] == "exit-log" and "end with it" in darshan["method_reason"]
    assert darshan["missing_logs"] == []
    logs = run.table("darshan", "logs")
    assert set(logs["status"]) == {"ingested"}, logs[["path", "status", "reason"]]
    assert set(logs["kind"]) == {"final"}  # every process's log was complete when read
    workers = logs[logs["role"] == "worker"]
    assert len(workers) == 2
    # no process outlived the wait (it would be named in missing_logs, checked above): a
    # wall-clock bound here failed on a loaded machine without telling anything more
    assert validate_store(live["store"]) == []
    # the launcher's own file (the script's outcome, written by the script's process
    # under Darshan) is recorded, out of the user's view
    every = run.io(scope="all")
    ours = every[every["file"].astype(str).str.contains("/metacollect-run-")]
    assert ours["file"].str.endswith("/outcome.json").any()
    assert set(ours["scope"]) == {"metacollect"}


# -- DXT on ------------------------------------------------------------------------------
def test_run_darshan_waits_for_every_log_and_records_darshan_enabled(dxt_on):
    _check_record_whole(dxt_on)


def test_run_darshan_bytes_per_file_and_worker_are_exact(dxt_on):
    _check_files_exact(dxt_on)


def test_run_darshan_bytes_per_task_are_exact(dxt_on):
    run = open_run(dxt_on["store"])
    rows = run.io(by="task").dropna(subset=["key"]).set_index("key")
    seg = run.io(by="segment")
    seg = seg[seg["file"].astype(str).str.startswith(dxt_on["data"])]
    data = dxt_on["data"]
    parts = dxt_on["npy"][1]
    for key, name in TASK_FILES.items():
        path = os.path.join(data, name)
        row = rows.loc[key]
        assert not row["ambiguous"], key
        mine = seg[(seg["key"] == key) & (seg["file"] == path)]
        assert set(seg[seg["file"] == path]["key"]) == {key}, key  # all of it, to this task
        if key.startswith("w-"):
            assert row["bytes_written"] == dxt_on["written"][path], key
            assert mine[mine["op"] == "write"]["length"].sum() == dxt_on["written"][path]
        elif key == "r-npy":
            got = mine[mine["op"] == "read"]
            assert got["length"].sum() == parts["POSIX"] + parts["STDIO"]
            assert got.groupby("module")["length"].sum().to_dict() == {
                "DXT_POSIX": parts["POSIX"],
                "STDIO": parts["STDIO"],
            }
        else:
            got = mine[mine["op"] == "read"]["length"].sum()
            assert got == dxt_on["read"][path], key
            assert row["bytes_read"] >= got  # the task also reads what Python loads for it


# -- DXT off -----------------------------------------------------------------------------
def test_run_darshan_without_dxt_is_exact_per_file_and_worker(dxt_off):
    _check_record_whole(dxt_off)
    _check_files_exact(dxt_off)


def test_run_darshan_without_dxt_splits_by_task_with_record_windows(dxt_off):
    # no DXT segments: each record's window (POSIX: first to last operation, STDIO:
    # open-close) is given to the one task of its worker that ran through it (one task
    # at a time here: each file to its own task)
    run = open_run(dxt_off["store"])
    seg = run.io(by="segment")
    data = seg[seg["file"].astype(str).str.startswith(dxt_off["data"])]
    assert set(data["method"]) == {"posix-first-last", "stdio-open-close"}
    npy, parts = dxt_off["npy"]
    for key, name in TASK_FILES.items():
        path = os.path.join(dxt_off["data"], name)
        mine = data[data["file"] == path]
        assert set(mine["key"]) == {key}, (key, mine)
        op = "write" if key.startswith("w-") else "read"
        truth = {**dxt_off["written"], **dxt_off["read"], npy: parts["POSIX"] + parts["STDIO"]}
        assert mine[mine["op"] == op]["length"].sum() == truth[path], key
