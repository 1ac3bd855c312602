"""Which sharing strategy CPU tensors use when they cross a process boundary."""

from __future__ import annotations

import os
import sys

__all__ = [
    "FILE_DESCRIPTOR",
    "FILE_SYSTEM",
    "get_all_sharing_strategies",
    "get_sharing_strategy",
    "set_sharing_strategy",
]

FILE_DESCRIPTOR = "file_descriptor"
FILE_SYSTEM = "file_system"

# The descriptor strategy needs SCM_RIGHTS and anonymous shared files (memfd or shm_open+unlink).
_ALL = (FILE_DESCRIPTOR, FILE_SYSTEM) if sys.platform.startswith("linux") else (FILE_SYSTEM,)
_current = os.environ.get("GRADWIRE_SHARING_STRATEGY", _ALL[0])
if _current not in _ALL:
    _current = _ALL[0]


def get_all_sharing_strategies() -> set[str]:
    """Return the sharing strategies this platform supports.

    Returns:
        A set of names: ``{"file_descriptor", "file_system"}`` on Linux, ``{"file_system"}``
        elsewhere.

    Example:
        >>> "file_system" in get_all_sharing_strategies()
        True
    """
    return set(_ALL)


def get_sharing_strategy() -> str:
    """Return the strategy used from now on to share CPU tensors with other processes.

    Returns:
        ``"file_descriptor"`` (the Linux default) or ``"file_system"``.

    Example:
        >>> get_sharing_strategy() in get_all_sharing_strategies()
        True
    """
    return _current


def set_sharing_strategy(new_strategy: str) -> None:
    """Choose how CPU tensors are shared with other processes from now on.

    Tensors already in shared memory keep the kind of segment they have; the setting decides
    the kind of segment new ones get. Child processes started afterwards inherit the choice
    (it is copied into the environment variable ``GRADWIRE_SHARING_STRATEGY``).

    Args:
        new_strategy: one of :func:`get_all_sharing_strategies`.

    Raises:
        ValueError: if ``new_strategy`` is not a strategy this platform supports.

    Example:
        >>> set_sharing_strategy("file_system")
        >>> get_sharing_strategy()
        'file_system'
        >>> set_sharing_strategy("file_descriptor")
    """
    global _current
    if new_strategy not in _ALL:
        raise ValueError(
            f"unknown sharing strategy {new_strategy!r}: this platform supports "
            f"{sorted(_ALL)} (see gradwire.multiprocessing.get_all_sharing_strategies())"
        )
    _current = new_strategy
    os.environ["GRADWIRE_SHARING_STRATEGY"] = new_strategy
