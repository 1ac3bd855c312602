"""Session-wide setup: compile the project's sources to bytecode once, before any test runs.

Most tests start real worker processes (spawned interpreters, ``gradwire-worker``, ``gradwire
run``), and each imports gradwire afresh. Where ``PYTHONDONTWRITEBYTECODE`` is set (it is on
these machines) no process ever writes a bytecode cache, so every one of them compiled every
module from source: about 0.4 s of each cluster start. Python still reads caches it did not
write, so compiling once here (a no-op for files whose cache is current) gives every process
the cached bytecode. ``__pycache__`` is ignored by git and by the Docker build context.
"""

from __future__ import annotations

import compileall
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]

for _tree in ("client", "server", "tests", "examples", "deploy", "benchmarks"):
    if (_ROOT / _tree).is_dir():
        compileall.compile_dir(_ROOT / _tree, quiet=1)
