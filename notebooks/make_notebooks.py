"""Regenerate the notebooks of this directory (unexecuted; the tests execute them)."""

from __future__ import annotations

import os

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))

SETUP = """\
%matplotlib inline
import tempfile, time
import dask, dask.array as da
from distributed import Client, LocalCluster
import metacollect
from metacollect import analysis, plot
workdir = tempfile.mkdtemp(prefix="metacollect-notebook-")"""


def nb(name: str, cells: list[tuple[str, str]]) -> None:
    book = new_notebook(
        cells=[new_markdown_cell(t) if k == "md" else new_code_cell(t) for k, t in cells]
    )
    book.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(book, os.path.join(HERE, name))


nb(
    "01-tour-of-a-run.ipynb",
    [
        (
            "md",
            "# A tour of a run\n\nCollect a small dask.array computation on a LocalCluster into one Zarr store, "
            "then walk it: levels and steps of the metadata map, the tables, and the dashboard views after the fact.",
        ),
        ("code", SETUP),
        (
            "code",
            """\
store = f"{workdir}/tour.zarr"
with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster, Client(cluster) as client:
    with metacollect.collect(client, store):
        x = da.random.random((1000, 1000), chunks=(250, 250))
        print((x @ x.T).mean().compute())
run = metacollect.open_run(store)
run""",
        ),
        (
            "md",
            "## Levels and steps\nEvery group of the store sits at one level (run, job, client, scheduler, worker, ...) and one step (1-5) of the metadata map.",
        ),
        ("code", "run.levels()"),
        ("code", "list(run.step(3)), list(run.step(4))"),
        (
            "md",
            "## Tables\nEverything is a pandas DataFrame: one row per task execution, per transition, per worker ...",
        ),
        ("code", "run.tasks().head()"),
        ("code", "analysis.prefix_summary(run)"),
        ("code", "analysis.utilisation(run)"),
        ("md", "## The dashboard, after the fact"),
        ("code", "plot.task_stream(run)"),
        ("code", "plot.progress(run)"),
        ("code", "plot.memory(run)"),
        ("code", "plot.processing(run)"),
        ("md", "## Beyond the dashboard: the task graph and its critical path"),
        ("code", "plot.task_graph(run, color='duration')"),
        (
            "code",
            """\
cp = analysis.critical_path(run)
print(f"{len(cp)} tasks, {cp.attrs['length']:.3f} s of {cp.attrs['wall']:.3f} s wall ({cp.attrs['fraction']:.0%})")
plot.critical_path(run)""",
        ),
        ("md", "## A Perfetto trace (open it in ui.perfetto.dev)"),
        (
            "code",
            """\
from metacollect.export import perfetto
# `metacollect report STORE -o DIR` writes every view below into one offline index.html
perfetto.write(run, f"{workdir}/trace.json")""",
        ),
    ],
)

nb(
    "02-io-and-profile.ipynb",
    [
        (
            "md",
            "# I/O and profile\n\nStep 5 of the metadata map: what happens inside the worker processes. "
            "Yappi profiles every worker thread (and attributes time to tasks); Darshan records the I/O "
            "when its library is available. Views are drawn only when the store has the data.",
        ),
        ("code", SETUP + "\nimport numpy as np, os"),
        (
            "code",
            """\
def write_and_read(i, directory):
    path = os.path.join(directory, f"block-{i}.npy")
    np.save(path, np.random.default_rng(i).random((300, 300)))
    return float(np.load(path).sum())

store = f"{workdir}/io.zarr"
with dask.config.set({"metacollect.yappi.enabled": True}):
    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster, Client(cluster) as client:
        with metacollect.collect(client, store):
            parts = [dask.delayed(write_and_read)(i, workdir) for i in range(8)]
            print(dask.compute(sum(parts))[0])
run = metacollect.open_run(store)
sorted(plot.available_views(run))""",
        ),
        (
            "md",
            "## Profile (Yappi)\nTop functions by own time, per worker and per task prefix.",
        ),
        (
            "code",
            """\
prof = run.profile() if hasattr(run, "profile") else None
prof.head(10) if prof is not None else "this metacollect has no Yappi reader\"""",
        ),
        ("code", "plot.profile(run)"),
        (
            "md",
            "## I/O (Darshan)\nWhen the workers ran with Darshan, `run.io()` holds one row per file and worker, and DXT segments appear over the task stream and in the Perfetto trace.",
        ),
        ("code", "plot.io(run)"),
        ("code", "plot.task_stream(run)"),
    ],
)

nb(
    "03-comparing-runs.ipynb",
    [
        (
            "md",
            "# Comparing runs\n\nThe same computation with two chunk sizes: wall time, compute time, per-prefix durations, and a catalog of every run in a directory.",
        ),
        ("code", SETUP),
        (
            "code",
            """\
stores = {}
with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster, Client(cluster) as client:
    for chunk in (250, 500):
        stores[chunk] = f"{workdir}/chunks-{chunk}.zarr"
        with metacollect.collect(client, stores[chunk]):
            x = da.random.random((1000, 1000), chunks=(chunk, chunk))
            (x + x.T).sum().compute()
runs = [metacollect.open_run(s) for s in stores.values()]
labels = [f"chunks {c}" for c in stores]""",
        ),
        (
            "code",
            "analysis.compare(runs, labels)[['wall_time', 'tasks', 'compute_time', 'utilisation']]",
        ),
        ("code", "analysis.compare_prefixes(runs, labels)"),
        ("code", "plot.compare(runs, labels)"),
        (
            "md",
            "## A catalog of runs\nOne row per store under a directory, with its main figures (stores that cannot be read are listed with the reason).",
        ),
        ("code", "metacollect.catalog(workdir)"),
    ],
)

nb(
    "04-image-pipeline.ipynb",
    [
        (
            "md",
            "# The reference workflow: an image-processing pipeline on dask.array, instrumented end to end\n\n"
            "Synthetic images are written to disk, read lazily, smoothed with an overlapping stencil, thresholded, "
            "reduced to per-image statistics, and written back as tiles (`metacollect.demo`).",
        ),
        ("code", SETUP + "\nfrom metacollect.demo import run_demo"),
        (
            "code",
            """\
store = f"{workdir}/pipeline.zarr"
with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster, Client(cluster) as client:
    with metacollect.collect(client, store):
        result = run_demo(f"{workdir}/data", n_images=3, size=256)
print(result["foreground_fraction"])
run = metacollect.open_run(store)
run""",
        ),
        ("code", "run.graphs()[['graph', 'n_tasks', 'n_dependencies']]"),
        ("code", "analysis.prefix_summary(run).head(10)"),
        ("code", "plot.task_graph(run)"),
        ("code", "plot.task_stream(run)"),
        ("code", "plot.progress(run, max_prefixes=6)"),
        (
            "code",
            """\
cp = analysis.critical_path(run)
cp[['prefix', 'worker', 'duration']]""",
        ),
        ("code", "plot.critical_path(run)"),
        (
            "code",
            """\
import os
from metacollect.report import write_report
index = write_report(run, f"{workdir}/report")
sorted(os.listdir(os.path.dirname(index)))""",
        ),
    ],
)

nb(
    "05-spans-and-fine-metrics.ipynb",
    [
        (
            "md",
            "# Spans and fine performance metrics\n\n"
            "Dask groups the work of a computation into spans (`distributed.span`, nested, and a "
            "`default` span for unannotated work) and measures where each task prefix's time goes: "
            "thread CPU, thread time beyond CPU (sleeping, I/O, waiting for the GIL), Dask's own "
            "overhead (`executor`, `other`), spilling, (de)serialisation. The dashboard shows it live "
            "and forgets it with the cluster; metacollect keeps it in the store, over time and per span.",
        ),
        ("code", SETUP + "\nfrom distributed import span, wait\nfrom metacollect.export import perfetto"),
        (
            "code",
            """\
def spin(seconds):
    \"\"\"Pure Python work: thread CPU, where Dask's sampling profiler sees it.\"\"\"
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n

store = f"{workdir}/spans.zarr"
with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster, Client(cluster) as client:
    with metacollect.collect(client, store):
        with span("prepare"):
            x = da.random.random((2000, 2000), chunks=(500, 500)).persist()
            wait(x)
            with span("normalise"):
                y = ((x - x.mean()) / x.std()).persist()
                wait(y)
        with span("simulate"):
            print(sum(client.gather(client.map(spin, [0.3] * 8, pure=False))))
        print(float((x @ y.T).sum().compute()))  # no span: Dask's "default" span
        del x, y
run = metacollect.open_run(store)
run""",
        ),
        (
            "md",
            "## The span tree\nOne row per span: its parent, when its first task started and its last one stopped, "
            "how many of its own tasks ran.",
        ),
        ("code", "run.spans()[['name', 'depth', 'start', 'duration', 'n_tasks', 'done']]"),
        ("code", "plot.span_timeline(run)"),
        (
            "md",
            "## Where the threads' time went\nExecute seconds per task prefix and activity, summed over "
            "workers, spans and time (`run.fine_metrics(time=True)` keeps each flush's delta instead).",
        ),
        (
            "code",
            """\
fm = run.fine_metrics(by=["context", "prefix", "activity", "unit"])
execute = fm[(fm.context == "execute") & (fm.unit == "seconds")]
execute.pivot_table(index="prefix", columns="activity", values="value", aggfunc="sum", fill_value=0)""",
        ),
        (
            "md",
            "The dashboard's *Fine Performance Metrics* page, after the fact: by prefix, by activity with "
            "the time the cluster's threads left idle, and the seconds spent sending data to other workers.",
        ),
        ("code", "plot.fine_metrics(run)"),
        (
            "md",
            "One span's own tasks; its child spans and idle make up the rest of its wall time times the threads.",
        ),
        ("code", "plot.fine_metrics(run, span='prepare')"),
        (
            "md",
            "## Per span: Dask, Darshan and Yappi side by side\n`span_summary` adds the bytes the span's "
            "tasks read and wrote (Darshan) and their heaviest functions (Yappi) when the run has them.",
        ),
        (
            "code",
            "run.span_summary()[['name', 'duration', 'n_tasks', 'thread-cpu', 'thread-noncpu', 'executor', 'other', 'execute', 'idle']]",
        ),
        (
            "md",
            "## Dask's sampled profile\nEvery run has it, Yappi or not: per function, the seconds sampled in "
            "it (`self`) and in it or below (`total`).",
        ),
        ("code", "run.dask_profile(prefix='spin').head(10)"),
        (
            "md",
            "## In Perfetto\nSpans are nested slices of a `spans` process; each worker has counters of its "
            "execute seconds by activity (open the file in ui.perfetto.dev).",
        ),
        (
            "code",
            """\
perfetto.write(run, f"{workdir}/trace.json")
doc = perfetto.trace(run)
[(e["name"], e["ph"], e["tid"]) for e in doc["traceEvents"] if e.get("cat") == "span"]""",
        ),
    ],
)
