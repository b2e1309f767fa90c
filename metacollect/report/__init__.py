"""Reports of a run: one self-contained interactive HTML file (:func:`write_html`, the
default of ``metacollect report``), or a directory of PNG views and an index page
(:func:`write_report`, ``metacollect report --png DIR``)."""

from __future__ import annotations

from metacollect.report.interactive import ViewsFailedError, write_html
from metacollect.report.png import write_report

__all__ = ["ViewsFailedError", "write_html", "write_report"]
