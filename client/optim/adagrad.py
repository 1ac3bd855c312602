"""Adagrad (Duchi et al.): per-coordinate step sizes from the sum of squared gradients."""

from __future__ import annotations

from typing import Any, Iterable

from .._backend import array_module
from .._tensor import Tensor
from ._real_view import as_real, write_back
from .optimizer import Optimizer, check_non_negative

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    """Adagrad as torch.optim.Adagrad.

    Per step ``t`` (from 1), with ``g`` the gradient (negated when ``maximize``, plus
    ``weight_decay * p``): ``clr = lr / (1 + (t - 1) * lr_decay)``, ``s += g**2``,
    ``p -= clr * g / (sqrt(s) + eps)``; ``s`` starts at ``initial_accumulator_value``. As in
    PyTorch the state (``step``, ``sum``) exists from construction. Complex parameters are
    treated as pairs of reals.

    Args:
        params: parameters (or parameter-group dicts) to optimize.
        lr: learning rate.
        lr_decay: learning rate decay per step.
        weight_decay: L2 penalty added to the gradient.
        initial_accumulator_value: starting value of the squared-gradient sum.
        eps: added to the denominator for numerical stability.
        maximize: maximize the objective instead of minimizing it.

    Raises:
        ValueError: a negative ``lr``, ``lr_decay``, ``weight_decay``,
            ``initial_accumulator_value`` or ``eps``.

    Example:
        >>> opt = gradwire.optim.Adagrad(model.parameters(), lr=0.01)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        maximize: bool = False,
    ) -> None:
        check_non_negative(
            learning_rate=lr,
            lr_decay=lr_decay,
            weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value,
            epsilon=eps,
        )
        super().__init__(
            params,
            dict(
                lr=lr,
                lr_decay=lr_decay,
                weight_decay=weight_decay,
                initial_accumulator_value=initial_accumulator_value,
                eps=eps,
                maximize=maximize,
            ),
        )
        for group in self.param_groups:
            for p in group["params"]:
                self._init_state(p, self.state.setdefault(p, {}), group)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        d = as_real(p._data)
        state["step"] = 0
        state["sum"] = array_module(d).full_like(d, group["initial_accumulator_value"])

    def _update(self, p: Tensor, grad: Any, state: dict[str, Any], group: dict[str, Any]) -> None:
        if not state:  # a parameter group added after construction
            self._init_state(p, state, group)
        d = as_real(p._data)
        xp = array_module(d)
        g = as_real(grad)
        g = -g if group["maximize"] else g
        if group["weight_decay"]:
            g = g + group["weight_decay"] * d
        state["step"] += 1
        clr = group["lr"] / (1 + (state["step"] - 1) * group["lr_decay"])
        s = state["sum"]
        s += g * g
        step = xp.sqrt(s)  # one scratch array, updated in place (no temporaries per term)
        step += group["eps"]
        xp.divide(g, step, out=step)
        step *= clr
        d -= step.astype(d.dtype, copy=False)
        write_back(p._data, d)
