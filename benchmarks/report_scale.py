"""The interactive report at scale (issue 22): render time, HTML size and bytes per task.

A synthetic sealed store per size, written through the collector's own StoreWriter (as the
scheduler and client collectors write them): ``n`` executed tasks of one graph (each depends
on the task ``i // 2``: a binary tree, depth log2 n), 30 task prefixes (so the report groups
all but twenty as "other"), 8 workers x 4 threads running tasks back to back with lognormal
durations, two scheduler transitions per task and a worker-state sample per worker and second.
``write_html`` is timed once per size (the store is built first, not timed); with
``--browser``, the report is then opened in headless Chromium (``tests/browser.py``: selenium,
Debian's ``chromium`` and ``chromium-driver``) and timed until Bokeh has drawn its first tab
(the document idle), and the task stream's swap to single tasks is checked by zooming in.

    PYTHONPATH=. python benchmarks/report_scale.py [--tasks 20000 200000 1000000] [--browser]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np

PREFIXES = [f"step{i:02d}" for i in range(30)]
WORKERS = [f"tcp://10.0.0.{i}:40000" for i in range(8)]
THREADS = 4


def synthetic_store(path: str, n: int, seed: int = 0) -> None:
    from metacollect.session import init_root
    from metacollect.session.end import finalize
    from metacollect.store.writer import StoreWriter

    rng = np.random.default_rng(seed)
    w = StoreWriter(path)
    init_root(w, "report-scale")
    cl, sc = w.group("client", cluster="c0"), w.group("scheduler", cluster="c0")
    t0 = 1.7e9
    idx = np.arange(n)
    prefix = np.array(PREFIXES, dtype=object)[np.minimum(rng.zipf(1.5, n) - 1, len(PREFIXES) - 1)]
    keys = [f"('{p}-{i % 1009:032x}', {i})" for p, i in zip(prefix, idx, strict=True)]
    duration = rng.lognormal(np.log(2e-3), 1.0, n)
    lane = idx % (len(WORKERS) * THREADS)  # each thread runs its tasks back to back
    start = np.empty(n)
    for la in range(len(WORKERS) * THREADS):
        m = lane == la
        d = duration[m]
        start[m] = t0 + np.concatenate([[0.0], np.cumsum(d + 1e-4)[:-1]])
    stop = start + duration
    worker = np.array(WORKERS, dtype=object)[lane // THREADS]
    cl.append(
        "graphs",
        {"graph": [0], "time": [t0], "client": ["Client-0"], "stimulus_id": ["update-graph"],
         "n_tasks": [n], "n_keys": [1], "n_dependencies": [n - 1], "annotations": [""]},
    )  # fmt: skip
    cl.append(
        "tasks",
        {"graph": np.zeros(n, np.int64), "key": keys, "prefix": list(prefix),
         "group": list(prefix), "requested": idx == 0, "priority": ["[0]"] * n,
         "n_dependencies": (idx > 0).astype(np.int32), "annotations": [""] * n,
         "span": [""] * n},
    )  # fmt: skip
    dep_keys = [keys[i // 2] for i in idx[1:]]
    cl.append(
        "dependencies",
        {"graph": np.zeros(n - 1, np.int64), "key": keys[1:], "dependency": dep_keys},
    )
    sc.append(
        "transitions",
        {"key": keys + keys, "start": ["waiting"] * n + ["processing"] * n,
         "finish": ["processing"] * n + ["memory"] * n,
         "time": np.concatenate([start - 1e-4, stop + 1e-4]),
         "stimulus_id": ["update"] * n + ["task-finished"] * n,
         "worker": list(worker) * 2},
    )  # fmt: skip
    sc.append(
        "tasks",
        {"key": keys, "prefix": list(prefix), "group": list(prefix), "state": ["memory"] * n,
         "worker": list(worker), "thread": (140000000000 + lane % THREADS).astype(np.int64),
         "start": start, "stop": stop, "time": stop + 1e-4,
         "nbytes": rng.integers(8, 1 << 20, n).astype(np.int64),
         "typename": ["numpy.ndarray"] * n, "retries": np.zeros(n, np.int32),
         "exception": [""] * n},
    )  # fmt: skip
    times = np.arange(t0, stop.max() + 1.0, 1.0)
    k = len(times)
    ws: dict[str, Any] = {"time": np.repeat(times, len(WORKERS)), "worker": WORKERS * k}
    m = len(ws["time"])
    managed = rng.integers(1 << 28, 1 << 30, m).astype(np.int64)
    ws.update(
        nthreads=np.full(m, THREADS, np.int32), processing=np.full(m, THREADS, np.int32),
        executing=np.full(m, THREADS, np.int32), occupancy=np.full(m, 0.01),
        memory_managed=managed, memory_unmanaged=managed // 4,
        memory_spilled=np.zeros(m, np.int64), memory_process=managed + managed // 4,
        nbytes=managed, n_in_memory=np.full(m, 100, np.int32),
    )  # fmt: skip
    sc.append("worker_states", ws)
    w.flush()
    finalize(path)


#: the task stream's figure, found among Bokeh's views by its title
STREAM_JS = (
    "const v = [...Bokeh.index.all_views()].find(v => v.model.type == 'Figure' "
    "&& v.model.title.text.startsWith('Task stream'));"
)


def in_browser(path: str) -> tuple[float, int]:
    """Seconds until Chromium has drawn the report (its first tab), and how many single
    task bars the task stream shows once zoomed in with the wheel to less than 50 ms (0 when
    it stays a density view)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from browser import chromium, load, show_tab, tabs
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.wheel_input import ScrollOrigin

    with chromium() as driver:
        seconds = load(driver, path, timeout=600)
        titles = [t.text for t in tabs(driver)]
        show_tab(driver, titles.index("Task stream"), settle=1.0)
        canvas = driver.execute_script(STREAM_JS + "return v.canvas_view.events_el")
        for _ in range(30):  # the wheel zooms in on the middle, as a user does
            ActionChains(driver).scroll_from_origin(
                ScrollOrigin.from_element(canvas, 0, 0), 0, -300
            ).perform()
            time.sleep(0.2)
            if driver.execute_script(STREAM_JS + "const r = v.model.x_range; "
                                     "return r.end - r.start < 50"):  # fmt: skip
                break
        time.sleep(1.0)
        singles = driver.execute_script(
            STREAM_JS + "return v.model.renderers.filter(r => r.visible && r.glyph.type == "
            "'HBar').reduce((s, r) => s + r.data_source.get_length(), 0);"
        )
    return seconds, int(singles)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, nargs="+", default=[20_000, 200_000, 1_000_000])
    p.add_argument("--browser", action="store_true", help="also time it in headless Chromium")
    args = p.parse_args(argv)
    from metacollect.report import write_html

    rows = []
    for n in args.tasks:
        tmp = tempfile.mkdtemp()
        try:
            store = f"{tmp}/scale.zarr"
            synthetic_store(store, n)
            out = f"{tmp}/scale.html"
            t = time.perf_counter()
            write_html(store, out)
            seconds = time.perf_counter() - t
            size = os.path.getsize(out)
            drawn, singles = in_browser(out) if args.browser else (float("nan"), -1)
        finally:
            shutil.rmtree(tmp)
        rows.append((n, seconds, size, drawn, singles))
        print(f"{n} tasks: {seconds:.1f} s, {size:,} B, drawn in {drawn:.1f} s", flush=True)
    print("| tasks | render (s) | HTML (bytes) | bytes/task | first tab drawn (s) | zoomed: bars |")
    print("|---|---|---|---|---|---|")
    for n, seconds, size, drawn, singles in rows:
        print(f"| {n:,} | {seconds:.1f} | {size:,} | {size / n:.0f} | {drawn:.1f} | {singles:,} |")


if __name__ == "__main__":
    main()
