"""Every view of metacollect.plot renders on a real run and draws the data it should."""

from __future__ import annotations

import io

import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from views_runs import CHAIN, LONG_CHAIN, WIDE, basic_store, chain_store

import metacollect
from metacollect import analysis, plot
from metacollect.errors import UsageError
from metacollect.plot.jobs import JOB_END_COLOURS, OTHER_END, RUNNING, how_ended


@pytest.fixture(scope="module")
def run():
    return metacollect.open_run(basic_store())


def render(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    assert buf.getvalue()[:4] == b"\x89PNG"
    return buf.getvalue()


def test_task_stream_draws_one_rectangle_per_task(run):
    fig = plot.task_stream(run)
    render(fig)
    ax = fig.axes[0]
    polys = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(polys[0].get_paths()) == len(run.tasks()) == CHAIN + WIDE + 2
    assert len(ax.get_yticks()) == analysis.task_stream(run)["row"].nunique()
    # erred tasks are black, as on the dashboard
    colours = polys[0].get_facecolors()
    erred = analysis.task_stream(run)["state"].eq("erred").to_numpy()
    assert (colours[erred][:, :3] == 0).all()


def test_transfers_are_red(run):
    act = analysis.activity(run)
    fig = plot.task_stream(run)
    polys = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    if len(act):
        assert len(polys) == 2 and len(polys[1].get_paths()) == len(act)
        red = act["action"].eq("transfer").to_numpy()
        assert (polys[1].get_facecolors()[red][:, :3] == (1, 0, 0)).all()


def test_colour_of_a_prefix_is_stable():
    assert plot.color_of("inc") == plot.color_of("inc")


@pytest.mark.parametrize(
    "name", ["progress", "memory", "processing", "task_graph", "critical_path"]
)
def test_view_renders(run, name):
    render(getattr(plot, name)(run))


def test_available_views_match_the_store(run):
    views = plot.available_views(run)
    assert {
        "task_stream",
        "progress",
        "memory",
        "processing",
        "task_graph",
        "critical_path",
    } <= set(views)
    has_io = getattr(run, "io", None) is not None and plot.io_frame(run) is not None
    assert ("io" in views) == has_io
    assert "batch_jobs" not in views  # a LocalCluster: no batch job
    render(plot.batch_jobs(run))  # says so, in a figure of its own


def test_task_graph_colour_by_any_attribute(run):
    for column in ["duration", "nbytes", "worker", "typename"]:
        render(plot.task_graph(run, graph=1, color=column, label="key"))
    nodes, _ = analysis.graph_nodes(run, 1)
    render(plot.task_graph(run, graph=1, color="mine", nodes=nodes.assign(mine=range(len(nodes)))))
    with pytest.raises(UsageError, match="no column 'nope'"):
        plot.task_graph(run, color="nope")


def test_task_graph_aggregates_by_prefix(run):
    fig = plot.task_graph(run, graph=1, max_nodes=5)
    assert "2 prefixes of 13 tasks" in fig.axes[0].get_title()
    render(fig)


@pytest.mark.slow
def test_critical_path_of_a_200k_task_chain():
    """The view was quadratic in the path's length (a set rebuilt for every task on it): it
    never ended at 200k tasks; linear, it takes seconds (no timing here - the suite's
    per-test timeout stops a quadratic one, and benchmarks/report_scale.py measures it)."""
    long_run = metacollect.open_run(chain_store(LONG_CHAIN))
    fig = plot.critical_path(long_run)
    ax = fig.axes[0]
    assert f"{LONG_CHAIN} tasks" in ax.get_title() and "(50.0%)" in ax.get_title()
    grey, path = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(grey.get_paths()) == len(path.get_paths()) == LONG_CHAIN
    (line,) = ax.lines  # the path, through every task in order
    assert len(line.get_xdata()) == LONG_CHAIN
    assert (line.get_xdata()[1:] > line.get_xdata()[:-1]).all()


def test_critical_path_title_has_the_fraction(run):
    fig = plot.critical_path(run, graph=0)
    assert f"{CHAIN} tasks" in fig.axes[0].get_title() and "%" in fig.axes[0].get_title()


def test_compare_renders(run):
    render(plot.compare([run, run], labels=["a", "b"]))


def test_io_and_profile_without_data_say_so(run):
    if plot.io_frame(run) is None:
        assert "no Darshan data" in plot.io(run).axes[0].texts[0].get_text()
    if plot.profile_frame(run) is None:
        assert "no Yappi data" in plot.profile(run).axes[0].texts[0].get_text()


def test_profile_view_on_yappi_data(run):
    prof = run.profile()
    assert len(prof), "the run was collected with Yappi enabled"
    assert "profile" in plot.available_views(run)
    fig = plot.profile(run)
    render(fig)
    top = fig.axes[0]
    assert top.get_title().startswith("Top ")
    heaviest = fig.axes[1].get_yticklabels()
    assert any(t.get_text().startswith(("inc:", "slow:", "total:")) for t in heaviest)


def test_metadata_map_has_every_step_and_level():
    from metacollect.store.schema import load_schema

    schema = load_schema()
    fig = plot.metadata_map(schema)
    render(fig)
    ax = fig.axes[0]
    assert [t.get_text().split("\n")[0] for t in ax.get_xticklabels()] == [
        f"step {s}" for s in range(1, 6)
    ]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        lv for lv in schema.levels if lv != "run"
    ]
    text = "\n".join(t.get_text() for t in ax.texts)
    for g in schema.groups.values():
        if g.step > 0:
            assert g.path in text


class WithIO:
    """A run plus synthetic Darshan tables shaped like ``Run.io()`` (file and segment rows),
    one write then one read per task of the wide graph, inside the task's interval."""

    def __init__(self, run):
        self._run = run
        t = run.tasks()
        self.slow = t[t["prefix"] == "slow"]

    def __getattr__(self, name):
        return getattr(self._run, name)

    def io(self, by="file"):
        import pandas as pd

        s = self.slow
        seg = pd.DataFrame(
            {
                "worker": list(s["worker"]) * 2,
                "file": [f"/data/block-{k}.npy" for k in s["key"]] * 2,
                "op": ["write"] * len(s) + ["read"] * len(s),
                "length": [8000] * (2 * len(s)),
                "start": list(s["start"]) * 2,
                "stop": list((s["start"] + s["stop"]) / 2) * 2,
                "key": list(s["key"]) * 2,
            }
        )
        if by == "segment":
            return seg
        return seg.groupby(["worker", "file"], as_index=False).agg(
            bytes=("length", "sum"), start=("start", "min"), stop=("stop", "max")
        )


def test_io_view_on_darshan_shaped_data(run):
    fake = WithIO(run)
    assert "io" in plot.available_views(fake)
    fig = plot.io(fake)
    render(fig)
    # DXT panel: the task stream plus one bar per segment
    dxt = next(ax for ax in fig.axes if ax.get_title().startswith("DXT segments"))
    polys = [c for c in dxt.collections if isinstance(c, PolyCollection)]
    assert len(polys) == 2 and len(polys[1].get_paths()) == 2 * WIDE


def test_perfetto_has_dxt_segments(run, tmp_path):
    import json

    from metacollect.export import perfetto

    perfetto.write(WithIO(run), tmp_path / "t.json")
    with open(tmp_path / "t.json") as f:
        doc = json.load(f)
    io = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "io"]
    assert len(io) == 2 * WIDE and {e["name"] for e in io} == {"read", "write"}


def test_flame_root_that_never_returned_is_as_wide_as_what_ran_under_it():
    """A worker thread's loop never returns while profiled: yappi gives ``run -> _worker`` no
    time. The flame view's root still spans what ran under it (not a zero-width root)."""
    import pandas as pd

    from metacollect.plot.profile import call_tree, icicle

    agg = pd.Series(
        {
            ("run", "_worker"): 0.0,
            ("_worker", "task"): 2.0,
            ("_worker", "get"): 1.0,  # idle waits between tasks
            ("task", "sort"): 1.5,
            ("helper", "sort"): 0.5,  # sort has two callers: its edges keep their own time
        }
    )
    children, roots = call_tree(agg)
    assert sorted(roots) == [("helper", 0.5), ("run", 3.0)]
    assert children["run"] == [("_worker", 3.0)]
    assert dict(children["_worker"]) == {"task": 2.0, "get": 1.0}
    boxes = icicle(children, roots, 3.5, 10, 0.0)
    assert {name for *_, name in boxes} == {"run", "_worker", "task", "get", "sort", "helper"}


@pytest.mark.parametrize(
    "state, exit_code, label, colour",
    [
        ("", "", "running at the end", RUNNING),
        ("TIMEOUT", "0:15", "TIMEOUT", JOB_END_COLOURS["TIMEOUT"]),
        ("F", "0", "F: exit 0", JOB_END_COLOURS["COMPLETED"]),
        ("C", "3", "C: exit > 0", JOB_END_COLOURS["FAILED"]),
        ("F", "271", "F: killed by a signal", JOB_END_COLOURS["CANCELLED"]),  # qdel: 256+15
        ("F", "-29", "F: exit -29 (batch system)", OTHER_END),
        ("C", "", "C: exit status unknown", OTHER_END),
        ("E", "", "E (exiting)", JOB_END_COLOURS["COMPLETING"]),
        ("SPECIAL", "", "SPECIAL", OTHER_END),
    ],
)
def test_a_pbs_jobs_end_is_drawn_by_its_exit_status(state, exit_code, label, colour):
    """PBS says only that a job is over (F, C, X); how, its exit status says. The batch
    jobs views draw it as Slurm's like end would be, and label it with what PBS said."""
    assert how_ended(state, exit_code) == (label, colour)


def test_collector_draws_every_flush_of_every_process(run):
    """One line per process (the scheduler, each worker by its address), a point per flush:
    its CPU, its rows and the time since the one before, as the store's flushes table holds
    them; the title gives the totals each process recorded at its end."""
    import numpy as np

    flushes = run.flushes()
    assert len(flushes) and "collector" in plot.available_views(run)
    fig = plot.collector(run)
    render(fig)
    cpu, rows, gaps = fig.axes[:3]
    addresses = set(run.workers()["address"])
    drawn = {line.get_label(): line for line in cpu.get_lines()}
    assert set(drawn) == {"scheduler", *addresses}
    t0 = analysis.origin(run)
    for label, line in drawn.items():
        kind = "scheduler" if label == "scheduler" else "worker"
        mine = flushes[flushes["kind"] == kind]
        if kind == "worker":
            group = run.workers().set_index("address").loc[label, "group"]
            mine = mine[mine["group"].str.endswith("/" + group)]
        assert np.allclose(line.get_xdata(), mine["time"] - t0)
        assert np.allclose(line.get_ydata(), mine["cpu_s"] * 1000)
    assert sum(len(line.get_xdata()) for line in rows.get_lines()) == len(flushes)
    ys = np.concatenate([line.get_ydata() for line in gaps.get_lines()])
    assert np.allclose(np.sort(ys), np.sort(flushes["gap_s"]))
    cost = run.collector_cost(per="process")
    assert (
        fig.axes[0]
        .get_title()
        .startswith(
            f"What collecting cost: flushes {cost.flush_cpu_s.sum():.2f} CPU-s of "
            f"{cost.process_cpu_s.sum():.1f} CPU-s ("
        )
    )
    assert fig.axes[0].get_title().endswith(f"in 3 processes, {len(flushes)} flushes")


def test_collector_of_a_store_without_flushes_says_so(tmp_path):
    """A store written before each flush was recorded: the view says so in one figure, and
    the report leaves it out."""
    from tests.test_store import store_of_groups

    store = store_of_groups(str(tmp_path / "older.zarr"), {"ended": 3.0}, {})
    older = metacollect.open_run(store)
    assert len(older.collector_cost()) == 1 and not len(older.flushes())
    assert "collector" not in plot.available_views(older)
    (text,) = plot.collector(older).axes[0].texts
    assert "no flush was recorded one by one" in text.get_text()
