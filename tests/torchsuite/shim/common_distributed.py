"""What PyTorch's RPC tests import from ``torch.testing._internal.common_distributed``.

``MultiProcessTestCase`` here is only the base the harness mixes into each test class; the
processes themselves are started by ``torchsuite.runner`` (one per rank, with a deadline) and
each runs one test method through ``torchsuite.worker``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import sys
import unittest
from collections.abc import Callable, Iterator
from typing import Any

from . import IMPL
from .testcase import TensorTestCase

__all__ = ["MultiProcessTestCase", "captured_output", "skip_if_lt_x_gpu", "tp_transports"]


class MultiProcessTestCase(TensorTestCase):
    """Rank, world size and scratch file of one test process (set by ``torchsuite.worker``)."""

    rank: int = -1
    file_name: str = ""

    def __init__(self, method_name: str = "runTest") -> None:
        super().__init__(method_name)


@contextlib.contextmanager
def captured_output() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    new_out, new_err = io.StringIO(), io.StringIO()
    old_out, old_err = sys.stdout, sys.stderr
    try:
        sys.stdout, sys.stderr = new_out, new_err
        yield new_out, new_err
    finally:
        sys.stdout, sys.stderr = old_out, old_err


def skip_if_lt_x_gpu(x: int, *, allow_cpu: bool = False) -> Callable[[Any], Any]:
    """Skip unless ``x`` CUDA devices are present (CUDA tests are not applicable anyway)."""

    def decorator(func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if IMPL == "torch":
                import torch

                if torch.cuda.is_available() and torch.cuda.device_count() >= x:
                    return func(*args, **kwargs)
            raise unittest.SkipTest(f"needs {x} GPUs")

        return wrapper

    return decorator


def tp_transports() -> list[str] | None:
    return None
