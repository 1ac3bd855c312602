"""Allocator tuning: keep freed array memory in the process instead of handing it back at once.

NumPy allocates array data with ``malloc``. With glibc's defaults, a program that keeps allocating
and freeing arrays of about a megabyte (every autograd step does: activations, gradients,
temporaries) trims the top of its heap on nearly every free and grows it again on the next
allocation, so each new array pays a page fault per 4 KiB page. On this project's benchmark
machine that made the backward pass of ``(y * y).mean()`` for a 512x512 ``y`` cost 2.5-3.0 ms
instead of 0.43-0.47 ms. Measured with ``mallopt``: both thresholds below must move (either alone
changes nothing).

At import (of this module, which ``import gradwire`` imports first), on glibc only, gradwire
sets:

- ``M_MMAP_THRESHOLD`` = 32 MiB: blocks below it come from the heap (glibc's own dynamic
  threshold stops growing at this value; setting it fixes it there);
- ``M_TRIM_THRESHOLD`` = 128 MiB: the heap is trimmed only when that much is free at its top.

The price: a process may keep up to 128 MiB of freed heap memory resident. Opt out by setting
``GRADWIRE_MALLOC_TUNING=0`` before importing gradwire. PyTorch addresses the same cost with its
own CPU allocator; NumPy exposes no allocator hook to Python.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune", "tuned"]

MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 128 << 20
_M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
_M_MMAP_THRESHOLD = -3
_tuned = False


def tune() -> bool:
    """Apply the thresholds once (glibc only, unless ``GRADWIRE_MALLOC_TUNING=0``).

    Returns:
        True if glibc accepted both settings (now or on an earlier call).
    """
    global _tuned
    if _tuned:
        return True
    if os.environ.get("GRADWIRE_MALLOC_TUNING", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _tuned = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    return _tuned


def tuned() -> bool:
    """Whether the thresholds are in effect in this process."""
    return _tuned


tune()
