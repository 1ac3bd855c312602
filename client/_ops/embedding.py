"""Embedding lookup (rows of a weight table picked by integer indices), its scatter-add
backward, and the functional form ``embedding`` (exported by ``gradwire.nn.functional``)."""

from __future__ import annotations

from typing import Any

from .._backend import array_module, on_input_device, ufunc_at
from .._sparse_coo import SparseCOO
from .._tensor import Tensor
from ._base import Op

__all__ = ["EmbeddingLookup", "EmbeddingScatter", "EmbeddingSparseGrad", "embedding"]


class EmbeddingLookup(Op):
    """weight[indices] -> (*indices.shape, dim). ``indices`` is a raw integer array (checked by
    the caller); the row ``padding_idx`` gets no gradient."""

    def forward(
        self,
        weight: Any,
        indices: Any = None,
        padding_idx: int | None = None,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
    ) -> Any:
        self.save("indices", indices)
        self.save("num_weights", weight._data.shape[0])
        self.save("padding_idx", padding_idx)
        self.save("scale_grad_by_freq", scale_grad_by_freq)
        self.save("sparse", sparse)
        return weight._data[indices]

    def backward(self, g: Any) -> Any:
        op = EmbeddingSparseGrad if self.saved("sparse") else EmbeddingScatter
        return op.apply(
            g,
            indices=self.saved("indices"),
            num_weights=self.saved("num_weights"),
            padding_idx=self.saved("padding_idx"),
            scale_grad_by_freq=self.saved("scale_grad_by_freq"),
        )

    def name(self) -> str:
        return "EmbeddingBackward0"


def _row_weights(
    xp: Any, flat: Any, num_weights: int, padding_idx: int | None, by_freq: bool, dtype: Any
) -> Any:
    """Per-index factor applied to the incoming rows: 0 for the padding row, 1/count when
    scaling by frequency; None when every factor is 1."""
    if padding_idx is None and not by_freq:
        return None
    w = xp.ones(flat.shape, dtype=dtype)
    if by_freq:
        w = w / xp.bincount(flat, minlength=num_weights)[flat].astype(dtype)
    if padding_idx is not None:
        w = xp.where(flat == padding_idx, 0, w).astype(dtype)
    return w[:, None]


def _flat_rows(g: Any, indices: Any) -> tuple[Any, Any, Any]:
    """(array module, the indices flattened, the gradient's rows, one per index)."""
    data = g._data
    return array_module(data), indices.reshape(-1), data.reshape(-1, data.shape[-1])


class EmbeddingScatter(Op):
    """zeros(num_weights, dim) with rows of ``g`` added at ``indices`` (duplicates accumulate);
    differentiable, so double backward works."""

    def forward(
        self,
        g: Any,
        indices: Any = None,
        num_weights: int = 0,
        padding_idx: int | None = None,
        scale_grad_by_freq: bool = False,
    ) -> Any:
        xp, flat, rows = _flat_rows(g, indices)
        scale = _row_weights(xp, flat, num_weights, padding_idx, scale_grad_by_freq, rows.dtype)
        if scale is not None:
            rows = rows * scale
        out = xp.zeros((num_weights, rows.shape[1]), dtype=g._data.dtype)
        ufunc_at("add", out, flat, rows)
        self.save("indices", indices)
        self.save("scale", scale)
        return out

    def backward(self, gg: Any) -> Any:
        indices, scale = self.saved("indices"), self.saved("scale")
        picked = gg[indices]
        if scale is None:
            return picked
        return picked * Tensor._wrap(scale.reshape(*indices.shape, 1))


class EmbeddingSparseGrad(Op):
    """The gradient of a lookup as a sparse COO tensor of the table's shape: one value row per
    index looked up (duplicates stay separate, uncoalesced, as PyTorch's), the padding row's
    left out; only these rows travel and reach the optimizer. Differentiable (double
    backward picks the rows again)."""

    sparse_inputs = True

    def forward(
        self,
        g: Any,
        indices: Any = None,
        num_weights: int = 0,
        padding_idx: int | None = None,
        scale_grad_by_freq: bool = False,
    ) -> Any:
        xp, flat, rows = _flat_rows(g, indices)
        dim = rows.shape[1]
        scale = _row_weights(xp, flat, num_weights, None, scale_grad_by_freq, rows.dtype)
        self.save("indices", indices)
        self.save("scale", scale)
        self.save("padding_idx", padding_idx)
        if padding_idx is not None:
            keep = flat != padding_idx
            flat, rows = flat[keep], rows[keep]  # new arrays
            scale = None if scale is None else scale[keep]
        else:
            rows = rows.copy()  # the gradient owns its values (``g`` may be a caller's tensor)
        if scale is not None:
            rows *= scale
        return SparseCOO(flat.reshape(1, -1).astype("int64"), rows, (num_weights, dim), False)

    def backward(self, gg: Any) -> Any:
        from .sparse import ToDense

        indices, scale = self.saved("indices"), self.saved("scale")
        dense = ToDense.apply(gg) if gg.is_sparse else gg
        picked = dense[indices]
        padding_idx = self.saved("padding_idx")
        if padding_idx is not None:
            keep = (indices != padding_idx)[..., None]
            picked = picked * Tensor._wrap(keep.astype(picked._data.dtype))
        if scale is None:
            return picked
        return picked * Tensor._wrap(scale.reshape(*indices.shape, 1))

    def name(self) -> str:
        return "EmbeddingBackward0"


def _normalize_padding_idx(padding_idx: int | None, num_embeddings: int) -> int | None:
    if padding_idx is None:
        return None
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise ValueError(
            f"Padding_idx must be within num_embeddings: got padding_idx={padding_idx} for "
            f"{num_embeddings} embeddings"
        )
    return padding_idx % num_embeddings


@on_input_device
def embedding(
    input: Tensor,
    weight: Tensor,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Tensor:
    """Look up rows of ``weight`` (num_embeddings, dim) at the integer indices ``input``.

    Args:
        input: an integer tensor of any shape.
        weight: the (num_embeddings, embedding_dim) table.
        padding_idx: the row that gets no gradient (negative counts from the end).
        max_norm, norm_type: renormalising looked-up rows is not supported (must be None).
        scale_grad_by_freq: divide each row's gradient by the row's count in ``input``.
        sparse: make the gradient of ``weight`` a sparse COO tensor holding only the rows
            looked up (for large tables: see ``docs/sparse.md``).

    Returns:
        A tensor of shape ``(*input.shape, embedding_dim)``.

    Raises:
        ArgumentError: if ``input`` is not an integer tensor or ``weight`` is not 2-D.
        IndexError: if an index is outside [0, num_embeddings).
        NotImplementedError: for ``max_norm``.

    Example:
        >>> w = gradwire.randn(10, 3, requires_grad=True)
        >>> gradwire.nn.functional.embedding(gradwire.tensor([[1, 2], [4, 9]]), w).shape
        (2, 2, 3)
    """
    from ..errors import ArgumentError

    if max_norm is not None:
        raise NotImplementedError(
            "embedding: max_norm is not supported in gradwire (it renormalises weight rows in "
            "place); leave max_norm=None and clip the weights yourself if needed"
        )
    if not isinstance(input, Tensor) or input._data.dtype.kind not in "iu":
        got = input.dtype if isinstance(input, Tensor) else type(input).__name__
        raise ArgumentError(
            "Expected tensor for argument #1 'indices' to have one of the following scalar "
            f"types: Long, Int; but got {got} instead (while checking arguments for embedding); "
            "pass integer indices, e.g. x.long()"
        )
    if weight.ndim != 2:
        raise ArgumentError(f"embedding: 'weight' must be 2-D, got shape {weight.shape}")
    num = weight.shape[0]
    idx = input._data
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= num):
        bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
        raise IndexError(
            f"index out of range in self: embedding index {bad} is outside [0, {num}) "
            f"for a table of {num} rows"
        )
    return EmbeddingLookup.apply(
        weight,
        indices=idx,
        padding_idx=_normalize_padding_idx(padding_idx, num),
        scale_grad_by_freq=scale_grad_by_freq,
        sparse=bool(sparse),
    )
