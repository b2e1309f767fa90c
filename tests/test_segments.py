"""Flushes as segment files: one file per flush, folded into Zarr at the seal.

A writer of a store on a filesystem writes each flush of a group as one segment
(``<group>/.segments/<seq>.seg``); readers fold them after the Zarr rows; the seal appends
them to Zarr, compacts and removes them. These tests count the files, tear a segment, kill a
real writing process, and open the sealed store with plain xarray.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import xarray as xr
import zarr

from metacollect import open_run
from metacollect.session import init_root
from metacollect.store import chunkio, segments, streams
from metacollect.store.doctor import salvage
from metacollect.store.lifecycle import finalize, prepare_store
from metacollect.store.validate import validate_store
from metacollect.store.writer import GroupWriter, StoreWriter
from tests.test_store import CLUSTER_ATTRS

GROUP = "clusters/c1/scheduler"


def _files(store: str) -> set[str]:
    return {
        os.path.relpath(os.path.join(d, f), store) for d, _, files in os.walk(store) for f in files
    }


def _flush_events(g, first: int, n: int) -> None:
    g.append(
        "events",
        {
            "time": np.arange(first, first + n, dtype=float),
            "topic": [f"topic-{i % 7}" for i in range(first, first + n)],
            "msg": [f"m{i}" for i in range(first, first + n)],
        },
    )
    g.append(
        "transitions",
        {
            "key": [("x", i) for i in range(first, first + n)],
            "start": ["released"] * n,
            "finish": ["waiting"] * n,
            "time": np.arange(first, first + n, dtype=float),
            "stimulus_id": ["s"] * n,
            "worker": [None] * n,
        },
    )
    assert g.flush() == 2 * n


def _run(store: str) -> tuple[StoreWriter, object]:
    prepare_store(store)
    w = StoreWriter(store, streams=False)
    init_root(w, "r1")
    w.group("cluster", attrs=CLUSTER_ATTRS, cluster="c1")
    return w, w.group("scheduler", cluster="c1")


def _torn(store: str, flushes: int, seq: int, keep: int | None = None):
    """A writer and its group after ``flushes`` flushes of ten rows each, with segment
    ``seq`` cut short to ``keep`` bytes (half by default), as a process killed while
    writing it leaves it; and that segment's path."""
    w, g = _run(store)
    for i in range(flushes):
        _flush_events(g, 10 * i, 10)
    path = os.path.join(segments.directory(store, GROUP), segments.file_name(seq))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2 if keep is None else keep)
    return w, g, path


def test_one_file_per_flush_read_live_and_sealed_as_plain_zarr(store):
    """Each flush of a group writes exactly one new file, its segment, whatever its tables;
    readers see the rows before the seal; the seal leaves plain Zarr (no segment) that
    ``xarray.open_datatree`` opens, with as many files whatever the number of flushes."""
    _, g = _run(store)
    segdir = segments.directory(store, GROUP)
    before = _files(store)
    flushes = 12
    for f in range(flushes):
        _flush_events(g, 100 * f, 100)
        now = _files(store)
        assert now - before == {os.path.relpath(os.path.join(segdir, f"{f:09d}.seg"), store)}
        before = now
    assert len(os.listdir(segdir)) == flushes
    run = open_run(store)
    events = run.table(GROUP, "events")
    assert events.msg.tolist() == [f"m{i}" for i in range(100 * flushes)]
    assert events.topic.tolist() == [f"topic-{i % 7}" for i in range(100 * flushes)]
    assert run.transitions().key.tolist() == [str(("x", i)) for i in range(100 * flushes)]
    # the same reader sees a later flush (live reading)
    _flush_events(g, 100 * flushes, 100)
    flushes += 1
    events = run.table(GROUP, "events")
    assert events.msg.tolist() == [f"m{i}" for i in range(100 * flushes)]
    assert validate_store(store) == []

    status, missing = finalize(store)
    assert (status, missing) == ("complete", [])
    assert segments.groups_with_segments(store) == []
    tree = xr.open_datatree(store, engine="zarr")
    ds = tree[f"{GROUP}/events"].ds
    assert ds.sizes["event"] == 100 * flushes
    assert list(ds["msg"].values[:3]) == ["m0", "m1", "m2"]
    sealed = open_run(store).table(GROUP, "events")
    assert sealed.equals(events)
    assert validate_store(store) == []
    # a segment written after the seal (a flush that outran the run's end) is named by
    # validate, and readers of the sealed record do not read it
    late = segments.encode({"events": {"time": np.array([1.0])}})
    os.makedirs(segments.directory(store, GROUP))
    segments.write(segments.directory(store, GROUP), 1000, late)  # its writer's next seq
    assert any("left in a sealed store" in p for p in validate_store(store))
    assert open_run(store).table(GROUP, "events").equals(events)
    os.remove(os.path.join(segments.directory(store, GROUP), segments.file_name(1000)))
    os.rmdir(segments.directory(store, GROUP))
    # as many files as a store written in one flush
    one = store + "-one"
    _, g1 = _run(one)
    _flush_events(g1, 0, 100 * flushes)
    finalize(one)
    assert len(_files(store)) == len(_files(one))


def test_the_seal_makes_again_a_group_whose_metadata_was_lost(store):
    """The fold writes a group's tables without making a writer of the group (it is there:
    its segments are in it); a group whose ``zarr.json`` went missing is made again, so its
    tables are part of the sealed store, not files below a directory no reader opens."""
    _, g = _run(store)
    _flush_events(g, 0, 10)
    expected = open_run(store).table(GROUP, "events")
    os.remove(os.path.join(store, *GROUP.split("/"), "zarr.json"))
    assert finalize(store) == ("complete", [])
    assert open_run(store).table(GROUP, "events").equals(expected)
    assert xr.open_datatree(store, engine="zarr")[f"{GROUP}/events"].ds.sizes["event"] == 10
    assert validate_store(store) == []


def test_a_torn_last_segment_is_skipped_reported_and_the_rows_before_survive(store):
    _torn(store, flushes=3, seq=2)  # the last one
    segdir = segments.directory(store, GROUP)
    run = open_run(store)
    assert run.table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(20)]
    problems = validate_store(store)
    assert any("segment 000000002.seg is torn" in p for p in problems), problems
    # a writer that starts the group again continues after it, codes included
    w2 = StoreWriter(store, streams=False)
    g2 = w2.group("scheduler", cluster="c1")
    _flush_events(g2, 1000, 5)
    assert sorted(os.listdir(segdir))[-1] == segments.file_name(3)
    events = open_run(store).table(GROUP, "events")
    assert events.msg.tolist() == [f"m{i}" for i in range(20)] + [
        f"m{i}" for i in range(1000, 1005)
    ]
    assert events.topic.tolist()[-5:] == [f"topic-{i % 7}" for i in range(1000, 1005)]
    # a salvage of the unsealed store keeps those rows and notes the torn segment
    report = salvage(store, store + "-salvaged")
    assert any("000000002.seg is torn" in n for n in report.notes)
    assert open_run(store + "-salvaged").table(GROUP, "events").msg.tolist()[-5:] == [
        f"m{i}" for i in range(1000, 1005)
    ]
    status, missing = finalize(store, "complete")
    assert status == "incomplete"
    assert any("000000002.seg is torn" in m for m in missing)
    assert open_run(store).table(GROUP, "events").msg.tolist() == events.msg.tolist()
    assert validate_store(store) == []


def test_a_flush_that_ends_during_the_seal_makes_the_run_incomplete(store, monkeypatch):
    """A writer of the run may flush while the store is being sealed: the run's lock is
    held until the seal is done (a worker's final flush that came late). A segment written
    after the fold read its group keeps the group's segment directory, and its rows are not
    in the sealed tables: the run says so (before: ``complete``, with the rows in a file
    only validate named)."""
    from metacollect.store import seal as seal_mod

    _, g = _run(store)
    _flush_events(g, 0, 10)
    real_fold = seal_mod._fold_group

    def fold_then_a_late_flush(*args, **kwargs):
        real_fold(*args, **kwargs)
        _flush_events(g, 100, 5)  # after the fold read the group's segments

    monkeypatch.setattr(seal_mod, "_fold_group", fold_then_a_late_flush)
    status, missing = finalize(store, "complete")
    assert status == "incomplete"
    (line,) = missing
    assert line.startswith(f"{GROUP}: a flush ended while the store was being sealed")
    assert segments.file_name(1) in line
    run = open_run(store)
    assert run.attrs["status"] == "incomplete" and run.attrs["missing"] == missing
    assert run.table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(10)]
    problems = validate_store(store)
    assert any(p.startswith(f"{GROUP}: 1 segment(s) left in a sealed store") for p in problems)
    assert xr.open_datatree(store, engine="zarr").attrs["status"] == "incomplete"


@pytest.mark.parametrize("when", ["before-the-read", "after-the-read"])
@pytest.mark.parametrize("before", ["placeholder", "flushed-nothing"])
def test_a_workers_only_flush_during_the_seal_is_named(store, monkeypatch, before, when):
    """A worker SIGTERMed with the run (a batch job's end) may write its only flush, and
    then its end, while the run's seal runs. Its group had no segment when the fold read
    the store: not there at all yet, or an empty segment directory, which the fold removed
    (the flush then failed, its rows lost with the process). Either way its end alone
    passed the check of unended workers, and the run said ``complete``; now the flush is
    written and the seal names it. A group without a segment directory is a node-local
    worker's placeholder, which its gather fills at its end. When the flush and the end
    land after the seal has read the store's nodes, the worker is named for its late flush
    only: it was also named as one that never took its final flush, which it did."""
    from metacollect.store import lifecycle

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
    else:  # the group and its segment directory exist, with no segment
        made = [w.group("worker", attrs=attrs, cluster="c1", worker="w1")]
        made[0].flush()
    real_read_nodes = lifecycle.read_nodes
    flushed: list[int] = []

    def a_final_flush_after_the_fold(*args, **kwargs):
        read = real_read_nodes(*args, **kwargs) if when == "after-the-read" else None
        if not flushed:
            worker = (
                made[0]
                if made
                else StoreWriter(store, streams=False).group("worker", cluster="c1", worker="w1")
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

    monkeypatch.setattr(lifecycle, "read_nodes", a_final_flush_after_the_fold)
    status, missing = finalize(store, "complete")
    assert flushed == [5] and status == "incomplete"
    (line,) = missing
    assert line.startswith("clusters/c1/workers/w1: a flush ended while the store was being")
    assert any("1 segment(s) left in a sealed store" in p for p in validate_store(store))


def test_segments_of_a_group_the_schema_does_not_know_are_named_once(store):
    """Segments the fold cannot place (a group of another metacollect version) stay where
    they are; the run says their rows are missing, once, and not as a late flush (before:
    a logged warning, and the run complete)."""
    _, g = _run(store)
    _flush_events(g, 0, 10)
    alien = segments.directory(store, "clusters/c1/not-a-group")
    os.makedirs(alien)
    shutil.copy(os.path.join(segments.directory(store, GROUP), segments.file_name(0)), alien)
    status, missing = finalize(store, "complete")
    assert status == "incomplete"
    assert missing == [
        "clusters/c1/not-a-group: segments left unfolded, no group of this version's schema "
        "(written by another metacollect version?): their rows are not in the tables"
    ]
    assert open_run(store).table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(10)]


def test_validate_of_a_live_store_waits_for_the_segment_being_written(store, monkeypatch):
    """A flush's segment reads short until its one write ends: ``validate`` on a live store
    must not call it torn. Here the write is slowed down the way a stalled filesystem
    would: half the file, then the rest once validate has read the group. Validate reads
    the group again after SETTLE and finds it whole; a segment begun during that wait is a
    flush under way and is left out; one still short after the wait is torn."""
    _, g = _run(store)
    _flush_events(g, 0, 10)
    _flush_events(g, 10, 10)
    segdir = segments.directory(store, GROUP)
    second = os.path.join(segdir, segments.file_name(1))
    with open(second, "rb") as f:
        whole = f.read()
    with open(second, "wb") as f:  # the flush's write, half done
        f.write(whole[: len(whole) // 2])
    waits: list[float] = []
    sleep = time.sleep

    def write_lands_meanwhile(seconds: float) -> None:
        if not waits:  # the rest of the write lands; a new flush begins, short
            with open(second, "ab") as f:
                f.write(whole[len(whole) // 2 :])
            with open(os.path.join(segdir, segments.file_name(2)), "wb") as f:
                f.write(whole[:100])
        waits.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", write_lands_meanwhile)
    assert validate_store(store) == []
    assert waits == [streams.SETTLE]  # validate saw the segment torn, and waited once
    assert open_run(store).table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(20)]
    # a segment short before and after the wait is torn (a writer killed mid-write)
    problems = validate_store(store)
    assert [p for p in problems if "torn" in p] == [
        f"{GROUP}: segment 000000002.seg is torn (cut short within its header (100 bytes)); "
        "its rows are not read"
    ], problems


def test_a_fold_cut_short_and_run_again_appends_nothing_twice(store, monkeypatch):
    """The seal writes each table whose rows are all in segments once, in its sealed form,
    committed (its group's ``zarr.json``, last) with the last segment it holds. A seal
    killed after one table was written, and run again, takes the group through the append
    path (a table of it is in Zarr now), which appends the other tables only."""
    from metacollect.store import seal as seal_mod
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
        raise RuntimeError("killed mid-fold")

    monkeypatch.setattr(tablewrite._TableSink, "finish", die_after_the_first)
    with pytest.raises(RuntimeError, match="killed mid-fold"):
        seal_mod.fold_segments(store)
    monkeypatch.setattr(tablewrite._TableSink, "finish", real)
    tables = {
        t for t in ("events", "transitions") if os.path.exists(f"{store}/{GROUP}/{t}/zarr.json")
    }
    assert len(tables) == 1  # one written, the other not
    mid = open_run(store)  # readers see every row once in the meantime
    assert mid.table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(40)]
    assert len(mid.transitions()) == 40
    real_fold, folded = seal_mod._fold_table, []

    def fold(gw, found, table):
        folded.append((gw.path, table))
        return real_fold(gw, found, table)

    monkeypatch.setattr(seal_mod, "_fold_table", fold)
    finalize(store)
    run = open_run(store)
    assert run.table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(40)]
    assert run.transitions().key.tolist() == [str(("x", i)) for i in range(40)]
    assert (GROUP, "strings") in folded  # the append path, for that group only
    assert not os.path.exists(segments.directory(store, GROUP))
    assert validate_store(store) == []


def test_tables_written_once_at_the_seal_equal_the_appended_and_compacted(store, tmp_path):
    """The seal's one write of a table from its segments leaves exactly what appending the
    segments to Zarr and compacting the table leaves: the same documents (but for the
    ``consolidated_metadata`` key of an unconsolidated group) and the same values."""
    from metacollect.store import seal as seal_mod

    _, g = _run(store)
    for f in range(5):
        _flush_events(g, 10 * f, 10)
    g.append("events", {"time": np.arange(3.0), "topic": [None, "", "t"], "msg": ["a", None, ""]})
    g.flush()
    appended = str(tmp_path / "appended.zarr")
    shutil.copytree(store, appended)
    finalize(store)

    real = seal_mod._write_sealed
    seal_mod._write_sealed = seal_mod._append_folded
    try:
        finalize(appended)
    finally:
        seal_mod._write_sealed = real

    assert _docs(store) == _docs(appended)
    once, twice = xr.open_datatree(store, engine="zarr"), xr.open_datatree(appended, engine="zarr")
    for node in once.subtree:
        if node.path != "/":
            assert node.to_dataset().identical(twice[node.path].to_dataset()), node.path
    events = open_run(store).table(GROUP, "events")
    assert events.topic.tolist()[-3:] == [None, "", "t"]
    assert events.msg.tolist()[-3:] == ["a", "", ""]  # a ``str`` column writes None as ""
    assert validate_store(store) == []


def test_a_long_groups_seal_holds_a_window_of_its_strings(store, tmp_path, monkeypatch):
    """The seal goes through a group's segments one at a time, in order, and holds only the
    strings of the recent ones: a writer's string cache restarts every ``cache-size``
    strings, and rows never index strings from before. With a cache of 1,000, 40 flushes of
    500 transitions (40,000 distinct keys and stimulus ids) are sealed holding at most
    ~2,000 strings at a time, in several blocks of chunks, and leave exactly what appending
    every segment to Zarr and compacting leaves (documents and values). Blank strings among
    them (an empty topic beside a missing one) make the seal look at which column holds
    which before writing."""
    import dask.config

    from metacollect.store import layout
    from metacollect.store import seal as seal_mod

    monkeypatch.setattr(layout, "COMPACT_ROWS", 1000)  # chunks of 1,000, blocks of 4,000
    held: list[int] = []
    trim = segments.StringWindow.trim

    def trim_and_count(self):
        trim(self)
        held.append(sum(len(v) for v in self._held.values()))

    monkeypatch.setattr(segments.StringWindow, "trim", trim_and_count)
    decoded: list[int] = []
    decode = segments.StringWindow._decode

    def decode_and_count(self, i):
        decoded.append(i)
        return decode(self, i)

    monkeypatch.setattr(segments.StringWindow, "_decode", decode_and_count)
    keys, stimuli, workers, topics = [], [], [], []
    # a segment a flush (merged ones hold the strings of many: a window of a merged one is
    # that one, see test_merged_segments_*)
    with dask.config.set(
        {"metacollect.strings.cache-size": 1000, "metacollect.store.segment-merge": 0}
    ):
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
        appended = str(tmp_path / "appended.zarr")
        shutil.copytree(store, appended)
        finalize(store)
        monkeypatch.setattr(seal_mod, "_write_sealed", seal_mod._append_folded)
        finalize(appended)

    assert held and max(held) <= 2 * 1000, max(held)
    # each segment's strings read once more, to find the blank ones (every segment here has
    # an empty topic); no code had to be read again from a segment the window let go of
    assert sorted(decoded) == list(range(40))
    assert _docs(store) == _docs(appended)
    once, twice = xr.open_datatree(store, engine="zarr"), xr.open_datatree(appended, engine="zarr")
    for node in once.subtree:
        if node.path != "/":
            assert node.to_dataset().identical(twice[node.path].to_dataset()), node.path
    run = open_run(store)
    transitions = run.transitions()
    assert transitions.key.tolist() == keys
    assert transitions.stimulus_id.tolist() == stimuli
    assert transitions.worker.tolist() == workers
    assert run.table(GROUP, "events").topic.tolist() == topics
    chunks = [f for f in os.listdir(f"{store}/{GROUP}/transitions/key") if f != "zarr.json"]
    assert len(chunks) == 20  # 20,000 rows in chunks of 1,000
    assert validate_store(store) == []


def test_the_append_fold_decodes_one_segment_at_a_time(store, monkeypatch):
    """The fold that appends segments to Zarr (a seal cut short, then run again) decodes a
    segment as its turn comes and lets it go once its rows are in a batch: a many-hour run's
    segments decoded all at once would not fit where the seal runs. Six flushes, folded in
    batches of two, leave every row, in order, through several commits."""
    from metacollect.store import seal as seal_mod
    from metacollect.store import writer as writer_mod

    _, g = _run(store)
    for f in range(6):
        _flush_events(g, 10 * f, 10)
    monkeypatch.setattr(seal_mod, "FOLD_ROWS", 20)
    monkeypatch.setattr(seal_mod, "_write_sealed", seal_mod._append_folded)
    decoded_at_commit: list[int] = []
    fold, append = seal_mod._fold_table, writer_mod.GroupWriter._append_zarr

    def counting_fold(gw, found, table):
        def append_and_count(self, tables):
            decoded_at_commit.append(sum(s.decoded for s in found.segments))
            return append(self, tables)

        monkeypatch.setattr(writer_mod.GroupWriter, "_append_zarr", append_and_count)
        return fold(gw, found, table)

    monkeypatch.setattr(seal_mod, "_fold_table", counting_fold)
    finalize(store)

    assert len(decoded_at_commit) >= 3 * 2  # events and transitions, three batches each
    assert max(decoded_at_commit) == 0, decoded_at_commit  # the old fold: all six
    run = open_run(store)
    assert run.table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(60)]
    assert run.transitions().key.tolist() == [str(("x", i)) for i in range(60)]
    assert not os.path.exists(segments.directory(store, GROUP))
    assert validate_store(store) == []


def test_a_large_appended_table_is_compacted_a_block_at_a_time(store, tmp_path, monkeypatch):
    """A table appended to Zarr (a seal cut short and run again, ``metacollect ingest``
    after the seal) larger than ``COMPACT_ROWS`` is read a block of chunks at a time as it
    is compacted, never a whole column, and leaves what the seal's one write leaves. One of
    its chunks that does not decode leaves it as written, with nothing half-written beside
    it."""
    from metacollect.store import compact, layout, zarrio
    from metacollect.store import lifecycle as lifecycle_mod
    from metacollect.store import seal as seal_mod

    monkeypatch.setattr(layout, "COMPACT_ROWS", 1000)  # chunks of 1,000, blocks of 4,000
    _, g = _run(store)
    for f in range(20):
        _flush_events(g, 500 * f, 500)  # 10,000 rows in each of two tables
    appended, damaged = str(tmp_path / "appended.zarr"), str(tmp_path / "damaged.zarr")
    shutil.copytree(store, appended)
    shutil.copytree(store, damaged)
    finalize(store)

    monkeypatch.setattr(seal_mod, "_write_sealed", seal_mod._append_folded)
    whole, blocks = [], []
    read_rows, read_block = chunkio.read_rows, chunkio.read_block

    async def counted_rows(arrays, n):
        whole.extend((a.path, n) for a in arrays)
        return await read_rows(arrays, n)

    async def counted_block(arr, lo, hi):
        blocks.append((arr.path, hi - lo))
        return await read_block(arr, lo, hi)

    monkeypatch.setattr(chunkio, "read_rows", counted_rows)
    monkeypatch.setattr(chunkio, "read_block", counted_block)
    finalize(appended)
    assert {p.rsplit("/", 1)[-1] for p, _ in blocks} >= {"key", "time", "msg"}
    assert max(n for _, n in blocks) <= 4000
    assert not [(p, n) for p, n in whole if n > 1000]
    assert _docs(store) == _docs(appended)
    once, twice = xr.open_datatree(store, engine="zarr"), xr.open_datatree(appended, engine="zarr")
    for node in once.subtree:
        if node.path != "/":
            assert node.to_dataset().identical(twice[node.path].to_dataset()), node.path

    with monkeypatch.context() as m:  # folded into Zarr, not compacted
        m.setattr(lifecycle_mod, "compact", lambda root, nodes: 0)
        finalize(damaged)
    table = os.path.join(damaged, *GROUP.split("/"), "transitions")
    chunk = os.path.join(table, "time", "c.0")
    with open(chunk, "rb") as f:
        body = bytearray(f.read())
    body[len(body) // 2] ^= 0xFF
    with open(chunk, "wb") as f:
        f.write(bytes(body))
    root = zarrio.open_group(damaged, mode="a")
    before = set(os.listdir(os.path.dirname(table)))
    assert compact.compact(root, seal_mod.read_nodes(root)) == 1  # the events table
    assert set(os.listdir(os.path.dirname(table))) == before  # no .compacting left
    with open(chunk, "rb") as f:
        assert f.read() == bytes(body)  # left as written


def test_a_store_sealed_with_the_chunks_of_before_is_not_sealed_again(store, monkeypatch):
    """Seals before 2026-11-29 cut a large table into chunks of ``COMPACT_ROWS`` and a padded
    last one; today's divide it nearly evenly. A store sealed either way and sealed again
    (``metacollect finalize`` run twice, a merge) is left as it is, not rewritten."""
    from metacollect.store import compact, layout, zarrio
    from metacollect.store import seal as seal_mod

    monkeypatch.setattr(layout, "COMPACT_ROWS", 1000)
    tables = {}
    for name, before in (("before", True), ("today", False)):
        where = os.path.join(os.path.dirname(store), f"{name}.zarr")
        _, g = _run(where)
        for f in range(5):
            _flush_events(g, 500 * f, 500)  # 2,500 rows in each of two tables
        with monkeypatch.context() as m:
            if before:
                m.setattr(layout, "_chunk", lambda n, extra: min(n, layout._base_rows(extra)))
            finalize(where)
        table = os.path.join(where, *GROUP.split("/"), "transitions")
        tables[name] = zarr.open_array(os.path.join(table, "time"), mode="r").chunks
        root = zarrio.open_group(where, mode="a")
        assert compact.compact(root, seal_mod.read_nodes(root)) == 0, name
        assert validate_store(where) == []
    assert tables == {"before": (1000,), "today": (1250,)}


def test_a_segment_says_whether_its_strings_may_be_blank():
    """A segment's header lists the string columns that may hold an empty or NUL-only
    string (four zero bytes in their encoding: no such string without them), so the seal
    knows without decoding that a group has none, the usual case; one written before the
    header said so may hold one."""

    def head(values):
        data = segments.encode({"strings": {"value": np.array(values, dtype=object)}})
        return segments.read(0, data)

    assert head(["a", "tcp://10.0.0.1:4000", "x" * 300]).head["blank"] == []
    for blank in ["", "\0", "\0" * 300]:
        found = head(["a", blank, "b"])
        assert found.may_hold_blank("strings", "value"), repr(blank)
    older = head(["a"])
    del older.head["blank"]
    assert older.may_hold_blank("strings", "value")


def test_a_string_window_reads_any_code_whatever_it_let_go(store):
    """The strings a seal holds are those of the recent segments; a code it let go of (a
    writer's cache larger than the window) is read again from its segment, never wrong."""
    _, g = _run(store)
    for f in range(6):
        _flush_events(g, 10 * f, 10)
    found = segments.load(store, GROUP, decoded=False)
    assert not any(s.decoded for s in found.segments)
    truth = segments.load(store, GROUP).strings()
    window = segments.StringWindow(found, keep=0)
    assert len(window) == len(truth)
    for s in found.segments:
        window.hold(s.seq, s.tables["strings"]["value"])
        s.release()
        window.trim()
    codes = np.array([-1, 0, len(truth) - 1, 3, len(truth), 7, 1])
    expected = [None, truth[0], truth[-1], truth[3], None, truth[7], truth[1]]
    assert window.take(codes).tolist() == expected
    assert window.blanks() == {}
    assert not any(s.decoded for s in found.segments)


def _docs(root: str) -> dict[str, dict]:
    """Every node's ``zarr.json`` below ``root`` (but its ``consolidated_metadata``)."""
    out = {}
    for d, _, files in os.walk(root):
        if "zarr.json" in files and os.path.relpath(d, root) != ".":
            with open(os.path.join(d, "zarr.json")) as f:
                doc = json.load(f)
            doc.pop("consolidated_metadata", None)
            out[os.path.relpath(d, root)] = doc
    return out


_WRITER = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from metacollect.session import init_root
    from metacollect.store.writer import GroupWriter, StoreWriter

    store = sys.argv[1]
    w = StoreWriter(store, streams=False)
    init_root(w, "killed")
    w.group("cluster", attrs=json.loads(sys.argv[2]), cluster="c1")
    g = w.group("scheduler", cluster="c1")
    i = 0
    while True:
        n = 50
        g.append("events", {"time": np.arange(i, i + n, dtype=float),
                            "topic": [f"t{j % 5}" for j in range(i, i + n)],
                            "msg": [f"m{j}" for j in range(i, i + n)]})
        g.flush()
        i += n
        print(i, flush=True)  # rows whose flush returned
        time.sleep(0.005)
    """
)


@pytest.mark.parametrize("merge", ["16", "2"])
def test_a_process_killed_mid_run_loses_nothing_flushed(store, tmp_path, merge):
    """SIGKILL a real process that flushes a store in a loop; the seal of what it left (as
    ``metacollect batch finalize`` does) folds its segments: every row of every flush that
    returned before the kill is in the sealed store, in order, and it validates. Its writer
    merges its segments every 16 flushes (the default), or every other flush: then the kill
    lands in a merge as often as not."""
    prepare_store(store)
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "DASK_METACOLLECT__STORE__SEGMENT_MERGE": merge,
    }
    proc = subprocess.Popen(
        [sys.executable, str(script), store, json.dumps(CLUSTER_ATTRS)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    flushed = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        flushed = int(line)
        if flushed >= 2000:
            break
    time.sleep(0.02)  # mid-way through later flushes
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # killed, not ended by itself
    assert flushed >= 2000
    rest = proc.stdout.read().split()
    proc.stdout.close()
    flushed = int(rest[-1]) if rest else flushed
    status, _ = finalize(store, "incomplete")
    assert status == "incomplete"
    assert segments.groups_with_segments(store) == []
    msgs = open_run(store).table(GROUP, "events").msg.tolist()
    assert len(msgs) >= flushed
    assert msgs == [f"m{i}" for i in range(len(msgs))]
    assert validate_store(store) == []


def test_the_seals_own_chunk_files_are_the_bytes_zarr_writes(store, tmp_path):
    """The seal encodes a table's chunks itself and stores each as a plain new file (no
    temporary file and rename): Zarr, given the same metadata and values, writes the same
    bytes, chunk for chunk, the padded last chunk included; and the store reads as Zarr."""
    import zarr
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


def _levels(store: str) -> list[tuple[int, int, int]]:
    """``(seq, first, level)`` of each segment file of the group, as on disk."""
    found = segments.load(store, GROUP, decoded=False)
    return [(s.seq, s.first, s.head.get("level", 0)) for s in found.segments]


def test_a_writers_segments_merge_as_a_counter_carries(store):
    """Every K (``store.segment-merge``) segments of one level a writer wrote become one of
    the next: after 300 flushes at K=4 the group holds the digits of 300 in base 4 (1, 0, 2,
    3, 0: six files), not 300. Readers of the live store, the seal and validate see each row
    once, in order, with its strings, whatever merged it."""
    import dask.config

    with dask.config.set({"metacollect.store.segment-merge": 4}):
        _, g = _run(store)
        for f in range(300):
            _flush_events(g, 10 * f, 10)
    assert _levels(store) == [
        (255, 0, 4),
        (271, 256, 2),
        (287, 272, 2),
        (291, 288, 1),
        (295, 292, 1),
        (299, 296, 1),
    ]
    assert set(os.listdir(segments.directory(store, GROUP))) == {
        segments.file_name(s) for s in (255, 271, 287, 291, 295, 299)
    }
    run = open_run(store)
    assert run.transitions().key.tolist() == [str(("x", i)) for i in range(3000)]
    live = run.table(GROUP, "events")
    assert live.msg.tolist() == [f"m{i}" for i in range(3000)]
    assert validate_store(store) == []
    assert finalize(store) == ("complete", [])
    assert open_run(store).table(GROUP, "events").equals(live)
    assert validate_store(store) == []


def test_segments_too_large_to_merge_whole_merge_up_to_the_limit(store, monkeypatch):
    """K segments of one level that hold more rows than a merge may hold do not merge; the
    oldest of them that fit become one that merges no more, and the counter goes on: a
    group that flushes many rows holds about one segment a ``MERGE_MAX_ROWS`` rows, none of
    them larger, not one a level-1 merge's worth."""
    import dask.config

    from metacollect.store import writer as writer_mod

    monkeypatch.setattr(writer_mod, "MERGE_MAX_ROWS", 300)
    with dask.config.set({"metacollect.store.segment-merge": 4}):
        _, g = _run(store)
        for f in range(200):
            _flush_events(g, 10 * f, 10)
    found = segments.load(store, GROUP, decoded=False)
    sizes = [
        sum(
            shape[0]
            for cols in s.head["tables"].values()
            for _, shape, _, _ in [next(iter(cols.values()))]
        )
        for s in found.segments
    ]
    total = sum(sizes)
    assert max(sizes) <= 300, sizes
    # 4 flushes of ~30 rows merge whole (level 1); 4 of those would be ~480 rows: the
    # oldest 2 merge (level 2), and merge no more
    assert len(sizes) <= total / 240 + 2 * 3, sizes
    assert [s.head.get("level", 0) for s in found.segments][:3] == [2, 2, 2]
    run = open_run(store)
    assert run.table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(2000)]
    assert run.transitions().key.tolist() == [str(("x", i)) for i in range(2000)]
    assert validate_store(store) == []
    assert finalize(store) == ("complete", [])
    assert open_run(store).transitions().key.tolist() == [str(("x", i)) for i in range(2000)]


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_a_merge_cut_short_at_any_step_leaves_each_row_once(store, tmp_path):
    """A merge writes the merged segment beside the others, renames it over the last, then
    removes the others: a process killed between any two steps leaves a directory that the
    live readers, validate and the seal read as each row once, and the seal leaves no file of
    it behind."""
    import dask.config

    with dask.config.set({"metacollect.store.segment-merge": 0}):
        _, g = _run(store)
        for f in range(8):
            _flush_events(g, 10 * f, 10)
    segdir = segments.directory(store, GROUP)
    singles = {n: _bytes(os.path.join(segdir, n)) for n in os.listdir(segdir)}
    expected = open_run(store).table(GROUP, "events")
    segments.merge(segdir, list(range(8)), level=1)
    merged = _bytes(os.path.join(segdir, segments.file_name(7)))
    assert os.listdir(segdir) == [segments.file_name(7)]

    def state(name: str, files: dict[str, bytes]) -> str:
        copy = str(tmp_path / name)
        shutil.copytree(store, copy)
        seg_copy = segments.directory(copy, GROUP)
        for n in os.listdir(seg_copy):
            os.remove(os.path.join(seg_copy, n))
        for n, data in files.items():
            with open(os.path.join(seg_copy, n), "wb") as f:
                f.write(data)
        return copy

    cut = {
        # killed while writing the merged segment, or before renaming it
        "written": {**singles, f"{7:09d}{segments.MERGING}": merged[:100]},
        "renamed": {**singles, segments.file_name(7): merged},
        "half removed": {
            **{segments.file_name(s): singles[segments.file_name(s)] for s in (4, 5, 6)},
            segments.file_name(7): merged,
        },
    }
    for name, files in cut.items():
        copy = state(name, files)
        assert open_run(copy).table(GROUP, "events").equals(expected), name
        assert validate_store(copy) == [], name
        assert finalize(copy) == ("complete", []), name
        assert not os.path.exists(segments.directory(copy, GROUP)), name
        assert open_run(copy).table(GROUP, "events").equals(expected), name


def test_live_readers_see_each_row_once_while_the_writer_merges(store):
    """A reader of the live store lists a group's segments, then reads them in order, while
    its writer merges them: whatever it finds gone was merged into a later one it reads, and
    a merged one it reads supersedes those it read before. Every read is the rows flushed so
    far, each once, in order."""
    import threading

    import dask.config

    done = threading.Event()
    seen: list[int] = []
    bad: list[str] = []

    def read() -> None:
        while not done.is_set():
            found = segments.load(store, GROUP)
            rows = found.rows("events")
            times = rows["time"] if rows is not None else np.empty(0)
            if not np.array_equal(times, np.arange(len(times), dtype=float)):
                bad.append(f"{len(times)} rows, not 0..n in order")
            seen.append(len(times))

    with dask.config.set({"metacollect.store.segment-merge": 2}):
        _, g = _run(store)
        reader = threading.Thread(target=read)
        reader.start()
        try:
            for f in range(400):
                _flush_events(g, 5 * f, 5)
        finally:
            done.set()
            reader.join()
    assert not bad, bad[:3]
    assert len(seen) > 10 and seen == sorted(seen)
    assert len(os.listdir(segments.directory(store, GROUP))) == bin(400).count("1")


def test_a_merge_that_fails_is_recorded_and_loses_nothing_else(store, tmp_path):
    """A group whose fold another process has claimed is not merged meanwhile. A merged
    segment the writer cannot read back (damaged on disk) stops its merges: the failure is
    in the group's errors (what, where, why), the other segments stay as written, and the
    seal names the damaged one in what the store misses."""
    import dask.config

    with dask.config.set({"metacollect.store.segment-merge": 2}):
        claimed = str(tmp_path / "claimed.zarr")
        _, g = _run(claimed)
        segdir = segments.directory(claimed, GROUP)
        assert streams.claim(segdir, 0.0) is None  # another process folds it
        for f in range(3):
            _flush_events(g, 10 * f, 10)
        assert sorted(os.listdir(segdir)) == [
            *(segments.file_name(s) for s in range(3)),
            streams.CLAIM,
        ]

        _, g = _run(store)
        segdir = segments.directory(store, GROUP)
        for f in range(2):  # merged into segment 1, a flush's bytes merged as written
            _flush_events(g, 10 * f, 10)
        path = os.path.join(segdir, segments.file_name(1))
        data = bytearray(_bytes(path))
        data[len(data) // 2] ^= 0xFF
        with open(path, "wb") as f:
            f.write(bytes(data))
        for f in range(2, 4):  # 2 and 3 merge into 3, then 1 and 3 would: 1 is read back
            _flush_events(g, 10 * f, 10)
        assert g.flush() == 1  # the error's row
        for f in range(4, 7):
            _flush_events(g, 10 * f, 10)
        assert sorted(os.listdir(segdir)) == [segments.file_name(s) for s in (1, 3, 4, 5, 6, 7)]
    errors = open_run(store).errors()
    assert errors["where"].tolist() == ["merge segments"], errors
    assert "CRC-32" in errors.what.iloc[0]
    status, missing = finalize(store)
    assert status == "incomplete" and any(segments.file_name(1) in m for m in missing)
    events = open_run(store).table(GROUP, "events")
    assert events.time.tolist() == [float(i) for i in range(20, 70)]


def test_a_merged_segment_holds_its_parts_rows_bytes_joined_not_decoded(tmp_path):
    """A merge joins the parts' column bytes as they are (strings: their counts added):
    decoded, the merged segment is the parts' columns concatenated, a table only some parts
    hold included, and it says a string column may hold a blank string only where a part
    said so."""
    segdir = str(tmp_path)
    parts = [
        {
            "strings": {"value": np.array(["a", "", "b"], dtype=object)},
            "events": {"time": np.arange(2.0), "topic": np.array(["x", "y"], dtype=object)},
        },
        {"events": {"time": np.arange(2.0, 5.0), "topic": np.array(["z", "é", "w"], dtype=object)}},
        {
            "strings": {"value": np.array(["c"], dtype=object)},
            "metrics": {"value": np.arange(6, dtype=np.int32).reshape(3, 2)},
        },
    ]
    for seq, tables in enumerate(parts):
        segments.write(segdir, seq, segments.encode(tables))
    merged = segments.merge(segdir, [0, 1, 2], level=1)
    assert os.listdir(segdir) == [segments.file_name(2)]
    assert (merged.seq, merged.first, merged.head["level"]) == (2, 0, 1)
    tables = merged.tables
    assert tables["strings"]["value"].tolist() == ["a", "", "b", "c"]
    assert tables["events"]["time"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert tables["events"]["topic"].tolist() == ["x", "y", "z", "é", "w"]
    assert tables["metrics"]["value"].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert merged.may_hold_blank("strings", "value")
    assert not merged.may_hold_blank("events", "topic")
