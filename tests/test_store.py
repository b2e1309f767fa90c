"""The writer, the reader and the schema, without a cluster."""

from __future__ import annotations

import os

import dask.config
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

from metacollect import open_run
from metacollect.check.validate import validate_store
from metacollect.session import init_root
from metacollect.session.end import finalize
from metacollect.steps.job import JobInfo, write_job
from metacollect.store import documents
from metacollect.store.schema import load_schema
from metacollect.store.writer import StoreWriter
from metacollect.store.zarrio import walk


def test_schema_groups_have_map_attrs():
    schema = load_schema()
    assert schema.levels[:5] == ["run", "job", "config", "client", "scheduler"]
    for spec in schema.groups.values():
        assert spec.level in schema.levels
        assert spec.step in schema.steps
        assert spec.category in schema.categories
        for table in spec.tables.values():
            for var in table.variables.values():
                assert var.description, (spec.kind, table.name, var.name)
    assert schema.match("clusters/ab12/workers/0-x").kind == "worker"
    assert schema.table_owner("clusters/ab12/scheduler/transitions")[1].dim == "transition"


CLUSTER_ATTRS = {
    "scheduler_id": "Scheduler-c1",
    "address": "tcp://x:1",
    "host": "h",
    "pid": 1,
    "started": 1.0,
    "ended": 2.0,
    "attached_by": "plugin",
}


def store_of_groups(store: str, cluster: dict, workers: dict[str, dict]) -> str:
    """A sealed store made by the writer alone (no collector ran): one cluster with
    ``cluster``'s attrs over :data:`CLUSTER_ATTRS`, its scheduler's group, and a worker
    group of each ``workers`` entry's attrs (``tcp://h:<i>`` on host ``h``, pid 10 + i):
    the shape of a store written before a group's attrs or tables were recorded."""
    from metacollect.store.lifecycle import prepare_store

    prepare_store(store)
    w = StoreWriter(store)
    init_root(w, "r1")
    w.group("cluster", attrs={**CLUSTER_ATTRS, **cluster}, cluster="c1")
    w.group("scheduler", cluster="c1")
    for i, (name, attrs) in enumerate(workers.items()):
        where = {"address": f"tcp://h:{i}", "host": "h", "pid": 10 + i}
        w.group("worker", attrs={**where, **attrs}, cluster="c1", worker=name)
    w.flush()
    finalize(store)
    return store


def test_roundtrip_tables_strings_and_datatree(store):
    w = StoreWriter(store)
    init_root(w, "r1")
    w.group("cluster", attrs=CLUSTER_ATTRS, cluster="c1")
    g = w.group("scheduler", cluster="c1")
    n = 70_000  # more than one chunk
    keys = [("x", i % 1000) for i in range(n)]
    g.append(
        "transitions",
        {
            "key": keys,
            "start": ["released"] * n,
            "finish": ["waiting"] * n,
            "time": np.arange(n, dtype=float),
            "stimulus_id": ["s"] * n,
            "worker": [None] * n,
        },
    )
    assert g.flush() == n
    g.append(
        "transitions",
        {
            "key": ["late"],
            "start": ["waiting"],
            "finish": ["processing"],
            "time": [1e9],
            "stimulus_id": ["s2"],
            "worker": ["tcp://w"],
        },
    )
    g.flush()
    finalize(store)
    run = open_run(store)
    tr = run.transitions()
    assert len(tr) == n + 1
    assert tr.key.iloc[5] == "('x', 5)" and tr.key.iloc[-1] == "late"
    assert pd.isna(tr.worker.iloc[0]) and tr.worker.iloc[-1] == "tcp://w"
    assert run.attrs["status"] == "complete"
    assert run.attrs["levels"]["scheduler"] == ["clusters/c1/scheduler"]
    tree = xr.open_datatree(store, engine="zarr")
    ds = tree["clusters/c1/scheduler/transitions"].ds
    assert ds.sizes["transition"] == n + 1
    assert ds["time"].dtype.kind == "M"  # CF units: a datetime64 for plain xarray
    assert ds["time"].attrs["long_name"] == "when the transition happened"
    assert tree["clusters/c1/scheduler"].attrs["step"] == 3
    assert validate_store(store) == []
    # metadata written by zarr, whose own settings stay untouched in the writer's process
    import pathlib

    metadata = list(pathlib.Path(store).rglob("zarr.json"))
    assert len(metadata) > 10
    assert zarr.config.get("json_indent") == 2


@pytest.mark.parametrize("n", [40, 3000])  # a worker's flush and a larger one, all columns together
def test_a_flush_encodes_the_names_of_all_its_tables_together(store, n):
    """A flush encodes the names of every table it writes in one pass (a task's key object
    in its transitions and its execution, a worker's address, states): each table reads
    back what was appended to it, live from the streams and sealed, also across two
    appends of a table where a column is left out of one (its fill), with None and NaN
    for no value and objects that are not strings."""
    w = StoreWriter(store)
    init_root(w, "r1")
    w.group("cluster", attrs=CLUSTER_ATTRS, cluster="c1")
    g = w.group("scheduler", cluster="c1")
    keys = [("x", i) for i in range(n)]
    workers = ["tcp://a:1", None, float("nan"), "tcp://b:2"]
    expect_tr: list[tuple[object, ...]] = []
    expect_tasks: list[tuple[object, ...]] = []
    for part in range(2):
        tr = {
            "key": [k for k in keys for _ in range(2)],
            "start": ["waiting", "processing"] * n,
            "finish": ["processing", "memory"] * n,
            "time": np.arange(2 * n, dtype=float),
            "stimulus_id": [f"s-{part}-{i // 2}" for i in range(2 * n)],
            "worker": [workers[i % 4] for i in range(2 * n)],
        }
        g.append("transitions", tr)
        expect_tr += [
            (str(k), s, f, st, wk if isinstance(wk, str) else None)
            for k, s, f, st, wk in zip(
                tr["key"], tr["start"], tr["finish"], tr["stimulus_id"], tr["worker"], strict=True
            )
        ]
        tasks = {
            "key": keys,
            "prefix": ["x"] * n,
            "group": [("x", part)] * n,  # not a string: stored as its str()
            "state": ["memory"] * n,
            "worker": [workers[i % 4] for i in range(n)],
            "time": np.arange(n, dtype=float),
        }
        if part:
            tasks["typename"] = ["int", None] * (n // 2)
        g.append("tasks", tasks)
        expect_tasks += [
            (
                str(k),
                "x",
                str(("x", part)),
                "memory",
                wk if isinstance(wk, str) else None,
                ("int" if i % 2 == 0 else None) if part else None,
            )
            for i, (k, wk) in enumerate(zip(keys, tasks["worker"], strict=True))
        ]
    assert g.flush() == 6 * n

    def rows(df: pd.DataFrame, names: list[str]) -> list[tuple[object, ...]]:
        return [tuple(None if pd.isna(v) else v for v in r) for r in df[names].itertuples(False)]

    for when in ("live", "sealed"):
        if when == "sealed":
            finalize(store)
        run = open_run(store)
        tr_names = ["key", "start", "finish", "stimulus_id", "worker"]
        assert rows(run.transitions(), tr_names) == expect_tr, when
        tasks_names = ["key", "prefix", "group", "state", "worker", "typename"]
        assert rows(run.scheduler_table("tasks"), tasks_names) == expect_tasks, when
    assert validate_store(store) == []


def test_groups_made_at_once_by_many_writers_each_keep_their_attributes(store):
    """Sixteen writers make their worker groups at the same moment, as a cluster's workers
    do at a session's start, one of them the cluster's group as well: each group is made
    once, whole, with its own attributes and its level's annotation, their common parents
    too (never written over by a writer that found one missing), and no temporary file is
    left. A
    group found already there gets its new attributes beside its old ones, and a parent
    made without its annotation (by Zarr alone) gets it."""
    import os
    import threading
    from concurrent.futures import ThreadPoolExecutor

    init_root(StoreWriter(store), "r1")
    zarr.open_group(store, mode="a").require_group("clusters")  # no annotation
    n = 16
    start = threading.Barrier(n)

    def make(i: int) -> None:
        w = StoreWriter(store)
        start.wait()
        if i == 0:  # the scheduler's cluster group, a parent of the workers' groups
            w.group("cluster", attrs=CLUSTER_ATTRS, cluster="c1")
        w.group("worker", attrs={"address": f"tcp://w:{i}"}, cluster="c1", worker=f"{i}-w")

    with ThreadPoolExecutor(n) as pool:
        list(pool.map(make, range(n)))
    assert zarr.open_group(store, mode="r")["clusters/c1"].attrs["scheduler_id"] == "Scheduler-c1"
    StoreWriter(store).group("worker", attrs={"ended": 2.0}, cluster="c1", worker="3-w")
    schema = load_schema()
    root = zarr.open_group(store, mode="r")
    for path in ("clusters", "clusters/c1", "clusters/c1/workers"):
        spec = schema.match(path)
        if spec is not None:
            assert root[path].attrs["step"] == spec.step, path
    for i in range(n):
        attrs = dict(root[f"clusters/c1/workers/{i}-w"].attrs)
        assert attrs["address"] == f"tcp://w:{i}" and attrs["level"] == "worker"
        assert ("ended" in attrs) == (i == 3)
    left = [f for _, _, fs in os.walk(store) for f in fs if f.endswith(".partial")]
    assert left == []
    finalize(store)
    tree = xr.open_datatree(store, engine="zarr")
    assert len(tree["clusters/c1/workers"].children) == n


def test_a_group_made_by_another_writer_meanwhile_is_never_written_over(store, monkeypatch):
    """The race the sixteen writers above can lose: a group's document is missing when a
    writer looks and there when it writes (another process made it in between). The writer
    keeps the other's document and its attributes, and says it did not make the group."""
    import metacollect.store.zarrio as zarrio

    init_root(StoreWriter(store), "r1")
    root = zarrio.open_root(store)
    theirs, made = documents.local_group(root, "clusters", {"by": "them"})
    assert made and dict(theirs.attrs) == {"by": "them"}
    read = documents._read_json
    looked: list[str] = []

    def missed_once(path: str) -> object:  # the first look finds nothing, as in the race
        looked.append(path)
        return None if len(looked) == 1 else read(path)

    monkeypatch.setattr(documents, "_read_json", missed_once)
    mine, made = documents.local_group(root, "clusters", {"by": "me"})
    assert not made and dict(mine.attrs) == {"by": "them"} and len(looked) == 2
    assert dict(zarr.open_group(store, mode="r")["clusters"].attrs) == {"by": "them"}
    # a filesystem without hard links: made all the same, and still never written over
    monkeypatch.setattr(documents, "_read_json", read)

    def no_links(src: str, dst: str) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(documents.os, "link", no_links)
    _, made = documents.local_group(root, "clusters/c1", {"by": "me"})
    assert made and dict(zarr.open_group(store, mode="r")["clusters/c1"].attrs) == {"by": "me"}
    assert not documents._link_new(f"{store}/clusters/zarr.json", b"{}")
    assert dict(zarr.open_group(store, mode="r")["clusters"].attrs) == {"by": "them"}


def test_flush_failure_keeps_rows_and_reports_once(store, tmp_path):
    w = StoreWriter(store)
    g = w.group("scheduler", cluster="c1")
    g.append("events", {"time": [1.0], "topic": ["t"], "msg": ["{}"]})
    g.flush()
    orig = g._append_tables
    calls = []

    def broken(tables):
        calls.append(list(tables))
        raise OSError("disk gone")

    g._append_tables = broken
    g.append("events", {"time": [2.0], "topic": ["t"], "msg": ["{}"]})
    assert g.flush() == 0 and g.flush() == 0
    assert g.tables["events"].pending == 1
    assert g.tables["errors"].pending == 1  # reported once, not per attempt
    g._append_tables = orig
    g.flush()
    run = open_run_unfinalized(store)
    assert run.table("clusters/c1/scheduler", "events").time.tolist() == [1.0, 2.0]
    assert "disk gone" in run.table("clusters/c1/scheduler", "errors").what[0]


def open_run_unfinalized(store):
    w = StoreWriter(store)
    init_root(w, "r")
    return open_run(store)


def test_buffer_limit_bounds_memory(store):
    with dask.config.set({"metacollect.buffer-limit": 1000}):
        g = StoreWriter(store).group("scheduler", cluster="c1")
    for i in range(30):
        g.append(
            "events",
            {"time": [float(i)] * 100, "topic": ["t"] * 100, "msg": [""] * 100},
        )
    assert g.tables["events"].pending <= 1100
    assert g.tables["events"].dropped >= 1900


def test_job_info_roundtrip_and_redaction(monkeypatch, store):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("MY_API_TOKEN", "s3cr3t-value")
    info = JobInfo.capture("collect", argv=["x.py", "--password", "pw"])
    assert JobInfo.from_dict(info.to_dict()) == info
    assert info.environment["SLURM_JOB_ID"] == "42"
    assert info.environment["MY_API_TOKEN"] == "<redacted>"
    assert info.command_line == ["x.py", "--password", "<redacted>"]
    w = StoreWriter(store)
    init_root(w, "r")
    write_job(w, info)
    finalize(store)
    run = open_run(store)
    env = run.table("job", "environment").set_index("name").value
    assert env["SLURM_JOB_ID"] == "42"
    assert run.config()["metacollect"]["flush-interval"] == "5s"
    assert "distributed" in run.config()
    assert validate_store(store) == []


def test_packages_are_every_installed_distribution_read_off_its_header(tmp_path, store):
    """``job/packages`` lists what ``importlib.metadata`` knows, read off each file's
    header only: the same names and versions as parsing the whole file, and a long
    description that looks like headers changes nothing."""
    import importlib.metadata as im

    from metacollect.steps.job import name_version

    egg = tmp_path / "legacy.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text(
        "Metadata-Version: 1.1\nName: legacy\nVersion: 0.3\n\nName: not-this\nVersion: 9.9\n"
    )
    assert name_version(im.PathDistribution(egg)) == ("legacy", "0.3")
    empty = tmp_path / "broken.dist-info"
    empty.mkdir()
    assert name_version(im.PathDistribution(empty)) is None
    expected = sorted(
        {(d.metadata["Name"], d.version) for d in im.distributions() if d.metadata["Name"]}
    )
    w = StoreWriter(store)
    init_root(w, "r")
    write_job(w, JobInfo.capture("collect"))
    packages = open_run(store).table("job", "packages")
    assert list(zip(packages.name, packages.version, strict=True)) == expected
    assert ("distributed", im.version("distributed")) in expected
    # the run's own versions (the job's attributes) are read the same way
    from metacollect.steps.job import VERSIONED, versions

    found = versions()
    assert {n: v for n, v in found.items() if n != "python"} == {
        n: im.version(n) for n in VERSIONED if n in found
    }
    assert {"dask", "distributed", "zarr"} <= set(found)


def test_installed_packages_are_read_again_when_the_environment_changes(tmp_path, monkeypatch):
    """A session's package list is read once per state of ``sys.path`` (a second session
    in the same process reads no metadata file), and a distribution installed since, or
    removed, is seen by the next session."""
    import importlib.metadata as im

    from metacollect.steps import job

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    first = job.installed()
    assert ("distributed", im.version("distributed")) in first
    assert all(name != "mc-late" for name, _ in first)
    reads: list[str] = []
    monkeypatch.setattr(job, "name_version", lambda d: reads.append(d) or None)
    assert job.installed() == first and reads == []  # the same environment: no reads
    monkeypatch.undo()
    monkeypatch.syspath_prepend(str(site))
    late = site / "mc_late-1.2.dist-info"
    late.mkdir()
    (late / "METADATA").write_text("Metadata-Version: 2.1\nName: mc-late\nVersion: 1.2\n")
    assert ("mc-late", "1.2") in job.installed()
    assert job.versions()["distributed"] == im.version("distributed")
    (late / "METADATA").unlink()
    late.rmdir()
    assert all(name != "mc-late" for name, _ in job.installed())


def test_validate_reports_schema_violations(store):
    w = StoreWriter(store)
    init_root(w, "r")
    w.group("scheduler", cluster="c1").append(
        "events", {"time": [1.0], "topic": ["t"], "msg": [""]}
    )
    w.flush()
    finalize(store)
    import zarr

    root = zarr.open_group(store, mode="a")
    root["clusters/c1/scheduler"].attrs["step"] = 9
    root.create_group("stray")
    problems = validate_store(store)
    assert any("step is 9, schema says 3" in p for p in problems)
    assert any("stray: group not described" in p for p in problems)


def test_open_run_rejects_non_stores(tmp_path):
    from metacollect.errors import NotAStoreError

    with pytest.raises(NotAStoreError, match="does not exist"):
        open_run(tmp_path / "nope.zarr")
    import zarr

    zarr.open_group(str(tmp_path / "plain.zarr"), mode="w")
    with pytest.raises(NotAStoreError, match="not a metacollect run"):
        open_run(tmp_path / "plain.zarr")


def _broken_stream(monkeypatch, table: str, broken: dict[str, bool], half: bool = True) -> None:
    """Writes to ``table``'s stream files fail while ``broken["on"]`` (the disk fills under
    them): with ``half``, after half of the flush's bytes landed."""
    from metacollect.store import streams

    real = streams._write_all

    def flaky(fd: int, data: bytes) -> None:
        if broken["on"] and os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(
            f"{table}."
        ):
            if half:
                real(fd, data[: len(data) // 2])
            raise OSError("disk full")
        real(fd, data)

    monkeypatch.setattr(streams, "_write_all", flaky)


def test_append_that_fails_half_way_is_written_over(store, monkeypatch):
    """One table's stream failing half-way through a flush while the others land: readers
    never see the half batch (the stream is cut back to its last whole one), and the next
    flush writes the rows again, so no row is duplicated and every string is whole."""
    w = StoreWriter(store)
    init_root(w, "r")
    g = w.group("scheduler", cluster="c1")
    g.append("events", {"time": [1.0], "topic": ["a"], "msg": ["m1"]})
    g.flush()
    broken = {"on": True}
    _broken_stream(monkeypatch, "events", broken)
    g.append("events", {"time": [2.0, 3.0], "topic": ["b", "c"], "msg": ["m2", "m3"]})
    assert g.flush() == 0
    assert len(open_run(store).table("clusters/c1/scheduler", "events")) == 1
    broken["on"] = False
    assert g.flush() > 0
    run = open_run(store)
    events = run.table("clusters/c1/scheduler", "events")
    assert events.time.tolist() == [1.0, 2.0, 3.0]
    assert events.topic.tolist() == ["a", "b", "c"]
    assert "disk full" in run.table("clusters/c1/scheduler", "errors").what[0]
    finalize(store)
    assert open_run(store).table("clusters/c1/scheduler", "events").msg.tolist() == [
        "m1",
        "m2",
        "m3",
    ]


def _events_flushed_one_by_one(store: str, n: int) -> StoreWriter:
    """A run's store with ``n`` scheduler events, each appended by a flush of its own."""
    w = StoreWriter(store)
    init_root(w, "r")
    w.group("cluster", attrs=CLUSTER_ATTRS, cluster="c1")
    g = w.group("scheduler", cluster="c1")
    for i in range(n):
        g.append("events", {"time": [float(i)], "topic": ["t"], "msg": [f"m{i}"]})
        g.flush()
    return w


def test_arrays_are_cut_to_their_rows_when_sealed(store):
    """Readers stop at a table's ``rows``; sealing the store leaves every array exactly as
    long as its table's rows, so plain Zarr and xarray readers see exactly the rows
    written."""
    _events_flushed_one_by_one(store, 3)
    assert open_run(store).table("clusters/c1/scheduler", "events").msg.tolist() == [
        "m0",
        "m1",
        "m2",
    ]
    finalize(store)
    root = zarr.open_group(store, mode="a")
    for path, member in walk(root):
        if isinstance(member, zarr.Group) and "rows" in member.attrs:
            shapes = {a.shape[0] for _, a in member.arrays()}
            assert shapes <= {member.attrs["rows"]}, path
    tree = xr.open_datatree(store, engine="zarr", consolidated=False)
    assert tree["clusters/c1/scheduler/events"].sizes["event"] == 3
    assert validate_store(store) == []
    # a writer killed mid-append in a finished run leaves a tail past ``rows``: not a fault
    events = root["clusters/c1/scheduler/events"]
    events["msg"].resize((5,))
    assert validate_store(store) == []
    # but a commit point past the data is
    events.update_attributes({"rows": 6})
    assert any("rows attribute 6 exceeds" in p for p in validate_store(store))


def test_sealing_writes_what_zarr_consolidate_metadata_writes(store, tmp_path):
    """The seal builds the consolidated metadata from the nodes it read once and writes
    the root with it and the final attributes in one write: the root's ``zarr.json`` is
    what ``zarr.consolidate_metadata`` makes of the same store, and xarray opens the run
    through it."""
    import json
    import shutil
    import warnings

    w = _events_flushed_one_by_one(store, 2)
    w.group("worker", cluster="c1", worker="w-1").flush()
    finalize(store, status="complete")
    copy = str(tmp_path / "copy.zarr")
    shutil.copytree(store, copy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # consolidated metadata is not in the v3 spec yet
        zarr.consolidate_metadata(copy, zarr_format=3)
    with open(f"{store}/zarr.json") as ours, open(f"{copy}/zarr.json") as zarrs:
        sealed, expected = json.load(ours), json.load(zarrs)
    assert sealed == expected
    assert sealed["attributes"]["status"] == "complete"
    assert "clusters/c1/scheduler/events/time" in sealed["consolidated_metadata"]["metadata"]
    tree = xr.open_datatree(store, engine="zarr", consolidated=True)
    assert tree["clusters/c1/scheduler/events"].sizes["event"] == 2


def test_a_store_at_an_fsspec_url_is_sealed_through_the_store_api():
    """A writer of a store at an fsspec URL appends its flushes to streams in a spool of its
    process, and seals its groups from there into the store at its end, through Zarr's
    store API (no rename); finalize reads the nodes and writes the seal through it too: a
    run at an fsspec URL is cut to its rows and consolidated like a directory."""
    import warnings

    from metacollect.store.local import GATHERED_ATTR, LOCAL_ATTR
    from metacollect.store.seal import read_nodes, seal_own

    url = "memory://metacollect-test/sealed.zarr"
    w = StoreWriter(url)
    init_root(w, "r1")
    g = w.group("scheduler", cluster="c1")
    for i in range(3):  # three flushes: three batches of one stream
        g.append("events", {"time": [float(i)], "topic": ["t"], "msg": [f"m{i}"]})
        g.flush()
    assert os.listdir(w.spool) == ["clusters"]  # the rows are in the spool until the seal
    assert "events" not in w.root["clusters/c1/scheduler"]
    assert w.root["clusters/c1/scheduler"].attrs[LOCAL_ATTR].endswith(f":{w.spool}")
    seal_own(w)  # as the process's end does
    assert not os.path.exists(w.spool)
    assert finalize(url, status="complete") == ("complete", [])
    root = zarr.open_group(url, mode="r", use_consolidated=False)
    nodes = read_nodes(root)
    assert nodes["clusters/c1/scheduler/events/msg"]["shape"] == [3]
    assert nodes["clusters/c1/scheduler"]["attributes"]["level"] == "scheduler"
    assert nodes["clusters/c1/scheduler"]["attributes"][GATHERED_ATTR] is not None
    with warnings.catch_warnings():
        # consolidated metadata is not in the v3 spec yet: Zarr warns on reading it
        warnings.simplefilter("ignore")
        sealed = zarr.open_consolidated(url)
    assert sealed.attrs["status"] == "complete"
    assert sealed["clusters/c1/scheduler/events/msg"].shape == (3,)
    assert open_run(url).table("clusters/c1/scheduler", "events").msg.tolist() == [
        "m0",
        "m1",
        "m2",
    ]


def test_an_array_cut_short_while_made_is_left_out_of_the_sealed_store(store):
    """A process killed while it makes a table's arrays leaves an array directory without
    ``zarr.json`` (only Zarr's temp file). Sealing reads the nodes that
    exist and lists only those; validation and reading take the store as whole."""
    import json
    import os

    _events_flushed_one_by_one(store, 2)
    cut = os.path.join(store, "clusters/c1/scheduler/events/extra")
    os.makedirs(cut)
    with open(os.path.join(cut, "zarr.0123abcd.partial"), "wb") as f:
        f.write(b'{"shape": [')
    finalize(store, status="complete")
    with open(f"{store}/zarr.json") as f:
        listed = json.load(f)["consolidated_metadata"]["metadata"]
    assert "clusters/c1/scheduler/events/time" in listed
    assert not any(p.endswith("events/extra") for p in listed)
    # the table was written anew: the temp file is gone (an empty directory is harmless)
    assert not os.path.exists(cut) or not os.listdir(cut)
    assert validate_store(store) == []
    assert open_run(store).table("clusters/c1/scheduler", "events").msg.tolist() == [
        "m0",
        "m1",
    ]


def test_a_failed_stream_creation_is_made_again_by_the_next_flush(store, monkeypatch):
    """A stream file whose making failed is not kept, so the next flush makes it again and
    writes the rows it kept."""
    from metacollect.store import streams

    real_open = streams.TableStream._open
    outage = {"left": 1}

    def fail_once(self):
        if outage["left"]:
            outage["left"] -= 1
            raise OSError("out of inodes making the stream")
        return real_open(self)

    monkeypatch.setattr(streams.TableStream, "_open", fail_once)
    w = StoreWriter(store)
    init_root(w, "r")
    g = w.group("scheduler", cluster="c1")
    g.append("events", {"time": [1.0], "topic": ["a"], "msg": ["m1"]})
    assert g.flush() == 0 and g.tables["events"].pending == 1
    assert g.flush() > 0
    run = open_run(store)
    assert run.table("clusters/c1/scheduler", "events").msg.tolist() == ["m1"]
    assert "making the stream" in run.table("clusters/c1/scheduler", "errors").what[0]


def test_sealing_a_store_without_consolidated_metadata_writes_the_attributes(store, monkeypatch):
    """A store kind that does not hold consolidated metadata (zarr's
    ``consolidate_metadata`` refuses those) is still sealed: status and index land."""
    import json

    from zarr.storage import LocalStore

    _events_flushed_one_by_one(store, 1)
    monkeypatch.setattr(LocalStore, "supports_consolidated_metadata", property(lambda self: False))
    finalize(store, status="complete")
    with open(f"{store}/zarr.json") as f:
        root = json.load(f)
    assert root["attributes"]["status"] == "complete" and root["attributes"]["levels"]
    assert root.get("consolidated_metadata") is None
    assert open_run(store).table("clusters/c1/scheduler", "events").msg.tolist() == ["m0"]


def test_table_created_by_a_failed_flush_is_opened_and_the_report_always_lands(store, monkeypatch):
    """An outage that ends in the middle of a flush can leave a new table's stream made but
    not written: the next flush writes it rather than failing forever. And a table that
    keeps failing does not keep the group's report of it out of the store: the errors
    table is written by itself."""
    from metacollect.store import streams

    w = StoreWriter(store)
    init_root(w, "r")
    g = w.group("scheduler", cluster="c1")
    real_open = streams.TableStream._open
    outage = {"creates": 1}

    def make_then_fail(self):
        real_open(self)
        if outage["creates"]:
            outage["creates"] -= 1
            raise OSError("storage went away after making the stream")

    monkeypatch.setattr(streams.TableStream, "_open", make_then_fail)
    g.append("events", {"time": [1.0], "topic": ["a"], "msg": ["m1"]})
    assert g.flush() == 0
    assert g.flush() > 0
    run = open_run(store)
    assert run.table("clusters/c1/scheduler", "events").time.tolist() == [1.0]
    assert "went away" in run.table("clusters/c1/scheduler", "errors").what[0]

    broken = {"on": True}
    _broken_stream(monkeypatch, "events", broken, half=False)
    g.append("events", {"time": [2.0], "topic": ["b"], "msg": ["m2"]})
    assert g.flush() == 0 and g.flush() == 0
    run = open_run(store)
    assert run.table("clusters/c1/scheduler", "events").time.tolist() == [1.0]
    errors = run.table("clusters/c1/scheduler", "errors")
    assert [w.split(":")[0] for w in errors.what] == ["OSError", "OSError"]
    assert "disk full" in errors.what[1] and errors["where"].tolist()[1] == "flush"
    assert g.tables["events"].pending == 1  # kept for when the disk is mended
    broken["on"] = False
    assert g.flush() > 0
    run = open_run(store)
    assert run.table("clusters/c1/scheduler", "events").time.tolist() == [1.0, 2.0]
    assert len(run.table("clusters/c1/scheduler", "errors")) == 2


def test_strings_through_a_restarted_dictionary_and_distinct_rows(store):
    """A column's strings read back as written across a restart of its stream's
    dictionary, live and sealed, and ``distinct`` keeps one row per distinct value."""
    with dask.config.set({"metacollect.strings.cache-size": 3000}):
        w = StoreWriter(store)
        init_root(w, "r")
        g = w.group("scheduler", cluster="c1")
    n = 4000
    topics = ["a", "b", None, "a"] * (n // 4)
    for half in (slice(0, n // 2), slice(n // 2, n)):  # the dictionary restarts in between
        g.append(
            "events",
            {
                "time": np.arange(n, dtype=float)[half],
                "topic": topics[half],
                "msg": [f"m{i}" for i in range(n)][half],
            },
        )
        g.append("transitions", {"key": [f"k{i}" for i in range(n)][half]})
        g.flush()
    path = "clusters/c1/scheduler"
    for sealed in (False, True):
        if sealed:
            finalize(store)
        run = open_run(store)
        assert run.table(path, "events").topic.tolist() == topics
        assert run.table(path, "transitions").key.tolist() == [f"k{i}" for i in range(n)]
        seen = run.table(path, "events", columns=["topic"], distinct=True)
        assert sorted(seen.drop_duplicates().topic, key=str) == [None, "a", "b"]


def test_a_live_stores_tables_are_opened_as_they_are_now(store):
    """A store not sealed yet changes under its reader: its tables are opened from the store
    at each read, not from the metadata read when it was opened (a table made since is read,
    with the rows appended since)."""
    w = StoreWriter(store)  # the tables change in their streams
    init_root(w, "r")
    g = w.group("scheduler", cluster="c1")
    g.append("events", {"time": [1.0], "topic": ["a"], "msg": ["m"]})
    g.flush()
    run = open_run_unfinalized(store)
    path = "clusters/c1/scheduler"
    assert run.groups and run._open.docs is None
    assert run.committed(path, "transitions") is None
    g.append("events", {"time": [2.0], "topic": ["b"], "msg": ["n"]})
    g.append("transitions", {"key": ["k0"], "start": ["released"], "finish": ["waiting"]})
    g.flush()
    assert run.table(path, "events").topic.tolist() == ["a", "b"]
    assert run.table(path, "transitions").key.tolist() == ["k0"]


def test_a_burst_is_flushed_in_slices_in_order(store, monkeypatch):
    """A flush encodes at most FLUSH_ROWS rows of a table at a time (a chunk that straddles
    the limit is split), and the slices land whole and in order, each code with its string."""
    import metacollect.store.writer as writer

    monkeypatch.setattr(writer, "FLUSH_ROWS", 1000)
    w = StoreWriter(store)
    g = w.group("scheduler", cluster="c1")
    sizes = [700, 2500, 1, 1300]  # chunks below, across and exactly at slice edges
    keys = [f"k{i}" for i in range(sum(sizes))]
    lo = 0
    for n in sizes:
        g.append(
            "transitions",
            {
                "key": keys[lo : lo + n],
                "time": np.arange(lo, lo + n, dtype=float),
                "start": ["waiting"] * n,
            },
        )
        lo += n
    taken = []
    real = g._write

    def spy(tables):
        taken.append(sum(n for n, _ in tables["transitions"]))
        return real(tables)

    monkeypatch.setattr(g, "_write", spy)  # this group only, as below
    assert g.flush() == len(keys)
    assert taken == [1000, 1000, 1000, 1000, 501]
    t = open_run_unfinalized(store).table("clusters/c1/scheduler", "transitions")
    assert t.key.tolist() == keys and t.time.tolist() == list(range(len(keys)))
    assert set(t.start) == {"waiting"}


def test_a_flush_writes_the_rows_pending_when_it_started(store, monkeypatch):
    """Rows appended while a flush runs (the event loop does not wait for it) are left for
    the next flush: a flush ends however fast rows keep coming."""
    import metacollect.store.writer as writer

    monkeypatch.setattr(writer, "FLUSH_ROWS", 10)
    w = StoreWriter(store)
    g = w.group("scheduler", cluster="c1")
    row = {"time": [0.0], "topic": ["t"], "msg": ["m"]}
    for _ in range(25):
        g.append("events", row)
    real = g._write

    def busy_loop(tables):  # every slice written, two more rows arrive
        g.append("events", row)
        g.append("events", row)
        return real(tables)

    # on this group only: a flusher another test left running must not append to it
    monkeypatch.setattr(g, "_write", busy_loop)
    assert g.flush() == 25
    assert g.tables["events"].pending == 6  # three slices, two rows each meanwhile
    monkeypatch.setattr(g, "_write", real)
    assert g.flush() == 6
    events = open_run_unfinalized(store).table("clusters/c1/scheduler", "events")
    assert len(events) == 31


def test_slow_flushes_come_less_often_within_the_budget():
    """The next flush starts ``flush-interval`` after the last began, or later when that
    flush took more than the budget's share - up to six intervals, since rows wait in
    memory for it."""
    from metacollect.store.flush import next_tick

    assert next_tick(0.05, interval=5.0, budget=0.02) == 5.0  # a quick flush: on time
    assert next_tick(0.4, interval=5.0, budget=0.02) == pytest.approx(20.0)
    assert next_tick(0.4, interval=5.0, budget=1.0) == 5.0  # budget 1: a fixed interval
    for spent in (0.01, 0.1, 0.5):
        assert spent / next_tick(spent, 5.0, 0.02) <= 0.02 + 1e-12
    # a very slow flush (a burst of a million rows): rows must not wait for minutes
    assert next_tick(10.0, interval=5.0, budget=0.02) == 30.0


def test_flusher_writes_on_its_interval_until_closed():
    """The flush thread takes the rows and writes them on its interval; closing writes
    what is left and stops the ticks."""
    import asyncio

    from metacollect.store.flush import PeriodicFlusher, take

    rows: list[int] = []
    written: list[list[int]] = []

    async def main():
        flusher = PeriodicFlusher(
            lambda: take(rows),
            written.append,
            0.02,
            lambda where, e: None,
            "test-flush",
            budget=0.5,
        )
        flusher.start()
        for i in range(6):
            rows.append(i)
            await asyncio.sleep(0.05)
        await flusher.close()
        rows.append(99)
        await asyncio.sleep(0.1)  # no tick after close

    asyncio.run(main())
    assert [r for batch in written for r in batch] == [0, 1, 2, 3, 4, 5]
    # written along the way, not only at close
    assert len([b for b in written if b]) >= 2


def test_a_flush_gives_the_memory_it_freed_back_to_the_os():
    """A flush's temporaries are freed in malloc's heap, which glibc keeps (a few blocks
    still in use pin the pages between them): the flusher gives the free pages back after
    each flush, or a worker's RSS - Dask's measure of its memory - would keep them. Here
    ~190 MB stays without it."""
    import os

    from metacollect.store.flush import PeriodicFlusher, _malloc_trim

    if _malloc_trim() is None:
        pytest.skip("this C library has no malloc_trim (not glibc)")

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    kept: list[bytes] = []

    def write(batch: object) -> None:
        blocks = [bytes(2000) for _ in range(100_000)]  # malloc's, not Python's arenas
        kept.extend(blocks[::50])  # the survivors a flush leaves (its caches, its rows)

    flusher = PeriodicFlusher(lambda: None, write, 60.0, lambda where, e: None, "test-flush")
    before = rss_mb()
    flusher.flush_now()
    assert len(kept) == 2000
    assert rss_mb() - before < 50


def test_finding_malloc_trim_starts_no_process(monkeypatch):
    """Every worker and scheduler looks up ``malloc_trim`` at its first flush: among the
    symbols it has loaded, never by running ``ldconfig`` (a fork from a process that may
    hold RDMA memory registrations, where a fork is what the network's libraries warn
    against)."""
    import platform
    import subprocess

    from metacollect.store import flush

    started: list[object] = []

    def no_process(*args: object, **kwargs: object) -> None:
        started.append(args)
        raise OSError("no process may be started here")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    flush._malloc_trim.cache_clear()
    try:
        trim = flush._malloc_trim()
    finally:
        flush._malloc_trim.cache_clear()
    assert started == []
    if platform.libc_ver()[0] == "glibc":
        assert trim is not None


def test_flusher_writes_while_the_event_loop_is_held():
    """One event-loop step can last a minute (a million-task graph submitted): the flush
    thread ticks by itself, so the rows of that step are written while it runs, not all
    kept in memory (and lost to a kill) until it ends."""
    import asyncio
    import time

    from metacollect.store.flush import PeriodicFlusher, take

    rows: list[int] = []
    written: list[list[int]] = []

    async def main():
        flusher = PeriodicFlusher(
            lambda: take(rows),
            written.append,
            0.05,
            lambda where, e: None,
            "test-flush",
        )
        flusher.start()
        end = time.monotonic() + 0.6
        i = 0
        while time.monotonic() < end:  # no await: the event loop is held all along
            rows.append(i)
            i += 1
            time.sleep(0.001)
        during = [r for batch in written for r in batch]
        await flusher.close()
        return during, i

    during, n = asyncio.run(main())
    assert len(during) > n // 2, (len(during), n)
    assert [r for batch in written for r in batch] == list(range(n))


def test_flusher_thread_stretches_its_interval_and_survives_a_failing_swap():
    """The thread applies the flush budget, capped at MAX_STRETCH intervals, to the flushes
    it times itself; a swap that fails is reported and the next tick takes the rows."""
    import time

    from metacollect.store.flush import MAX_STRETCH, PeriodicFlusher, take

    rows = [1, 2]
    written: list[list[int]] = []
    errors: list[str] = []
    swaps = {"n": 0}

    def swap():
        swaps["n"] += 1
        if swaps["n"] == 1:
            raise RuntimeError("swap broke once")
        return take(rows)

    def slow_write(batch):
        written.append(batch)
        time.sleep(0.1)  # / budget 0.5 = 0.2 s, capped at 6 x 0.02 s

    flusher = PeriodicFlusher(
        swap, slow_write, 0.02, lambda where, e: errors.append(where), "t", budget=0.5
    )
    flusher.start()
    time.sleep(0.5)
    by_the_thread = [r for batch in written for r in batch]
    flusher.flush_now()
    assert errors == ["swap"]
    assert by_the_thread == [1, 2]  # the ticks went on after the failed swap
    assert flusher.longest == pytest.approx(MAX_STRETCH * 0.02)


def test_one_slow_flush_does_not_stretch_the_interval():
    """The first flush makes the arrays and is slow once: the interval stretches only when
    flushes are slow twice in a row, so a kill then still loses at most one interval."""
    import time

    from metacollect.store.flush import PeriodicFlusher

    writes: list[float] = []

    def write(batch):
        writes.append(time.monotonic())
        if len(writes) == 1:
            time.sleep(0.1)  # / budget 0.5 = 0.2 s: ten intervals, if it counted

    flusher = PeriodicFlusher(lambda: [], write, 0.02, lambda where, e: None, "t", budget=0.5)
    flusher.start()
    time.sleep(0.5)
    flusher.flush_now()
    assert flusher.longest == 0.02
    assert len(writes) > 8


def test_each_flush_hands_its_own_row_to_the_next_and_the_last_its_own_at_once():
    """A flush's own row (when it began, its wall and CPU time, the rows its write said it
    wrote) goes to ``log`` at the start of the next flush, so that flush writes it; the last
    one's right after it, marked final. A ``log`` that fails is recorded and costs only
    those rows: the flushes and their totals go on."""
    from metacollect.store.flush import FLUSH_COLUMNS, PeriodicFlusher

    written = iter([5, None, 7, 9])
    logged: list[tuple[list[float], bool]] = []
    errors: list[str] = []
    during: list[int] = []  # how many flushes log had heard of as each write ran

    def log(rows, final):
        assert list(rows) == list(FLUSH_COLUMNS)
        if len(logged) == 2:
            logged.append(([], final))
            raise OSError("the store's filesystem is full")
        logged.append((rows["rows"], final))

    def write(batch):
        during.append(sum(len(r) for r, _ in logged))
        return next(written)

    flusher = PeriodicFlusher(lambda: [], write, 60.0, lambda w, e: errors.append(w), "t", log=log)
    for _ in range(3):
        with flusher._lock:
            flusher._flush()
    flusher.flush_now()
    assert during == [0, 1, 2, 2]  # each write came after the rows before it were logged
    # a write that did not say how many rows: -1; the third flush's row lost, and said
    assert logged == [([5], False), ([-1], False), ([], False), ([9], True)]
    assert errors == ["flush record"]
    assert flusher.cost()["flushes"] == 4


def test_take_rows_keeps_columns_aligned_while_a_thread_appends():
    """A hook appends a row column by column (the last column last) in one thread while
    the flush thread takes rows: every row taken is whole, none is lost or repeated."""
    import array
    import sys
    import threading

    from metacollect.store.flush import take_rows

    columns = ([], [], array.array("d"))
    add_a, add_b, add_t = (c.append for c in columns)
    n = 200_000
    done = threading.Event()

    def hook() -> None:
        for i in range(n):
            add_a(i)
            add_b(-i)
            add_t(float(i))
        done.set()

    taken: list[tuple] = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows
    try:
        t = threading.Thread(target=hook)
        t.start()
        while not done.is_set():
            taken.append(take_rows(columns))
        t.join()
    finally:
        sys.setswitchinterval(switch)
    taken.append(take_rows(columns))
    assert sum(1 for a, _, _ in taken if a) > 2  # taken while the hook was appending
    a = [v for part in taken for v in part[0]]
    b = [v for part in taken for v in part[1]]
    times = [v for part in taken for v in part[2]]
    assert a == list(range(n))
    assert b == [-i for i in range(n)]
    assert times == [float(i) for i in range(n)]
    assert all(len(c) == 0 for c in columns)


def test_a_collector_failing_on_every_call_writes_its_first_failures_and_counts_the_rest(store):
    """A hook that fails on every transition records the first ``limit`` failures of its
    place in full and then, at each flush, how many more there were: never a million rows,
    never silence."""
    from metacollect.steps.base import ErrorRecorder

    w = StoreWriter(store)
    g = w.group("scheduler", cluster="c1")
    errors = ErrorRecorder(lambda: g, "scheduler", limit=3)
    for i in range(10):
        errors("transition", KeyError(f"k{i}"))
    errors("sample", RuntimeError("once"))
    errors.report_counts()
    g.flush()
    for _ in range(5):
        errors("transition", KeyError("later"))
    errors.report_counts()
    errors.report_counts()  # nothing new: nothing written
    g.flush()
    rows = open_run_unfinalized(store).table("clusters/c1/scheduler", "errors")
    whats = rows.what.tolist()
    assert rows["where"].tolist().count("scheduler.transition") == 5
    assert whats[:3] == ["KeyError: 'k0'", "KeyError: 'k1'", "KeyError: 'k2'"]
    assert "RuntimeError: once" in whats
    assert [w for w in whats if "more times" in w] == [
        "failed 7 more times, not recorded one by one (only the first 3 failures of a place "
        "are written in full)",
        "failed 5 more times, not recorded one by one (only the first 3 failures of a place "
        "are written in full)",
    ]
