"""Fixtures for the gradwire.multiprocessing tests: strategy isolation and /dev/shm checks."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # children started with spawn import gwmp_workers by name

import gradwire.multiprocessing as gmp  # noqa: E402


@pytest.fixture(params=sorted(gmp.get_all_sharing_strategies()))
def strategy(request: pytest.FixtureRequest) -> Iterator[str]:
    old = gmp.get_sharing_strategy()
    gmp.set_sharing_strategy(request.param)
    try:
        yield request.param
    finally:
        gmp.set_sharing_strategy(old)


@pytest.fixture
def script_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env.pop("GRADWIRE_SHM_MANAGER", None)  # scenario scripts start their own manager
    return env
