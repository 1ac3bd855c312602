"""AdamW (Loshchilov & Hutter): Adam with weight decay decoupled from the gradient."""

from __future__ import annotations

from typing import Any, Iterable

from .._tensor import Tensor
from .adam import Adam

__all__ = ["AdamW"]


class AdamW(Adam):
    """AdamW as torch.optim.AdamW: ``p *= 1 - lr * weight_decay`` before the Adam step.

    The Adam step itself (bias correction, ``amsgrad``, ``maximize``) is :class:`Adam`'s; only
    the weight decay differs: it shrinks the parameter directly instead of being added to the
    gradient, so it is not rescaled by the adaptive denominator.

    Args:
        params: parameters (or parameter-group dicts) to optimize.
        lr: learning rate.
        betas: decay rates of the first and second moment estimates.
        eps: added to the denominator for numerical stability.
        weight_decay: decoupled weight decay coefficient (PyTorch's default, 0.01).
        amsgrad: use the maximum of past second moments (AMSGrad).
        maximize: maximize the objective instead of minimizing it.

    Raises:
        ValueError: a negative ``lr``, ``eps`` or ``weight_decay``, or a beta outside [0, 1).

    Example:
        >>> opt = gradwire.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        maximize: bool = False,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
        )

    def _update(self, p: Tensor, grad: Any, state: dict[str, Any], group: dict[str, Any]) -> None:
        decay = group["lr"] * group["weight_decay"]
        if decay:
            p._data *= 1 - decay
        super()._update(p, grad, state, {**group, "weight_decay": 0.0})
