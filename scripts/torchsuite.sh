#!/usr/bin/env bash
# PyTorch's own RPC test suite on gradwire, read from an installed torch wheel (tests/torchsuite).
#   scripts/torchsuite.sh [--ratchet] [-j 2] [-k NAME] [--json out.json]      on gradwire
#   scripts/torchsuite.sh --impl torch [-j 2]                                 on torch itself
# The torch interpreter is $GRADWIRE_TORCH_PYTHON (default .torchenv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
export GRADWIRE_TORCH_PYTHON="${GRADWIRE_TORCH_PYTHON:-$PWD/.torchenv/bin/python}"
python=.venv/bin/python
for arg in "$@"; do
  case "$arg" in torch|--impl=torch) python="$GRADWIRE_TORCH_PYTHON" ;; esac
done
PYTHONPATH="$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m torchsuite "$@"
