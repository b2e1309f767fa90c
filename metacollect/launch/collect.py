"""``metacollect.collect``: a collection session whose sealed store keeps its summary.

The session (:func:`metacollect.session.collection.collect`) records and seals the store;
the figures a catalog of many stores reads (:func:`~metacollect.analysis.campaign.
summary_attrs`) are computed by the analysis layer above the session from the final tables,
and the seal writes them on the root with the rest, as ``metacollect run`` does.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from metacollect.analysis.campaign import summary_attrs
from metacollect.session import collection


@functools.wraps(collection.collect)
@contextlib.contextmanager
def collect(*args: Any, **kwargs: Any) -> Iterator[collection.Collection]:
    with collection.collect(*args, **kwargs) as session:
        session.summarize = summary_attrs
        yield session
