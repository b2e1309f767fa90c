"""A sealed ``code`` column's values as text.

A ``code`` variable (names that recur: task keys, workers, states) is stored as
variable-length strings. No value becomes the column's :data:`NONE_ATTR` string: ``""`` with CF's
``missing_value`` (xarray masks it) when the column holds no genuine ``""``, else a string
it does not hold (:func:`none_value`). :func:`text_values` reads it back to ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

#: attribute of a ``code`` column: the string that stands for no value
NONE_ATTR = "none_value"


def text_values(data: np.ndarray, none: Any) -> np.ndarray:
    """A sealed ``code`` column's strings as objects, its ``none`` string back to
    ``None`` (``none``: the array's :data:`NONE_ATTR`, ``None`` when it has none)."""
    out = np.asarray(data, dtype=object)
    if isinstance(none, str) and len(out):
        missing = equal_text(out, none)
        if missing.any():
            out = out.copy()
            out[missing] = None
    return out


def equal_text(values: np.ndarray, text: str) -> np.ndarray:
    """Which of an object array's values equal ``text``, compared as Python strings: numpy
    turns a bare ``str`` into its own string type, which drops trailing NULs ("\\0" would
    equal ""), so ``text`` goes in as an object."""
    scalar = np.empty((), dtype=object)
    scalar[()] = text
    return np.asarray(values == scalar, dtype=bool)


def no_value(values: np.ndarray) -> np.ndarray:
    """Which values of an object array are no value (``None`` or NaN), as ``pandas.isna``
    says of strings and as fast, without pandas: a worker that seals its own group then never
    imports it (a third of a second and ~2,400 stat and open calls on a shared filesystem)."""
    values = np.asarray(values, dtype=object)
    nothing = np.empty((), dtype=object)  # None, as an array (what numpy's typing asks)
    return np.asarray(np.equal(values, nothing) | np.not_equal(values, values), dtype=bool)


def none_value(values: Iterable[Any]) -> str:
    """The string a column of these values (``None`` among them) writes for ``None``:
    ``""``, or when it holds ``""`` itself a string of NULs it does not hold."""
    held = {v for v in values if v is not None and (v == "" or v.strip("\0") == "")}
    none = ""
    while none in held:
        none += "\0"
    return none
