"""Scaling studies and the campaign catalog on a real series: one workflow run on 1, 2 and 4
worker processes (a LocalCluster each), whose answer the test knows from how it is built.

The workflow: WORK independent ``work`` tasks of a fixed WORK_S seconds each (1 MB result
each), then a chain of STEPS ``step`` tasks of STEP_S seconds, the first needing every
``work`` result. ``work`` scales perfectly (its span is ceil(WORK / n) * WORK_S); ``step`` is
serial (its span stays STEPS * STEP_S, efficiency 1/n); the makespan's efficiency follows
from the two; and the bytes moved are the ``work`` results not on the worker that ran
``step-0``, which the test reads from the scheduler as it runs.
"""

from __future__ import annotations

import math
import os
import shutil
import time

import pandas as pd
import pytest
import zarr
from distributed import Client, LocalCluster, wait
from scaling_work import MB, STEP_S, STEPS, WORK, WORK_S, step, work

import metacollect
from metacollect import analysis, plot
from metacollect.analysis.campaign import SUMMARY_ATTR, stored_summary, write_summary
from metacollect.check.doctor import salvage
from metacollect.cli import main
from metacollect.errors import UsageError

SIZES = (1, 2, 4)


def ideal_makespan(n: int) -> float:
    return math.ceil(WORK / n) * WORK_S + STEPS * STEP_S


def _run_series(directory, per_size) -> dict[int, dict[str, float]]:
    """The workflow at each size, ``per_size(n)`` work tasks; what the test saw of each."""
    truth = {}
    for n in SIZES:
        store = str(directory / f"w{n}.zarr")
        with (
            LocalCluster(
                n_workers=n, threads_per_worker=1, dashboard_address=":0", processes=True
            ) as cluster,
            Client(cluster) as client,
            metacollect.collect(client, store),
        ):
            t0 = time.perf_counter()
            parts = [client.submit(work, i, key=f"work-{i}") for i in range(per_size(n))]
            wait(parts)  # where each result was made, before the step fetches copies
            made = client.who_has(parts)
            s = first = client.submit(step, *parts, key="step-0")
            for j in range(1, STEPS):
                s = client.submit(step, s, key=f"step-{j}")
            assert s.result() == 1
            elapsed = time.perf_counter() - t0
            (runner,) = client.who_has([first])[first.key]
            fetched = sum(runner not in made[p.key] for p in parts)
        truth[n] = {"elapsed": elapsed, "fetched_bytes": fetched * MB * 8}
    return truth


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """The stores of the series and what the test recorded of each run: its own wall clock
    around the compute and the bytes the step's worker had to fetch."""
    directory = tmp_path_factory.mktemp("series")
    truth = _run_series(directory, lambda n: WORK)
    return str(directory), truth


@pytest.mark.slow
def test_strong_scaling_of_a_series_with_a_known_answer(series):
    directory, truth = series
    study = metacollect.scaling(directory, threshold=0.7)
    runs = study.runs
    assert list(runs.index) == list(SIZES) and list(runs["workers"]) == list(SIZES)
    for n in SIZES:
        # the makespan: at least the tasks' own time, within what the test's clock saw
        assert ideal_makespan(n) <= runs.at[n, "makespan"] <= truth[n]["elapsed"]
        expected = ideal_makespan(1) / (n * ideal_makespan(n))
        assert runs.at[n, "efficiency"] == pytest.approx(expected, abs=0.12)
        # bytes moved: the work results the step's worker fetched (plus the step's ints)
        assert truth[n]["fetched_bytes"] <= runs.at[n, "transfer_bytes"]
        assert runs.at[n, "transfer_bytes"] < truth[n]["fetched_bytes"] + 10_000
        assert runs.at[n, "compute_time"] >= WORK * WORK_S + STEPS * STEP_S
    pre = study.prefixes
    for n in SIZES:
        # work scales (each worker's first task waits for its dispatch: under a loaded
        # machine's latency, a few tenths); step is serial
        assert pre.at[("work", n), "efficiency"] > 0.75
        assert pre.at[("step", n), "efficiency"] == pytest.approx(1 / n, abs=0.05)
        assert pre.at[("work", n), "span"] >= math.ceil(WORK / n) * WORK_S
    limits = study.limits.set_index("what")
    # ideal efficiencies 1, 0.82, 0.60: the makespan stops scaling at 4 workers
    assert limits.at["makespan", "stops_at"] == 4
    assert limits.at["prefix step", "stops_at"] == 2
    assert "prefix work" not in limits.index
    assert limits.at["transfer_bytes", "stops_at"] == 2  # none on one worker
    # the verdict names the serial prefix as the first cause
    assert study.verdict().startswith("strong scaling stops at 4 workers")
    assert "prefix 'step'" in study.verdict()
    assert study.limits["what"].iloc[0] == "makespan"
    fig = plot.scaling(study)
    assert len(fig.axes) == 5  # four panels and the bytes' twin axis


@pytest.mark.slow
def test_weak_scaling_of_a_series_whose_work_grows_with_the_workers(tmp_path):
    """Two work tasks a worker: the work's span stays, so does the serial chain's; weak
    scaling holds, the compute seconds growing less than as n (the chain's are fixed)."""
    truth = _run_series(tmp_path, lambda n: 2 * n)
    # each worker's first task waits for its dispatch: a few tenths on a loaded machine,
    # against 1.7 s of the tasks' own time
    study = metacollect.scaling(str(tmp_path), kind="weak", threshold=0.6)
    runs = study.runs
    for n in SIZES:
        ideal = 2 * WORK_S + STEPS * STEP_S
        assert ideal <= runs.at[n, "makespan"] <= truth[n]["elapsed"]
        assert runs.at[n, "efficiency"] > 0.6
        assert study.prefixes.at[("work", n), "efficiency"] > 0.6
        assert study.prefixes.at[("step", n), "efficiency"] == pytest.approx(1, abs=0.05)
        assert truth[n]["fetched_bytes"] <= runs.at[n, "transfer_bytes"]
    assert study.verdict().startswith("weak scaling holds from 1 to 4 workers")
    expected = (2 * 4 * WORK_S + STEPS * STEP_S) / (4 * (2 * WORK_S + STEPS * STEP_S))
    grown = study.resources.xs("compute_time", level="resource")["growth"]
    assert grown.loc[4] == pytest.approx(expected, abs=0.05)
    assert set(study.limits["what"]) == {"transfer_bytes"}  # none on one worker


@pytest.mark.slow
def test_weak_and_by_threads_read_the_same_series(series):
    directory, _ = series
    by_threads = metacollect.scaling(directory, by="threads", threshold=0.7)
    assert list(by_threads.runs.index) == list(SIZES)  # one thread a worker
    # read as weak scaling, the same series is far from it: the efficiency is T(1)/T(n) > 1
    weak = metacollect.scaling(directory, kind="weak")
    assert (weak.runs["efficiency"].iloc[1:] > 1).all()
    assert "makespan" not in set(weak.limits["what"])
    # weak scaling expects compute seconds to grow as n: the fixed work falls short of it
    grown = weak.resources.xs("compute_time", level="resource")["growth"]
    assert grown.loc[4] == pytest.approx(0.25, abs=0.05)


@pytest.mark.slow
def test_catalog_reads_stored_summaries_and_campaign_prefixes(series, tmp_path):
    directory, _ = series
    copy = tmp_path / "campaign"
    shutil.copytree(directory, copy)
    # collect() keeps a summary in each store it seals: the catalog reads those
    stored = metacollect.catalog(copy)
    assert list(stored["summary"]) == ["stored"] * len(SIZES)
    # a store without one (sealed by an older metacollect): computed from its tables, and said
    for path in stored["path"]:
        del zarr.open_group(path, mode="r+").attrs[SUMMARY_ATTR]
    first = metacollect.catalog(copy)
    assert list(first["summary"]) == ["computed"] * len(SIZES)
    # kept in the stores, then read from them: the same figures
    kept = metacollect.catalog(copy, write_summaries=True)
    assert list(kept["summary"]) == ["written"] * len(SIZES)
    again = metacollect.catalog(copy)
    assert list(again["summary"]) == ["stored"] * len(SIZES)
    cols = ["run_id", "status", "wall_time", "workers", "threads", "tasks", "erred",
            "compute_time", "prefixes", "transfers", "errors", "utilisation"]  # fmt: skip
    pd.testing.assert_frame_equal(again[cols], first[cols], check_dtype=False)
    pd.testing.assert_frame_equal(stored[cols], first[cols], check_dtype=False)
    assert (again["started"] == first["started"]).all()
    assert list(again["workers"]) == list(SIZES)
    # per prefix over the campaign: each store's prefix_summary, summed
    camp = analysis.campaign_prefixes(again)
    assert camp.at["work", "runs"] == len(SIZES) and camp.at["work", "n"] == WORK * len(SIZES)
    assert camp.at["step", "n"] == STEPS * len(SIZES)
    total = sum(
        analysis.prefix_summary(metacollect.open_run(p)).at["work", "total"] for p in again["path"]
    )
    assert camp.at["work", "total"] == pytest.approx(total)
    assert camp.attrs["problems"] == {}
    # the scaling study reads the catalog as well as the directory
    assert list(metacollect.scaling(again).runs.index) == list(SIZES)


@pytest.mark.slow
def test_stale_and_foreign_summaries_are_not_read(series, tmp_path):
    directory, _ = series
    store = str(tmp_path / "w2.zarr")
    shutil.copytree(os.path.join(directory, "w2.zarr"), store)
    written = write_summary(store)
    assert stored_summary(store)["tasks"] == written["tasks"] == WORK + STEPS
    # a store salvaged from it carries its attributes, the summary among them, and its own
    # seal: that summary is not the new store's, which is summarised from its tables
    salvaged = str(tmp_path / "salvaged.zarr")
    salvage(store, salvaged)
    assert SUMMARY_ATTR in metacollect.open_run(salvaged).attrs
    assert stored_summary(salvaged) is None
    assert metacollect.catalog([salvaged])["summary"].tolist() == ["computed"]


@pytest.mark.slow
def test_scaling_and_catalog_commands(series, capsys):
    directory, _ = series
    assert main(["scaling", directory, "--threshold", "0.7", "--prefixes"]) == 0
    out = capsys.readouterr().out
    assert "strong scaling stops at 4 workers" in out and "prefix 'step'" in out
    assert "bytes transferred between workers" in out
    assert main(["catalog", directory, "--prefixes"]) == 0
    out = capsys.readouterr().out
    assert f"{len(SIZES)} stores" in out and "work" in out and "step" in out


def test_scaling_bad_input_says_how_to_fix_it(tmp_path):
    with pytest.raises(UsageError, match="two runs or more"):
        metacollect.scaling([])
    with pytest.raises(UsageError, match="use 'strong' or 'weak'"):
        metacollect.scaling([], kind="linear")
    with pytest.raises(UsageError, match="use one of workers, threads, nodes"):
        metacollect.scaling([], by="gpus")
    assert main(["scaling", str(tmp_path / "nowhere")]) == 2
    with pytest.raises(UsageError, match="not a directory"):
        metacollect.catalog(tmp_path / "nowhere")


def test_metacollect_run_keeps_the_summary_a_catalog_reads(tmp_path, capsys):
    script = tmp_path / "flow.py"
    script.write_text(
        "from distributed import Client\n"
        "if __name__ == '__main__':\n"
        "    with Client(n_workers=1, threads_per_worker=1, dashboard_address=':0') as c:\n"
        "        print(sum(c.gather(c.map(abs, range(-5, 5)))))\n"
    )
    store = str(tmp_path / "runs" / "flow.zarr")
    assert main(["run", "--store", store, str(script)]) == 0
    assert "no summary kept" not in capsys.readouterr().err
    kept = stored_summary(store)
    assert kept is not None and kept["tasks"] == 10 and kept["script"] == "flow.py"
    computed = analysis.summary(metacollect.open_run(store))
    for name in ("run_id", "status", "wall_time", "workers", "threads", "tasks", "erred"):
        assert kept[name] == computed[name], name
    assert kept["compute_time"] == pytest.approx(computed["compute_time"])
    assert metacollect.catalog(tmp_path / "runs")["summary"].tolist() == ["stored"]
    assert main(["validate", store]) == 0  # the schema knows the root's summary
