"""Screenshots of every tab of the demo's report (``media/report-<n>-<tab>.png``) and the
page that shows them (``media/report-tabs.md``), as headless Chromium shows them:
``metacollect demo`` (Yappi on; Darshan when a runtime is found) into a temporary
directory, its report opened, each tab clicked and saved.

    PYTHONPATH=. python media/make_screenshots.py [--out media] [--images 8 --size 256]

Needs ``chromium``, ``chromium-driver`` (Debian) and selenium (the ``test`` extra).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from browser import available, chromium, load, show_tab, tabs  # noqa: E402

from metacollect.cli import main as metacollect  # noqa: E402


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=HERE, help="directory of the PNGs (default media/)")
    p.add_argument("--images", type=int, default=8)
    p.add_argument("--size", type=int, default=256)
    args = p.parse_args(argv)
    why = available()
    if why:
        print(f"make_screenshots: {why}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="metacollect-shots-") as work:
        store, html = os.path.join(work, "demo.zarr"), os.path.join(work, "demo.html")
        code = metacollect(
            ["demo", "--store", store, "--report", html, "--images", str(args.images),
             "--size", str(args.size)]
        )  # fmt: skip
        if code:
            return code
        shots = []
        with chromium(width=1400, height=1100) as driver:
            load(driver, html)
            titles = [t.text for t in tabs(driver)]
            for i, title in enumerate(titles):
                show_tab(driver, i, settle=1.0)
                name = f"report-{i:02d}-{slug(title)}.png"
                driver.save_screenshot(os.path.join(args.out, name))
                shots.append((title, name))
                print(name)
    lines = [
        "# The demo's report, tab by tab",
        "",
        "`metacollect demo` (Yappi on, Darshan when a runtime is found) as headless Chromium "
        "shows it; made by `media/make_screenshots.py`. What each tab answers: "
        "[docs/report.md](../docs/report.md).",
        "",
    ]
    for title, name in shots:
        lines += [f"## {title}", "", f"![{title}]({name})", ""]
    with open(os.path.join(args.out, "report-tabs.md"), "w") as f:
        f.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
