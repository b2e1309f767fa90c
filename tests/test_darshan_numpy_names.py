"""Bytes per file of ``numpy.save``, with the REAL Darshan runtime, patched and plain.

numpy writes an array's data through ``fdopen(dup(fd))``. Darshan 3.5.0's STDIO module
names such a stream from the POSIX module's table of descriptors, which can still hold a
descriptor ``fclose`` closed: some records then carry another file's bytes. The runtime CI
builds carries ``.ci/darshan-patches`` and must give every file its own bytes; on a plain
3.5.0 runtime (a site's unpatched module) every file whose bytes are wrong must be marked
``name_verified == False`` by ``Run.io``, and the process's totals must stay exact.

The ground truth is the files themselves (``os.path.getsize``), written by one task on one
worker: 300 arrays of different sizes.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from distributed import Client, LocalCluster

from metacollect import collect, open_run
from metacollect.steps.darshan.runtime import forgets_closed_descriptors

pytestmark = pytest.mark.darshan

N_ARRAYS = 300


def _library(variable: str, default: str, patched: bool) -> str:
    """The runtime ``variable`` names (a file or an install prefix), else ``default``;
    in CI its absence fails."""
    for cand in (os.environ.get(variable), default):
        if not cand:
            continue
        for path in (cand, os.path.join(cand, "lib", "libdarshan.so")):
            if os.path.isfile(path):
                if forgets_closed_descriptors(path) != patched:
                    pytest.fail(
                        f"{path} is {'not ' if patched else ''}built with .ci/darshan-patches"
                    )
                return os.path.abspath(path)
    how = (
        "../shared/darshan/build-darshan-runtime.sh "
        + ("/opt/darshan .ci/darshan-patches" if patched else "/opt/darshan-plain")
        + f" (or set {variable})"
    )
    if os.environ.get("CI"):
        pytest.fail(f"no {'patched' if patched else 'plain'} Darshan runtime in CI: {how}")
    pytest.skip(f"no {'patched' if patched else 'plain'} Darshan runtime: {how}")


def save_arrays(directory: str, n: int) -> list[str]:
    """The task: ``n`` arrays of different sizes with ``numpy.save``."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i in range(n):
        path = os.path.join(directory, f"a{i}.npy")
        np.save(path, np.arange(17 * (i + 1) + i % 7, dtype=np.uint8))
        paths.append(path)
    return paths


def _collected(tmp_path, library: str):
    """One worker saves the arrays under ``collect``; the per-file rows of ``Run.io``
    and the files written."""
    store = str(tmp_path / "run.zarr")
    data = str(tmp_path / "data")
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cl,
        Client(cl) as client,
        collect(client, store, darshan={"enabled": True, "library": library}),
    ):
        paths = client.submit(save_arrays, data, N_ARRAYS, pure=False).result()
    run = open_run(store)
    io = run.io(by="file")
    return run, io[io["file"].isin(paths)].set_index("file"), paths


@pytest.fixture(scope="module")
def patched() -> str:
    return _library("METACOLLECT_DARSHAN_LIBRARY", "/opt/darshan", patched=True)


@pytest.fixture(scope="module")
def plain() -> str:
    return _library("METACOLLECT_DARSHAN_PLAIN_LIBRARY", "/opt/darshan-plain", patched=False)


def test_the_patched_runtime_gives_every_saved_array_its_own_bytes(tmp_path, patched):
    run, io, paths = _collected(tmp_path, patched)
    assert run.attrs["status"] == "complete"
    assert run.groups["darshan"]["runtime"]["stdio_names_exact"] is True
    assert sorted(io.index) == sorted(paths)
    wrong = {p: (int(io.loc[p, "bytes_written"]), os.path.getsize(p)) for p in paths}
    wrong = {p: v for p, v in wrong.items() if v[0] != v[1]}
    assert wrong == {}
    assert io["name_verified"].all()
    assert io.loc[paths, "interfaces"].eq("POSIX+STDIO").all()


def test_the_plain_runtime_marks_every_file_whose_bytes_it_may_have_mixed_up(tmp_path, plain):
    run, io, paths = _collected(tmp_path, plain)
    assert run.attrs["status"] == "complete"
    assert run.groups["darshan"]["runtime"]["stdio_names_exact"] is False
    sizes = {p: os.path.getsize(p) for p in paths}
    recorded = io["bytes_written"].reindex(paths, fill_value=0).astype(int)
    wrong = [p for p in paths if recorded[p] != sizes[p]]
    verified = io["name_verified"].reindex(paths, fill_value=False)
    # never silently wrong: a file with another's bytes is never shown as verified, and
    # every array numpy wrote through fdopen(dup(fd)) is marked, since any may be
    assert not [p for p in wrong if verified[p]]
    assert not verified.any()
    # no byte is lost: the saved files hold theirs or their neighbours', and what they miss
    # went to another file the process opened and closed meanwhile (the collector's own,
    # whose descriptor numpy's dup reused), marked unverified as well
    proc = io["process"].iloc[0]
    shortfall = sum(sizes.values()) - int(recorded.sum())
    assert shortfall >= 0
    every = run.io(by="file")
    others = every[(every["process"] == proc) & ~every["file"].isin(paths)]
    assert (
        int(others.loc[~others["name_verified"].astype(bool), "bytes_written"].sum()) >= shortfall
    )
    worker = run.io(by="worker")
    assert int(worker.set_index("process").loc[proc, "unverified_files"]) >= len(wrong)
    assert run.groups[proc]["unverified_names"] >= len(wrong)
