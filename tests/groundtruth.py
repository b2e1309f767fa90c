"""The ground truth a script-corpus test compares a store with, taken without metacollect.

A scheduler preload of the test's own (``DASK_DISTRIBUTED__SCHEDULER__PRELOAD`` names this
file, as a user names their own preloads; ``metacollect run`` appends its preload after it):
every scheduler the script starts gets a :class:`GroundTruth` plugin that keeps every
transition and every executed task, and writes them as JSON into ``$GROUNDTRUTH_DIR``, one
file per scheduler, whenever the scheduler closes and again at interpreter exit (plain file
writes: no thread pool needed), so it holds what happened up to the process's very end.

:func:`compare` then checks a store against those files, cluster by cluster.
"""

from __future__ import annotations

import atexit
import collections
import glob
import json
import os
import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

ENV = "GROUNDTRUTH_DIR"


class GroundTruth(SchedulerPlugin):
    name = "ground-truth"

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.transitions: list[list[Any]] = []
        self.executed: list[str] = []

    def transition(self, key, start, finish, *args, stimulus_id, **kwargs):
        self.transitions.append([str(key), start, finish, stimulus_id, time.time()])
        if start == "processing" and finish in ("memory", "erred"):
            self.executed.append(str(key))

    def dump(self) -> None:
        out = os.environ.get(ENV)
        if not out:
            return
        path = os.path.join(out, f"{self.scheduler.id}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(
                {
                    "scheduler_id": self.scheduler.id,
                    "transitions": self.transitions,
                    "executed": self.executed,
                },
                f,
            )
        os.replace(path + ".tmp", path)

    async def close(self) -> None:
        self.dump()


def dask_setup(scheduler: Any) -> None:
    plugin = GroundTruth(scheduler)
    scheduler.add_plugin(plugin)
    atexit.register(plugin.dump)


def environment(directory: str) -> dict[str, str]:
    """What a test puts in the script's environment to record the ground truth."""
    os.makedirs(directory, exist_ok=True)
    return {
        ENV: directory,
        "DASK_DISTRIBUTED__SCHEDULER__PRELOAD": json.dumps([os.path.abspath(__file__)]),
    }


def load(directory: str) -> dict[str, dict[str, Any]]:
    """The ground truth of every scheduler, by scheduler id."""
    truth = {}
    for path in glob.glob(os.path.join(directory, "*.json")):
        with open(path) as f:
            data = json.load(f)
        truth[data["scheduler_id"]] = data
    return truth


def compare(run: Any, directory: str, until: dict[str, float] | None = None) -> dict[str, int]:
    """Assert that ``run`` holds exactly the ground truth's transitions and executed tasks,
    scheduler by scheduler; ``until``: per scheduler id, compare only what happened up to that
    time (a scheduler that outlives the script). Returns the counts compared, by kind."""
    truth = load(directory)
    clusters = {run.groups[f"clusters/{c}"]["scheduler_id"]: c for c in run.clusters()}
    assert set(clusters) == set(truth), (sorted(clusters), sorted(truth))
    transitions, tasks = run.transitions(), run.tasks()
    counts = {"schedulers": len(truth), "transitions": 0, "executed": 0}
    for sid, cluster in clusters.items():
        rows = truth[sid]["transitions"]
        executed = truth[sid]["executed"]
        if until and sid in until:
            rows = [r for r in rows if r[4] <= until[sid]]
            keys_then = {r[0] for r in rows if r[1] == "processing" and r[2] in ("memory", "erred")}
            executed = [k for k in executed if k in keys_then]
        expected = collections.Counter(tuple(r[:4]) for r in rows)
        mine = transitions[transitions.cluster == cluster]
        got = collections.Counter(
            zip(mine.key, mine.start, mine.finish, mine.stimulus_id, strict=True)
        )
        assert got == expected, (
            f"cluster {cluster}: {sum((expected - got).values())} transitions missing, "
            f"{sum((got - expected).values())} extra, of {len(rows)}; "
            f"missing e.g. {list(expected - got)[:3]}"
        )
        ran = tasks[tasks.cluster == cluster]
        assert collections.Counter(ran.key) == collections.Counter(executed)
        counts["transitions"] += len(rows)
        counts["executed"] += len(executed)
    return counts
