"""``metacollect.collect``: a collection session whose sealed store keeps its summary.

The session (:func:`metacollect.session.collection.collect`) records and seals the store;
the figures a catalog of many stores reads (:func:`~metacollect.analysis.campaign.
keep_summary`) are computed from the sealed store by the analysis layer above the session,
as ``metacollect run`` and the batch wrappers do after their seal.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from typing import Any

from metacollect.analysis.campaign import keep_summary
from metacollect.session import collection

logger = logging.getLogger(__name__)


@functools.wraps(collection.collect)
@contextlib.contextmanager
def collect(*args: Any, **kwargs: Any) -> Iterator[collection.Collection]:
    started: collection.Collection | None = None
    interrupted = False
    try:
        with collection.collect(*args, **kwargs) as session:
            started = session
            yield session
    except KeyboardInterrupt:  # the user wants out: the catalog computes the summary later
        interrupted = True
        raise
    finally:
        # kept however the block ended, once the session sealed the store
        if started is not None and not interrupted:
            not_kept = keep_summary(started.store)
            if not_kept is not None:
                logger.warning("metacollect: %s", not_kept)
