"""no_grad, enable_grad, set_grad_enabled, inference_mode: context managers, decorators, threads."""

from __future__ import annotations

import threading

import gradwire as gw
import pytest


@pytest.fixture
def x():
    return gw.ones(2, requires_grad=True)


def test_no_grad_block_records_nothing_and_restores(x):
    assert gw.is_grad_enabled()
    with gw.no_grad():
        assert not gw.is_grad_enabled()
        y = x * 2
    assert gw.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None
    assert (x * 2).requires_grad


def test_no_grad_restores_the_mode_after_an_exception():
    with pytest.raises(ValueError):
        with gw.no_grad():
            raise ValueError
    assert gw.is_grad_enabled()


def test_enable_grad_inside_no_grad(x):
    with gw.no_grad():
        with gw.enable_grad():
            y = x * 2
        z = x * 2
    assert y.requires_grad and not z.requires_grad


@pytest.mark.parametrize("decorate", [lambda f: gw.no_grad()(f), lambda f: gw.no_grad(f)])
def test_no_grad_as_decorator_with_and_without_parentheses(x, decorate):
    @decorate
    def f(t):
        """Doc."""
        return t * 2, gw.is_grad_enabled()

    y, enabled = f(x)
    assert not y.requires_grad and not enabled
    assert gw.is_grad_enabled()
    assert f.__doc__ == "Doc."


def test_enable_grad_as_decorator(x):
    @gw.enable_grad
    def f(t):
        return t * 2

    with gw.no_grad():
        assert f(x).requires_grad


def test_set_grad_enabled_as_function_context_and_decorator(x):
    gw.set_grad_enabled(False)
    try:
        assert not gw.is_grad_enabled() and not (x * 2).requires_grad
    finally:
        gw.set_grad_enabled(True)
    assert gw.is_grad_enabled()
    with gw.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert gw.is_grad_enabled()
    with gw.no_grad():
        with gw.set_grad_enabled(True):
            assert (x * 2).requires_grad
        assert not gw.is_grad_enabled()

    @gw.set_grad_enabled(False)
    def f():
        return gw.is_grad_enabled()

    assert gw.is_grad_enabled()  # decorating does not switch the mode
    assert f() is False and gw.is_grad_enabled()
    with pytest.raises(TypeError):
        gw.set_grad_enabled("yes")


def test_autograd_namespace_exports_the_same_modes():
    assert gw.autograd.no_grad is gw.no_grad
    assert gw.autograd.set_grad_enabled is gw.set_grad_enabled
    assert gw.autograd.inference_mode is gw.inference_mode


def test_grad_mode_is_thread_local(x):
    seen = {}

    def probe():
        seen["enabled"] = gw.is_grad_enabled()
        seen["records"] = (x * 2).requires_grad

    with gw.no_grad():
        t = threading.Thread(target=probe)
        t.start()
        t.join()
        assert not gw.is_grad_enabled()
    assert seen == {"enabled": True, "records": True}


def test_no_grad_in_one_thread_does_not_leak_into_another(x):
    inside, release = threading.Event(), threading.Event()

    def hold_no_grad():
        with gw.no_grad():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=hold_no_grad)
    t.start()
    inside.wait(10)
    try:
        assert gw.is_grad_enabled() and (x * 2).requires_grad
    finally:
        release.set()
        t.join()


# ------------------------------------------------------------------ inference mode
def test_inference_mode_records_nothing(x):
    with gw.inference_mode():
        assert gw.is_inference_mode_enabled() and not gw.is_grad_enabled()
        y = x * 2
        z = gw.ones(2)
    assert not gw.is_inference_mode_enabled() and gw.is_grad_enabled()
    assert not y.requires_grad and y.is_inference() and z.is_inference()
    assert not x.is_inference() and not (x * 2).is_inference()


def test_inference_tensors_cannot_join_autograd_later(x):
    with gw.inference_mode():
        y = x * 2
        z = gw.ones(2)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        _ = y * x
    with pytest.raises(RuntimeError, match="inference tensor outside InferenceMode"):
        z.requires_grad_()
    with pytest.raises(
        RuntimeError, match="Inplace update to inference tensor outside InferenceMode"
    ):
        z.add_(1)
    # Ops that do not record are fine, and a clone is a normal tensor.
    assert (z * 2).tolist() == [2.0, 2.0]
    w = z.clone()
    assert not w.is_inference()
    (w * x).sum().backward()
    assert x.grad.tolist() == [1.0, 1.0]


def test_inference_mode_false_is_a_no_op_and_decorators_work(x):
    with gw.inference_mode(False):
        assert (x * 2).requires_grad

    @gw.inference_mode
    def bare():
        return gw.is_inference_mode_enabled()

    @gw.inference_mode()
    def called():
        return (x * 2).requires_grad

    assert bare() is True and called() is False
    assert not gw.is_inference_mode_enabled()


def test_enable_grad_does_not_escape_inference_mode(x):
    with gw.inference_mode():
        with gw.enable_grad():
            assert not (x * 2).requires_grad


def test_inference_mode_is_thread_local():
    seen = {}
    with gw.inference_mode():
        t = threading.Thread(target=lambda: seen.update(inf=gw.is_inference_mode_enabled()))
        t.start()
        t.join()
    assert seen == {"inf": False}


def test_inference_tensor_may_feed_an_op_that_does_not_save_it(x):
    # As in PyTorch: only saving an inference tensor for backward is forbidden.
    with gw.inference_mode():
        a = gw.ones(2)
    y = a + x
    assert not y.is_inference() and y.requires_grad
    y.sum().backward()
    assert x.grad.tolist() == [1.0, 1.0]
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        _ = a * x
