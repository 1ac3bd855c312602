"""In-place ops through views of tensors in the graph (CopySlices), and views whose storage
was modified in place after they were made."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest
from gradwire.autograd import gradcheck, gradgradcheck


def leaf(values):
    return gw.tensor(values, dtype=gw.float64, requires_grad=True)


def test_copy_into_a_row_of_a_plain_buffer_joins_the_graph():
    w = leaf([1.0, 2.0, 3.0])
    buf = gw.zeros(2, 3, dtype=gw.float64)
    buf[0].copy_(w)
    assert buf.requires_grad and buf.grad_fn.name() == "CopySlices"
    (buf * buf).sum().backward()
    assert w.grad.tolist() == [2.0, 4.0, 6.0]


def test_setitem_on_a_view_routes_gradients_to_the_value_and_the_rest():
    x = leaf([1.0, 2.0, 3.0])
    a = gw.zeros(2, 3, dtype=gw.float64)
    a[1][2] = x[0] * 4
    a[0] = x
    (a**2).sum().backward()
    assert x.grad.tolist() == [34.0, 4.0, 6.0]  # 2*x0 + 2*(4*x0)*4


def test_in_place_multiply_through_a_slice_of_a_non_leaf():
    w = leaf([1.0, 2.0, 3.0])
    a = w * 1
    a[1:].mul_(2)
    assert a.tolist() == [1.0, 4.0, 6.0]
    a.sum().backward()
    assert w.grad.tolist() == [1.0, 2.0, 2.0]


def test_view_made_before_its_base_changed_in_place_sees_the_change():
    x = leaf([1.0, 2.0])
    a = x * 1
    v = a[0:1]
    a.mul_(3)
    v.sum().backward()
    assert x.grad.tolist() == [3.0, 0.0]


def test_sibling_views_take_the_history_of_an_in_place_op_through_another_view():
    x = leaf([1.0, 2.0, 3.0, 4.0])
    a = x * 1
    first_half = a[:2]
    square = a.view(2, 2)
    first_half.mul_(10)
    (square * square).sum().backward()
    assert x.grad.tolist() == [200.0, 400.0, 6.0, 8.0]


def test_chained_views_and_in_place_ops_pass_gradcheck_and_gradgradcheck():
    def f(x):
        a = x * 1
        a.view(2, 2).t()[0].add_(x[:2] * 5)
        a.view(2, 2)[:, 1].mul_(x[2:])
        return a.exp()

    x = leaf([0.1, 0.2, -0.3, 0.4])
    assert gradcheck(f, (x,))
    assert gradgradcheck(f, (x,))


def test_in_place_through_a_view_of_a_leaf_that_requires_grad_is_an_error():
    x = leaf([1.0, 2.0])
    with pytest.raises(RuntimeError, match="view of a leaf Variable that requires grad"):
        x[0:1].add_(1)
    with gw.no_grad():
        x[0:1].add_(1)  # fine when not recording
    assert x.tolist() == [2.0, 2.0]


def test_in_place_into_an_expanded_view_is_a_clear_error():
    w = leaf([1.0, 2.0, 3.0])
    buf = gw.zeros(3, dtype=gw.float64)
    with pytest.raises(RuntimeError, match="cannot record this in-place operation on a view"):
        buf.expand(2, 3).add_(w)


def test_in_place_on_a_view_bumps_the_base_version_and_fails_a_saved_base():
    x = leaf([1.0, 2.0, 3.0])
    a = x * 1
    y = a.sin()  # saves a
    a[0:1].mul_(2)
    with pytest.raises(RuntimeError, match="is at version 1; expected version 0"):
        y.sum().backward()


def test_no_grad_in_place_on_a_view_keeps_values_consistent():
    x = leaf([1.0, 2.0])
    a = x * 2
    v = a[1:]
    with gw.no_grad():
        v.fill_(0.0)
    assert a.tolist() == [2.0, 0.0]
    np.testing.assert_array_equal(a.detach().numpy(), [2.0, 0.0])


def test_augmented_assignment_through_indexing_passes_gradcheck():
    def f(x, w):
        y = x * 1
        y[0:2] += w  # basic index: in place through a view
        y[[3, 2]] += w  # integer-array index: a copy, then setitem
        y[1] *= w[0]
        y[y.detach() > 0.5] = 0.25  # mask setitem
        return y * y

    rng = np.random.default_rng(3)
    x = leaf(rng.standard_normal(4))
    w = leaf(rng.standard_normal(2))
    assert gradcheck(f, (x, w))
    assert gradgradcheck(f, (x, w))


def test_same_shape_reshape_of_a_plain_buffer_is_a_recordable_view():
    w = leaf([1.0, 2.0, 3.0])
    buf = gw.zeros(3, dtype=gw.float64)
    buf.reshape(3).copy_(w)
    (buf * buf).sum().backward()
    assert w.grad.tolist() == [2.0, 4.0, 6.0]
