"""A scaling study drawn: time and efficiency against the size, per prefix, and the totals
against their ideal."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from metacollect.analysis.scalability import RESOURCES, Scaling
from metacollect.plot.base import color_of, new_figure


def scaling(study: Scaling, max_prefixes: int = 8) -> Figure:
    """Four panels of a :class:`~metacollect.analysis.scalability.Scaling`: the makespan against
    the size with its ideal (log-log), the efficiency of the makespan and of each prefix with
    the threshold, each prefix's span, and each total against its ideal; the sizes where
    something stops scaling are marked."""
    runs, by = study.runs, study.by
    n = runs.index.to_numpy(dtype=float)
    fig = new_figure(11, 7.5)
    (ax_t, ax_e), (ax_p, ax_r) = fig.subplots(2, 2)
    ideal = runs["makespan"].iloc[0] * (n[0] / n if study.kind == "strong" else np.ones_like(n))
    ax_t.plot(n, runs["makespan"], "o-", label="makespan")
    ax_t.plot(n, ideal, "--", color="grey", label="ideal")
    ax_t.set_xscale("log", base=2)
    ax_t.set_yscale("log")
    ax_t.set_xticks(n, [f"{int(v)}" for v in n])
    ax_t.set_xlabel(by)
    ax_t.set_ylabel("s")
    ax_t.set_title(f"{study.kind} scaling: makespan")
    ax_t.legend(fontsize="x-small")

    prefixes = study.prefixes
    top = (
        prefixes.groupby(level="prefix")["share"].max().sort_values(ascending=False)
        .head(max_prefixes).index
    )  # fmt: skip
    ax_e.plot(n, runs["efficiency"], "o-", color="black", lw=2, label="makespan")
    for p in top:
        pre = prefixes.xs(p, level="prefix")
        x = pre.index.to_numpy(dtype=float)
        ax_e.plot(x, pre["efficiency"], ".-", color=color_of(p), label=p)
        ax_p.plot(x, pre["span"], ".-", color=color_of(p), label=p)
    ax_e.axhline(study.threshold, color="red", ls=":", lw=1, label="threshold")
    ax_e.set_xscale("log", base=2)
    ax_e.set_xticks(n, [f"{int(v)}" for v in n])
    ax_e.set_ylim(0, 1.2)
    ax_e.set_xlabel(by)
    ax_e.set_ylabel("efficiency")
    ax_e.set_title("efficiency (per prefix: of its span)")
    ax_e.legend(fontsize="x-small", ncol=2)
    ax_p.set_xscale("log", base=2)
    ax_p.set_xticks(n, [f"{int(v)}" for v in n])
    ax_p.set_xlabel(by)
    ax_p.set_ylabel("span (s)")
    ax_p.set_title("per-prefix span (first start to last stop)")
    ax_p.legend(fontsize="x-small", ncol=2)

    res = study.resources
    for col, what, _ in RESOURCES:
        if col not in res.index.get_level_values("resource"):
            continue
        r = res.xs(col, level="resource")
        g = r["growth"].replace([np.inf], np.nan)
        if g.notna().any():
            ax_r.plot(r.index.to_numpy(dtype=float), g, "o-", label=what)
    ax_r.axhline(1.0, color="grey", ls="--", lw=1)
    ax_r.axhline(study.growth, color="red", ls=":", lw=1, label="named above")
    ax_r.set_xscale("log", base=2)
    ax_r.set_xticks(n, [f"{int(v)}" for v in n])
    ax_r.set_xlabel(by)
    ax_r.set_ylabel("value / ideal")
    ax_r.set_title("totals against their ideal; bytes moved")
    ax_r.legend(fontsize="x-small", loc="upper left")
    # bytes moved between workers, which a run on one worker has none of (no ratio)
    ax_b = ax_r.twinx()
    ax_b.bar(n, runs["transfer_bytes"] / 1e6, width=0.25 * n, color="red", alpha=0.25)
    ax_b.set_ylabel("transferred (MB, bars)")
    for at in study.limits["stops_at"].unique() if len(study.limits) else ():
        for ax in (ax_t, ax_e):
            ax.axvline(float(at), color="red", alpha=0.15, lw=6)
    fig.suptitle(study.verdict(), fontsize="small", wrap=True)
    return fig
