"""Anomaly detection: a failing backward node is traced to the forward op that made it."""

from __future__ import annotations

import threading
import warnings

import gradwire as gw
import numpy as np
import pytest
from gradwire.autograd.anomaly_mode import AnomalyError


@pytest.fixture(autouse=True)
def _quiet_and_off():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's 0 * inf
        yield
    assert not gw.autograd.is_anomaly_enabled()  # every test leaves it off


class Exploding(gw.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        raise ValueError("exploded in backward")


def _sqrt_of_zero_loss():
    x = gw.tensor([4.0, 0.0], dtype=gw.float64, requires_grad=True)
    y = x.sqrt()  # FORWARD-SQRT: at 0 its backward is 0 * inf = nan
    return x, (y * 0.0).sum()


def test_nan_names_the_node_the_forward_op_and_its_line():
    with gw.autograd.detect_anomaly():
        _, loss = _sqrt_of_zero_loss()
        with pytest.raises(RuntimeError) as info:
            loss.backward()
    assert isinstance(info.value, AnomalyError)
    msg = str(info.value)
    # PyTorch's message, word for word (torch 2.13: the same op under its detect_anomaly)
    assert msg.startswith("Function 'SqrtBackward0' returned nan values in its 0th output.")
    assert "forward op 'Sqrt'" in msg
    assert "test_anomaly.py" in msg and "FORWARD-SQRT" in msg  # the source line of the op
    assert "_sqrt_of_zero_loss" in msg


def test_an_error_in_backward_keeps_its_type_and_gets_the_origin_as_a_note():
    x = gw.tensor([1.0, 2.0], requires_grad=True)
    with gw.autograd.detect_anomaly(), pytest.warns(UserWarning, match="Error detected in"):
        y = Exploding.apply(x)  # FORWARD-EXPLODING
        with pytest.raises(ValueError, match="exploded in backward") as info:
            y.sum().backward()
    note = "\n".join(info.value.__notes__)
    assert "Error detected in ExplodingBackward" in note
    assert "forward op 'Exploding'" in note and "FORWARD-EXPLODING" in note


def test_a_second_backward_through_a_freed_graph_is_traced_too():
    x = gw.tensor([1.0, 2.0], requires_grad=True)
    with gw.autograd.detect_anomaly():
        y = (x * x).sum()  # FORWARD-MUL
        y.backward()
        with pytest.raises(RuntimeError, match="second time") as info:
            y.backward()
    assert "FORWARD-MUL" in "\n".join(info.value.__notes__)


def test_off_records_nothing_and_lets_nan_through():
    x, loss = _sqrt_of_zero_loss()
    assert not hasattr(loss.grad_fn, "_anomaly_origin")
    loss.backward()
    assert np.isnan(x.grad.numpy()[1])


def test_check_nan_false_records_but_does_not_check():
    with gw.autograd.detect_anomaly(check_nan=False):
        assert gw.autograd.is_anomaly_enabled()
        assert not gw.autograd.is_anomaly_check_nan_enabled()
        x, loss = _sqrt_of_zero_loss()
        assert loss.grad_fn._anomaly_origin is not None
        loss.backward()
    assert np.isnan(x.grad.numpy()[1])
    assert gw.autograd.is_anomaly_check_nan_enabled()


def test_a_node_made_before_anomaly_mode_says_so():
    _, loss = _sqrt_of_zero_loss()
    with gw.autograd.set_detect_anomaly(True):
        with pytest.raises(AnomalyError, match="before anomaly detection was on"):
            loss.backward()


def test_set_detect_anomaly_acts_at_once_and_restores_as_a_context_manager():
    gw.autograd.set_detect_anomaly(True)
    try:
        assert gw.autograd.is_anomaly_enabled()
        with gw.autograd.set_detect_anomaly(False):
            assert not gw.autograd.is_anomaly_enabled()
        assert gw.autograd.is_anomaly_enabled()
    finally:
        gw.autograd.set_detect_anomaly(False)
    with pytest.raises(TypeError, match="bools"):
        gw.autograd.set_detect_anomaly("yes")  # type: ignore[arg-type]


def test_detect_anomaly_as_a_decorator_and_its_warning():
    with pytest.warns(UserWarning, match="Anomaly Detection has been enabled"):
        deco = gw.autograd.detect_anomaly()

    @deco
    def run():
        assert gw.autograd.is_anomaly_enabled()
        _, loss = _sqrt_of_zero_loss()
        loss.backward()

    with pytest.raises(AnomalyError):
        run()
    assert not gw.autograd.is_anomaly_enabled()


def test_the_mode_is_process_wide():
    seen = []
    with gw.autograd.detect_anomaly():
        t = threading.Thread(target=lambda: seen.append(gw.autograd.is_anomaly_enabled()))
        t.start()
        t.join()
    assert seen == [True]


def test_gradients_are_unchanged_under_anomaly_mode():
    x = gw.tensor(np.linspace(0.5, 2.0, 6).reshape(2, 3), dtype=gw.float64, requires_grad=True)
    with gw.autograd.detect_anomaly():
        ((x.exp() * x.sin()).sum() / x.sum()).backward()
        assert gw.autograd.gradcheck(lambda t: (t.exp() * t.sin()).sum() / t.sum(), (x,))
    got = x.grad.numpy().copy()
    x.grad = None
    ((x.exp() * x.sin()).sum() / x.sum()).backward()
    np.testing.assert_array_equal(got, x.grad.numpy())


def test_set_multithreading_enabled_is_recorded_and_backward_still_runs():
    assert gw.autograd.is_multithreading_enabled()
    with gw.autograd.set_multithreading_enabled(False):
        assert not gw.autograd.is_multithreading_enabled()
        x = gw.tensor([1.0, 2.0], requires_grad=True)
        (x * x).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])
    assert gw.autograd.is_multithreading_enabled()
    gw.autograd.set_multithreading_enabled(False)
    assert not gw.autograd.is_multithreading_enabled()
    gw.autograd.set_multithreading_enabled(True)
    with pytest.raises(TypeError, match="bool"):
        gw.autograd.set_multithreading_enabled(1)  # type: ignore[arg-type]
