"""Autograd for views that outlive an in-place change of their storage.

A view records how it was made from its source (``_view_meta = (src, op class, kwargs,
version)``), so it can be made again from its base. Two things use that:

- ``refresh_view``: when the shared version counter moved since the view took its
  ``grad_fn`` (the base or another view was modified in place), the view's history is rebuilt
  from the base's current history, so gradients flow through the in-place op (PyTorch does the
  same when it regenerates a view's grad_fn).
- ``inplace_on_view``: an in-place op through a view of a tensor in the graph becomes a
  ``CopySlices`` node on the base: the base's new value is its old value with the view region
  replaced, and its gradient splits into "outside the region" (to the old base) and "the
  region" (to the new view value).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._backend import array_module
from .._tensor import Tensor
from ..autograd.grad_mode import _state, enable_grad, no_grad
from ._base import Op, reduce_grad

__all__ = ["CopySlices", "view_chain", "replay", "refresh_view", "inplace_on_view"]

# Views whose region is not "whole elements" of the base: replaying a mask through them would
# be wrong (real/imag select half of each complex element).
_NOT_REPLAYABLE = ("Real", "Imag")

_UNSUPPORTED = (
    "gradwire cannot record this in-place operation on a view ({why}); use the out-of-place "
    "op (e.g. x = x + y) or clone() the view first."
)


def view_chain(view: Tensor) -> list[tuple[Any, dict[str, Any]]] | None:
    """The (op class, kwargs) steps that make ``view`` from its base, or None if unknown."""
    chain = []
    cur = view
    while cur is not view._base:
        meta = cur._view_meta
        if meta is None:
            return None
        src, cls, kwargs, _ = meta
        if cls.__name__ in _NOT_REPLAYABLE:
            return None
        chain.append((cls, kwargs))
        cur = src
    chain.reverse()
    return chain


def replay(chain: list[tuple[Any, dict[str, Any]]], base: Tensor) -> Tensor:
    """Make the view described by ``chain`` from ``base`` (recorded if grad mode is on)."""
    out = base
    for cls, kwargs in chain:
        out = cls.apply(out, **kwargs)
    return out


def refresh_view(view: Tensor) -> bool:
    """Rebuild a stale view's grad_fn from its base; return whether it now requires grad."""
    meta = view._view_meta
    if meta[3] != view._vc.value and _state.grad_enabled:
        base = view._base
        assert base is not None  # only views carry _view_meta
        if base._requires_grad or base._grad_fn is not None:
            chain = view_chain(view)
            if chain is not None:
                with enable_grad():
                    fresh = replay(chain, base)
                view._grad_fn, view._output_nr = fresh._grad_fn, fresh._output_nr
        view._view_meta = (meta[0], meta[1], meta[2], view._vc.value)
    return view._requires_grad or view._grad_fn is not None


def inplace_on_view(view: Tensor, compute: Any) -> None:
    """Apply ``compute`` to ``view`` in place, recording it as a CopySlices on the base.

    The caller bumps the shared version counter afterwards, which makes ``view`` (and every
    other view of the base) take its new history on next use.
    """
    base = view._base
    assert base is not None
    if base._grad_fn is None and base._requires_grad:
        raise RuntimeError(
            "a view of a leaf Variable that requires grad is being used in an in-place operation."
        )
    chain = view_chain(view)
    if chain is None:
        raise RuntimeError(_UNSUPPORTED.format(why="its chain of view ops is not recorded"))
    snap = Tensor._wrap(view._data.copy(), view._requires_grad)
    snap._grad_fn, snap._output_nr = view._grad_fn, view._output_nr
    value = compute(snap)
    old = Tensor._wrap(base._data, base._requires_grad)
    old._grad_fn, old._output_nr = base._grad_fn, base._output_nr
    new = CopySlices.apply(old, value, chain=chain)
    base._data[...] = new._data
    base._grad_fn, base._output_nr = new._grad_fn, 0


class CopySlices(Op):
    """out = base with ``replay(chain, out)`` set to ``value``."""

    def forward(self, base: Any, value: Any, chain: Any = None) -> Any:
        arr = base._data.copy(order="K")  # same strides, so the view ops land on the same cells
        with no_grad():
            region = replay(chain, Tensor._wrap(arr))
        if array_module(arr) is np and not np.shares_memory(region._data, arr):
            raise RuntimeError(_UNSUPPORTED.format(why="it does not map onto the base's memory"))
        try:
            region._data[...] = value._data
        except ValueError as exc:  # e.g. an expanded (broadcast, read-only) view
            raise RuntimeError(_UNSUPPORTED.format(why=str(exc))) from None
        self.save("chain", chain)
        self.save("value_meta", (value._data.shape, value._data.dtype))
        return arr

    def backward(self, g: Any) -> Any:
        chain = self.saved("chain")
        g_base = g_value = None
        if self.needs_input_grad[0]:
            keep = array_module(g._data).ones(g._data.shape, dtype=bool)
            with no_grad():
                replay(chain, Tensor._wrap(keep))._data[...] = False
            g_base = g * Tensor._wrap(keep)
        if self.needs_input_grad[1]:
            shape, dtype = self.saved("value_meta")
            g_value = reduce_grad(replay(chain, g), shape, dtype)
        return g_base, g_value

    def name(self) -> str:
        return "CopySlices"
