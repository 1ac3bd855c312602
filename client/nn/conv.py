"""2-D convolution: ``gradwire.nn.functional.conv2d`` and the ``nn.Conv2d`` layer."""

from __future__ import annotations

import math
from typing import Any

from .._backend import on_input_device
from .._creation import empty
from .._ops.conv import Conv2d as _Conv2dOp
from .._ops.conv import ConvGeometry
from .._tensor import Tensor
from ..errors import ArgumentError
from . import init
from .modules import Module
from .parameter import Parameter

__all__ = ["conv2d", "Conv2d"]

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def pair(value: Any, name: str, op: str) -> tuple[int, int]:
    """``value`` (an int or a pair of ints) as a ``(h, w)`` tuple; clear error otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) in (1, 2):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return (value[0], value[-1])
    raise TypeError(f"{op}: {name} must be an int or a tuple of two ints, got {value!r}")


def _padding(
    padding: Any, kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int]
) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) zero padding for an int, a pair, 'valid' or 'same'."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding != "same":
            raise ArgumentError(
                f"Invalid padding string '{padding}', should be one of {{'valid', 'same'}}"
            )
        if stride != (1, 1):
            raise ArgumentError(
                f"padding='same' is not supported for strided convolutions (stride={stride}); "
                "give the padding as numbers instead"
            )
        # As PyTorch: any odd leftover of the total padding goes to the bottom / right.
        th, tw = dilation[0] * (kernel[0] - 1), dilation[1] * (kernel[1] - 1)
        return (th // 2, th - th // 2, tw // 2, tw - tw // 2)
    ph, pw = pair(padding, "padding", "conv2d")
    if ph < 0 or pw < 0:
        raise ArgumentError(f"negative padding is not supported, got padding={padding!r}")
    return (ph, ph, pw, pw)


def _shape(t: Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


@on_input_device
def conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """2-D cross-correlation of ``input`` with ``weight``, as ``torch.nn.functional.conv2d``.

    Args:
        input: ``(N, C_in, H, W)``, or ``(C_in, H, W)`` for one unbatched image.
        weight: ``(C_out, C_in / groups, kH, kW)`` filters.
        bias: optional ``(C_out,)`` added to every output position.
        stride: step between windows, an int or ``(sH, sW)``.
        padding: zeros added on each side, an int, ``(pH, pW)``, ``'valid'`` (none) or
            ``'same'`` (output as large as the input; stride 1 only).
        dilation: spacing between kernel elements, an int or ``(dH, dW)``.
        groups: split the channels into this many independent convolutions.

    Returns:
        ``(N, C_out, H_out, W_out)`` (or ``(C_out, H_out, W_out)`` for an unbatched input).

    Raises:
        ArgumentError: (a RuntimeError and ValueError) on a shape mismatch between input,
            weight and bias, a kernel larger than the padded input, non-positive stride,
            dilation or groups, negative padding, or mixed dtypes.

    Example:
        >>> x = gradwire.randn(8, 3, 32, 32)
        >>> w = gradwire.randn(16, 3, 3, 3)
        >>> gradwire.nn.functional.conv2d(x, w, padding=1).shape
        gradwire.Size([8, 16, 32, 32])
    """
    if weight.ndim != 4:
        raise ArgumentError(
            f"conv2d expects a 4-D weight (out_channels, in_channels / groups, kH, kW), "
            f"got weight of size {_shape(weight)}"
        )
    if input.ndim not in (3, 4):
        raise ArgumentError(
            "Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: "
            + _shape(input)
        )
    stride2, dilation2 = pair(stride, "stride", "conv2d"), pair(dilation, "dilation", "conv2d")
    if min(stride2) <= 0:
        raise ArgumentError(f"non-positive stride is not supported, got stride={stride!r}")
    if min(dilation2) <= 0:
        raise ArgumentError(f"dilation should be greater than zero, got dilation={dilation!r}")
    if not isinstance(groups, int) or groups <= 0:
        raise ArgumentError(f"non-positive groups is not supported, got groups={groups!r}")
    o, cg, kh, kw = weight.shape
    if o % groups:
        raise ArgumentError(
            f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
            f"but got weight of size {_shape(weight)} instead"
        )
    x = input if input.ndim == 4 else input.unsqueeze(0)
    if x.shape[1] != cg * groups:
        raise ArgumentError(
            f"Given groups={groups}, weight of size {_shape(weight)}, expected input"
            f"{_shape(input)} to have {cg * groups} channels, but got {x.shape[1]} channels "
            "instead"
        )
    if bias is not None and tuple(bias.shape) != (o,):
        raise ArgumentError(
            f"Given weight of size {_shape(weight)}, expected bias to be 1-dimensional with "
            f"{o} elements, but got bias of size {_shape(bias)} instead"
        )
    pad = _padding(padding, (kh, kw), stride2, dilation2)
    ph, pw = x.shape[2] + pad[0] + pad[1], x.shape[3] + pad[2] + pad[3]
    eh, ew = dilation2[0] * (kh - 1) + 1, dilation2[1] * (kw - 1) + 1
    if ph < eh or pw < ew:
        raise ArgumentError(
            f"Calculated padded input size per channel: ({ph} x {pw}). Kernel size: "
            f"({eh} x {ew}). Kernel size can't be greater than actual input size"
        )
    out: Tensor = _Conv2dOp.apply(
        x, weight, bias, geo=ConvGeometry(stride2, pad, dilation2, groups)
    )
    return out if input.ndim == 4 else out.squeeze(0)


class Conv2d(Module):
    """A 2-D convolution layer with PyTorch's arguments and default initialisation.

    The weight is ``(out_channels, in_channels / groups, kH, kW)``, initialised with
    ``kaiming_uniform_(a=sqrt(5))``; the bias is uniform in ``+-1/sqrt(fan_in)``.

    Args:
        in_channels: channels of the input.
        out_channels: channels the layer produces.
        kernel_size: an int or ``(kH, kW)``.
        stride, padding, dilation, groups: as :func:`conv2d`.
        bias: learn an additive bias (default True).
        padding_mode: only ``'zeros'`` is implemented.
        device, dtype: where and how the parameters are created.

    Raises:
        ValueError: ``groups`` does not divide both channel counts, an unknown padding string or
            mode, or ``padding='same'`` with a stride.
        NotImplementedError: a ``padding_mode`` other than ``'zeros'``.

    Example:
        >>> conv = gradwire.nn.Conv2d(1, 32, 3, padding=1)
        >>> conv(gradwire.randn(64, 1, 28, 28)).shape
        gradwire.Size([64, 32, 28, 28])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if not isinstance(groups, int) or groups <= 0:
            raise ValueError(f"groups must be a positive integer, got {groups!r}")
        if in_channels % groups:
            raise ValueError(f"in_channels must be divisible by groups ({in_channels} % {groups})")
        if out_channels % groups:
            raise ValueError(
                f"out_channels must be divisible by groups ({out_channels} % {groups})"
            )
        if padding_mode not in _PADDING_MODES:
            raise ValueError(
                f"padding_mode must be one of {list(_PADDING_MODES)}, but got "
                f"padding_mode='{padding_mode}'"
            )
        if padding_mode != "zeros":
            raise NotImplementedError(
                f"Conv2d: padding_mode='{padding_mode}' is not implemented in gradwire; use "
                "padding_mode='zeros', or pad the input yourself before the convolution"
            )
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = pair(kernel_size, "kernel_size", "Conv2d")
        self.stride = pair(stride, "stride", "Conv2d")
        self.dilation = pair(dilation, "dilation", "Conv2d")
        if isinstance(padding, str):
            _padding(padding, self.kernel_size, self.stride, self.dilation)  # validates
            self.padding: Any = padding
        else:
            self.padding = pair(padding, "padding", "Conv2d")
        self.padding_mode = padding_mode
        self.transposed, self.output_padding = False, (0, 0)
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        self.weight = Parameter(empty(*shape, dtype=dtype, device=device))
        if bias:
            self.bias = Parameter(empty(out_channels, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the weight and bias again with PyTorch's default initialisation."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight.shape[1] * self.kernel_size[0] * self.kernel_size[1]
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor) -> Tensor:
        return conv2d(
            input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups
        )

    def extra_repr(self) -> str:
        s = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}"
        )
        if self.padding != (0, 0):
            s += f", padding={self.padding!r}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s
