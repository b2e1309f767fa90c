"""``metacollect export STORE --ro-crate DIR``: a Workflow Run RO-Crate of a real run.

Two runs of real scripts under ``metacollect run``: one that reads the files the test made
and writes others in its tasks (with the real Darshan runtime, when present, so the crate
lists them), one whose script raises. The test checks the JSON-LD against what it recorded
itself: the script's SHA-256, the files' paths, the installed versions, the store's times.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
import sys
import textwrap

import dask
import distributed
import pytest
from rocrate.rocrate import ROCrate

from metacollect import open_run
from metacollect.cli import main
from metacollect.export.ro_crate import PROFILES
from tests.test_darshan_live import _find_library
from tests.test_jobqueue import require_slurm

SCRIPT = """
    import os, sys
    from distributed import Client, LocalCluster

    def copy(src, dst):
        with open(src, "rb") as f:
            data = f.read()
        with open(dst, "wb") as f:
            f.write(data[::-1])
        return len(data)

    if __name__ == "__main__":
        data = sys.argv[1]
        with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as c:
            with Client(c) as client:
                futures = [
                    client.submit(copy, f"{data}/in-{i}.bin", f"{data}/out-{i}.bin")
                    for i in range(3)
                ]
                print(sum(client.gather(futures)))
        if len(sys.argv) > 2:
            raise ValueError("the analysis found nothing")
"""
N_FILES = 3

SCHEMA = "http://schema.org/"


def _run(tmp_path, fail: bool, darshan: str | None) -> dict:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(N_FILES):
        (data / f"in-{i}.bin").write_bytes(os.urandom(1000 + i))
    script = tmp_path / "flow.py"
    script.write_text(textwrap.dedent(SCRIPT))
    store = str(tmp_path / "run.zarr")
    argv = ["run", "--store", store, str(script), str(data)] + (["fail"] if fail else [])
    if darshan:
        argv.insert(1, "--darshan")
    with dask.config.set({"metacollect.darshan.library": darshan}):
        code = main(argv)
    return {
        "code": code,
        "store": store,
        "script": str(script),
        "sha256": hashlib.sha256(script.read_bytes()).hexdigest(),
        "inputs": [str(data / f"in-{i}.bin") for i in range(N_FILES)],
        "outputs": [str(data / f"out-{i}.bin") for i in range(N_FILES)],
        "darshan": darshan,
    }


@pytest.fixture(scope="module")
def ok_run(tmp_path_factory):
    lib = _find_library()
    if lib is None and os.environ.get("CI"):
        pytest.fail("no real Darshan runtime in CI (the crate's inputs and outputs need it)")
    return _run(tmp_path_factory.mktemp("crate-ok"), False, lib)


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("crate-failed"), True, None)


def _export(run: dict, out, *extra: str) -> dict:
    assert main(["export", run["store"], "--ro-crate", str(out), *extra]) == 0
    with open(out / "ro-crate-metadata.json") as f:
        return json.load(f)


def _by_id(doc: dict) -> dict[str, dict]:
    graph = doc["@graph"]
    ids = [e["@id"] for e in graph]
    assert len(ids) == len(set(ids)), "an @id appears twice"
    return {e["@id"]: e for e in graph}


def _refs(value):
    """Every ``{"@id": ...}`` reference inside a property value."""
    if isinstance(value, dict):
        if set(value) == {"@id"}:
            yield value["@id"]
        else:
            for v in value.values():
                yield from _refs(v)
    elif isinstance(value, list):
        for v in value:
            yield from _refs(v)


def _ids(value) -> list[str]:
    return list(_refs(value))


def _types(entity: dict) -> set[str]:
    t = entity["@type"]
    return {t} if isinstance(t, str) else set(t)


def _check_structure(doc: dict, crate_dir) -> dict[str, dict]:
    """What every crate must hold: the contexts, the profiles, references that resolve."""
    assert "https://w3id.org/ro/crate/1.1/context" in doc["@context"]
    assert "https://w3id.org/ro/terms/workflow-run/context" in doc["@context"]
    ents = _by_id(doc)
    meta = ents["ro-crate-metadata.json"]
    assert meta["about"] == {"@id": "./"}
    assert "https://w3id.org/ro/crate/1.1" in _ids(meta["conformsTo"])
    root = ents["./"]
    assert "Dataset" in _types(root)
    conforms = _ids(root["conformsTo"])
    for url, name, version in PROFILES:
        assert url in conforms
        assert ents[url]["name"] == name and ents[url]["version"] == version
    # references resolve: to an entity of the graph, or to a vocabulary term / web page
    for entity in doc["@graph"]:
        for key, value in entity.items():
            if key.startswith("@"):
                continue
            for ref in _refs(value):
                assert ref in ents or ref.startswith(("http://", "https://")), (key, ref)
    # the crate's own data entities are in the directory
    for part in _ids(root["hasPart"]):
        assert part.startswith("file:///") or (crate_dir / part).exists(), part
    return ents


def test_crate_of_a_run_describes_workflow_run_and_software(ok_run, tmp_path, capsys):
    assert ok_run["code"] == 0
    out = tmp_path / "crate"
    doc = _export(ok_run, out)
    assert capsys.readouterr().out.strip() == str(out / "ro-crate-metadata.json")
    ents = _check_structure(doc, out)
    root = ents["./"]

    # the workflow: the script as run, its hash that of the file the test wrote
    wf = ents[root["mainEntity"]["@id"]]
    assert {"File", "SoftwareSourceCode", "ComputationalWorkflow"} <= _types(wf)
    assert hashlib.sha256((out / wf["@id"]).read_bytes()).hexdigest() == ok_run["sha256"]
    assert wf["sha256"] == ok_run["sha256"]
    assert wf["identifier"] == "file://" + ok_run["script"]
    assert ents[wf["programmingLanguage"]["@id"]]["name"] == "Python"

    # the software, with the versions installed here
    software = {
        ents[i]["name"]: ents[i]["softwareVersion"] for i in _ids(wf["softwareRequirements"])
    }
    assert software["Python"] == platform.python_version()
    assert software["Dask"] == dask.__version__
    assert software["Dask distributed"] == distributed.__version__

    # the run: one CreateAction of the workflow, with the store's times and status
    run = open_run(ok_run["store"])
    actions = [ents[i] for i in _ids(root["mentions"])]
    (action,) = [a for a in actions if a["instrument"] == {"@id": wf["@id"]}]
    assert action["@type"] == "CreateAction"
    assert action["actionStatus"] == {"@id": SCHEMA + "CompletedActionStatus"}
    assert "error" not in action
    for key, attr in (("startTime", "started"), ("endTime", "ended")):
        when = dt.datetime.fromisoformat(action[key]).timestamp()
        assert when == pytest.approx(run.attrs[attr], abs=1e-3)
    props = {ents[i]["name"]: ents[i]["value"] for i in _ids(action["additionalProperty"])}
    assert json.loads(props["command_line"]) == run.groups["job"]["command_line"]
    assert json.loads(props["script_arguments"]) == [os.path.dirname(ok_run["inputs"][0])]
    assert ents[action["agent"]["@id"]]["@type"] == "Person"

    # the collection: metacollect made the store, a copy in the crate that opens as the run
    (collection,) = [a for a in actions if a is not action]
    tool = ents[collection["instrument"]["@id"]]
    assert (
        tool["name"] == "metacollect"
        and tool["softwareVersion"] == run.attrs["metacollect_version"]
    )
    store = ents[collection["result"]["@id"]]
    assert store["about"] == {"@id": action["@id"]}
    assert store["@id"] in _ids(root["hasPart"])
    copy = open_run(out / store["@id"])
    assert copy.attrs["run_id"] == run.attrs["run_id"]
    assert len(copy.tasks()) == len(run.tasks()) == N_FILES

    # the rocrate library reads the crate back
    back = ROCrate(str(out))
    assert back.mainEntity.id == wf["@id"]

    # the files the tasks read and wrote, as Darshan saw them
    if ok_run["darshan"] is None:
        assert "object" not in action and "result" not in action
        return
    uri = {p: "file://" + p for p in ok_run["inputs"] + ok_run["outputs"]}
    assert {uri[p] for p in ok_run["inputs"]} <= set(_ids(action["object"]))
    assert {uri[p] for p in ok_run["outputs"]} <= set(_ids(action["result"]))
    assert not {uri[p] for p in ok_run["outputs"]} & set(_ids(action["object"]))
    for p in ok_run["inputs"]:
        assert f"{os.path.getsize(p)} bytes read" in ents[uri[p]]["description"]
    assert "file://" + ok_run["script"] not in _ids(action["object"])  # the workflow itself


def test_a_failed_script_gives_a_failed_action(failed_run, tmp_path):
    assert failed_run["code"] == 1
    assert open_run(failed_run["store"]).attrs["status"] == "failed"
    out = tmp_path / "crate"
    ents = _check_structure(_export(failed_run, out), out)
    wf_id = ents["./"]["mainEntity"]["@id"]
    (action,) = [e for e in ents.values() if e.get("instrument") == {"@id": wf_id}]
    assert action["actionStatus"] == {"@id": SCHEMA + "FailedActionStatus"}
    assert "ValueError" in action["error"] and "found nothing" in action["error"]


def test_the_store_can_be_referenced_instead_of_copied(failed_run, tmp_path, capsys):
    out = tmp_path / "crate"
    ents = _check_structure(_export(failed_run, out, "--reference-store"), out)
    uri = "file://" + os.path.abspath(failed_run["store"]) + "/"
    assert ents[uri]["@type"] == "Dataset"
    assert uri in _ids(ents["./"]["hasPart"])
    assert sorted(os.listdir(out)) == ["ro-crate-metadata.json", "workflow"]
    assert "store " + uri in capsys.readouterr().err


def test_a_non_empty_directory_is_refused_and_kept(failed_run, tmp_path, capsys):
    out = tmp_path / "crate"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert main(["export", failed_run["store"], "--ro-crate", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not empty" in err[0] and "choose a new directory" in err[0]
    assert os.listdir(out) == ["mine.txt"]


def test_a_missing_store_is_one_line(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope.zarr"), "--ro-crate", str(tmp_path / "c")]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0]
    assert not (tmp_path / "c").exists()


SLURM_SCRIPT = """
    import os, sys
    import dask
    from distributed import Client, LocalCluster

    if __name__ == "__main__":
        with open(sys.argv[1], "w") as f:
            f.write(os.environ["SLURM_JOB_ID"] + " " + os.environ["SLURM_JOB_NODELIST"])
        with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as c:
            with Client(c):
                print(dask.compute(dask.delayed(sum)([1, 2])))
"""


@pytest.mark.slurm
@pytest.mark.slow
def test_a_run_inside_a_slurm_job_names_the_job_and_nodes(tmp_path):
    """``srun metacollect run flow.py``: the crate says which job and nodes ran it, as the
    job's own environment said (the script writes it: the ground truth)."""
    require_slurm()
    script = tmp_path / "flow.py"
    script.write_text(textwrap.dedent(SLURM_SCRIPT))
    truth, store = tmp_path / "job.txt", str(tmp_path / "run.zarr")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [
        "srun",
        "-N1",
        "-n1",
        "--chdir",
        str(tmp_path),
        sys.executable,
        "-m",
        "metacollect",
        "run",
        "--store",
        store,
        str(script),
        str(truth),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr
    job_id, nodes = truth.read_text().split()
    out = tmp_path / "crate"
    ents = _check_structure(_export({"store": store}, out), out)
    wf_id = ents["./"]["mainEntity"]["@id"]
    (action,) = [e for e in ents.values() if e.get("instrument") == {"@id": wf_id}]
    props = {ents[i]["name"]: ents[i]["value"] for i in _ids(action["additionalProperty"])}
    assert props["slurm_job_id"] == job_id and props["slurm_nodes"] == nodes
    env_vars = {ents[i]["name"]: ents[i]["value"] for i in _ids(action["environment"])}
    assert env_vars["SLURM_JOB_ID"] == job_id
