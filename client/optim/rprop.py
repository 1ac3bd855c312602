"""Rprop (Riedmiller and Braun): per-coordinate steps grown or shrunk by the gradient's sign."""

from __future__ import annotations

from typing import Any, Iterable

from .._backend import array_module
from .._tensor import Tensor
from ._real_view import as_real, write_back
from .optimizer import Optimizer, check_non_negative

__all__ = ["Rprop"]


class Rprop(Optimizer):
    """Rprop as torch.optim.Rprop.

    Per step, with ``g`` the gradient (negated when ``maximize``) and ``s = sign(g * g_prev)``:
    the step size is multiplied by ``etaplus`` where ``s > 0`` and by ``etaminus`` where
    ``s < 0``, then clipped to ``step_sizes``; where ``s < 0`` the gradient is taken as 0 (no
    move, and it is remembered as 0); ``p -= sign(g) * step_size``.

    Args:
        params: parameters (or parameter-group dicts) to optimize.
        lr: initial step size.
        etas: (etaminus, etaplus), with ``0 < etaminus < 1 < etaplus``.
        step_sizes: (minimal, maximal) step size.
        maximize: maximize the objective instead of minimizing it.

    Raises:
        ValueError: a negative ``lr`` or etas outside ``0 < etaminus < 1 < etaplus``.

    Example:
        >>> opt = gradwire.optim.Rprop(model.parameters(), lr=0.01)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        etas: tuple[float, float] = (0.5, 1.2),
        step_sizes: tuple[float, float] = (1e-6, 50.0),
        maximize: bool = False,
    ) -> None:
        check_non_negative(learning_rate=lr)
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]}")
        super().__init__(
            params,
            dict(lr=lr, etas=tuple(etas), step_sizes=tuple(step_sizes), maximize=maximize),
        )

    def _update(self, p: Tensor, grad: Any, state: dict[str, Any], group: dict[str, Any]) -> None:
        d = as_real(p._data)
        xp = array_module(d)
        g = as_real(grad)
        g = -g if group["maximize"] else xp.array(g, copy=True)
        if not state:
            state["step"] = 0
            state["prev"] = xp.zeros_like(d)
            state["step_size"] = xp.full_like(d, group["lr"])
        state["step"] += 1
        etaminus, etaplus = group["etas"]
        lo, hi = group["step_sizes"]
        sign = xp.sign(g * state["prev"])
        factor = xp.where(sign > 0, etaplus, xp.where(sign < 0, etaminus, 1.0))
        step_size = state["step_size"]
        step_size *= factor.astype(step_size.dtype, copy=False)
        xp.clip(step_size, lo, hi, out=step_size)
        g[sign < 0] = 0
        d -= (xp.sign(g) * step_size).astype(d.dtype, copy=False)
        state["prev"] = g
        write_back(p._data, d)
