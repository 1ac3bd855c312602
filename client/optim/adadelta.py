"""Adadelta (Zeiler): steps scaled by running averages of squared gradients and updates."""

from __future__ import annotations

from typing import Any, Iterable

from .._tensor import Tensor
from ._real_view import real_step_inputs, write_back
from .optimizer import Optimizer, check_non_negative

__all__ = ["Adadelta"]


class Adadelta(Optimizer):
    """Adadelta as torch.optim.Adadelta.

    Per step, with ``g`` the gradient (negated when ``maximize``, plus ``weight_decay * p``):
    ``v = rho * v + (1 - rho) * g**2``, ``delta = sqrt(u + eps) / sqrt(v + eps) * g``,
    ``u = rho * u + (1 - rho) * delta**2``, ``p -= lr * delta``.

    Args:
        params: parameters (or parameter-group dicts) to optimize.
        lr: scale of the step (1.0 in the paper).
        rho: decay of the running averages, in [0, 1].
        eps: added inside the square roots.
        weight_decay: L2 penalty added to the gradient.
        maximize: maximize the objective instead of minimizing it.

    Raises:
        ValueError: a negative ``lr``, ``eps`` or ``weight_decay``, or ``rho`` outside [0, 1].

    Example:
        >>> opt = gradwire.optim.Adadelta(model.parameters(), rho=0.95)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        maximize: bool = False,
    ) -> None:
        check_non_negative(learning_rate=lr, epsilon=eps, weight_decay=weight_decay)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        super().__init__(
            params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize)
        )

    def _update(self, p: Tensor, grad: Any, state: dict[str, Any], group: dict[str, Any]) -> None:
        d, xp, g = real_step_inputs(p, grad, group)
        if not state:
            state["step"] = 0
            state["square_avg"] = xp.zeros_like(d)
            state["acc_delta"] = xp.zeros_like(d)
        state["step"] += 1
        rho, eps = group["rho"], group["eps"]
        v, u = state["square_avg"], state["acc_delta"]
        v *= rho
        v += (1 - rho) * g * g
        delta = xp.sqrt(u + eps) / xp.sqrt(v + eps) * g
        u *= rho
        u += (1 - rho) * delta * delta
        d -= (group["lr"] * delta).astype(d.dtype, copy=False)
        write_back(p._data, d)
