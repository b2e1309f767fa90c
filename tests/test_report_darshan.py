"""The report of a real ``metacollect run --darshan`` (DXT on): Darshan records every
process it runs in - the script (which here runs the scheduler too) as well as the
workers - and the I/O tab draws each on its own lane, named by its address or its role
and pid, where it failed with a TypeError on the processes that are not workers."""

from __future__ import annotations

import re
import textwrap

import dask.config
import pytest
from test_report_html import _objects

from metacollect import open_run
from metacollect.cli import main
from tests.test_darshan_live import darshan_library  # noqa: F401  (the fixture)

pytestmark = pytest.mark.darshan  # the real runtime: /opt/darshan, built by .ci/run

SCRIPT = """
    import os, sys
    from distributed import Client, LocalCluster

    def write(path, n):
        with open(path, "wb") as f:
            f.write(b"x" * n)
        return n

    if __name__ == "__main__":
        data = sys.argv[1]
        with open(os.path.join(data, "script.pid"), "w") as f:  # the script's own I/O
            f.write(str(os.getpid()))
        client = Client(LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0"))
        paths = [os.path.join(data, f"out-{i}.bin") for i in range(4)]
        print(client.gather(client.map(write, paths, [50_000] * 4)))
"""


@pytest.fixture(scope="module")
def darshan_run(darshan_library, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("report-darshan")
    data = tmp / "data"
    data.mkdir()
    script = tmp / "flow.py"
    script.write_text(textwrap.dedent(SCRIPT))
    store = str(tmp / "run.zarr")
    config = {"metacollect.darshan.library": darshan_library, "metacollect.darshan.dxt": True}
    with dask.config.set(config):
        assert main(["run", str(script), "--darshan", "--store", store, "--", str(data)]) == 0
    return store, int((data / "script.pid").read_text()), str(data)


def test_io_tab_names_every_process_that_did_io(darshan_run, tmp_path, capsys):
    store, script_pid, data = darshan_run
    run = open_run(store)
    seg = run.io(by="segment")
    script_rows = seg[seg["pid"] == script_pid]
    assert len(script_rows) and script_rows["worker"].isna().all()  # not a worker
    assert (script_rows["file"] == f"{data}/script.pid").any()
    out = tmp_path / "io.html"
    assert main(["report", store, "-o", str(out), "-q"]) == 0
    assert capsys.readouterr().err == ""
    text = out.read_text()
    assert re.findall(r"This view failed to build: ([^&<]*)", text) == []
    lanes = {
        str(label)
        for o in _objects(text)
        if o["name"] == "LinearAxis"
        for label in dict(
            o["attributes"].get("major_label_overrides", {}).get("entries", [])
        ).values()
    }
    role = script_rows["role"].iloc[0]
    workers = set(run.workers()["address"])
    assert f"{role} pid {script_pid}" in lanes
    assert workers <= lanes  # each worker's lane by its address
