"""The report as a user sees it: ``metacollect demo`` (Yappi and Darshan on by default when
a runtime is found) writes its report, which a real headless Chromium opens; every tab is
clicked. Each tab must show a plot with data or a table with rows, none may say it failed
to build, the console must hold no error, and a figure named in two tabs must be the same
in both."""

from __future__ import annotations

import os
import re

import pytest
from browser import available, chromium, console_errors, load, show_tab, tabs

from metacollect.cli import main

pytestmark = [pytest.mark.darshan, pytest.mark.slow]

#: a number with its unit, as the report writes durations (``1 min 3 s``, ``250 ms``)
_DURATION = re.compile(r"([\d.,]+)\s*(µs|us|ms|min|h|s)?\b")
_UNIT = {"µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, None: 1.0}


def seconds(text: str) -> float:
    """A duration as the report writes it (``0.244``, ``244 ms``, ``1 min 3 s``) in s."""
    parts = _DURATION.findall(text)
    if not parts:
        raise ValueError(f"no duration in {text!r}")
    return sum(float(n.replace(",", "")) * _UNIT[u or None] for n, u in parts)


def count(text: str) -> int:
    """The first whole number of ``text`` (``1,234``)."""
    found = re.search(r"\d[\d,]*", text)
    if found is None:
        raise ValueError(f"no number in {text!r}")
    return int(found.group().replace(",", ""))


def row_named(tables: list[dict], pattern: str) -> list[str]:
    """The first table row whose first cell matches ``pattern`` (``_`` read as a space)."""
    for t in tables:
        for r in t["rows"]:
            if r and re.match(pattern, r[0].replace("_", " "), re.I):
                return r
    raise AssertionError(f"no row named {pattern!r} in {[t['columns'] for t in tables]}")


def column_named(table: dict, pattern: str) -> int:
    return next(i for i, c in enumerate(table["columns"]) if re.match(pattern, c, re.I))


@pytest.fixture(scope="module")
def shown(tmp_path_factory):
    """Every tab of the demo's report as Chromium shows it: title -> what it holds; and
    the console's errors."""
    why = available()
    if why and os.environ.get("CI"):
        pytest.fail(f"no browser in CI: {why}")
    if why:
        pytest.skip(why)
    d = tmp_path_factory.mktemp("browser")
    store, html = d / "demo.zarr", d / "demo.html"
    # images of the demo's own size: tasks long enough (~0.7 s of task time in all) that
    # Dask's sampler, every 10 ms, is sure to catch some even on a loaded machine
    args = ["demo", "--store", str(store), "--report", str(html), "--images", "4"]
    assert main(args) == 0
    out: dict[str, dict] = {}
    with chromium() as driver:
        load(driver, html)
        titles = [t.text for t in tabs(driver)]
        for i, title in enumerate(titles):
            out[title] = show_tab(driver, i)
        errors = console_errors(driver)
    return out, errors


def test_no_console_error(shown):
    _, errors = shown
    assert errors == []


def test_every_tab_shows_a_plot_a_table_or_code(shown):
    tabs_shown, _ = shown
    assert len(tabs_shown) == 16

    def shows(s: dict) -> bool:
        return any(p["glyphs"] for p in s["plots"]) or any(t["n"] for t in s["tables"])

    empty = [title for title, s in tabs_shown.items() if not shows(s)]
    assert empty == ["Calling code"]  # code, not a plot or a table
    assert tabs_shown["Calling code"]["code"] > 0
    failed = [t for t, s in tabs_shown.items() if any("failed to build" in x for x in s["texts"])]
    assert failed == []


def test_yappi_and_darshan_tabs_have_data(shown):
    tabs_shown, _ = shown
    yappi = tabs_shown["Yappi profile"]
    assert yappi["tables"][0]["n"] > 0  # inside tasks, the first table
    assert any("inside tasks" in p["title"] for p in yappi["plots"])
    io = tabs_shown["I/O (Darshan)"]
    assert any(t["n"] for t in io["tables"])


def test_calling_code_by_default(shown):
    """Under collect(), Dask's computation code (one frame by default): the demo's own."""
    tabs_shown, _ = shown
    text = " ".join(tabs_shown["Calling code"]["texts"])
    assert "dask.compute(process(stack" in text


def test_tasks_in_summary_and_task_stream_agree(shown):
    tabs_shown, _ = shown
    tasks = count(row_named(tabs_shown["Summary"]["tables"], r"task executions")[1])
    title = tabs_shown["Task stream"]["plots"][0]["title"]
    drawn = re.findall(r"([\d,]+) task executions", title)
    assert drawn, title
    assert count(drawn[-1]) == tasks


def test_transfers_in_summary_and_transfers_tab_agree(shown):
    tabs_shown, _ = shown
    summary = count(row_named(tabs_shown["Summary"]["tables"], r"transfers between workers")[1])
    said = " ".join(tabs_shown["Transfers"]["texts"])  # the tab's heading
    found = re.search(r"([\d,]+) transfers? between workers", said)
    assert found, said
    assert count(found.group(1)) == summary


def test_compute_time_in_summary_and_spans_tab_agree(shown):
    tabs_shown, _ = shown
    summary = seconds(row_named(tabs_shown["Summary"]["tables"], r"compute \(thread-seconds\)")[1])
    spans = next(
        t for t in tabs_shown["Spans and fine metrics"]["tables"] if "span" in t["columns"]
    )
    c = column_named(spans, r"compute")
    roots = [r for r in spans["rows"] if "/" not in r[0]]  # the demo's one root span
    assert sum(seconds(r[c]) for r in roots) == pytest.approx(summary, rel=1e-3, abs=1e-3)
