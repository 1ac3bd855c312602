"""``Embedding``: a lookup table of ``num_embeddings`` vectors of size ``embedding_dim``;
``EmbeddingBag``: the same table, its rows reduced per bag (sum, mean or max)."""

from __future__ import annotations

from typing import Any

from .._creation import empty
from .._ops.embedding import _normalize_padding_idx, embedding
from .._ops.embedding_bag import embedding_bag
from .._tensor import Tensor
from ..autograd.grad_mode import no_grad
from . import init
from .modules import Module
from .parameter import Parameter

__all__ = ["Embedding", "EmbeddingBag"]


class Embedding(Module):
    """Rows of ``weight`` (num_embeddings, embedding_dim) looked up by integer indices.

    ``weight`` starts from N(0, 1) with the ``padding_idx`` row zeroed, as in PyTorch; that
    row receives no gradient.

    Args:
        num_embeddings: size of the table.
        embedding_dim: size of each vector.
        padding_idx: a row (negative counts from the end) that stays fixed during training.
        max_norm: not supported (must be None).
        scale_grad_by_freq: divide gradients by the frequency of each index in the batch.
        sparse: the gradient of ``weight`` is a sparse COO tensor of the rows looked up
            (optimizers that take it: SGD, Adagrad, SparseAdam).
        _weight: use this (num_embeddings, embedding_dim) tensor as the initial weight.
        _freeze: make the weight not require grad.

    Raises:
        ValueError: for non-positive sizes or ``padding_idx`` outside the table.
        NotImplementedError: for ``max_norm``.

    Example:
        >>> emb = gradwire.nn.Embedding(10, 3, padding_idx=0)
        >>> emb(gradwire.tensor([[0, 2], [4, 9]])).shape
        (2, 2, 3)
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight: Tensor | None = None,
        _freeze: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if num_embeddings <= 0 or embedding_dim <= 0:
            raise ValueError(
                "Embedding needs positive sizes, got "
                f"num_embeddings={num_embeddings}, embedding_dim={embedding_dim}"
            )
        if max_norm is not None:
            raise NotImplementedError(
                "Embedding(max_norm=...) is not supported in gradwire (it renormalises rows in "
                "place during the lookup); leave max_norm=None"
            )
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = _normalize_padding_idx(padding_idx, num_embeddings)
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        if _weight is None:
            self.weight = Parameter(
                empty(num_embeddings, embedding_dim, dtype=dtype, device=device),
                requires_grad=not _freeze,
            )
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(
                    f"Shape of weight {tuple(_weight.shape)} does not match num_embeddings and "
                    f"embedding_dim ({num_embeddings}, {embedding_dim})"
                )
            self.weight = Parameter(_weight.detach(), requires_grad=not _freeze)

    def reset_parameters(self) -> None:
        """Refill ``weight`` from N(0, 1) and zero the padding row."""
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx].fill_(0)

    def forward(self, input: Tensor) -> Tensor:
        """Look up ``input`` (integer indices of any shape) -> (*input.shape, embedding_dim)."""
        return embedding(
            input,
            self.weight,
            self.padding_idx,
            None,
            self.norm_type,
            self.scale_grad_by_freq,
            self.sparse,
        )

    @classmethod
    def from_pretrained(
        cls,
        embeddings: Tensor,
        freeze: bool = True,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
    ) -> Embedding:
        """An Embedding whose weight is (a copy-free detached view of) ``embeddings``.

        Args:
            embeddings: the (num_embeddings, embedding_dim) table.
            freeze: when True the weight does not require grad.
            padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse: as for the
                constructor (the padding row is *not* zeroed, as in PyTorch).

        Raises:
            ValueError: if ``embeddings`` is not 2-D.
        """
        if embeddings.ndim != 2:
            raise ValueError(
                f"Embeddings parameter is expected to be 2-dimensional, got shape {embeddings.shape}"
            )
        rows, dim = embeddings.shape
        return cls(
            rows,
            dim,
            padding_idx=padding_idx,
            max_norm=max_norm,
            norm_type=norm_type,
            scale_grad_by_freq=scale_grad_by_freq,
            sparse=sparse,
            _weight=embeddings,
            _freeze=freeze,
        )

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.scale_grad_by_freq:
            s += ", scale_grad_by_freq=True"
        return s


class EmbeddingBag(Module):
    """Bags of rows of ``weight`` (num_embeddings, embedding_dim) reduced by ``mode``, without
    building the rows of each bag (``nn.functional.embedding_bag``).

    ``weight`` starts from N(0, 1) with the ``padding_idx`` row zeroed, as in PyTorch.

    Args:
        num_embeddings: size of the table.
        embedding_dim: size of each vector.
        max_norm: not supported (must be None).
        scale_grad_by_freq: divide gradients by the frequency of each index (not for "max").
        mode: "sum", "mean" (the default) or "max".
        sparse: the gradient of ``weight`` is a sparse COO tensor of the rows looked up.
        _weight: use this (num_embeddings, embedding_dim) tensor as the initial weight.
        include_last_offset: ``offsets`` has one more entry, ending the last bag.
        padding_idx: a row (negative counts from the end) left out of every bag.

    Raises:
        ValueError: for non-positive sizes, an unknown mode or ``padding_idx`` outside the
            table.
        NotImplementedError: for ``max_norm``.

    Example:
        >>> bag = gradwire.nn.EmbeddingBag(10, 3, mode="sum")
        >>> bag(gradwire.tensor([[1, 2], [4, 9]])).shape
        (2, 3)
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        _weight: Tensor | None = None,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if num_embeddings <= 0 or embedding_dim <= 0:
            raise ValueError(
                "EmbeddingBag needs positive sizes, got "
                f"num_embeddings={num_embeddings}, embedding_dim={embedding_dim}"
            )
        if mode not in ("sum", "mean", "max"):
            raise ValueError("mode has to be one of sum, mean or max")
        if max_norm is not None:
            raise NotImplementedError(
                "EmbeddingBag(max_norm=...) is not supported in gradwire (it renormalises rows "
                "in place during the lookup); leave max_norm=None"
            )
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.mode, self.sparse = scale_grad_by_freq, mode, sparse
        self.include_last_offset = include_last_offset
        self.padding_idx = _normalize_padding_idx(padding_idx, num_embeddings)
        if _weight is None:
            self.weight = Parameter(
                empty(num_embeddings, embedding_dim, dtype=dtype, device=device)
            )
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(
                    f"Shape of weight {tuple(_weight.shape)} does not match num_embeddings and "
                    f"embedding_dim ({num_embeddings}, {embedding_dim})"
                )
            self.weight = Parameter(_weight.detach())

    def reset_parameters(self) -> None:
        """Refill ``weight`` from N(0, 1) and zero the padding row."""
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx].fill_(0)

    def forward(
        self,
        input: Tensor,
        offsets: Tensor | None = None,
        per_sample_weights: Tensor | None = None,
    ) -> Tensor:
        """Reduce the bags of ``input`` (2-D, or 1-D with ``offsets``) -> (bags, embedding_dim)."""
        return embedding_bag(
            input,
            self.weight,
            offsets,
            None,
            self.norm_type,
            self.scale_grad_by_freq,
            self.mode,
            self.sparse,
            per_sample_weights,
            self.include_last_offset,
            self.padding_idx,
        )

    @classmethod
    def from_pretrained(
        cls,
        embeddings: Tensor,
        freeze: bool = True,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
    ) -> EmbeddingBag:
        """An EmbeddingBag whose weight is (a detached view of) ``embeddings``.

        Args:
            embeddings: the (num_embeddings, embedding_dim) table.
            freeze: when True the weight does not require grad.
            max_norm, norm_type, scale_grad_by_freq, mode, sparse, include_last_offset,
                padding_idx: as for the constructor (the padding row is *not* zeroed).

        Raises:
            ValueError: if ``embeddings`` is not 2-D.
        """
        if embeddings.ndim != 2:
            raise ValueError(
                f"Embeddings parameter is expected to be 2-dimensional, got shape {embeddings.shape}"
            )
        rows, dim = embeddings.shape
        bag = cls(
            rows,
            dim,
            max_norm=max_norm,
            norm_type=norm_type,
            scale_grad_by_freq=scale_grad_by_freq,
            mode=mode,
            sparse=sparse,
            _weight=embeddings,
            include_last_offset=include_last_offset,
            padding_idx=padding_idx,
        )
        bag.weight.requires_grad_(not freeze)
        return bag

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.scale_grad_by_freq:
            s += ", scale_grad_by_freq=True"
        s += f", mode={self.mode!r}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s
