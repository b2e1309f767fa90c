"""The layout of a sealed table: its arrays' chunks, codecs, attributes and documents.

The seal writes each table once so that the sealed store reads as plain data and has
files in proportion to its data:

- chunks of at least :data:`COMPACT_ROWS` rows that divide the table nearly evenly (the
  whole table when it is smaller), so a table's files grow with its rows, never with the
  flushes that wrote them, and its last chunk is not mostly padding;
- every ``code`` variable as variable-length strings (Zstandard on whole chunks absorbs the
  repetition the codes saved), so ``xarray.open_datatree`` shows names, not numbers;
- each array's CF attributes (``units``, ``long_name``, ``calendar``) from the schema.

Arrays are made and written through Zarr's public API (:func:`array_args`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import metacollect.store.zarrio as zarrio
from metacollect.store.schema import FILL, TableSpec, VariableSpec
from metacollect.store.text import NONE_ATTR

#: fewest rows in a chunk of a large sealed table (see :func:`_chunk`)
COMPACT_ROWS = 65_536


#: chunks of a large table's array stored at a time, each in its own write, side by side:
#: what the seal holds of a column (and as much again while Zarr encodes it)
BLOCK_CHUNKS = 2


#: lowest Zstandard level of a sealed table's strings (see :func:`template`): 8 makes them
#: about as small as 9 in less time; 5 to 7 are faster still but markedly larger on a
#: run's task keys (docs/benchmarks.md)
SEAL_TEXT_LEVEL = 8


#: attribute of a table group the seal compacted
COMPACTED = "compacted"


def _chunk(n: int, extra: list[int]) -> int:
    """Rows in each chunk of a sealed array of ``n`` rows (``extra``: its shape past them):
    the whole array when it is short, else as few chunks of at least the base length as
    divide it nearly evenly, so the last one is padded by fewer rows than there are chunks
    (one chunk of the base length and a last one nearly empty would encode its padding:
    a tenth of a 20k-task run's seal)."""
    base = _base_rows(extra)
    if n <= base:
        return max(1, n)
    return -(-n // (n // base))


def _base_rows(extra: Sequence[int]) -> int:
    """The shortest chunk of a large sealed array (fewer rows for a 2-D variable: about as
    many values)."""
    width = int(np.prod(extra)) if extra else 1
    return max(1024, COMPACT_ROWS // width) if width > 1 else COMPACT_ROWS


def variable_layout(
    tspec: TableSpec, name: str, extra: tuple[int, ...]
) -> tuple[list[str], dict[str, Any]]:
    """The dimension names and attributes of variable ``name``'s array (``extra``: its
    shape past the rows), the same whether a writer appends to it or the seal writes it."""
    var = tspec.variables[name]
    dims = [tspec.dim] + ([var.dim2] if var.dim2 else [f"{name}_dim{i}" for i in range(len(extra))])
    return dims, {"description": var.description, "dtype": var.dtype, **var.cf_attrs}


def sealed_attrs(attrs: Mapping[str, Any], var: VariableSpec, none: str | None) -> dict[str, Any]:
    """A sealed array's attributes: the schema's CF attributes over ``attrs``, and for a
    ``code`` variable the string its missing values are written as (``none``; ``None``: it
    has none), with CF's ``missing_value`` when that is ``""`` (xarray reads it as missing)."""
    out = {**attrs, **var.cf_attrs}
    if var.dtype == "code":
        out.pop(NONE_ATTR, None)
        out.pop("missing_value", None)
        if none is not None:
            out[NONE_ATTR] = none
            if none == "":
                out["missing_value"] = ""
    return out


def chunk_of(shape: Sequence[int]) -> list[int]:
    """The chunk shape of a sealed array of ``shape`` (whole rows past the first axis)."""
    return [_chunk(shape[0], list(shape[1:])), *shape[1:]]


def array_args(
    var: VariableSpec,
    shape: Sequence[int],
    dims: list[str],
    attrs: Mapping[str, Any],
    level: int,
) -> tuple[Any, ...]:
    """The arguments of a sealed array for :func:`~metacollect.store.zarrio.new_array`
    (``where`` aside): chunks of :func:`chunk_of`, strings (and codes, written as strings)
    with Zstandard at :data:`SEAL_TEXT_LEVEL` at least, numbers with Blosc at the store's
    level (its highest levels are many times slower for little less on numbers)."""
    is_str = var.dtype in ("str", "code")
    return (
        tuple(shape),
        tuple(chunk_of(shape)),
        str if is_str else var.numpy_dtype,
        zarrio.codecs("text", max(level, SEAL_TEXT_LEVEL))
        if is_str
        else zarrio.codecs("numeric", level),
        "" if is_str else FILL[var.dtype],
        attrs,
        dims,
    )
