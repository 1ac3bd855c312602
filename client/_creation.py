"""Tensor factories: tensor, zeros, ones, full, empty, rand, randn, arange, eye, linspace, the
``*_like`` forms, stack and cat, and the global random generator (``manual_seed``)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ._backend import CPU, Device, device_of, device_scope, module_for, to_device
from ._dtypes import get_default_dtype, to_numpy_dtype
from ._ops import movement as M
from ._tensor import Tensor
from .autograd._profiling import traced
from .autograd.grad_mode import _state

__all__ = [
    "tensor",
    "as_tensor",
    "zeros",
    "ones",
    "full",
    "empty",
    "rand",
    "randn",
    "randint",
    "arange",
    "eye",
    "linspace",
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
    "rand_like",
    "randn_like",
    "manual_seed",
    "Generator",
    "seed",
    "stack",
    "cat",
    "concat",
    "where",
]

_rng = np.random.default_rng()


def manual_seed(seed: int) -> Any:
    """Seed the generator used by rand/randn/randint (and by CuPy when present)."""
    global _rng
    _rng = np.random.default_rng(int(seed))
    from ._backend import cupy_or_none

    cp = cupy_or_none()
    if cp is not None:
        cp.random.seed(int(seed))
    return _rng


class Generator:
    """A random number generator of its own (PyTorch's ``torch.Generator``), for the
    ``generator=`` argument of rand, randn and randint; the global one is left alone.

    Example:
        >>> g = gw.Generator().manual_seed(0)
        >>> gw.rand(2, generator=g)
    """

    def __init__(self, device: Any = "cpu") -> None:
        self.device = device
        self._seed = int(np.random.SeedSequence().entropy % (2**63))  # type: ignore[operator]
        self._rng = np.random.default_rng(self._seed)

    def manual_seed(self, seed: int) -> Generator:
        """Reseed this generator; returns it."""
        self._seed = int(seed)
        self._rng = np.random.default_rng(self._seed)
        return self

    def seed(self) -> int:
        """Reseed from OS entropy; returns the new seed."""
        self.manual_seed(int(np.random.SeedSequence().entropy % (2**63)))  # type: ignore[operator]
        return self._seed

    def initial_seed(self) -> int:
        """The seed this generator was last seeded with."""
        return self._seed


def _generator_rng(generator: Generator | None) -> Any:
    return _rng if generator is None else generator._rng


def seed() -> int:
    """Reseed from OS entropy; return the new seed."""
    s = int(np.random.SeedSequence().entropy % (2**63))  # type: ignore[operator]
    manual_seed(s)
    return s


def _infer_dtype(data: Any) -> Any:
    """PyTorch's inference: Python floats -> default dtype, ints -> int64, bools -> bool."""
    arr = np.asarray(data)
    kind = arr.dtype.kind
    if kind == "f" and not isinstance(data, np.ndarray):
        return get_default_dtype().np
    if kind == "c" and not isinstance(data, np.ndarray):
        return np.complex64 if get_default_dtype().np == np.float32 else np.complex128
    if kind in "iu" and not isinstance(data, np.ndarray):
        return np.int64
    return arr.dtype


def _array_from(data: Any, dtype: Any, device: Any) -> Any:
    dev = Device(device) if device is not None else None
    if isinstance(data, Tensor):
        arr = data._data
    elif (
        isinstance(data, (list, tuple)) and data and any(isinstance(x, Tensor) for x in _flat(data))
    ):
        arr = np.asarray([x.item() if isinstance(x, Tensor) else x for x in _flat(data)]).reshape(
            np.shape(_as_nested(data))
        )
    else:
        arr = data
    np_dt = to_numpy_dtype(dtype) if dtype is not None else None
    src_dev = (
        device_of(arr) if not isinstance(arr, (list, tuple, int, float, complex, bool)) else CPU
    )
    target = dev or src_dev
    if src_dev.type == "cpu":
        if np_dt is None:
            np_dt = _infer_dtype(arr)
        out = np.array(arr, dtype=np_dt, copy=True)
        from ._dtypes import from_numpy_dtype

        from_numpy_dtype(out.dtype)
        return to_device(out, target)
    xp = module_for(src_dev)
    out = xp.array(arr, dtype=np_dt, copy=True)
    return to_device(out, target)


def _flat(data: Any) -> list[Any]:
    out: list[Any] = []
    for x in data:
        if isinstance(x, (list, tuple)):
            out.extend(_flat(x))
        else:
            out.append(x)
    return out


def _as_nested(data: Any) -> Any:
    if isinstance(data, (list, tuple)):
        return [_as_nested(x) for x in data]
    return 0


@traced("aten::tensor")
def tensor(data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A new tensor that copies ``data`` (nested lists, numbers, arrays or a Tensor).

    Args:
        data: the values.
        dtype: element type; inferred as PyTorch does (floats -> default dtype, ints -> int64).
        device: "cpu" (default) or "cuda:N".
        requires_grad: record ops on the new leaf for autograd.

    Returns:
        A leaf Tensor.

    Raises:
        TypeError / ValueError: for data that cannot form a rectangular array of a supported dtype.

    Example:
        >>> gradwire.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    """
    t = Tensor._wrap(_array_from(data, dtype, device))
    t._inference = _state.inference
    if requires_grad:
        t.requires_grad_(True)
    return t


def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """Like ``tensor`` but shares memory with a Tensor or ndarray when no conversion is needed."""
    if isinstance(data, Tensor) and dtype is None and device is None:
        return data
    if (
        isinstance(data, np.ndarray)
        and (dtype is None or to_numpy_dtype(dtype) == data.dtype)
        and (device is None or Device(device).type == "cpu")
    ):
        return Tensor._wrap(data)
    return tensor(data, dtype=dtype, device=device)


def _factory(
    shape: Sequence[Any], dtype: Any, device: Any, requires_grad: bool, make: Any, random: str = ""
) -> Tensor:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    shp = tuple(int(s) for s in shape)
    if any(s < 0 for s in shp):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {list(shp)}")
    dev = Device(device) if device is not None else CPU
    np_dt = to_numpy_dtype(dtype) if dtype is not None else get_default_dtype().np
    if random and np.dtype(np_dt).kind not in "fc":
        raise RuntimeError(
            f"{random}(): expected a floating point or complex dtype, got {np.dtype(np_dt)}"
        )
    with device_scope(dev):  # CuPy creates arrays on its current device: make it `dev`
        arr = make(module_for(dev), shp, np_dt, dev)
    t = Tensor._wrap(arr)
    t._inference = _state.inference
    if requires_grad:
        t.requires_grad_(True)
    return t


def _on(dev: Device, arr: Any) -> Any:
    return to_device(arr, dev)


@traced("aten::zeros")
def zeros(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros of the given shape."""
    return _factory(size, dtype, device, requires_grad, lambda xp, s, d, dev: xp.zeros(s, dtype=d))


@traced("aten::ones")
def ones(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor of ones of the given shape."""
    return _factory(size, dtype, device, requires_grad, lambda xp, s, d, dev: xp.ones(s, dtype=d))


@traced("aten::empty")
def empty(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """An uninitialized tensor of the given shape."""
    return _factory(size, dtype, device, requires_grad, lambda xp, s, d, dev: xp.empty(s, dtype=d))


@traced("aten::full")
def full(
    size: Sequence[int],
    fill_value: Any,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    """A tensor of the given shape filled with ``fill_value`` (dtype inferred from it)."""
    if dtype is None:
        dtype = _infer_dtype(fill_value)
    return _factory(
        (tuple(size),),
        dtype,
        device,
        requires_grad,
        lambda xp, s, d, dev: xp.full(s, fill_value, dtype=d),
    )


@traced("aten::rand")
def rand(
    *size: Any,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    generator: Generator | None = None,
) -> Tensor:
    """Uniform samples in [0, 1) (from ``generator`` if given, else the global generator)."""
    rng = _generator_rng(generator)
    return _factory(
        size,
        dtype,
        device,
        requires_grad,
        lambda xp, s, d, dev: _on(dev, np.asarray(rng.random(s)).astype(d)),
        "rand",
    )


@traced("aten::randn")
def randn(
    *size: Any,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    generator: Generator | None = None,
) -> Tensor:
    """Standard normal samples (complex dtypes: real and imaginary parts each of variance 1/2),
    from ``generator`` if given, else the global generator."""
    rng = _generator_rng(generator)

    def make(xp: Any, s: Any, d: Any, dev: Device) -> Any:
        if np.dtype(d).kind == "c":
            return _on(
                dev,
                ((rng.standard_normal(s) + 1j * rng.standard_normal(s)) / np.sqrt(2)).astype(d),
            )
        return _on(dev, rng.standard_normal(s).astype(d))

    return _factory(size, dtype, device, requires_grad, make, "randn")


@traced("aten::randint")
def randint(
    low: int,
    high: int | None = None,
    size: Sequence[int] = (),
    dtype: Any = None,
    device: Any = None,
    generator: Generator | None = None,
) -> Tensor:
    """Random integers in [low, high) (from ``generator`` if given)."""
    if high is None:
        low, high = 0, low
    rng = _generator_rng(generator)
    return _factory(
        (tuple(size),),
        dtype or np.int64,
        device,
        False,
        lambda xp, s, d, dev: _on(dev, rng.integers(low, high, s).astype(d)),
    )


@traced("aten::arange")
def arange(
    start: Any,
    end: Any = None,
    step: Any = 1,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    """Values from ``start`` to ``end`` (exclusive) by ``step``."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if dtype is None:
        dtype = (
            np.int64
            if all(isinstance(v, int) for v in (start, end, step))
            else get_default_dtype().np
        )
    arr = np.arange(start, end, step).astype(to_numpy_dtype(dtype))
    t = tensor(arr, device=device)
    if requires_grad:
        t.requires_grad_(True)
    return t


@traced("aten::linspace")
def linspace(
    start: float,
    end: float,
    steps: int,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end`` inclusive."""
    if steps < 0:
        raise RuntimeError("linspace(): number of steps must be non-negative")
    arr = np.linspace(start, end, steps).astype(
        to_numpy_dtype(dtype) if dtype is not None else get_default_dtype().np
    )
    t = tensor(arr, device=device)
    if requires_grad:
        t.requires_grad_(True)
    return t


@traced("aten::eye")
def eye(
    n: int, m: int | None = None, dtype: Any = None, device: Any = None, requires_grad: bool = False
) -> Tensor:
    """The identity matrix (n x m)."""
    return _factory(
        ((n, n if m is None else m),),
        dtype,
        device,
        requires_grad,
        lambda xp, s, d, dev: xp.eye(s[0], s[1], dtype=d),
    )


def _like(fn: Any) -> Any:
    def like(
        t: Tensor, *args: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
    ) -> Tensor:
        return (
            fn(
                *args,
                t.shape,
                dtype=dtype or t.dtype,
                device=device or t.device,
                requires_grad=requires_grad,
            )
            if args
            else fn(
                t.shape,
                dtype=dtype or t.dtype,
                device=device or t.device,
                requires_grad=requires_grad,
            )
        )

    return like


zeros_like = _like(zeros)
ones_like = _like(ones)
empty_like = _like(empty)
rand_like = _like(rand)
randn_like = _like(randn)


@traced("aten::full_like")
def full_like(
    t: Tensor, fill_value: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
) -> Tensor:
    """A tensor shaped like ``t`` filled with ``fill_value``."""
    return full(
        t.shape,
        fill_value,
        dtype=dtype or t.dtype,
        device=device or t.device,
        requires_grad=requires_grad,
    )


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Join tensors of equal shape along a new dimension."""
    return M.Stack.apply(*_tensors(tensors, "stack"), dim=dim)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Join tensors along an existing dimension."""
    return M.Cat.apply(*_tensors(tensors, "cat"), dim=dim)


concat = cat


def _tensors(tensors: Sequence[Any], what: str) -> list[Tensor]:
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(
            f"{what}(): argument 'tensors' must be a sequence of Tensors, not {type(tensors).__name__}"
        )
    for i, x in enumerate(tensors):
        if not isinstance(x, Tensor):
            raise TypeError(
                f"{what}(): expected Tensor as element {i} in argument 0, but got {type(x).__name__}"
            )
    return list(tensors)


def where(condition: Tensor, input: Any = None, other: Any = None) -> Any:
    """Elementwise choice: ``input`` where ``condition`` is true, else ``other``."""
    from ._tensor_methods import where as _where

    if input is None and other is None:
        return tuple(Tensor._wrap(a) for a in np.nonzero(condition._data))
    return _where(condition, input, other)
