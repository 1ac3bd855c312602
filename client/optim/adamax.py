"""Adamax (Kingma and Ba): Adam with the infinity norm of past gradients."""

from __future__ import annotations

from typing import Any, Iterable

from .._tensor import Tensor
from ._real_view import real_step_inputs, write_back
from .optimizer import Optimizer, check_non_negative

__all__ = ["Adamax"]


class Adamax(Optimizer):
    """Adamax as torch.optim.Adamax.

    Per step ``t`` (from 1), with ``g`` the gradient (negated when ``maximize``, plus
    ``weight_decay * p``): ``m = b1 * m + (1 - b1) * g``, ``u = max(b2 * u, |g| + eps)``,
    ``p -= lr / (1 - b1**t) * m / u``.

    Args:
        params: parameters (or parameter-group dicts) to optimize.
        lr: learning rate.
        betas: decay of the first moment and of the infinity norm, each in [0, 1).
        eps: added to the norm for numerical stability.
        weight_decay: L2 penalty added to the gradient.
        maximize: maximize the objective instead of minimizing it.

    Raises:
        ValueError: a negative ``lr``, ``eps`` or ``weight_decay``, or a beta outside [0, 1).

    Example:
        >>> opt = gradwire.optim.Adamax(model.parameters(), lr=0.002)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        maximize: bool = False,
    ) -> None:
        check_non_negative(learning_rate=lr, epsilon=eps, weight_decay=weight_decay)
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta}")
        super().__init__(
            params,
            dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, maximize=maximize),
        )

    def _update(self, p: Tensor, grad: Any, state: dict[str, Any], group: dict[str, Any]) -> None:
        d, xp, g = real_step_inputs(p, grad, group)
        if not state:
            state["step"] = 0
            state["exp_avg"] = xp.zeros_like(d)
            state["exp_inf"] = xp.zeros_like(d)
        state["step"] += 1
        b1, b2 = group["betas"]
        m, u = state["exp_avg"], state["exp_inf"]
        m *= b1
        m += (1 - b1) * g
        u *= b2
        xp.maximum(u, xp.abs(g) + group["eps"], out=u)
        clr = group["lr"] / (1 - b1 ** state["step"])
        d -= (clr * m / u).astype(d.dtype, copy=False)
        write_back(p._data, d)
