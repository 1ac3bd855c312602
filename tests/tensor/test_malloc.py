"""glibc allocator tuning at import (gradwire._malloc): applied by default, opt-out honoured."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

_GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
_PROBE = "import gradwire, gradwire._malloc as m; print(m.tuned())"


def _tuned_in_fresh_process(**env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.strip()


@pytest.mark.skipif(not _GLIBC, reason="the tuning applies to glibc's malloc only")
def test_import_tunes_glibc_malloc() -> None:
    assert _tuned_in_fresh_process(GRADWIRE_MALLOC_TUNING="1") == "True"


@pytest.mark.parametrize("value", ["0", "off", "false"])
def test_opt_out_leaves_malloc_alone(value: str) -> None:
    assert _tuned_in_fresh_process(GRADWIRE_MALLOC_TUNING=value) == "False"
