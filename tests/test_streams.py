"""Arrow IPC streams: a table's flushes appended to one stream file while a run lasts.

These tests write tables of the schema through :class:`TableStream`, count the files,
cut a stream short at every byte of its last flush, kill a real writing process with
SIGKILL, and read everything back with pyarrow's own reader, compared with the rows the
test wrote.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import xarray as xr

from metacollect import open_run
from metacollect.check.validate import validate_store
from metacollect.session import init_root
from metacollect.session.end import finalize
from metacollect.store import arrowcols, streams
from metacollect.store.lifecycle import prepare_store
from metacollect.store.schema import load_schema
from metacollect.store.seal import fold_streams, seal_own
from metacollect.store.writer import GroupWriter, StoreWriter
from tests.test_store import CLUSTER_ATTRS

SCHEMA = load_schema()
GROUP = "clusters/c1/scheduler"
TRANSITIONS = SCHEMA.match("clusters/c1/scheduler").tables["transitions"]  # type: ignore[union-attr]
POSIX = SCHEMA.match("clusters/c1/workers/w/process").tables["posix"]  # type: ignore[union-attr]
TASKS = SCHEMA.match("clusters/c1/scheduler").tables["tasks"]  # type: ignore[union-attr]


def _transitions(first: int, n: int) -> dict[str, object]:
    """Rows ``first .. first+n`` of a transitions table: tuple keys as the scheduler holds
    them, a state that recurs, a worker that is sometimes missing."""
    return {
        "key": [("x", i) for i in range(first, first + n)],
        "start": ["released"] * n,
        "finish": ["waiting" if i % 2 else "processing" for i in range(first, first + n)],
        "time": np.arange(first, first + n, dtype=float),
        "stimulus_id": [f"s-{i // 3}" for i in range(first, first + n)],
        "worker": [None if i % 5 == 0 else f"tcp://w{i % 3}" for i in range(first, first + n)],
    }


def _expected(first: int, n: int) -> dict[str, list[object]]:
    rows = _transitions(first, n)
    return {
        "key": [str(k) for k in rows["key"]],  # type: ignore[attr-defined]
        "start": list(rows["start"]),  # type: ignore[call-overload]
        "finish": list(rows["finish"]),  # type: ignore[call-overload]
        "time": list(rows["time"]),  # type: ignore[call-overload]
        "stimulus_id": list(rows["stimulus_id"]),  # type: ignore[call-overload]
        "worker": list(rows["worker"]),  # type: ignore[call-overload]
    }


def _read_all(path: str) -> tuple[dict[str, list[object]], str | None]:
    found = streams.read(path)
    out: dict[str, list[object]] = {v: [] for v in TRANSITIONS.variables}
    for batch in found.batches:
        for name, col in streams.columns(batch, TRANSITIONS).items():
            out[name] += col.tolist()
    return out, found.torn


def test_flushes_append_to_one_file_and_read_back_as_written(tmp_path):
    where = str(tmp_path / ".streams")
    ts = streams.TableStream(where, TRANSITIONS, cache_size=1000)
    assert not os.path.exists(where)  # nothing made before the first flush
    for i in range(20):
        assert ts.write(_transitions(10 * i, 10)) == 10
        assert ts.path is not None  # no file made per flush
        assert os.listdir(where) == [os.path.basename(ts.path)]
    got, torn = _read_all(ts.path)  # a live stream: no end-of-stream marker yet
    assert torn is None
    assert got == _expected(0, 200)
    ts.close()
    got, torn = _read_all(ts.path)
    assert torn is None and got == _expected(0, 200)


def test_a_second_writer_of_a_table_gets_a_file_of_its_own(tmp_path):
    where = str(tmp_path / ".streams")
    first = streams.TableStream(where, TRANSITIONS, cache_size=1000)
    second = streams.TableStream(where, TRANSITIONS, cache_size=1000)
    first.write(_transitions(0, 5))
    second.write(_transitions(5, 5))
    first.write(_transitions(10, 5))
    files = streams.table_files(str(tmp_path), "")
    assert files == {"transitions": [first.path, second.path]}
    assert [_read_all(p)[0]["time"] for p in files["transitions"]] == [
        _expected(0, 5)["time"] + _expected(10, 5)["time"],
        _expected(5, 5)["time"],
    ]


def test_a_flush_landing_as_the_seal_removes_its_file_keeps_its_rows(tmp_path, monkeypatch):
    """The seal removes a stream file its tables hold (``retire``) while its writer may be
    flushing: the flush that passed its check that the file is still there is written
    before the removal, which moves it to a file of its own, never into a removed file."""
    import threading

    where = str(tmp_path / ".streams")
    ts = streams.TableStream(where, TRANSITIONS, cache_size=1000)
    ts.write(_transitions(0, 5))
    assert ts.path is not None
    first = ts.path
    counted = streams.batches(first)
    while True:  # what the seal read and wrote into the tables: one batch
        try:
            next(counted)
        except StopIteration as done:
            held, end = done.value
            break
    assert held == 1
    write_all = streams._write_all
    sealing: list[threading.Thread] = []

    def seal_meanwhile(fd: int, data: bytes) -> None:
        # the seal comes as the flush is past its check and before its bytes land; the
        # seal's own writes (its move of the late batch) may come before this stand-in is
        # taken away, and go straight through
        if sealing:
            write_all(fd, data)
            return
        sealing.append(threading.Thread(target=streams.retire, args=(first, held, end)))
        sealing[0].start()
        sealing[0].join(0.5)
        write_all(fd, data)

    monkeypatch.setattr(streams, "_write_all", seal_meanwhile)
    ts.write(_transitions(5, 5))
    monkeypatch.setattr(streams, "_write_all", write_all)
    sealing[0].join()
    assert not os.path.exists(first)
    (late,) = os.listdir(where)
    got, torn = _read_all(os.path.join(where, late))
    assert torn is None and got == _expected(5, 5)
    ts.write(_transitions(10, 5))  # the next flush: a file of its own, as after any seal
    assert sorted(os.listdir(where)) == sorted([late, os.path.basename(ts.path)])
    assert _read_all(ts.path)[0] == _expected(10, 5)


def test_strings_go_as_delta_dictionaries_and_a_full_cache_restarts(tmp_path):
    ts = streams.TableStream(str(tmp_path), TRANSITIONS, cache_size=25)
    for i in range(6):
        ts.write(_transitions(10 * i, 10))
    ts.close()
    with pa.ipc.open_stream(pa.OSFile(ts.path)) as reader:
        batches = list(reader)
        stats = reader.stats
    assert len(batches) == 6
    # the keys are new at every flush: each flush after the first sends them as a delta,
    # and past 25 strings the key column's dictionary starts again (a replacement)
    assert stats.num_dictionary_deltas > 0
    assert stats.num_replaced_dictionaries > 0
    key = batches[-1].column("key")
    assert len(key.dictionary) <= 25  # what a reader holds: one cache of the column's strings
    got, torn = _read_all(ts.path)
    assert torn is None and got == _expected(0, 60)


def test_a_stream_cut_at_any_byte_of_its_last_flush_keeps_the_flushes_before(tmp_path):
    ts = streams.TableStream(str(tmp_path), TRANSITIONS, cache_size=1000)
    ends = []
    for i in range(3):
        ts.write(_transitions(10 * i, 10))
        ends.append(os.path.getsize(ts.path))
    with open(ts.path, "rb") as f:
        data = f.read()
    cut_path = str(tmp_path / "cut.arrows")
    for cut in range(ends[1], ends[2] + 1):
        with open(cut_path, "wb") as f:
            f.write(data[:cut])
        got, torn = _read_all(cut_path)
        whole = 30 if cut == ends[2] else 20
        assert got == _expected(0, whole), cut
        assert (torn is None) == (cut in (ends[1], ends[2])), (cut, torn)
    for cut in range(0, ends[0]):  # cut within the first flush: no rows, and said so
        with open(cut_path, "wb") as f:
            f.write(data[:cut])
        got, torn = _read_all(cut_path)
        assert got == {v: [] for v in TRANSITIONS.variables} and torn, cut


def test_a_variable_with_a_second_dimension_reads_back_as_written(tmp_path):
    ts = streams.TableStream(str(tmp_path), POSIX, cache_size=100)
    rows = []
    for i in range(3):
        n = 4
        cols = {}
        for var in POSIX.variables.values():
            if var.dim2:
                cols[var.name] = np.arange(n * 7, dtype=var.numpy_dtype).reshape(n, 7) + i
            elif var.dtype in ("code", "str"):
                cols[var.name] = [f"{var.name}-{i}-{j}" for j in range(n)]
            else:
                cols[var.name] = np.arange(n, dtype=var.numpy_dtype) + i
        ts.write(cols)
        rows.append(cols)
    found = streams.read(ts.path)
    assert found.torn is None and len(found.batches) == 3
    group = streams.load(str(tmp_path.parent), tmp_path.name, {"posix": POSIX})
    group.files = {"posix": [ts.path]}
    layout = group.layout("posix")
    assert layout is not None and layout["counters"][1] == (12, 7)
    assert layout["id"] == (np.dtype(np.uint64), (12,))
    for batch, cols in zip(found.batches, rows, strict=True):
        got = streams.columns(batch, POSIX)
        for name, values in cols.items():
            if isinstance(values, np.ndarray):
                np.testing.assert_array_equal(got[name], values)
                assert got[name].dtype == values.dtype
            else:
                assert got[name].tolist() == values


_KILLED_WRITER = textwrap.dedent(
    """
    import sys
    from metacollect.store import arrowcols, streams
    from tests.test_streams import TRANSITIONS, _transitions

    ts = streams.TableStream(sys.argv[1], TRANSITIONS, cache_size=100_000)
    n = int(sys.argv[2])
    for i in range(10_000):
        ts.write(_transitions(i * n, n))
        print(i + 1, flush=True)  # flushes whole on disk
    """
)


@pytest.mark.parametrize("delay", [0.3, 0.7])
def test_a_sigkill_mid_flush_loses_at_most_the_flush_in_progress(tmp_path, delay):
    where = str(tmp_path / ".streams")
    n = 20_000  # a flush of ~20 ms: a kill lands mid-flush mostly
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, where, str(n)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert proc.stdout is not None
    done = 0
    start = time.monotonic()
    while done < 3 or time.monotonic() - start < delay:  # some flushes whole, then the kill
        line = proc.stdout.readline()
        assert line, "the writer ended before it was killed"
        done = int(line)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with proc.stdout:
        done = max([done, *(int(line) for line in proc.stdout.read().split())])
    (path,) = streams.table_files(str(tmp_path), "")["transitions"]
    got, torn = _read_all(path)
    flushes = len(got["time"]) // n
    assert len(got["time"]) == flushes * n  # whole flushes only
    assert done <= flushes <= done + 1  # each acknowledged flush, and at most the one going on
    assert got == _expected(0, flushes * n)  # in order, each row once, as written
    if torn is not None:
        assert "cut short" in torn


def test_a_groups_streams_read_table_by_table_and_name_the_torn(tmp_path):
    store = str(tmp_path)
    group = "clusters/c1/scheduler"
    spec = SCHEMA.match(group).tables  # type: ignore[union-attr]
    where = streams.directory(store, group)
    first = streams.TableStream(where, TRANSITIONS, cache_size=1000)
    second = streams.TableStream(where, TRANSITIONS, cache_size=1000)
    for i in range(4):
        (first if i % 2 else second).write(_transitions(10 * i, 10))
    assert streams.groups_with_streams(store) == [group]
    found = streams.load(store, group, spec)
    assert found.count("transitions") == 40
    assert found.blank == {"transitions": set()}
    layout = found.layout("transitions")
    assert layout is not None and {n: s for n, (_, s) in layout.items()} == {
        n: (40,) for n in TRANSITIONS.variables
    }
    assert found.check() == {}
    rows = found.rows("transitions")
    assert rows is not None and sorted(rows["time"].tolist()) == _expected(0, 40)["time"]
    assert found.rows("events") is None
    # the file made first (by the writer that flushed first) is read first; each
    # writer's rows in its own order
    assert streams.table_files(store, group)["transitions"][0] == second.path
    assert [p["time"][0] for p in found.parts("transitions")] == [0.0, 20.0, 10.0, 30.0]
    with open(second.path, "rb+") as f:  # its last flush cut short, as a kill leaves it
        f.truncate(os.path.getsize(second.path) - 5)
    found = streams.load(store, group, spec)
    assert found.count("transitions") == 30
    assert list(found.check()) == [second.path]


class _Labelled:
    """A value whose text is what the test says at the time: a code column takes a
    value's text at each flush, never one remembered from an earlier flush."""

    label = ""

    def __str__(self) -> str:
        return self.label


class _Text(str):
    pass


def _every_kind_of_key() -> list[object]:
    """Values a key column meets: Dask's key types, values equal to one another whose
    texts differ, no value, blank strings, text beyond ASCII, numpy scalars."""
    return [
        ("x", 1),
        ("x", 1.0),
        ("x", True),
        ("x", -0.0),
        ("x", 0.0),
        ("x", (1, 2)),
        ("x",),
        ("it's", 2),
        1,
        1.0,
        True,
        -0.0,
        0.0,
        2**70,
        float("inf"),
        b"k",
        b"'\\",
        "k",
        "('x', 1)",
        "1",
        None,
        float("nan"),
        "",
        "\0",
        "\0\0",
        "é",
        "日本",
        "\ud800",
        "a\ud83d\ude00b",
        np.int64(3),
        np.float64(3.0),
        _Text("sub"),
    ]


def _text(value: object) -> object:
    """What a code column reads back for ``value``: its ``str()`` (a lone surrogate, not
    UTF-8, as "?"), ``None`` for no value or NaN."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return str(value).encode("utf-8", "replace").decode()


def test_code_values_of_every_type_read_back_as_their_text(tmp_path):
    """Equal values of other types (``1``, ``1.0``, ``True``) keep their own texts, in one
    flush and across flushes; the same objects again, copies of them, and the same objects
    after the column's dictionary restarted read back the same; a value whose text
    changes is read with the text it had at its flush."""
    import pickle

    values = _every_kind_of_key()
    labelled = _Labelled()
    ts = streams.TableStream(str(tmp_path), TRANSITIONS, cache_size=60)
    flushes = [
        values,
        values[::-1],  # the same objects again: remembered
        [pickle.loads(pickle.dumps(v)) for v in values[:-1]],  # equal objects, new
        [("new", i) for i in range(50)],  # past the cache: the dictionary restarts
        values + values,  # the same objects, after the restart
    ]
    expected: list[object] = []
    for i, keys in enumerate(flushes):
        labelled.label = f"label-{i}"
        keys = [*keys, labelled]
        rows = _transitions(0, len(keys))
        rows["key"] = keys
        rows["worker"] = keys[::-1]
        ts.write(rows)
        expected += [_text(k) for k in keys]
    ts.close()
    with pa.ipc.open_stream(pa.OSFile(ts.path)) as reader:
        list(reader)
        assert reader.stats.num_replaced_dictionaries > 0
    got, torn = _read_all(ts.path)
    assert torn is None
    assert got["key"] == expected
    n = 0
    for keys in flushes:  # the worker column: each flush's keys the other way round
        m = len(keys) + 1
        assert got["worker"][n : n + m] == expected[n : n + m][::-1]
        n += m


def test_a_groups_streams_turn_each_key_object_into_text_once(tmp_path, monkeypatch):
    """The streams of a group share their memo of texts: a task key passed as one object
    to its transitions and its ``tasks`` row, over several flushes, is turned into text
    once; the rows read back exact."""
    made: list[object] = []
    texts_of = arrowcols.texts_of

    def counted(values):
        made.extend(v for v in values if isinstance(v, tuple))
        return texts_of(values)

    monkeypatch.setattr(arrowcols, "texts_of", counted)
    texts = arrowcols.Texts()
    transitions = streams.TableStream(str(tmp_path), TRANSITIONS, 1000, texts)
    tasks = streams.TableStream(str(tmp_path), TASKS, 1000, texts)
    keys = [("inc-0123456789abcdef", i) for i in range(40)]
    for first in (0, 20):
        rows = _transitions(0, 60)
        rows["key"] = [k for k in keys[first : first + 20] for _ in range(3)]
        transitions.write(rows)
        tasks.write(arrowcols.chunk_columns(TASKS, [(20, {"key": keys[first : first + 20]})]))
    assert sorted(made, key=keys.index) == keys  # each object once
    for ts in (transitions, tasks):
        ts.close()
    got, torn = _read_all(transitions.path)
    assert torn is None and got["key"] == [str(k) for k in keys for _ in range(3)]
    batches = streams.read(tasks.path).batches
    assert [k for b in batches for k in streams.columns(b, TASKS)["key"]] == list(map(str, keys))


def test_a_dictionary_restarts_past_its_bytes_and_the_memo_stays_bounded(tmp_path, monkeypatch):
    """A column's dictionary restarts when its text passes ``DICTIONARY_BYTES`` (a
    replacement dictionary in the stream, none larger than the bound), and the memo of
    texts holds at most ``MEMO_OBJECTS`` objects; every row reads back as written."""
    monkeypatch.setattr(arrowcols, "DICTIONARY_BYTES", 2000)
    monkeypatch.setattr(arrowcols, "MEMO_OBJECTS", 64)
    texts = arrowcols.Texts()
    ts = streams.TableStream(str(tmp_path), TRANSITIONS, 100_000, texts)
    expected = []
    for i in range(30):
        keys = [(f"a-task-name-{i}", j) for j in range(30)]
        rows = _transitions(0, 60)
        rows["key"] = keys + keys[::-1]
        ts.write(rows)
        expected += list(map(str, rows["key"]))  # type: ignore[call-overload]
        assert len(texts.known) <= 64
    ts.close()
    with pa.ipc.open_stream(pa.OSFile(ts.path)) as reader:
        batches = list(reader)
        assert reader.stats.num_replaced_dictionaries > 0
        assert reader.stats.num_dictionary_deltas > 0
    for batch in batches:
        dictionary = batch.column("key").dictionary
        assert len(dictionary) + len(dictionary.buffers()[2]) <= 2000
    got, torn = _read_all(ts.path)
    assert torn is None and got["key"] == expected


@pytest.mark.parametrize("cache_size", [100_000, 500])
def test_the_arrays_a_dictionary_gave_keep_their_strings_as_it_grows(cache_size):
    """A column's dictionary grows in place, past its first buffers, and restarts when
    full: every array it gave before (which the stream writer holds to find the next
    delta) still reads as the values it was given."""
    d = arrowcols.Dictionary(cache_size)
    given = []
    for i in range(300):
        values = [f"name-{i}-{j}" + "é" * (i % 3) for j in range(i % 13)] + ["", None, "x"]
        given.append((values, d.encode(values)))
    assert sum(len(v) for v, _ in given) > 1000
    for values, array in given:
        assert array.dictionary_decode().to_pylist() == values


def test_a_batch_says_which_columns_met_an_empty_string(tmp_path):
    ts = streams.TableStream(str(tmp_path), TRANSITIONS, cache_size=1000)
    ts.write(_transitions(0, 5))
    rows = _transitions(5, 5)
    rows["worker"] = ["", None, "\0", "tcp://w1", ""]
    ts.write(rows)
    ts.write(_transitions(10, 5))  # "" again: not new, not said again
    marks = [item[1] for item in streams.batches(ts.path) if not isinstance(item, str)]
    assert marks == [frozenset(), frozenset({"worker"}), frozenset()]
    got, _ = _read_all(ts.path)
    assert got["worker"][5:10] == ["", None, "\0", "tcp://w1", ""]


def test_the_seal_writes_a_groups_streams_as_plain_zarr_tables(tmp_path):
    """A group whose rows are all in its streams is sealed into tables that plain xarray
    opens, equal to the rows written, strings as strings and no value as no value; the
    streams are removed and a torn one is named with its whole flushes kept."""
    store = str(tmp_path / "run.zarr")
    prepare_store(store)
    w = StoreWriter(store)
    init_root(w, "r1")
    w.group("cluster", attrs=CLUSTER_ATTRS, cluster="c1")
    w.group("scheduler", cluster="c1")
    where = streams.directory(store, GROUP)
    ts = streams.TableStream(where, TRANSITIONS, cache_size=50)  # restarts: replacements
    for i in range(30):
        rows = _transitions(10 * i, 10)
        if i == 7:
            rows["worker"] = ["", None, "\0", *rows["worker"][3:]]  # type: ignore[index]
        ts.write(rows)
    expected = _expected(0, 300)
    expected["worker"][70:73] = ["", None, "\0"]
    other = streams.TableStream(where, TRANSITIONS, cache_size=50)
    other.write(_transitions(300, 10))
    other.write(_transitions(310, 10))
    assert other.path is not None
    with open(other.path, "rb+") as f:  # its second flush cut short by a kill
        f.truncate(os.path.getsize(other.path) - 3)
    expected = {n: v + _expected(300, 10)[n] for n, v in expected.items()}

    (problem,) = validate_store(store)
    assert f"stream {os.path.basename(other.path)} is torn" in problem
    live = open_run(store).table(GROUP, "transitions")  # read from the streams, before the seal
    assert live.key.tolist() == expected["key"]
    assert [None if v is None or v != v else v for v in live.worker] == expected["worker"]
    assert live.time.tolist() == [float(t) for t in expected["time"]]
    status, missing = finalize(store)
    assert status == "incomplete"
    (line,) = missing
    assert f"{os.path.basename(other.path)} is torn" in line
    assert streams.table_files(store, GROUP) == {}
    assert validate_store(store) == []
    ds = xr.open_datatree(store, engine="zarr")[f"{GROUP}/transitions"].to_dataset()
    assert ds.sizes["transition"] == 310
    assert [None if v is None else str(v) for v in ds["key"].values] == expected["key"]
    assert ds["finish"].values.tolist() == expected["finish"]
    assert ds["stimulus_id"].values.tolist() == expected["stimulus_id"]
    run = open_run(store)
    got = run.table(GROUP, "transitions")
    assert [None if v is None or v != v else v for v in got.worker] == expected["worker"]
    assert got.time.tolist() == [float(t) for t in expected["time"]]
    # a stream written after the seal (a flush that outran the run's end) is named by
    # validate, and readers of the sealed record do not read it
    streams.TableStream(where, TRANSITIONS, cache_size=50).write(_transitions(999, 2))
    assert any("left in a sealed store" in p for p in validate_store(store))
    assert open_run(store).table(GROUP, "transitions").equals(got)


def test_streams_of_a_group_the_schema_does_not_know_are_named(tmp_path):
    store = str(tmp_path / "run.zarr")
    prepare_store(store)
    init_root(StoreWriter(store), "r1")
    where = streams.directory(store, "elsewhere")
    streams.TableStream(where, TRANSITIONS, cache_size=10).write(_transitions(0, 3))
    folded = fold_streams(store)
    assert folded.groups == []
    assert folded.lost == ["elsewhere: streams of no group of this version's schema"]


def test_a_write_that_fails_keeps_the_stream_whole_and_the_next_goes_to_a_new_file(
    tmp_path, monkeypatch
):
    """A flush whose write fails half-way (a full disk) leaves the file at its last whole
    batch; the caller writes the rows again, into a new file: each row once, in order."""
    ts = streams.TableStream(str(tmp_path / ".streams"), TRANSITIONS, cache_size=1000)
    ts.write(_transitions(0, 10))
    real = os.write

    def half(fd, data):
        real(fd, bytes(data)[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half)
    with pytest.raises(OSError):
        ts.write(_transitions(10, 10))
    monkeypatch.setattr(os, "write", real)
    ts.write(_transitions(10, 10))  # the rows kept, written again
    ts.write(_transitions(20, 10))
    files = streams.table_files(str(tmp_path), "")["transitions"]
    assert len(files) == 2
    found = [_read_all(p) for p in files]
    assert [torn for _, torn in found] == [None, None]
    assert found[0][0]["time"] + found[1][0]["time"] == _expected(0, 30)["time"]
    assert found[1][0]["key"] == _expected(10, 20)["key"]  # its dictionary sent whole again


def test_a_flush_after_the_seal_removed_its_stream_goes_to_a_new_file(tmp_path):
    ts = streams.TableStream(str(tmp_path / ".streams"), TRANSITIONS, cache_size=1000)
    ts.write(_transitions(0, 10))
    assert ts.path is not None
    os.remove(ts.path)  # what the run's seal does once it has written it into the tables
    ts.write(_transitions(10, 10))
    (path,) = streams.table_files(str(tmp_path), "")["transitions"]
    assert _read_all(path) == (_expected(10, 10), None)


def _flush_events(g, first: int, n: int) -> None:
    g.append(
        "events",
        {
            "time": np.arange(first, first + n, dtype=float),
            "topic": [f"topic-{i % 7}" for i in range(first, first + n)],
            "msg": [f"m{i}" for i in range(first, first + n)],
        },
    )
    g.append("transitions", _transitions(first, n))
    assert g.flush() == 2 * n


def _run(store: str) -> tuple[StoreWriter, GroupWriter]:
    """A store's writer (its defaults, as a collector makes it) and its scheduler group."""
    prepare_store(store)
    w = StoreWriter(store)
    init_root(w, "r1")
    w.group("cluster", attrs=CLUSTER_ATTRS, cluster="c1")
    return w, w.group("scheduler", cluster="c1")


def _files(store: str) -> set[str]:
    return {
        os.path.relpath(os.path.join(d, f), store) for d, _, files in os.walk(store) for f in files
    }


def _scheduler_group(tmp_path: Any) -> tuple[str, StoreWriter, GroupWriter]:
    """A new store with run r1, a cluster c1 and its scheduler's group, written to streams."""
    store = str(tmp_path / "run.zarr")
    prepare_store(store)
    w = StoreWriter(store)
    init_root(w, "r1")
    w.group("cluster", attrs=CLUSTER_ATTRS, cluster="c1")
    return store, w, w.group("scheduler", cluster="c1")


@pytest.mark.parametrize("own_seal", [False, True])
def test_a_writers_flushes_go_to_its_streams_read_live_and_sealed_as_plain_zarr(tmp_path, own_seal):
    """A group's writer appends each flush to one stream a table: no file made after a
    table's first flush; readers see the rows before the seal; the seal (the process's own,
    or the run's) leaves plain Zarr, no stream, as many files as a store flushed once."""
    store, w, g = _scheduler_group(tmp_path)
    _flush_events(g, 0, 100)
    before = _files(store)
    assert {
        os.path.basename(f).partition(".")[0] for f in before if f.endswith(streams.SUFFIX)
    } == {
        "events",
        "transitions",
    }
    flushes = 12
    for f in range(1, flushes):
        _flush_events(g, 100 * f, 100)
        assert _files(store) == before  # no file made by a flush after the first
    run = open_run(store)
    events = run.table(GROUP, "events")
    assert events.msg.tolist() == [f"m{i}" for i in range(100 * flushes)]
    assert events.topic.tolist() == [f"topic-{i % 7}" for i in range(100 * flushes)]
    live = run.transitions()
    assert live.key.tolist() == _expected(0, 100 * flushes)["key"]
    assert validate_store(store) == []
    if own_seal:
        seal_own(w)
        assert streams.table_files(store, GROUP) == {}
    status, missing = finalize(store)
    assert (status, missing) == ("complete", [])
    assert streams.groups_with_streams(store) == []
    tree = xr.open_datatree(store, engine="zarr")
    ds = tree[f"{GROUP}/events"].ds
    assert ds.sizes["event"] == 100 * flushes
    assert list(ds["msg"].values[:3]) == ["m0", "m1", "m2"]
    sealed = open_run(store)
    assert sealed.table(GROUP, "events").equals(events)
    got = sealed.table(GROUP, "transitions")
    assert got.key.tolist() == live.key.tolist()
    assert [None if v is None or v != v else v for v in got.worker] == _expected(0, 100 * flushes)[
        "worker"
    ]
    assert validate_store(store) == []
    one = str(tmp_path / "one.zarr")  # as many files as a store written in one flush
    prepare_store(one)
    w1 = StoreWriter(one)
    init_root(w1, "r1")
    w1.group("cluster", attrs=CLUSTER_ATTRS, cluster="c1")
    _flush_events(w1.group("scheduler", cluster="c1"), 0, 100 * flushes)
    finalize(one)
    assert len(_files(store)) == len(_files(one))


_FLUSHING_WRITER = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from metacollect.session import init_root
    from metacollect.store.writer import GroupWriter, StoreWriter

    w = StoreWriter(sys.argv[1])
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
        time.sleep(0.002)
    """
)


def test_a_process_killed_mid_run_loses_nothing_flushed(tmp_path):
    """SIGKILL a real process that flushes a store in a loop; the seal of what it left (as
    ``metacollect batch finalize`` does) writes its streams: every row of every flush that
    returned before the kill is in the sealed store, in order, at most the flush in progress
    more, and it validates."""
    store = str(tmp_path / "run.zarr")
    prepare_store(store)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _FLUSHING_WRITER, store, json.dumps(CLUSTER_ATTRS)],
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
    with proc.stdout:
        rest = proc.stdout.read().split()
    flushed = int(rest[-1]) if rest else flushed
    status, _ = finalize(store, "incomplete")
    assert status == "incomplete"
    assert streams.groups_with_streams(store) == []
    msgs = open_run(store).table(GROUP, "events").msg.tolist()
    assert flushed <= len(msgs) <= flushed + 50
    assert msgs == [f"m{i}" for i in range(len(msgs))]
    assert validate_store(store) == []


@pytest.mark.parametrize("during", [False, True], ids=["after-removal", "while-writing"])
def test_a_flush_that_ends_during_the_seal_makes_the_run_incomplete(tmp_path, monkeypatch, during):
    """A writer of the run may flush while the store is being sealed (the run's lock is
    held until the seal is done): a flush after the seal wrote and removed the group's
    streams goes to new streams, its rows are not in the sealed tables, and the run says
    so; and so does a flush that lands while the seal writes the tables from what it read:
    the seal moves the batches past those into a stream of their own."""
    from metacollect.session import end
    from metacollect.store import seal as seal_mod

    store, _, g = _scheduler_group(tmp_path)
    _flush_events(g, 0, 10)
    if during:
        real_write = seal_mod._write_streamed

        def write_then_a_late_flush(*args, **kwargs):
            real_write(*args, **kwargs)
            _flush_events(g, 100, 5)  # after the seal read the streams, before it removes them

        monkeypatch.setattr(seal_mod, "_write_streamed", write_then_a_late_flush)
    else:
        real = end.fold_streams

        def fold_then_a_late_flush(*args, **kwargs):
            done = real(*args, **kwargs)
            _flush_events(g, 100, 5)  # after the seal wrote and removed the group's streams
            return done

        monkeypatch.setattr(end, "fold_streams", fold_then_a_late_flush)
    status, missing = finalize(store, "complete")
    assert status == "incomplete"
    (line,) = missing
    assert line.startswith(f"{GROUP}: a flush ended while the store was being sealed (stream ")
    assert "events." in line and "transitions." in line
    run = open_run(store)
    assert run.attrs["status"] == "incomplete" and run.attrs["missing"] == missing
    assert run.table(GROUP, "events").msg.tolist() == [f"m{i}" for i in range(10)]
    problems = validate_store(store)
    assert any(p.startswith(f"{GROUP}: 2 stream(s) left in a sealed store") for p in problems)
    assert xr.open_datatree(store, engine="zarr").attrs["status"] == "incomplete"
    # the late rows are kept, each once, in the streams left (for `metacollect doctor`)
    spec = SCHEMA.match(GROUP).tables  # type: ignore[union-attr]
    left = streams.GroupStreams(store, GROUP, spec, streams.table_files(store, GROUP))
    late = left.rows("events")
    assert late is not None and late["msg"].tolist() == [f"m{i}" for i in range(100, 105)]
