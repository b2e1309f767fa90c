"""``metacollect doctor``: a damaged or unsealed store salvaged into a new, valid one that keeps
every row that decodes - each kept row as it was - says what it dropped, and leaves the source
as it was."""

from __future__ import annotations

import collections
import hashlib
import os
import shutil

import pytest
from test_damaged_stores import (  # noqa: F401 - fixtures
    APPENDED,
    DAMAGES,
    appended_store,
    good_store,
)
from test_faults import _start_and_kill

from metacollect import open_run
from metacollect.check.doctor import salvage
from metacollect.check.validate import validate_store
from metacollect.cli import main


def _digest(store):
    h = hashlib.sha256()
    for d, dirs, files in sorted(os.walk(store)):
        dirs.sort()
        for f in sorted(files):
            h.update(os.path.join(d, f).encode())
            with open(os.path.join(d, f), "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


def _tables(store):
    """Every table of every group, as rows (tuples of plain values), by ``group/table``."""
    run = open_run(store)
    out = {}
    for path in sorted(run.groups):
        spec = run.schema.match(path)
        for table in spec.tables if spec is not None else ():
            df = run.table(path, table)
            rows = [tuple(map(_plain, r)) for r in df.itertuples(index=False, name=None)]
            out[f"{path}/{table}" if path else table] = rows
    return out


def _plain(v):
    if isinstance(v, float) and v != v:
        return "nan"
    return tuple(v) if hasattr(v, "__len__") and not isinstance(v, str) else v


def _check_salvaged(source_rows, target, report):
    """The new store validates, every row it keeps is a row of the source, and the report's
    counts are what the new store holds."""
    assert validate_store(target) == []
    run = open_run(target)
    assert run.attrs["status"] == "incomplete"
    said = report.missing()
    # then what the seal finds itself: workers of a killed run that never took their final
    # flush (what they did after their last one is in neither store)
    assert run.attrs["missing"][: len(said)] == said
    assert all("never took its final flush" in m for m in run.attrs["missing"][len(said) :])
    got = _tables(target)
    for where, rows in got.items():
        assert not collections.Counter(rows) - collections.Counter(source_rows.get(where, [])), (
            where
        )
        assert report.kept.get(where, 0) == len(rows), where
    return got


def test_an_undamaged_store_is_copied_row_for_row(good_store, tmp_path):  # noqa: F811
    before = _digest(good_store)
    target = str(tmp_path / "copy.zarr")
    report = salvage(good_store, target)
    assert report.rows_dropped == 0 and report.missing() == []
    got = _check_salvaged(_tables(good_store), target, report)
    assert got == {k: v for k, v in _tables(good_store).items() if k in got}
    assert all(not rows for k, rows in _tables(good_store).items() if k not in got)
    attrs = open_run(target).attrs
    assert attrs["salvaged_from"]["status"] == "complete"
    assert attrs["run_id"] == open_run(good_store).attrs["run_id"]
    assert _digest(good_store) == before


@pytest.mark.parametrize("name, damage", DAMAGES, ids=[n for n, _ in DAMAGES])
def test_a_damaged_store_keeps_every_row_that_decodes(name, damage, request, tmp_path):
    # damage to arrays grown after a seal is done to a store with rows appended after it
    original = request.getfixturevalue("appended_store" if name in APPENDED else "good_store")
    source = str(tmp_path / "damaged.zarr")
    shutil.copytree(original, source)
    damage(source)
    before = _digest(source)
    good = _tables(original)
    target = str(tmp_path / "salvaged.zarr")
    report = salvage(source, target)
    got = _check_salvaged(good, target, report)
    assert _digest(source) == before  # the source is only read
    lost = sum(len(good[k]) for k in good) - sum(len(v) for v in got.values())
    if lost:  # what is gone is said: dropped rows, or a group or table left out
        assert report.missing(), name


def test_the_unsealed_store_of_a_killed_run_is_salvaged_whole(tmp_path):
    source = str(tmp_path / "killed.zarr")
    _start_and_kill(tmp_path, "local", source, whole_group=True)
    assert open_run(source).attrs["status"] == "incomplete"
    rows = _tables(source)
    target = str(tmp_path / "salvaged.zarr")
    report = salvage(source, target)
    got = _check_salvaged(rows, target, report)
    workers = open_run(source).worker_groups()
    unended = [m for m in open_run(target).attrs["missing"] if "never took its final flush" in m]
    assert len(unended) == len(workers) > 0  # the job was killed with its workers
    # every row its readers returned
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in rows.items() if v}
    assert report.rows_dropped == 0


def test_the_cli(good_store, tmp_path, capsys):  # noqa: F811
    target = str(tmp_path / "out.zarr")
    assert main(["doctor", good_store, "-o", target]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{target}: ") and "0 dropped" in out
    for argv, code, says in [
        (["doctor", str(tmp_path / "nope.zarr"), "-o", str(tmp_path / "x")], 3, "does not exist"),
        (["doctor", str(tmp_path), "-o", str(tmp_path / "y")], 3, "not a metacollect store"),
        (["doctor", good_store, "-o", target], 2, "exists"),
        (["doctor", good_store, "-o", good_store], 3, "new path"),
    ]:
        assert main(argv) == code, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("metacollect doctor: error:") and says in err[0]
    assert main(["doctor", good_store, "-o", target, "--overwrite"]) == 0
