"""Regenerate the notebooks of this directory (unexecuted; the tests execute them)."""

from __future__ import annotations

import os

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from scaling_study import scaling_cells

HERE = os.path.dirname(os.path.abspath(__file__))

SETUP = """\
%matplotlib inline
import os, tempfile, time
import numpy as np, pandas as pd
import dask, dask.array as da
from distributed import Client, LocalCluster
import metacollect
from metacollect import analysis, plot
pd.set_option("display.width", 120)
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
    "01-array-reduction.ipynb",
    [
        (
            "md",
            "# Where did the time go in an xarray reduction?\n\n"
            "Two years of daily temperature on a 200 x 200 grid (an xarray `Dataset` backed by "
            "dask.array, 40 chunks of 5.8 MB), standardised per grid cell and averaged over space: "
            "the shape of many climate diagnostics. metacollect records the run on a LocalCluster of "
            "2 workers x 2 threads into one Zarr store; every number below is computed from that "
            "store. Questions: how much of the wall time did the workers compute, which task prefix "
            "dominates, what bounds the run (critical path, transfers) and was one worker slower.",
        ),
        ("code", SETUP + "\nimport xarray as xr"),
        (
            "code",
            """\\
store = f"{workdir}/anomaly.zarr"
times = pd.date_range("2000-01-01", periods=730, freq="D")
temp = da.random.default_rng(0).normal(15, 8, size=(730, 200, 200), chunks=(73, 100, 100))
ds = xr.Dataset({"temp": (("time", "lat", "lon"), temp)}, coords={"time": times})
with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster, Client(cluster) as client:
    with metacollect.collect(client, store):
        z = (ds.temp - ds.temp.mean("time")) / ds.temp.std("time")
        series = z.mean(("lat", "lon")).compute()
run = metacollect.open_run(store)
print(run)
print(f"result: {series.sizes['time']} daily values, mean {float(series.mean()):+.2e} (≈ 0 by construction)")""",
        ),
        (
            "md",
            "## How much of the wall time was computing?\n"
            "From the first task's start to the last one's stop, each worker thread was either "
            "running a task or not. `run.tasks()` has one row per task execution.",
        ),
        (
            "code",
            """\\
tasks = run.tasks()
t0, t1 = tasks.start.min(), tasks.stop.max()
window = t1 - t0
threads = int(run.workers().drop_duplicates("address").nthreads.sum())
busy = tasks.duration.sum()
print(f"{len(tasks)} tasks in {window:.2f} s on {threads} threads: "
      f"{busy:.2f} thread-seconds of compute = {busy / (threads * window):.0%} of the thread time")
per_worker = tasks.groupby("worker").agg(tasks=("key", "size"), busy=("duration", "sum"))
per_worker["busy_fraction"] = per_worker.busy / (window * run.workers().groupby("address").nthreads.max())
print(f"balance: the busiest worker ran {per_worker.busy.max() / busy:.0%} of the compute seconds, "
      f"its threads busy {per_worker.busy_fraction.max():.0%} of the window against "
      f"{per_worker.busy_fraction.min():.0%} for the least busy")
per_worker""",
        ),
        ("code", "plot.task_stream(run)"),
        (
            "md",
            "## Which task prefix dominates?\n"
            "The compute seconds per prefix (a prefix is the part of a task's key before the "
            "token: `normal` draws the random chunks, `mean_chunk` and `moment_chunk` are the "
            "per-chunk partial sums of the mean and standard deviation).",
        ),
        (
            "code",
            """\\
prefixes = analysis.prefix_summary(run)
share = prefixes.total / prefixes.total.sum()
top = prefixes.index[0]
print(f"{top!r} dominates: {share.iloc[0]:.0%} of the compute time "
      f"({prefixes.n.iloc[0]} tasks, median {prefixes['median'].iloc[0] * 1e3:.1f} ms each); "
      f"the top 3 prefixes take {share.iloc[:3].sum():.0%}")
prefixes[["n", "total", "median", "max", "nbytes"]].head(8)""",
        ),
        ("code", "plot.progress(run, max_prefixes=6)"),
        (
            "md",
            "## What bounds the run?\n"
            "The critical path is the longest chain of dependent tasks: with infinitely many "
            "threads the run would still take that long. Transfers between workers and disk "
            "spill are what workers did besides computing (`analysis.activity`).",
        ),
        (
            "code",
            """\\
cp = analysis.critical_path(run)
print(f"critical path: {len(cp)} tasks, {cp.attrs['length']:.2f} s of compute "
      f"= {cp.attrs['fraction']:.0%} of the graph's {cp.attrs['wall']:.2f} s wall time")
act = analysis.activity(run)
seconds = (act.stop - act.start).groupby(act.action).sum()
for action, sec in seconds.items():
    print(f"{action}: {sec:.2f} s in {int((act.action == action).sum())} intervals")
tr = run.worker_table("transfers")
moved = tr.loc[tr.direction == "in", "total"].sum()
print(f"moved between workers: {moved / 2**20:.1f} MiB "
      f"({moved / run.tasks().nbytes.clip(lower=0).sum():.0%} of all result bytes)")""",
        ),
        ("code", "plot.critical_path(run)"),
        (
            "md",
            "## Was one worker slow?\n"
            "Comparing total busy time mixes in how many tasks each worker got. Compare like with "
            "like instead: for each prefix that matters (10% of the compute or more) run on both "
            "workers, the median task duration (ms) on each worker and the ratio slowest / fastest.",
        ),
        (
            "code",
            """\\
med = tasks.pivot_table(index="prefix", columns="worker", values="duration", aggfunc="median")
counts = tasks.pivot_table(index="prefix", columns="worker", values="duration", aggfunc="size")
# prefixes with at least 5 tasks on every worker and 10% of the compute time: the others are noise
med = med[(counts >= 5).all(axis=1) & (share.reindex(med.index) >= 0.10)]
ratio = (med.max(axis=1) / med.min(axis=1)).sort_values(ascending=False)
slowest = med.idxmax(axis=1)
for prefix in ratio.index:
    print(f"{prefix}: {slowest[prefix]} is {ratio[prefix]:.2f}x slower (median)")
if len(ratio):
    verdict = slowest[ratio.index[0]] if ratio.iloc[0] > 1.5 else None
    print("verdict:", f"{verdict} is slow on {ratio.index[0]}" if verdict else
          f"no worker is more than 1.5x slower than another on the same prefix "
          f"(largest ratio {ratio.iloc[0]:.2f})")
print(f"context: {threads} worker threads on {os.cpu_count()} cores "
      f"(more threads than cores share them, which slows tasks unevenly)")
(med * 1e3).round(2)""",
        ),
        ("code", "plot.memory(run)"),
        (
            "md",
            "## Take it further\n"
            "`metacollect report STORE -o run.html` draws every view of this store into one "
            "interactive HTML file that opens offline; `metacollect export STORE --perfetto trace.json` opens it in ui.perfetto.dev; "
            "`--ro-crate DIR` packages the run for sharing.",
        ),
    ],
)

nb(
    "02-dataframe-shuffle.ipynb",
    [
        (
            "md",
            "# What did a dataframe shuffle cost?\n\n"
            "A month of one-second records (`dask.datasets.timeseries`, 2.6 million rows in 30 "
            "partitions) shuffled by `id` and then aggregated per `id`: the all-to-all step "
            "behind joins, `set_index` and grouped applies. Dask runs it as a P2P shuffle: "
            "the data moves between workers outside the ordinary task transfers, and is "
            "buffered to disk. To see spilling on a laptop-sized example the workers get 1 GiB "
            "each and are told to spill managed memory above 10% of it (a shuffle of terabytes "
            "on a real cluster reaches the default 60% the same way). Questions: how much of "
            "the run was the shuffle, how many bytes moved between which workers, what spilled "
            "and why.",
        ),
        ("code", SETUP + "\nimport dask.dataframe as dd"),
        (
            "code",
            """\\
store = f"{workdir}/shuffle.zarr"
memory = {"distributed.worker.memory.target": 0.10, "distributed.worker.memory.spill": 0.20}
with dask.config.set(memory):
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1GiB",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        df = dask.datasets.timeseries(start="2000-01-01", end="2000-01-31", freq="1s",
                                      partition_freq="1d", seed=0)
        with metacollect.collect(client, store):
            means = df.shuffle("id").groupby("id").x.mean().compute()
run = metacollect.open_run(store)
print(run)
print(f"{len(means)} ids aggregated")""",
        ),
        (
            "md",
            "## How much of the run was the shuffle?\n"
            "Task prefixes with `shuffle` or `p2p` in their name are the shuffle's own tasks: "
            "`shuffle-transfer` splits each input partition and sends its shards, the barrier "
            "waits for all of them, `p2pshuffle` reads each output partition back.",
        ),
        (
            "code",
            """\\
tasks = run.tasks()
prefixes = analysis.prefix_summary(run)
is_shuffle = prefixes.index.str.contains("shuffle|p2p")
shuffle_s, total_s = prefixes.total[is_shuffle].sum(), prefixes.total.sum()
sh = tasks[tasks.prefix.str.contains("shuffle|p2p")]
print(f"shuffle tasks: {shuffle_s:.2f} s of {total_s:.2f} s compute ({shuffle_s / total_s:.0%}), "
      f"from {sh.start.min() - tasks.start.min():.2f} s to {sh.stop.max() - tasks.start.min():.2f} s "
      f"of a {tasks.stop.max() - tasks.start.min():.2f} s run")
prefixes.assign(shuffle=is_shuffle)[["shuffle", "n", "total", "median", "nbytes"]]""",
        ),
        ("code", "plot.task_stream(run)"),
        (
            "md",
            "## Bytes between workers\n"
            "Dask's fine performance metrics (`run.fine_metrics`) account for the P2P shuffle "
            "in the `p2p` context: the shards each worker cut and sent, the seconds its "
            "background comms spent sending, the bytes its disk buffer wrote. Ordinary task "
            "transfers (a task's input fetched from the other worker) are in "
            "`run.worker_table('transfers')`.",
        ),
        (
            "code",
            """\\
fm = run.fine_metrics(by=["worker", "context", "prefix", "activity", "unit"])
p2p = fm[fm.context == "p2p"]
def p2p_total(prefix, activity, unit):
    rows = p2p[(p2p.prefix == prefix) & (p2p.activity == activity) & (p2p.unit == unit)]
    return rows.groupby("worker").value.sum()
sent = p2p_total("background-comms", "process", "bytes")
send_s = p2p_total("background-comms", "send", "seconds")
buffered = p2p_total("background-disk", "disk-write", "bytes")
cut_cpu = p2p_total("foreground", "shard-partition-cpu", "seconds")
per_worker = pd.DataFrame({"shards_sent_MiB": sent / 2**20, "send_s": send_s,
                           "disk_buffer_MiB": buffered / 2**20, "shard_cpu_s": cut_cpu}).fillna(0)
tr = run.worker_table("transfers")
task_moved = tr.loc[tr.direction == "in", "total"].sum()
print(f"P2P: {sent.sum() / 2**20:.1f} MiB of shards sent in {send_s.sum():.2f} s of comms, "
      f"{buffered.sum() / 2**20:.1f} MiB buffered to disk; ordinary task transfers moved "
      f"{task_moved / 2**20:.2f} MiB in {int((tr.direction == 'in').sum())} transfers")
input_bytes = prefixes.nbytes.get("timeseries", 0)
if input_bytes:
    print(f"shards sent / input size: {sent.sum() / input_bytes:.0%} of the input's "
          f"{input_bytes / 2**20:.1f} MiB")
slow = send_s.idxmax() if len(send_s) else None
if slow is not None and send_s.min() > 0:
    print(f"{slow} spent {send_s.max() / send_s.min():.1f}x the other's time sending shards")
per_worker.round(2)""",
        ),
        (
            "code",
            """\\
# the ordinary transfers as a matrix: bytes received by each worker from each peer
incoming = tr[tr.direction == "in"].copy()
addr = run.workers().drop_duplicates("group").set_index("group").address
incoming["receiver"] = incoming.worker_group.map(addr)
(incoming.pivot_table(index="peer", columns="receiver", values="total", aggfunc="sum", fill_value=0)
 / 2**10).round(1).rename_axis(index="from (KiB)", columns="to")""",
        ),
        (
            "md",
            "## What spilled, and why?\n"
            "A worker spills task results it holds to disk when its managed memory passes "
            "`target` x memory limit, or its whole process memory passes `spill` x memory limit "
            "(then it spills until the process is back under target). The scheduler samples "
            "each worker's memory; Dask's fine metrics count every spill and un-spill.",
        ),
        (
            "code",
            """\\
mem = analysis.memory(run)
limit = run.workers().groupby("address").memory_limit.max()
peaks = mem.groupby("worker")[["managed", "unmanaged", "spilled", "process"]].max() / 2**20
peaks["target_MiB"] = limit.reindex(peaks.index) * memory["distributed.worker.memory.target"] / 2**20
peaks["spill_MiB"] = limit.reindex(peaks.index) * memory["distributed.worker.memory.spill"] / 2**20
def metric(context, activity, unit):
    rows = fm[(fm.context == context) & (fm.activity == activity) & (fm.unit == unit)]
    return rows.value.sum()
print(f"spilled by the memory monitor: {metric('memory-monitor', 'disk-write', 'count'):.0f} writes, "
      f"{metric('memory-monitor', 'disk-write', 'bytes') / 2**20:.1f} MiB, "
      f"{metric('memory-monitor', 'disk-write', 'seconds'):.2f} s")
read_back = fm[(fm.context != "p2p") & (fm.activity == "disk-read")]
print(f"read back by tasks and transfers: {read_back[read_back.unit == 'count'].value.sum():.0f} reads, "
      f"{read_back[read_back.unit == 'bytes'].value.sum() / 2**20:.1f} MiB, "
      f"{read_back[read_back.unit == 'seconds'].value.sum():.2f} s")
for w in peaks.index:
    reasons = []
    if peaks.process[w] > peaks.spill_MiB[w]:
        reasons.append(f"process memory {peaks.process[w]:.0f} MiB > spill threshold {peaks.spill_MiB[w]:.0f} MiB")
    if peaks.managed[w] > peaks.target_MiB[w]:
        reasons.append(f"managed {peaks.managed[w]:.0f} MiB > target {peaks.target_MiB[w]:.0f} MiB")
    print(f"{w}: " + ("; ".join(reasons) if reasons else "no threshold crossed in the scheduler's samples")
          + f"; unmanaged memory (interpreter, libraries, buffers) peaked at {peaks.unmanaged[w]:.0f} MiB")
peaks.round(1)""",
        ),
        ("code", "plot.memory(run)"),
        (
            "md",
            "Where each prefix's execute time went (CPU, waiting, disk, (de)serialisation), "
            "from the same fine metrics:",
        ),
        ("code", "plot.fine_metrics(run)"),
    ],
)

nb(
    "03-futures-workflow.ipynb",
    [
        (
            "md",
            "# A futures workflow: task durations, scheduler decisions, retries\n\n"
            "A parameter sweep as many groups run it: 120 independent `simulate` calls submitted "
            "with `client.map`, each a CPU-bound loop whose length we draw from a log-normal "
            "distribution (so the test knows the truth), gathered with `as_completed`. One call "
            "in 20 fails once with a transient `ConnectionError` and is retried "
            "(`retries=2`). Questions: how are task durations distributed and how much does Dask "
            "add to each, how did the scheduler place and queue the tasks, which tasks were "
            "retried and what did the failures cost.",
        ),
        ("code", SETUP + "\nfrom distributed import as_completed"),
        (
            "code",
            """\\
def simulate(i, seconds, scratch):
    \"\"\"Spin for `seconds`; sample i % 20 == 3 fails on its first attempt.\"\"\"
    marker = os.path.join(scratch, f"attempt-{i}")
    if i % 20 == 3 and not os.path.exists(marker):
        open(marker, "w").close()
        raise ConnectionError(f"license server unreachable (sample {i})")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return float(np.random.default_rng(i).random(1000).mean())

N = 120
requested = pd.Series(np.random.default_rng(1).lognormal(np.log(0.05), 0.8, size=N),
                      index=[f"simulate-{i}" for i in range(N)])
store = f"{workdir}/sweep.zarr"
with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster, Client(cluster) as client:
    with metacollect.collect(client, store):
        futures = client.map(simulate, range(N), requested.values, [workdir] * N,
                             retries=2, key=list(requested.index))
        total = sum(f.result() for f in as_completed(futures))
run = metacollect.open_run(store)
print(run)
print(f"sum of the {N} results: {total:.3f}")""",
        ),
        (
            "md",
            "## How are task durations distributed?\n"
            "`run.tasks()` holds the successful execution of each key; the requested durations "
            "are the ground truth, so the difference is what running through Dask added.",
        ),
        (
            "code",
            """\\
tasks = run.tasks().set_index("key")
sim = tasks.loc[requested.index]
q = sim.duration.quantile([0.5, 0.9, 0.99])
print(f"durations: median {q[0.5] * 1e3:.0f} ms, p90 {q[0.9] * 1e3:.0f} ms, p99 {q[0.99] * 1e3:.0f} ms, "
      f"max {sim.duration.max() * 1e3:.0f} ms ({sim.duration.max() / q[0.5]:.1f}x the median)")
longest = sim.duration.nlargest(max(1, N // 10))
print(f"the longest 10% of the tasks take {longest.sum() / sim.duration.sum():.0%} of the compute time")
extra = sim.duration - requested
print(f"measured - requested: median {extra.median() * 1e3:+.2f} ms, max {extra.max() * 1e3:+.2f} ms "
      f"(4 threads on {os.cpu_count()} cores: time a thread waits for a core counts in its task)")
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(8, 3))
ax.hist(sim.duration * 1e3, bins=np.geomspace(sim.duration.min() * 1e3, sim.duration.max() * 1e3, 30))
ax.set_xscale("log"); ax.set_xlabel("task duration (ms, log scale)"); ax.set_ylabel("tasks")
ax.set_title("simulate: duration of each task")
plt.show()""",
        ),
        (
            "md",
            "## How did the scheduler place and queue the tasks?\n"
            "Every scheduler transition is in `run.transitions()`, with the stimulus that caused "
            "it. With queuing on (`distributed.scheduler.worker-saturation`), the scheduler keeps "
            "root tasks in its own queue and hands one to a worker whenever a thread frees up.",
        ),
        (
            "code",
            """\\
tr = run.transitions()
tr = tr[tr.key.isin(requested.index)].sort_values("time", kind="stable")
print("transitions:", {f"{a}->{b}": n for (a, b), n in tr.groupby(["start", "finish"]).size().items()})
assigned = tr[tr.finish == "processing"]
why = assigned.stimulus_id.str.rsplit("-", n=1).str[0].value_counts()
print("a task went to a worker because of:", {k: int(n) for k, n in why.items()})
first_seen = tr.groupby("key").time.min()
started = assigned.groupby("key").time.min()
wait = (started - first_seen).reindex(requested.index)
print(f"time from submission to a worker: median {wait.median():.2f} s, max {wait.max():.2f} s "
      f"(worker-saturation = {dask.config.get('distributed.scheduler.worker-saturation')})")
per_worker = sim.groupby("worker").agg(tasks=("duration", "size"), busy_s=("duration", "sum"))
per_worker["share"] = per_worker.busy_s / per_worker.busy_s.sum()
print(f"balance: the busiest worker did {per_worker.share.max():.0%} of the compute "
      f"({per_worker.tasks.max()} of {N} tasks)")
per_worker.round(2)""",
        ),
        ("code", "plot.task_stream(run)"),
        (
            "md",
            "## Which tasks were retried, and what did the failures cost?\n"
            "`tasks().retries` counts the retries each key needed; the workers' own table keeps "
            "every failed attempt (`state == 'error'`) with its start and stop.",
        ),
        (
            "code",
            """\\
retried = sim[sim.retries > 0]
expected = {k for k in requested.index if int(k.split("-")[1]) % 20 == 3}
print(f"{len(retried)} keys retried ({int(retried.retries.sum())} retries), "
      f"{'exactly the ones made to fail' if set(retried.index) == expected else 'not the ones made to fail: ' + str(sorted(expected ^ set(retried.index)))}")
wt = run.worker_table("tasks")
failed = wt[wt.state == "error"]
print(f"failed attempts: {len(failed)}, {(failed.stop - failed.start).sum() * 1e3:.1f} ms of thread time lost "
      f"({(failed.stop - failed.start).sum() / sim.duration.sum():.2%} of the compute)")
erred = tr[(tr.finish == "released") & tr.stimulus_id.str.startswith("task-erred")]
gap = (assigned.groupby("key").time.max() - erred.groupby("key").time.min()).dropna()
print(f"from a failure to the retry's assignment: median {gap.median() * 1e3:.1f} ms")
retried[["retries", "worker", "duration"]]""",
        ),
        ("code", "plot.progress(run)"),
    ],
)

nb(
    "04-io-cost.ipynb",
    [
        (
            "md",
            "# What did I/O cost? An image pipeline under Darshan and Yappi\n\n"
            "The reference workflow (`metacollect.demo`): images saved as `.npy` files are read "
            "lazily into a dask.array, smoothed with an overlapping stencil, thresholded, reduced "
            "to statistics and written back as tiles. Darshan (the I/O characterisation tool HPC "
            "centres run) records every read and write of the worker processes, DXT each "
            "operation with its time; Yappi profiles the functions the tasks ran. Questions: how "
            "many bytes did the tasks read and write and in how long, what share of each task "
            "prefix's time was I/O, and which functions the time went to.\n\n"
            "Darshan needs its runtime library (`libdarshan.so`, a site module on HPC systems). "
            "Without it the I/O cells say so and the profile still runs.",
        ),
        ("code", SETUP + "\nfrom metacollect.demo import run_demo"),
        (
            "code",
            """\\
from metacollect.errors import MetacollectError
from metacollect.steps.darshan.runtime import find_library

def darshan_library():
    \"\"\"libdarshan.so: the site's (module load darshan), else the CI build in /opt/darshan.\"\"\"
    try:
        return find_library().path
    except MetacollectError as e:
        for candidate in (os.environ.get("METACOLLECT_DARSHAN_LIBRARY"), "/opt/darshan/lib/libdarshan.so"):
            if candidate and os.path.isfile(candidate):
                return candidate
        print(f"no Darshan here, the I/O cells are skipped: {e}")
        return None

library = darshan_library()
options = {"yappi": {"enabled": True}}
if library:
    print(f"Darshan runtime: {library}")
    options["darshan"] = {"enabled": True, "library": library, "dxt": True}""",
        ),
        (
            "code",
            """\\
store = f"{workdir}/pipeline.zarr"
with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster, Client(cluster) as client:
    with metacollect.collect(client, store, **options):
        result = run_demo(f"{workdir}/data", n_images=3, size=512)
run = metacollect.open_run(store)
print(run)
print(f"foreground fraction per image: {np.round(result['foreground_fraction'], 3).tolist()}")
has_io = "darshan" in run.groups and len(run.io()) > 0
print("Darshan I/O in the store:", has_io)""",
        ),
        (
            "md",
            "## Bytes and seconds, per file and per worker\n"
            "`run.io()` sums POSIX and STDIO per file and process; `scope='user'` keeps the "
            "workload's files (not the interpreter's, the system's or metacollect's own).",
        ),
        (
            "code",
            """\\
if not has_io:
    print("skipped: no Darshan I/O in this run (see above)")
else:
    files = run.io(by="file")
    files = files[~files.file.str.startswith("<")]
    inputs = files[files.file.str.contains("/images/")]
    outputs = files[files.file.str.contains("/processed/")]
    truth_in = sum(os.path.getsize(p) for p in set(inputs.file))
    truth_out = sum(os.path.getsize(p) for p in set(outputs.file))
    print(f"read {inputs.bytes_read.sum() / 2**20:.2f} MiB from {inputs.file.nunique()} images "
          f"(their size on disk: {truth_in / 2**20:.2f} MiB) in {inputs.read_time.sum():.3f} s")
    print(f"wrote {outputs.bytes_written.sum() / 2**20:.2f} MiB to {outputs.file.nunique()} tiles "
          f"(on disk: {truth_out / 2**20:.2f} MiB) in {outputs.write_time.sum():.3f} s")
    print(f"metadata (open, stat, close): {files.meta_time.sum():.3f} s over {int(files.opens.sum())} opens")
    display(run.io(by="worker")[["worker", "role", "bytes_read", "bytes_written", "read_time", "write_time", "meta_time"]])""",
        ),
        (
            "md",
            "## What share of each prefix's time was I/O?\n"
            "With DXT on, each read and write segment is attributed to the task whose execution "
            "interval contains it on its worker (`run.io(by='task')`).",
        ),
        (
            "code",
            """\\
if not has_io:
    print("skipped: no Darshan I/O in this run (see above)")
else:
    per_task = run.io(by="task")
    tasks = run.tasks()
    io_by_prefix = per_task.merge(tasks[["key", "prefix"]].drop_duplicates("key"), on="key").groupby("prefix")
    share = pd.DataFrame({
        "compute_s": tasks.groupby("prefix").duration.sum(),
        "io_s": io_by_prefix.time.sum(),
        "MiB": io_by_prefix.bytes.sum() / 2**20,
    }).fillna(0)
    share = share[share.MiB > 0]  # the prefixes that moved bytes
    share["io_share"] = share.io_s / share.compute_s
    share = share.sort_values("io_s", ascending=False)
    top = share.index[0]
    print(f"{top!r} spent {share.io_share.iloc[0]:.0%} of its {share.compute_s.iloc[0]:.2f} s in I/O "
          f"({share.MiB.iloc[0]:.2f} MiB at {share.MiB.iloc[0] / max(share.io_s.iloc[0], 1e-9):.0f} MiB/s); "
          f"all I/O: {share.io_s.sum():.3f} s of {tasks.duration.sum():.2f} s compute "
          f"({share.io_s.sum() / tasks.duration.sum():.1%})")
    display(share.round(3))""",
        ),
        ("code", "plot.io(run)"),
        (
            "md",
            "## Where the compute went: Yappi's top functions\n"
            "Own time (`tsub`, wall clock) per function while a task ran, summed over the workers.",
        ),
        (
            "code",
            """\\
prof = run.profile()
prof = prof[prof.key.notna()]  # inside tasks (not the event loop, not idle threads)
top = (prof.groupby(["name", "module"], dropna=False).tsub.sum()
       .sort_values(ascending=False).head(8))
total = prof.tsub.sum()
print(f"the top function {top.index[0][0]!r} takes {top.iloc[0] / total:.0%} of the profiled own time; "
      f"the top 8 take {top.sum() / total:.0%}")
top.to_frame("own seconds").round(3)""",
        ),
        ("code", "plot.profile(run)"),
    ],
)

nb(
    "06-comparing-runs.ipynb",
    [
        (
            "md",
            "# Comparing two runs, done right\n\n"
            "Question: for `(x + x.T).sum()` on a 3000 x 3000 array held in memory, are chunks "
            "of 250 slower than chunks of 750 (144 vs 16 chunks)? A single run of each answers a different "
            "question: the first computation on a fresh cluster also pays for imports, "
            "connections and memory pools (*warm-up*), and two runs of the same code differ by "
            "noise. So:\n\n"
            "1. **like with like**: one cluster for every run, the same values in memory "
            "before each measured computation (so only the computation is compared), the "
            "same result checked;\n"
            "2. **warm up first**: one run of each configuration that is recorded but not "
            "compared;\n"
            "3. **repeat, interleaved**: A B A B ... so that a drift of the machine (another "
            "job, thermal throttling) hits both, then compare medians against the spread.",
        ),
        ("code", SETUP + "\nfrom distributed import wait"),
        (
            "code",
            """\\
CONFIGS = {"chunks 250": 250, "chunks 750": 750}
REPEATS = 3

def data(chunk):
    \"\"\"The same 3000 x 3000 values for every configuration (drawn in 750-blocks, then cut).\"\"\"
    return da.random.default_rng(42).random((3000, 3000), chunks=(750, 750)).rechunk((chunk, chunk))

records = []  # (config, phase, repeat, store, client seconds, result)
with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster, Client(cluster) as client:
    order = [("warm-up", 0)] + [("measured", r) for r in range(REPEATS)]
    for phase, r in order:
        for label, chunk in CONFIGS.items():  # interleaved: A B, A B, ...
            x = data(chunk).persist()  # the input in memory, outside what is measured
            wait(x)
            store = f"{workdir}/{label.replace(' ', '-')}-{phase}-{r}.zarr"
            with metacollect.collect(client, store):
                t = time.perf_counter()
                value = float((x + x.T).sum().compute())
                seconds = time.perf_counter() - t
            del x
            records.append((label, phase, r, store, seconds, value))
runs = pd.DataFrame(records, columns=["config", "phase", "repeat", "store", "client_s", "result"])
values = runs.result.round(6).unique()
print(f"{len(runs)} runs, {len(values)} distinct result(s): "
      f"{'the same computation every time' if len(values) == 1 else values}")""",
        ),
        (
            "md",
            "## What each run's store says\n"
            "The wall time of the computation from the store (first task start to last task "
            "stop) next to the client's own timer, and the tasks' summed compute time.",
        ),
        (
            "code",
            """\\
def figures(path):
    run = metacollect.open_run(path)
    tasks = run.tasks()
    tr = run.worker_table("transfers")
    tr = tr[tr.direction == "in"]  # each session's store holds its own transfers only
    return pd.Series({"tasks": len(tasks), "window_s": tasks.stop.max() - tasks.start.min(),
                      "compute_s": tasks.duration.sum(), "transfer_MiB": tr.total.sum() / 2**20})
table = pd.concat([runs, runs.store.apply(figures)], axis=1)
gap = (table.client_s - table.window_s)
print(f"client timer - store window: median {gap.median() * 1e3:.0f} ms "
      f"(submitting the graph and fetching the result)")
table[["config", "phase", "repeat", "tasks", "client_s", "window_s", "compute_s", "transfer_MiB"]].round(3)""",
        ),
        (
            "md",
            "## How large was the warm-up effect?",
        ),
        (
            "code",
            """\\
for label in CONFIGS:
    rows = table[table.config == label]
    first = rows[rows.phase == "warm-up"].window_s.iloc[0]
    later = rows[rows.phase == "measured"].window_s.median()
    print(f"{label}: warm-up run {first:.2f} s vs {later:.2f} s median afterwards "
          f"({first / later - 1:+.0%})")
first = table.iloc[0]
print(f"the session's very first computation ({first.config}): client timer {first.client_s:.2f} s "
      f"for a {first.window_s:.2f} s task window; later runs' median gap: "
      f"{(table.client_s - table.window_s).iloc[1:].median():.2f} s")""",
        ),
        (
            "md",
            "## The comparison: medians against the spread",
        ),
        (
            "code",
            """\\
measured = table[table.phase == "measured"]
stats = measured.groupby("config").window_s.agg(["median", "min", "max"])
stats["tasks"] = measured.groupby("config").tasks.first()
(a, b) = stats.index
fast, slow = (a, b) if stats.loc[a, "median"] <= stats.loc[b, "median"] else (b, a)
ratio = stats.loc[slow, "median"] / stats.loc[fast, "median"]
overlap = stats.loc[slow, "min"] <= stats.loc[fast, "max"]
print(f"{fast}: median {stats.loc[fast, 'median']:.2f} s [{stats.loc[fast, 'min']:.2f}-{stats.loc[fast, 'max']:.2f}], "
      f"{slow}: median {stats.loc[slow, 'median']:.2f} s [{stats.loc[slow, 'min']:.2f}-{stats.loc[slow, 'max']:.2f}] "
      f"over {REPEATS} runs each")
if overlap:
    print(f"verdict: {slow} is {ratio:.2f}x the time of {fast} by the medians, but the ranges overlap: "
          "within run-to-run noise at this size; repeat more or grow the problem")
else:
    print(f"verdict: {slow} takes {ratio:.2f}x the time of {fast}, every run of it slower than every run of {fast}")
stats.round(3)""",
        ),
        (
            "md",
            "## Why: the same prefixes, side by side\n"
            "Per-prefix compute seconds of the median run of each configuration, with the "
            "number of tasks: where the difference comes from.",
        ),
        (
            "code",
            """\\
median_run = {}
for label in CONFIGS:
    rows = measured[measured.config == label].sort_values("window_s")
    median_run[label] = metacollect.open_run(rows.store.iloc[len(rows) // 2])
labels = list(median_run)
per_prefix = analysis.compare_prefixes(list(median_run.values()), labels)
counts = analysis.compare_prefixes(list(median_run.values()), labels, stat="n")
per_prefix.join(counts, rsuffix=" tasks").round(3)""",
        ),
        ("code", "plot.compare(list(median_run.values()), labels)"),
        (
            "md",
            "## What changed, in one call\n"
            "`metacollect.diff(a, b)` (the CLI's `metacollect compare A B`) leads with the wall "
            "time and where it went, then the differences in seconds of work (a prefix's "
            "typical cost, a worker's excess over its prefixes' median, transfers, I/O), "
            "memory, the scheduling of the tasks both runs executed, and the config, package "
            "and environment values that differ. Between the two configurations the graphs "
            "differ (other chunks, other keys): no task is in both.",
        ),
        (
            "code",
            """\\
d = metacollect.diff(median_run[labels[0]], median_run[labels[1]], labels=tuple(labels))
print(d.text(top=4))""",
        ),
        (
            "md",
            "Two repeats of one configuration run the same graph (the same keys): the diff "
            "matches their tasks and shows what varies from run to run by itself, which "
            "tasks ran on another worker and which waited longer, and why.",
        ),
        (
            "code",
            """\\
reps = measured[measured.config == labels[0]].store.tolist()
same = metacollect.open_run(reps[0]).diff(metacollect.open_run(reps[1]), labels=("repeat 0", "repeat 1"))
print(same.text(top=3))
s = same.scheduling
print(f"between two runs of the same graph: {s.moved} of {s.matched} tasks ran on another "
      f"worker; the first finding accounts for {same.findings[0].seconds:+.3f} s")""",
        ),
        (
            "md",
            "## Did the profiler weigh on what was compared?\n"
            "Each store records what collecting cost the processes it ran in: every flush's "
            "CPU against the CPU of the whole process (the workload's too), and when each "
            "flush ran. A session ends with its final flushes, tens of milliseconds a "
            "process whatever its length: a large share of a sub-second session, a fraction "
            "of a percent of an hour's. What matters for the comparison above is whether "
            "flushes ran inside the task window it compares.",
        ),
        (
            "code",
            """\\
def collecting(path):
    run = metacollect.open_run(path)
    tasks, flushes = run.tasks(), run.flushes()
    inside = flushes.time.between(tasks.start.min(), tasks.stop.max())
    return pd.Series({**analysis.collector_totals(run), "in_window": int(inside.sum())})
cost = pd.DataFrame([collecting(s) for s in measured.store], index=measured.config.to_numpy())
cost = cost.astype({"processes": int, "flushes": int, "in_window": int})
cost["share_%"] = 100 * cost.share
by_config = cost.groupby(level=0)["share_%"].agg(["min", "max"])
print("flushes' share of the processes' CPU, per configuration: " + "; ".join(
    f"{c}: {r['min']:.2f}-{r['max']:.2f} %" for c, r in by_config.iterrows()))
print(f"flushes inside the compared task windows: {int(cost.in_window.sum())} of {int(cost.flushes.sum())}")
cost[["processes", "flushes", "in_window", "flush_cpu_s", "process_cpu_s", "share_%"]].round(3)""",
        ),
        ("code", "plot.collector(median_run[labels[0]])"),
        (
            "md",
            "## A catalog of every run\n"
            "One row per store under the directory, warm-up runs included, with its main figures.",
        ),
        (
            "code",
            """\\
cat = metacollect.catalog(workdir)
cat.assign(store=cat.path.map(os.path.basename)).sort_values("started")[
    ["store", "status", "wall_time", "tasks", "compute_time", "utilisation"]]""",
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


nb("07-scaling-study.ipynb", scaling_cells(SETUP))
