"""``metacollect.diff`` and ``metacollect compare`` on two real runs of the same graph whose
difference the test made: in run B one worker sleeps 8x longer in every ``work`` task and
work stealing is off (see :mod:`diff_runs`). The ground truth is the test's own: which
worker ran each key (every task returns its worker's name), the graph's dependencies."""

from __future__ import annotations

import os
import re

import pandas as pd
import pytest
from diff_runs import N_COMBINE, N_WORK, SLOW, pair

import metacollect
from metacollect.cli import main
from metacollect.errors import UsageError
from tests.test_darshan_live import darshan_library  # noqa: F401  (the fixture)
from tests.test_report_html import _objects, _sources
from tests.test_ro_crate import _run


@pytest.fixture(scope="module")
def runs():
    a, b, placed_a, placed_b = pair()
    return metacollect.open_run(a), metacollect.open_run(b), placed_a, placed_b


@pytest.fixture(scope="module")
def d(runs):
    a, b, _, _ = runs
    return metacollect.diff(a, b)


def _dependencies() -> dict[str, set[str]]:
    per = N_WORK // N_COMBINE
    deps = {f"combine-{j}": {f"work-{i}" for i in range(j * per, (j + 1) * per)}
            for j in range(N_COMBINE)}  # fmt: skip
    deps["total-0"] = {f"combine-{j}" for j in range(N_COMBINE)}
    return deps


def test_the_slowed_worker_is_named_first_and_the_changed_config(d):
    first = d.findings[0]
    assert (first.kind, first.subject) == ("worker", SLOW)
    assert first.seconds > 0.2  # each of its work tasks slept 0.75 s more than the median
    assert d.workers.loc[SLOW, "slowdown_b"] > 3 > d.workers.loc[SLOW, "slowdown_a"]
    # the prefix's typical cost did not change: the worker explains the prefix's growth
    work = d.prefixes.loc["work"]
    assert work.delta_total > 0.2 and abs(work.delta_typical) < 0.5 * work.delta_total
    config = d.config.set_index("key")
    assert config.loc["distributed.scheduler.work-stealing", "a"] is True
    assert config.loc["distributed.scheduler.work-stealing", "b"] is False
    text = d.text()
    numbered = re.findall(r"^  (\d+)\. (.*)$", text, flags=re.M)
    assert numbered[0] == ("1", numbered[0][1]) and numbered[0][1].startswith(f"worker {SLOW}:")
    assert "distributed.scheduler.work-stealing: True -> False" in text
    # the wall time leads, before the differences
    assert text.index("wall time:") < text.index("1. worker") < text.index("configuration:")


def test_placement_is_where_the_tasks_said_they_ran(runs, d):
    _, _, placed_a, placed_b = runs
    s = d.scheduling
    assert s.matched == len(placed_a) == N_WORK + N_COMBINE + 1 and s.only_a == s.only_b == 0
    got = s.placement.set_index("key")
    for key in placed_a:
        assert (got.at[key, "worker_a"], got.at[key, "worker_b"]) == (
            placed_a[key],
            placed_b[key],
        )
    assert s.moved == sum(placed_a[k] != placed_b[k] for k in placed_a)


def test_waits_and_what_made_each_task_ready(d):
    w = d.scheduling.waits.set_index("key")
    assert (w[["wait_a", "wait_b", "queued_a", "queued_b"]] >= 0).all().all()
    assert (w["delta"] == w["wait_b"] - w["wait_a"]).all()
    assert list(d.scheduling.waits["delta"]) == sorted(d.scheduling.waits["delta"], reverse=True)
    deps = _dependencies()
    for run in ("a", "b"):
        for key, by in w[f"readied_by_{run}"].items():
            if key.startswith("work-"):
                assert by == ""  # a root task is ready when submitted
            else:  # the dependency whose end made it ready, and where that ran
                assert re.fullmatch(r"(\S+) \(on worker \S+\)", by), by
                assert by.split()[0] in deps[key]
    # combines fetched what they needed from other workers: the transfers are counted
    assert w.loc[w.index.str.startswith("combine"), "fetched_b"].sum() > 0
    top = d.scheduling.waits.iloc[0]
    assert "processing (task-finished" in top.chain_b or "processing (update-graph" in top.chain_b


def test_critical_paths_compared(d):
    s = d.scheduling
    assert len(s.critical_a) == len(s.critical_b) == 3  # work -> combine -> total
    assert s.critical_b.iloc[-1].key == s.critical_a.iloc[-1].key == "total-0"
    shared = sum(1 for x, y in zip(s.critical_a.key, s.critical_b.key, strict=True) if x == y)
    assert s.common_path <= shared
    assert s.critical_b.attrs["length"] > s.critical_a.attrs["length"]  # the slowed work task


def test_a_run_against_itself_has_no_difference(runs):
    a = runs[0]
    same = a.diff(a)
    assert same.scheduling.moved == 0 and (same.scheduling.waits["delta"] == 0).all()
    assert all(f.seconds == 0 for f in same.findings if f.kind in ("worker", "prefix"))
    assert [len(t) for t in (same.config, same.cluster, same.packages, same.environment)] == [
        0,
        0,
        0,
        0,
    ]
    assert same.wall["delta"].abs().max() == 0


def test_cli_compare_text_and_page(runs, tmp_path, capsys):
    a, b, _, _ = runs
    out = tmp_path / "compare.html"
    assert main(["compare", a.path, b.path, "--html", str(out), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert re.search(rf"^  1\. worker {SLOW}:", text, flags=re.M)
    assert "distributed.scheduler.work-stealing: True -> False" in text
    page = out.read_text()
    objs = _objects(page)
    tabs = [o["attributes"]["title"] for o in objs if o["name"] == "TabPanel"]
    assert tabs == [
        "Summary",
        "Task streams",
        "Prefixes and workers",
        "Scheduling",
        "Configuration",
    ]
    # both task streams hold every task, on the worker it said it ran on
    streams = _sources(objs, "key", "worker", "left", "right")
    assert len(streams) == 2
    for stream, placed in zip(streams, runs[2:], strict=True):
        assert dict(zip(stream["key"], stream["worker"], strict=True)) == placed
    # the waits plotted A against B: one point per task of both runs
    (waits,) = _sources(objs, "a", "b", "key", "moved")
    assert sorted(waits["key"]) == sorted(runs[2])
    assert "distributed.scheduler.work-stealing" in page


def test_cli_compare_needs_two_stores(runs, capsys):
    assert main(["compare", runs[0].path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs two stores or more" in err[0]
    with pytest.raises(UsageError, match="one label per run"):
        metacollect.diff(runs[0], runs[1], labels=("a",))  # type: ignore[arg-type]
    assert isinstance(metacollect.diff(runs[0], runs[1], labels=("x", "y")).wall, pd.DataFrame)


def test_cli_compares_each_store_with_the_first(runs, capsys):
    a, b, _, _ = runs
    assert main(["compare", a.path, b.path, a.path, "--top", "2"]) == 0
    text = capsys.readouterr().out
    assert text.count(f"({a.path})\nB = ") == 2  # two comparisons, each against A
    assert text.count("distributed.scheduler.work-stealing") == 1  # B against A only
    assert re.search(r"^scheduling \(tasks matched by key\):\n  33 tasks in both runs", text, re.M)


@pytest.mark.darshan
def test_io_compared_when_darshan_ran(tmp_path, darshan_library):  # noqa: F811
    ran = _run(tmp_path, False, darshan_library)
    assert ran["code"] == 0
    run = metacollect.open_run(ran["store"])
    d = metacollect.diff(run, run)
    written = sum(os.path.getsize(p) for p in ran["outputs"])
    assert d.io.at["bytes_written", "a"] >= written  # the test's files, and the processes' own
    assert (d.io["delta"] == 0).all()
    io = [f for f in d.findings if f.kind == "io"]
    assert len(io) == 1 and io[0].seconds == 0 and "I/O (Darshan)" in io[0].text
