"""Exports of a run to other tools: Perfetto traces (:mod:`.perfetto`), Workflow Run RO-Crates
(:mod:`.ro_crate`); pstats profiles are :func:`metacollect.analysis.pstats.write`
(``Run.export_pstats``)."""
