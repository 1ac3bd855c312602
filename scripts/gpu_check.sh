#!/usr/bin/env bash
# One command for the first machine with a GPU: install the `cuda` extra (CuPy), run the tests
# marked `gpu`, the GPU benchmark (benchmarks/gpu_bench.py) and the demo with its model on
# cuda:0. See docs/gpu.md.
#
#   scripts/gpu_check.sh            # uses .venv/bin/python if present, else python3
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

"$PY" -m pip install -e '.[cuda,dev]'
if ! "$PY" -c 'import gradwire, sys; sys.exit(0 if gradwire.is_cuda_available() else 1)'; then
    echo "gpu_check: CuPy is installed but sees no CUDA device; nothing to check here" >&2
    exit 2
fi
"$PY" -m pytest -m gpu -rs tests
"$PY" benchmarks/gpu_bench.py
# The demo with its model on the GPU (hidden layers on the parameter server, heads on trainers).
"$PY" -m gradwire.cli demo --device cuda:0
