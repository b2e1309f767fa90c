"""Regenerate the figures of media/: the metadata map and example report views of a demo run.

Run from the repository root: ``python media/make_media.py`` (about a minute; starts a
LocalCluster with 2 workers for the demo pipeline). ``--slurm`` also draws
``batch-jobs.png`` from a run on Slurm (``.ci/slurm-up`` starts one on this machine): three
worker jobs, one cancelled mid-run, one whose worker is killed, one kept to the end.
"""

from __future__ import annotations

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    from distributed import Client, LocalCluster

    import metacollect
    from metacollect import plot
    from metacollect.demo import run_demo

    plot.metadata_map().savefig(os.path.join(HERE, "metadata-map.png"), dpi=80)
    with tempfile.TemporaryDirectory(prefix="metacollect-media-") as work:
        store = os.path.join(work, "demo.zarr")
        with (
            LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster,
            Client(cluster) as client,
        ):
            with metacollect.collect(client, store):
                run_demo(os.path.join(work, "data"), n_images=8, size=256)
        run = metacollect.open_run(store)
        for name in [
            "task_stream",
            "progress",
            "memory",
            "task_graph",
            "critical_path",
        ]:
            fig = getattr(plot, name)(run, **({"max_prefixes": 8} if name == "progress" else {}))
            fig.savefig(os.path.join(HERE, f"{name.replace('_', '-')}.png"), dpi=70)
            print(f"media/{name.replace('_', '-')}.png", file=sys.stderr)
    return 0


def batch_jobs() -> None:
    """``batch-jobs.png``: a run on a real Slurm whose jobs end in three ways."""
    import signal
    import subprocess
    import time

    from dask_jobqueue import SLURMCluster
    from distributed import Client

    import metacollect
    from metacollect import plot

    with tempfile.TemporaryDirectory(prefix="metacollect-media-") as work:
        store = os.path.join(work, "batch.zarr")
        with (
            SLURMCluster(
                cores=1,
                processes=1,
                memory="1GB",
                walltime="00:10:00",
                interface="lo",
                log_directory=os.path.join(work, "logs"),
                scheduler_options={"dashboard_address": ":0"},
            ) as cluster,
            Client(cluster) as client,
        ):
            with metacollect.collect(client, store):
                cluster.scale(jobs=3)
                client.wait_for_workers(3, timeout=120)
                job_of = client.run(lambda: os.environ["SLURM_JOB_ID"])
                client.gather(client.map(lambda x: (time.sleep(0.1), x)[1], range(60)))
                _kept, cancelled, killed = sorted(job_of)
                subprocess.run(["scancel", job_of[cancelled]], check=True)
                pids = client.run(lambda: (os.getppid(), os.getpid()), workers=[killed])[killed]
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                client.gather(client.map(lambda x: (time.sleep(0.1), x)[1], range(40)))
        run = metacollect.open_run(store)
        plot.batch_jobs(run).savefig(os.path.join(HERE, "batch-jobs.png"), dpi=70)
        print("media/batch-jobs.png", file=sys.stderr)


if __name__ == "__main__":
    if "--slurm" in sys.argv[1:]:
        batch_jobs()
    sys.exit(main())
