"""``Embedding``: a lookup table of ``num_embeddings`` vectors of size ``embedding_dim``."""

from __future__ import annotations

from typing import Any

from .._creation import empty
from .._ops.embedding import _normalize_padding_idx, embedding
from .._tensor import Tensor
from ..autograd.grad_mode import no_grad
from . import init
from .modules import Module
from .parameter import Parameter

__all__ = ["Embedding"]


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
        sparse: not supported (must be False).
        _weight: use this (num_embeddings, embedding_dim) tensor as the initial weight.
        _freeze: make the weight not require grad.

    Raises:
        ValueError: for non-positive sizes or ``padding_idx`` outside the table.
        NotImplementedError: for ``max_norm`` or ``sparse=True``.

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
        if sparse:
            raise NotImplementedError("Embedding(sparse=True) is not supported; use sparse=False")
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
            input, self.weight, self.padding_idx, None, self.norm_type, self.scale_grad_by_freq
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
