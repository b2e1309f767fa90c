"""Stores from real LocalCluster runs, shared by the analysis, plot and report tests.

Built once per test session (each test module asks through a module-scoped fixture) so the
view tests stay fast: one run with a chain graph, a wide graph with transfers and one erred task.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from metacollect.steps.job import scheduler_identity

#: the chain graph: CHAIN tasks, each depending on the previous
CHAIN = 6
#: the wide graph: WIDE independent ``slow`` tasks summed by one ``total`` task
WIDE = 12


def inc(x):
    time.sleep(0.02)
    return x + 1


def slow(i):
    import numpy as np

    time.sleep(0.01)
    return np.full(1000, i, dtype=float)


def total(*parts):
    return float(sum(p.sum() for p in parts))


def boom(x):
    raise ValueError("boom")


@functools.cache
def _tmp() -> str:
    path = tempfile.mkdtemp(prefix="metacollect-views-")
    atexit.register(shutil.rmtree, path, True)
    return path


@functools.cache
def basic_store() -> str:
    """Path of a store holding graph 0 = a chain, graph 1 = a wide graph, graph 2 = one erred
    task."""
    import dask

    store = f"{_tmp()}/basic.zarr"
    # Yappi on: the profile view is checked on the same run (step 5, when installed)
    # no calling code (code-frames 0): the System tab's line saying why is checked on it
    config = {"metacollect.yappi.enabled": True, "metacollect.capture.code-frames": 0}
    with collected(store, config) as client:
        x = dask.delayed(inc)(0, dask_key_name="inc-0")
        for i in range(1, CHAIN):
            x = dask.delayed(inc)(x, dask_key_name=f"inc-{i}")
        assert dask.compute(x)[0] == CHAIN
        parts = [dask.delayed(slow)(i, dask_key_name=f"slow-{i}") for i in range(WIDE)]
        dask.compute(dask.delayed(total)(*parts, dask_key_name="total-0"))
        fut = client.submit(boom, 1, key="boom-0")
        with contextlib.suppress(ValueError):
            fut.result()
        time.sleep(0.5)  # a few worker-state samples after the last task
    return store


@contextlib.contextmanager
def collected(store: str, config: dict | None = None) -> Iterator[Any]:
    """A client of a new LocalCluster (2 worker processes, 2 threads each), its run
    collected into ``store`` with ``config`` set."""
    import dask
    from distributed import Client, LocalCluster

    from metacollect import collect

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=2, dashboard_address=":0", processes=True
        ) as cluster,
        Client(cluster) as client,
        dask.config.set(config or {}),
        collect(client, store, overwrite=True),
    ):
        yield client


SCRIPT = """
import time
import dask
from distributed import Client, LocalCluster

def work(i):
    time.sleep(0.01)
    return i * 2

if __name__ == "__main__":
    with LocalCluster(n_workers=1, threads_per_worker=2, dashboard_address=":0") as cluster, \
            Client(cluster):
        print(sum(dask.compute(*[dask.delayed(work)(i) for i in range(10)])))
"""


@functools.cache
def script_store() -> str:
    """Path of a store written by ``metacollect run`` on a tiny script (10 ``work`` tasks)."""
    from metacollect.launch.runner import run_script

    script = f"{_tmp()}/script.py"
    with open(script, "w") as f:
        f.write(SCRIPT)
    store = f"{_tmp()}/script.zarr"
    code = run_script(script, [], store, echo=lambda m: None)
    if code != 0:
        raise RuntimeError(f"the script exited with {code}")
    return store


def spin(seconds):
    """Pure Python work: thread-cpu in Dask's fine metrics, where Dask's sampler sees it."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


@functools.cache
def spans_store() -> str:
    """Path of a store with Dask spans: ``load`` with a child ``load/clean``, unannotated work
    (Dask's ``default`` spans) with a transfer between the workers, ``fails`` (its one task
    fails: no task finished) and ``twins`` whose children ``twins/left`` and ``twins/right``
    run at the same time."""
    import dask.array as da
    import numpy as np
    from distributed import span, wait

    store = f"{_tmp()}/spans.zarr"
    with collected(store) as client:
        with span("load"):
            x = da.random.random((2000, 1000), chunks=(500, 1000)).persist()
            wait(x)
            with span("clean"):
                y = (x * 2).persist()
                wait(y)
        assert (x + y).sum().compute() > 0
        workers = sorted(scheduler_identity(client)["workers"])
        a = client.submit(np.ones, 1_000_000, workers=[workers[0]], pure=False)
        assert client.submit(len, a, workers=[workers[1]], pure=False).result() == 1_000_000
        with span("fails"):
            wait(client.submit(boom, 1, pure=False))
        with span("twins"):
            with span("left"):
                left = client.submit(spin, 0.4, key="left-0")
            with span("right"):
                right = client.submit(spin, 0.4, key="right-0")
            wait([left, right])
    return store


#: the long chain: as many tasks as the views must handle in a few seconds each
LONG_CHAIN = 200_000


def chain_store(n: int = LONG_CHAIN, skew: float = 0.0) -> str:
    """Path of a store holding one graph: a chain of ``n`` tasks, ``inc-0`` .. ``inc-{n-1}``,
    each depending on the one before, executed one after another (1 ms apart, 0.5 ms each)
    on two workers. Written as the collectors write (their StoreWriter and schema) but
    without a cluster: a real chain this long takes a LocalCluster many minutes. Only the
    tables the graph views read are there (no cluster attrs, no transitions). ``skew``: from
    the middle of the chain on, the workers' estimate of their clock offset from the
    scheduler's is off by this many seconds, as after a heartbeat that changed it (their
    tasks' start and stop shift; the scheduler's times do not)."""
    return _chain_store(n, skew)  # one store per (n, skew), however it is asked for


@functools.cache
def _chain_store(n: int, skew: float) -> str:
    import numpy as np

    from metacollect.session import init_root
    from metacollect.session.end import finalize
    from metacollect.store.writer import StoreWriter

    path = f"{_tmp()}/chain-{n}-{skew}.zarr"
    w = StoreWriter(path)
    init_root(w, "chain")
    client, scheduler = w.group("client", cluster="c0"), w.group("scheduler", cluster="c0")
    t0 = 1.7e9
    client.append(
        "graphs",
        {
            "graph": [0],
            "time": [t0],
            "client": ["Client-0"],
            "stimulus_id": ["update-graph"],
            "n_tasks": [n],
            "n_keys": [1],
            "n_dependencies": [n - 1],
            "annotations": [""],
        },
    )
    idx = np.arange(n)
    keys = [f"inc-{i}" for i in idx]
    client.append(
        "tasks",
        {
            "graph": np.zeros(n, np.int64),
            "key": keys,
            "prefix": ["inc"] * n,
            "group": ["inc"] * n,
            "requested": idx == n - 1,
            "priority": ["[0]"] * n,
            "n_dependencies": (idx > 0).astype(np.int32),
            "annotations": [""] * n,
            "span": [""] * n,
        },
    )
    client.append(
        "dependencies",
        {"graph": np.zeros(n - 1, np.int64), "key": keys[1:], "dependency": keys[:-1]},
    )
    scheduler.append(
        "tasks",
        {
            "key": keys,
            "prefix": ["inc"] * n,
            "group": ["inc"] * n,
            "state": ["memory"] * n,
            "worker": [f"tcp://127.0.0.1:4000{i % 2}" for i in idx],
            "thread": np.full(n, 140000000000, np.int64),
            "start": t0 + idx * 1e-3 + (idx >= n // 2) * skew,
            "stop": t0 + idx * 1e-3 + 5e-4 + (idx >= n // 2) * skew,
            "time": t0 + idx * 1e-3 + 6e-4,
            "nbytes": np.full(n, 8, np.int64),
            "typename": ["int"] * n,
            "retries": np.zeros(n, np.int32),
            "exception": [""] * n,
        },
    )
    w.flush()
    finalize(path)
    return path
