"""Complex parameters seen as pairs of reals, as PyTorch's adaptive optimizers treat them."""

from __future__ import annotations

from typing import Any

__all__ = ["as_real", "write_back"]


def as_real(a: Any) -> Any:
    """``a`` itself when real; a complex array viewed as its real and imaginary parts (a
    writable view, so in-place updates reach ``a``), or a real copy when ``a`` is strided."""
    if a.dtype.kind != "c":
        return a
    if not a.flags.c_contiguous:
        a = a.copy()
    return a.view(a.real.dtype)


def write_back(d: Any, real: Any) -> None:
    """Store ``real`` (from :func:`as_real`) into ``d`` when it was a copy, not a view."""
    if d.dtype.kind == "c" and not d.flags.c_contiguous:
        d[...] = real.view(d.dtype)
