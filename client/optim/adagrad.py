"""Adagrad (Duchi et al.): per-coordinate step sizes from the sum of squared gradients."""

from __future__ import annotations

import contextlib
from typing import Any, Iterable

from .. import _sparse_kernels as K
from .._backend import array_module, device_scope_of
from .._sparse_coo import SparseCOO, is_sparse
from .._tensor import Tensor
from ..errors import ArgumentError
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

    A sparse gradient (``nn.Embedding(sparse=True)``) is coalesced and updates ``s`` and the
    parameter at its rows only, as PyTorch's sparse path. There, as in PyTorch, a complex
    gradient is squared and rooted as a complex number, not as a pair of reals.

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
        ArgumentError: (at ``step``, a RuntimeError as PyTorch's) a sparse gradient with
            ``weight_decay``.

    Example:
        >>> opt = gradwire.optim.Adagrad(model.parameters(), lr=0.01)
    """

    _accepts_sparse_grad = True

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
                # made on the parameter's own device (CuPy allocates on the current one)
                with device_scope_of((p,)) or contextlib.nullcontext():
                    self._init_state(p, self.state.setdefault(p, {}), group)

    def _check_grad(self, p: Tensor, grad: Any, group: dict[str, Any]) -> None:
        super()._check_grad(p, grad, group)
        if is_sparse(grad) and group["weight_decay"]:
            raise ArgumentError("weight_decay option is not compatible with sparse gradients")

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        d = as_real(p._data)
        state["step"] = 0
        state["sum"] = array_module(d).full_like(d, group["initial_accumulator_value"])

    def _update(self, p: Tensor, grad: Any, state: dict[str, Any], group: dict[str, Any]) -> None:
        if not state:  # a parameter group added after construction
            self._init_state(p, state, group)
        state["step"] += 1
        clr = group["lr"] / (1 + (state["step"] - 1) * group["lr_decay"])
        if is_sparse(grad):
            _sparse_step(p._data, grad, state["sum"], clr, group)
            return
        d = as_real(p._data)
        xp = array_module(d)
        g = as_real(grad)
        g = -g if group["maximize"] else g
        if group["weight_decay"]:
            g = g + group["weight_decay"] * d
        s = state["sum"]
        s += g * g
        step = xp.sqrt(s)  # one scratch array, updated in place (no temporaries per term)
        step += group["eps"]
        xp.divide(g, step, out=step)
        step *= clr
        d -= step.astype(d.dtype, copy=False)
        write_back(p._data, d)


def _sparse_step(d: Any, grad: SparseCOO, total: Any, clr: float, group: dict[str, Any]) -> None:
    """PyTorch's sparse Adagrad step on the rows of ``grad``: ``s += g**2`` there, then
    ``p -= clr * g / (sqrt(s) + eps)`` there."""
    g = grad.with_values(-grad.values) if group["maximize"] else grad
    g = K.coalesce(g)  # the step is not linear in g: duplicate rows are summed first
    if d.dtype.kind == "c":  # the sum is stored as pairs of reals; PyTorch's sparse math is complex
        total = total.view(d.dtype)
    K.add_into_dense(total, g.with_values(g.values * g.values))
    std = K.mask(total, g).values
    xp = array_module(std)
    xp.sqrt(std, out=std)
    std += group["eps"]
    K.add_into_dense(d, g.with_values(g.values / std), -clr)
