"""Helpers of ``Module``: hook handles, ``load_state_dict``'s result, ``to()``'s arguments."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple

from .._backend import Device
from .._dtypes import from_numpy_dtype, to_numpy_dtype
from .._tensor import Tensor

__all__ = ["RemovableHandle"]


class _IncompatibleKeys(NamedTuple):
    """What ``load_state_dict`` returns: keys the module wanted but did not get, and the rest."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class RemovableHandle:
    """Returned by ``register_forward_hook`` and friends; ``remove()`` unregisters the hook."""

    _next_id = 0

    def __init__(self, hooks: OrderedDict[int, Any]) -> None:
        self._hooks = hooks
        self.id = RemovableHandle._next_id
        RemovableHandle._next_id += 1

    def remove(self) -> None:
        self._hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _add_hook(hooks: OrderedDict[int, Any], entry: Any, prepend: bool) -> RemovableHandle:
    handle = RemovableHandle(hooks)
    hooks[handle.id] = entry
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    return handle


def _to_args(args: Any, kwargs: Any) -> tuple[Any, Any]:
    """Device and dtype of a ``Module.to(...)`` call, as ``Tensor.to`` reads them."""
    dev, dt = kwargs.pop("device", None), kwargs.pop("dtype", None)
    kwargs.pop("non_blocking", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, Tensor):
            dev, dt = a.device, a.dtype
        elif isinstance(a, (str, Device)):
            dev = a
        else:
            dt = a
    if dt is not None:
        dt = from_numpy_dtype(to_numpy_dtype(dt))
    if dt is not None and not (dt.is_floating_point or dt.is_complex):
        raise TypeError(
            f"nn.Module.to only accepts floating point or complex dtypes, but got desired dtype={dt}"
        )
    return dev, dt
