"""The one place that starts and ends a collection.

- :mod:`.collection`: ``with collect(client, store): ...`` (:class:`Collection`);
- :mod:`.process`: ending every collection of a process whose script has returned
  (``metacollect run``'s child process);
- :mod:`.shutdown`: retiring a cluster's workers gracefully, so their exit handlers run.

All of them end a collection through the scheduler collector's own end
(:func:`~metacollect.steps.scheduler.end_collection`).
"""

from __future__ import annotations

from metacollect.session.collection import Collection, collect, config_overrides, init_root
from metacollect.session.process import end_process_collections

__all__ = ["Collection", "collect", "config_overrides", "end_process_collections", "init_root"]
