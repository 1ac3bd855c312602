"""SparseAdam: Adam on the rows a sparse gradient holds (``nn.Embedding(sparse=True)``)."""

from __future__ import annotations

import math
from typing import Any, Iterable

from .. import _sparse_kernels as K
from .._backend import array_module
from .._sparse_coo import is_sparse
from .._tensor import Tensor
from ..errors import ArgumentError
from .optimizer import Optimizer

__all__ = ["SparseAdam"]


class SparseAdam(Optimizer):
    """SparseAdam as torch.optim.SparseAdam: Adam's moments and step, masked to the rows of
    each (sparse) gradient.

    Per step ``t`` (from 1, counted on every step with a gradient, an empty one included),
    with ``g`` the coalesced gradient (negated when ``maximize``) and ``r`` its rows:
    ``m[r] = b1 * m[r] + (1 - b1) * g``, ``v[r] = b2 * v[r] + (1 - b2) * g**2``,
    ``p[r] -= lr * sqrt(1 - b2**t) / (1 - b1**t) * m[r] / (sqrt(v[r]) + eps)``. Rows the
    gradient does not hold keep their parameter and moments. As PyTorch, it takes dense
    real parameters and sparse gradients only.

    Args:
        params: parameters (or parameter-group dicts) to optimize.
        lr: learning rate (> 0).
        betas: decay rates of the first and second moment estimates, each in [0, 1).
        eps: added to the denominator for numerical stability (> 0).
        maximize: maximize the objective instead of minimizing it.

    Raises:
        ValueError: ``lr`` or ``eps`` not positive, a beta outside [0, 1), or a sparse or
            complex parameter (PyTorch's messages, with the [group, index] of each).
        ArgumentError: (at ``step``, a RuntimeError as PyTorch's) a dense gradient.

    Example:
        >>> emb = gradwire.nn.Embedding(1000, 16, sparse=True)
        >>> opt = gradwire.optim.SparseAdam(emb.parameters(), lr=0.01)
    """

    _accepts_sparse_grad = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        maximize: bool = False,
    ) -> None:
        # ``not 0 < x`` (not ``x <= 0``): NaN is refused too, as PyTorch's checks read.
        if not 0.0 < lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 < eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, maximize=maximize))
        where = [
            (i, j, p)
            for i, group in enumerate(self.param_groups)
            for j, p in enumerate(group["params"])
        ]
        sparse = [[i, j] for i, j, p in where if p.is_sparse]
        if sparse:
            raise ValueError(
                f"Sparse params at indices {sparse}: SparseAdam requires dense parameter tensors"
            )
        complex_ = [[i, j] for i, j, p in where if p.is_complex()]
        if complex_:
            raise ValueError(
                f"Complex params at indices {complex_}: SparseAdam does not support complex "
                "parameters"
            )

    def _check_grad(self, p: Tensor, grad: Any, group: dict[str, Any]) -> None:
        if not is_sparse(grad):
            raise ArgumentError(
                "SparseAdam does not support dense gradients, please consider Adam instead"
            )

    def _update(self, p: Tensor, grad: Any, state: dict[str, Any], group: dict[str, Any]) -> None:
        d = p._data
        xp = array_module(d)
        if not state:
            state["step"] = 0
            state["exp_avg"] = xp.zeros_like(d)
            state["exp_avg_sq"] = xp.zeros_like(d)
        state["step"] += 1
        t = state["step"]
        g = grad.with_values(-grad.values) if group["maximize"] else grad
        g = K.coalesce(g)  # the update is not linear in g: duplicate rows are summed first
        if not g.nnz:
            return
        b1, b2 = group["betas"]
        values = g.values
        # Old moments at the rows, and the change that moves each to its new value; the new
        # values are rebuilt from these two (as PyTorch does) instead of reading them back.
        old_m = K.mask(state["exp_avg"], g).values
        step_m = (values - old_m) * (1 - b1)
        K.add_into_dense(state["exp_avg"], g.with_values(step_m))
        old_v = K.mask(state["exp_avg_sq"], g).values
        step_v = (values * values - old_v) * (1 - b2)
        K.add_into_dense(state["exp_avg_sq"], g.with_values(step_v))
        numer = step_m + old_m
        denom = xp.sqrt(step_v + old_v) + group["eps"]
        step_size = group["lr"] * math.sqrt(1 - b2**t) / (1 - b1**t)
        K.add_into_dense(d, g.with_values(numer / denom), -step_size)
