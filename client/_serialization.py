"""``gradwire.save`` and ``gradwire.load``: tensors and plain containers to a file and back.

PyTorch's ``torch.save`` / ``torch.load`` for gradwire: the file is a pickle in which every tensor
is its NumPy array (on the host) plus ``requires_grad``. ``load`` reads it with an unpickler that
rebuilds only tensors, parameters, gradwire dtypes, NumPy arrays and dtypes, and the builtin
numbers and containers (PyTorch's ``weights_only=True``, its default since 2.6), so a file
cannot make ``load`` run code; ``weights_only=False`` unpickles anything, for files you trust.
Objects that refuse the Python pickler (an ``RRef``, a ``Future``) make ``save`` raise their own
error, and nothing is written.

Example:
    >>> gw.save({"w": gw.ones(2, 2), "step": 3}, "ckpt.pt")
    >>> gw.load("ckpt.pt")["w"].sum().item()
    4.0
"""

from __future__ import annotations

import codecs
import io
import os
import pickle
from collections import OrderedDict
from typing import IO, Any

import numpy as np

from . import _dtypes
from ._tensor import Tensor, _rebuild_sparse, _rebuild_tensor
from .errors import ArgumentError

__all__ = ["save", "load"]

_File = str | os.PathLike[str] | IO[bytes]

#: The globals a weights-only file may name, with the Python 2 spellings pickle protocol 2 uses.
_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "slice"): slice,
    ("builtins", "range"): range,
    ("builtins", "bytearray"): bytearray,
    ("_codecs", "encode"): codecs.encode,  # bytes in protocol 2
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}
for _mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
    _ALLOWED[(_mod, "_reconstruct")] = np._core.multiarray._reconstruct  # type: ignore[attr-defined]
for _mod in ("numpy._core.numeric", "numpy.core.numeric"):
    _ALLOWED[(_mod, "_frombuffer")] = np._core.numeric._frombuffer  # type: ignore[attr-defined]
for _name in ("set", "frozenset", "complex", "slice", "bytearray"):
    _ALLOWED[("__builtin__", _name)] = _ALLOWED[("builtins", _name)]


def _tensor_classes() -> dict[tuple[str, str], type[Tensor]]:
    from .nn.parameter import Parameter

    return {(c.__module__, c.__qualname__): c for c in (Tensor, Parameter)}


class _WeightsUnpickler(pickle.Unpickler):
    """Rebuilds only what ``_ALLOWED``, the tensor classes and gradwire's dtypes name."""

    def __init__(self, file: IO[bytes], device: Any) -> None:
        super().__init__(file)
        self._device = device
        self._classes = _tensor_classes()

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name)) or self._classes.get((module, name))
        if found is not None:
            return found
        if (module, name) == ("gradwire._tensor", "_rebuild_tensor"):
            return self._rebuild
        if (module, name) == ("gradwire._tensor", "_rebuild_sparse"):
            return self._rebuild_sparse
        if module == "gradwire._dtypes":
            value = getattr(_dtypes, name, None)
            if isinstance(value, _dtypes.dtype):
                return value
        raise pickle.UnpicklingError(
            f"weights_only load refused the global {module}.{name}: a file loaded with "
            "weights_only=True may hold tensors, NumPy arrays, dtypes and builtin numbers and "
            "containers only; pass weights_only=False only for a file you trust (unpickling "
            "it can run any code)"
        )

    def _rebuild(self, arr: Any, requires_grad: bool, cls: Any = Tensor) -> Tensor:
        if not (isinstance(arr, np.ndarray) and isinstance(cls, type) and issubclass(cls, Tensor)):
            raise pickle.UnpicklingError("malformed tensor in a weights_only file")
        if cls not in self._classes.values():
            raise pickle.UnpicklingError(f"weights_only load refused tensor class {cls!r}")
        return _moved(_rebuild_tensor(arr, requires_grad, cls), self._device)

    def _rebuild_sparse(
        self,
        indices: Any,
        values: Any,
        shape: Any,
        coalesced: Any,
        requires_grad: bool,
        cls: Any = Tensor,
    ) -> Tensor:
        ok = (
            isinstance(indices, np.ndarray)
            and isinstance(values, np.ndarray)
            and isinstance(shape, tuple)
            and all(type(n) is int for n in shape)
            and cls in self._classes.values()
        )
        if not ok:
            raise pickle.UnpicklingError("malformed sparse tensor in a weights_only file")
        try:  # the indices are checked against the shape
            t = _rebuild_sparse(indices, values, shape, bool(coalesced), bool(requires_grad), cls)
        except (ValueError, TypeError) as exc:
            raise pickle.UnpicklingError(
                f"malformed sparse tensor in a weights_only file: {exc}"
            ) from None
        return t if self._device is None else t.to(self._device)


def _moved(t: Tensor, device: Any) -> Tensor:
    if device is None:
        return t
    # Rebuilt rather than t.to(device): a saved leaf stays a leaf, of its own class.
    return _rebuild_tensor(t.detach().to(device)._data, t.requires_grad and t.is_leaf, type(t))


def save(obj: Any, f: _File, pickle_protocol: int = pickle.DEFAULT_PROTOCOL) -> None:
    """Write ``obj`` (tensors, parameters, state dicts, containers of them) to ``f``.

    Args:
        obj: what to save; tensors are stored as host arrays with their ``requires_grad``.
        f: a path, or a binary file object open for writing.
        pickle_protocol: the pickle protocol (2 or newer).

    Raises:
        RRefError: ``obj`` holds an RRef ("Can not pickle rref in python pickler").
        FuturePicklingError: ``obj`` holds a Future. Nothing is written when pickling fails.

    Example:
        >>> gw.save(model.state_dict(), "model.pt")
    """
    data = pickle.dumps(obj, protocol=pickle_protocol)  # first: a failure writes nothing
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as out:
            out.write(data)
    else:
        f.write(data)


def load(f: _File, map_location: Any = None, *, weights_only: bool = True) -> Any:
    """Read what :func:`save` wrote.

    Args:
        f: a path, or a binary file object open for reading.
        map_location: a device (``"cpu"``, ``"cuda:0"``, a gradwire device) to put every tensor
            on; None keeps them on the host, where they were saved.
        weights_only: rebuild only tensors, NumPy arrays, dtypes and builtin numbers and
            containers (the default); False unpickles anything: only for a file you trust.

    Returns:
        The saved object.

    Raises:
        pickle.UnpicklingError: a weights_only file names any other global (named in the
            message) or is malformed.
        ArgumentError: ``map_location`` is a mapping or a function (not supported).

    Example:
        >>> state = gw.load("model.pt")
        >>> model.load_state_dict(state)
    """
    if callable(map_location) or isinstance(map_location, dict):
        raise ArgumentError(
            "gradwire.load: map_location must be a device (or None); mappings and functions "
            "are not supported"
        )
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as src:
            data = src.read()
    else:
        data = f.read()
    if not weights_only:
        obj = pickle.loads(data)  # noqa: S301 - the caller trusts this file (weights_only=False)
        return _map(obj, map_location)
    return _WeightsUnpickler(io.BytesIO(data), map_location).load()


def _map(obj: Any, device: Any) -> Any:
    if device is None:
        return obj
    if isinstance(obj, Tensor):
        return _moved(obj, device)
    if type(obj) in (dict, OrderedDict):
        return type(obj)((k, _map(v, device)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(_map(v, device) for v in obj)
    return obj
