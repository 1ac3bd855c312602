"""L1Loss / l1_loss against PyTorch's: values and gradients for each reduction."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest
from torch_oracle import torch_values


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_l1_loss_matches_pytorch(reduction: str) -> None:
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    x[0, 0] = y[0, 0]  # a zero difference: gradient 0, as in PyTorch
    ref = torch_values(
        "x = torch.tensor(inputs['x'], requires_grad=True)\n"
        f"out['loss'] = torch.nn.L1Loss(reduction='{reduction}')(x, torch.tensor(inputs['y']))\n"
        "out['loss'].sum().backward(); out['gx'] = x.grad\n",
        {"x": x, "y": y},
    )
    xt = gw.tensor(x, requires_grad=True)
    loss = gw.nn.L1Loss(reduction=reduction)(xt, gw.tensor(y))
    loss.sum().backward()
    np.testing.assert_allclose(loss.detach().numpy(), ref["loss"], rtol=1e-12)
    np.testing.assert_allclose(xt.grad.numpy(), ref["gx"], rtol=1e-12)
    with pytest.raises(ValueError, match="differ"):
        gw.nn.functional.l1_loss(xt, gw.ones(3))
