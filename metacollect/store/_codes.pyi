"""Types of the C encoder of code columns (``_codes.c``)."""

from collections.abc import Sequence
from typing import Any

import numpy as np

def encode_into(
    columns: tuple[Sequence[Any], ...],
    out: np.ndarray[Any, np.dtype[np.int32]],
    codes: dict[str, int],
    new: list[str],
    start: int,
    cache_size: int,
    hint: int,
    /,
) -> int: ...
def vlen_utf8(values: Sequence[str | None] | np.ndarray[Any, np.dtype[np.object_]], /) -> bytes: ...
