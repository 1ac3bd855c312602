"""A Process whose tensor arguments are shared whatever the start method."""

from __future__ import annotations

import multiprocessing
from typing import Any

from ._sharing import share_memory_

__all__ = ["Process"]


def _share_tensors(obj: Any, depth: int = 0) -> None:
    from .._tensor import Tensor

    if isinstance(obj, Tensor):
        share_memory_(obj)
    elif depth < 4 and isinstance(obj, (list, tuple, set, frozenset)):
        for item in obj:
            _share_tensors(item, depth + 1)
    elif depth < 4 and isinstance(obj, dict):
        for item in obj.values():
            _share_tensors(item, depth + 1)


class Process(multiprocessing.Process):
    """``multiprocessing.Process`` that moves tensor arguments to shared memory on ``start()``.

    With ``spawn`` and ``forkserver`` the arguments are pickled, which shares them anyway; with
    ``fork`` (the Linux default) they would be inherited copy-on-write, so the child's writes
    would stay in the child. Tensors found in ``args`` / ``kwargs`` (also inside lists, tuples,
    sets and dict values, four levels deep) are shared first, so the behaviour is the same for
    every start method. Processes from ``get_context(...).Process`` are the standard ones.

    Example:
        >>> t = gradwire.zeros(3)
        >>> p = Process(target=fill, args=(t,)); p.start(); p.join()   # t now holds fill's writes
    """

    def start(self) -> None:
        """Share the tensor arguments, then start the process (see the class docstring)."""
        _share_tensors(getattr(self, "_args", ()))
        _share_tensors(getattr(self, "_kwargs", {}))
        super().start()
