"""The task stream's spills, drawn as Dask draws them: a worker with a low spill target
spills the results it holds (``disk-write``) and reads them back for the tasks that use them
(``disk-read``, when that takes Dask's 5 ms); every such startstop the worker recorded is an
orange bar in the report."""

from __future__ import annotations

import json

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster
from test_report_html import _objects, _sources

from metacollect import collect, open_run
from metacollect.report import write_html

#: each result's size: 8 of them exceed the worker's spill target (20 % of 400 MiB) 3 times
MB = 30
#: spill early; never pause or kill the worker for its memory
MEMORY = {
    "distributed.worker.memory.target": 0.2,
    "distributed.worker.memory.spill": False,
    "distributed.worker.memory.pause": False,
    "distributed.worker.memory.terminate": False,
}


def block(i):
    return np.random.default_rng(i).random(MB * 2**20 // 8)  # incompressible


def first(b):
    return float(b[0])


@pytest.fixture(scope="module")
def spilled(tmp_path_factory):
    d = tmp_path_factory.mktemp("spill")
    store = str(d / "spill.zarr")
    with (
        dask.config.set(MEMORY),
        LocalCluster(
            n_workers=1, threads_per_worker=1, memory_limit="400MiB", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        collect(client, store, overwrite=True),
    ):
        parts = dask.persist(
            *[dask.delayed(block)(i, dask_key_name=f"block-{i}") for i in range(8)]
        )
        dask.compute(
            *[dask.delayed(first)(p, dask_key_name=f"first-{i}") for i, p in enumerate(parts)]
        )
    out = d / "spill.html"
    write_html(store, out)
    return open_run(store), out


def test_every_spill_is_an_orange_bar(spilled):
    run, out = spilled
    ss = run.worker_table("startstops", clock="scheduler")
    truth = ss[ss["action"].isin(["disk-write", "disk-read"])]
    assert "disk-write" in set(truth["action"])  # a read back may take under the 5 ms Dask records
    objs = _objects(out.read_text())
    drawn = _sources(objs, "action", "key", "left", "y")
    bars = sorted(
        (a, k, round(x, 3))
        for s in drawn
        for a, k, x in zip(s["action"], s["key"], s["left"], strict=True)
    )
    expected = sorted(
        (a, str(k), round(x * 1000.0, 3))
        for a, k, x in zip(truth["action"], truth["key"], truth["start"], strict=True)
    )
    assert bars == expected
    # drawn orange, as Dask's task stream draws spills
    assert any('"orange"' in json.dumps(o["attributes"]) for o in objs if o["name"] == "HBar")
