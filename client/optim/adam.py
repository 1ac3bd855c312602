"""Adam (Kingma & Ba), with PyTorch's bias correction, weight decay and amsgrad."""

from __future__ import annotations

import math
from typing import Any, Iterable

from .._tensor import Tensor
from ._real_view import real_step_inputs, write_back
from .optimizer import Optimizer, check_non_negative

__all__ = ["Adam"]


class Adam(Optimizer):
    """Adam as torch.optim.Adam (L2 weight decay added to the gradient).

    Example:
        >>> opt = gradwire.optim.Adam(model.parameters(), lr=1e-3)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        maximize: bool = False,
    ) -> None:
        check_non_negative(learning_rate=lr, epsilon=eps)
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameters: {betas}")
        check_non_negative(weight_decay=weight_decay)
        super().__init__(
            params,
            dict(
                lr=lr,
                betas=betas,
                eps=eps,
                weight_decay=weight_decay,
                amsgrad=amsgrad,
                maximize=maximize,
            ),
        )

    @classmethod
    def _sparse_refusal(cls) -> str:
        # PyTorch's words, AdamW's included (it says "Adam" there too).
        return "Adam does not support sparse gradients, please consider SparseAdam instead"

    def _update(self, p: Tensor, grad: Any, state: dict[str, Any], group: dict[str, Any]) -> None:
        d, xp, g = real_step_inputs(p, grad, group)
        if not state:
            state["step"] = 0
            state["exp_avg"] = xp.zeros_like(d)
            state["exp_avg_sq"] = xp.zeros_like(d)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = xp.zeros_like(state["exp_avg_sq"])
        b1, b2 = group["betas"]
        state["step"] += 1
        t = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * g * g
        if group["amsgrad"]:
            xp.maximum(state["max_exp_avg_sq"], v, out=state["max_exp_avg_sq"])
            v = state["max_exp_avg_sq"]
        bc1 = 1 - b1**t
        bc2 = 1 - b2**t
        denom = xp.sqrt(v) / math.sqrt(bc2) + group["eps"]
        d -= ((group["lr"] / bc1) * m / denom).astype(d.dtype, copy=False)
        write_back(p._data, d)
