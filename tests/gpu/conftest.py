"""The ``fake_cupy`` fixture: the TEST-ONLY CuPy stand-in (tests/fake_cupy) in place of ``cupy``.

No GPU is involved: device arrays are NumPy arrays carrying a device id. Worker processes get
the stand-in by importing ``fake_cupy_bodies`` (which installs it) before gradwire looks for
CuPy; subprocesses started otherwise can use ``GRADWIRE_FAKE_CUPY=1`` with
``tests/fake_cupy/site`` on ``PYTHONPATH``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fake_cupy
import pytest


@pytest.fixture
def fake_cupy_module() -> Iterator[Any]:
    """The stand-in installed as ``cupy`` for one test (two fake devices)."""
    fake_cupy.install()
    try:
        yield fake_cupy
    finally:
        fake_cupy.uninstall()
