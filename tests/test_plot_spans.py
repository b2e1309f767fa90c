"""The views of Dask's spans and fine performance metrics draw what the store holds, on a real
run with nested spans, a default span, a failing task and two spans at once."""

from __future__ import annotations

import io

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.container import BarContainer
from matplotlib.patches import Wedge
from views_runs import spans_store, spin

import metacollect
from metacollect import analysis, plot
from metacollect.analysis.spans import fine_metrics_page, tree_order
from metacollect.errors import UsageError
from metacollect.report import write_report


@pytest.fixture(scope="module")
def run():
    return metacollect.open_run(spans_store())


def render(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    assert buf.getvalue()[:4] == b"\x89PNG"


def axis(fig, title):
    return next(ax for ax in fig.axes if ax.get_title().startswith(title))


def stacked_widths(ax):
    """{bar label: summed width over the stacked containers}, and the containers' labels."""
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    widths = np.sum([[p.get_width() for p in c.patches] for c in bars], axis=0)
    return dict(zip(labels, widths, strict=True)), [c.get_label() for c in bars]


def execute_seconds(run, span_ids=None):
    fm = run.fine_metrics(by=["span", "context", "prefix", "activity", "unit"])
    ex = fm[(fm["context"] == "execute") & (fm["unit"] == "seconds")]
    if span_ids is not None:
        ex = ex[ex["span"].isin(span_ids)]
    return ex


def test_the_workload_has_what_the_views_are_about(run):
    sp = run.spans().set_index("name")
    assert {"load", "load/clean", "default", "fails", "twins", "twins/left", "twins/right"} <= set(
        sp.index
    )
    assert np.isnan(sp.loc["fails", "start"])  # its one task failed: no task finished
    left, right = sp.loc["twins/left"], sp.loc["twins/right"]
    assert left["start"] < right["stop"] and right["start"] < left["stop"]  # at once
    assert {"fine_metrics", "span_timeline"} <= set(plot.available_views(run))


def test_fine_metrics_execute_time_by_prefix_stacked_by_activity(run):
    fig = plot.fine_metrics(run)
    render(fig)
    ax = axis(fig, "Execute time by task prefix")
    widths, activities = stacked_widths(ax)
    truth = execute_seconds(run).groupby("prefix")["value"].sum()
    assert set(widths) == set(truth.index) >= {"random_sample", "mul", "left", "right", "boom"}
    for prefix, seconds in truth.items():
        assert widths[prefix] == pytest.approx(seconds)
    # heaviest on top; Dask's activity names, the failed task's time under "failed"
    assert list(widths) == list(truth.sort_values(ascending=False).index)
    assert activities[:4] == ["thread-cpu", "thread-noncpu", "executor", "other"]
    assert "failed" in activities
    assert "(s)" in ax.get_xlabel()
    boom = next(c for c in ax.containers if c.get_label() == "failed")
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert boom.patches[labels.index("boom")].get_width() > 0
    assert boom.patches[labels.index("boom")].get_facecolor()[:3] == (0, 0, 0)


def test_fine_metrics_pie_adds_idle_from_the_root_spans(run):
    fig = plot.fine_metrics(run)
    ax = axis(fig, "Execute time by activity")
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(wedges) == len(legend)
    assert [t.split()[0] for t in legend][-1] == "idle"
    summary = run.span_summary()
    roots = set(run.spans().query("parent == ''")["id"])
    idle = summary[summary["id"].isin(roots)]["idle"].sum()
    page = fine_metrics_page(run)
    assert page.by_activity["idle"] == pytest.approx(idle) and idle > 0
    total = execute_seconds(run)["value"].sum() + idle
    assert f"{total:.3g} s" in ax.get_title()
    # wedge angles follow the seconds
    angles = np.array([abs(w.theta2 - w.theta1) for w in wedges])
    shown = page.by_activity[page.by_activity > 0]
    assert angles / 360 == pytest.approx(shown.to_numpy() / shown.sum(), abs=1e-6)


def test_fine_metrics_send_data_is_the_get_data_context(run):
    fig = plot.fine_metrics(run)
    ax = axis(fig, "Send data (get-data)")
    fm = run.fine_metrics(by=["context", "activity", "unit"])
    gd = fm[(fm["context"] == "get-data") & (fm["unit"] == "seconds")].set_index("activity")
    assert "network" in gd.index  # the workload moved data between the workers
    bars = {
        t.get_text(): p.get_width() for t, p in zip(ax.get_yticklabels(), ax.patches, strict=True)
    }
    assert bars == pytest.approx(gd["value"].to_dict())
    assert "(s)" in ax.get_xlabel()


def test_fine_metrics_of_one_span_is_its_own_tasks_and_its_children(run):
    sp = run.spans().set_index("name")
    load = sp.loc["load", "id"]
    fig = plot.fine_metrics(run, span="load")
    render(fig)
    ax = axis(fig, "Execute time by task prefix (span load")
    widths, _ = stacked_widths(ax)
    own = execute_seconds(run, [load]).groupby("prefix")["value"].sum()
    assert widths == pytest.approx(own.to_dict()) and set(widths) == {"random_sample"}
    page = fine_metrics_page(run, span=load)  # by id, the same as by name
    clean = execute_seconds(run, [sp.loc["load/clean", "id"]])["value"].sum()
    assert page.by_activity["child spans"] == pytest.approx(clean) and clean > 0
    summary = run.span_summary().set_index("name")
    assert page.by_activity["idle"] == pytest.approx(summary.loc["load", "idle"])
    # own activities, children and idle make up the span's wall time times the threads
    assert page.by_activity.sum() == pytest.approx(sp.loc["load", "active_cpu_seconds"], rel=1e-6)
    pie = axis(fig, "Execute time by activity")
    assert any(t.get_text().startswith("child spans") for t in pie.get_legend().get_texts())
    assert axis(fig, "Send data").get_title().endswith("whole run")


def test_fine_metrics_of_an_unknown_span_teaches(run):
    with pytest.raises(UsageError, match=r"no span has the id or name 'nope'.*'load/clean'"):
        plot.fine_metrics(run, span="nope")


def test_span_timeline_rows_in_tree_order_with_bars_from_start_to_stop(run):
    fig = plot.span_timeline(run)
    render(fig)
    ax = fig.axes[0]
    sp = run.spans().set_index("name")
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == len(sp)
    # parents above their children, children indented
    assert labels.index("load") + 1 == labels.index("  └ clean")
    twins = labels.index("twins")
    assert {labels[twins + 1], labels[twins + 2]} == {"  └ left", "  └ right"}
    # one bar per span with a finished task, at its start and stop since the run's origin
    t0 = analysis.origin(run)
    tree = tree_order(run.spans())
    (poly,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    rows = [round(p.vertices[:, 1].mean()) for p in poly.get_paths()]
    extent = {tree["id"][r]: (p.vertices[:, 0].min(), p.vertices[:, 0].max())
              for r, p in zip(rows, poly.get_paths(), strict=True)}  # fmt: skip
    timed = tree[tree["start"].notna()].set_index("id")
    assert set(extent) == set(timed.index) and set(timed["name"]) == set(sp.index) - {"fails"}
    for sid, r in timed.iterrows():
        assert extent[sid] == pytest.approx((r["start"] - t0, r["stop"] - t0))
    # coloured by root: a child has its root's colour, two roots differ
    colour = {tree["name"][r]: tuple(c) for r, c in zip(rows, poly.get_facecolors(), strict=True)}
    assert colour["load"] == colour["load/clean"]
    assert colour["twins"] == colour["twins/left"] == colour["twins/right"]
    roots = [tree["id"][r] for r in rows if tree["parent"][r] == ""]
    root_colours = {
        tree["id"][r]: tuple(c) for r, c in zip(rows, poly.get_facecolors(), strict=True)
    }
    assert len({root_colours[r] for r in roots}) == len(roots) >= 3
    # durations beside the bars; the failed span a marker with a note
    texts = [t.get_text() for t in ax.texts]
    assert f" {sp.loc['load', 'duration']:.3g} s" in texts
    assert any("no task finished" in t for t in texts)
    (marker,) = ax.get_lines()
    assert marker.get_xdata()[0] == pytest.approx(sp.loc["fails", "enqueued"] - t0)
    assert marker.get_ydata()[0] == labels.index("fails")
    assert ax.get_xlabel() == "time since start of run (s)"
    assert ax.get_title().startswith(f"Spans ({len(sp)} spans")


def test_report_has_the_views_and_the_span_table(run, tmp_path):
    index = write_report(run, tmp_path / "report", dpi=30)
    with open(index) as f:
        text = f.read()
    assert 'src="fine_metrics.png"' in text and 'src="span_timeline.png"' in text
    assert "Fine performance metrics (Dask)" in text and ">Spans</h2>" in text
    assert "Span summary (Dask, Darshan, Yappi)" in text and "twins/right" in text
    assert "<th>thread-cpu</th>" in text and "<th>idle</th>" in text
    assert "Problems" not in text


def test_without_fine_metrics_the_views_say_so_and_the_report_leaves_them_out(
    client, store, tmp_path
):
    with metacollect.collect(client, store, capture={"fine-metrics": False}):
        client.submit(spin, 0.05, pure=False).result()
    run = metacollect.open_run(store)
    views = plot.available_views(run)
    assert "span_timeline" in views and "fine_metrics" not in views
    fig = plot.fine_metrics(run)
    assert "no execute seconds" in fig.axes[0].texts[0].get_text()
    index = write_report(run, tmp_path / "report", dpi=30)
    with open(index) as f:
        text = f.read()
    # the span table without execute columns: they would read 0 s and all idle
    assert "Span summary" in text and "<th>n_tasks</th>" in text
    assert "<th>idle</th>" not in text and "<th>thread-cpu</th>" not in text
