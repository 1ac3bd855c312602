"""2-D max and average pooling as autograd ops.

Both walk the ``kh * kw`` kernel offsets, each a strided slice of the padded input as large as
the output, so the work is a handful of vectorised array ops with no loop over pixels or batch.
Every gradient is an op whose backward is the forward's gather or sum again (second
derivatives work): max pooling's backward scatters to the saved arg-max offsets, and average
pooling's backward spreads each output gradient evenly over its window.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._backend import array_module
from ._base import Op

__all__ = ["PoolGeometry", "MaxPool2d", "MaxPool2dBackward", "AvgPool2d", "AvgPool2dBackward"]


class PoolGeometry(NamedTuple):
    """Kernel, stride, padding and dilation (each (h, w)) and the output size of a pooling."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    out: tuple[int, int]


def _padded_size(size: int, axis: int, geo: PoolGeometry) -> int:
    # Ceil mode may let the last window run past the right padding: make room for it.
    reach = (geo.out[axis] - 1) * geo.stride[axis] + geo.dilation[axis] * (geo.kernel[axis] - 1)
    return max(size + 2 * geo.padding[axis], reach + 1)


def _windows(shape: tuple[int, ...], geo: PoolGeometry) -> list[tuple[slice, slice]]:
    """For each kernel offset, the (row, column) slices of the padded input it reads."""
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = geo.kernel, geo.stride, geo.dilation, geo.out
    return [
        (
            slice(i * dh, i * dh + (ho - 1) * sh + 1, sh),
            slice(j * dw, j * dw + (wo - 1) * sw + 1, sw),
        )
        for i in range(kh)
        for j in range(kw)
    ]


def _pad(x: Any, geo: PoolGeometry, fill: Any) -> Any:
    xp = array_module(x)
    n, c, h, w = x.shape
    ph, pw = geo.padding
    hp, wp = _padded_size(h, 0, geo), _padded_size(w, 1, geo)
    if (hp, wp) == (h, w):
        return x
    out = xp.full((n, c, hp, wp), fill, dtype=x.dtype)
    out[:, :, ph : ph + h, pw : pw + w] = x
    return out


def _scatter(g: Any, x_shape: tuple[int, ...], geo: PoolGeometry, pick: Any) -> Any:
    """Add ``pick(k, g)`` into the window slice of every kernel offset ``k``; crop the padding."""
    xp = array_module(g)
    n, c, h, w = x_shape
    ph, pw = geo.padding
    acc = xp.zeros((n, c, _padded_size(h, 0, geo), _padded_size(w, 1, geo)), dtype=g.dtype)
    disjoint = all(geo.stride[a] >= geo.dilation[a] * (geo.kernel[a] - 1) + 1 for a in (0, 1))
    for k, (rows, cols) in enumerate(_windows(x_shape, geo)):
        if disjoint:  # each input pixel is in at most one window: no need to read acc
            acc[:, :, rows, cols] = pick(k, g)
        else:
            acc[:, :, rows, cols] += pick(k, g)
    return xp.ascontiguousarray(acc[:, :, ph : ph + h, pw : pw + w])


def _lowest(dtype: Any) -> Any:
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _first_max(cands: list[Any], want_arg: bool) -> tuple[Any, Any]:
    """Elementwise max of equally shaped arrays and the index of the first one holding it."""
    xp = array_module(cands[0])
    if len(cands) == 1:
        return cands[0], (xp.zeros(cands[0].shape, dtype=np.int8) if want_arg else None)
    best = xp.maximum(cands[0], cands[1])  # propagates NaN, as PyTorch does
    for cand in cands[2:]:
        xp.maximum(best, cand, out=best)
    if not want_arg:
        return best, None
    if len(cands) == 2:
        return best, (cands[1] > cands[0]).view(np.int8)
    arg = xp.empty(best.shape, dtype=np.int8 if len(cands) < 128 else np.int32)
    for k in range(len(cands) - 1, -1, -1):  # backwards, so that the first maximum wins
        xp.copyto(arg, arg.dtype.type(k), where=cands[k] == best)
    return best, arg


def _separable_max(data: Any, geo: PoolGeometry, want_arg: bool) -> tuple[Any, Any]:
    """Window maxima of a padded array and, if asked, each one's kernel offset ``i * kw + j``.

    The max over a window is the max over its rows of the max over its columns: ``kh + kw``
    passes instead of ``kh * kw``, the second pass reading whole rows. The first maximum in
    row-major order is the first column of the first row holding the maximum, as in PyTorch.
    """
    xp = array_module(data)
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = geo.kernel, geo.stride, geo.dilation, geo.out
    col_sl = [slice(j * dw, j * dw + (wo - 1) * sw + 1, sw) for j in range(kw)]
    row_sl = [slice(i * dh, i * dh + (ho - 1) * sh + 1, sh) for i in range(kh)]
    col_best, col_arg = _first_max([data[:, :, :, c] for c in col_sl], want_arg)
    best, row_arg = _first_max([col_best[:, :, r] for r in row_sl], want_arg)
    if not want_arg:
        return best, None
    if best.dtype.kind == "f" and bool(xp.isnan(best).any()):
        # PyTorch keeps the last NaN of a window in row-major order: walk every offset.
        arg = xp.zeros(best.shape, dtype=np.int32)
        for k, (rows, cols) in enumerate(_windows(data.shape, geo)):
            xp.copyto(arg, arg.dtype.type(k), where=xp.isnan(data[:, :, rows, cols]))
        return best, arg
    dt = np.dtype(np.int8 if kh * kw < 128 else np.int32)
    arg = row_arg.astype(dt) * dt.type(kw)
    for i, r in enumerate(row_sl):
        arg += xp.where(row_arg == i, col_arg[:, :, r], 0).astype(dt, copy=False)
    return best, arg


class MaxPool2d(Op):
    """Max pooling of ``(N, C, H, W)``; returns ``(values, indices)`` if asked for indices."""

    def forward(self, x: Any, geo: PoolGeometry, return_indices: bool = False) -> Any:
        data = _pad(x._data, geo, _lowest(x._data.dtype))
        best, arg = _separable_max(data, geo, self._recording or return_indices)
        if arg is None:
            return best
        if self._recording:
            self.save("geometry", geo)
            self.save("self_sym_sizes", x._data.shape)
            self.save("offsets", arg)
        if not return_indices:
            return best
        return best, _flat_indices(arg, x._data.shape, geo)

    def backward(self, g: Any, _gi: Any = None) -> Any:
        return MaxPool2dBackward.apply(
            g,
            offsets=self.saved("offsets"),
            x_shape=self.saved("self_sym_sizes"),
            geo=self.saved("geometry"),
        )

    def name(self) -> str:
        return "MaxPool2DWithIndicesBackward0"


def _flat_indices(arg: Any, x_shape: tuple[int, ...], geo: PoolGeometry) -> Any:
    """PyTorch's indices: ``row * W + col`` of each maximum in the unpadded input plane."""
    xp = array_module(arg)
    (_, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo) = (
        geo.kernel,
        geo.stride,
        geo.padding,
        geo.dilation,
        geo.out,
    )
    a = arg.astype(np.int64)
    rows = xp.arange(ho, dtype=np.int64)[:, None] * sh - ph + (a // kw) * dh
    cols = xp.arange(wo, dtype=np.int64)[None, :] * sw - pw + (a % kw) * dw
    return rows * x_shape[3] + cols


class MaxPool2dBackward(Op):
    """Max pooling's input gradient: ``g`` scattered to each window's arg-max."""

    def forward(self, g: Any, offsets: Any, x_shape: tuple[int, ...], geo: PoolGeometry) -> Any:
        xp = array_module(g._data)
        self.save("offsets", offsets)
        self.save("geometry", geo)
        zero = g._data.dtype.type(0)
        return _scatter(g._data, x_shape, geo, lambda k, a: xp.where(offsets == k, a, zero))

    def backward(self, h: Any) -> Any:
        return _MaxPool2dGather.apply(h, offsets=self.saved("offsets"), geo=self.saved("geometry"))

    def name(self) -> str:
        return "MaxPool2DWithIndicesBackwardBackward0"


class _MaxPool2dGather(Op):
    """Read each window's saved arg-max (max pooling with the choice of maxima fixed)."""

    def forward(self, h: Any, offsets: Any, geo: PoolGeometry) -> Any:
        xp = array_module(h._data)
        data = _pad(h._data, geo, 0)
        out = xp.zeros(offsets.shape, dtype=h._data.dtype)
        for k, (rows, cols) in enumerate(_windows(h._data.shape, geo)):
            xp.copyto(out, data[:, :, rows, cols], where=offsets == k)
        self.save("offsets", offsets)
        self.save("geometry", geo)
        self.save("self_sym_sizes", h._data.shape)
        return out

    def backward(self, g: Any) -> Any:
        return MaxPool2dBackward.apply(
            g,
            offsets=self.saved("offsets"),
            x_shape=self.saved("self_sym_sizes"),
            geo=self.saved("geometry"),
        )


def _divisor(x_shape: tuple[int, ...], geo: PoolGeometry, include_pad: bool, xp: Any) -> Any:
    """Per output position, how many elements its average divides by (PyTorch's rule)."""
    sizes = []
    for axis in (0, 1):
        size, k, s, p = x_shape[2 + axis], geo.kernel[axis], geo.stride[axis], geo.padding[axis]
        start = np.arange(geo.out[axis]) * s - p
        end = np.minimum(start + k, size + p)
        if include_pad:
            sizes.append(end - start)
        else:
            sizes.append(np.minimum(end, size) - np.maximum(start, 0))
    return xp.asarray(np.outer(sizes[0], sizes[1]))


class AvgPool2d(Op):
    """Average pooling of ``(N, C, H, W)`` (zero padding, PyTorch's divisor rules)."""

    def forward(
        self, x: Any, geo: PoolGeometry, count_include_pad: bool, divisor: int | None
    ) -> Any:
        xp = array_module(x._data)
        data = _pad(x._data, geo, 0)
        (first_rows, first_cols), *rest = _windows(x._data.shape, geo)
        total = data[:, :, first_rows, first_cols].copy()
        for rows, cols in rest:
            total += data[:, :, rows, cols]
        div = divisor or _divisor(x._data.shape, geo, count_include_pad, xp)
        if self._recording:
            self.save("geometry", geo)
            self.save("self_sym_sizes", x._data.shape)
            self.save("count_include_pad", count_include_pad)
            self.save("divisor_override", divisor)
        return (total / div).astype(x._data.dtype, copy=False)

    def backward(self, g: Any) -> Any:
        return AvgPool2dBackward.apply(
            g,
            x_shape=self.saved("self_sym_sizes"),
            geo=self.saved("geometry"),
            count_include_pad=self.saved("count_include_pad"),
            divisor=self.saved("divisor_override"),
        )

    def name(self) -> str:
        return "AvgPool2DBackward0"


class AvgPool2dBackward(Op):
    """Average pooling's input gradient: each output gradient spread over its window."""

    def forward(
        self,
        g: Any,
        x_shape: tuple[int, ...],
        geo: PoolGeometry,
        count_include_pad: bool,
        divisor: int | None,
    ) -> Any:
        xp = array_module(g._data)
        self.save("geometry", geo)
        self.save("count_include_pad", count_include_pad)
        self.save("divisor_override", divisor)
        div = divisor or _divisor(x_shape, geo, count_include_pad, xp)
        share = (g._data / div).astype(g._data.dtype, copy=False)
        return _scatter(share, x_shape, geo, lambda k, a: a)

    def backward(self, h: Any) -> Any:
        return AvgPool2d.apply(
            h,
            geo=self.saved("geometry"),
            count_include_pad=self.saved("count_include_pad"),
            divisor=self.saved("divisor_override"),
        )

    def name(self) -> str:
        return "AvgPool2DBackwardBackward0"
