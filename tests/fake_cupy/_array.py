"""``cupy.ndarray`` of the test-only CuPy stand-in: a NumPy array that carries a device id.

It is deliberately *not* a ``numpy.ndarray``: like a real CuPy array it refuses implicit
conversion to NumPy (``get()`` or ``cupy.asnumpy`` copies to the host), refuses host arrays
mixed into its operators, and refuses arrays of another device in one operation. Results stay
on the device of their inputs.

It is at least as strict as CuPy about the current device (CuPy launches every kernel there,
and without peer access an array of another device is refused): operators, methods that run a
kernel (``sum``, ``astype``, ``fill``, a reshape that copies, ...), ``__setitem__`` and advanced
indexing all need the array's device to be current. What makes no kernel does not: views,
basic indexing, ``get``/``set``/``item``/``tolist``, and ``copy()``, which (as CuPy's) puts the
copy on the *current* device, wherever the array lives. ``__array_ufunc__`` and
``__array_function__`` route NumPy's functions here (``numpy.add(a, b, out=a)``), as CuPy's do.
"""

from __future__ import annotations

import ctypes
import operator
from typing import Any

import numpy as np

from . import _cuda

__all__ = ["ndarray", "wrap", "unwrap", "device_of_args"]


class _DeviceRef:
    """``ndarray.device``: CuPy returns a ``cupy.cuda.Device``; only ``.id`` is read."""

    def __init__(self, device_id: int) -> None:
        self.id = device_id

    def __eq__(self, other: object) -> bool:
        return getattr(other, "id", None) == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


#: Methods that return a view when they can (no kernel then); a copy needs the current device.
_VIEW_METHODS = frozenset("view reshape transpose swapaxes squeeze ravel diagonal".split())


def _advanced(key: Any) -> bool:
    """True when an index key holds an array, list or bool (CuPy gathers with a kernel)."""
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (ndarray, np.ndarray, list, bool, np.bool_)) for k in keys)


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class ndarray:  # noqa: N801 - CuPy's name
    """A device array of the stand-in (NumPy memory, a device id)."""

    __slots__ = ("_a", "_dev", "_mem", "__weakref__")
    __array_priority__ = 1000.0  # numpy defers binary operators to us (then we refuse them)

    def __init__(
        self,
        shape: Any,
        dtype: Any = float,
        memptr: _cuda.MemoryPointer | None = None,
        strides: Any = None,
        order: str = "C",
    ) -> None:
        if memptr is None:
            self._a = np.empty(shape, dtype, order=order)  # type: ignore[call-overload]
            self._dev = _cuda.current_device()
            self._mem: Any = None
            return
        mem = memptr.mem
        buf = (ctypes.c_char * max(mem.size, 1)).from_address(mem.ptr)
        self._a = np.ndarray(shape, dtype, buffer=buf, offset=memptr.offset, strides=strides)
        self._dev = memptr.device_id
        self._mem = mem

    # -- what gradwire reads ---------------------------------------------------------------------
    @property
    def device(self) -> _DeviceRef:
        return _DeviceRef(self._dev)

    @property
    def data(self) -> _cuda.MemoryPointer:
        ptr = int(self._a.__array_interface__["data"][0])
        mem = self._mem
        if mem is None:
            root = _root(self._a)
            base = int(root.__array_interface__["data"][0])
            mem = _cuda.HostMemory(base, root.nbytes, self._dev, root)
        return _cuda.MemoryPointer(mem, ptr - mem.ptr)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        strides = None if self._a.flags.c_contiguous else self._a.strides
        return {
            "shape": self._a.shape,
            "typestr": self._a.dtype.str,
            "data": (int(self._a.__array_interface__["data"][0]), False),
            "strides": strides,
            "version": 3,
        }

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: wrap(self._a.T, self._dev, self))
    real = property(lambda self: wrap(self._a.real, self._dev, self))
    imag = property(lambda self: wrap(self._a.imag, self._dev, self))

    @property
    def base(self) -> Any:
        return None if self._a.base is None else self

    def get(self, stream: Any = None, order: str = "C", out: Any = None) -> np.ndarray:
        """Copy to the host (a ``numpy.ndarray``)."""
        host = np.array(self._a, order=order)  # type: ignore[call-overload]
        if out is not None:
            out[...] = host
            return out
        return host

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        self._a[...] = arr

    def item(self) -> Any:
        return self._a.item()

    def tolist(self) -> Any:
        return self._a.tolist()

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
            "construct a NumPy array explicitly. (fake CuPy stand-in, like the real one)"
        )

    def __repr__(self) -> str:
        return f"fake_cupy.ndarray({self._a!r}, device={self._dev})"

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self) -> Any:
        return (wrap(x, self._dev, self) for x in self._a)

    def __bool__(self) -> bool:
        return bool(self._a)

    def __float__(self) -> float:
        return float(self._a)

    def __int__(self) -> int:
        return int(self._a)

    def __complex__(self) -> complex:
        return complex(self._a)

    def __index__(self) -> int:
        return operator.index(self._a)

    def __getitem__(self, key: Any) -> Any:
        if _advanced(key):
            _cuda.check_current(self._dev)
        return wrap(self._a[unwrap(key, self._dev)], self._dev, self)

    def __setitem__(self, key: Any, value: Any) -> None:
        _cuda.check_current(self._dev)  # CuPy copies the values in with a kernel
        self._a[unwrap(key, self._dev)] = unwrap(value, self._dev)

    def copy(self, order: str = "C") -> ndarray:
        """A copy on the *current* device (CuPy: "Even when a given array is located in
        another device, you can copy it to the current device")."""
        return wrap(self._a.copy(order=order), _cuda.current_device())

    def __copy__(self) -> ndarray:
        return self.copy()

    def __deepcopy__(self, memo: Any) -> ndarray:
        with _cuda.Device(self._dev):  # CuPy: ``with self.device: return self.copy()``
            return self.copy()

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        from . import _UFunc

        uf = _UFunc(ufunc)
        out = kwargs.get("out")
        result = (
            uf(*inputs, **kwargs)
            if method == "__call__"
            else getattr(uf, method)(*inputs, **kwargs)
        )
        if isinstance(out, tuple) and len(out) == 1:
            return out[0]  # numpy.add(a, b, out=a) returns a itself
        return result

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        from . import _call

        return _call(func, args, kwargs)

    def __reduce__(self) -> Any:
        from . import _reconstruct

        return (_reconstruct, (self._a.copy(), self._dev))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return wrap(attr, self._dev, self)

        def method(*args: Any, **kwargs: Any) -> Any:
            out = attr(*unwrap(args, self._dev), **unwrap(kwargs, self._dev))
            view = name in _VIEW_METHODS and isinstance(out, np.ndarray)
            if not (view and np.shares_memory(out, self._a)):
                _cuda.check_current(self._dev)  # a kernel ran (or would have)
            return wrap(out, self._dev, self)

        return method


def _binary(name: str) -> Any:
    def op(self: ndarray, *args: Any) -> Any:
        _cuda.check_current(self._dev)
        out = getattr(self._a, name)(*unwrap(args, self._dev))
        if out is NotImplemented:
            return out
        if out is self._a:  # in place
            return self
        return wrap(out, self._dev, self)

    op.__name__ = name
    return op


for _name in (
    "add sub mul truediv floordiv mod pow matmul and or xor lshift rshift "
    "radd rsub rmul rtruediv rfloordiv rmod rpow rmatmul rand ror rxor "
    "iadd isub imul itruediv ifloordiv imod ipow iand ior ixor "
    "lt le gt ge eq ne neg pos abs invert"
).split():
    setattr(ndarray, f"__{_name}__", _binary(f"__{_name}__"))
ndarray.__hash__ = None  # type: ignore[assignment]


def wrap(out: Any, device: int, source: ndarray | None = None) -> Any:
    """NumPy results back into device arrays (tuples/lists element-wise). NumPy scalars become
    0-d arrays, as CuPy's reductions return; Python scalars stay as they are."""
    if isinstance(out, np.generic):
        out = np.asarray(out)
    if isinstance(out, np.ndarray):
        arr = ndarray.__new__(ndarray)
        arr._a, arr._dev = out, device
        shares = source is not None and source._mem is not None
        arr._mem = source._mem if shares and np.may_share_memory(out, source._a) else None  # type: ignore[union-attr]
        return arr
    if isinstance(out, tuple):
        return tuple(wrap(o, device, source) for o in out)
    if isinstance(out, list):
        return [wrap(o, device, source) for o in out]
    return out


def unwrap(obj: Any, device: int | None) -> Any:
    """Device arrays -> their NumPy arrays, refusing host arrays and other devices' arrays."""
    if isinstance(obj, ndarray):
        if device is not None and obj._dev != device:
            raise ValueError(
                f"fake CuPy: an array on device {obj._dev} used with arrays on device {device} "
                "(CuPy needs one device per operation; move one with cupy.asarray under "
                "cupy.cuda.Device)"
            )
        return obj._a
    if isinstance(obj, np.ndarray) and obj.ndim > 0:
        raise TypeError(
            "fake CuPy: a numpy.ndarray mixed into a device operation (CuPy refuses host arrays "
            "here: move it with cupy.asarray first)"
        )
    if isinstance(obj, tuple):
        return tuple(unwrap(o, device) for o in obj)
    if isinstance(obj, list):
        return [unwrap(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: unwrap(v, device) for k, v in obj.items()}
    return obj


def device_of_args(args: Any) -> int | None:
    """The device of the first device array among ``args`` (nested), or None."""
    if isinstance(args, ndarray):
        return args._dev
    if isinstance(args, (tuple, list)):
        for a in args:
            d = device_of_args(a)
            if d is not None:
                return d
    if isinstance(args, dict):
        return device_of_args(list(args.values()))
    return None
