"""Saved tensors: ``_saved_*`` introspection, freeing after backward, version checks and hooks."""

from __future__ import annotations

import threading

import gradwire as gw
import numpy as np
import pytest
from gradwire.autograd.graph import saved_tensors_hooks

FREED = "Trying to backward through the graph a second time"


# ------------------------------------------------------------------ introspection
def test_pow_saves_its_input_as_the_same_object():
    x = gw.randn(5, requires_grad=True)
    y = x.pow(2)
    assert x.equal(y.grad_fn._saved_self)
    assert x is y.grad_fn._saved_self
    assert y.grad_fn._saved_exponent == 2


def test_exp_saves_its_result_as_a_new_object_on_the_same_storage():
    x = gw.randn(5, requires_grad=True)
    y = x.exp()
    saved = y.grad_fn._saved_result
    assert y.equal(saved)
    assert y is not saved
    assert np.shares_memory(saved._data, y._data)
    assert saved.grad_fn is y.grad_fn  # unpacked with the output's history


def test_mul_saves_both_operands_and_unknown_names_raise():
    a, b = gw.randn(3, requires_grad=True), gw.randn(3, requires_grad=True)
    y = a * b
    assert y.grad_fn._saved_self is a and y.grad_fn._saved_other is b
    with pytest.raises(AttributeError):
        _ = y.grad_fn._saved_nonexistent


def test_saved_tensors_are_freed_after_backward():
    x = gw.randn(3, requires_grad=True)
    y = x.exp()
    raw = y.grad_fn._raw_saved_result
    y.sum().backward()
    with pytest.raises(RuntimeError, match=FREED):
        _ = y.grad_fn._saved_result
    assert raw._data is None and raw._tensor is None  # the buffer is really dropped


def test_retain_graph_keeps_saved_tensors():
    x = gw.randn(3, requires_grad=True)
    y = x.exp()
    y.sum().backward(retain_graph=True)
    assert y.grad_fn._saved_result.equal(y)


def test_second_backward_error_tells_the_user_to_retain_the_graph():
    x = gw.randn(3, requires_grad=True)
    loss = (x * x).sum()
    loss.backward()
    with pytest.raises(RuntimeError) as info:
        loss.backward()
    assert "retain_graph=True" in str(info.value) and "second time" in str(info.value)


# ------------------------------------------------------------------ version counters
def test_modifying_a_saved_input_in_place_fails_backward_with_both_versions():
    x = gw.randn(3, requires_grad=True)
    h = x * 1
    y = h * h  # saves h at version 0
    h.add_(1)
    with pytest.raises(
        RuntimeError, match=r"modified by an inplace operation.*is at version 1; expected version 0"
    ):
        y.sum().backward()


def test_modifying_a_saved_output_in_place_is_detected():
    x = gw.randn(3, requires_grad=True)
    y = x.exp()  # saves its result
    z = y * 1
    y.mul_(2)
    with pytest.raises(RuntimeError, match="is at version 1; expected version 0"):
        z.sum().backward()


def test_in_place_on_a_tensor_nobody_saved_is_fine_and_correct():
    x = gw.tensor([1.0, 2.0], requires_grad=True)
    h = x * 2  # MulBackward0 with a constant saves nothing about h
    y = h + 1  # AddBackward0 saves no tensor
    h.add_(10)
    y.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda t: t.add_(1),
        lambda t: t.sub_(1),
        lambda t: t.mul_(2),
        lambda t: t.div_(2),
        lambda t: t.zero_(),
        lambda t: t.fill_(3.0),
        lambda t: t.copy_(gw.ones(3)),
        lambda t: t.__setitem__(0, 5.0),
        lambda t: t[1:].add_(1),
        lambda t: t.detach().add_(1),
    ],
)
def test_every_in_place_path_bumps_the_version_seen_by_saved_tensors(mutate):
    x = gw.randn(3, requires_grad=True)
    h = x * 1
    y = h.sin()  # saves h
    with gw.no_grad():
        mutate(h)
    with pytest.raises(RuntimeError, match="is at version 1; expected version 0"):
        y.sum().backward()


def test_leaf_that_requires_grad_cannot_be_modified_in_place():
    x = gw.ones(3, requires_grad=True)
    for op in (
        lambda: x.add_(1),
        lambda: x.mul_(2),
        lambda: x.zero_(),
        lambda: x.fill_(1.0),
        lambda: x.copy_(gw.zeros(3)),
        lambda: x.__setitem__(0, 2.0),
    ):
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            op()
    with gw.no_grad():
        x.add_(1)  # allowed when not recording (optimizer steps)
    assert x.tolist() == [2.0, 2.0, 2.0] and x.is_leaf


def test_in_place_ops_on_non_leaves_are_differentiable():
    x = gw.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    y.mul_(x)  # y = 2x * x
    y.add_(1)
    assert y.grad_fn.name() == "AddBackward0"
    y.sum().backward()
    assert x.grad.tolist() == [4.0, 8.0, 12.0]


def test_setitem_on_a_non_leaf_routes_gradients():
    x = gw.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = gw.tensor(7.0, requires_grad=True)
    y = x * 2
    y[1] = w
    (y * y).sum().backward()
    assert x.grad.tolist() == [8.0, 0.0, 24.0] and w.grad.item() == 14.0


def test_copy_into_a_plain_tensor_attaches_it_to_the_graph():
    x = gw.tensor([1.0, 2.0], requires_grad=True)
    buf = gw.zeros(2)
    buf.copy_(x * 3)
    assert buf.requires_grad and not buf.is_leaf
    buf.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


# ------------------------------------------------------------------ register_hooks
def _recording_hooks(log):
    def pack(t):
        log.append("pack")
        return t.detach().numpy().copy()

    def unpack(arr):
        log.append("unpack")
        return gw.from_numpy(arr)

    return pack, unpack


def test_register_hooks_packs_at_once_and_unpacks_per_use():
    x = gw.randn(5, requires_grad=True)
    y = x.pow(2)
    log = []
    y.grad_fn._raw_saved_self.register_hooks(*_recording_hooks(log))
    assert log == ["pack"]
    assert y.grad_fn._saved_self.equal(x)
    assert log == ["pack", "unpack"]
    y.sum().backward()
    assert log == ["pack", "unpack", "unpack"]
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.detach().numpy(), rtol=1e-6)


def test_register_hooks_content_is_what_backward_uses():
    x = gw.tensor([1.0, 2.0], requires_grad=True)
    y = x.pow(2)
    # The unpack hook's content is what counts: backward sees 10 * x.
    y.grad_fn._raw_saved_self.register_hooks(lambda t: t.detach() * 10, lambda t: t)
    y.sum().backward()
    assert x.grad.tolist() == [20.0, 40.0]


def test_register_hooks_twice_is_an_error():
    y = gw.randn(3, requires_grad=True).pow(2)
    raw = y.grad_fn._raw_saved_self
    raw.register_hooks(lambda t: t, lambda t: t)
    with pytest.raises(RuntimeError, match="only be called once"):
        raw.register_hooks(lambda t: t, lambda t: t)


def test_register_hooks_after_release_is_an_error():
    y = gw.randn(3, requires_grad=True).pow(2)
    raw = y.grad_fn._raw_saved_self
    y.sum().backward()
    with pytest.raises(RuntimeError, match=FREED):
        raw.register_hooks(lambda t: t, lambda t: t)


def test_register_hooks_needs_callables():
    y = gw.randn(3, requires_grad=True).pow(2)
    with pytest.raises(TypeError):
        y.grad_fn._raw_saved_self.register_hooks(1, 2)


# ------------------------------------------------------------------ saved_tensors_hooks
def test_default_hooks_pack_once_per_saved_tensor_and_unpack_per_use():
    log = []
    with saved_tensors_hooks(*_recording_hooks(log)):
        x = gw.randn(3, requires_grad=True)
        y = x * x  # saves self and other
    assert log == ["pack", "pack"]
    # With hooks, unpacking makes new tensor objects with the same content.
    unpacked = y.grad_fn._saved_self
    assert unpacked is not x and unpacked.equal(x)
    assert log.count("unpack") == 1
    y.sum().backward()
    assert log.count("unpack") == 3 and log.count("pack") == 2
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.detach().numpy(), rtol=1e-6)


def test_default_hooks_apply_only_inside_the_block():
    log = []
    with saved_tensors_hooks(*_recording_hooks(log)):
        pass
    x = gw.randn(3, requires_grad=True)
    (x * x).sum().backward()
    assert log == []


def test_default_hooks_nest_innermost_wins():
    outer, inner = [], []
    with saved_tensors_hooks(*_recording_hooks(outer)):
        with saved_tensors_hooks(*_recording_hooks(inner)):
            x = gw.randn(3, requires_grad=True)
            _ = x.exp()
    assert inner == ["pack"] and outer == []


def test_default_hooks_are_thread_local():
    log, other_thread = [], []

    def work():
        x = gw.randn(3, requires_grad=True)
        (x * x).sum().backward()
        other_thread.append(True)

    with saved_tensors_hooks(*_recording_hooks(log)):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    assert other_thread == [True] and log == []


def test_pack_hook_modifying_its_input_in_place_is_an_error():
    def bad_pack(t):
        t.add_(1)
        return t

    x = gw.randn(3, requires_grad=True)
    h = x * 1
    with saved_tensors_hooks(bad_pack, lambda t: t):
        with pytest.raises(RuntimeError, match="pack hook is modifying its input in place"):
            _ = h.sin()


def test_disable_saved_tensors_hooks_forbids_them():
    from gradwire.autograd.graph import disable_saved_tensors_hooks

    with disable_saved_tensors_hooks("no hooks here"):
        with pytest.raises(RuntimeError, match="no hooks here"):
            with saved_tensors_hooks(lambda t: t, lambda t: t):
                pass


def test_identity_hooks_unpack_new_objects_that_share_storage():
    with saved_tensors_hooks(lambda t: t, lambda t: t):
        x = gw.randn(5, requires_grad=True)
        y = x * x
    s, o = y.grad_fn._saved_self, y.grad_fn._saved_other
    assert s is not x and o is not x and s is not o
    assert np.shares_memory(s._data, x._data) and np.shares_memory(o._data, x._data)


def test_default_hooks_also_apply_to_custom_function_saves():
    log = []

    class Square(gw.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            ctx.save_for_backward(t)
            return t * t

        @staticmethod
        def backward(ctx, g):
            (t,) = ctx.saved_tensors
            return 2 * t * g

    with saved_tensors_hooks(*_recording_hooks(log)):
        x = gw.tensor([3.0], requires_grad=True)
        y = Square.apply(x)
    assert log == ["pack"]
    y.sum().backward()
    assert log == ["pack", "unpack"] and x.grad.tolist() == [6.0]


def test_overwriting_ops_ignore_old_inf_and_nan_values():
    # The old contents must not leak into the result (e.g. through old * 0 = nan).
    x = gw.tensor([1.0, 2.0, 3.0], requires_grad=True)
    junk = [float("inf"), float("nan"), -float("inf")]
    buf = gw.tensor(junk)
    buf.copy_(x)
    assert buf.tolist() == [1.0, 2.0, 3.0] and buf.grad_fn.name() == "CopyBackwards"
    (buf * buf).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]
    y = gw.tensor(junk) * x
    y.zero_()
    assert y.tolist() == [0.0, 0.0, 0.0] and y.grad_fn.name() == "ZeroBackward0"
    z = gw.tensor(junk) * x
    z.fill_(2.5)
    assert z.tolist() == [2.5, 2.5, 2.5] and z.grad_fn.name() == "FillBackward0"
    x.grad = None
    w = gw.tensor(junk)
    w.fill_(x.sum())
    w.sum().backward()
    assert w.tolist() == [6.0, 6.0, 6.0] and x.grad.tolist() == [3.0, 3.0, 3.0]
