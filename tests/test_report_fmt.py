"""Numbers for humans: the formatting module every view uses, and what a written report shows
with it (dates not epochs, ids as typed, binary-round byte ticks, a colour bar on the heatmap,
distinct worker colours, each tab its own height)."""

from __future__ import annotations

import html

import pandas as pd
import pytest
from bokeh.models.widgets.tables import NumberFormatter, StringFormatter
from test_report_html import _objects
from views_runs import basic_store

import metacollect
from metacollect.report import write_html
from metacollect.report.views import fmt


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (12e-6, "12 µs"),
        (0.35, "350 ms"),
        (2.5, "2.5 s"),
        (185, "3 min 05 s"),
        (3720, "1 h 02 min"),
        (float("nan"), ""),
    ],
)
def test_duration(seconds, text):
    assert fmt.duration(seconds) == text


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [(512, "512 B"), (1536, "1.5 KiB"), (50 * 2**20, "50 MiB"), (3 * 2**30, "3 GiB")],
)
def test_size_is_binary(nbytes, text):
    assert fmt.size(nbytes) == text


def test_pct_count_when_plural():
    assert fmt.pct(0.0662) == "6.6 %"
    assert fmt.pct(0.0001) == "< 0.1 %"
    assert fmt.count(25000) == "25,000"
    assert fmt.plural(1, "transfer") == "1 transfer"
    assert fmt.plural(2, "transfer") == "2 transfers"
    assert fmt.when([0.0]) == ["1970-01-01 00:00:00.000"]


def test_table_formatters_by_column():
    ints = pd.Series([8209])
    assert isinstance(fmt.table_formatter("pid", ints), StringFormatter)
    assert isinstance(fmt.table_formatter("graph", ints), StringFormatter)
    assert fmt.table_formatter("result bytes", ints).format == "0.[00] b"
    assert fmt.table_formatter("flushes", ints).format == "0,0"
    assert "fmt(s)" in fmt.table_formatter("compute (s)", pd.Series([1.0])).template
    assert isinstance(fmt.table_formatter("utilisation (%)", pd.Series([1.0])), NumberFormatter)


def test_workers_get_distinct_strong_colours():
    c = fmt.categorical(["a", "b"])
    assert len(set(c.values())) == 2
    assert len(set(fmt.CATEGORICAL[:10])) == 10 and len(fmt.CATEGORICAL) == 18


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    out = tmp_path_factory.mktemp("fmt") / "r.html"
    write_html(basic_store(), out)
    return _objects(out.read_text())


def test_report_shows_dates_and_ids_as_typed(page):
    run = metacollect.open_run(basic_store())
    divs = html.unescape(" ".join(str(o.get("attributes", {}).get("text", "")) for o in page))
    started = float(run.attrs["started"])
    assert str(started) not in divs and str(int(started)) not in divs  # no epoch shown
    pids = {str(p) for p in run.workers()["pid"]}
    cells = set()
    for o in page:
        if o["name"] == "ColumnDataSource" and "attributes" in o:
            for _, col in o["attributes"].get("data", {}).get("entries", []):
                if isinstance(col, list):
                    cells.update(str(v) for v in col)
    assert pids <= cells  # "8209", never "8,209" or "8209.0"


def test_heatmap_has_a_colour_bar_and_byte_axes_round_ticks(page):
    names = [o["name"] for o in page]
    assert "ColorBar" in names
    tickers = [o for o in page if o["name"] == "AdaptiveTicker"]
    assert any(t["attributes"].get("base") == 1024 for t in tickers)


def test_each_tab_has_its_own_height(page):
    by_id = {o["id"]: o for o in page if "attributes" in o}
    panels = [o for o in page if o["name"] == "TabPanel"]
    children = [by_id[p["attributes"]["child"]["id"]] for p in panels]
    shown = [c["attributes"].get("visible", True) for c in children]
    assert shown[0] is True and not any(shown[1:])  # hidden tabs are out of the layout
    callbacks = [o for o in page if o["name"] == "CustomJS"]
    assert any("cb_obj.active" in str(c["attributes"].get("code")) for c in callbacks)
