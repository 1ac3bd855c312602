"""2-D convolution as three autograd ops: the convolution and its two gradients.

The forward unrolls the input into columns through a strided view (im2col) and does one BLAS
matmul; the input gradient is one matmul and ``kh * kw`` vectorised adds (col2im); the weight
gradient is one matmul. Each gradient is itself an op whose backward is expressed with the
other two, so ``create_graph=True`` gives exact second derivatives.

Arrays are laid out channel-first, ``(C, kh, kw, N, Ho, Wo)``, so that the columns of all
images form one ``(C * kh * kw, N * Ho * Wo)`` matrix and the convolution is a single large
GEMM (NumPy's stacked matmul over the batch is several times slower).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._backend import array_module
from ..errors import ArgumentError
from ._base import Op

__all__ = ["ConvGeometry", "Conv2d", "Conv2dInputGrad", "Conv2dWeightGrad", "as_strided"]


class ConvGeometry(NamedTuple):
    """Stride, padding (top, bottom, left, right), dilation and groups of a convolution."""

    stride: tuple[int, int]
    padding: tuple[int, int, int, int]
    dilation: tuple[int, int]
    groups: int


def as_strided(xp: Any, a: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    """A read-only strided view of ``a`` on NumPy or CuPy."""
    if xp is np:
        return np.lib.stride_tricks.as_strided(a, shape, strides, writeable=False)
    return xp.lib.stride_tricks.as_strided(a, shape, strides)


# OpenBLAS runs a GEMM of at most this many multiply-adds (M * N * K) on one thread.
_SMALL_GEMM = 4 * 65536


def _out_size(size: int, k: int, s: int, lo: int, hi: int, d: int) -> int:
    return (size + lo + hi - d * (k - 1) - 1) // s + 1


def _im2col(x: Any, kh: int, kw: int, geo: ConvGeometry) -> Any:
    """Columns ``(C, kh, kw, N, Ho, Wo)`` (contiguous) of an ``(N, C, H, W)`` array."""
    xp = array_module(x)
    n, c, h, w = x.shape
    pt, pb, pl, pr = geo.padding
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    ho, wo = _out_size(h, kh, sh, pt, pb, dh), _out_size(w, kw, sw, pl, pr, dw)
    src = x.transpose(1, 0, 2, 3)
    if pt or pb or pl or pr:
        padded = xp.zeros((c, n, h + pt + pb, w + pl + pr), dtype=x.dtype)
        padded[:, :, pt : pt + h, pl : pl + w] = src
        src = padded
    s0, s1, s2, s3 = src.strides
    view = as_strided(xp, src, (c, kh, kw, n, ho, wo), (s0, s2 * dh, s3 * dw, s1, s2 * sh, s3 * sw))
    return xp.ascontiguousarray(view)


def _col2im(cols: Any, x_shape: tuple[int, ...], geo: ConvGeometry) -> Any:
    """The adjoint of :func:`_im2col`: add each column entry back to its input pixel."""
    xp = array_module(cols)
    c, kh, kw, n, ho, wo = cols.shape
    _, _, h, w = x_shape
    pt, pb, pl, pr = geo.padding
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    acc = xp.zeros((c, n, h + pt + pb, w + pl + pr), dtype=cols.dtype)
    for i in range(kh):
        r0 = i * dh
        for j in range(kw):
            c0 = j * dw
            acc[:, :, r0 : r0 + (ho - 1) * sh + 1 : sh, c0 : c0 + (wo - 1) * sw + 1 : sw] += cols[
                :, i, j
            ]
    return xp.ascontiguousarray(acc[:, :, pt : pt + h, pl : pl + w].transpose(1, 0, 2, 3))


def _grouped(a: Any, groups: int) -> Any:
    """A ``(rows, cols)`` matrix split into ``(groups, rows / groups, cols)``."""
    return a.reshape(groups, a.shape[0] // groups, -1)


def _matmul(a: Any, b: Any) -> Any:
    xp = array_module(a)
    if a.shape[0] == 1:  # one group: a plain 2-D GEMM, the fastest BLAS path
        return xp.matmul(a[0], b[0])[None]
    return xp.matmul(a, b)


def _cols_matrix(cols: Any) -> Any:
    c, kh, kw = cols.shape[:3]
    return cols.reshape(c * kh * kw, -1)


def _out_grad_matrix(g: Any, groups: int) -> Any:
    """``(N, O, Ho, Wo)`` output gradient as ``(groups, O / groups, N * Ho * Wo)``."""
    return _grouped(array_module(g).ascontiguousarray(g.transpose(1, 0, 2, 3)), groups)


def conv2d_forward(x: Any, w: Any, b: Any, geo: ConvGeometry, cols: Any = None) -> Any:
    """``(out, cols)`` for arrays ``x`` (N, C, H, W), ``w`` (O, C / groups, kh, kw), ``b``."""
    xp = array_module(x)
    n = x.shape[0]
    o, _, kh, kw = w.shape
    if cols is None:
        cols = _im2col(x, kh, kw, geo)
    ho, wo = cols.shape[4], cols.shape[5]
    out = _matmul(_grouped(w.reshape(o, -1), geo.groups), _grouped(_cols_matrix(cols), geo.groups))
    out = out.reshape(o, n * ho * wo)
    if b is not None:
        out += b[:, None]
    return xp.ascontiguousarray(out.reshape(o, n, ho, wo).transpose(1, 0, 2, 3)), cols


def conv2d_input_grad(g: Any, w: Any, x_shape: tuple[int, ...], geo: ConvGeometry) -> Any:
    """The gradient of a convolution's input, given its output gradient ``g``."""
    n, o, ho, wo = g.shape
    _, cg, kh, kw = w.shape
    wt = _grouped(w.reshape(o, -1), geo.groups).transpose(0, 2, 1)
    gcols = _matmul(wt, _out_grad_matrix(g, geo.groups))
    return _col2im(gcols.reshape(cg * geo.groups, kh, kw, n, ho, wo), x_shape, geo)


def conv2d_weight_grad(
    x: Any, g: Any, w_shape: tuple[int, ...], geo: ConvGeometry, cols: Any = None
) -> Any:
    """The gradient of a convolution's weight, from its input (or columns) and ``g``."""
    xp = array_module(g)
    _, _, kh, kw = w_shape
    if cols is None:
        cols = _im2col(x, kh, kw, geo)
    n, o, ho, wo = g.shape
    groups, k = geo.groups, cols.shape[0] * kh * kw // geo.groups
    if (o // groups) * k * ho * wo > _SMALL_GEMM:
        gcols = _grouped(_cols_matrix(cols), groups)
        return _matmul(_out_grad_matrix(g, groups), gcols.transpose(0, 2, 1)).reshape(w_shape)
    # A small weight (a first layer, say): one GEMM per image, summed. The single GEMM would
    # reduce over N * Ho * Wo with little work per block of it, and a multi-threaded BLAS
    # synchronises its threads once per block; GEMMs this small run on one thread.
    per_image = xp.ascontiguousarray(g).reshape(n, groups, o // groups, ho * wo)
    image_cols = cols.reshape(groups, k, n, ho * wo).transpose(2, 0, 3, 1)
    return xp.matmul(per_image, image_cols).sum(axis=0).reshape(w_shape)


def _check_dtypes(x: Any, w: Any, b: Any) -> None:
    if x.dtype != w.dtype or (b is not None and b.dtype != w.dtype):
        names = f"input {x.dtype}, weight {w.dtype}" + ("" if b is None else f", bias {b.dtype}")
        raise ArgumentError(
            f"conv2d: input, weight and bias must have the same dtype, got {names}; "
            "convert them with .to(dtype) first"
        )
    if x.dtype.kind != "f":
        raise ArgumentError(f"conv2d: expected a floating point input, got {x.dtype}")


class Conv2d(Op):
    """``conv2d(x, w, b)`` on ``(N, C, H, W)`` inputs; see ``gradwire.nn.functional.conv2d``."""

    def forward(self, x: Any, w: Any, b: Any, geo: ConvGeometry) -> Any:
        bias = None if b is None else b._data
        _check_dtypes(x._data, w._data, bias)
        out, cols = conv2d_forward(x._data, w._data, bias, geo)
        if self._recording:
            wants_weight = self.needs_input_grad[1]
            # Only the weight gradient reads the input; it reuses the forward's columns.
            self.save("input", x if wants_weight else None)
            self.save("input_sym_sizes", x._data.shape)
            self.save("weight", w)
            self.save("geometry", geo)
            self.save("has_bias", b is not None)
            self._cols = cols if wants_weight else None
        return out

    def backward(self, g: Any) -> Any:
        w, geo = self.saved("weight"), self.saved("geometry")
        needs = self.needs_input_grad
        gx = gw = None
        if needs[0]:
            gx = Conv2dInputGrad.apply(g, w, x_shape=self.saved("input_sym_sizes"), geo=geo)
        if needs[1]:
            x = self.saved("input")
            gw = Conv2dWeightGrad.apply(x, g, w_shape=w.shape, geo=geo, cols=self._cols)
        if not self.saved("has_bias"):
            return gx, gw
        gb = g.sum(dim=(0, 2, 3)) if needs[2] else None
        return gx, gw, gb

    def release_saved(self) -> None:
        super().release_saved()
        self._cols = None

    def name(self) -> str:
        return "ConvolutionBackward0"


class Conv2dInputGrad(Op):
    """The input gradient of :class:`Conv2d`: linear in the output gradient and the weight."""

    def forward(self, g: Any, w: Any, x_shape: tuple[int, ...], geo: ConvGeometry) -> Any:
        self.save("grad_output", g)
        self.save("weight", w)
        self.save("geometry", geo)
        return conv2d_input_grad(g._data, w._data, tuple(x_shape), geo)

    def backward(self, h: Any) -> Any:
        g, w, geo = self.saved("grad_output"), self.saved("weight"), self.saved("geometry")
        needs = self.needs_input_grad
        gg = Conv2d.apply(h, w, None, geo=geo) if needs[0] else None
        gw = Conv2dWeightGrad.apply(h, g, w_shape=w.shape, geo=geo) if needs[1] else None
        return gg, gw

    def name(self) -> str:
        return "ConvolutionBackwardBackward0"


class Conv2dWeightGrad(Op):
    """The weight gradient of :class:`Conv2d`: linear in the input and the output gradient."""

    def forward(
        self,
        x: Any,
        g: Any,
        w_shape: tuple[int, ...],
        geo: ConvGeometry,
        cols: Any = None,
    ) -> Any:
        self.save("input", x)
        self.save("grad_output", g)
        self.save("geometry", geo)
        return conv2d_weight_grad(x._data, g._data, tuple(w_shape), geo, cols)

    def backward(self, h: Any) -> Any:
        x, g, geo = self.saved("input"), self.saved("grad_output"), self.saved("geometry")
        needs = self.needs_input_grad
        gx = Conv2dInputGrad.apply(g, h, x_shape=x.shape, geo=geo) if needs[0] else None
        gg = Conv2d.apply(x, h, None, geo=geo) if needs[1] else None
        return gx, gg

    def name(self) -> str:
        return "ConvolutionBackwardBackward0"
