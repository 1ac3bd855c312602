"""2-D pooling: ``max_pool2d``, ``avg_pool2d``, ``adaptive_avg_pool2d`` and their layers."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._backend import array_module, on_input_device
from .._ops.pool import AvgPool2d as _AvgPoolOp
from .._ops.pool import MaxPool2d as _MaxPoolOp
from .._ops.pool import PoolGeometry
from .._tensor import Tensor
from ..errors import ArgumentError
from .conv import pair
from .modules import Module

__all__ = [
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "MaxPool2d",
    "AvgPool2d",
    "AdaptiveAvgPool2d",
]


def _out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    # A window must start inside the input or its left padding, even in ceil mode.
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _geometry(
    op: str,
    input: Tensor,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    ceil_mode: bool,
) -> PoolGeometry:
    if input.ndim not in (3, 4):
        raise ArgumentError(
            f"{op}: expected a 3D (C, H, W) or 4D (N, C, H, W) input, got shape "
            f"{tuple(input.shape)}"
        )
    k = pair(kernel_size, "kernel_size", op)
    s = k if stride is None or stride == [] or stride == () else pair(stride, "stride", op)
    p, d = pair(padding, "padding", op), pair(dilation, "dilation", op)
    if min(k) <= 0 or min(s) <= 0 or min(d) <= 0:
        raise ArgumentError(
            f"{op}: kernel_size, stride and dilation must be positive, got kernel_size={k}, "
            f"stride={s}, dilation={d}"
        )
    for axis in (0, 1):
        effective = d[axis] * (k[axis] - 1) + 1
        if p[axis] < 0 or 2 * p[axis] > effective:
            raise ArgumentError(
                f"{op}: pad should be at most half of effective kernel size, but got pad="
                f"{p[axis]}, kernel_size={k[axis]} and dilation={d[axis]}"
            )
    h, w = input.shape[-2:]
    out = tuple(_out_size(size, k[a], s[a], p[a], d[a], ceil_mode) for a, size in enumerate((h, w)))
    if min(out) < 1:
        c = input.shape[-3]
        raise ArgumentError(
            f"{op}: Given input size: ({c}x{h}x{w}). Calculated output size: "
            f"({c}x{out[0]}x{out[1]}). Output size is too small"
        )
    return PoolGeometry(k, s, p, d, (out[0], out[1]))


def _batched(input: Tensor) -> Tensor:
    return input if input.ndim == 4 else input.unsqueeze(0)


def _unbatch(out: Tensor, input: Tensor) -> Tensor:
    return out if input.ndim == 4 else out.squeeze(0)


@on_input_device
def max_pool2d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """The maximum of each window, as ``torch.nn.functional.max_pool2d``.

    Args:
        input: ``(N, C, H, W)`` or unbatched ``(C, H, W)``.
        kernel_size: window size, an int or ``(kH, kW)``.
        stride: step between windows (default: ``kernel_size``).
        padding: implicit ``-inf`` on each side, at most half the effective kernel.
        dilation: spacing between window elements.
        ceil_mode: round the output size up, so that a partial last window counts.
        return_indices: also return each maximum's flat index ``row * W + col`` in its plane.

    Returns:
        The pooled tensor, or ``(values, indices)`` with ``return_indices=True``.

    Raises:
        ArgumentError: a non-positive size, too much padding, or an empty output.

    Example:
        >>> F.max_pool2d(gradwire.randn(1, 1, 4, 4), 2).shape
        gradwire.Size([1, 1, 2, 2])
    """
    geo = _geometry("max_pool2d", input, kernel_size, stride, padding, dilation, ceil_mode)
    out = _MaxPoolOp.apply(_batched(input), geo=geo, return_indices=return_indices)
    if return_indices:
        # Indices are not differentiable: no grad_fn on them, as in PyTorch.
        return _unbatch(out[0], input), _unbatch(out[1].detach(), input)
    return _unbatch(out, input)


@on_input_device
def avg_pool2d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """The mean of each window, as ``torch.nn.functional.avg_pool2d``.

    Args:
        input: ``(N, C, H, W)`` or unbatched ``(C, H, W)``, floating point.
        kernel_size: window size, an int or ``(kH, kW)``.
        stride: step between windows (default: ``kernel_size``).
        padding: implicit zeros on each side, at most half the kernel.
        ceil_mode: round the output size up, so that a partial last window counts.
        count_include_pad: divide by the window size including padding (not the part of a
            ceil-mode window past the padding); otherwise by the number of input elements.
        divisor_override: divide every window sum by this instead.

    Returns:
        The pooled tensor.

    Raises:
        ArgumentError: a non-positive size, too much padding, an empty output, a zero divisor
            or an integer input.

    Example:
        >>> F.avg_pool2d(gradwire.ones(1, 1, 4, 4), 2)[0, 0, 0, 0].item()
        1.0
    """
    geo = _geometry("avg_pool2d", input, kernel_size, stride, padding, 1, ceil_mode)
    if divisor_override is not None and divisor_override == 0:
        raise ArgumentError("avg_pool2d: divisor must be not zero")
    if input._data.dtype.kind != "f":
        raise ArgumentError(f"avg_pool2d: expected a floating point input, got {input.dtype}")
    out: Tensor = _AvgPoolOp.apply(
        _batched(input),
        geo=geo,
        count_include_pad=bool(count_include_pad),
        divisor=divisor_override,
    )
    return _unbatch(out, input)


def _adaptive_matrix(size: int, out: int, like: Any) -> Tensor:
    """``(out, size)``: row ``i`` averages ``[floor(i*size/out), ceil((i+1)*size/out))``."""
    i = np.arange(out)
    start, end = (i * size) // out, -((-(i + 1) * size) // out)
    cols = np.arange(size)
    inside = (cols >= start[:, None]) & (cols < end[:, None])
    m = inside / (end - start)[:, None]
    return Tensor._wrap(array_module(like).asarray(m.astype(like.dtype)))


@on_input_device
def adaptive_avg_pool2d(input: Tensor, output_size: Any) -> Tensor:
    """Average pooling to a fixed output size, as ``torch.nn.functional.adaptive_avg_pool2d``.

    Output cell ``i`` along an axis of input size ``L`` and output size ``O`` averages the input
    range ``[floor(i*L/O), ceil((i+1)*L/O))``.

    Args:
        input: ``(N, C, H, W)`` or unbatched ``(C, H, W)``, floating point.
        output_size: an int, or ``(oH, oW)`` where ``None`` keeps that input size.

    Returns:
        ``(N, C, oH, oW)`` (or ``(C, oH, oW)``).

    Raises:
        ArgumentError: a wrong input rank, a non-positive output size or an empty input.

    Example:
        >>> F.adaptive_avg_pool2d(gradwire.randn(2, 8, 7, 7), 1).shape
        gradwire.Size([2, 8, 1, 1])
    """
    if input.ndim not in (3, 4):
        raise ArgumentError(
            "adaptive_avg_pool2d: expected a 3D (C, H, W) or 4D (N, C, H, W) input, got shape "
            f"{tuple(input.shape)}"
        )
    h, w = input.shape[-2:]
    if isinstance(output_size, (tuple, list)) and len(output_size) == 2:
        oh = h if output_size[0] is None else output_size[0]
        ow = w if output_size[1] is None else output_size[1]
    else:
        oh = ow = output_size
    oh, ow = pair((oh, ow), "output_size", "adaptive_avg_pool2d")
    if oh <= 0 or ow <= 0 or h == 0 or w == 0:
        raise ArgumentError(
            f"adaptive_avg_pool2d: output_size must be positive and the input non-empty, got "
            f"output_size={output_size!r} for input shape {tuple(input.shape)}"
        )
    if input._data.dtype.kind != "f":
        raise ArgumentError(
            f"adaptive_avg_pool2d: expected a floating point input, got {input.dtype}"
        )
    if (oh, ow) == (1, 1):
        return input.mean(dim=(-2, -1), keepdim=True)
    if h % oh == 0 and w % ow == 0:  # equal windows: a plain average pooling
        return avg_pool2d(input, (h // oh, w // ow))
    rows = _adaptive_matrix(h, oh, input._data)
    cols = _adaptive_matrix(w, ow, input._data)
    return rows @ (input @ cols.t())


class MaxPool2d(Module):
    """Max pooling layer; see :func:`max_pool2d` for the arguments.

    Example:
        >>> gradwire.nn.MaxPool2d(2)(gradwire.randn(8, 3, 28, 28)).shape
        gradwire.Size([8, 3, 14, 14])
    """

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, input: Tensor) -> Any:
        return max_pool2d(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.dilation,
            ceil_mode=self.ceil_mode,
            return_indices=self.return_indices,
        )

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )


class AvgPool2d(Module):
    """Average pooling layer; see :func:`avg_pool2d` for the arguments.

    Example:
        >>> gradwire.nn.AvgPool2d(2)(gradwire.randn(8, 3, 28, 28)).shape
        gradwire.Size([8, 3, 14, 14])
    """

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.ceil_mode = padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, input: Tensor) -> Tensor:
        return avg_pool2d(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """Adaptive average pooling layer; see :func:`adaptive_avg_pool2d`.

    Example:
        >>> gradwire.nn.AdaptiveAvgPool2d((5, None))(gradwire.randn(1, 64, 8, 9)).shape
        gradwire.Size([1, 64, 5, 9])
    """

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, input: Tensor) -> Tensor:
        return adaptive_avg_pool2d(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
