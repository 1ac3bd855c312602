"""fake_cupy: a TEST-ONLY stand-in for CuPy over NumPy memory. Never shipped, never a GPU.

gradwire imports CuPy in exactly one place (``gradwire._backend.cupy_or_none``). The tests
marked ``fake_cupy`` put this module there instead, so the device plumbing (devices, moves,
device maps, dist-autograd gradients, CUDA IPC through ``gradwire.multiprocessing`` queues)
runs without a GPU. It presents the subset of CuPy's interface gradwire uses:

- ``ndarray`` carrying a device id (``a.device.id``), ``get()``, ``data.ptr`` / ``data.mem``,
  the operators, and NumPy's methods; no implicit conversion to NumPy, no host arrays or
  arrays of another device mixed into one operation (as CuPy);
- ``cuda.Device`` (context manager, a per-thread current device), streams and events as
  no-ops, ``cuda.runtime`` IPC memory/event handles (shared-memory segments), ``Memory``,
  ``UnownedMemory``, ``MemoryPointer``;
- ``asarray`` / ``array`` / ``asnumpy`` / ``get_array_module`` and every NumPy function and
  ufunc, run on the host and wrapped onto the device of their inputs (or the current device).

What it cannot tell: kernel speed, real asynchrony (streams), peer access, memory limits, and
whether CuPy itself behaves as assumed here; docs/gpu.md lists what only a GPU run checks.

Use: ``fake_cupy.install()`` / ``fake_cupy.uninstall()`` (the ``fake_cupy`` fixture in
tests/gpu/conftest.py does it), or set ``GRADWIRE_FAKE_CUPY=1`` and put
``tests/fake_cupy/site`` on ``PYTHONPATH`` for a subprocess (its ``sitecustomize`` installs it).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
import types
from typing import Any

import numpy as np

from . import _cuda as cuda
from ._array import device_of_args, ndarray, unwrap, wrap

__all__ = [
    "IS_FAKE",
    "install",
    "uninstall",
    "ndarray",
    "cuda",
    "asarray",
    "array",
    "asnumpy",
    "get_array_module",
    "ascontiguousarray",
    "random",
]

#: Marks the stand-in (gradwire never reads it; tests and the benchmark do).
IS_FAKE = True
dtype = np.dtype
ndarray.data.fget  # noqa: B018 - keep the property imported for readers


def _reconstruct(host: np.ndarray, device: int) -> ndarray:
    return wrap(host, device)


def _to_current(x: Any, dtype: Any = None, copy: bool = False) -> ndarray:
    dev = cuda.current_device()
    if isinstance(x, ndarray):
        # Like CuPy's asarray: an array is returned as it is (no move to the current device).
        if copy or (dtype is not None and np.dtype(dtype) != x.dtype):
            return wrap(np.array(x._a, dtype=dtype), x._dev)
        return x
    return wrap(np.array(x, dtype=dtype), dev)


def asarray(a: Any, dtype: Any = None, order: Any = None) -> ndarray:
    """Host data -> an array on the current device; a device array is returned unchanged."""
    return _to_current(a, dtype)


def array(obj: Any, dtype: Any = None, copy: bool = True, order: Any = "K", ndmin: int = 0) -> Any:
    """A copy on the current device (of host data) or on the array's device (of a device array)."""
    out = _to_current(obj, dtype, copy=copy)
    return wrap(np.array(out._a, ndmin=ndmin, copy=False), out._dev) if ndmin else out


def asnumpy(a: Any, stream: Any = None) -> np.ndarray:
    return a.get() if isinstance(a, ndarray) else np.asarray(a)


def get_array_module(*args: Any) -> Any:
    return sys.modules[__name__] if device_of_args(args) is not None else np


def _call(fn: Any, args: Any, kwargs: Any) -> Any:
    dev = device_of_args((args, kwargs))
    if dev is None:
        dev = cuda.current_device()
    else:
        cuda.check_current(dev)
    return wrap(fn(*unwrap(args, dev), **unwrap(kwargs, dev)), dev)


#: The dtypes CuPy 14's ``ufunc.at`` takes, per ufunc (its TypeError before any kernel, read
#: off real CuPy over host memory: tests/gpu/test_real_cupy_prekernel.py); other ufuncs' ``at``
#: raise NotImplementedError.
AT_DTYPES: dict[str, frozenset[str]] = {
    "add": frozenset("int32 int64 float16 float32 float64 uint32 uint64".split()),
    "subtract": frozenset("int32 uint32".split()),
    "maximum": frozenset("int32 int64 float32 float64 uint32 uint64".split()),
    "minimum": frozenset("int32 int64 float32 float64 uint32 uint64".split()),
    "bitwise_or": frozenset("int32 int64 uint32 uint64".split()),
    "bitwise_and": frozenset("int32 int64 uint32 uint64".split()),
    "bitwise_xor": frozenset("int32 int64 uint32 uint64".split()),
}


def _check_at(name: str, args: Any) -> None:
    if name not in AT_DTYPES:
        raise NotImplementedError(f"`cupy_{name}.at` is not supported yet")
    target = args[0] if args else None
    dtype = getattr(target, "dtype", None)
    if dtype is not None and dtype.name not in AT_DTYPES[name]:
        raise TypeError(
            f"cupy.{name}.at only supports {', '.join(sorted(AT_DTYPES[name]))} as data type"
        )


class _UFunc:
    """A NumPy ufunc run on device arrays (``reduce`` / ``at`` / ``accumulate`` included)."""

    def __init__(self, uf: np.ufunc) -> None:
        self._uf = uf
        self.__name__ = uf.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self._uf, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._uf, name)
        if not callable(attr):
            return attr
        if name == "at":

            def at(*a: Any, **k: Any) -> Any:
                _check_at(self.__name__, a)
                return _call(attr, a, k)

            return at
        return lambda *a, **k: _call(attr, a, k)


def _real_cupy() -> Any:
    """Real CuPy, where it is installed (it imports without a GPU), as the reference for the
    signatures of module functions; None where it is not. Read before install() puts the
    stand-in in ``sys.modules['cupy']``."""
    real = sys.modules.get("cupy")
    if real is not None and not getattr(real, "IS_FAKE", False):
        return real
    if real is not None or importlib.util.find_spec("cupy") is None:
        return None
    try:
        return importlib.import_module("cupy")
    except Exception:  # noqa: BLE001 - a broken install: no reference, as without CuPy
        return None


_REAL = _real_cupy()


@functools.cache
def _real_signature(name: str) -> inspect.Signature | None:
    fn = getattr(_REAL, name, None)
    if fn is None or isinstance(fn, type):
        return None
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # Cython functions without a signature
        return None


def _bind_as_cupy(name: str, args: Any, kwargs: Any) -> None:
    """Refuse arguments real CuPy's function does not take (``indices(..., sparse=True)``)."""
    sig = _real_signature(name) if _REAL is not None else None
    if sig is not None:
        try:
            sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{name}() {exc} (real CuPy's signature: {name}{sig})") from None


def _wrapped(obj: Any, name: str = "") -> Any:
    if isinstance(obj, np.ufunc):
        return _UFunc(obj)
    if callable(obj) and not isinstance(obj, type):

        def fn(*args: Any, **kwargs: Any) -> Any:
            if name:
                _bind_as_cupy(name, args, kwargs)
            return _call(obj, args, kwargs)

        fn.__name__ = getattr(obj, "__name__", "fn")
        return fn
    return obj  # dtypes, constants, classes


def ascontiguousarray(a: Any, dtype: Any = None) -> Any:
    if isinstance(a, ndarray):
        return wrap(np.ascontiguousarray(a._a, dtype=dtype), a._dev, a)
    return _to_current(np.ascontiguousarray(a, dtype=dtype))


def _copy_from_device(self: cuda.MemoryPointer, src: cuda.MemoryPointer, size: int) -> None:
    cuda.runtime.memcpy(self.ptr, src.ptr, size)


cuda.MemoryPointer.copy_from_device = _copy_from_device  # type: ignore[attr-defined]
cuda.MemoryPointer.copy_from_device_async = lambda self, src, size, stream=None: (  # type: ignore[attr-defined]
    _copy_from_device(self, src, size)
)


class _Random(types.ModuleType):
    """``cupy.random``: NumPy's generator functions, results on the current device."""

    def __getattr__(self, name: str) -> Any:
        return _wrapped(getattr(np.random, name))


random = _Random("fake_cupy.random")


def _as_strided(x: Any, shape: Any = None, strides: Any = None) -> Any:
    """``cupy.lib.stride_tricks.as_strided``: a view of the same device memory (no kernel)."""
    return wrap(np.lib.stride_tricks.as_strided(x._a, shape, strides), x._dev, x)


lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(as_strided=_as_strided))


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        obj = getattr(np, name)
    except AttributeError:
        raise AttributeError(
            f"fake CuPy stand-in has no {name!r} (NumPy has none either)"
        ) from None
    return _wrapped(obj, name)


_saved: list[Any] = []


def install() -> None:
    """Put this stand-in in ``sys.modules['cupy']`` and make gradwire look for CuPy again."""
    _saved.append(sys.modules.get("cupy"))
    sys.modules["cupy"] = sys.modules[__name__]
    _forget_backend_cache()


def uninstall() -> None:
    """Restore whatever ``cupy`` was before :func:`install` (usually nothing)."""
    prev = _saved.pop() if _saved else None
    if prev is None:
        sys.modules.pop("cupy", None)
    else:
        sys.modules["cupy"] = prev
    _forget_backend_cache()


def _forget_backend_cache() -> None:
    backend = sys.modules.get("gradwire._backend")
    if backend is not None:  # imported already: its once-only check must run again
        backend._cupy = None  # type: ignore[attr-defined]
        backend._cupy_checked = False  # type: ignore[attr-defined]
