"""Stochastic gradient descent with momentum, dampening, Nesterov and weight decay."""

from __future__ import annotations

from typing import Any, Iterable

from .. import _sparse_kernels as K
from .._sparse_coo import SparseCOO, is_sparse
from .._tensor import Tensor
from ..errors import ArgumentError
from .optimizer import Optimizer, check_non_negative

__all__ = ["SGD"]


class SGD(Optimizer):
    """p -= lr * (g + weight_decay * p), with optional (Nesterov) momentum, as torch.optim.SGD.

    Sparse gradients (``nn.Embedding(sparse=True)``) move only the rows they hold. With
    momentum the buffer is then sparse too, as in PyTorch: it holds the rows seen so far
    (coalesced, so it grows with the rows touched, not with the steps), and each step moves
    those rows.

    Args:
        params: parameters (or parameter-group dicts) to optimize.
        lr: learning rate.
        momentum: momentum factor.
        dampening: dampening of the gradient added to the momentum buffer.
        weight_decay: L2 penalty added to the gradient (dense gradients only).
        nesterov: Nesterov momentum (needs a momentum and zero dampening).
        maximize: maximize the objective instead of minimizing it.

    Raises:
        ValueError: a negative ``lr``, ``momentum`` or ``weight_decay``, or ``nesterov``
            without momentum or with dampening.
        ArgumentError: (at ``step``, a RuntimeError as PyTorch's) a sparse gradient with
            ``weight_decay``, a dense gradient on a sparse momentum buffer, or a sparse
            gradient with Nesterov on a dense buffer: the combinations PyTorch refuses.

    Example:
        >>> opt = gradwire.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    """

    _accepts_sparse_grad = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        maximize: bool = False,
    ) -> None:
        check_non_negative(learning_rate=lr, momentum=momentum, weight_decay=weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(
            params,
            dict(
                lr=lr,
                momentum=momentum,
                dampening=dampening,
                weight_decay=weight_decay,
                nesterov=nesterov,
                maximize=maximize,
            ),
        )

    def _check_grad(self, p: Tensor, grad: Any, group: dict[str, Any]) -> None:
        # PyTorch fails on these with "add(sparse, dense) is not supported"; say which option.
        super()._check_grad(p, grad, group)
        sparse = is_sparse(grad)
        if sparse and group["weight_decay"]:
            raise ArgumentError(
                "SGD: the weight_decay option is not compatible with sparse gradients "
                "(PyTorch refuses it too); use weight_decay=0 for this parameter's group"
            )
        buf = self.state.get(p, {}).get("momentum_buffer") if group["momentum"] else None
        if buf is None:
            return
        if is_sparse(buf) and not sparse:
            raise ArgumentError(
                "SGD: this parameter's momentum buffer is sparse (its earlier gradients were "
                "sparse) and cannot take a dense gradient, as in PyTorch"
            )
        if sparse and not is_sparse(buf) and group["nesterov"]:
            raise ArgumentError(
                "SGD: Nesterov momentum cannot add this parameter's dense momentum buffer "
                "(its earlier gradients were dense) to a sparse gradient, as in PyTorch"
            )

    def _update(self, p: Tensor, grad: Any, state: dict[str, Any], group: dict[str, Any]) -> None:
        d = p._data
        if is_sparse(grad):
            g = _sparse_direction(grad, state, group)
            if is_sparse(g):
                K.add_into_dense(d, g, -group["lr"])
            else:  # a dense momentum buffer from earlier dense gradients
                d -= (group["lr"] * g).astype(d.dtype, copy=False)
            return
        g = -grad if group["maximize"] else grad
        if group["weight_decay"]:
            g = g + group["weight_decay"] * d
        mu = group["momentum"]
        if mu:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = g.copy()
            else:
                buf *= mu
                buf += (1 - group["dampening"]) * g
            g = g + mu * buf if group["nesterov"] else buf
        d -= (group["lr"] * g).astype(d.dtype, copy=False)


def _sparse_direction(grad: SparseCOO, state: dict[str, Any], group: dict[str, Any]) -> Any:
    """The step direction for a sparse gradient (updating the momentum buffer): sparse, or the
    dense buffer when earlier gradients were dense."""
    g = grad.with_values(-grad.values) if group["maximize"] else grad
    mu = group["momentum"]
    if not mu:
        return g
    buf = state.get("momentum_buffer")
    if buf is None:
        buf = K.coalesce(g.copy())  # PyTorch clones the gradient: a sparse buffer
    elif is_sparse(buf):
        decayed = buf.with_values(buf.values * mu)
        buf = K.coalesce(K.add(decayed, g, 1 - group["dampening"]))
    else:
        buf *= mu
        K.add_into_dense(buf, g, 1 - group["dampening"])
    state["momentum_buffer"] = buf
    if group["nesterov"]:
        return K.add(g, buf, mu)  # buf is sparse here: _check_grad refused a dense one
    return buf
