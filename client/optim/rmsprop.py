"""RMSprop (Hinton): divide the gradient by a running root mean square of its history."""

from __future__ import annotations

from typing import Any, Iterable

from .._tensor import Tensor
from ._real_view import real_step_inputs, write_back
from .optimizer import Optimizer, check_non_negative

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    """RMSprop as torch.optim.RMSprop.

    Per step, with ``g`` the gradient (negated when ``maximize``, plus ``weight_decay * p``):
    ``v = alpha * v + (1 - alpha) * g**2``; the denominator is ``sqrt(v) + eps``, or, when
    ``centered``, ``sqrt(v - m**2) + eps`` with ``m`` the running mean of ``g``; then
    ``p -= lr * g / denom``, or with ``momentum`` ``b = momentum * b + g / denom`` and
    ``p -= lr * b``. Complex parameters are treated as pairs of reals.

    Args:
        params: parameters (or parameter-group dicts) to optimize.
        lr: learning rate.
        alpha: smoothing constant of the squared-gradient average.
        eps: added to the denominator for numerical stability.
        weight_decay: L2 penalty added to the gradient.
        momentum: momentum factor.
        centered: normalize by an estimate of the gradient's variance.
        maximize: maximize the objective instead of minimizing it.

    Raises:
        ValueError: a negative ``lr``, ``alpha``, ``eps``, ``momentum`` or ``weight_decay``.

    Example:
        >>> opt = gradwire.optim.RMSprop(model.parameters(), lr=0.01, momentum=0.9)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        maximize: bool = False,
    ) -> None:
        check_non_negative(
            learning_rate=lr, epsilon=eps, momentum=momentum, weight_decay=weight_decay, alpha=alpha
        )
        super().__init__(
            params,
            dict(
                lr=lr,
                alpha=alpha,
                eps=eps,
                weight_decay=weight_decay,
                momentum=momentum,
                centered=centered,
                maximize=maximize,
            ),
        )

    def _update(self, p: Tensor, grad: Any, state: dict[str, Any], group: dict[str, Any]) -> None:
        d, xp, g = real_step_inputs(p, grad, group)
        if not state:
            state["step"] = 0
            state["square_avg"] = xp.zeros_like(d)
            if group["momentum"] > 0:
                state["momentum_buffer"] = xp.zeros_like(d)
            if group["centered"]:
                state["grad_avg"] = xp.zeros_like(d)
        state["step"] += 1
        alpha = group["alpha"]
        v = state["square_avg"]
        v *= alpha
        v += (1 - alpha) * g * g
        # ``denom`` is the one scratch array: each term is computed into it in place.
        if group["centered"]:
            m = state["grad_avg"]
            m *= alpha
            m += (1 - alpha) * g
            denom = m * m
            xp.subtract(v, denom, out=denom)
            xp.sqrt(denom, out=denom)
        else:
            denom = xp.sqrt(v)
        denom += group["eps"]
        xp.divide(g, denom, out=denom)
        if group["momentum"] > 0:
            buf = state["momentum_buffer"]
            buf *= group["momentum"]
            buf += denom
            xp.multiply(buf, group["lr"], out=denom)
        else:
            denom *= group["lr"]
        d -= denom.astype(d.dtype, copy=False)
        write_back(p._data, d)
