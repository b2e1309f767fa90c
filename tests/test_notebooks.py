"""Every notebook of notebooks/ executes (each creates its own store in a temp dir)."""

from __future__ import annotations

import glob
import os

import nbformat
import pytest
from nbclient import NotebookClient
from test_jobqueue import require_slurm

#: the environment variable that runs the scaling notebook's series on Slurm
SLURM_SWITCH = "METACOLLECT_NOTEBOOK_SLURM"

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
        "07-scaling-study.ipynb",
    } <= names


def _execute(path: str, tmp_path) -> nbformat.NotebookNode:
    """The notebook at ``path`` executed in a kernel whose temp dir is ``tmp_path``."""
    nb = nbformat.read(path, as_version=4)
    # the kernel must not inherit pytest's "warnings are errors"; the notebooks' own code
    # runs as users run it
    client = NotebookClient(
        nb,
        timeout=240,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    return nb


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_executes(path, tmp_path, monkeypatch):
    # the notebooks keep their stores in a temp dir for the reader to explore: the kernel's
    # temp dir is the test's, or every run leaves ~1,500 files a notebook in /tmp
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv(SLURM_SWITCH, raising=False)  # the slurm test runs that part
    nb = _execute(path, tmp_path)
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


def _printed(nb: nbformat.NotebookNode) -> str:
    return "".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("name") == "stdout"
    )


@pytest.mark.slurm
def test_scaling_notebook_runs_its_series_on_slurm(tmp_path, monkeypatch):
    """The scaling notebook's Slurm part: 1, 2 and 4 worker jobs on the real Slurm, each
    run's store recording its jobs, read as a scaling study."""
    require_slurm()
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv(SLURM_SWITCH, "1")
    path = next(p for p in NOTEBOOKS if os.path.basename(p) == "07-scaling-study.ipynb")
    nb = _execute(path, tmp_path)
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
    printed = _printed(nb)
    assert "Slurm series: 3 runs, batch jobs per run [1, 2, 4]" in printed, printed
    assert printed.count("strong scaling") >= 2, printed  # the LocalCluster's and Slurm's
