"""Stochastic gradient descent with momentum, dampening, Nesterov and weight decay."""

from __future__ import annotations

from typing import Any, Iterable

from .._tensor import Tensor
from .optimizer import Optimizer, check_non_negative

__all__ = ["SGD"]


class SGD(Optimizer):
    """p -= lr * (g + weight_decay * p), with optional (Nesterov) momentum, as torch.optim.SGD.

    Example:
        >>> opt = gradwire.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    """

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

    def _update(self, p: Tensor, grad: Any, state: dict[str, Any], group: dict[str, Any]) -> None:
        d = p._data
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
