"""The seal of a store whose flushes are Arrow streams: each table written once, in Zarr.

A writer of a store on a filesystem appends each flush to one stream a table
(``<group>/.streams/<table>.<n>.arrows``, :mod:`metacollect.store.streams`); the seal writes
each group's streams as its sealed tables and removes them. These tests cut a seal short
and run it again, tear a stream, flush during the seal, and compare what the seal writes
with what zarr-python writes, and append the streams of a writer into a sealed store.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from typing import Any

import numpy as np
import pytest
import xarray as xr
import zarr

from metacollect import open_run
from metacollect.check.doctor import salvage
from metacollect.check.validate import validate_store
from metacollect.session.end import finalize
from metacollect.store import seal as seal_mod
from metacollect.store import streams
from metacollect.store.writer import GroupWriter, StoreWriter
from tests.test_streams import GROUP, _flush_events, _run


def _files(root: str) -> set[str]:
    return {
        os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files
    }


def _cut_last_flush(path: str, before: int) -> None:
    """Cut the stream at ``path`` half-way through the bytes written after ``before``, as
    a process killed while writing its last flush leaves it."""
    with open(path, "r+b") as f:
        f.truncate(before + (os.path.getsize(path) - before) // 2)


def test_the_seal_makes_again_a_group_whose_metadata_was_lost(store):
    """The seal writes a group's tables without making a writer of the group (it is there:
    its streams are in it); a group whose ``zarr.json`` went missing is made again, so its
    tables are part of the sealed store, not files below a directory no reader opens."""
    _, g = _run(store)
    _flush_events(g, 0, 10)
    expected = open_run(store).table(GROUP, "events")
    os.remove(os.path.join(store, *GROUP.split("/"), "zarr.json"))
    assert finalize(store) == ("complete", [])
    assert open_run(store).table(GROUP, "events").equals(expected)
    assert xr.open_datatree(store, engine="zarr")[f"{GROUP}/events"].ds.sizes["event"] == 10
    assert validate_store(store) == []


def test_a_torn_last_flush_is_skipped_reported_and_the_rows_before_survive(store):
    _, g = _run(store)
    for i in range(3):
        if i == 2:
            (path,) = streams.table_files(store, GROUP)["events"]
            before = os.path.getsize(path)
        _flush_events(g, 10 * i, 10)
    _cut_last_flush(path, before)
    name = os.path.basename(path)
    run = open_run(store)
    assert run.table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(20)]
    problems = validate_store(store)
    assert any(f"stream {name} is torn" in p for p in problems), problems
    # a writer that starts the group again writes a stream of its own, read after it
    w2 = StoreWriter(store)
    g2 = w2.group("scheduler", cluster="c1")
    _flush_events(g2, 1000, 5)
    assert streams.table_files(store, GROUP)["events"][0] == path
    assert len(streams.table_files(store, GROUP)["events"]) == 2
    events = open_run(store).table(GROUP, "events")
    assert events.msg.tolist() == [f"m{i}" for i in range(20)] + [
        f"m{i}" for i in range(1000, 1005)
    ]
    assert events.topic.tolist()[-5:] == [f"topic-{i % 7}" for i in range(1000, 1005)]
    # a salvage of the unsealed store keeps those rows and notes the torn stream
    report = salvage(store, store + "-salvaged")
    assert any(f"{name} is torn" in n for n in report.notes)
    assert open_run(store + "-salvaged").table(GROUP, "events").msg.tolist()[-5:] == [
        f"m{i}" for i in range(1000, 1005)
    ]
    status, missing = finalize(store, "complete")
    assert status == "incomplete"
    assert any(f"{name} is torn" in m for m in missing)
    assert open_run(store).table(GROUP, "events").msg.tolist() == events.msg.tolist()
    assert validate_store(store) == []


@pytest.mark.parametrize("when", ["before-the-read", "after-the-read"])
@pytest.mark.parametrize("before", ["placeholder", "flushed-nothing"])
def test_a_workers_only_flush_during_the_seal_is_named(store, monkeypatch, before, when):
    """A worker SIGTERMed with the run (a batch job's end) may write its only flush, and
    then its end, while the run's seal runs. Its group had no stream when the seal read
    the store (a node-local worker's placeholder, which its gather fills at its end, or a
    group that flushed nothing yet). Its end alone passes the check of unended workers;
    the flush is written into new streams, and the seal names it. When the flush and the
    end land after the seal has read the store's nodes, the worker is named for its late
    flush only: it was also named as one that never took its final flush, which it did."""
    from metacollect.session import end

    w, g = _run(store)
    _flush_events(g, 0, 10)
    attrs = {
        "address": "tcp://h:2",
        "name": "w1",
        "host": "h",
        "pid": 2,
        "nthreads": 1,
        "memory_limit": None,
        "started": 1.0,
        "ended": None,
        "profile_interval": 0.01,
    }
    if before == "placeholder":
        spec = w.schema.groups["worker"]
        w.ensure_group(spec.format(cluster="c1", worker="w1"), spec, attrs)
        made: list[GroupWriter] = []
    else:  # the group exists, its writer flushed nothing: no stream
        made = [w.group("worker", attrs=attrs, cluster="c1", worker="w1")]
        made[0].flush()
        assert streams.table_files(store, "clusters/c1/workers/w1") == {}
    real_read_nodes = end.read_nodes
    flushed: list[int] = []

    def a_final_flush_after_the_seal(*args, **kwargs):
        read = real_read_nodes(*args, **kwargs) if when == "after-the-read" else None
        if not flushed:
            worker = (
                made[0] if made else StoreWriter(store).group("worker", cluster="c1", worker="w1")
            )
            worker.append(
                "tasks",
                {
                    "key": [f"t-{i}" for i in range(5)],
                    "state": ["memory"] * 5,
                    "thread": [1] * 5,
                    "start": [1.0] * 5,
                    "stop": [2.0] * 5,
                    "nbytes": [8] * 5,
                    "typename": ["int"] * 5,
                    "clock_delay": [0.0] * 5,
                },
            )
            flushed.append(worker.flush())
            worker.set_attrs(ended=time.time(), terminated="SIGTERM")
        return real_read_nodes(*args, **kwargs) if read is None else read

    monkeypatch.setattr(end, "read_nodes", a_final_flush_after_the_seal)
    status, missing = finalize(store, "complete")
    assert flushed == [5] and status == "incomplete"
    (line,) = missing
    assert line.startswith("clusters/c1/workers/w1: a flush ended while the store was being")
    assert any("1 stream(s) left in a sealed store" in p for p in validate_store(store))


def test_streams_of_a_group_the_schema_does_not_know_are_named_once(store):
    """Streams the seal cannot place (a group of another metacollect version) stay where
    they are; the run says their rows are missing, once, and not as a late flush."""
    _, g = _run(store)
    _flush_events(g, 0, 10)
    alien = streams.directory(store, "clusters/c1/not-a-group")
    os.makedirs(alien)
    shutil.copy(streams.table_files(store, GROUP)["events"][0], alien)
    status, missing = finalize(store, "complete")
    assert status == "incomplete"
    assert missing == ["clusters/c1/not-a-group: streams of no group of this version's schema"]
    assert streams.table_files(store, "clusters/c1/not-a-group")
    assert open_run(store).table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(10)]


def test_validate_of_a_live_store_waits_for_the_flush_being_written(store, monkeypatch):
    """A flush's batch reads short until its one write ends: ``validate`` on a live store
    must not call its stream torn. Here the write is slowed down the way a stalled
    filesystem would: half the batch, then the rest once validate has read the group.
    Validate reads the stream again after SETTLE and finds it whole; a stream begun during
    that wait is a flush under way and is left out; one still short after the wait is
    torn."""
    _, g = _run(store)
    _flush_events(g, 0, 10)
    (path,) = streams.table_files(store, GROUP)["events"]
    before = os.path.getsize(path)
    _flush_events(g, 10, 10)
    with open(path, "rb") as f:
        whole = f.read()
    half = before + (len(whole) - before) // 2
    with open(path, "wb") as f:  # the flush's write, half done
        f.write(whole[:half])
    begun = os.path.join(os.path.dirname(path), f"events.{time.time_ns() // 1000 + 1}.arrows")
    waits: list[float] = []
    sleep = time.sleep

    def write_lands_meanwhile(seconds: float) -> None:
        if not waits:  # the rest of the write lands; a new stream begins, short
            with open(path, "ab") as f:
                f.write(whole[half:])
            with open(begun, "wb") as f:
                f.write(whole[:100])
        waits.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", write_lands_meanwhile)
    assert validate_store(store) == []
    assert waits == [streams.SETTLE]  # validate saw the stream torn, and waited once
    assert open_run(store).table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(20)]
    # a stream short before and after the wait is torn (a writer killed mid-write)
    problems = validate_store(store)
    torn = [p for p in problems if "torn" in p]
    assert len(torn) == 1, problems
    assert torn[0].startswith(f"{GROUP}: stream {os.path.basename(begun)} is torn (")


def test_a_seal_cut_short_and_run_again_writes_nothing_twice(store, monkeypatch):
    """The seal writes each table whose rows are all in streams once, in its sealed form,
    naming the stream batches it holds. A seal killed after one table was written, and run
    again, takes the table written through the append path (it is in Zarr now), which
    appends none of its batches again, and writes the other once; readers meanwhile read
    each row once."""
    from metacollect.store import tablewrite

    _, g = _run(store)
    for f in range(4):
        _flush_events(g, 10 * f, 10)
    real = tablewrite._TableSink.finish
    first: dict[str, asyncio.Future] = {}

    async def die_after_the_first(self):
        # the first table is written whole; the other's arrays are stored, not its
        # zarr.json: killed there, it is a directory no reader counts
        if not first:
            first["table"] = asyncio.ensure_future(real(self))
            return await first["table"]
        await first["table"]
        raise RuntimeError("killed mid-seal")

    monkeypatch.setattr(tablewrite._TableSink, "finish", die_after_the_first)
    with pytest.raises(RuntimeError, match="killed mid-seal"):
        seal_mod.fold_streams(store)
    monkeypatch.setattr(tablewrite._TableSink, "finish", real)
    tables = {
        t for t in ("events", "transitions") if os.path.exists(f"{store}/{GROUP}/{t}/zarr.json")
    }
    assert len(tables) == 1  # one written, the other not
    assert streams.table_files(store, GROUP)  # the streams are all still there
    mid = open_run(store)  # readers see every row once in the meantime
    assert mid.table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(40)]
    assert len(mid.transitions()) == 40
    real_append, appended = seal_mod._append_table, []

    def append(root, group, tspec, found, upto, attrs):
        appended.append((group, tspec.name))
        return real_append(root, group, tspec, found, upto, attrs)

    monkeypatch.setattr(seal_mod, "_append_table", append)
    assert finalize(store) == ("complete", [])
    run = open_run(store)
    assert run.table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(40)]
    assert run.transitions().key.tolist() == [str(("x", i)) for i in range(40)]
    assert appended == [(GROUP, tables.pop())]  # the append path, for that table only
    assert not os.path.exists(streams.directory(store, GROUP))
    assert validate_store(store) == []


def test_a_long_groups_seal_goes_a_batch_at_a_time_through_restarted_dictionaries(
    store, monkeypatch
):
    """The seal goes through a group's streams a batch at a time, in order: a writer's
    dictionary of a column restarts every ``cache-size`` strings (a replacement dictionary
    in the stream), and the rows read back never mix strings of two dictionaries. With a
    cache of 1,000, 40 flushes of 500 transitions (40,000 distinct keys and stimulus ids)
    are sealed in several blocks of chunks, holding one batch at a time. Blank strings
    among them (an empty topic beside a missing one) make the seal look at which column
    holds which before writing."""
    import dask.config

    from metacollect.store import layout

    monkeypatch.setattr(layout, "COMPACT_ROWS", 1000)  # chunks of 1,000, blocks of 4,000
    alive: list[int] = []
    most = [0]
    real_columns = streams.sealed_columns

    class _Part(dict):
        def __del__(self) -> None:
            alive.pop()

    def counted(batch, spec):
        alive.append(1)
        most[0] = max(most[0], len(alive))
        return _Part(real_columns(batch, spec))

    keys, stimuli, workers, topics = [], [], [], []
    with dask.config.set({"metacollect.strings.cache-size": 1000}):
        _, g = _run(store)
        for f in range(40):
            ids = range(500 * f, 500 * (f + 1))
            batch = {
                "key": [("inc", i) for i in ids],
                "start": ["processing"] * 500,
                "finish": ["memory"] * 500,
                "time": np.arange(500 * f, 500 * (f + 1), dtype=float),
                "stimulus_id": [f"task-finished-{i}" for i in ids],
                "worker": [None if i % 3 else f"tcp://10.0.0.{i % 2}:4000" for i in ids],
            }
            g.append("transitions", batch)
            topic = [None, "", f"topic-{f}"]
            g.append("events", {"time": np.arange(3.0), "topic": topic, "msg": ["a", "b", "c"]})
            assert g.flush() == 503
            keys += [str(k) for k in batch["key"]]
            stimuli += batch["stimulus_id"]
            workers += batch["worker"]
            topics += topic
        g.close_streams()
        monkeypatch.setattr(streams, "sealed_columns", counted)
        finalize(store)
        monkeypatch.setattr(streams, "sealed_columns", real_columns)

    # the batches read are let go of as the next come: a few alive at once, not 40
    assert 0 < most[0] <= 4, most[0]
    run = open_run(store)
    transitions = run.transitions()
    assert transitions.key.tolist() == keys
    assert transitions.stimulus_id.tolist() == stimuli
    assert transitions.worker.tolist() == workers
    assert run.table(GROUP, "events").topic.tolist() == topics
    chunks = [f for f in os.listdir(f"{store}/{GROUP}/transitions/key") if f != "zarr.json"]
    assert len(chunks) == 20  # 20,000 rows in chunks of 1,000
    assert validate_store(store) == []


def test_the_append_path_takes_a_few_batches_at_a_time(store, monkeypatch):
    """A writer into a sealed store (``metacollect ingest``) writes streams; the seal after
    it appends them to the sealed arrays (zarr's ``Array.append``) a few batches at a time,
    each append committed with the batches it holds: a many-hour run's streams are never
    read all at once where the seal runs. Six flushes, appended two at a time, leave every
    row, in order, through several commits."""
    from metacollect.store.lifecycle import consolidate

    _, g = _run(store)
    _flush_events(g, 0, 10)
    finalize(store)
    g = StoreWriter(store).group("scheduler", cluster="c1")
    for f in range(1, 7):
        _flush_events(g, 10 * f, 10)
    g.close_streams()
    monkeypatch.setattr(seal_mod, "FOLD_ROWS", 20)
    commits: list[tuple[str, int, list[int]]] = []
    real = zarr.Group.update_attributes

    def counted(self, new_attributes):
        if streams.FOLDED in new_attributes:
            held = list(new_attributes[streams.FOLDED].values())
            commits.append((self.basename, new_attributes["rows"], held))
        return real(self, new_attributes)

    monkeypatch.setattr(zarr.Group, "update_attributes", counted)
    consolidate(store)
    assert sorted((t, n) for t, n, _ in commits) == [
        (t, n) for t in ("events", "transitions") for n in (30, 50, 70)
    ]
    assert [held for t, _, held in commits if t == "events"] == [[1, 2], [1, 4], [1, 6]]
    run = open_run(store)
    assert run.table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(70)]
    assert run.transitions().key.tolist() == [str(("x", i)) for i in range(70)]
    assert not os.path.exists(streams.directory(store, GROUP))
    assert validate_store(store) == []


def test_the_seals_own_chunk_files_are_the_bytes_zarr_writes(store, tmp_path):
    """The seal encodes a table's chunks itself and stores each as a plain new file (no
    temporary file and rename): Zarr, given the same metadata and values, writes the same
    bytes, chunk for chunk, the padded last chunk included; and the store reads as Zarr."""
    from zarr.storage import LocalStore, StorePath

    _, g = _run(store)
    n = 2 * 65_536 + 1  # two sealed chunks of 65,537 rows, the last padded by one
    g.append(
        "transitions",
        {
            "key": [("x", i % 50_000) for i in range(n)],
            "start": ["released"] * n,
            "finish": [("waiting", "memory")[i % 2] for i in range(n)],
            "time": np.arange(n, dtype=float),
            "stimulus_id": [f"s{i // 100}" for i in range(n)],
            "worker": [(None, "tcp://w:1")[i % 2] for i in range(n)],
        },
    )
    g.flush()
    finalize(store)
    table = os.path.join(store, *GROUP.split("/"), "transitions")
    assert not [f for f in _files(table) if f.endswith(".partial")]
    again = str(tmp_path / "by-zarr")
    for name in ("key", "start", "finish", "time", "stimulus_id", "worker"):
        with open(os.path.join(table, name, "zarr.json")) as f:
            doc = json.load(f)
        values = zarr.open_array(os.path.join(table, name), mode="r")[:]
        assert len(values) == n and doc["chunk_grid"]["configuration"]["chunk_shape"][0] == 65_537
        by_zarr = zarr.Array(zarr.AsyncArray.from_dict(StorePath(LocalStore(again), name), doc))
        by_zarr[:] = values
        ours = _files(os.path.join(table, name)) - {"zarr.json"}
        assert ours == _files(os.path.join(again, name)) == {"c.0", "c.1"}
        for chunk in ours:
            with (
                open(os.path.join(table, name, chunk), "rb") as a,
                open(os.path.join(again, name, chunk), "rb") as b,
            ):
                assert a.read() == b.read(), f"{name}/{chunk}"
    # chunks lie beside their array's zarr.json: the seal makes no directory for them
    assert not [d for _, dirs, _ in os.walk(store) for d in dirs if d == "c"]
    run = open_run(store).transitions()
    assert run.worker.tolist()[:2] == [None, "tcp://w:1"]
    assert validate_store(store) == []


def test_string_chunks_encoded_from_arrow_read_back_as_zarr_wrote_them(tmp_path):
    """The seal encodes string chunks from Arrow's buffers itself
    (``tablewrite.set_text_rows``): for strings with empty ones, NULs, non-ASCII and long
    ones, a missing value (written as the ``none`` string), dictionary-encoded and plain,
    across a chunk boundary and a last partial chunk, each chunk file is the bytes Zarr
    writes for the same values, and zarr-python and ``xarray.open_datatree`` read back
    exactly those values."""
    import pyarrow as pa
    from zarr.storage import LocalStore, StorePath

    from metacollect.store import tablewrite, zarrio

    texts = ["", "a", "\0", "h\u00e9llo w\u00f6rld \u2713", "x" * 1000, "\0\0", "tcp://w:1"]
    values = [texts[i % len(texts)] if i % 11 else None for i in range(2_101)]
    expected = np.asarray(["\0\0\0" if v is None else v for v in values], dtype=object)
    plain = pa.array(values, pa.string())
    coded = plain.dictionary_encode()

    async def write(root: str, name: str) -> Any:
        arr = await zarrio.new_array(
            StorePath(LocalStore(root), name),
            (len(values),),
            (1_000,),
            str,
            zarrio.codecs("text", 8),
            "",
            {},
            ["row"],
        )
        if name == "zarr":
            arr_sync = zarr.Array(arr)
            await asyncio.to_thread(arr_sync.__setitem__, slice(None), expected)
        else:
            rows = coded if name == "coded" else plain
            # two writes, as the seal's blocks: two whole chunks, then the partial last
            await tablewrite.set_text_rows(
                arr, 0, pa.chunked_array([rows[:700], rows[700:2_000]]), "\0\0\0"
            )
            await tablewrite.set_text_rows(arr, 2_000, pa.chunked_array([rows[2_000:]]), "\0\0\0")
        return arr

    root = str(tmp_path / "s.zarr")
    zarr.open_group(root, mode="w", zarr_format=3)
    for name in ("zarr", "plain", "coded"):
        zarrio.run(write(root, name))
    zarrio.run(zarrio.consolidate(StorePath(LocalStore(root)), {}))  # xarray's one read
    for name in ("plain", "coded"):
        assert _files(os.path.join(root, name)) == _files(os.path.join(root, "zarr"))
        for chunk in ("c.0", "c.1", "c.2"):
            with (
                open(os.path.join(root, name, chunk), "rb") as a,
                open(os.path.join(root, "zarr", chunk), "rb") as b,
            ):
                assert a.read() == b.read(), f"{name}/{chunk}"
        read = zarr.open_array(os.path.join(root, name), mode="r")[:]
        assert read.tolist() == expected.tolist()
    tree = xr.open_datatree(root, engine="zarr")
    for name in ("plain", "coded"):
        assert tree.to_dataset()[name].values.tolist() == expected.tolist()


def test_nodes_made_from_templates_are_those_zarrs_create_array_makes(tmp_path):
    """The seal makes a table's group and arrays from metadata made once per kind of array
    (``zarrio.Templates``) through Zarr's ``create_hierarchy``: each document (``zarr.json``)
    is the bytes Zarr's ``create_array`` and ``create_group`` write for the same arguments,
    for strings, numbers with a NaN fill, 2-D arrays and several sizes from one template;
    the arrays write every chunk, as those ``create_array`` makes."""
    from zarr.storage import LocalStore, StorePath

    from metacollect.store import zarrio

    kinds = [
        ((10,), (10,), str, zarrio.codecs("text", 8), "", ["row"]),
        ((70_000,), (35_000,), str, zarrio.codecs("text", 8), "", ["row"]),
        ((5,), (5,), np.float64, zarrio.codecs("numeric", 5), np.nan, ["row"]),
        ((9, 3), (9, 3), np.int64, zarrio.codecs("numeric", 5), -1, ["row", "col"]),
        ((4, 2), (4, 2), np.int64, zarrio.codecs("numeric", 5), -1, ["row", "col"]),
    ]
    attrs = {"units": "1", "description": "d\u00e9j\u00e0", "rows": [1, 2]}

    async def by_zarr(where: Any) -> None:
        await zarrio.new_group(where, {"table": "t", "rows": 3})
        for i, (shape, chunks, dtype, codecs, fill, dims) in enumerate(kinds):
            await zarrio.new_array(where / f"a{i}", shape, chunks, dtype, codecs, fill, attrs, dims)

    async def by_templates(where: Any) -> dict[str, Any]:
        made = zarrio.Templates()
        group = await made.group({"table": "t", "rows": 3})
        arrays = {
            f"a{i}": await made.array(shape, chunks, dtype, codecs, fill, attrs, dims)
            for i, (shape, chunks, dtype, codecs, fill, dims) in enumerate(kinds)
        }
        return await zarrio.new_nodes(where, group, arrays)

    root = str(tmp_path / "s.zarr")
    zarrio.run(by_zarr(StorePath(LocalStore(os.path.join(root, "zarr")))))
    made = zarrio.run(by_templates(StorePath(LocalStore(os.path.join(root, "ours")))))
    assert _files(os.path.join(root, "ours")) == _files(os.path.join(root, "zarr"))
    for name in sorted(_files(os.path.join(root, "zarr"))):
        with (
            open(os.path.join(root, "ours", name), "rb") as a,
            open(os.path.join(root, "zarr", name), "rb") as b,
        ):
            assert a.read() == b.read(), name
    zarrio.run(made["a2"].setitem(slice(None), np.full(5, np.nan)))  # all fill: still stored
    assert os.path.exists(os.path.join(root, "ours", "a2", "c.0"))
    group = zarr.open_group(os.path.join(root, "ours"), mode="r")
    assert np.isnan(group["a2"][:]).all() and group.attrs["rows"] == 3


def test_a_table_made_whole_and_killed_before_its_chunks_is_not_read_as_whole(store, monkeypatch):
    """A short table's group is made with its ``rows`` at once, beside its place (its
    arrays' final attributes known): a seal killed before its chunks are written leaves that
    directory, which readers do not take for the table (they read the rows from the
    streams), the doctor salvages around, and the next seal writes over."""
    from metacollect.store import tablewrite

    _, g = _run(store)
    _flush_events(g, 0, 10)
    expected = open_run(store).table(GROUP, "events")

    async def killed(self, block):
        raise RuntimeError("killed before its chunks")

    monkeypatch.setattr(tablewrite._ColumnSink, "store", killed)
    with pytest.raises(Exception, match="killed before its chunks"):
        finalize(store)
    monkeypatch.undo()
    beside = os.path.join(store, *GROUP.split("/"), "events" + seal_mod.NEW)
    with open(os.path.join(beside, "zarr.json")) as f:
        assert json.load(f)["attributes"]["rows"] == 10
    assert not os.path.exists(os.path.join(store, *GROUP.split("/"), "events"))
    assert open_run(store).table(GROUP, "events").equals(expected)
    fixed = salvage(store, store + ".fixed")
    assert fixed.rows_dropped == 0
    assert open_run(fixed.target).table(GROUP, "events").equals(expected)
    assert finalize(store) == ("complete", [])
    assert not os.path.exists(beside)
    assert open_run(store).table(GROUP, "events").equals(expected)
    assert validate_store(store) == []
