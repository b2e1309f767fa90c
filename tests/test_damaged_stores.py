"""Damaged stores: ``validate`` names the damage, or the readers return exactly the undamaged data.

A real store of a small run, sealed as ``finalize`` seals it, and the same with rows
appended after its seal (a writer into the sealed store, then sealed again: its arrays
grown by zarr's ``Array.append``), is damaged in every way we found stores get damaged (a
group, an array or a chunk deleted, garbage or flipped bytes in a compressed chunk, a
``rows`` commit point of -5 or past the arrays, a broken ``zarr.json``, ids that do not
join), then at random (seeded). For each damaged copy: ``validate`` reports a
problem naming what is damaged, or every public reader returns exactly what it returned on
the undamaged store; a reader that meets damage raises a :class:`StoreError`, never returns
wrong data and never another exception.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import zarr
from distributed import Client, LocalCluster

from metacollect import collect, open_run
from metacollect.check.validate import validate_store
from metacollect.errors import StoreError
from metacollect.session import end
from metacollect.store import documents, lifecycle
from metacollect.store import writer as writer_mod

#: the public readers of a run that return tables (and ``config``)
READERS = (
    "tasks",
    "transitions",
    "graphs",
    "graph_tasks",
    "dependencies",
    "events",
    "worker_states",
    "workers",
    "errors",
    "losses",
    "config",
)
WORKER_TABLES = ("tasks", "startstops", "transitions", "transfers", "metrics")


def _collected(path: str) -> str:
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        collect(client, path, flush_interval="0.5s"),
    ):
        da.ones((60, 60), chunks=20).sum().compute()
    return path


@pytest.fixture(scope="module")
def good_store(tmp_path_factory):
    """A real, sealed store of a small run on a process LocalCluster."""
    return _collected(str(tmp_path_factory.mktemp("damage") / "good.zarr"))


@pytest.fixture(scope="module")
def good_data(good_store):
    assert validate_store(good_store) == []
    return read_everything(good_store)


@pytest.fixture(scope="module")
def appended_store(tmp_path_factory):
    """The same, with rows appended after its seal to the scheduler's tables by a writer
    into the sealed store, and sealed again (its arrays grown past their sealed chunks)."""
    path = _collected(str(tmp_path_factory.mktemp("damage") / "appended.zarr"))
    (cluster,) = open_run(path).clusters()
    g = writer_mod.StoreWriter(path).group("scheduler", cluster=cluster)
    n = 300
    g.append(
        "events",
        {
            "time": np.arange(n, dtype=float),
            "topic": ["late"] * n,
            "msg": [f"m{i}" for i in range(n)],
        },
    )
    g.append(
        "transitions",
        {
            "key": [f"late-{i}" for i in range(n)],
            "start": ["released"] * n,
            "finish": ["waiting"] * n,
            "time": np.arange(n, dtype=float),
        },
    )
    g.flush()
    g.close_streams()
    lifecycle.consolidate(path)
    return path


@pytest.fixture(scope="module")
def appended_data(appended_store):
    assert validate_store(appended_store) == []
    return read_everything(appended_store)


def read_everything(store: str) -> dict[str, Any]:
    """What every public reader of the run returns, and every table of every group."""
    run = open_run(store)
    out: dict[str, Any] = {name: getattr(run, name)() for name in READERS}
    out.update({f"worker_table:{t}": run.worker_table(t) for t in WORKER_TABLES})
    for path in sorted(run.groups):
        spec = run.schema.match(path)
        for table in spec.tables if spec is not None else ():
            out[f"{path}/{table}"] = run.table(path, table)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, pd.DataFrame):
        try:
            pd.testing.assert_frame_equal(a, b)
        except AssertionError:
            return False
        return True
    return bool(a == b)


def reader_outcome(store: str, good: dict[str, Any]) -> str:
    """``exact`` (every reader returns the undamaged data), ``StoreError: ...``, ``wrong: ...``
    (what differs) or ``crash: ...`` (an exception other than a StoreError)."""
    try:
        found = read_everything(store)
    except StoreError as e:
        return f"StoreError: {e}"
    except Exception as e:
        return f"crash: {type(e).__name__}: {e}"
    if found.keys() != good.keys():
        return f"wrong: readers {sorted(found.keys() ^ good.keys())} appear or vanish"
    differ = [k for k in good if not _same(good[k], found[k])]
    return f"wrong: {differ}" if differ else "exact"


# -- damage ---------------------------------------------------------------------------------------
def _one(store: str, pattern: str) -> str:
    found = sorted(glob.glob(os.path.join(store, pattern)))
    assert found, pattern
    return found[0]


def _rel(store: str, path: str) -> str:
    return os.path.relpath(path, store)


def _edit_json(path: str, edit: Callable[[dict[str, Any]], None]) -> None:
    with open(path) as f:
        doc = json.load(f)
    edit(doc)
    with open(path, "w") as f:
        json.dump(doc, f)


def _flip_middle(path: str, count: int = 6) -> None:
    with open(path, "rb") as f:
        data = bytearray(f.read())
    mid = len(data) // 2
    for i in range(count):
        data[(mid + 3 * i) % len(data)] ^= 0x5A
    with open(path, "wb") as f:
        f.write(bytes(data))


def delete_group(store: str, pattern: str) -> str:
    path = _one(store, pattern)
    shutil.rmtree(path)
    return _rel(store, path)


def _first_chunk(store: str, array: str) -> tuple[str, str]:
    """The file of an array's first chunk, named as its metadata names chunks, and the
    array's path in the store (what a reader names when the chunk is damaged)."""
    where = _one(store, array)
    meta = zarr.open_array(where, mode="r").metadata
    key = meta.encode_chunk_key((0,) * len(meta.shape))
    return os.path.join(where, *key.split("/")), _rel(store, where)


def delete_chunk(store: str, array: str) -> str:
    path, where = _first_chunk(store, array)
    os.remove(path)
    return where


def garbage_chunk(store: str, array: str) -> str:
    path, where = _first_chunk(store, array)
    with open(path, "wb") as f:
        f.write(b"\x00garbage, not a compressed chunk\xff" * 3)
    return where


def flip_chunk(store: str, array: str) -> str:
    path, where = _first_chunk(store, array)
    _flip_middle(path)
    return where


def truncate_chunk(store: str, array: str) -> str:
    path, where = _first_chunk(store, array)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    return where


def set_rows(store: str, table: str, rows: Callable[[int], int]) -> str:
    path = _one(store, table)
    _edit_json(
        os.path.join(path, "zarr.json"),
        lambda d: d["attributes"].update(rows=rows(d["attributes"]["rows"])),
    )
    return _rel(store, path)


def edit_array_json(store: str, array: str, edit: Callable[[dict[str, Any]], None]) -> str:
    path = _one(store, array)
    _edit_json(os.path.join(path, "zarr.json"), edit)
    return _rel(store, path)


def junk_json(store: str, node: str, junk: bytes = b'{"zarr_format": 3, "node_') -> str:
    path = _one(store, node)
    with open(os.path.join(path, "zarr.json"), "wb") as f:
        f.write(junk)
    return _rel(store, path)


def set_value(store: str, array: str, index: int, value: Callable[[Any, str], Any]) -> str:
    """Write one value through Zarr (the chunk stays well-formed): damage only the data."""
    path = _one(store, array)
    arr = zarr.open_array(path, mode="r+")
    arr[index] = value(arr, path)
    return _rel(store, path)


S = "clusters/*/scheduler"
C = "clusters/*/client"
W = "clusters/*/workers/*"

#: (name, damage): each returns the path (group or array) that validate must name
DAMAGES: list[tuple[str, Callable[[str], str]]] = [
    ("delete worker group", lambda s: delete_group(s, W)),
    ("delete table group", lambda s: delete_group(s, f"{S}/tasks")),
    ("delete array", lambda s: delete_group(s, f"{S}/tasks/nbytes")),
    ("delete chunk (names)", lambda s: delete_chunk(s, f"{S}/transitions/key")),
    ("delete chunk (floats)", lambda s: delete_chunk(s, f"{S}/tasks/start")),
    ("delete chunk (appended)", lambda s: delete_chunk(s, f"{S}/events/time")),
    ("garbage chunk (blosc)", lambda s: garbage_chunk(s, f"{S}/tasks/start")),
    ("garbage chunk (zstd)", lambda s: garbage_chunk(s, f"{C}/tasks/key")),
    ("flip bytes in blosc chunk", lambda s: flip_chunk(s, f"{S}/tasks/stop")),
    ("flip bytes in zstd names", lambda s: flip_chunk(s, f"{S}/transitions/key")),
    ("flip bytes in zstd chunk", lambda s: flip_chunk(s, f"{S}/transitions/stimulus_id")),
    ("flip bytes in str column", lambda s: flip_chunk(s, f"{S}/events/msg")),
    ("truncate chunk", lambda s: truncate_chunk(s, f"{S}/transitions/time")),
    ("rows -5", lambda s: set_rows(s, f"{S}/transitions", lambda n: -5)),
    ("rows past the arrays", lambda s: set_rows(s, f"{S}/tasks", lambda n: n + 100)),
    ("rows cut short", lambda s: set_rows(s, f"{S}/transitions", lambda n: n - 3)),
    ("rows not an int", lambda s: set_rows(s, f"{S}/tasks", lambda n: str(n))),
    ("invalid zarr.json (array)", lambda s: junk_json(s, f"{S}/tasks/key")),
    ("invalid zarr.json (table)", lambda s: junk_json(s, f"{S}/transitions")),
    ("invalid zarr.json (group)", lambda s: junk_json(s, W, b"\xff\xfe")),
    (
        "wrong dtype",
        lambda s: edit_array_json(s, f"{S}/tasks/start", lambda d: d.update(data_type="int64")),
    ),
    (
        "wrong shape",
        lambda s: edit_array_json(
            s, f"{S}/transitions/time", lambda d: d.update(shape=[d["shape"][0] - 4])
        ),
    ),
    (
        "wrong fill, chunk gone",
        lambda s: (
            edit_array_json(s, f"{S}/tasks/nbytes", lambda d: d.update(fill_value=7)),
            delete_chunk(s, f"{S}/tasks/nbytes"),
        )[1],
    ),
    (
        "sealed task key not a transition",
        lambda s: set_value(s, f"{S}/tasks/key", 1, lambda a, p: "('no-such-key', 0)"),
    ),
    ("names as ints", lambda s: edit_array_json(s, f"{S}/tasks/worker", _as_codes)),
    (
        "sealed units gone",
        lambda s: edit_array_json(s, f"{S}/tasks/start", lambda d: d["attributes"].pop("units")),
    ),
    ("graph id not a graph", lambda s: set_value(s, f"{C}/tasks/graph", 0, lambda a, p: 99)),
    (
        "dependency graph not a graph",
        lambda s: set_value(s, f"{C}/dependencies/graph", 0, lambda a, p: 7),
    ),
]


def _as_codes(doc: dict[str, Any]) -> None:
    doc.update(data_type="int32", fill_value=-1)


#: damage done to the store with rows appended after its seal (its grown arrays)
APPENDED = {
    "delete chunk (names)",
    "delete chunk (appended)",
    "flip bytes in zstd names",
    "flip bytes in zstd chunk",
    "flip bytes in str column",
    "truncate chunk",
    "rows cut short",
}


def _rel_in(where: str, problems: list[str]) -> bool:
    """Whether a problem names ``where`` (its cluster id and worker group in any form)."""
    parts = where.split("/")
    return any(all(p in line for p in parts) for line in problems)


#: damage only a check across tables finds: each value is valid on its own, and a reader of
#: one table does not read the table it joins (``validate`` does)
JOINS_ONLY = {
    "sealed task key not a transition",
    "graph id not a graph",
    "dependency graph not a graph",
}


@pytest.mark.parametrize("name, damage", DAMAGES, ids=[n for n, _ in DAMAGES])
def test_damage_is_named(name, damage, request, tmp_path):
    form = "appended" if name in APPENDED else "good"
    good_store = request.getfixturevalue(f"{form}_store")
    good_data = request.getfixturevalue(f"{form}_data")
    store = str(tmp_path / "damaged.zarr")
    shutil.copytree(good_store, store)
    where = damage(store)
    problems = validate_store(store)
    outcome = reader_outcome(store, good_data)
    assert problems, f"validate passed; readers: {outcome}"
    assert _rel_in(where, problems), f"{where} not named in {problems}"
    if name in JOINS_ONLY:
        assert not outcome.startswith("crash"), outcome
    else:
        assert outcome == "exact" or outcome.startswith("StoreError"), outcome
    if outcome.startswith("StoreError"):  # names the damaged node, or the group holding it
        assert "damaged" in outcome, outcome
        assert where.split("/")[-1] in outcome or where.split("/")[-2] in outcome, outcome


# -- fuzz -----------------------------------------------------------------------------------------
def _fuzz_damage(store: str, rng: random.Random) -> str:
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(store) for f in fs)
    target = rng.choice(files)
    kind = rng.choice(["flip", "flip", "truncate", "delete", "empty", "zero-range"])
    with open(target, "rb") as f:
        data = bytearray(f.read())
    if kind == "flip" and data:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        data = data[: rng.randrange(max(len(data), 1))]
    elif kind == "empty":
        data = bytearray()
    elif kind == "zero-range" and data:
        lo = rng.randrange(len(data))
        hi = min(len(data), lo + rng.randint(1, 16))
        data[lo:hi] = bytes(hi - lo)
    if kind == "delete":
        os.remove(target)
    else:
        with open(target, "wb") as f:
            f.write(bytes(data))
    return f"{kind} {_rel(store, target)}"


FUZZ_CASES = 40


@pytest.mark.slow
@pytest.mark.parametrize("form", ["good", "appended"])
def test_fuzz_damage_caught_or_harmless(form, request, tmp_path):
    good_store = request.getfixturevalue(f"{form}_store")
    good_data = request.getfixturevalue(f"{form}_data")
    rng = random.Random(20240924)
    failures = []
    for case in range(FUZZ_CASES):
        store = str(tmp_path / f"case{case}.zarr")
        shutil.copytree(good_store, store)
        what = _fuzz_damage(store, rng)
        problems = validate_store(store)
        if not problems:  # damage validate lets pass must change nothing a reader returns
            outcome = reader_outcome(store, good_data)
            if outcome != "exact":
                failures.append(f"{what}: validate passed; readers {outcome}")
        shutil.rmtree(store)
    assert not failures, "\n".join(failures)


def test_undamaged_copy_reads_the_same(good_store, good_data, tmp_path):
    """The harness itself: a plain copy validates and reads exactly like the original."""
    store = str(tmp_path / "copy.zarr")
    shutil.copytree(good_store, store)
    assert validate_store(store) == []
    assert reader_outcome(store, good_data) == "exact"
    assert np.isfinite(good_data["tasks"]["start"]).all()


def test_validate_of_a_sealed_store_from_its_documents_finds_what_zarr_finds(tmp_path, monkeypatch):
    """``validate`` opens a sealed store's nodes from the documents its seal check read
    (not through Zarr, one group at a time): a store sealed with problems of its own (a group
    without the attributes the schema needs) gets the same
    problems, in the same order, as through Zarr; a store whose nodes are unlike its seal
    is walked through Zarr."""
    from metacollect.check import validate as validate_mod
    from metacollect.session import init_root

    path = str(tmp_path / "run.zarr")
    w = writer_mod.StoreWriter(path)
    init_root(w, "bare")
    g = w.group("scheduler", cluster="c1")  # none of a scheduler's attributes
    g.append(
        "transitions", {"key": ["a", "b"], "start": ["released"] * 2, "finish": ["waiting"] * 2}
    )
    g.append("events", {"time": [1.0], "topic": ["t"], "msg": ["m"]})
    g.flush()
    end.finalize(path)
    opened = []
    check_seal = validate_mod._check_seal

    def seen(root, problems):
        sealed, nodes = check_seal(root, problems)
        opened.append(nodes.docs is not None)
        return sealed, nodes

    monkeypatch.setattr(validate_mod, "_check_seal", seen)
    from_docs = validate_store(path)
    monkeypatch.setattr(
        validate_mod,
        "_check_seal",
        lambda root, problems: (check_seal(root, problems)[0], documents.Nodes(root)),
    )
    through_zarr = validate_store(path)
    assert opened == [True]
    assert any("missing attr" in p for p in from_docs)
    assert from_docs == through_zarr
    monkeypatch.setattr(validate_mod, "_check_seal", seen)
    doc = os.path.join(path, "clusters", "c1", "scheduler", "events", "zarr.json")
    with open(doc) as f:
        meta = json.load(f)
    meta["attributes"]["added"] = 1  # unlike the seal now
    with open(doc, "w") as f:
        json.dump(meta, f)
    changed = validate_store(path)
    assert opened == [True, False]
    assert any("events" in p for p in changed) and set(from_docs) <= set(changed)
