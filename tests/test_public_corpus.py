"""``metacollect run`` on scripts nobody here wrote: Dask's own documentation examples.

Each page of :data:`PAGES` is turned into the script a user makes of it
(:mod:`public_corpus`, rules in its docstring), run unmodified under ``metacollect run``, and
the store compared with the ground truth of the test's own scheduler preload
(:mod:`groundtruth`). A run that fails is run again under plain ``python``, to tell a page
that does not work on its own (no fair test) from a failure of ours. Running every page
plainly first doubled the test's time; that ``metacollect run`` ends as plain ``python`` would
is shown on the shapes of ``test_scripts.py`` and ``test_run.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import groundtruth
import public_corpus
import pytest

from metacollect import open_run
from metacollect.check.validate import validate_store

pytestmark = pytest.mark.slow  # whole documentation pages under metacollect run

#: (package, page): chosen for different shapes - collections and delayed with a late client;
#: dataframe merges with Parquet I/O; several clients and clusters, scaling and adapt; tasks
#: that fail on the workers and events they log
PAGES = [
    ("dask", "10-minutes-to-dask.rst"),
    ("dask", "dataframe-joins.rst"),
    ("dask", "deploying-python.rst"),
    ("distributed", "logging.rst"),
]


@pytest.mark.parametrize(("package", "page"), PAGES, ids=[p for _, p in PAGES])
def test_documentation_page_recorded_completely(tmp_path, package, page):
    script = public_corpus.page_script(package, page)
    path = tmp_path / "page.py"
    path.write_text(script.source)
    print(f"{script.page}: {len(script.source.splitlines())} lines; dropped: {script.dropped}")
    truth, store = str(tmp_path / "truth"), str(tmp_path / "run.zarr")
    env = {**os.environ, **groundtruth.environment(truth)}
    cmd = [sys.executable, "-m", "metacollect", "run", "--store", store]
    proc = subprocess.run(
        [*cmd, "--flush-interval", "0.5s", str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        plain = subprocess.run(
            [sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=240
        )
        assert plain.returncode == 0, f"the page fails on its own: {plain.stderr[-3000:]}"
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = open_run(store)
    assert run.attrs["status"] == "complete", run.attrs.get("missing")
    assert run.attrs["missing"] == []
    counts = groundtruth.compare(run, truth)
    assert counts["schedulers"] >= 1
    assert validate_store(store) == []
    print(script.page, counts)
