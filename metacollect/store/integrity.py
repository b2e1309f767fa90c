"""What makes a store's data trustworthy, shared by the readers and ``validate``.

A reader that meets damage raises a :class:`StoreError` naming what is damaged; ``validate``
reports the same finding as one line. Checked here:

- a table's ``rows`` commit point: an int, not negative, no more than its arrays hold;
- the seal: a sealed store (``finalize`` wrote the consolidated metadata of every node on its
  root) must still hold every node the seal lists, each as the seal recorded it - nothing
  writes a store after its seal without sealing it again (``metacollect ingest`` does).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from metacollect.errors import StoreError

if TYPE_CHECKING:
    from metacollect.store.zarrio import Group

RESTORE = "the store is damaged; restore it from a copy"


def rows_problem(rows: Any, shapes: Mapping[str, int]) -> str | None:
    """What is wrong with a table's ``rows`` attribute against its arrays' lengths (``None``:
    nothing; an absent attribute is a store from before it)."""
    if rows is None:
        return None
    if not isinstance(rows, int) or isinstance(rows, bool):
        return f"rows attribute {rows!r} is not an integer"
    if rows < 0:
        return f"rows attribute {rows} is negative"
    shortest = min(shapes.values(), default=0)
    if rows > shortest:
        return f"rows attribute {rows} exceeds its arrays' lengths {dict(shapes)}"
    return None


def table_rows(where: str, rows: Any, shapes: Mapping[str, int]) -> int:
    """The committed rows of table ``where``: its ``rows`` attribute, or without one the
    shortest array; a :class:`StoreError` if the attribute cannot be right."""
    problem = rows_problem(rows, shapes)
    if problem is not None:
        raise StoreError(f"table {where}: {problem}; {RESTORE}")
    return int(rows) if rows is not None else min(shapes.values(), default=0)


def rows_within(rows: Any, shapes: Iterable[int]) -> int:
    """The rows of a table readers may use, unchecked: its ``rows`` attribute (written once
    all of an append's data had landed; arrays keep room past it), and no more than the
    shortest of its arrays. Without the attribute (a store from before it), the shortest."""
    n = min(shapes, default=0)
    return min(n, int(rows)) if isinstance(rows, int) and not isinstance(rows, bool) else n


def normal(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A node's metadata as JSON compares it: without the consolidated metadata a group's
    own entry may carry."""
    out = json.loads(json.dumps(dict(doc), allow_nan=True))
    out.pop("consolidated_metadata", None)
    return dict(out)


def seal_problems(
    sealed: Mapping[str, Mapping[str, Any]], found: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Nodes that differ from the seal: missing, added, or changed (one line each)."""
    problems = [f"{p}: missing, though the store's seal lists it" for p in sealed if p not in found]
    problems += [f"{p}: not in the store's seal (added after it)" for p in found if p not in sealed]
    for path, doc in found.items():
        if path in sealed:
            was, now = normal(sealed[path]), normal(doc)
            if was != now and not _grown(was, now):
                keys = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
                problems.append(
                    f"{path}: its zarr.json changed since the store was sealed ({', '.join(keys)})"
                )
    return problems


def _grown(was: dict[str, Any], now: dict[str, Any]) -> bool:
    """An array only longer than sealed: a writer killed mid-append after the seal left a
    tail past its table's ``rows``, which no reader reads - not damage."""
    shape, sealed_shape = now.get("shape"), was.get("shape")
    if not (isinstance(shape, list) and isinstance(sealed_shape, list) and shape and sealed_shape):
        return False
    same_rest = {**now, "shape": None} == {**was, "shape": None}
    return same_rest and shape[1:] == sealed_shape[1:] and shape[0] > sealed_shape[0]


def committed_rows(tgroup: Group, shapes: Iterable[int] | None = None) -> int:
    """Rows of a table that readers may use: its ``rows`` attribute (written once all of an
    append's data had landed; arrays keep room past it), and no more than the shortest of
    its variables. Without the attribute (a store from before it), the shortest variable."""
    if shapes is None:
        shapes = (a.shape[0] for _, a in tgroup.arrays())
    return rows_within(tgroup.attrs.get("rows"), shapes)
