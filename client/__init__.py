"""gradwire: distributed RPC, remote references and distributed autograd.

``import gradwire as gw`` gives PyTorch-style tensors with autograd; ``gradwire.distributed``
adds RPC, RRefs and distributed autograd across workers that are gRPC services.
"""

from __future__ import annotations

from . import _tensor_methods  # noqa: F401  (op surface of Tensor)
from . import autograd, nn, optim
from ._backend import Device, device, is_cuda_available
from ._creation import (
    arange, as_tensor, cat, concat, empty, empty_like, eye, full, full_like, linspace,
    manual_seed, ones, ones_like, rand, rand_like, randint, randn, randn_like, seed, stack,
    tensor, where, zeros, zeros_like,
)
from ._dtypes import (
    bool, cdouble, cfloat, complex64, complex128, double, dtype, float, float16, float32,
    float64, get_default_dtype, half, int, int8, int16, int32, int64, long, set_default_dtype,
    uint8,
)
from ._functional import *  # noqa: F403  (module-level math: gw.exp, gw.matmul, ...)
from ._functional import __all__ as _functional_all
from ._tensor import Tensor, from_numpy, is_tensor
from .autograd.grad_mode import (
    enable_grad, inference_mode, is_grad_enabled, is_inference_mode_enabled, no_grad,
    set_grad_enabled,
)

__version__ = "0.1.0"

__all__ = [
    "Tensor", "tensor", "as_tensor", "from_numpy", "is_tensor", "zeros", "ones", "full",
    "empty", "rand", "randn", "randint", "arange", "eye", "linspace", "zeros_like",
    "ones_like", "full_like", "empty_like", "rand_like", "randn_like", "manual_seed", "seed",
    "stack", "cat", "concat", "where", "dtype", "float16", "float32", "float64", "complex64",
    "complex128", "int8", "int16", "int32", "int64", "uint8", "bool", "half", "float",
    "double", "long", "int", "cfloat", "cdouble", "get_default_dtype", "set_default_dtype",
    "device", "Device", "is_cuda_available", "no_grad", "enable_grad", "set_grad_enabled",
    "inference_mode", "is_grad_enabled", "is_inference_mode_enabled", "autograd", "nn", "optim",
    *_functional_all,
]
