"""Run mypy on the package under its import name.

mypy does not run the editable-install import hook that maps gradwire -> client/, so this
builds a throw-away tree of symlinks (gradwire/ = client/*, gradwire/server = server/) and
checks that tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "gradwire"
        pkg.mkdir()
        for entry in (ROOT / "client").iterdir():
            if entry.name != "__pycache__":
                os.symlink(entry, pkg / entry.name)
        os.symlink(ROOT / "server", pkg / "server")
        cmd = [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "-p",
            "gradwire",
        ]
        return subprocess.call(cmd, cwd=tmp, env={**os.environ, "MYPYPATH": tmp})


if __name__ == "__main__":
    sys.exit(main())
