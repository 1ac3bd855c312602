"""Custom ``gradwire.autograd.Function``: ctx, saved tensors, dirty and non-differentiable outputs."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest
from gradwire.autograd import Function, gradcheck, gradgradcheck, once_differentiable


class ScaledExp(Function):
    """y = k * exp(x), with k a non-tensor argument."""

    @staticmethod
    def forward(ctx, x, k):
        y = x.exp() * k
        ctx.save_for_backward(y)
        ctx.k = k
        ctx.seen_needs = ctx.needs_input_grad
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y, None


class MulPair(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        ctx.needs = ctx.needs_input_grad
        return a * b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga = g * b if ctx.needs_input_grad[0] else None
        gb = g * a if ctx.needs_input_grad[1] else None
        return ga, gb


def test_apply_records_a_node_named_after_the_function():
    x = gw.randn(3, dtype=gw.float64, requires_grad=True)
    y = ScaledExp.apply(x, 2.0)
    assert y.grad_fn.name() == "ScaledExpBackward"
    assert y.grad_fn.seen_needs == (True, False)
    ((acc, _),) = y.grad_fn.next_functions
    assert acc.variable is x
    np.testing.assert_allclose(y.detach().numpy(), 2 * np.exp(x.detach().numpy()))


def test_custom_function_gradients_pass_gradcheck_and_gradgradcheck():
    x = gw.randn(3, dtype=gw.float64, requires_grad=True)
    assert gradcheck(lambda t: ScaledExp.apply(t, 2.0), (x,))
    assert gradgradcheck(lambda t: ScaledExp.apply(t, 2.0), (x,))
    a = gw.randn(2, 3, dtype=gw.float64, requires_grad=True)
    b = gw.randn(2, 3, dtype=gw.float64, requires_grad=True)
    assert gradcheck(MulPair.apply, (a, b))


def test_needs_input_grad_reflects_which_inputs_require_grad():
    a = gw.ones(2, requires_grad=True)
    b = gw.ones(2)
    y = MulPair.apply(a, b)
    assert y.grad_fn.needs == (True, False)
    y.sum().backward()
    assert a.grad.tolist() == [1.0, 1.0] and b.grad is None


def test_forward_runs_without_recording():
    class Probe(Function):
        @staticmethod
        def forward(ctx, x):
            y = x * 2
            ctx.inner_recorded = y.requires_grad
            return y

        @staticmethod
        def backward(ctx, g):
            return g * 2

    y = Probe.apply(gw.ones(2, requires_grad=True))
    assert y.grad_fn.inner_recorded is False and y.grad_fn.name() == "ProbeBackward"


def test_saved_tensors_are_freed_after_backward():
    x = gw.randn(3, requires_grad=True)
    y = ScaledExp.apply(x, 1.0)
    y.sum().backward()
    with pytest.raises(RuntimeError, match="second time"):
        _ = y.grad_fn.saved_tensors
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        y.sum().backward()


def test_saved_input_modified_in_place_is_detected():
    x = gw.randn(3, requires_grad=True)
    h = x * 1
    y = MulPair.apply(h, h)
    with gw.no_grad():
        h.add_(1)
    with pytest.raises(RuntimeError, match="is at version 1; expected version 0"):
        y.sum().backward()


def test_save_for_backward_rejects_non_tensors():
    class Bad(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(3)
            return x * 1

    with pytest.raises(TypeError, match="save_for_backward can only save tensors"):
        Bad.apply(gw.ones(1, requires_grad=True))


def test_wrong_number_of_gradients_is_an_error():
    class TooFew(Function):
        @staticmethod
        def forward(ctx, a, b):
            return a + b

        @staticmethod
        def backward(ctx, g):
            return (g,)

    y = TooFew.apply(gw.ones(1, requires_grad=True), gw.ones(1, requires_grad=True))
    with pytest.raises(RuntimeError, match="incorrect number of gradients"):
        y.sum().backward()


def test_mark_dirty_makes_the_input_take_the_new_history():
    class AddOneInPlace(Function):
        @staticmethod
        def forward(ctx, x):
            x.add_(1)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 3  # distinctive, to see that this node ran

    x = gw.tensor([1.0, 2.0], requires_grad=True)
    h = x * 1
    v0 = h._version
    out = AddOneInPlace.apply(h)
    assert out is h and h.grad_fn.name() == "AddOneInPlaceBackward"
    assert h._version == v0 + 1 and h.tolist() == [2.0, 3.0]
    h.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        AddOneInPlace.apply(gw.ones(2, requires_grad=True))


def test_mark_non_differentiable_outputs_get_no_grad_and_argsort_backward_works():
    class SortWithIndex(Function):
        @staticmethod
        def forward(ctx, x):
            idx = gw.tensor(np.argsort(x.detach().numpy()))
            ctx.mark_non_differentiable(idx)
            ctx.save_for_backward(idx)
            return x[idx], idx

        @staticmethod
        def backward(ctx, g, g_idx):
            (idx,) = ctx.saved_tensors
            out = gw.zeros_like(g)
            out[idx] = g
            return out

    x = gw.tensor([3.0, 1.0, 2.0], requires_grad=True)
    values, idx = SortWithIndex.apply(x)
    assert values.requires_grad and not idx.requires_grad
    assert values.tolist() == [1.0, 2.0, 3.0] and idx.tolist() == [1, 2, 0]
    (values * gw.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert x.grad.tolist() == [3.0, 1.0, 2.0]


def test_unused_output_gets_zeros_materialized():
    class Two(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, x * 3

        @staticmethod
        def backward(ctx, g1, g2):
            assert g2 is not None and g2.tolist() == [0.0, 0.0]
            return g1 * 2 + g2 * 3

    x = gw.ones(2, requires_grad=True)
    a, _ = Two.apply(x)
    a.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


def test_apply_under_no_grad_records_nothing():
    x = gw.ones(2, requires_grad=True)
    with gw.no_grad():
        y = ScaledExp.apply(x, 1.0)
    assert not y.requires_grad and y.grad_fn is None


def test_backward_is_differentiable_by_default():
    class Cube(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x**3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * x * x * g

    x = gw.tensor([2.0], requires_grad=True)
    (g,) = gw.autograd.grad(Cube.apply(x), x, create_graph=True)
    (gg,) = gw.autograd.grad(g, x)
    assert g.item() == 12.0 and gg.item() == 12.0


def test_once_differentiable_runs_backward_without_recording_and_refuses_double_backward():
    class Square(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @once_differentiable
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            assert not gw.is_grad_enabled()
            return 2 * x * g

    x = gw.tensor([3.0], requires_grad=True)
    Square.apply(x).sum().backward()
    assert x.grad.tolist() == [6.0]
    y = Square.apply(x) * x  # the gradient flowing into Square's backward requires grad
    (g,) = gw.autograd.grad(y, x, create_graph=True)
    assert g.item() == 27.0
    with pytest.raises(RuntimeError, match="once_differentiable"):
        g.sum().backward()
