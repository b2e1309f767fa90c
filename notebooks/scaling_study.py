"""The cells of notebook 07, a scaling study (``make_notebooks.py`` writes it)."""

from __future__ import annotations


def scaling_cells(setup: str) -> list[tuple[str, str]]:
    """Notebook 07's cells, ``setup`` the notebooks' shared first code cell."""
    return [
        (
            "md",
            "# How does this workflow scale?\n\n"
            "A strong scaling study: the same workflow run on 1, 2 and 4 workers, each run "
            "collected into its own store, then `metacollect.scaling` reads the series: the "
            "makespan's efficiency, each task prefix's, and the totals that should not grow "
            "(compute seconds, bytes moved between workers, bytes read and written, a "
            "worker's peak memory), with the point where each stops scaling named.\n\n"
            "The workflow is the shape of many parameter studies: 16 independent simulations "
            "of a fixed 0.4 s each (a sleep stands for an external solver or a wait on I/O, "
            "so the answer does not depend on how many cores this machine has), each "
            "returning 1 MB, then a serial post-processing chain of three 0.3 s steps, the "
            "first needing every simulation's result. Amdahl's law predicts where it stops: "
            "the chain does not get faster with workers.",
        ),
        ("code", setup),
        (
            "code",
            """\\
SIMS, SIM_S, STEPS, STEP_S = 16, 0.4, 3, 0.3

def simulate(i):
    time.sleep(SIM_S)
    return np.full(125_000, i, dtype=float)  # 1 MB

def post(*parts):
    time.sleep(STEP_S)
    return len(parts)

def workflow(client):
    sims = [client.submit(simulate, i, key=f"simulate-{i}") for i in range(SIMS)]
    s = client.submit(post, *sims, key="post-0")
    for j in range(1, STEPS):
        s = client.submit(post, s, key=f"post-{j}")
    return s.result()

def series(make_cluster, sizes, directory):
    \"\"\"One collected run of the workflow per size, each in its own store.\"\"\"
    os.makedirs(directory, exist_ok=True)
    for n in sizes:
        with make_cluster(n) as cluster, Client(cluster) as client:
            client.wait_for_workers(n)
            with metacollect.collect(client, f"{directory}/workers-{n}.zarr"):
                workflow(client)
    return directory""",
        ),
        (
            "md",
            "## The series on a LocalCluster\nOne worker process per size step, one thread each.",
        ),
        (
            "code",
            """\\
local = series(
    lambda n: LocalCluster(n_workers=n, threads_per_worker=1, dashboard_address=":0"),
    (1, 2, 4), f"{workdir}/local")
study = metacollect.scaling(local)
print(study)""",
        ),
        (
            "md",
            "`study.runs` has one row per size: the makespan (first task's start to last "
            "task's stop: the run's `wall_time` also holds the collection's start and end, "
            "the same at every size), the speedup and efficiency against the smallest run, "
            "and the totals.",
        ),
        ("code", "study.runs.drop(columns=['path']).round(3)"),
        ("code", "plot.scaling(study)"),
        (
            "md",
            "## Which prefix stops scaling?\n"
            "Per prefix and size: its span (first start to last stop), its share of the "
            "makespan and the efficiency of its span. `simulate` keeps scaling; `post` does "
            "not, and its share of the makespan grows with every worker added.",
        ),
        ("code", "study.prefixes.round(3)"),
        (
            "md",
            "## Measured against Amdahl's law\n"
            "The serial fraction, read from the one-worker run (the chain's span over the "
            "makespan), predicts the speedup at each size: `1 / (s + (1 - s) / n)`. What "
            "the measured speedup misses of it is Dask's own cost: each worker's first task "
            "waits for its dispatch, and `post-0` waits for the results it fetches from the "
            "other workers (the bytes moved, in the last panel above).",
        ),
        (
            "code",
            """\\
serial = study.prefixes.at[("post", 1), "span"] / study.runs.at[1, "makespan"]
n = study.runs.index.to_numpy()
amdahl = pd.DataFrame({
    "measured speedup": study.runs["speedup"].to_numpy(),
    "Amdahl": 1 / (serial + (1 - serial) / n),
    "MB moved": study.runs["transfer_bytes"].to_numpy() / 1e6,
}, index=pd.Index(n, name="workers"))
print(f"serial fraction from the 1-worker run: {serial:.0%}; "
      f"Amdahl's bound on the speedup: {1 / serial:.1f}x however many workers")
amdahl.round(2)""",
        ),
        (
            "md",
            "## The same series on Slurm\n"
            "The workers are batch jobs now, one worker a job (`jobqueue_cluster` is "
            "dask-jobqueue's `SLURMCluster` with metacollect's defaults): 1, 2 and 4 jobs. "
            "Each store also records the jobs (`run.jobs()`). The cell runs where "
            "`METACOLLECT_NOTEBOOK_SLURM=1` is set, as the `slurm` test of this notebook "
            "does against the Slurm that CI starts.",
        ),
        (
            "code",
            """\\
if os.environ.get("METACOLLECT_NOTEBOOK_SLURM") == "1":
    from metacollect.launch import jobqueue_cluster

    def slurm_cluster(n):
        cluster = jobqueue_cluster(
            "slurm", cores=1, processes=1, memory="1GB", walltime="00:10:00",
            interface="lo", log_directory=f"{workdir}/slurm-logs",
            scheduler_options={"dashboard_address": ":0"})
        cluster.scale(jobs=n)
        return cluster

    on_slurm = series(slurm_cluster, (1, 2, 4), f"{workdir}/slurm")
    slurm_study = metacollect.scaling(on_slurm)
    print(slurm_study)
    jobs = [len(metacollect.open_run(p).jobs()) for p in slurm_study.runs.path]
    print(f"Slurm series: {len(jobs)} runs, batch jobs per run {jobs}")
    display(plot.scaling(slurm_study))
else:
    print("The Slurm series runs with METACOLLECT_NOTEBOOK_SLURM=1 (and a running Slurm).")""",
        ),
        (
            "md",
            "## The campaign: every run of this notebook\n"
            "`metacollect.catalog` lists the stores under a directory from the small summary "
            "each sealed store carries; a store sealed by `collect()` carries none yet, so "
            "its row is computed from its tables (`summary` says which), and "
            "`write_summaries=True` keeps it for the next catalog. `campaign_prefixes` "
            "reads each store's per-prefix table in a Dask task and sums them: the "
            "campaign's per-prefix figures without one process reading every task table.",
        ),
        (
            "code",
            """\\
cat = metacollect.catalog(workdir, write_summaries=True)
print(cat.summary.value_counts().to_dict())
cat = metacollect.catalog(workdir)
print(cat.summary.value_counts().to_dict())
cat.assign(store=cat.path.map(lambda p: os.path.relpath(p, workdir)))[
    ["store", "status", "workers", "tasks", "wall_time", "compute_time", "utilisation"]].round(3)""",
        ),
        ("code", "analysis.campaign_prefixes(cat).round(3)"),
    ]
