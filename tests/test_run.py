"""``metacollect run`` on unmodified scripts, and the CLI around it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from metacollect import open_run
from metacollect.check.validate import validate_store
from metacollect.cli import main

SCRIPTS = {
    "bare_client": """
        from distributed import Client
        import dask.array as da
        if __name__ == "__main__":
            with Client(n_workers=1, threads_per_worker=1, dashboard_address=":0") as c:
                print(da.ones(100, chunks=10).sum().compute())
    """,
    "client_n_workers": """
        from distributed import Client
        if __name__ == "__main__":
            client = Client(n_workers=2, threads_per_worker=1, dashboard_address=":0")
            print(sum(client.gather(client.map(lambda x: x + 1, range(20)))))
            client.close()
    """,
    "own_clusters": """
        import sys
        from distributed import Client, LocalCluster
        if __name__ == "__main__":
            assert sys.argv[1:] == ["--n", "7"], sys.argv
            for i in range(2):  # two clusters one after another
                with LocalCluster(n_workers=1, dashboard_address=":0") as cl, Client(cl) as c:
                    c.cluster.scale(2)
                    c.wait_for_workers(2)
                    print(c.submit(lambda x: x * 2, 21).result())
    """,
}


def _script(tmp_path, name):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(SCRIPTS[name]))
    return str(path)


@pytest.mark.parametrize("name", ["bare_client", "client_n_workers"])
def test_run_collects_whatever_cluster_the_script_starts(tmp_path, name, capsys):
    store = str(tmp_path / "s.zarr")
    assert (
        main(
            [
                "run",
                "--store",
                store,
                "--flush-interval",
                "0.5s",
                _script(tmp_path, name),
            ]
        )
        == 0
    )
    assert f"store written to {store}" in capsys.readouterr().err
    run = open_run(store)
    assert run.attrs["status"] == "complete"
    assert len(run.clusters()) == 1
    assert len(run.tasks()) > 0 and len(run.worker_groups()) >= 1
    script = run.groups["script"]
    assert script["path"].endswith(f"{name}.py") and len(script["sha256"]) == 64
    assert "Client(" in script["source"]
    assert validate_store(store) == []
    assert main(["validate", store]) == 0
    assert main(["info", store]) == 0
    out = capsys.readouterr().out
    assert "status: complete" in out and "[scheduler]" in out and "transitions=" in out
    # workers counted as workers, their joins and leaves as such (not 2 + 2 "workers")
    n = {"bare_client": 1, "client_n_workers": 2}[name]
    assert f"  workers: {n}  size: " in out
    assert f" workers={n} (joined {n}, left {n}) " in out
    assert " clients=1 (joined 1, left 1)" in out


@pytest.mark.slow
def test_run_keeps_several_clusters_apart_and_passes_args(tmp_path):
    store = str(tmp_path / "s.zarr")
    assert (
        main(
            [
                "run",
                _script(tmp_path, "own_clusters"),
                "--store",
                store,
                "--",
                "--n",
                "7",
            ]
        )
        == 0
    )
    run = open_run(store)
    clusters = run.clusters()
    assert len(clusters) == 2
    for c in clusters:
        assert len(run.worker_groups(c)) == 2  # scale(2) added a worker that was collected too
    assert set(run.tasks().cluster) == set(clusters)
    assert run.groups["script"]["argv"] == ["--n", "7"]
    assert validate_store(store) == []


@pytest.mark.slow
def test_run_appends_to_the_users_own_preload(tmp_path, monkeypatch):
    (tmp_path / "mypreload.py").write_text(
        "import os\ndef dask_setup(scheduler):\n    open(os.environ['MARK'], 'w').write('ran')\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("MARK", str(tmp_path / "mark"))
    monkeypatch.setenv("DASK_DISTRIBUTED__SCHEDULER__PRELOAD", '["mypreload"]')
    store = str(tmp_path / "s.zarr")
    assert main(["run", "--store", store, _script(tmp_path, "bare_client")]) == 0
    assert (tmp_path / "mark").read_text() == "ran"
    assert len(open_run(store).tasks()) > 0


def test_run_with_a_local_cluster_started_by_metacollect(tmp_path):
    store = str(tmp_path / "s.zarr")
    script = tmp_path / "uses_bare_client.py"
    script.write_text(
        textwrap.dedent("""
        from distributed import Client
        if __name__ == "__main__":
            with Client() as c:   # connects to the cluster metacollect started
                assert len(c.nthreads()) == 2
                print(c.submit(sum, [1, 2, 3]).result())
    """)
    )
    assert (
        main(
            [
                "run",
                "--store",
                store,
                "--cluster",
                "local",
                "--workers",
                "2",
                "--threads",
                "1",
                str(script),
            ]
        )
        == 0
    )
    run = open_run(store)
    assert run.groups["job"]["cluster_type"] == "LocalCluster"
    assert len(run.worker_groups()) == 2 and len(run.tasks()) == 1
    assert validate_store(store) == []


def test_run_errors_are_one_line(tmp_path, capsys):
    store = str(tmp_path / "s.zarr")
    assert main(["run", "--store", store, str(tmp_path / "missing.py")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "script" in err[0] and "not found" in err[0]
    assert not os.path.exists(store)

    os.makedirs(store)
    (tmp_path / "s.zarr" / "zarr.json").write_text("{}")
    script = _script(tmp_path, "bare_client")
    assert main(["run", "--store", store, script]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists; pass --overwrite" in err[0]

    (tmp_path / "afile").write_text("x")
    assert main(["run", "--store", str(tmp_path / "afile" / "s.zarr"), script]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not writable" in err[0]


def test_invalid_config_value_from_the_environment(tmp_path):
    env = {**os.environ, "DASK_METACOLLECT__YAPPI__CLOCK": "gpu"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "metacollect",
            "run",
            "--store",
            str(tmp_path / "s.zarr"),
            _script(tmp_path, "bare_client"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and "metacollect.yappi.clock = 'gpu'" in lines[0]
        and "wall, cpu" in lines[0]
    )
    assert not (tmp_path / "s.zarr").exists()


#: prints how python runs it, then computes on its own LocalCluster (worker processes: they
#: import nothing of ``__main__`` that the parent could not give them)
PROBE = """
import json, sys
from distributed import Client

def view():
    spec = globals().get("__spec__")
    return {
        "name": __name__,
        "file": __file__,
        "package": __package__,
        "spec": spec.name if spec else None,
        "cached": globals().get("__cached__"),
        "argv": sys.argv,
        "path0": sys.path[0],
    }

if __name__ == "__main__":
    print(json.dumps(view()))
    if "--compute" in sys.argv:
        with Client(n_workers=2, threads_per_worker=1, dashboard_address=":0") as client:
            print(sum(client.gather(client.map(lambda x: x + 1, range(10)))))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layout", "target"),
    [
        ({"flow.py": PROBE}, ["flow.py"]),
        ({"flow.py": PROBE}, ["-m", "flow"]),
        ({"pkg/__init__.py": "", "pkg/__main__.py": PROBE}, ["-m", "pkg"]),
        ({"pkg/__init__.py": "", "pkg/sub/__init__.py": "", "pkg/sub/flow.py": PROBE},
         ["-m", "pkg.sub.flow"]),
    ],
    ids=["script", "module", "package", "submodule"],
)  # fmt: skip
def test_run_a_script_or_module_as_python_does(tmp_path, layout, target):
    """``metacollect run [-m] TARGET ARGS`` runs it as ``python [-m] TARGET ARGS`` does (the
    arguments need no ``--``), collects it, and names the store after it."""
    for name, text in layout.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    args = ["--compute", "-v", "--store", "theirs"]
    plain = subprocess.run(
        [sys.executable, *target, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert plain.returncode == 0, plain.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "metacollect", "run", "--flush-interval", "0.5s", *target, *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout == plain.stdout  # the same view of how it runs, the same sum
    assert proc.stdout.splitlines()[1] == "55"
    (store,) = tmp_path.glob("*.zarr")
    assert store.name.startswith(target[-1].removesuffix(".py") + "-")
    assert f"store written to {store} (status complete)" in proc.stderr
    run = open_run(str(store))
    assert run.attrs["status"] == "complete", run.attrs["missing"]
    assert (run.tasks().prefix == "lambda").sum() == 10
    script = run.groups["script"]
    assert script["path"] == json.loads(plain.stdout.splitlines()[0])["file"]
    assert script["argv"] == args and "def view" in script["source"]
    assert validate_store(str(store)) == []
