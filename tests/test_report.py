"""report and export on a store written by ``metacollect run``; Perfetto trace checked."""

from __future__ import annotations

import json

import pytest
from views_runs import basic_store, script_store

import metacollect
from metacollect.cli import main
from metacollect.export import perfetto
from metacollect.report import write_report


@pytest.fixture(scope="module")
def store():
    return script_store()


def test_report_cli_writes_every_view(store, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", store, "--png", str(out), "--dpi", "40"]) == 0
    index = out / "index.html"
    assert capsys.readouterr().out.strip() == str(index)
    text = index.read_text()
    for view in [
        "task_stream",
        "progress",
        "memory",
        "processing",
        "task_graph",
        "critical_path",
        "fine_metrics",
        "span_timeline",
        "collector",
    ]:
        assert f'src="{view}.png"' in text
        assert (out / f"{view}.png").stat().st_size > 1000
    assert "Task prefixes" in text and "work" in text
    assert "http://" not in text and "https://" not in text  # offline
    assert "Problems" not in text


def test_report_of_a_missing_store_is_one_clean_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope.zarr")]) == 3
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err


def test_export_perfetto_one_x_event_per_task(store, tmp_path, capsys):
    out = tmp_path / "trace.json"
    assert main(["export", store, "--perfetto", str(out)]) == 0
    doc = json.loads(out.read_text())
    run = metacollect.open_run(store)
    tasks = run.tasks()
    x = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"].startswith("task")]
    assert len(x) == len(tasks) == 10
    assert sorted(e["args"]["key"] for e in x) == sorted(tasks["key"])
    for e in doc["traceEvents"]:
        assert {"ph", "pid", "tid", "name"} <= set(e)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["ts"], float)
    names = {
        e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert "scheduler" in names and any(n.startswith("worker tcp://") for n in names)
    assert doc["metadata"]["truncated"] is False and doc["metadata"]["executed_tasks"] == 10


def test_export_is_bounded_and_says_so(store, tmp_path, capsys):
    out = tmp_path / "trace.json"
    assert main(["export", store, "--perfetto", str(out), "--max-events", "4"]) == 0
    assert "bounded to --max-events 4" in capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["metadata"]["truncated"] is True and doc["metadata"]["events"] == 4
    assert doc["metadata"]["dropped"]["tasks"] == 6
    assert sum(e["ph"] != "M" for e in doc["traceEvents"]) == 4


def test_export_without_a_format_teaches(store, capsys):
    assert main(["export", store]) == 2
    assert "pass --perfetto out.json" in capsys.readouterr().err


def test_report_api_and_perfetto_counts(store, tmp_path):
    index = write_report(store, tmp_path / "r", dpi=30)
    with open(index) as f:
        assert f.read().count("<img") == 9  # the six above, fine metrics, spans, collector
    run = metacollect.open_run(basic_store())
    meta = perfetto.write(run, tmp_path / "t.json")
    assert meta["executed_tasks"] == len(run.tasks())
