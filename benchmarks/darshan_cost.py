"""Fixed cost of Darshan per collect() session on a LocalCluster (2 workers x 2 threads).

Prints the median seconds of: entering ``collect`` (start) and leaving it (end), with
Darshan off and on, over ``--repeat`` sessions; the difference is Darshan's fixed cost.

    PYTHONPATH=. python benchmarks/darshan_cost.py --library /opt/darshan/lib/libdarshan.so
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from distributed import Client, LocalCluster

from metacollect import collect


def session(client: Client, store: str, darshan: dict | bool) -> tuple[float, float]:
    t0 = time.perf_counter()
    with collect(client, store, darshan=darshan):
        t1 = time.perf_counter()
        client.submit(sum, [1, 2], pure=False).result()
        t2 = time.perf_counter()
    return t1 - t0, time.perf_counter() - t2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--library", default="/opt/darshan/lib/libdarshan.so")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    on = {"enabled": True, "library": args.library, "dxt": True}
    rows: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    with (
        tempfile.TemporaryDirectory() as d,
        LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        for i in range(args.repeat):
            for name, opt in (("off", {"enabled": False}), ("on", on)):
                rows[name].append(session(client, os.path.join(d, f"{name}{i}.zarr"), opt))
    print(f"{'darshan':8} {'start (s)':>10} {'end (s)':>10} {'total (s)':>10}")
    med = {}
    for name, r in rows.items():
        s, e = statistics.median(x[0] for x in r), statistics.median(x[1] for x in r)
        med[name] = s + e
        print(f"{name:8} {s:10.3f} {e:10.3f} {s + e:10.3f}")
    print(f"{'cost':8} {'':10} {'':10} {med['on'] - med['off']:10.3f}")


if __name__ == "__main__":
    main()
