"""gradwire.linalg: PyTorch's ``torch.linalg`` functions built on gradwire's differentiable ops.

Example:
    >>> gw.linalg.multi_dot([a, b, c])   # a @ b @ c
"""

from __future__ import annotations

from collections.abc import Sequence

from ._tensor import Tensor

__all__ = ["multi_dot"]


def multi_dot(tensors: Sequence[Tensor]) -> Tensor:
    """The product of two or more matrices; the first may be 1-D (a row vector) and the last
    1-D (a column vector), as in PyTorch. Differentiable like the products it is made of.

    Raises:
        RuntimeError: fewer than two tensors, or one that is not 1-D or 2-D where allowed.

    Example:
        >>> gw.linalg.multi_dot([gw.ones(2, 3), gw.ones(3, 4), gw.ones(4)]).shape
        (2,)
    """
    tensors = list(tensors)
    if len(tensors) < 2:
        raise RuntimeError(f"multi_dot(): expected at least 2 tensors but got {len(tensors)}")
    for i, t in enumerate(tensors):
        allowed = (1, 2) if i in (0, len(tensors) - 1) else (2,)
        if t.ndim not in allowed:
            raise RuntimeError(
                f"multi_dot(): tensor {i} must be {' or '.join(f'{d}D' for d in allowed)}, "
                f"got {t.ndim}D"
            )
    out = tensors[0]
    for t in tensors[1:]:
        out = out.matmul(t)
    return out
