"""Every notebook of notebooks/ executes (each creates its own store in a temp dir)."""

from __future__ import annotations

import glob
import os

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "notebooks", "*.ipynb")))


def test_there_are_notebooks():
    names = {os.path.basename(p) for p in NOTEBOOKS}
    assert {
        "01-array-reduction.ipynb",
        "02-dataframe-shuffle.ipynb",
        "03-futures-workflow.ipynb",
        "04-io-cost.ipynb",
        "05-spans-and-fine-metrics.ipynb",
        "06-comparing-runs.ipynb",
    } <= names


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_executes(path, tmp_path, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    # the notebooks keep their stores in a temp dir for the reader to explore: the kernel's
    # temp dir is the test's, or every run leaves ~1,500 files a notebook in /tmp
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    # the kernel must not inherit pytest's "warnings are errors"; the notebooks' own code
    # runs as users run it
    client = NotebookClient(
        nb,
        timeout=240,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the notebook draws no figure"
    printed = "".join(
        o.get("text", "")
        for c in nb.cells
        for o in c.get("outputs", [])
        if o.get("name") == "stdout"
    )
    if os.path.isfile("/opt/darshan/lib/libdarshan.so") or os.environ.get("CI"):
        # where a Darshan runtime exists (CI builds one) the I/O cells run, never skip
        assert "no Darshan" not in printed and "skipped" not in printed, printed
