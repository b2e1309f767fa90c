"""Darshan's cost per collect() session on a LocalCluster (2 workers x 2 threads).

Two tables, medians over ``--repeat`` sessions (Darshan off and on alternate, on one
cluster):

1. The fixed cost: seconds entering ``collect`` (start) and leaving it (end), off and
   on, and where the time goes with Darshan on - the phases the capture records in the
   ``darshan`` group's ``seconds`` (restart under Darshan, clock mark, stopping the
   workers so their logs are written, reading the logs, the workers coming back).
2. The overhead on I/O-heavy tasks: each task writes ``--mb`` MiB in 64 KiB
   ``os.write`` calls and reads it back; the seconds each task took (measured inside
   it), Darshan off and on, and the ratio.

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
from distributed import Client, LocalCluster

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
        task_s = client.gather(futs)
        # held results would be recomputed when the workers restart at the end
        del futs
        t2 = time.perf_counter()
    end = time.perf_counter() - t2
    phases = open_run(store).groups.get("darshan", {}).get("seconds") or {}
    return {"start": t1 - t0, "end": end, "tasks": task_s, "phases": phases}


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--library", default="/opt/darshan/lib/libdarshan.so")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=8, help="I/O tasks per session")
    ap.add_argument("--mb", type=int, default=32, help="MiB each task writes and reads")
    args = ap.parse_args()
    on = {"enabled": True, "library": args.library, "dxt": True}
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    with (
        tempfile.TemporaryDirectory() as d,
        LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        data = os.path.join(d, "data")
        os.makedirs(data)
        for i in range(args.repeat):
            for name, opt in (("off", {"enabled": False}), ("on", on)):
                store = os.path.join(d, f"{name}{i}.zarr")
                runs[name].append(session(client, store, opt, data, args.tasks, args.mb))
    n = args.repeat
    print(f"Fixed cost per session (medians of {n}; LocalCluster 2 workers x 2 threads)")
    print(f"{'darshan':10} {'start (s)':>10} {'end (s)':>10} {'total (s)':>10}")
    total = {}
    for name, rows in runs.items():
        s, e = med([r["start"] for r in rows]), med([r["end"] for r in rows])
        total[name] = s + e
        print(f"{name:10} {s:10.3f} {e:10.3f} {s + e:10.3f}")
    print(f"{'cost':10} {'':10} {'':10} {total['on'] - total['off']:10.3f}   (target <= 0.5)")
    print()
    print("Where it goes with Darshan on (darshan.seconds of each store)")
    print(f"{'phase':36} {'median (s)':>11} {'min (s)':>9} {'max (s)':>9}")
    names = list(dict.fromkeys(k for r in runs["on"] for k in r["phases"]))
    for phase in names:
        vals = [float(r["phases"].get(phase, 0.0)) for r in runs["on"]]
        print(f"{phase:36} {med(vals):11.3f} {min(vals):9.3f} {max(vals):9.3f}")
    print()
    off = [t for r in runs["off"] for t in r["tasks"]]
    on_ = [t for r in runs["on"] for t in r["tasks"]]
    print(
        f"I/O-heavy tasks ({args.tasks} per session, each {args.mb} MiB written + read in "
        f"64 KiB calls; medians of {len(off)} tasks)"
    )
    print(f"{'darshan':10} {'task (s)':>10} {'MiB/s':>10}")
    for name, vals in (("off", off), ("on", on_)):
        m = med(vals)
        print(f"{name:10} {m:10.4f} {2 * args.mb / m:10.0f}")
    ratio = med(on_) / med(off)
    print(f"{'on/off':10} {ratio:10.4f}   (overhead {100 * (ratio - 1):+.2f} %)")


if __name__ == "__main__":
    main()
