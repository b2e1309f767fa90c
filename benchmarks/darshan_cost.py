"""Darshan's cost per collect() session on a LocalCluster (2 workers x 2 threads).

Two tables, medians over ``--repeat`` sessions (Darshan off and on alternate, on one
cluster per delivery):

1. The fixed cost per delivery: seconds entering ``collect`` (start) and leaving it
   (end), off and on, and where the time goes with Darshan on - the phases the capture
   records in the ``darshan`` group's ``seconds`` (restart under Darshan, clock mark,
   log readers started, stopping the workers so their logs are written, reading the
   logs, the workers coming back). Two deliveries:

   - ``restart``: ``collect()`` on a cluster that runs without Darshan: the nannies
     restart the workers under it at the start (``LD_PRELOAD`` works only at process
     start) and without it at the end;
   - ``already``: the workers were started under Darshan (the nannies'
     ``distributed.nanny.pre-spawn-environ``, as a jobqueue ``job_script_prologue`` or
     ``metacollect run --darshan`` do), DXT off: no restart at the start. Two ways to
     end, alternating on the same cluster: ``already exit-log``
     (``metacollect.darshan.live: false``: the workers are stopped - Darshan writes its
     log at process exit - and come back) and ``already live`` (the default: the
     workers run on; the session keeps what changed in their live mmap logs between
     snapshots at its start and end). Its ``off`` is ``collect()`` without Darshan on
     that same cluster.
   With ``--delivery run``: ``metacollect run --darshan`` of an unmodified script that
   starts its own LocalCluster and runs the I/O tasks, against ``metacollect run``
   without it, alternating: the cost is the difference of the whole runs' wall times
   (every process of the script starts under Darshan, the logs are read once the
   processes have exited), with the phases of the on runs.
2. Reading the logs (the ingest's largest part), apart from the cluster's restarts: two
   logs like a session's workers write (each process doing ``--tasks`` of the I/O
   tasks below under Darshan with DXT) read ``--repeat`` times by new children (they
   import pydarshan first) and by readers started ahead (``ReaderPool``, started a
   workflow's worth of seconds before, ``--ahead``), alternating.
3. The overhead on I/O-heavy tasks: each task writes ``--mb`` MiB in 64 KiB
   ``os.write`` calls and reads it back; the seconds each task took (measured inside
   it), Darshan off and on, and the ratio (delivery ``restart``: with ``already`` the
   workers run under Darshan in the sessions without it too).

    PYTHONPATH=. python benchmarks/darshan_cost.py --library /opt/darshan/lib/libdarshan.so
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import cloudpickle
from distributed import Client, LocalCluster, wait

from metacollect import collect, open_run

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def io_task(path: str, mb: int) -> float:
    """Write ``mb`` MiB in 64 KiB writes, read it back; the seconds that took."""
    block = b"\0" * 65536
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for _ in range(mb * 16):
        os.write(fd, block)
    os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    while os.read(fd, 65536):
        pass
    os.close(fd)
    took = time.perf_counter() - t0
    os.remove(path)
    return took


def session(
    client: Client, store: str, darshan: dict, data: str, tasks: int, mb: int
) -> dict[str, object]:
    t0 = time.perf_counter()
    with collect(client, store, darshan=darshan):
        t1 = time.perf_counter()
        futs = [
            client.submit(io_task, os.path.join(data, f"f{i}"), mb, pure=False)
            for i in range(tasks)
        ]
        try:  # a session whose cluster lost its workers must not hang the benchmark
            wait(futs, timeout=300)
            task_s = client.gather(futs)
        except TimeoutError:
            print("a session's tasks did not finish in 300 s: left out", file=sys.stderr)
            task_s = []
        # held results would be recomputed when the workers restart at the end
        del futs
        t2 = time.perf_counter()
    end = time.perf_counter() - t2
    phases = open_run(store).groups.get("darshan", {}).get("seconds") or {}
    return {"start": t1 - t0, "end": end, "tasks": task_s, "phases": phases}


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def darshan_cluster(library: str, store: str) -> dict[str, object]:
    """The config of a LocalCluster whose workers start under Darshan, logging below
    ``<store>.darshan``, and that log directory."""
    import dask

    from metacollect.steps.darshan import darshan_environment

    with dask.config.set({"metacollect.darshan.dxt": False}):  # live ends need it off
        env = darshan_environment(store, library=library)
    return {"distributed.nanny.pre-spawn-environ": env}


def forget_logs(store: str) -> None:
    """Remove the final logs of the workers of the last session from the log directory
    of a cluster started under Darshan (each session's store has ingested its own; they
    would be ingested again by the next session's store)."""
    from metacollect.steps.darshan.logs import parse_log_name

    for dirpath, _dirs, files in os.walk(store + ".darshan"):
        for name in files:
            info = parse_log_name(name)
            if info is not None and info["kind"] == "final":  # mmap logs: running workers
                os.remove(os.path.join(dirpath, name))


def variants(args: argparse.Namespace, delivery: str) -> list[tuple[str, dict]]:
    """The sessions of one delivery, by name: Darshan off, then the ways it is on."""
    on = {"enabled": True, "library": args.library}
    if delivery == "restart":
        return [("off (restart)", {"enabled": False}), ("restart", {**on, "dxt": True})]
    return [
        ("off (already)", {"enabled": False}),
        ("already exit-log", {**on, "dxt": False, "live": False}),
        ("already live", {**on, "dxt": False, "live": True}),
    ]


def sessions(args: argparse.Namespace, d: str, delivery: str, runs: dict[str, list[dict]]) -> None:
    """``--repeat`` sessions off and on, alternating, on one cluster for ``delivery``."""
    import dask

    workers_store = os.path.join(d, "workers.zarr")
    cfg = darshan_cluster(args.library, workers_store) if delivery == "already" else {}
    data = os.path.join(d, "data")
    os.makedirs(data, exist_ok=True)
    with (
        dask.config.set(cfg),
        LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        for i in range(args.repeat):
            for name, opt in variants(args, delivery):
                store = os.path.join(d, f"{name.replace(' ', '-')}-{i}.zarr")
                runs.setdefault(name, []).append(
                    session(client, store, opt, data, args.tasks, args.mb)
                )
                if delivery == "already":
                    forget_logs(workers_store)


def log_writer() -> str:
    """A script doing ``argv[2]`` :func:`io_task` of ``argv[3]`` MiB below ``argv[1]``."""
    import inspect

    calls = (
        "for t in range(int(sys.argv[2])):\n    io_task(f'{sys.argv[1]}/f{t}', int(sys.argv[3]))"
    )
    return f"import os, sys, time\n{inspect.getsource(io_task)}\n{calls}\n"


def run_script() -> str:
    """A user's script: its own LocalCluster (2 workers x 2 threads), ``argv[2]``
    :func:`io_task` of ``argv[3]`` MiB below ``argv[1]``, the client left to the exit."""
    import inspect

    main = (
        "if __name__ == '__main__':\n"
        "    from distributed import Client, LocalCluster\n"
        "    cluster = LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=':0')\n"
        "    client = Client(cluster)\n"
        "    n, mb = int(sys.argv[2]), int(sys.argv[3])\n"
        "    paths = [os.path.join(sys.argv[1], f'f{i}') for i in range(n)]\n"
        "    print(sum(client.gather(client.map(io_task, paths, [mb] * n, pure=False))))\n"
    )
    return f"import os, sys, time\n{inspect.getsource(io_task)}\n{main}"


def runs_of_scripts(args: argparse.Namespace, d: str, runs: dict[str, list[dict]]) -> None:
    """``metacollect run`` of :func:`run_script` without and with ``--darshan``, alternating."""
    import subprocess

    script = os.path.join(d, "flow.py")
    with open(script, "w") as f:
        f.write(run_script())
    data = os.path.join(d, "run-data")
    os.makedirs(data, exist_ok=True)
    env = {**os.environ, "DASK_METACOLLECT__DARSHAN__LIBRARY": args.library}
    for i in range(args.repeat):
        for name, flags in (("run off", []), ("run --darshan", ["--darshan"])):
            store = os.path.join(d, f"{name.replace(' ', '-')}-{i}.zarr")
            cmd = [sys.executable, "-m", "metacollect", "run", "--store", store]
            t0 = time.perf_counter()
            done = subprocess.run(
                [*cmd, *flags, script, data, str(args.tasks), str(args.mb)],
                env=env,
                capture_output=True,
                text=True,
            )
            wall = time.perf_counter() - t0
            if done.returncode != 0:
                print(f"{name} failed ({done.returncode}): {done.stderr[-2000:]}", file=sys.stderr)
                continue
            groups = open_run(store).groups
            phases = groups.get("darshan", {}).get("seconds") or {}
            runs.setdefault(name, []).append({"start": 0.0, "end": wall, "phases": phases})


def reading(args: argparse.Namespace, d: str) -> dict[str, list[float]]:
    """Seconds to read two worker-like logs: new children vs readers started ahead."""
    import subprocess

    import dask

    from metacollect.steps.darshan import darshan_environment, find_logs, read_logs
    from metacollect.steps.darshan.logs import ReaderPool

    store = os.path.join(d, "reading.zarr")
    with dask.config.set({"metacollect.darshan.dxt": True}):
        env = {**os.environ, **darshan_environment(store, library=args.library)}
    data = os.path.join(d, "reading-data")
    os.makedirs(data, exist_ok=True)
    script = os.path.join(d, "log_writer.py")  # a file: pydarshan could not decode the
    with open(script, "w") as f:  # log of a long `python -c` (UnicodeDecodeError)
        f.write(log_writer())
    for _ in range(2):
        cmd = [sys.executable, script, data, str(args.tasks), str(args.mb)]
        subprocess.run(cmd, env=env, check=True)
    paths = [lg.path for lg in find_logs(store + ".darshan") if lg.kind == "final"]
    out: dict[str, list[float]] = {"new children": [], "started ahead": []}
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        cold = read_logs(paths)
        out["new children"].append(time.perf_counter() - t0)
        with ReaderPool(len(paths)) as pool:
            time.sleep(args.ahead)  # the workflow runs meanwhile
            t0 = time.perf_counter()
            warm = read_logs(paths, pool=pool)
            out["started ahead"].append(time.perf_counter() - t0)
        assert [r.error for r in cold] == [r.error for r in warm] == [None] * len(paths)
    return out


def print_runs(runs: dict[str, list[dict]], n: int) -> None:
    """The table of the ``run`` delivery."""
    print(f"metacollect run of a script (its own LocalCluster, 2 x 2), medians of {n}")
    print(f"{'run':18} {'wall (s)':>10} {'cost (s)':>10}")
    off = med([r["end"] for r in runs.get("run off", [])])
    for name in ("run off", "run --darshan"):
        wall = med([r["end"] for r in runs.get(name, [])])
        cost = f"{wall - off:10.3f}" if name != "run off" else ""
        print(f"{name:18} {wall:10.3f} {cost:>10}")
    print(f"{'':18} {'':10} {'(target <= 0.5)':>10}")
    rows = [r for r in runs.get("run --darshan", []) if r["phases"]]
    if rows:  # (metacollect run records no darshan.seconds: its phases are the script's)
        print()
        print("Where it goes, run --darshan (darshan.seconds of each store)")
    for phase in dict.fromkeys(k for r in rows for k in r["phases"]):
        vals = [float(r["phases"].get(phase, 0.0)) for r in rows]
        print(f"{phase:36} {med(vals):11.3f} {min(vals):9.3f} {max(vals):9.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--library", default="/opt/darshan/lib/libdarshan.so")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=8, help="I/O tasks per session")
    ap.add_argument("--mb", type=int, default=32, help="MiB each task writes and reads")
    ap.add_argument(
        "--delivery",
        choices=("restart", "already", "both", "run"),
        default="both",
        help="how the workers come under Darshan (see the module's doc)",
    )
    ap.add_argument(
        "--ahead", type=float, default=3.0, help="seconds the readers start before the logs"
    )
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {}
    n = args.repeat
    if args.delivery == "run":
        with tempfile.TemporaryDirectory() as d:
            runs_of_scripts(args, d, runs)
        print_runs(runs, n)
        return
    deliveries = ("restart", "already") if args.delivery == "both" else (args.delivery,)
    with tempfile.TemporaryDirectory() as d:
        for delivery in deliveries:
            sessions(args, d, delivery, runs)
        read_s = reading(args, d)
    print(f"Fixed cost per session (medians of {n}; LocalCluster 2 workers x 2 threads)")
    print(f"{'darshan':18} {'start (s)':>10} {'end (s)':>10} {'total (s)':>10} {'cost (s)':>10}")
    for delivery in deliveries:
        off = None
        for name, _opt in variants(args, delivery):
            rows = runs[name]
            s, e = med([r["start"] for r in rows]), med([r["end"] for r in rows])
            off = s + e if off is None else off
            cost = f"{s + e - off:10.3f}" if name != f"off ({delivery})" else ""
            print(f"{name:18} {s:10.3f} {e:10.3f} {s + e:10.3f} {cost:>10}")
    print(f"{'':18} {'':10} {'':10} {'':10} {'(target <= 0.5)':>10}")
    for name in [n for dl in deliveries for n, _ in variants(args, dl)[1:]]:
        rows = runs[name]
        print()
        print(f"Where it goes, {name} (darshan.seconds of each store)")
        print(f"{'phase':36} {'median (s)':>11} {'min (s)':>9} {'max (s)':>9}")
        names = list(dict.fromkeys(k for r in rows for k in r["phases"]))
        for phase in names:
            vals = [float(r["phases"].get(phase, 0.0)) for r in rows]
            print(f"{phase:36} {med(vals):11.3f} {min(vals):9.3f} {max(vals):9.3f}")
    print()
    print(
        f"Reading two worker logs ({args.tasks} tasks x {args.mb} MiB each, DXT; medians "
        f"of {n}; readers started {args.ahead:g} s ahead)"
    )
    print(f"{'readers':18} {'median (s)':>11} {'min (s)':>9} {'max (s)':>9}")
    for name, vals in read_s.items():
        print(f"{name:18} {med(vals):11.3f} {min(vals):9.3f} {max(vals):9.3f}")
    print()
    if "restart" not in deliveries:  # an already cluster's workers run under Darshan
        print("I/O-heavy tasks: run with --delivery restart or both (with already, the")
        print("workers run under Darshan in the sessions without it too)")
        return
    off = [t for r in runs["off (restart)"] for t in r["tasks"]]
    on_ = [t for r in runs["restart"] for t in r["tasks"]]
    print(
        f"I/O-heavy tasks ({args.tasks} per session, each {args.mb} MiB written + read in "
        f"64 KiB calls; medians of {len(off)} tasks; delivery restart, DXT on)"
    )
    print(f"{'darshan':10} {'task (s)':>10} {'MiB/s':>10}")
    for name, vals in (("off", off), ("on", on_)):
        m = med(vals)
        print(f"{name:10} {m:10.4f} {2 * args.mb / m:10.0f}")
    ratio = med(on_) / med(off)
    print(f"{'on/off':10} {ratio:10.4f}   (overhead {100 * (ratio - 1):+.2f} %)")


if __name__ == "__main__":
    main()
