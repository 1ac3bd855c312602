"""The guard on its own, in fresh interpreters: what gradwire's own lazy imports need passes."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest
from gradwire.errors import PolicyError

LAZY = "gradwire._repr"  # imported by Tensor.__repr__ at its first call

_UNDER_GUARD = f"""
import importlib, sys
import gradwire.distributed.rpc  # what a running worker has loaded (protobuf, grpc, the runtime)
from gradwire._wire import guard
assert {LAZY!r} not in sys.modules
with guard.guarded("test", "w"):
    importlib.import_module({LAZY!r})  # from the bytecode cache: open, marshal.loads, exec
    try:
        importlib.import_module("yaml")  # installed (the test extra), but not a library it vets
    except Exception as exc:
        print(type(exc).__name__, exc)
"""


def test_a_lazy_import_of_gradwire_from_its_bytecode_cache_passes_the_guard() -> None:
    # The first interpreter writes the module's bytecode cache; the second loads it guarded,
    # as an installed worker image does (found by running docker compose for real).
    subprocess.run([sys.executable, "-c", f"import {LAZY}"], check=True, timeout=60)
    done = subprocess.run(
        [sys.executable, "-c", _UNDER_GUARD], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    # an import from outside the standard library, gradwire and NumPy is still refused
    assert "PolicyError" in done.stdout and "yaml" in done.stdout, done.stdout


def test_logging_inside_guarded_code_works(caplog: Any) -> None:
    # logging's findCaller raises the sys._getframe audit event on every call: a guarded
    # gradwire function that logs a warning must not fail for it.
    from gradwire._wire import guard

    log = logging.getLogger("gradwire.test_guard")
    with guard.guarded("test", "w"):
        log.warning("a warning from guarded code")
        with pytest.raises(PolicyError, match="tried to open"):
            open(__file__)  # noqa: SIM115 - the refused event itself
    assert "a warning from guarded code" in caplog.text
