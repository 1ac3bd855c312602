"""gradwire.nn: modules, parameters and losses, enough to train models like in PyTorch."""

from __future__ import annotations

from . import functional, init
from .modules import (
    CrossEntropyLoss,
    Identity,
    Linear,
    Module,
    MSELoss,
    ReLU,
    Sequential,
    Sigmoid,
    Tanh,
)
from .parameter import Parameter

__all__ = [
    "Module",
    "Parameter",
    "Linear",
    "ReLU",
    "Sigmoid",
    "Tanh",
    "Identity",
    "Sequential",
    "MSELoss",
    "CrossEntropyLoss",
    "functional",
    "init",
]
