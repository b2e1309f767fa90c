"""Bad input: each a clear one-line error, a non-zero exit, and nothing half-written.

The CLI is driven through :func:`metacollect.cli.main` (return code + captured stderr) and once
through a real ``python -m metacollect`` subprocess with a bad ``DASK_METACOLLECT__...`` value.
The fuzz test damages a real store in ~50 seeded ways and checks that ``open_run``, ``info``
and ``validate`` either work or fail with a :class:`MetacollectError`, never a traceback.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys

import dask.array as da
import pytest
from distributed import Client, LocalCluster

from metacollect import collect, open_run
from metacollect.cli import main
from metacollect.errors import (
    MetacollectError,
    NotAStoreError,
    SchemaVersionError,
    StoreError,
)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


@pytest.fixture(scope="module")
def real_store(tmp_path_factory):
    """A real, complete store of a small run on a process LocalCluster."""
    path = str(tmp_path_factory.mktemp("bad") / "good.zarr")
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        collect(client, path, flush_interval="0.5s"),
    ):
        da.ones((60, 60), chunks=20).sum().compute()
    return path


@pytest.fixture
def store_copy(real_store, tmp_path):
    dst = str(tmp_path / "copy.zarr")
    shutil.copytree(real_store, dst)
    return dst


def one_error_line(capsys, command: str) -> str:
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert len(lines) == 1, out.err
    assert lines[0].startswith(f"metacollect {command}: error: "), lines[0]
    assert "Traceback" not in out.err
    return lines[0]


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "ok.py"
    p.write_text("print('hello')\n")
    return str(p)


# -- metacollect run ----------------------------------------------------------------------------


def test_missing_script(tmp_path, capsys):
    store = tmp_path / "s.zarr"
    assert main(["run", "--store", str(store), str(tmp_path / "nope.py")]) == 2
    line = one_error_line(capsys, "run")
    assert "nope.py not found" in line
    assert not store.exists()


def test_unreadable_script(tmp_path, capsys):
    bad = tmp_path / "bin.py"
    bad.write_bytes(b"\xff\xfe\x00 not text")
    store = tmp_path / "s.zarr"
    assert main(["run", "--store", str(store), str(bad)]) == 2
    assert "cannot read script" in one_error_line(capsys, "run")
    assert not store.exists()
    assert main(["run", "--store", str(store), str(tmp_path)]) == 2
    assert "is a directory" in one_error_line(capsys, "run")
    assert not store.exists()


def test_existing_store_without_overwrite(store_copy, script, capsys):
    before = sorted(os.listdir(store_copy))
    root_json = _read(os.path.join(store_copy, "zarr.json"))
    assert main(["run", "--store", store_copy, script]) == 2
    line = one_error_line(capsys, "run")
    assert "exists" in line and "--overwrite" in line
    assert sorted(os.listdir(store_copy)) == before
    assert _read(os.path.join(store_copy, "zarr.json")) == root_json


def test_store_path_is_a_file(tmp_path, script, capsys):
    f = tmp_path / "afile"
    f.write_text("precious")
    assert main(["run", "--store", str(f), script]) == 3
    assert "is a file" in one_error_line(capsys, "run")
    assert f.read_text() == "precious"


def test_store_path_unwritable(tmp_path, script, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    # below a regular file: not creatable, even for root
    assert main(["run", "--store", str(f / "sub.zarr"), script]) == 3
    assert "not writable" in one_error_line(capsys, "run")
    assert f.read_text() == "x"


def test_non_store_directory_not_overwritten(tmp_path, script, capsys):
    d = tmp_path / "data"
    d.mkdir()
    (d / "keep.txt").write_text("mine")
    assert main(["run", "--overwrite", "--store", str(d), script]) == 3
    assert "not a metacollect store" in one_error_line(capsys, "run")
    assert (d / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("var", "value", "expected"),
    [
        (
            "DASK_METACOLLECT__YAPPI__CLOCK",
            "bogus",
            "metacollect.yappi.clock = 'bogus' is not allowed; allowed values: wall, cpu",
        ),
        (
            "DASK_METACOLLECT__FLUSH_INTERVAL",
            "soon",
            "metacollect.flush-interval = 'soon' is not a duration",
        ),
        (
            "DASK_METACOLLECT__BUFFER_LIMIT",
            "5",
            "metacollect.buffer-limit = 5 is below the minimum 1000",
        ),
        (
            "DASK_METACOLLECT__YAPPI__ENABLED",
            "maybe",
            "metacollect.yappi.enabled = 'maybe' has the wrong type; expected boolean",
        ),
    ],
)
def test_invalid_config_values(tmp_path, script, var, value, expected):
    """A real ``metacollect`` process with a bad config value from the environment."""
    store = tmp_path / "s.zarr"
    env = {**os.environ, var: value}
    proc = subprocess.run(
        [sys.executable, "-m", "metacollect", "run", "--store", str(store), script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert expected in lines[0]
    assert "hello" not in proc.stdout  # the script never ran
    assert not store.exists()


# -- reading: not a store, newer schema, corrupt chunks ------------------------------------------


@pytest.mark.parametrize("command", ["info", "validate"])
def test_not_a_store(tmp_path, capsys, command):
    assert main([command, str(tmp_path / "missing")]) == 3
    assert "does not exist" in one_error_line(capsys, command)
    (tmp_path / "plain").mkdir()
    assert main([command, str(tmp_path / "plain")]) == 3
    assert "not a Zarr v3 store" in one_error_line(capsys, command)
    import zarr

    zarr.open_group(str(tmp_path / "other.zarr"), mode="w", zarr_format=3).attrs["x"] = 1
    assert main([command, str(tmp_path / "other.zarr")]) == 3
    assert "not a metacollect run" in one_error_line(capsys, command)
    with pytest.raises(NotAStoreError, match="not a metacollect run"):
        open_run(tmp_path / "other.zarr")


def _set_root_attr(store: str, name: str, value) -> None:
    p = os.path.join(store, "zarr.json")
    meta = json.loads(_read(p))
    meta["attributes"][name] = value
    _write(p, json.dumps(meta).encode())


def test_newer_schema_version(store_copy, capsys):
    _set_root_attr(store_copy, "schema_version", 999)
    with pytest.raises(SchemaVersionError, match=r"schema version 999.*upgrade metacollect"):
        open_run(store_copy)
    for command in ("info", "validate"):
        assert main([command, store_copy]) == 3
        assert "upgrade metacollect" in one_error_line(capsys, command)


def _chunks(store: str, table_suffix: str) -> list[str]:
    out = []
    for dirpath, _, files in os.walk(store):
        rel = os.path.relpath(dirpath, store)
        if f"/{table_suffix}/" in f"/{rel}/":
            out += [os.path.join(dirpath, f) for f in files if f.startswith("c.")]
    return out


def test_corrupt_chunks_name_the_group(store_copy, capsys):
    chunks = [c for c in _chunks(store_copy, "scheduler/transitions")]
    assert chunks
    for c in chunks:
        _write(c, b"\x00garbage, not zstd\xff" * 3)
    run = open_run(store_copy)
    with pytest.raises(StoreError, match=r"clusters/\w+/scheduler/transitions.*damaged"):
        run.transitions()
    assert main(["validate", store_copy]) == 4
    err = capsys.readouterr().err
    assert "scheduler/transitions" in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("metacollect validate: error:")


@pytest.mark.parametrize("junk", [b"\xff", b"\xff\xfe\x00junk", b"{"])
def test_a_group_metadata_that_does_not_decode_is_named_in_one_line(store_copy, capsys, junk):
    """Bytes that are not UTF-8 JSON in a group's ``zarr.json`` (found by the fuzz test:
    Zarr's own UnicodeDecodeError reached ``metacollect info`` as a traceback)."""
    _write(os.path.join(store_copy, "clusters", "zarr.json"), junk)
    with pytest.raises(StoreError, match=r"damaged zarr.json|clusters/zarr.json .* damaged"):
        open_run(store_copy).tasks()
    for command in ("info", "validate"):
        assert main([command, store_copy]) != 0
        err = capsys.readouterr().err
        assert "Traceback" not in err and "clusters" in err
        assert err.strip().splitlines()[-1].startswith(f"metacollect {command}: error:")


# -- fuzz ----------------------------------------------------------------------------------------


def _damage(store: str, rng: random.Random) -> str:
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(store) for f in fs)
    target = rng.choice(files)
    kind = rng.choice(["flip", "truncate", "delete", "empty", "json-junk"])
    if kind == "json-junk":
        target = rng.choice([f for f in files if f.endswith("zarr.json")])
    data = _read(target)
    if kind == "flip" and data:
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        data = bytes(b)
    elif kind == "truncate":
        data = data[: rng.randrange(max(len(data), 1))]
    elif kind == "empty":
        data = b""
    elif kind == "json-junk":
        data = rng.choice(
            [b"[]", b"null", b'{"zarr_format": 3}', b'{"attributes": 7}', b"{", b"\xff"]
        )
    if kind == "delete":
        os.remove(target)
    else:
        _write(target, data)
    return f"{kind} {os.path.relpath(target, store)}"


@pytest.mark.slow
def test_fuzz_damaged_stores(real_store, tmp_path, capsys):
    rng = random.Random(20261121)
    failures = []
    for case in range(50):
        store = str(tmp_path / f"case{case}.zarr")
        shutil.copytree(real_store, store)
        what = _damage(store, rng)
        try:
            open_run(store).errors()
        except MetacollectError:
            pass
        except Exception as e:  # an unexpected traceback is what this test hunts
            failures.append(f"{what}: open_run: {type(e).__name__}: {e}")
        for command in (("info", "validate")[case % 2],):  # alternate: each costs ~1 s
            try:
                code = main([command, store])
            except Exception as e:
                failures.append(f"{what}: {command}: {type(e).__name__}: {e}")
                continue
            err = capsys.readouterr().err
            if code != 0:
                last = err.strip().splitlines()[-1] if err.strip() else ""
                if not last.startswith(f"metacollect {command}: error:"):
                    failures.append(
                        f"{what}: {command} exit {code} without a one-line error: {err!r}"
                    )
        shutil.rmtree(store)
    assert not failures, "\n".join(failures)


# -- ingest darshan: truncated and non-Darshan files ---------------------------------------------


def _example_darshan_log() -> str:
    from darshan.log_utils import get_log_path

    return get_log_path("dxt.darshan")


def test_ingest_darshan_bad_files(store_copy, tmp_path, capsys):
    assert main(["ingest", "darshan", store_copy, str(tmp_path / "no-such-dir")]) == 2
    assert "does not exist" in one_error_line(capsys, "ingest")

    logs = tmp_path / "logs" / "host1"
    logs.mkdir(parents=True)
    (logs / "junk_id1.darshan").write_bytes(b"this is not a darshan log\n" * 10)
    good = _read(_example_darshan_log())
    (logs / "cut_id2.darshan").write_bytes(good[:200])  # cut inside the header
    (logs / "empty_id3.darshan").write_bytes(b"")
    code = main(["ingest", "darshan", store_copy, str(tmp_path / "logs")])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "3 logs could not be read" in err
    assert code == 1  # the rest went in, the exit code still says not all did
    run = open_run(store_copy)  # the store is intact and says which file failed, and why
    what = " ".join(run.errors().what)
    for name in ("junk_id1", "cut_id2", "empty_id3"):
        assert f"cannot read Darshan log {name}.darshan" in what
    assert main(["validate", "-q", store_copy]) == 0
