"""Types of the C encoder of code columns (``_codes.c``)."""

from collections.abc import Sequence
from typing import Any

import numpy as np

class Codes:
    """A group's strings and their codes, at most about ``cache_size`` of them."""

    def __init__(self, cache_size: int) -> None: ...
    def encode_into(
        self,
        columns: tuple[Sequence[Any], ...],
        out: np.ndarray[Any, np.dtype[np.int32]],
        new: list[str],
        start: int,
        hint: int,
        /,
    ) -> int: ...
    def items(self) -> list[tuple[str, int]]: ...
    def clear(self) -> None: ...
    def __len__(self) -> int: ...

def vlen_utf8(values: Sequence[str | None] | np.ndarray[Any, np.dtype[np.object_]], /) -> bytes: ...
def holds_blank(data: bytes, /) -> bool: ...
