"""StepLR and LambdaLR: PyTorch's learning-rate sequences, state dicts, resuming."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest
from gradwire.optim.lr_scheduler import LambdaLR, LRScheduler, StepLR
from torch_oracle import torch_values

EPOCHS = 12


def _opt(lrs=(0.1,), cls=gw.optim.SGD):
    groups = [{"params": [gw.nn.Parameter(gw.zeros(2))], "lr": lr} for lr in lrs]
    return cls(groups, lr=lrs[0])


def _warmup(epoch: int) -> float:
    return min(1.0, (epoch + 1) / 4)


def _decay(epoch: int) -> float:
    return 0.9**epoch


class Ramp:
    """A callable object: its state goes into the scheduler's state_dict."""

    def __init__(self, slope: float) -> None:
        self.slope = slope

    def __call__(self, epoch: int) -> float:
        return 1.0 + self.slope * epoch


def _sequence(sched: LRScheduler, step_optimizer: bool = True) -> np.ndarray:
    rows = [sched.get_last_lr()]
    for _ in range(EPOCHS):
        if step_optimizer:
            sched.optimizer.step()
        sched.step()
        rows.append(sched.get_last_lr())
    return np.array(rows)


@pytest.fixture(scope="module")
def torch_out() -> dict[str, np.ndarray]:
    src = f"""
def opt(lrs):
    return torch.optim.SGD([{{"params": [torch.zeros(2, requires_grad=True)], "lr": lr}} for lr in lrs], lr=lrs[0])
def seq(s):
    rows = [s.get_last_lr()]
    for _ in range({EPOCHS}):
        s.optimizer.step(); s.step(); rows.append(s.get_last_lr())
    return np.array(rows)
out["step3"] = seq(torch.optim.lr_scheduler.StepLR(opt([0.1]), step_size=3))
out["step2_two_groups"] = seq(torch.optim.lr_scheduler.StepLR(opt([0.1, 0.5]), 2, gamma=0.5))
out["lambda"] = seq(torch.optim.lr_scheduler.LambdaLR(opt([0.1]), lambda e: min(1.0, (e + 1) / 4)))
out["lambdas"] = seq(torch.optim.lr_scheduler.LambdaLR(
    opt([0.1, 0.2]), [lambda e: min(1.0, (e + 1) / 4), lambda e: 0.9 ** e]))
o = opt([0.1]); o.param_groups[0]["initial_lr"] = 0.1
out["resumed"] = seq(torch.optim.lr_scheduler.StepLR(o, step_size=3, last_epoch=4))
"""
    return torch_values(src)


def test_step_lr_matches_torch(torch_out):
    np.testing.assert_allclose(_sequence(StepLR(_opt(), step_size=3)), torch_out["step3"])
    got = _sequence(StepLR(_opt((0.1, 0.5)), 2, gamma=0.5))
    np.testing.assert_allclose(got, torch_out["step2_two_groups"])


def test_lambda_lr_matches_torch(torch_out):
    np.testing.assert_allclose(_sequence(LambdaLR(_opt(), _warmup)), torch_out["lambda"])
    got = _sequence(LambdaLR(_opt((0.1, 0.2)), [_warmup, _decay]))
    np.testing.assert_allclose(got, torch_out["lambdas"])


def test_resuming_matches_torch(torch_out):
    opt = _opt()
    opt.param_groups[0]["initial_lr"] = 0.1
    got = _sequence(StepLR(opt, step_size=3, last_epoch=4))
    np.testing.assert_allclose(got, torch_out["resumed"])


def test_step_lr_hand_computed():
    opt = _opt((1.0,))
    sched = StepLR(opt, step_size=2, gamma=0.1)
    lrs = _sequence(sched)[:, 0]
    expected = [1.0 * 0.1 ** (e // 2) for e in range(EPOCHS + 1)]
    np.testing.assert_allclose(lrs, expected, rtol=1e-12)
    assert opt.param_groups[0]["lr"] == pytest.approx(expected[-1])
    assert opt.param_groups[0]["initial_lr"] == 1.0
    assert sched.base_lrs == [1.0] and sched.last_epoch == EPOCHS


def test_lambda_lr_hand_computed_and_writes_the_optimizer():
    opt = _opt((0.2, 0.4))
    sched = LambdaLR(opt, lambda e: 1.0 / (e + 1))
    assert sched.get_last_lr() == [0.2, 0.4]
    sched.step()
    sched.step()
    assert sched.get_last_lr() == pytest.approx([0.2 / 3, 0.4 / 3])
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.2 / 3, 0.4 / 3])


def test_the_scheduled_lr_drives_the_update():
    p = gw.nn.Parameter(gw.tensor([1.0], dtype=gw.float64))
    opt = gw.optim.SGD([p], lr=1.0)
    sched = StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(3):
        p.grad = gw.tensor([1.0], dtype=gw.float64)
        opt.step()
        sched.step()
    np.testing.assert_allclose(p.detach().numpy(), [1.0 - 1.0 - 0.5 - 0.25])


def test_state_dict_round_trip():
    sched = StepLR(_opt(), step_size=3, gamma=0.3)
    for _ in range(4):
        sched.step()
    state = sched.state_dict()
    assert "optimizer" not in state
    assert state["last_epoch"] == 4 and state["step_size"] == 3 and state["gamma"] == 0.3
    other = StepLR(_opt(), step_size=7)
    other.load_state_dict(state)
    assert other.last_epoch == 4 and other.step_size == 3
    assert other.get_last_lr() == sched.get_last_lr()


def test_lambda_state_dict_keeps_callable_objects_state_only():
    ramp = Ramp(0.5)
    sched = LambdaLR(_opt((0.1, 0.1)), [_warmup, ramp])
    state = sched.state_dict()
    assert state["lr_lambdas"] == [None, {"slope": 0.5}]
    ramp.slope = 9.0
    sched.load_state_dict(state)
    assert ramp.slope == 0.5


def test_errors():
    with pytest.raises(ValueError, match="Expected 2 lr_lambdas, but got 1"):
        LambdaLR(_opt((0.1, 0.2)), [_warmup])
    with pytest.raises(KeyError, match="initial_lr"):
        StepLR(_opt(), step_size=2, last_epoch=3)
    with pytest.raises(TypeError, match="not an Optimizer"):
        StepLR(object(), step_size=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="step_size"):
        StepLR(_opt(), step_size=0)


def test_step_with_epoch_is_deprecated_and_uses_the_closed_form():
    sched = StepLR(_opt((1.0,)), step_size=2, gamma=0.5)
    with pytest.warns(UserWarning, match="deprecated"):
        sched.step(5)
    assert sched.get_last_lr() == [0.25]
