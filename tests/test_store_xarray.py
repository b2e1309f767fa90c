"""A sealed store read by plain xarray (no metacollect), and what the seal writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import zarr
from distributed import Client, LocalCluster
from test_store import CLUSTER_ATTRS

import metacollect.store.layout as layout
import metacollect.store.seal as seal_mod
import metacollect.store.text as text
from metacollect import collect, open_run
from metacollect.check.doctor import salvage
from metacollect.check.validate import validate_store
from metacollect.session import init_root
from metacollect.session.end import finalize
from metacollect.store import chunkio, streams
from metacollect.store.lifecycle import prepare_store
from metacollect.store.writer import StoreWriter

#: run in a fresh interpreter: what a user without metacollect sees of a store
PLAIN_XARRAY = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("error")  # xarray must decode the store without a warning
    import xarray as xr
    tree = xr.open_datatree(sys.argv[1], engine="zarr")
    out = {"imported": "metacollect" in sys.modules, "vars": {}, "values": {}}
    for node in tree.subtree:
        for name, var in node.ds.data_vars.items():
            where = f"{node.path.strip('/')}/{name}"
            out["vars"][where] = {
                "kind": var.dtype.kind,
                # xarray moves the CF units of a time it decoded into its encoding
                "units": var.attrs.get("units", var.encoding.get("units")),
                "long_name": var.attrs.get("long_name"),
                "none_value": var.attrs.get("none_value"),
            }
            if var.ndim == 1 and var.dtype.kind in "MOTU":
                values = var.values
                if var.dtype.kind == "M":
                    # ns since the epoch (NaT: int64's min), whatever resolution xarray chose
                    values = values.astype("datetime64[ns]").astype("int64").tolist()
                else:
                    values = [v if isinstance(v, str) else None for v in values.tolist()]
                out["values"][where] = values
    print(json.dumps(out))
    """
)


def plain_xarray(store: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_XARRAY, store],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=os.path.dirname(store),
    )
    return json.loads(done.stdout)


def check_against_reader(store: str) -> dict:
    """Everything plain xarray reads of ``store`` is what metacollect's reader reads."""
    seen = plain_xarray(store)
    assert not seen["imported"]
    run = open_run(store)
    schema = run.schema
    checked = {"times": 0, "codes": 0}
    for where, info in seen["vars"].items():
        assert info["units"], f"{where} has no units"
        assert info["long_name"], f"{where} has no long_name"
        group, table, name = (
            where.rsplit("/", 2) if where.count("/") >= 2 else ("", *where.split("/"))
        )
        spec = schema.match(group)
        var = spec.tables[table].variables[name]
        if var.unit == "s":  # a duration: numbers, never times
            assert info["kind"] == "f", where
        if where not in seen["values"]:
            continue
        frame = run.table(group, table, [name])
        mine = frame[name]
        theirs = seen["values"][where]
        if info["kind"] == "M":
            expected = pd.to_datetime(mine.to_numpy(), unit="s").to_numpy()
            expected = expected.astype("datetime64[ns]").astype("int64")
            got = np.asarray(theirs, dtype=np.int64)
            nat = np.iinfo(np.int64).min
            assert ((expected == nat) == (got == nat)).all(), where
            assert np.abs(expected - got)[got != nat].max(initial=0) <= 1000, where  # <= 1 us
            checked["times"] += 1
        elif var.dtype == "code":
            # a column holding "" as well writes "no value" as its none_value ("\0")
            none = info["none_value"]
            assert mine.tolist() == [None if v == none else v for v in theirs], where
            checked["codes"] += 1
    return checked


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("xr") / "run.zarr")
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        collect(client, path, flush_interval="0.2s"),
    ):
        x = da.random.RandomState(0).random((400, 400), chunks=50)
        dask.compute((x + 1).sum(), (x @ x.T).mean())
    return path


def test_a_collected_run_reads_with_plain_xarray(collected):
    checked = check_against_reader(collected)
    assert checked["times"] >= 10 and checked["codes"] >= 20
    assert validate_store(collected) == []
    tasks = open_run(collected).tasks()
    assert tasks["prefix"].notna().all() and tasks["worker"].str.startswith("tcp://").all()


def test_the_sealed_store_has_no_strings_tables_and_large_chunks(collected):
    for dirpath, dirs, _ in os.walk(collected):
        assert "strings" not in dirs, dirpath
        assert not any(d.endswith(seal_mod.NEW) for d in dirs)


def _many_flushes(store: str, flushes: int, rows: int) -> StoreWriter:
    prepare_store(store)
    w = StoreWriter(store)
    init_root(w, "r1")
    w.group("cluster", attrs=CLUSTER_ATTRS, cluster="c1")
    g = w.group("scheduler", cluster="c1")
    for f in range(flushes):
        lo = f * rows
        g.append(
            "transitions",
            {
                "key": [f"('x', {i})" for i in range(lo, lo + rows)],
                "start": ["released"] * rows,
                "finish": ["waiting"] * rows,
                "time": 1.7e9 + np.arange(lo, lo + rows, dtype=float),
                "stimulus_id": [f"s{i % 7}" for i in range(lo, lo + rows)],
                "worker": [None if i % 3 else "" for i in range(lo, lo + rows)],
            },
        )
        g.flush()
    return w


def _files(path: str) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


def test_files_of_a_sealed_table_grow_with_rows_not_flushes(tmp_path):
    store = str(tmp_path / "s.zarr")
    _many_flushes(store, flushes=200, rows=500)  # 100k rows: one chunk, none of it padding
    table = os.path.join(store, "clusters/c1/scheduler/transitions")
    # during the run, one stream file per table of the group (all its flushes), none in
    # the table's arrays
    (stream,) = streams.table_files(store, "clusters/c1/scheduler")["transitions"]
    assert os.listdir(os.path.dirname(stream)) == [os.path.basename(stream)]
    finalize(store)
    arrays = 6
    assert _files(table) == 1 + arrays * (1 + 1)  # zarr.json of the table, each array's
    assert {a.chunks for _, a in zarr.open_group(table, mode="r").arrays()} == {(100_000,)}
    assert not os.path.exists(os.path.join(store, "clusters/c1/scheduler/.streams"))
    tr = open_run(store).transitions()
    assert len(tr) == 100_000
    # no value and an empty string stay apart through the seal
    assert tr.worker.iloc[0] == "" and tr.worker.iloc[1:3].isna().all()
    assert validate_store(store) == []
    check_against_reader(store)


def _arrays(store: str, table: str) -> dict[str, np.ndarray]:
    group = zarr.open_group(os.path.join(store, table), mode="r")
    return {name: arr[:] for name, arr in group.arrays()}


def test_a_large_table_sealed_a_few_chunks_at_a_time_holds_what_was_appended(tmp_path, monkeypatch):
    """The seal writes a large table's arrays a block of chunks at a time, from its
    streams' batches (never a whole column in memory): the rows read back are the rows
    appended, and the arrays hold what the seal of the table in one piece writes."""
    flushes, rows = 200, 37  # batches of 37 rows: parts that straddle every block
    whole, blocks = str(tmp_path / "whole.zarr"), str(tmp_path / "blocks.zarr")
    _many_flushes(whole, flushes, rows)
    finalize(whole)
    monkeypatch.setattr(layout, "COMPACT_ROWS", 1000)  # 7 chunks of 1,058 rows ...
    monkeypatch.setattr(layout, "BLOCK_CHUNKS", 3)  # ... written 3 at a time
    _many_flushes(blocks, flushes, rows)
    finalize(blocks)
    table = "clusters/c1/scheduler/transitions"
    assert _files(os.path.join(blocks, table)) == 1 + 6 * (1 + 7)
    streamed, one_piece = _arrays(blocks, table), _arrays(whole, table)
    assert (
        set(streamed)
        == set(one_piece)
        == {
            "key",
            "start",
            "finish",
            "time",
            "stimulus_id",
            "worker",
        }
    )
    for name, values in one_piece.items():
        assert np.array_equal(streamed[name], values), name
    n = flushes * rows
    tr = open_run(blocks).transitions()
    assert tr.key.tolist() == [f"('x', {i})" for i in range(n)]
    assert tr.stimulus_id.tolist() == [f"s{i % 7}" for i in range(n)]
    assert tr.worker.tolist() == [None if i % 3 else "" for i in range(n)]
    assert np.array_equal(streamed["time"], 1.7e9 + np.arange(n))
    assert validate_store(blocks) == []
    check_against_reader(blocks)


def test_strings_read_off_their_chunk_files_are_what_zarr_reads(tmp_path):
    """Readers decode a local array of strings from its chunk files themselves (Zarr packs
    them into numpy strings first): any rows give what Zarr gives, for arrays written by
    Zarr itself; a chunk whose CRC32C no longer matches is named as damaged; an array with
    codecs metacollect does not write is read by Zarr."""
    from zarr.codecs import Crc32cCodec, GzipCodec, ZstdCodec

    from metacollect.errors import StoreError

    values = np.array(
        [f"('x-\u00e9\u4e2d', {i})" if i % 5 else ("" if i % 2 else "\0") for i in range(2500)],
        dtype=object,
    )
    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=3)
    ours = root.create_array(
        "ours",
        shape=(3000,),  # the last 500 rows were never written: the fill value
        chunks=(1000,),
        dtype=str,
        compressors=[ZstdCodec(level=3), Crc32cCodec()],
        fill_value="",
    )
    ours[:2500] = values
    other = root.create_array(
        "other", shape=(2500,), chunks=(1000,), dtype=str, compressors=[GzipCodec()]
    )
    other[:] = values
    assert chunkio.chunk_decoder(ours) is not None and chunkio.chunk_decoder(other) is None
    for lo, hi in [(0, 2500), (0, 1), (999, 1001), (1500, 2500), (2400, 3000), (1000, 2000)]:
        got = chunkio.read_slice(ours, lo, hi)
        assert got.dtype == object and got.tolist() == list(ours[lo:hi]), (lo, hi)
        assert chunkio.read_slice(other, lo, min(hi, 2500)).tolist() == values[lo:hi].tolist()
    chunk = tmp_path / "s.zarr" / "ours" / "c" / "1"
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 0xFF  # the stored CRC32C: the chunk itself still decodes
    chunk.write_bytes(bytes(data))
    assert chunkio.read_slice(ours, 0, 1000).tolist() == values[:1000].tolist()
    with pytest.raises(StoreError, match=r"array ours is damaged: rows 500..1499 do not decode"):
        chunkio.read_slice(ours, 500, 1500)


@pytest.mark.parametrize(
    "dtype", ["float64", "int64", "int32", "bool", ">i8", "<f4"], ids=lambda d: f"dtype={d}"
)
def test_numbers_read_off_their_chunk_files_are_what_zarr_reads(tmp_path, dtype):
    """Readers decode a local array of numbers from its chunk files themselves, with the
    codecs metacollect writes (raw bytes, Blosc, a CRC32C): any rows give what Zarr gives,
    in either byte order, as an array the caller may change; a chunk whose CRC32C no longer
    matches, or that is gone, is named as damaged; other codecs are read by Zarr."""
    from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec

    from metacollect.errors import StoreError
    from metacollect.store import zarrio

    rng = np.random.default_rng(7)
    values = (rng.random(2500) * 1e6).astype(dtype) if dtype != "bool" else rng.random(2500) > 0.5
    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=3)
    order = "big" if dtype.startswith(">") else "little"
    ours = root.create_array(
        "ours",
        shape=(3000,),  # the last 500 rows were never written: the fill value
        chunks=(1000,),
        dtype=values.dtype,
        serializer=BytesCodec(endian=order),
        compressors=zarrio.codecs("numeric", 3),
        fill_value=0,
    )
    ours[:2500] = values
    other = root.create_array(
        "other", shape=(2500,), chunks=(1000,), dtype=values.dtype, compressors=[GzipCodec()]
    )
    other[:] = values
    assert isinstance(ours.metadata.codecs[1], BloscCodec)
    assert isinstance(ours.metadata.codecs[2], Crc32cCodec)
    assert chunkio.chunk_decoder(ours) is not None and chunkio.chunk_decoder(other) is None
    for lo, hi in [(0, 2500), (0, 1), (999, 1001), (1500, 2500), (2400, 3000), (1000, 2000)]:
        got = chunkio.read_slice(ours, lo, hi)
        assert got.dtype == np.dtype(dtype).newbyteorder("=") and got.dtype.isnative
        assert np.array_equal(got, ours[lo:hi]), (lo, hi)
        assert np.array_equal(chunkio.read_slice(other, lo, min(hi, 2500)), values[lo:hi])
    got[:1] = got[1:2]  # the caller's to change, as Zarr's arrays are
    chunk = tmp_path / "s.zarr" / "ours" / "c" / "1"
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 0xFF  # the stored CRC32C: the chunk itself still decodes
    chunk.write_bytes(bytes(data))
    assert np.array_equal(chunkio.read_slice(ours, 0, 1000), values[:1000])
    with pytest.raises(StoreError, match=r"array ours is damaged: rows 500..1499 do not decode"):
        chunkio.read_slice(ours, 500, 1500)
    chunk.unlink()
    with pytest.raises(StoreError, match=r"array ours is damaged: its chunk c/1 is missing"):
        chunkio.read_slice(ours, 500, 2500)


def _sealed_workers(store: str, workers: list) -> tuple[dict, list]:
    """A store whose scheduler wrote ``workers`` as its transitions' worker column, sealed:
    the column's array attributes and what the reader reads of it."""
    prepare_store(store)
    w = StoreWriter(store)
    init_root(w, "r1")
    g = w.group("scheduler", cluster="c1")
    n = len(workers)
    g.append("transitions", {"key": [f"k{i}" for i in range(n)], "worker": workers})
    g.flush()
    finalize(store)
    attrs = dict(zarr.open_array(f"{store}/clusters/c1/scheduler/transitions/worker").attrs)
    return attrs, open_run(store).transitions().worker.tolist()


def test_empty_and_nul_strings_stay_apart_from_no_value_through_the_seal(tmp_path):
    """A code column holding "" and "\0" writes no value as a string of NULs it does not
    hold, and reads each back as it was (numpy's own strings would find "\0" equal to "");
    without "" in the column, no value is "" itself, marked as CF's missing value."""
    expected = ["", None, "\0", "a", None, ""]
    attrs, got = _sealed_workers(str(tmp_path / "a.zarr"), expected)
    assert attrs[text.NONE_ATTR] == "\0\0" and "missing_value" not in attrs
    assert got == expected
    attrs, got = _sealed_workers(str(tmp_path / "b.zarr"), [None, "\0", "a", None])
    assert attrs[text.NONE_ATTR] == "" and attrs["missing_value"] == ""
    assert got == [None, "\0", "a", None]


def test_no_value_says_what_pandas_isna_says_of_strings():
    """The seal tells missing strings apart without pandas (a worker sealing its own group
    never imports it): ``None`` and NaN are no value; "", "\\0", "nan" and "None" are
    strings; any shape."""
    values = np.array(["", "\0", "nan", "None", None, float("nan"), "a", None], dtype=object)
    for data in (values, values.reshape(4, 2), values[:0]):
        assert text.no_value(data).tolist() == pd.isna(data).tolist()
        assert text.no_value(data).dtype == bool


def test_a_seal_killed_mid_table_is_finished_by_the_next_seal_and_the_doctor(tmp_path, monkeypatch):
    """A seal killed once a table was written beside its place, before it was renamed into
    it: the doctor salvages the store (read only) whole from its streams, and sealing again
    writes the table anew."""
    store = str(tmp_path / "s.zarr")
    _many_flushes(store, flushes=5, rows=100)
    expected = open_run(store).transitions()
    real = seal_mod.write_sealed_stream

    async def killed(root, group, tables, parts, strings, where, done, **kwargs):
        def dies(table: str) -> None:  # the table whole beside its place; then the kill
            raise RuntimeError("killed mid-seal")

        return await real(root, group, tables, parts, strings, where, dies, **kwargs)

    monkeypatch.setattr(seal_mod, "write_sealed_stream", killed)
    with pytest.raises(Exception, match="killed mid-seal"):
        finalize(store)
    monkeypatch.undo()
    table = os.path.join(store, "clusters/c1/scheduler/transitions")
    assert os.path.exists(table + seal_mod.NEW) and not os.path.exists(table)
    # the doctor salvages the half-sealed store (read only) whole
    fixed = salvage(store, str(tmp_path / "fixed.zarr"))
    assert fixed.rows_dropped == 0
    pd.testing.assert_frame_equal(open_run(fixed.target).transitions(), expected)
    check_against_reader(fixed.target)
    # sealing again writes the table
    finalize(store)
    assert not os.path.exists(table + seal_mod.NEW)
    pd.testing.assert_frame_equal(open_run(store).transitions(), expected)
    assert validate_store(store) == []
    check_against_reader(store)


def _late_rows(w: StoreWriter) -> None:
    g = w.group("scheduler", cluster="c1")
    g.append(
        "transitions",
        {
            "key": ["late", None],
            "start": ["a", "b"],
            "finish": ["c", ""],
            "time": [1.8e9, 1.8e9 + 1],
            "stimulus_id": ["x", "y"],
            "worker": [None, ""],
        },
    )
    assert g.flush() == 2


def test_a_writer_after_the_seal_appends_strings_and_the_next_seal_holds_them(tmp_path):
    """``metacollect ingest`` writes into a sealed store: its rows go to streams, and the
    seal it ends with appends them to the sealed arrays as strings (zarr's
    ``Array.append``). Plain xarray reads it back exactly as a store that had all the
    rows at its one seal."""
    store = str(tmp_path / "s.zarr")
    _many_flushes(store, flushes=2, rows=10)
    finalize(store)
    _late_rows(StoreWriter(store))
    finalize(store)
    once = str(tmp_path / "once.zarr")
    _late_rows(_many_flushes(once, flushes=2, rows=10))
    finalize(once)
    assert plain_xarray(store)["values"] == plain_xarray(once)["values"]
    pd.testing.assert_frame_equal(open_run(store).transitions(), open_run(once).transitions())
    tail = open_run(store).transitions().tail(2)
    assert tail.key.tolist() == ["late", None] and tail.finish.tolist() == ["c", ""]
    assert tail.worker.tolist() == [None, ""]
    assert validate_store(store) == []
    assert not os.path.exists(os.path.join(store, "clusters/c1/scheduler/strings"))
    check_against_reader(store)
