"""PyTorch as an outside oracle for differential tests, without gradwire depending on torch.

gradwire never imports torch. A differential test computes its gradwire side in the test process
and asks PyTorch for the same values through :func:`torch_values`, which runs a snippet in an
interpreter that has torch: this one if ``torch`` imports here, else the one named by
``GRADWIRE_TORCH_PYTHON`` (``.ci/run`` installs ``torch==2.13.0`` into ``.torchenv`` for this).
Where neither exists, :func:`require_torch_python` skips the PyTorch side with the reason.

Example::

    out = torch_values(
        "x = torch.tensor(inputs['x'], requires_grad=True)\\n"
        "y = torch.nn.functional.relu(x).sum(); y.backward()\\n"
        "out['y'] = y; out['gx'] = x.grad\\n",
        {"x": np.arange(3.0)},
    )
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

__all__ = ["torch_python", "require_torch_python", "torch_values"]

_RUNNER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch

    src, inp, dst = sys.argv[1:4]
    with np.load(inp) as data:
        inputs = {k: data[k] for k in data.files}
    out = {}
    exec(compile(open(src).read(), src, "exec"), {"torch": torch, "np": np, "inputs": inputs, "out": out})
    arrays = {}
    for key, value in out.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().resolve_conj().numpy()
        arrays[key] = np.asarray(value)
    np.savez(dst, **arrays)
    """
)


def torch_python() -> str | None:
    """The interpreter that has torch: ``GRADWIRE_TORCH_PYTHON``, or this one, or None."""
    python = os.environ.get("GRADWIRE_TORCH_PYTHON")
    if python:
        return os.path.abspath(python)
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    return None


def require_torch_python() -> str:
    """:func:`torch_python`, or skip the calling test with how to enable its PyTorch side."""
    python = torch_python()
    if python is None:
        pytest.skip(
            "torch is not importable here (pip install torch==2.13.0, or set "
            "GRADWIRE_TORCH_PYTHON to an interpreter that has it)"
        )
    return python


def torch_values(
    source: str, inputs: dict[str, Any] | None = None, timeout: float = 300
) -> dict[str, np.ndarray]:
    """Run ``source`` under PyTorch and return what it put in ``out`` as NumPy arrays.

    The snippet sees ``torch``, ``np``, ``inputs`` (the given arrays) and ``out`` (a dict to
    fill with tensors, arrays or numbers). Skips the test when no interpreter has torch.

    Raises:
        AssertionError: when the snippet fails; the message carries torch's traceback.
    """
    python = require_torch_python()
    with tempfile.TemporaryDirectory(prefix="gradwire-torch-") as tmp:
        folder = Path(tmp)
        (folder / "runner.py").write_text(_RUNNER)
        (folder / "snippet.py").write_text(textwrap.dedent(source))
        np.savez(folder / "inputs.npz", **{k: np.asarray(v) for k, v in (inputs or {}).items()})
        done = subprocess.run(
            [
                python,
                str(folder / "runner.py"),
                str(folder / "snippet.py"),
                str(folder / "inputs.npz"),
                str(folder / "out.npz"),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"the PyTorch side failed:\n{done.stdout}{done.stderr}"
        with np.load(folder / "out.npz") as data:
            return {k: data[k] for k in data.files}
