#!/usr/bin/env bash
# One command for the first machine with a GPU (under 10 minutes on one GPU): install the
# `cuda` extra (CuPy), then
#   1. the tests marked `gpu` (the current-device cases on a real device, CUDA IPC),
#   2. tests/gpu in full: the stand-in's device plumbing and real CuPy's signatures,
#   3. benchmarks/gpu_bench.py: device-to-device echo of 1/16/128 MiB with and without device
#      maps, and the demo model's step on cuda:0,
#   4. `gradwire demo --device cuda:0`,
# each with its own time limit, and write a summary to paste into docs/gpu.md
# (gpu-check-summary.md: the GPU, driver, CuPy, each step's status and time, the benchmark).
#
#   scripts/gpu_check.sh            # uses .venv/bin/python if present, else python3
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
SUMMARY=gpu-check-summary.md

"$PY" -m pip install -q -e '.[cuda,test]' || exit 1
if ! "$PY" -c 'import gradwire, sys; sys.exit(0 if gradwire.is_cuda_available() else 1)'; then
    "$PY" -c 'from gradwire._backend import cuda_unavailable_reason as r; print("gpu_check:", r())' >&2
    echo "gpu_check: no usable CUDA device here; nothing to check" >&2
    exit 2
fi

{
    echo "# gpu_check $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    "$PY" -c 'import cupy, gradwire, sys
rt = cupy.cuda.runtime
n = rt.getDeviceCount()
names = [rt.getDeviceProperties(i)["name"].decode() for i in range(n)]
print(f"- {n} GPU(s): {names}; driver {rt.driverGetVersion()}, runtime {rt.runtimeGetVersion()}")
print(f"- CuPy {cupy.__version__}, Python {sys.version.split()[0]}, gradwire {gradwire.__version__}")'
    echo
    echo "| step | status | seconds |"
    echo "| --- | --- | --- |"
} > "$SUMMARY"

failed=0
step() {  # step NAME LIMIT-SECONDS COMMAND...: run it, log its status and time to the summary
    local name=$1 limit=$2 start status
    shift 2
    echo "== gpu_check: $name"
    start=$(date +%s)
    timeout "$limit" "$@"
    status=$?
    [ "$status" = 0 ] || failed=1
    echo "| $name | $([ "$status" = 0 ] && echo passed || echo "FAILED ($status)") | $(( $(date +%s) - start )) |" >> "$SUMMARY"
}

step "pytest -m gpu" 180 "$PY" -m pytest -q -m gpu -rs tests
step "tests/gpu (stand-in, real CuPy's signatures)" 120 "$PY" -m pytest -q tests/gpu
step "benchmarks/gpu_bench.py" 180 bash -c "\"$PY\" benchmarks/gpu_bench.py | tee gpu-bench.txt"
# The demo with its model on the GPU (hidden layers on the parameter server, heads on trainers).
step "gradwire demo --device cuda:0" 120 "$PY" -m gradwire.cli demo --device cuda:0

{ echo; echo '```'; cat gpu-bench.txt 2>/dev/null; echo '```'; } >> "$SUMMARY"
echo "gpu_check: summary in $SUMMARY"
cat "$SUMMARY"
exit "$failed"
