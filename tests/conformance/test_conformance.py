"""Differential tests: the scenarios of ``scenarios.py`` on gradwire and on PyTorch.

The gradwire side always runs. The PyTorch side runs where ``torch`` imports in this
interpreter, or with ``GRADWIRE_TORCH_PYTHON`` naming an interpreter that has it (gradwire never
depends on torch; ``.ci/run`` installs ``torch==2.13.0`` for this when it can). Both sides are
held to ``scenarios.EXPECTED`` (PyTorch's outcomes), so the expectations themselves are checked
against PyTorch whenever it is there.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from torch_oracle import require_torch_python

from . import launch, scenarios

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gradwire_outcomes() -> dict[str, Any]:
    return launch.run_gradwire()


@pytest.fixture(scope="module")
def torch_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = require_torch_python()
    out = tmp_path_factory.mktemp("torch") / "outcomes.json"
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    subprocess.run(
        [python, "-m", "conformance.launch", "torch", str(out)],
        cwd=TESTS,
        env=env,
        check=True,
        timeout=600,
        capture_output=True,
    )
    return dict(json.loads(out.read_text()))


NAMES = list(scenarios.SCENARIOS)


def test_there_are_enough_scenarios() -> None:
    steps = sum(len(v) for v in scenarios.EXPECTED.values())
    assert len(NAMES) >= 20 and steps >= 70, (len(NAMES), steps)


@pytest.mark.parametrize("name", NAMES)
def test_gradwire_gives_pytorchs_outcome(gradwire_outcomes: dict[str, Any], name: str) -> None:
    outcome = gradwire_outcomes[name]
    assert not (isinstance(outcome, dict) and "crashed" in outcome), outcome
    assert scenarios.check(name, outcome) == []


@pytest.mark.parametrize("name", NAMES)
def test_pytorch_gives_the_expected_outcome(torch_outcomes: dict[str, Any], name: str) -> None:
    outcome = torch_outcomes[name]
    assert not (isinstance(outcome, dict) and "crashed" in outcome), outcome
    assert scenarios.check(name, outcome) == []


def test_gradwire_keeps_the_programs_own_exception_type(gradwire_outcomes: dict[str, Any]) -> None:
    # PyTorch turns it into a RuntimeError naming the type; gradwire raises the type itself,
    # which is also a RuntimeError, so code written for either catches it.
    first = gradwire_outcomes["the_programs_own_exceptions_reach_the_caller"][0]
    assert first["type"] == "ScenarioError" and "RuntimeError" in first["raises"]
