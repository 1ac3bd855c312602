"""Complex parameters seen as pairs of reals, as PyTorch's adaptive optimizers treat them."""

from __future__ import annotations

from typing import Any

__all__ = ["as_real", "write_back", "real_step_inputs"]


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


def real_step_inputs(p: Any, grad: Any, group: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The common start of an adaptive update: the parameter as reals, its array module, and
    the gradient as reals, negated for ``maximize``, with ``weight_decay * p`` added."""
    from .._backend import array_module

    d = as_real(p._data)  # complex: pairs of reals, as PyTorch
    g = as_real(grad)
    g = -g if group["maximize"] else g
    if group["weight_decay"]:
        g = g + group["weight_decay"] * d
    return d, array_module(d), g
