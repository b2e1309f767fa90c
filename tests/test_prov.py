"""``metacollect export --prov``: W3C PROV-JSON of real runs, read back with the ``prov``
package and counted against what the test ran: the graph of :mod:`diff_runs` (33 tasks, 32
dependency edges, 3 workers, where each task says it ran) and, with the real Darshan
runtime, a script whose tasks read and write files the test made."""

from __future__ import annotations

import getpass
import json
import os

import prov
import pytest
from diff_runs import N_COMBINE, N_WORK, pair
from views_runs import LONG_CHAIN, chain_store

from metacollect import open_run
from metacollect.cli import main
from metacollect.errors import UsageError
from metacollect.export.prov import MAX_TASKS, count_records, write
from tests.test_darshan_live import darshan_library  # noqa: F401  (the fixture)
from tests.test_ro_crate import N_FILES, _run

N_TASKS = N_WORK + N_COMBINE + 1
N_EDGES = N_WORK + N_COMBINE  # each work feeds one combine, each combine the total


@pytest.fixture(scope="module")
def graph_run():
    a, _, placed, _ = pair()
    return open_run(a), placed


def _read(path) -> tuple[prov.model.ProvDocument, dict[str, int]]:
    doc = prov.read(str(path), format="json")
    return doc, count_records(doc)


def test_every_task_an_activity_with_its_worker_and_dependencies(graph_run, tmp_path):
    run, placed = graph_run
    out = tmp_path / "run.prov.json"
    meta = write(run, out, tasks="all")
    doc, counts = _read(out)
    assert {k: meta[k] for k in counts} == counts  # what was written is what reads back
    user = 1 if getpass.getuser() else 0
    assert counts["activities"] == 1 + 1 + N_TASKS  # the run, its one graph, the tasks
    assert counts["agents"] == 3 + user  # the workers, the user
    assert counts["wasAssociatedWith"] == N_TASKS + user
    assert counts["wasInformedBy"] == N_EDGES
    assert counts["wasStartedBy"] == 1 + N_TASKS  # the graph by the run, tasks by the graph
    assert counts["entities"] == 1 and counts["wasGeneratedBy"] == 1  # the store
    # each task is associated with the worker it said it ran on
    agents = {
        str(r.identifier): str(next(iter(r.get_attribute("metacollect:name"))))
        for r in doc.get_records(prov.model.ProvAgent)
        if r.get_attribute("metacollect:name")
    }
    keys = {
        str(r.identifier): str(next(iter(r.get_attribute("metacollect:key"))))
        for r in doc.get_records(prov.model.ProvActivity)
        if r.get_attribute("metacollect:key")
    }
    ran = {
        keys[str(r.formal_attributes[0][1])]: agents[str(r.formal_attributes[1][1])]
        for r in doc.get_records(prov.model.ProvAssociation)
        if str(r.formal_attributes[0][1]) in keys
    }
    assert ran == placed


def test_per_prefix_by_default(graph_run, tmp_path, capsys):
    run, placed = graph_run
    out = tmp_path / "prefix.prov.json"
    assert main(["export", run.path, "--prov", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    _, counts = _read(out)
    user = 1 if getpass.getuser() else 0
    assert counts["activities"] == 1 + 1 + 3  # work, combine, total
    pairs = {(k.split("-")[0], w) for k, w in placed.items()}  # (prefix, worker) that ran
    assert counts["wasAssociatedWith"] == len(pairs) + user
    assert counts["wasInformedBy"] == 2  # combine <- work, total <- combine
    doc = json.loads(out.read_text())
    n = {a["metacollect:prefix"]: int(a["metacollect:n_tasks"]["$"])
         for a in doc["activity"].values() if "metacollect:prefix" in a}  # fmt: skip
    assert n == {"work": N_WORK, "combine": N_COMBINE, "total": 1}


def test_bounds_and_bad_flags(tmp_path, capsys):
    store = chain_store()
    with pytest.raises(UsageError, match="--prov-tasks prefix"):
        write(open_run(store), tmp_path / "all.json", tasks="all")
    assert LONG_CHAIN > MAX_TASKS
    meta = write(open_run(store), tmp_path / "chain.json")  # one prefix for 200k tasks
    _, counts = _read(tmp_path / "chain.json")
    assert counts["activities"] == meta["activities"] == 3
    assert main(["export", store, "--prov-tasks", "all"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--prov-tasks only applies to --prov" in err[0]
    assert main(["export", store, "--prov", str(tmp_path)]) == 2  # a directory
    assert "is a directory" in capsys.readouterr().err


@pytest.mark.darshan
def test_files_read_and_written_are_entities(tmp_path, darshan_library):  # noqa: F811
    ran = _run(tmp_path, False, darshan_library)
    assert ran["code"] == 0
    out = tmp_path / "files.prov.json"
    assert main(["export", ran["store"], "--prov", str(out), "--prov-tasks", "all"]) == 0
    doc, counts = _read(out)
    files = {
        str(next(iter(r.get_attribute("prov:location")))): r
        for r in doc.get_records(prov.model.ProvEntity)
        if str(next(iter(r.get_attribute("prov:type")))) == "metacollect:File"
    }
    workload = set(ran["inputs"] + ran["outputs"])
    assert workload <= set(files)
    # and the other files of the user's scope the store holds (dask's config files, the
    # processes' temporary files): every one, not Darshan's pseudo-files or the script
    io = open_run(ran["store"]).io(by="file", scope="user")
    seen = {f for f in io["file"] if not f.startswith("<") and f != ran["script"]}
    seen = {f for f in seen if "/metacollect-run-" not in f}
    assert set(files) == seen
    for path in ran["inputs"]:
        assert int(next(iter(files[path].get_attribute("metacollect:bytes_read")))) == (
            os.path.getsize(path)
        )
    for path in ran["outputs"]:
        assert int(next(iter(files[path].get_attribute("metacollect:bytes_written")))) == (
            os.path.getsize(path)
        )
    # the store, the script and the files
    assert counts["entities"] == 2 + len(files)

    def moved(r, counter: str) -> int:
        return int(next(iter(r.get_attribute(f"metacollect:{counter}"))))

    read = [f for f, r in files.items() if moved(r, "bytes_read")]
    written = [f for f, r in files.items() if moved(r, "bytes_written")]
    # the run used the script and each file read, and each copy task the input it read (DXT)
    assert counts["used"] == 1 + len(read) + N_FILES
    # the run generated the store and each output, and each copy task the one it wrote
    assert counts["wasGeneratedBy"] == 1 + len(written) + N_FILES
    assert counts["activities"] == 1 + N_FILES + N_FILES  # the run, a graph per submit, tasks
