"""metacollect.analysis on a real LocalCluster run, checked against what the run did."""

from __future__ import annotations

import pandas as pd
import pytest
from views_runs import CHAIN, LONG_CHAIN, WIDE, basic_store, chain_store

import metacollect
from metacollect import analysis
from metacollect.errors import StoreError, UsageError
from metacollect.store import documents


@pytest.fixture(scope="module")
def run():
    return metacollect.open_run(basic_store())


def test_task_stream_has_one_row_per_task_run(run):
    ts = analysis.task_stream(run)
    assert len(ts) == CHAIN + WIDE + 1 + 1  # chain, wide + total, boom
    assert sorted(ts["key"]) == sorted(
        [f"inc-{i}" for i in range(CHAIN)]
        + [f"slow-{i}" for i in range(WIDE)]
        + ["total-0", "boom-0"]
    )
    # one row per worker thread: 2 workers x at most 2 threads, rows numbered densely
    assert ts["row"].nunique() == ts[["worker", "thread"]].drop_duplicates().shape[0] <= 4
    assert set(ts["row"]) == set(range(ts["row"].nunique()))
    assert (ts["t_stop"] >= ts["t_start"]).all() and (ts["t_start"] >= 0).all()
    assert ts.set_index("key").at["boom-0", "state"] == "erred"


def test_prefix_summary_counts_and_times(run):
    ps = analysis.prefix_summary(run)
    assert ps.at["inc", "n"] == CHAIN and ps.at["slow", "n"] == WIDE and ps.at["total", "n"] == 1
    assert ps.at["boom", "erred"] == 1 and ps.at["inc", "erred"] == 0
    assert ps.at["inc", "mean"] >= 0.02  # each inc sleeps 20 ms
    assert ps.at["inc", "total"] == pytest.approx(
        run.tasks().query("prefix == 'inc'")["duration"].sum()
    )


def test_progress_totals_equal_task_counts(run):
    pr = analysis.progress(run)
    last = pr.groupby("prefix").last()
    assert last.at["inc", "done"] == CHAIN
    assert last.at["slow", "done"] == WIDE
    assert last.at["boom", "done"] == 1
    states = ["released", "waiting", "processing", "memory", "erred", "forgotten"]
    # the states of a prefix always add up to its keys seen so far, never more than it has
    sums = pr[states].sum(axis=1)
    assert (sums <= pr["prefix"].map({"inc": CHAIN, "slow": WIDE, "total": 1, "boom": 1})).all()
    assert (pr[states] >= 0).all().all()
    assert (
        last.loc["boom", "erred"] + last.loc["boom", "forgotten"] + last.loc["boom", "released"]
        == 1
    )


def test_critical_path_of_a_chain_is_the_chain(run):
    cp = analysis.critical_path(run, graph=0)
    assert list(cp["key"]) == [f"inc-{i}" for i in range(CHAIN)]
    assert cp.attrs["length"] == pytest.approx(cp["duration"].sum())
    assert 0 < cp.attrs["fraction"] <= 1.0 + 1e-9
    # the chain is serial: the path explains a good part of the graph's wall time
    # (the rest is scheduling latency between the 20 ms tasks)
    assert cp.attrs["fraction"] > 0.2


def test_critical_path_of_a_wide_graph_is_one_branch(run):
    cp = analysis.critical_path(run, graph=1)
    assert (
        len(cp) == 2 and cp["key"].iloc[-1] == "total-0" and cp["key"].iloc[0].startswith("slow-")
    )


def test_critical_path_unknown_graph_says_which_exist(run):
    with pytest.raises(StoreError, match=r"no graph 99 .* graphs are \[0, 1, 2\]"):
        analysis.critical_path(run, graph=99)


@pytest.mark.slow
def test_critical_path_of_a_200k_task_chain():
    """Linear in the path's length (it was quadratic: 8 s at 10k tasks, no end at 200k; the
    suite's per-test timeout stops a quadratic one - no timing asserted here)."""
    long_run = metacollect.open_run(chain_store(LONG_CHAIN))
    cp = analysis.critical_path(long_run)
    nodes, edges = analysis.graph_nodes(long_run)
    assert len(cp) == LONG_CHAIN and cp["key"].iloc[0] == "inc-0"
    assert (cp["key"].to_numpy() == [f"inc-{i}" for i in range(LONG_CHAIN)]).all()
    assert cp.attrs["length"] == pytest.approx(LONG_CHAIN * 5e-4, rel=1e-3)
    assert cp.attrs["fraction"] == pytest.approx(0.5, rel=1e-3)
    depth = nodes.set_index("key")["depth"]
    assert depth["inc-0"] == 0 and depth[f"inc-{LONG_CHAIN - 1}"] == LONG_CHAIN - 1
    assert len(edges) == LONG_CHAIN - 1


def test_critical_path_fraction_ignores_the_workers_clock_offsets():
    """A worker's task times carry its estimate of its clock offset from the scheduler's,
    which heartbeats keep changing; a chain whose estimate changed midway looks longer than
    the span from its first start to its last stop (here 4 tasks of 0.5 ms, 1 ms apart,
    the last two read 2 ms early: 2.0 ms of work in 1.5 ms). The wall is measured on the
    scheduler's clock, which a serial chain cannot exceed."""
    run = metacollect.open_run(chain_store(4, skew=-2e-3))
    tasks = run.tasks()
    assert tasks["duration"].sum() > tasks["stop"].max() - tasks["start"].min()  # the trap
    cp = analysis.critical_path(run)
    assert cp.attrs["length"] == pytest.approx(4 * 5e-4, abs=1e-6)  # times near 1.7e9 s
    assert cp.attrs["wall"] == pytest.approx(3.5e-3, abs=1e-6)  # first start to last arrival
    assert cp.attrs["fraction"] == pytest.approx(2e-3 / 3.5e-3, rel=1e-3)


def test_graph_nodes_depths(run):
    nodes, edges = analysis.graph_nodes(run, 0)
    assert dict(zip(nodes["key"], nodes["depth"], strict=False)) == {
        f"inc-{i}": i for i in range(CHAIN)
    }
    assert len(edges) == CHAIN - 1
    nodes, _ = analysis.graph_nodes(run, 1)
    assert nodes.set_index("key").at["total-0", "depth"] == 1


def test_utilisation_and_memory(run):
    ut = analysis.utilisation(run)
    assert len(ut) == 2 and ut["n_tasks"].sum() == len(run.tasks())
    assert ut["busy"].sum() == pytest.approx(run.tasks()["duration"].sum())
    assert ((ut["utilisation"] > 0) & (ut["utilisation"] <= 1)).all()
    mem = analysis.memory(run)
    assert len(mem) == len(run.worker_states()) and set(mem["worker"]) == set(ut.index)
    one_time = mem[mem["time"] == mem["time"].iloc[-1]]
    assert one_time["total_nbytes"].iloc[0] == one_time["nbytes"].sum()
    load = analysis.worker_load(run)
    assert (load["processing"] >= 0).all() and (load["occupancy"] >= 0).all()


def test_compare_and_catalog(run, tmp_path):
    cmp = analysis.compare([run, run], labels=["a", "b"])
    assert list(cmp.index) == ["a", "b"] and (cmp["tasks"] == len(run.tasks())).all()
    per = analysis.compare_prefixes([run, run], labels=["a", "b"])
    assert per.at["inc", "a"] == per.at["inc", "b"] > 0
    with pytest.raises(UsageError, match="one label per run"):
        analysis.compare([run], labels=["a", "b"])
    (tmp_path / "broken.zarr").mkdir()
    import shutil

    shutil.copytree(run.path, tmp_path / "sub" / "a.zarr")
    cat = metacollect.catalog(tmp_path)
    assert len(cat) == 2
    good = cat[cat["problem"] == ""].iloc[0]
    assert good["tasks"] == len(run.tasks()) and good["wall_time"] > 0
    assert (
        "not a Zarr" in cat[cat["problem"] != ""].iloc[0]["problem"]
        or "NotAStore" in cat[cat["problem"] != ""].iloc[0]["problem"]
    )
    assert isinstance(cat, pd.DataFrame)


def test_compare_profiles_and_io(run):
    prof = analysis.compare_profiles([run, run], labels=["a", "b"], top=None)
    assert {"a", "b", "delta_b"} <= set(prof.columns)
    assert (prof["delta_b"] == 0).all() and (prof["a"] > 0).any()
    assert any(name.endswith(":inc") for name in prof.index)  # the chain's function
    assert len(analysis.compare_profiles([run], top=5)) == 5
    io = analysis.compare_io([run], labels=["a"])
    assert not io.at["a", "has_io"] and io.at["a", "bytes_read"] == 0  # no Darshan here


def test_a_sealed_stores_tables_are_read_without_opening_their_metadata_again(monkeypatch):
    """Opening a store reads every node's ``zarr.json`` once (and checks them against the
    seal); a sealed store's tables are then made from those documents, not opened through
    Zarr one file at a time (most of the time of a run of many workers). They read the same
    as through Zarr, and ``committed`` counts each table's rows as its arrays say."""
    from metacollect.store import zarrio
    from metacollect.store.integrity import committed_rows

    path = basic_store()
    through_zarr = metacollect.open_run(path)
    assert through_zarr.groups and through_zarr._open.docs is not None  # sealed
    through_zarr._open = documents.Nodes(through_zarr.root)
    expected = {
        "tasks": through_zarr.tasks(),
        "transitions": through_zarr.transitions(),
        "workers": through_zarr.workers(),
        "metrics": through_zarr.worker_metrics(),
        "startstops": through_zarr.worker_table("startstops"),
    }
    counted = {}
    for group in through_zarr.groups:
        spec = through_zarr.schema.match(group)
        for table in spec.tables if spec else {}:
            try:
                tg = zarrio.group_at(through_zarr.root, f"{group}/{table}" if group else table)
            except KeyError:
                counted[(group, table)] = None
            else:
                counted[(group, table)] = committed_rows(tg)
    assert any(n for n in counted.values())

    run = metacollect.open_run(path)
    assert run.groups == through_zarr.groups

    def opened_again(*args, **kwargs):
        raise AssertionError(f"a node opened through Zarr again: {args[1:]}")

    for name in ("group_at", "array_at", "members"):
        monkeypatch.setattr(zarrio, name, opened_again)
    got = {
        "tasks": run.tasks(),
        "transitions": run.transitions(),
        "workers": run.workers(),
        "metrics": run.worker_metrics(),
        "startstops": run.worker_table("startstops"),
    }
    for name, frame in expected.items():
        assert len(frame), name
        pd.testing.assert_frame_equal(got[name], frame, obj=name)
    assert {key: run.committed(*key) for key in counted} == counted
