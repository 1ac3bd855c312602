"""The programs of ``examples/rpc_tutorials`` run to their checked outcome on gradwire, and the
same programs on PyTorch where it imports (only ``_framework.py``'s imports differ)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from torch_oracle import require_torch_python

from .tutorial_models import EXAMPLES

OUTCOMES = {
    "rnn_parameter_server": ["loss fell from"],
    "cnn_parameter_server": ["trainer 1: accuracy", "trainer 2: accuracy", "(above 0.5)"],
    "batched_rl": ["300 batched policy calls served 900 actions", "mean reward per step rose"],
    "pipeline_resnet": ["micro-batches per shard [24, 24]", "pipelined and trained"],
    "remote_module": ["remote table changed: True", "forward_async gave (32, 3, 16)", "trained"],
}


def _run(python: str, program: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [python, str(EXAMPLES / f"{program}.py")],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    return done.stdout


@pytest.mark.parametrize("program", sorted(OUTCOMES))
def test_the_tutorial_reaches_its_outcome_on_gradwire(program: str) -> None:
    out = _run(sys.executable, program, {})
    for line in OUTCOMES[program]:
        assert line in out, out


@pytest.mark.parametrize("program", sorted(OUTCOMES))
def test_the_same_program_reaches_it_on_pytorch(program: str) -> None:
    out = _run(require_torch_python(), program, {"GRADWIRE_TUTORIAL_TORCH": "1"})
    for line in OUTCOMES[program]:
        assert line in out, out
