"""Exports of a run to other tools: Perfetto traces (:mod:`.perfetto`), pstats profiles."""
