"""Exports of a run to other tools: Perfetto traces (:mod:`.perfetto`); pstats profiles are
:func:`metacollect.analysis.pstats.write` (``Run.export_pstats``)."""
