"""``gradwire.sparse``: functions of sparse COO tensors (PyTorch's ``torch.sparse``).

Sparse tensors themselves are ``gradwire.Tensor`` objects with ``layout`` ``gradwire.sparse_coo``
(made by ``gradwire.sparse_coo_tensor`` or ``Tensor.to_sparse()``); see ``docs/sparse.md``.
"""

from __future__ import annotations

from .._sparse_methods import sparse_sum as sum  # noqa: A004 - PyTorch's name

__all__ = ["sum"]
