"""Installs the TEST-ONLY CuPy stand-in (tests/fake_cupy) in a subprocess when
``GRADWIRE_FAKE_CUPY=1``; put this directory on ``PYTHONPATH`` to use it (never shipped)."""

from __future__ import annotations

import os
import sys

if os.environ.get("GRADWIRE_FAKE_CUPY") == "1":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    import fake_cupy

    fake_cupy.install()
