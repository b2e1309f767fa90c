"""The one place that starts and ends a collection.

- :mod:`.start`: the start of a run's store, the same for every way in (:func:`start_run`);
- :mod:`.collection`: ``with collect(client, store): ...`` (:class:`Collection`);
- :mod:`.process`: ending every collection of a process whose script has returned
  (``metacollect run``'s child process);
- :mod:`.shutdown`: retiring a cluster's workers gracefully, so their exit handlers run.

All of them end a collection through the scheduler collector's own end
(:func:`~metacollect.steps.scheduler.end_collection`).
"""

from __future__ import annotations

from metacollect.session.collection import Collection, collect, config_overrides
from metacollect.session.process import end_process_collections
from metacollect.session.start import init_root, prepare_run, start_run

__all__ = [
    "Collection",
    "collect",
    "config_overrides",
    "end_process_collections",
    "init_root",
    "prepare_run",
    "start_run",
]
