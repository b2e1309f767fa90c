"""The interactive one-file HTML report: on a real collected run (its task stream holds exactly
the run's tasks, with hover), on a 200k-task synthetic run (bounded, and it says so), with a
view that fails (reported, the others render), and through the CLI."""

from __future__ import annotations

import base64
import gzip
import html
import itertools
import json
import os
import re

import numpy as np
import pytest
from views_runs import basic_store, chain_store, script_store

import metacollect
from metacollect.cli import main
from metacollect.report import ViewsFailedError, views, write_html
from metacollect.report.views.task_density import busy_seconds

#: the tabs the report always has (a view without data says so inside its tab)
TABS = [
    "Summary",
    "Calling code",
    "Task stream",
    "Progress",
    "Memory",
    "CPU and network",
    "Transfers",
    "Graphs",
    "Critical path",
    "Yappi profile",
    "Dask profile",
    "Spans and fine metrics",
    "I/O (Darshan)",
    "Events and logs",
    "System",
    "What collecting cost",
]


def _objects(text: str) -> list[dict]:
    """Every Bokeh model of the page's embedded document, as ``{"name", "attributes"}``."""
    start = text.index('<script type="application/json"')
    body = text.index(">", start) + 1
    doc = text[body : text.index("</script>", body)]
    found: list[dict] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "name" in node:
                found.append(node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(doc))
    return found


def _column(value: object) -> list:
    """A ColumnDataSource column: a list, or an ndarray (a list, or base64 bytes that Bokeh
    may have gzipped)."""
    if isinstance(value, list):
        return value
    assert isinstance(value, dict) and value.get("type") == "ndarray", value
    array = value["array"]
    if isinstance(array, list):
        return array
    raw = base64.b64decode(array["data"])
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return np.frombuffer(raw, dtype=value["dtype"]).tolist()


def _sources(objs: list[dict], *columns: str) -> list[dict[str, list]]:
    """The data of every ColumnDataSource holding all of ``columns``."""
    out = []
    for o in objs:
        if o["name"] != "ColumnDataSource":
            continue
        data = o.get("attributes", {}).get("data", {})
        entries = dict(data.get("entries", [])) if isinstance(data, dict) else {}
        if set(columns) <= set(entries):
            out.append({c: _column(entries[c]) for c in columns})
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("html") / "run.html"
    assert write_html(basic_store(), out) == str(out)
    return out


def test_one_offline_file_with_every_tab(report):
    assert os.listdir(report.parent) == ["run.html"]  # one file, nothing beside it
    text = report.read_text()
    assert not re.search(r"<script[^>]*\ssrc=", text)  # every script inline
    assert not re.search(r"<link[^>]*\shref=", text)  # no stylesheet to fetch
    objs = _objects(text)
    tabs = [o["attributes"]["title"] for o in objs if o["name"] == "TabPanel"]
    assert tabs == TABS
    failed = re.findall(r"This view failed to build: ([^&<]*)", text)
    assert failed == []
    titles = " ".join(str(o["attributes"].get("text", "")) for o in objs if o["name"] == "Title")
    n = len(metacollect.open_run(basic_store()).tasks())
    for expected in [
        f"Task stream: all {n} task executions",
        "Progress per task prefix",
        "Memory of all workers",
        "CPU per worker process",
        "Critical path of graph",
        "Yappi flame view: every worker",
        "Dask statistical profile",
    ]:
        found = expected in titles
        assert found, expected
    divs = " ".join(str(o["attributes"].get("text", "")) for o in objs if o["name"] == "Div")
    says = ["No Darshan I/O" in divs, "nframes" in divs]
    assert says == [True, True]  # a view without data says so; why the code table is empty


def test_task_stream_holds_every_task_with_hover(report):
    objs = _objects(report.read_text())
    tasks = metacollect.open_run(basic_store()).tasks()
    stream = _sources(objs, "key", "worker", "thread", "nbytes", "left", "right")
    keys = [k for s in stream for k in s["key"]]
    assert sorted(keys) == sorted(tasks["key"].astype(str))
    starts = sorted(v for s in stream for v in s["left"])
    assert starts == pytest.approx(sorted(tasks["start"] * 1000.0))  # wall clock, in ms
    # one colour (one renderer, one legend entry) per prefix
    prefixes = {p for s in _sources(objs, "key", "prefix", "thread") for p in set(s["prefix"])}
    assert prefixes == set(tasks["prefix"])
    hovers = [o["attributes"].get("tooltips") for o in objs if o["name"] == "HoverTool"]
    fields = [{t[0] for t in h} for h in hovers if isinstance(h, list)]
    assert any({"key", "worker", "thread", "start", "duration", "bytes"} <= f for f in fields)


def test_task_stream_draws_the_transfers_as_dask_does(report):
    """Every transfer of a task's inputs (the workers' startstops), red on the row of the
    thread that ran the task."""
    run = metacollect.open_run(basic_store())
    ss = run.worker_table("startstops", clock="scheduler")
    truth = ss[ss["action"] == "transfer"]
    assert len(truth) > 0  # the wide graph's total gathers from both workers
    objs = _objects(report.read_text())
    drawn = [a for s in _sources(objs, "action", "key", "left", "y") for a in s["action"]]
    assert drawn == ["transfer"] * len(truth)
    (starts,) = [s["left"] for s in _sources(objs, "action", "key", "left", "y")]
    assert sorted(starts) == pytest.approx(sorted(truth["start"] * 1000.0))


def test_collector_holds_every_flush_with_hover(report):
    """The collector's tab: every flush of every process (a small run: none sampled out),
    with its CPU and the time since the flush before, as the store holds them."""
    run = metacollect.open_run(basic_store())
    flushes = run.flushes()
    objs = _objects(report.read_text())
    drawn = _sources(objs, "x", "cpu_ms", "wall_ms", "rows", "gap_s", "process")
    assert {p for s in drawn for p in s["process"]} == {"scheduler", *run.workers()["address"]}
    points = sorted(
        (x, c, g) for s in drawn for x, c, g in zip(s["x"], s["cpu_ms"], s["gap_s"], strict=True)
    )
    truth = sorted(
        zip(flushes["time"] * 1000.0, flushes["cpu_s"] * 1000.0, flushes["gap_s"], strict=True)
    )
    assert np.array(points) == pytest.approx(np.array(truth))
    hovers = [o["attributes"].get("tooltips") for o in objs if o["name"] == "HoverTool"]
    fields = [{t[0] for t in h} for h in hovers if isinstance(h, list)]
    assert any({"process", "CPU", "wall", "rows", "since the one before"} <= f for f in fields)


@pytest.mark.slow
def test_200k_tasks_bounded_and_said(tmp_path):
    """At 200k executions the task stream starts as a density view whose busy thread-seconds
    are the tasks' compute seconds, and embeds every execution once, compactly, for the
    single bars that swap in as one zooms."""
    out = tmp_path / "big.html"
    write_html(chain_store(), out)
    n = 200_000
    assert os.path.getsize(out) < 1000 * n
    objs = _objects(out.read_text())
    tasks = metacollect.open_run(chain_store()).tasks()
    assert len(tasks) == n
    titles = [str(o["attributes"].get("text", "")) for o in objs if o["name"] == "Title"]
    assert f"Task stream: busy threads per worker of {n:,} task executions" in " ".join(titles)
    # the density: each bin's busy threads x its width, summed, is every task's duration
    density = _sources(objs, "left", "right", "busy", "worker", "prefix")
    busy_s = sum(
        b * (r - left) / 1000.0
        for d in density
        for b, left, r in zip(d["busy"], d["left"], d["right"], strict=True)
    )
    assert busy_s == pytest.approx(tasks["duration"].sum(), rel=1e-6)
    # every execution embedded once: its start (to the tick) and duration (float32)
    (compact,) = _sources(objs, "off", "dur", "row", "label")
    swap = next(
        dict(o["attributes"]["args"]["entries"])
        for o in objs
        if o["name"] == "CustomJS" and "compact" in json.dumps(o["attributes"].get("args"))
    )
    starts = swap["t0"] + np.array(compact["off"], dtype=float) * swap["tick"]
    assert np.sort(starts) == pytest.approx(np.sort(tasks["start"] * 1000.0), abs=swap["tick"])
    durations = np.sort(np.array(compact["dur"], dtype=float))
    assert durations == pytest.approx(np.sort(tasks["duration"] * 1000.0), rel=1e-6, abs=1e-6)


def test_busy_seconds_per_bin_are_exact():
    """The density view's busy thread-seconds per bin, against each interval clipped to
    each bin one by one."""
    rng = np.random.default_rng(1)
    start = rng.uniform(0, 10, 500)
    stop = start + rng.exponential(0.5, 500)
    edges = np.linspace(-1, 12, 40)
    truth = [
        np.clip(np.minimum(stop, b) - np.maximum(start, a), 0, None).sum()
        for a, b in itertools.pairwise(edges)
    ]
    assert busy_seconds(start, stop, edges) == pytest.approx(truth, abs=1e-9)


def test_a_failing_view_is_reported_and_the_rest_render(tmp_path, monkeypatch):
    def broken(ctx):
        raise RuntimeError("the memory view broke")

    monkeypatch.setitem(views.VIEWS, "Memory", broken)
    out = tmp_path / "r.html"
    with pytest.raises(ViewsFailedError, match="'Memory' failed to build: RuntimeError") as e:
        write_html(script_store(), out)
    assert e.value.path == str(out)
    assert e.value.failures == [("Memory", "RuntimeError: the memory view broke")]
    text = out.read_text()
    reported = ["Views that failed to build" in text, "RuntimeError: the memory view broke" in text]
    assert reported == [True, True]
    objs = _objects(text)
    assert [o["attributes"]["title"] for o in objs if o["name"] == "TabPanel"] == TABS
    assert _sources(objs, "key", "worker", "thread", "nbytes")  # the task stream still there


def test_cli_exits_non_zero_naming_a_tab_that_failed(tmp_path, monkeypatch, capsys):
    """A tab that cannot be built is an error: the tab and why on stderr (one line), a
    non-zero exit, and the report written all the same, the tab saying why."""

    def broken(ctx):
        raise KeyError("no such column")

    monkeypatch.setitem(views.VIEWS, "Transfers", broken)
    out = tmp_path / "x.html"
    assert main(["report", script_store(), "-o", str(out), "-q"]) == 1
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out)
    err = [line for line in captured.err.splitlines() if line.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert "tab 'Transfers' failed to build: KeyError: 'no such column'" in err[0]
    assert "This view failed to build: KeyError" in out.read_text()


def test_demo_exits_non_zero_naming_a_tab_that_failed(tmp_path, monkeypatch, capsys):
    def broken(ctx):
        raise ValueError("cannot draw this")

    monkeypatch.setitem(views.VIEWS, "Progress", broken)
    out = tmp_path / "demo.html"
    argv = ["demo", "--images", "2", "--size", "32", "--workers", "1", "--threads", "1"]
    assert main([*argv, "-s", str(tmp_path / "demo.zarr"), "--report", str(out)]) == 1
    err = capsys.readouterr().err
    assert "metacollect demo: error: tab 'Progress' failed to build: ValueError" in err
    assert "Traceback" not in err
    assert "This view failed to build: ValueError: cannot draw this" in out.read_text()


def test_calling_code_shows_the_script_under_metacollect_run(tmp_path):
    out = tmp_path / "script.html"
    write_html(script_store(), out)
    objs = _objects(out.read_text())
    divs = " ".join(str(o["attributes"].get("text", "")) for o in objs if o["name"] == "Div")
    source = metacollect.open_run(script_store()).groups["script"]["source"]
    assert "def work(i):" in source
    # the whole script, as metacollect run kept it (the page escapes the HTML once more)
    assert html.escape(source) in html.unescape(divs)


def test_cli_writes_the_file_and_says_where(tmp_path, capsys):
    out = tmp_path / "x.html"
    assert main(["report", script_store(), "-o", str(out), "-q"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["{tmp}/missing.zarr", "-o", "{tmp}/x.html"], "does not exist"),
        (["{store}", "-o", "{tmp}/no/such/dir/x.html"], "does not exist; create it"),
        (["{store}", "-o", "{tmp}"], "is a directory"),
    ],
    ids=["missing-store", "output-dir-missing", "output-is-a-dir"],
)
def test_cli_bad_paths_one_line(tmp_path, capsys, argv, says):
    filled = [a.format(tmp=tmp_path, store=script_store()) for a in argv]
    assert main(["report", *filled]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and says in err[0] and "Traceback" not in err[0], err
    assert not list(tmp_path.glob("*.html"))
