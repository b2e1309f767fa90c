"""The Calling code tab, as Dask's performance report shows it: the code that ran the
computations - the script's source under ``metacollect run``, and the frames of calling code
Dask kept for each computation (``metacollect.capture.code-frames``, 1 by default) under
:func:`metacollect.collect`."""

from __future__ import annotations

import html
import os

import pandas as pd
from bokeh.layouts import column

from metacollect.report.views.base import Context, Layout, div, note

#: most distinct snippets shown
MAX_SNIPPETS = 50
_PRE = "<pre style='background:#f6f6f6;padding:6px;overflow-x:auto'>{}</pre>"


def calling_code(ctx: Context) -> Layout:
    """The script's source (``metacollect run``) and Dask's computation code, each distinct
    snippet once with the graphs it submitted."""
    parts: list[Layout] = []
    script = ctx.run.groups.get("script") or {}
    if script.get("source"):
        argv = " ".join(str(a) for a in script.get("argv") or [])
        parts.append(
            div(
                f"<h3>The script: {html.escape(os.path.basename(str(script.get('path'))))}</h3>"
                f"<p><code>{html.escape(str(script.get('path')))} {html.escape(argv)}</code></p>"
                + _PRE.format(html.escape(str(script["source"])))
            )
        )
    elif script:
        parts.append(
            note(
                "The script's source was not kept (metacollect.capture.source false); its "
                f"sha256 is {script.get('sha256')}."
            )
        )
    code = _computation_code(ctx)
    if len(code):
        snippets = code.groupby("code", sort=False)["graph"].apply(sorted)
        blocks = "".join(
            f"<h4>graph{'s' if len(graphs) > 1 else ''} "
            f"{html.escape(', '.join(map(str, graphs)))}</h4>" + _PRE.format(html.escape(str(text)))
            for text, graphs in snippets.iloc[:MAX_SNIPPETS].items()
        )
        more = len(snippets) - MAX_SNIPPETS
        extra = f"<p>{more} more snippets not shown</p>" if more > 0 else ""
        parts.append(
            div(
                "<h3>Dask's computation code</h3><p>the calling frames Dask kept for each "
                f"computation, each distinct snippet once</p>{blocks}{extra}"
            )
        )
    elif not parts:
        parts.append(
            note(
                "No calling code: the run was not started by metacollect run (which keeps the "
                "script) and Dask kept no computation code (metacollect.capture.code-frames "
                "0, or metacollect.capture.source false)."
            )
        )
    return column(*parts)


def _computation_code(ctx: Context) -> pd.DataFrame:
    frames = [
        ctx.run.table(p, "code")
        for p in ctx.run.groups
        if p.endswith("/client") and p.startswith("clusters/")
    ]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
