"""The demo model: hidden layers on the parameter server, an output head on each trainer."""

from __future__ import annotations

from typing import Any

from .. import nn
from .._tensor import Tensor
from ..distributed import rpc
from ..nn import functional as F

__all__ = ["HiddenLayers", "forward_hidden", "hidden_parameter_rrefs"]


class HiddenLayers(nn.Module):
    """Linear(2, h) -> Tanh -> Linear(h, h) -> Tanh, created on the parameter server (on
    ``device``: its forward takes and returns CPU tensors, as PyTorch's RPC tutorials do)."""

    def __init__(self, hidden: int = 32, seed: int = 0, device: str = "cpu") -> None:
        super().__init__()
        from .. import manual_seed

        manual_seed(seed)
        self.device = device
        self.net = nn.Sequential(
            nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh()
        )
        self.net.to(device)

    def forward(self, x: Tensor) -> Tensor:
        # Hogwild: both trainers update these parameters while the other's backward may still
        # be pending. Each forward reads a snapshot (clone() is differentiable, so gradients
        # still reach the parameters), so an update never invalidates a saved tensor.
        h = x.to(self.device)  # batches arrive on the CPU; differentiable, so grads go back
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                h = F.linear(h, layer.weight.clone(), layer.bias.clone())
            else:
                h = layer(h)
        return h.to("cpu")


def forward_hidden(module_rref: Any, x: Tensor) -> Tensor:
    """Runs on the parameter server: the hidden layers' forward pass."""
    return module_rref.local_value()(x)


def hidden_parameter_rrefs(module_rref: Any) -> list[Any]:
    """Runs on the parameter server: RRefs of the hidden layers' parameters."""
    return [rpc.RRef(p) for p in module_rref.local_value().parameters()]
