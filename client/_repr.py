"""A repr like PyTorch's: ``tensor([1., 2.], requires_grad=True)``."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["tensor_repr"]


def tensor_repr(t: Any) -> str:
    if t.is_sparse:
        return _sparse_repr(t)
    arr = t._to_host()
    kind = arr.dtype.kind
    opts: dict[str, Any] = {
        "separator": ", ",
        "prefix": "tensor(",
        "threshold": 1000,
        "edgeitems": 3,
    }
    if kind == "f":
        opts["formatter"] = {"float_kind": _float_formatter(arr)}
    body = np.array2string(arr, **opts) if arr.ndim else _scalar(arr)
    extras = []
    if t.device.type != "cpu":
        extras.append(f"device='{t.device}'")
    from ._dtypes import get_default_dtype

    default = get_default_dtype().np
    if arr.size == 0:
        # As PyTorch: nothing to infer the dtype from, so only the default float is implied.
        body = "[]"
        if arr.ndim != 1:
            extras.append(f"size={tuple(arr.shape)}")
        implied = arr.dtype == default
    else:
        implied = (
            arr.dtype == default
            or arr.dtype == np.int64
            or kind == "b"
            or arr.dtype == (np.complex128 if default == np.float64 else np.complex64)
        )
    if not implied:
        extras.append(f"dtype=gradwire.{t.dtype.name}")
    if t.grad_fn is not None:
        extras.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        extras.append("requires_grad=True")
    return "tensor(" + body + "".join(", " + e for e in extras) + ")"


def _sparse_repr(t: Any) -> str:
    """PyTorch's form: ``tensor(indices=..., values=..., size=..., nnz=..., layout=...)``."""
    coo = t._data
    pad = "\n" + " " * len("tensor(")

    def part(name: str, arr: Any) -> str:
        return (
            name + "=" + tensor_repr(type(t)._wrap(arr)).replace("\n", pad + " " * (len(name) + 1))
        )

    extras = [f"size={coo.shape}", f"nnz={coo.nnz}", "layout=gradwire.sparse_coo"]
    if t.device.type != "cpu":
        extras.append(f"device='{t.device}'")
    if t.grad_fn is not None:
        extras.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        extras.append("requires_grad=True")
    body = [part("indices", coo.indices), part("values", coo.values), ", ".join(extras)]
    return "tensor(" + ("," + pad).join(body) + ")"


def _scalar(arr: Any) -> str:
    v = arr.item()
    if arr.dtype.kind == "f":
        return _fmt_float(v)
    if arr.dtype.kind == "b":
        return str(bool(v))
    return str(v)


def _fmt_float(v: float) -> str:
    if not np.isfinite(v):
        return str(v)  # nan, inf, -inf, as PyTorch prints them
    if v == int(v) and abs(v) < 1e8:
        return f"{int(v)}."
    return f"{v:.4f}"


def _float_formatter(arr: Any) -> Any:
    fmt = _float_style(arr)
    # PyTorch pads every element to the widest one: tensor([-1.,  2.]).
    flat = arr.reshape(-1)
    shown = flat if flat.size <= 1000 else np.concatenate([flat[:3], flat[-3:]])
    width = max((len(fmt(v)) for v in shown), default=0)
    return lambda v: fmt(v).rjust(width)


def _float_style(arr: Any) -> Any:
    finite = arr[np.isfinite(arr)] if arr.size else arr
    ints = finite.size and np.all(finite == np.round(finite)) and np.all(np.abs(finite) < 1e8)
    if ints:
        return lambda v: f"{v:.0f}." if np.isfinite(v) else str(v)
    nonzero = np.abs(finite[finite != 0])
    big = finite.size and (
        np.max(np.abs(finite)) >= 1e8 or (nonzero.size and np.min(nonzero) < 1e-4)
    )
    if big:
        return lambda v: f"{v:.4e}" if np.isfinite(v) else str(v)
    return lambda v: f"{v:.4f}" if np.isfinite(v) else str(v)
