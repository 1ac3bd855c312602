"""Named tuples returned by ops with several outputs (``max(dim)`` -> values, indices)."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["MinMax"]


class MinMax(NamedTuple):
    values: Any
    indices: Any
