"""Darshan's DXT segments joined to the tasks that wrote them on workers whose clocks are
skewed (the real Darshan runtime and libfaketime both preloaded into each worker).

Two workers of 1 thread, +2 s and -1.5 s off the scheduler's clock, each write files in
tasks run back to back under known keys. Ground truth: which task wrote which file and
``os.path.getsize`` of each. Checked: every DXT segment of a file is joined to the task
that wrote it, and the bytes per task are the file's size.
"""

from __future__ import annotations

import asyncio
import os
import sys

import cloudpickle
import dask
import pytest
from distributed import Client, Scheduler, SpecCluster

from metacollect import collect, open_run
from metacollect.steps import darshan as dsh
from tests.test_clock_skew import FAKETIME, SkewedNanny, faketime_env, skewed_workers
from tests.test_darshan_live import darshan_library  # noqa: F401  (the fixture)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

SKEWS = {"ahead": 2.0, "behind": -1.5}
#: tasks per worker
TASKS = 8

pytestmark = pytest.mark.usefixtures("needs_faketime")


def write_chunks(path: str, n: int) -> int:
    """Write ``n`` bytes into ``path`` in 4 ``os.write`` calls (4 DXT segments)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for part in (n // 4, n // 4, n // 4, n - 3 * (n // 4)):
            os.write(fd, os.urandom(part))
    finally:
        os.close(fd)
    return n


def _worker_env(darshan_env: dict[str, str], skew: float) -> dict[str, str]:
    """Darshan's pre-spawn environment with libfaketime preloaded beside it."""
    env = {**darshan_env, **faketime_env(skew)}
    env["LD_PRELOAD"] = f"{darshan_env['LD_PRELOAD']} {FAKETIME}"
    return env


@pytest.mark.darshan
def test_dxt_segments_join_their_tasks_on_skewed_workers(darshan_library, tmp_path):  # noqa: F811
    store = str(tmp_path / "run.zarr")
    data = tmp_path / "data"
    data.mkdir()
    with dask.config.set({"metacollect.darshan.dxt": True}):
        darshan_env = dsh.darshan_environment(
            str(tmp_path / "workers.zarr"), library=darshan_library
        )
    lock = asyncio.Lock()
    workers = {
        name: {
            "cls": SkewedNanny,
            "options": {"nthreads": 1, "clock_env": _worker_env(darshan_env, skew), "lock": lock},
        }
        for name, skew in SKEWS.items()
    }
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0"}}
    written: dict[str, str] = {}
    before = dict(os.environ)
    try:
        with (
            SpecCluster(workers=workers, scheduler=scheduler) as cluster,
            Client(cluster) as client,
        ):
            by_name = skewed_workers(client, SKEWS)
            with collect(client, store, darshan={"enabled": True, "library": darshan_library}):
                futures = []
                for name in SKEWS:
                    for i in range(TASKS):
                        key = f"w-{name}-{i}"
                        written[key] = str(data / f"{key}.bin")
                        futures.append(
                            client.submit(
                                write_chunks,
                                written[key],
                                4096 * (i + 1),
                                key=key,
                                workers=[by_name[name]],
                                pure=False,
                            )
                        )
                client.gather(futures)
    finally:  # the nannies wrote their pre-spawn environment into this process's
        os.environ.clear()
        os.environ.update(before)

    run = open_run(store)
    seg = run.io(by="segment")
    seg = seg[seg["file"].astype(str).str.startswith(str(data))]
    assert (seg["method"] == "dxt-segment").all() and len(seg) == 4 * len(written)
    rows = run.io(by="task").dropna(subset=["key"]).set_index("key")
    for key, path in written.items():
        assert set(seg[seg["file"] == path]["key"]) == {key}, seg[seg["file"] == path]
        assert rows.loc[key, "bytes_written"] == os.path.getsize(path), key
        assert not rows.loc[key, "ambiguous"], key
