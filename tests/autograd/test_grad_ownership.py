"""``.grad`` may take the engine's gradient buffer without a copy, but never one that anything
else can still see: accumulating into ``.grad`` later must not change any other tensor."""

from __future__ import annotations

import gradwire as gw
import numpy as np


def _leaf() -> gw.Tensor:
    return gw.ones(3, requires_grad=True)


def test_fresh_gradient_buffer_is_taken_without_copy_and_accumulates():
    z = _leaf()
    (z * 2).sum().backward()
    assert z.grad._data.base is None and z.grad._data.flags.owndata
    (z * 3).sum().backward()
    np.testing.assert_array_equal(z.grad.numpy(), np.full(3, 5.0))


def test_one_gradient_reaching_two_leaves_gives_two_buffers():
    a, b = _leaf(), _leaf()
    (a + b).sum().backward()
    assert not np.shares_memory(a.grad.numpy(), b.grad.numpy())
    (a * 2).sum().backward()
    np.testing.assert_array_equal(b.grad.numpy(), np.ones(3))


def test_user_gradient_is_copied():
    g = gw.ones(3)
    y = _leaf()
    y.backward(g)
    assert not np.shares_memory(y.grad.numpy(), g.numpy())
    y.backward(g)
    np.testing.assert_array_equal(g.numpy(), np.ones(3))


def test_gradient_kept_by_a_hook_is_copied():
    q = _leaf()
    seen = []
    q.register_hook(seen.append)
    (q * 3).sum().backward()
    (q * 3).sum().backward()
    np.testing.assert_array_equal(seen[0].numpy(), np.full(3, 3.0))


def test_gradient_kept_by_a_non_leaf_hook_or_retain_grad_is_copied():
    h = _leaf()
    kept = []
    m = h * 1.0
    m.register_hook(kept.append)
    m.retain_grad()
    (m + 0.0).sum().backward()
    assert not np.shares_memory(h.grad.numpy(), kept[0].numpy())
    assert not np.shares_memory(h.grad.numpy(), m.grad.numpy())
