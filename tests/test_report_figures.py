"""One source per figure: a number the report shows in two tabs is the same number, read from
the written report (its data sources and text) and from the analysis function both tabs call;
a graph that re-uses an earlier graph's keys is credited only with the tasks it ran."""

from __future__ import annotations

import html
import re

import dask
import numpy as np
import pytest
from test_report_html import _objects, _sources
from views_runs import basic_store, collected, spans_store

import metacollect
from metacollect import analysis
from metacollect.report import write_html
from metacollect.report.views import fmt


@pytest.fixture(scope="module")
def basic(tmp_path_factory):
    out = tmp_path_factory.mktemp("fig") / "basic.html"
    write_html(basic_store(), out)
    return metacollect.open_run(basic_store()), out.read_text()


@pytest.fixture(scope="module")
def with_spans(tmp_path_factory):
    out = tmp_path_factory.mktemp("fig") / "spans.html"
    write_html(spans_store(), out)
    return metacollect.open_run(spans_store()), out.read_text()


def _text(page: str) -> str:
    """Every Div's and Title's text of the report, one string (Bokeh escapes the document's
    JSON inside the page)."""
    objs = _objects(page)
    return html.unescape(
        " ".join(
            str(o["attributes"].get("text", "")) for o in objs if o["name"] in ("Div", "Title")
        )
    )


def test_compute_is_one_number_in_summary_task_stream_and_workers(basic):
    run, page = basic
    stream = _sources(_objects(page), "key", "thread", "duration", "state")  # the task stream
    drawn = sum(sum(s["duration"]) for s in stream)
    compute = analysis.compute_seconds(run)
    assert drawn == pytest.approx(compute)  # the task stream draws every task of this run
    text = _text(page)
    assert f"computed for <b>{fmt.duration(compute)}</b>" in text  # the Summary's story
    assert f"<td style='padding:2px 8px;border-top:1px solid #eee'>{fmt.duration(compute)}" in text
    busy = analysis.utilisation(run)["busy"].sum()  # the Summary's per-worker table
    assert busy == pytest.approx(compute)
    assert analysis.summary(run)["compute_time"] == compute
    assert analysis.prefix_times(run)["compute_s"].sum() == pytest.approx(compute)


def test_transfers_are_one_number_in_summary_and_transfers_tab(basic):
    run, page = basic
    moved = analysis.transfers(run)
    assert moved.between_workers > 0 and moved.between_workers == moved.sent_to_workers
    text = _text(page)
    said = re.search(r"(\d[\d,]*) transfers? between workers, ([^<]+)<", text)
    assert said is not None
    assert int(said.group(1).replace(",", "")) == moved.between_workers
    assert said.group(2) == fmt.size(moved.between_workers_bytes)
    summary_row = f"{fmt.count(moved.between_workers)} ({fmt.size(moved.between_workers_bytes)})"
    assert summary_row in text
    # every "in" row is one transfer, counted once; the "out" rows with a worker peer are
    # the same transfers seen by the sender
    tr = run.worker_table("transfers")
    assert (tr["direction"] == "in").sum() == moved.between_workers


def test_prefix_overhead_is_the_spans_tab_executor_and_other(with_spans):
    run, page = with_spans
    pt = analysis.prefix_times(run)
    wide = analysis.figures.execute_seconds(run, by="prefix")
    stacked = _sources(_objects(page), "prefix", "executor", "other")
    assert stacked, "the fine metrics chart"
    for s in stacked:
        for prefix, ex, other in zip(s["prefix"], s["executor"], s["other"], strict=True):
            assert ex + other == pytest.approx(pt.loc[prefix, "overhead_s"])
            assert ex == pytest.approx(wide.loc[prefix, "executor"])
    # one name per prefix: the fine metrics' prefixes are the task stream's
    assert set(wide.index) <= set(run.tasks()["prefix"])


def test_root_spans_add_up_to_the_runs_compute(with_spans):
    run, page = with_spans
    sp = analysis.figures.span_compute(run)
    t = run.tasks()
    in_spans = float(t.loc[t["span"] != "", "duration"].sum())
    roots = sp[sp["parent"] == ""]
    assert roots["compute_s"].sum() == pytest.approx(in_spans)
    assert sp["own_compute_s"].sum() == pytest.approx(in_spans)
    drawn = _sources(_objects(page), "name", "compute", "n_tasks")
    shown = {n: c for s in drawn for n, c in zip(s["name"], s["compute"], strict=True)}
    for name, c in shown.items():  # what the span timeline's hover says
        assert c == pytest.approx(sp.loc[sp["name"] == name, "compute_s"].iloc[0]) or (
            name == "default"  # several spans of that name: one of them
            and any(c == pytest.approx(v) for v in sp.loc[sp["name"] == name, "compute_s"])
        )


def inc(x):
    return x + 1


def test_a_graph_reusing_keys_is_credited_only_with_what_it_ran(tmp_path):
    """Graph 0 persists N tasks; graph 1 sends them again with one more task on top: graph 1
    is sent N + 1 tasks, of which one is new, and runs only that one."""
    n = 6
    store = str(tmp_path / "reuse.zarr")
    with collected(store) as client:
        parts = [dask.delayed(inc)(i, dask_key_name=f"part-{i}") for i in range(n)]
        persisted = client.persist(parts)
        client.gather(persisted)
        total = dask.delayed(sum)(persisted, dask_key_name="total-0")
        assert client.compute(total).result() == sum(range(1, n + 1))
    run = metacollect.open_run(store)
    counts = analysis.graph_counts(run).sort_values("time", ignore_index=True)
    assert list(counts["new"]) == [n, 1]
    assert list(counts["executed"]) == [n, 1]  # graph 1 re-sent the parts while they ran
    assert counts.loc[1, "submitted"] >= 1
    assert int(np.sum(counts["executed"])) == len(run.tasks())
