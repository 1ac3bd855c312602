"""Where the benchmarks find PyTorch: here, or in ``$GRADWIRE_TORCH_PYTHON``.

gradwire never depends on torch. A benchmark that compares with it calls
:func:`run_where_torch_is` first: when torch does not import here but the interpreter named by
``$GRADWIRE_TORCH_PYTHON`` has torch and gradwire, the whole benchmark re-runs there, so both
sides share one environment. The benchmarks run as scripts and import this as ``torch_env``.
"""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["have_torch", "run_where_torch_is"]


def have_torch() -> bool:
    """Whether ``torch.distributed.rpc`` imports in this interpreter."""
    try:
        import torch.distributed.rpc  # noqa: F401
    except ImportError:
        return False
    return True


def run_where_torch_is() -> None:
    """Re-run this benchmark in ``$GRADWIRE_TORCH_PYTHON`` when torch is not here but there
    (never returns then); otherwise return and run here."""
    if have_torch():
        return
    other = os.environ.get("GRADWIRE_TORCH_PYTHON")
    if not other or os.path.abspath(other) == os.path.abspath(sys.executable):
        return
    probe = subprocess.run(
        [other, "-c", "import torch.distributed.rpc, gradwire"], capture_output=True
    )
    if probe.returncode == 0:
        print(f"running in {other} (it has torch)", file=sys.stderr, flush=True)
        os.execv(other, [other, *sys.argv])
