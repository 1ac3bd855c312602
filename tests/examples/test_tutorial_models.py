"""The tutorial models compute what PyTorch computes: same weights in, same outputs, gradients
and running statistics out (``tutorial_models.py`` holds the recipe both sides run)."""

from __future__ import annotations

import numpy as np
import pytest
from torch_oracle import torch_values

from . import tutorial_models as tm

HERE = tm.EXAMPLES.parents[1] / "tests" / "examples"

TORCH_SIDE = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
import tutorial_models as tm
tutorials = tm.load(torch_side=True)
for name in tm.NAMES:
    for key, value in tm.results(name, tutorials, None).items():
        out[name + "|" + key] = value
"""


@pytest.fixture(scope="module")
def torch_results() -> dict[str, np.ndarray]:
    return torch_values(TORCH_SIDE)


@pytest.fixture(scope="module")
def tutorials() -> dict[str, object]:
    return tm.load(torch_side=False)


@pytest.mark.parametrize("name", tm.NAMES)
def test_each_model_runs_forward_and_backward_on_gradwire(name: str, tutorials: dict) -> None:
    got = tm.results(name, tutorials, None)
    loss = got["out:loss"]
    assert loss.shape == () and np.isfinite(loss)
    grads = [k for k in got if k.startswith("grad:")]
    params = {k.split(":", 1)[1] for k in got if k.startswith("init:")}
    assert grads and all(np.isfinite(got[k]).all() for k in grads)
    assert {g.split(":", 1)[1] for g in grads} <= params


@pytest.mark.parametrize("name", tm.NAMES)
def test_each_model_matches_pytorch(name: str, tutorials: dict, torch_results: dict) -> None:
    theirs = {k.split("|", 1)[1]: v for k, v in torch_results.items() if k.startswith(name + "|")}
    weights = {k[len("init:") :]: v for k, v in theirs.items() if k.startswith("init:")}
    mine = tm.results(name, tutorials, weights)
    expected = {k: v for k, v in theirs.items() if not k.startswith("init:")}
    assert sorted(mine) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(mine[key], value, rtol=2e-4, atol=2e-5, err_msg=f"{name}: {key}")
