"""Regenerate the figures of media/: the metadata map and example report views of a demo run.

Run from the repository root: ``python media/make_media.py`` (about a minute; starts a
LocalCluster with 2 workers for the demo pipeline).
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


if __name__ == "__main__":
    sys.exit(main())
