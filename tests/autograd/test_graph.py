"""The recorded graph (grad_fn, next_functions, leaves, hooks) and the backward/grad entry points."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest


def leaf(*values):
    return gw.tensor(list(values), requires_grad=True)


# ------------------------------------------------------------------ introspection
def test_leaves_and_non_leaves():
    x = leaf(1.0, 2.0)
    c = gw.tensor([1.0, 2.0])
    y = x * 3
    assert x.is_leaf and x.grad_fn is None and x.requires_grad
    assert c.is_leaf and not c.requires_grad
    assert not y.is_leaf and y.requires_grad and y.grad_fn is not None
    z = c * 3
    assert z.is_leaf and z.grad_fn is None and not z.requires_grad


def test_grad_fn_names():
    x = leaf(1.0, 2.0)
    names = {
        "AddBackward0": x + 1,
        "SubBackward0": x - x,
        "MulBackward0": x * x,
        "DivBackward0": x / 2,
        "PowBackward0": x**2,
        "PowBackward1": x ** gw.tensor([1.0, 2.0]),
        "ExpBackward0": x.exp(),
        "SumBackward0": x.sum(),
        "MeanBackward0": x.mean(),
        "NegBackward0": -x,
        "ViewBackward0": x.view(2, 1),
        "CloneBackward0": x.clone(),
        "ToCopyBackward0": x.to(gw.float64),
        "MaxBackward1": x.max(),
        "MaxBackward0": x.max(0).values,
        "IndexBackward0": x[[0, 0]],
        "CatBackward0": gw.cat([x, x]),
        "StackBackward0": gw.stack([x, x]),
        "MmBackward0": x.view(1, 2) @ x.view(2, 1),
    }
    for name, t in names.items():
        assert t.grad_fn.name() == name, t.grad_fn.name()
    assert f"<{names['MulBackward0'].grad_fn.name()} object" in repr(names["MulBackward0"].grad_fn)


def test_next_functions_point_at_the_inputs_nodes():
    x = leaf(1.0, 2.0)
    y = x * 3
    z = y.sum()
    ((node, nr),) = z.grad_fn.next_functions
    assert node is y.grad_fn and nr == 0
    (acc, _), (const, _) = y.grad_fn.next_functions
    assert acc.name() == "torch::autograd::AccumulateGrad" and acc.variable is x
    assert const is None  # the scalar 3 needs no gradient
    # The same leaf reached twice goes to the same accumulator.
    w = x * x
    assert w.grad_fn.next_functions[0][0] is w.grad_fn.next_functions[1][0]


def test_multi_output_ops_number_their_outputs():
    x = leaf(1.0, 2.0, 3.0, 4.0)
    a, b = x.split(2)
    s = gw.cat([b, a])
    edges = s.grad_fn.next_functions
    assert edges[0][0] is b.grad_fn and edges[1][0] is a.grad_fn


def test_requires_grad_flag_rules():
    x = gw.ones(2)
    assert x.requires_grad_() is x and x.requires_grad
    x.requires_grad_(False)
    assert not x.requires_grad
    x.requires_grad = True
    assert x.requires_grad
    y = x * 2
    with pytest.raises(RuntimeError, match="only change requires_grad flags of leaf variables"):
        y.requires_grad_(False)
    with pytest.raises(RuntimeError, match="floating point and complex"):
        gw.ones(2, dtype=gw.int64).requires_grad_()


def test_ops_on_tensors_without_grad_are_not_recorded():
    a, b = gw.ones(2), gw.ones(2)
    assert (a * b).grad_fn is None
    assert (a * leaf(1.0, 1.0)).grad_fn is not None


def test_detach_cuts_the_graph():
    x = leaf(1.0, 2.0)
    y = (x * 2).detach() * x
    y.sum().backward()
    assert x.grad.tolist() == [2.0, 4.0]  # only the direct x factor contributes


# ------------------------------------------------------------------ backward
def test_scalar_backward_accumulates_into_leaf_grad():
    x = leaf(1.0, 2.0, 3.0)
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]
    assert x.grad.grad_fn is None and not x.grad.requires_grad
    (x * 3).sum().backward()
    assert x.grad.tolist() == [5.0, 7.0, 9.0]  # gradients accumulate


def test_gradient_is_required_for_non_scalar_outputs_and_is_used():
    x = leaf(1.0, 2.0, 3.0)
    y = x * x
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        y.backward()
    y.backward(gw.tensor([1.0, 0.0, 2.0]))
    assert x.grad.tolist() == [2.0, 0.0, 12.0]


def test_gradient_shape_mismatch_is_an_error():
    x = leaf(1.0, 2.0)
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        (x * 2).backward(gw.ones(3))


def test_backward_on_a_tensor_without_grad_is_an_error():
    with pytest.raises(RuntimeError, match="does not require grad"):
        gw.ones(2).sum().backward()


def test_second_backward_needs_retain_graph():
    x = leaf(1.0, 2.0)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert x.grad.tolist() == [4.0, 8.0]
    with pytest.raises(RuntimeError, match="Specify retain_graph=True"):
        y.backward()


def test_graph_without_saved_tensors_can_be_walked_twice():
    # Like PyTorch: only nodes that saved tensors fail on a second walk.
    x = leaf(1.0, 2.0)
    y = (x + 1).sum()
    y.backward()
    y.backward()
    assert x.grad.tolist() == [2.0, 2.0]


def test_backward_with_inputs_only_fills_those():
    x, w = leaf(1.0, 2.0), leaf(3.0, 4.0)
    (x * w).sum().backward(inputs=[x])
    assert x.grad.tolist() == [3.0, 4.0] and w.grad is None
    h = x * 2
    (h * h).sum().backward(inputs=[h])
    assert h.grad.tolist() == [4.0, 8.0]
    with pytest.raises(RuntimeError, match="cannot be empty"):
        (x * 2).sum().backward(inputs=[])


def test_autograd_backward_with_several_roots():
    x = leaf(1.0, 2.0)
    gw.autograd.backward([(x * 2).sum(), x * x], [None, gw.tensor([1.0, 1.0])])
    assert x.grad.tolist() == [4.0, 6.0]


def test_create_graph_makes_grad_differentiable():
    x = leaf(2.0)
    (x**3).sum().backward(create_graph=True)
    gx = x.grad
    assert gx.requires_grad and gx.item() == 12.0
    x.grad = None
    gx.sum().backward()
    assert x.grad.item() == 12.0  # d/dx 3x^2 = 6x


# ------------------------------------------------------------------ autograd.grad
def test_grad_returns_gradients_without_touching_dot_grad():
    x, w = leaf(1.0, 2.0), leaf(3.0, 4.0)
    gx, gw_ = gw.autograd.grad((x * w).sum(), [x, w])
    assert gx.tolist() == [3.0, 4.0] and gw_.tolist() == [1.0, 2.0]
    assert x.grad is None and w.grad is None
    assert not gx.requires_grad


def test_grad_of_an_intermediate_and_with_grad_outputs():
    x = leaf(1.0, 2.0)
    h = x * 3
    y = h * h
    (gh,) = gw.autograd.grad(y, h, grad_outputs=gw.tensor([1.0, 0.5]))
    assert gh.tolist() == [6.0, 6.0]


def test_grad_unused_inputs():
    x, unused = leaf(1.0), leaf(5.0)
    with pytest.raises(RuntimeError, match="allow_unused=True"):
        gw.autograd.grad((x * 2).sum(), [x, unused])
    gx, gu = gw.autograd.grad((x * 2).sum(), [x, unused], allow_unused=True)
    assert gx.tolist() == [2.0] and gu is None
    gx, gu = gw.autograd.grad((x * 2).sum(), [x, unused], materialize_grads=True)
    assert gu.tolist() == [0.0]
    with pytest.raises(RuntimeError, match="does not require grad"):
        gw.autograd.grad((x * 2).sum(), [gw.ones(1)])


def test_higher_order_gradients():
    x = leaf(2.0)
    y = x**4
    (g1,) = gw.autograd.grad(y, x, create_graph=True)
    (g2,) = gw.autograd.grad(g1, x, create_graph=True)
    (g3,) = gw.autograd.grad(g2, x)
    assert (g1.item(), g2.item(), g3.item()) == (32.0, 48.0, 48.0)


def test_hessian_vector_product_through_matmul_and_tanh():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 3))
    x = gw.tensor(rng.standard_normal(3), requires_grad=True)
    A = gw.tensor(a)
    f = (A @ x).tanh().sum()
    (g,) = gw.autograd.grad(f, x, create_graph=True)
    v = gw.tensor([1.0, 0.0, 0.0], dtype=gw.float64)
    (hv,) = gw.autograd.grad((g * v).sum(), x)
    # Analytic Hessian: A^T diag(-2 tanh(u) sech^2(u)) A with u = A x.
    u = a @ x.detach().numpy()
    d = -2 * np.tanh(u) / np.cosh(u) ** 2
    np.testing.assert_allclose(hv.numpy(), (a.T * d) @ a @ np.array([1.0, 0, 0]), rtol=1e-10)


def test_grad_through_a_freed_graph_is_an_error():
    x = leaf(1.0)
    y = x.exp().sum()
    gw.autograd.grad(y, x)
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        gw.autograd.grad(y, x)


# ------------------------------------------------------------------ hooks
def test_leaf_hook_sees_and_can_replace_the_gradient():
    x = leaf(1.0, 2.0)
    seen = []
    handle = x.register_hook(lambda g: seen.append(g.tolist()) or g * 10)
    (x * 3).sum().backward()
    assert seen == [[3.0, 3.0]] and x.grad.tolist() == [30.0, 30.0]
    handle.remove()
    x.grad = None
    (x * 3).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0] and len(seen) == 1


def test_non_leaf_hook_changes_what_flows_upstream():
    x = leaf(1.0, 2.0)
    y = x * 3
    y.register_hook(lambda g: g * 2)
    y.sum().backward()
    assert x.grad.tolist() == [6.0, 6.0]


def test_hook_on_tensor_without_grad_is_an_error():
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        gw.ones(2).register_hook(lambda g: g)


def test_retain_grad_keeps_non_leaf_gradients():
    x = leaf(1.0, 2.0)
    y = x * 3
    z = y * y
    assert y.grad is None
    y.retain_grad()
    assert y.retains_grad and not z.retains_grad
    z.sum().backward()
    assert y.grad.tolist() == [6.0, 12.0]
    assert z.grad is None
    with pytest.raises(RuntimeError, match="requires_grad=False"):
        gw.ones(2).retain_grad()


def test_node_hooks_run_before_and_after_the_node():
    x = leaf(1.0, 2.0)
    y = x * 3
    seen = []
    y.grad_fn.register_prehook(lambda grad_outputs: seen.append(("pre", grad_outputs[0].tolist())))
    y.grad_fn.register_hook(lambda gin, gout: seen.append(("post", gin[0].tolist())))
    y.sum().backward()
    assert seen == [("pre", [1.0, 1.0]), ("post", [3.0, 3.0])]


def test_accumulate_grad_post_hooks_run_once_after_the_gradient_is_in_grad():
    # PyTorch calls them with no outputs and the (summed) input gradient, once per pass.
    x = leaf(1.0, 2.0)
    y = x + x  # both edges lead to the same AccumulateGrad
    acc = y.grad_fn.next_functions[0][0]
    seen = []
    acc.register_hook(lambda outs, ins: seen.append((outs, ins[0].tolist(), x.grad.tolist())))
    handle = acc.register_hook(lambda outs, ins: seen.append("second"))
    y.sum().backward()
    assert seen == [((), [2.0, 2.0], [2.0, 2.0]), "second"]
    handle.remove()
    (x * 1).sum().backward()
    assert seen[2:] == [((), [1.0, 1.0], [3.0, 3.0])]
    # autograd.grad does not run leaves' accumulators, nor their hooks.
    gw.autograd.grad((x * 2).sum(), [x])
    assert len(seen) == 3


def test_assigning_grad_checks_its_shape():
    x = leaf(1.0, 2.0)
    x.grad = gw.tensor([5.0, 5.0])
    assert x.grad.tolist() == [5.0, 5.0]
    with pytest.raises(RuntimeError, match="shape"):
        x.grad = gw.ones(3)


# ------------------------------------------------------------------ x * x and mean
def test_square_gradient_is_two_x_g_and_its_input_hook_sees_the_sum():
    # x * x computes g * x once for both of its inputs (the same tensor); the engine adds them.
    x = leaf(1.5, -2.0, 3.0)
    seen = []
    x.register_hook(lambda g: seen.append(g.numpy().copy()))
    (x * x * gw.tensor([1.0, 10.0, 100.0])).sum().backward()
    expected = 2 * np.array([1.5, -2.0, 3.0]) * np.array([1.0, 10.0, 100.0])
    np.testing.assert_allclose(x.grad.numpy(), expected)
    assert len(seen) == 1  # one accumulated gradient reaches the leaf, as in PyTorch
    np.testing.assert_allclose(seen[0], expected)


def test_square_of_a_tensor_modified_in_place_after_is_an_error():
    x = leaf(1.0, 2.0)
    y = x * 1
    z = y * y
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


def test_square_and_mean_second_order():
    x = gw.tensor([1.5, -2.0, 3.0], dtype=gw.float64, requires_grad=True)
    (g,) = gw.autograd.grad((x * x).mean(), x, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), 2 * x.detach().numpy() / 3)
    (h,) = gw.autograd.grad((g * g).sum(), x)  # d/dx sum((2x/3)^2) = 8x/9
    np.testing.assert_allclose(h.numpy(), 8 * x.detach().numpy() / 9)


@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), ((0, 1), False)])
def test_mean_gradient_is_one_over_count_everywhere(dim, keepdim):
    x = gw.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    out = x.mean() if dim is None else x.mean(dim=dim, keepdim=keepdim)
    out.sum().backward()
    count = 6 if dim is None or dim == (0, 1) else x.shape[dim]
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 1.0 / count))
    x.grad.add_(1)  # the leaf's gradient is its own writable array, not a broadcast view
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 1.0 + 1.0 / count))
