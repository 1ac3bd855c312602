"""Adadelta, Adamax and Rprop against PyTorch's: the same parameters after the same gradients."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest
from torch_oracle import torch_values

CASES = [
    ("Adadelta", "rho=0.95"),
    ("Adadelta", "lr=0.5, weight_decay=0.1, maximize=True"),
    ("Adamax", "lr=0.05"),
    ("Adamax", "betas=(0.8, 0.99), weight_decay=0.1, maximize=True"),
    ("Rprop", "lr=0.05"),
    ("Rprop", "etas=(0.4, 1.5), step_sizes=(1e-3, 0.2), maximize=True"),
]


@pytest.mark.parametrize(("name", "kwargs"), CASES)
def test_steps_match_pytorch(name: str, kwargs: str) -> None:
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((3, 4))
    grads = [rng.standard_normal((3, 4)) for _ in range(5)]
    grads[2] = -grads[1]  # a sign change, for Rprop's backtracking
    p = gw.tensor(w0.copy(), requires_grad=True)
    opt = eval(f"gw.optim.{name}([p], {kwargs})")
    for g in grads:
        p.grad = gw.tensor(g)
        opt.step()
    ref = torch_values(
        f"p = torch.tensor(inputs['w'], requires_grad=True)\n"
        f"opt = torch.optim.{name}([p], {kwargs})\n"
        f"for i in range({len(grads)}):\n"
        f"    p.grad = torch.tensor(inputs[f'g{{i}}'])\n"
        f"    opt.step()\n"
        f"out['p'] = p\n",
        {"w": w0, **{f"g{i}": g for i, g in enumerate(grads)}},
    )
    np.testing.assert_allclose(p.detach().numpy(), ref["p"], rtol=1e-12, atol=1e-12)


def test_invalid_hyperparameters() -> None:
    p = gw.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match="rho"):
        gw.optim.Adadelta([p], rho=1.5)
    with pytest.raises(ValueError, match="beta"):
        gw.optim.Adamax([p], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="eta"):
        gw.optim.Rprop([p], etas=(1.5, 1.2))
