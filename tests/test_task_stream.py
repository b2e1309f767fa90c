"""The task stream: spills drawn as Dask draws them, and the density view of a large run
swapping single tasks in as one zooms, in a real browser.

Spills: a worker with a low spill target
spills the results it holds (``disk-write``) and reads them back for the tasks that use them
(``disk-read``, when that takes Dask's 5 ms); every such startstop the worker recorded is an
orange bar in the report."""

from __future__ import annotations

import json
import os
import time

import dask
import numpy as np
import pytest
from browser import available, chromium, console_errors, load, show_tab, tabs
from distributed import Client, LocalCluster
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.actions.wheel_input import ScrollOrigin
from test_report_html import _objects, _sources
from views_runs import chain_store

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


@pytest.mark.slow  # 240 MB spilled to disk and read back
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


#: the task stream's figure among Bokeh's views, and its visible bars by glyph type
_STREAM = (
    "const v = [...Bokeh.index.all_views()].find(v => v.model.type == 'Figure' "
    "&& v.model.title.text.startsWith('Task stream')); const f = v.model;"
)


@pytest.mark.slow
def test_zooming_in_swaps_single_tasks_in(tmp_path):
    """A 30,000-task stream (a chain, 1 ms apart: 30 s) opens as the density view in
    Chromium; zoomed in with the wheel, it shows exactly the executions that overlap the
    visible range as single bars, and zoomed out again, the density."""
    why = available()
    if why and os.environ.get("CI"):
        pytest.fail(f"no browser in CI: {why}")
    if why:
        pytest.skip(why)
    store = chain_store(30_000)
    out = tmp_path / "chain.html"
    write_html(store, out)
    tasks = open_run(store).tasks()
    counts = _STREAM + (
        "return [f.x_range.start, f.x_range.end, ...['Quad', 'HBar'].map(g => f.renderers"
        ".filter(r => r.glyph.type == g).reduce((s, r) => s + r.view.indices.count, 0))]"
    )
    with chromium() as driver:
        load(driver, out)
        show_tab(driver, [t.text for t in tabs(driver)].index("Task stream"), settle=1.0)
        _, _, quads, bars = driver.execute_script(counts)
        assert quads > 0 and bars == 0
        canvas = driver.execute_script(_STREAM + "return v.canvas_view.events_el")
        for _ in range(12):
            ActionChains(driver).scroll_from_origin(
                ScrollOrigin.from_element(canvas, 0, 0), 0, -300
            ).perform()
            time.sleep(0.3)
        time.sleep(1.0)
        x0, x1, quads, bars = driver.execute_script(counts)
        start, stop = tasks["start"] * 1000.0, tasks["stop"] * 1000.0
        in_view = int(((stop >= x0) & (start <= x1)).sum())
        assert 0 < in_view <= 20_000
        assert (quads, bars) == (0, in_view)
        for _ in range(60):  # zoomed out again, until more than the limit are in view
            ActionChains(driver).scroll_from_origin(
                ScrollOrigin.from_element(canvas, 0, 0), 0, 300
            ).perform()
            time.sleep(0.2)
            x0, x1, _, _ = driver.execute_script(counts)
            if (x1 - x0) / 1000.0 > 25.0:  # seconds: most of the 30 s chain
                break
        time.sleep(1.0)
        _, _, quads, bars = driver.execute_script(counts)
        assert quads > 0 and bars == 0
        assert console_errors(driver) == []
