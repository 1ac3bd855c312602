"""The helpers PyTorch's RPC tests import from ``torch.testing._internal.common_utils``."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "FILE_SCHEMA",
    "IS_LINUX",
    "IS_MACOS",
    "IS_SANDCASTLE",
    "TEST_WITH_TSAN",
    "TEST_WITH_DEV_DBG_ASAN",
    "TemporaryFileName",
    "find_free_port",
    "get_cycles_per_ms",
    "load_tests",
    "skip_but_pass_in_sandcastle_if",
]

FILE_SCHEMA = "file://"
IS_LINUX = sys.platform.startswith("linux")
IS_MACOS = sys.platform == "darwin"
IS_SANDCASTLE = False
TEST_WITH_TSAN = False
TEST_WITH_DEV_DBG_ASAN = False


def find_free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get_cycles_per_ms(device: str = "cuda") -> float:
    """Only CUDA tests (not applicable) sleep in device cycles."""
    raise RuntimeError("get_cycles_per_ms is for CUDA tests, which are not applicable here")


def load_tests(loader: Any, tests: Any, pattern: Any) -> Any:
    return tests


def skip_but_pass_in_sandcastle_if(condition: bool, reason: str) -> Callable[[Any], Any]:
    def decorator(func: Any) -> Any:
        if condition:
            func.__unittest_skip__ = True
            func.__unittest_skip_why__ = reason
        return func

    return decorator


@contextlib.contextmanager
def TemporaryFileName(*args: Any, **kwargs: Any) -> Iterator[str]:  # noqa: N802 - torch's name
    with tempfile.TemporaryDirectory() as folder:
        yield os.path.join(folder, "file")
