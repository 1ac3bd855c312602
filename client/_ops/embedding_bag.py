"""Embedding bags: the rows of a weight table picked by integer indices, reduced per bag (sum,
mean or max) without materialising the looked-up rows per bag; ``embedding_bag`` (exported by
``gradwire.nn.functional``).

The lookup is ``EmbeddingLookup`` (its scatter-add backward), followed by one reduction op over
the bags: ``BagSum`` (backward: pick each entry's bag gradient) or ``BagMax`` (backward: the
gradient goes to the entry that held each maximum). Mean is a sum of rows scaled by 1/count,
``per_sample_weights`` a sum of rows scaled by their weights, so both differentiate for free.
Every backward is made of these ops again, so second derivatives work.
"""

from __future__ import annotations

import warnings
from typing import Any

from .._backend import array_module, on_input_device, ufunc_at
from .._tensor import Tensor
from ._base import Op
from .embedding import EmbeddingLookup, _normalize_padding_idx

__all__ = ["BagSum", "BagMax", "embedding_bag"]

_MODES = ("sum", "mean", "max")


class BagSum(Op):
    """rows (K, D) summed into ``num_bags`` bags by ``bag_ids`` (K,) -> (num_bags, D)."""

    def forward(self, rows: Any, bag_ids: Any = None, num_bags: int = 0) -> Any:
        xp = array_module(rows._data)
        out = xp.zeros((num_bags, rows._data.shape[1]), dtype=rows._data.dtype)
        ufunc_at("add", out, bag_ids, rows._data)
        self.save("bag_ids", bag_ids)
        return out

    def backward(self, g: Any) -> Any:
        return EmbeddingLookup.apply(g, indices=self.saved("bag_ids"))

    def name(self) -> str:
        return "EmbeddingBagBackward0"


class _PickMax(Op):
    """out[b, d] = rows[arg[b, d], d], 0 where ``arg`` is -1 (an empty bag)."""

    def forward(self, rows: Any, arg: Any = None) -> Any:
        self.save("arg", arg)
        self.save("num_rows", rows._data.shape[0])
        return _pick(rows._data, arg)

    def backward(self, g: Any) -> Any:
        return _ScatterMax.apply(g, arg=self.saved("arg"), num_rows=self.saved("num_rows"))


class _ScatterMax(Op):
    """The adjoint of ``_PickMax``: (num_rows, D) zeros with g[b, d] put at (arg[b, d], d)."""

    def forward(self, g: Any, arg: Any = None, num_rows: int = 0) -> Any:
        xp = array_module(g._data)
        out = xp.zeros((num_rows + 1, g._data.shape[1]), dtype=g._data.dtype)
        cols = xp.broadcast_to(xp.arange(arg.shape[1]), arg.shape)
        # Each entry belongs to one bag, so no (row, column) pair repeats; -1 lands in the
        # spare last row, dropped below.
        out[arg, cols] = g._data
        self.save("arg", arg)
        return out[:num_rows]

    def backward(self, gg: Any) -> Any:
        return _PickMax.apply(gg, arg=self.saved("arg"))


class BagMax(_PickMax):
    """rows (K, D) reduced to the per-bag, per-column maximum -> (num_bags, D); an empty bag
    gives 0. The gradient goes to the first entry holding each maximum."""

    def forward(self, rows: Any, bag_ids: Any = None, num_bags: int = 0) -> Any:
        data = rows._data
        xp = array_module(data)
        k, dim = data.shape
        best = xp.full((num_bags, dim), -xp.inf, dtype=data.dtype)
        ufunc_at("maximum", best, bag_ids, data)
        entry = xp.arange(k)[:, None]
        first = xp.full((num_bags, dim), k, dtype=xp.int64)
        ufunc_at("minimum", first, bag_ids, xp.where(data == best[bag_ids], entry, k))
        return super().forward(rows, arg=xp.where(first == k, -1, first))

    def name(self) -> str:
        return "EmbeddingBagBackward0"


def _pick(data: Any, arg: Any) -> Any:
    xp = array_module(data)
    padded = xp.concatenate([data, xp.zeros((1, data.shape[1]), dtype=data.dtype)])
    return xp.take_along_axis(padded, xp.where(arg < 0, data.shape[0], arg), axis=0)


def _int_tensor(t: Any, what: str) -> Any:
    from ..errors import ArgumentError

    if not isinstance(t, Tensor) or t._data.dtype.kind not in "iu":
        got = t.dtype if isinstance(t, Tensor) else type(t).__name__
        raise ArgumentError(
            f"embedding_bag: expected {what} to be a Long or Int tensor, got {got}; pass "
            "integer indices, e.g. x.long()"
        )
    return t._data


def _bags(input: Tensor, offsets: Tensor | None, include_last_offset: bool) -> tuple[Any, Any, int]:
    """(flat indices, bag id of each, number of bags); an entry outside every bag gets id -1."""
    from ..errors import ArgumentError

    idx = _int_tensor(input, "input")
    xp = array_module(idx)
    if idx.ndim == 2:
        if offsets is not None:
            raise ValueError(
                "if input is 2D, then offsets has to be None, as input is treated is a mini-batch "
                f"of fixed length sequences. However, found offsets of type {type(offsets)}"
            )
        rows, length = idx.shape
        return idx.reshape(-1), xp.repeat(xp.arange(rows), length), rows
    if idx.ndim != 1:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {idx.ndim}")
    if offsets is None:
        raise ValueError("offsets has to be a 1D Tensor but got None")
    off = _int_tensor(offsets, "offsets")
    if off.ndim != 1:
        raise ValueError("offsets has to be a 1D Tensor")
    n = idx.shape[0]
    if off.size and int(off[0]) != 0:
        raise ArgumentError(
            "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
            f"position 0. However, got {int(off[0])}"
        )
    if off.size and int(off[-1]) > n:
        raise ArgumentError(
            f"offsets[-1] can not be greater than input's length {n} but got offsets[-1] of "
            f"{int(off[-1])}"
        )
    if off.size > 1 and bool((off[1:] < off[:-1]).any()):
        raise ArgumentError(f"embedding_bag: offsets must not decrease, got {off.tolist()}")
    num_bags = max(0, off.size - 1) if include_last_offset else off.size
    bag_ids = xp.searchsorted(off, xp.arange(n), side="right") - 1
    if include_last_offset:  # the last offset ends the last bag
        bag_ids = xp.where(bag_ids >= num_bags, -1, bag_ids)
    return idx, bag_ids, num_bags


@on_input_device
def embedding_bag(
    input: Tensor,
    weight: Tensor,
    offsets: Tensor | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    mode: str = "mean",
    sparse: bool = False,
    per_sample_weights: Tensor | None = None,
    include_last_offset: bool = False,
    padding_idx: int | None = None,
) -> Tensor:
    """Reduce bags of rows of ``weight`` (num_embeddings, dim) picked by integer indices.

    Args:
        input: integer indices: 2-D (B, N), one bag per row; or 1-D with ``offsets``.
        weight: the (num_embeddings, embedding_dim) table.
        offsets: with a 1-D ``input``, where each bag starts (``offsets[0]`` is 0).
        max_norm, norm_type: renormalising rows is not supported (max_norm must be None).
        scale_grad_by_freq: divide each row's gradient by its count in ``input`` (not "max").
        mode: "sum", "mean" or "max" over each bag; an empty bag gives zeros.
        sparse: make the gradient of ``weight`` a sparse COO tensor of the rows looked up.
        per_sample_weights: with mode "sum", a weight per index (same shape as ``input``).
        include_last_offset: ``offsets`` has B + 1 entries, the last one ending the last bag.
        padding_idx: entries equal to it are left out of their bag (not counted by "mean").

    Returns:
        A (B, embedding_dim) tensor.

    Raises:
        ValueError: a wrong mode, shape or argument combination (PyTorch's messages).
        ArgumentError: non-integer indices, bad offsets, an index outside the table.
        NotImplementedError: ``max_norm``, or ``per_sample_weights`` with a
            mode other than "sum".

    Example:
        >>> w = gradwire.randn(10, 3, requires_grad=True)
        >>> idx, off = gradwire.tensor([1, 2, 4, 5, 4, 3]), gradwire.tensor([0, 4])
        >>> gradwire.nn.functional.embedding_bag(idx, w, off, mode="sum").shape
        (2, 3)
    """
    from ..errors import ArgumentError

    if (
        isinstance(weight, Tensor)
        and isinstance(input, Tensor)
        and weight._data.dtype == "int64"
        and input.is_floating_point()
    ):
        # PyTorch's old argument order, embedding_bag(weight, input, ...): still accepted
        warnings.warn(
            "Argument order of nn.functional.embedding_bag was changed. Usage "
            "`embedding_bag(weight, input, ...)` is deprecated, and should now be "
            "`embedding_bag(input, weight, ...)`.",
            stacklevel=3,
        )
        weight, input = input, weight
    if mode not in _MODES:
        raise ValueError("mode has to be one of sum, mean or max")
    if max_norm is not None:
        raise NotImplementedError(
            "embedding_bag: max_norm is not supported in gradwire (it renormalises weight rows "
            "in place); leave max_norm=None"
        )
    if mode == "max" and sparse:
        raise ValueError("max mode does not support sparse weights")
    if mode == "max" and scale_grad_by_freq:
        raise ValueError("max mode does not support scaling the gradient by the frequency")
    if per_sample_weights is not None and mode != "sum":
        raise NotImplementedError(
            "embedding_bag: per_sample_weights was not None. per_sample_weights is only "
            f"supported for mode='sum' (got mode='{mode}')."
        )
    if not isinstance(weight, Tensor) or weight.ndim != 2:
        dims = weight.ndim if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight has to be a 2D Tensor, but got Tensor of dimension {dims}")
    if per_sample_weights is not None and tuple(per_sample_weights.shape) != tuple(input.shape):
        raise ValueError(
            f"embedding_bag: If per_sample_weights ({per_sample_weights.shape}) is not None, "
            f"then it must have the same shape as the input ({input.shape})"
        )
    idx, bag_ids, num_bags = _bags(input, offsets, include_last_offset)
    xp = array_module(idx)
    num = weight.shape[0]
    outside = (idx < 0) | (idx >= num)
    if bool(outside.any()):
        at = int(xp.argmax(outside))
        raise ArgumentError(
            f"Index {at} of input takes value {int(idx[at])} which is not in the valid range "
            f"[0, {num})"
        )
    keep = bag_ids >= 0
    pad = _normalize_padding_idx(padding_idx, num)
    if pad is not None:
        keep &= idx != pad
    where = xp.nonzero(keep)[0]
    rows = EmbeddingLookup.apply(
        weight, indices=idx[where], scale_grad_by_freq=scale_grad_by_freq, sparse=bool(sparse)
    )
    bags = bag_ids[where]
    if mode == "max":
        return BagMax.apply(rows, bag_ids=bags, num_bags=num_bags)
    if per_sample_weights is not None:
        picked = EmbeddingLookup.apply(per_sample_weights.reshape(-1, 1), indices=where)
        rows = rows * picked.to(rows.dtype)
    elif mode == "mean":
        counts = xp.bincount(bags, minlength=num_bags)
        scale = (1.0 / xp.maximum(counts, 1))[bags].astype(rows._data.dtype)
        rows = rows * Tensor._wrap(scale[:, None])
    return BagSum.apply(rows, bag_ids=bags, num_bags=num_bags)
