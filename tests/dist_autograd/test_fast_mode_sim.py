"""FAST-mode distributed backward over an in-process cluster (see tests/dist_autograd/sim.py)."""

from __future__ import annotations

import threading

import gradwire as gw
import numpy as np
import pytest
from gradwire._runtime.dist_autograd.engine import ContextError

from .sim import SimCluster


@pytest.fixture
def cluster():
    c = SimCluster(4)
    yield c
    c.close()


def _rand(*shape: int) -> gw.Tensor:
    return gw.randn(*shape, dtype=gw.float64, requires_grad=True)


def _grads(worker, ctx_id, tensors):
    store = worker.container.get(ctx_id).gradients()
    return [store.get(t) for t in tensors]


def test_design_note_example_matches_local_exactly(cluster):
    a = cluster.workers[0]
    t1, t2, t4 = _rand(3, 3), _rand(3, 3), _rand(3, 3)
    ctx = a.container.new_context()
    try:
        t3 = cluster.rpc(0, 1, lambda x, y: x + y, t1, t2)
        loss = (t3 * t4).sum()
        a.engine.backward(ctx.context_id, [loss])
        g1, g2, g4 = _grads(a, ctx.context_id, [t1, t2, t4])
    finally:
        a.container.release(ctx.context_id)
    # the same computation in one process
    l1, l2, l4 = (t.detach().clone().requires_grad_() for t in (t1, t2, t4))
    local = ((l1 + l2) * l4).sum()
    local.backward()
    assert loss.item() == local.item()
    for g, l in ((g1, l1), (g2, l2), (g4, l4)):
        assert np.array_equal(g.numpy(), l.grad.numpy())
    assert t1.grad is None and t4.grad is None  # gradients go to the context, not .grad


def test_chain_over_four_workers_with_nested_calls(cluster):
    a = cluster.workers[0]
    w = [_rand(4) for _ in range(4)]

    def on3(x, w3):
        return (x * w3).tanh()

    def on2(x, w2):
        return cluster.rpc(2, 3, on3, x.sin() * w2, w[3])

    def on1(x, w1):
        return cluster.rpc(1, 2, on2, x.exp() + w1, w[2])

    ctx = a.container.new_context()
    x = _rand(4)
    loss = cluster.rpc(0, 1, on1, x * w[0], w[1]).sum()
    a.engine.backward(ctx.context_id, [loss])
    # w[2] and w[3] are sent by workers 1 and 2 (closures), so their gradients live there.
    got = _grads(a, ctx.context_id, [x, w[0], w[1]])
    got += _grads(cluster.workers[1], ctx.context_id, [w[2]]) + _grads(
        cluster.workers[2], ctx.context_id, [w[3]]
    )
    lx, *lw = (t.detach().clone().requires_grad_() for t in [x, *w])
    ref = (((((lx * lw[0]).exp() + lw[1]).sin() * lw[2]) * lw[3]).tanh()).sum()
    ref.backward()
    for g, l in zip(got, [lx, *lw]):
        np.testing.assert_allclose(g.numpy(), l.grad.numpy(), rtol=1e-12)


def test_unused_rpc_output_finishes_with_exact_gradients(cluster):
    """PyTorch's FAST mode hangs here; gradwire fires unreachable recv functions with zero."""
    a = cluster.workers[0]
    x = _rand(3)
    ctx = a.container.new_context()
    used = cluster.rpc(0, 1, lambda t: t * 2, x)
    cluster.rpc(0, 1, lambda t: t * 3, x)  # result dropped: its recv is unreachable
    cluster.rpc(0, 2, lambda t: (t * 0).sum(), x)  # another worker, also unused
    done = threading.Event()
    err: list[BaseException] = []

    def run():
        try:
            a.engine.backward(ctx.context_id, [used.sum()])
        except BaseException as e:  # noqa: BLE001
            err.append(e)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(10), "distributed backward hung on an unused RPC output"
    assert not err
    (g,) = _grads(a, ctx.context_id, [x])
    np.testing.assert_array_equal(g.numpy(), np.full(3, 2.0))


def test_callee_whose_result_needs_no_grad_still_releases_the_caller(cluster):
    """x goes to worker1 (result not differentiable) and to worker2 (result used): x's
    gradient must still be computed, which needs worker1 to hear of the pass."""
    a = cluster.workers[0]
    x = _rand(2)
    ctx = a.container.new_context()
    cluster.rpc(0, 1, lambda t: t.detach() * 5, x)
    y = cluster.rpc(0, 2, lambda t: t * t, x)
    a.engine.backward(ctx.context_id, [y.sum()])
    (g,) = _grads(a, ctx.context_id, [x])
    np.testing.assert_allclose(g.numpy(), 2 * x.detach().numpy())


def test_gradients_accumulate_over_passes_and_retain_graph(cluster):
    a = cluster.workers[0]
    x = _rand(3)
    ctx = a.container.new_context()
    loss = cluster.rpc(0, 1, lambda t: (t * t).sum(), x)
    a.engine.backward(ctx.context_id, [loss], retain_graph=True)
    a.engine.backward(ctx.context_id, [loss], retain_graph=False)
    (g,) = _grads(a, ctx.context_id, [x])
    np.testing.assert_allclose(g.numpy(), 4 * x.detach().numpy())
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        a.engine.backward(ctx.context_id, [loss])


def test_error_in_remote_backward_names_the_worker(cluster):
    class Boom(gw.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 1

        @staticmethod
        def backward(ctx, g):
            raise ValueError("boom in backward")

    a = cluster.workers[0]
    x = _rand(2)
    ctx = a.container.new_context()
    y = cluster.rpc(0, 1, lambda t: Boom.apply(t), x)
    with pytest.raises(ValueError, match="boom in backward"):
        a.engine.backward(ctx.context_id, [y.sum()])


def test_dead_peer_turns_into_an_error_not_a_hang(cluster):
    a = cluster.workers[0]
    x = _rand(2)
    ctx = a.container.new_context()
    y = cluster.rpc(0, 1, lambda t: t * 2, x)
    cluster.dead.add(1)
    with pytest.raises(ConnectionError, match="worker1"):
        a.engine.backward(ctx.context_id, [y.sum()])


def test_concurrent_gradients_for_one_worker_accumulate(cluster):
    cluster.jitter = 0.002
    a = cluster.workers[0]
    x = _rand(5)
    ctx = a.container.new_context()
    parts = [cluster.rpc(0, 1 + i % 3, lambda t, k=k: t * k, x) for i, k in enumerate(range(1, 13))]
    loss = gw.stack(parts).sum()
    a.engine.backward(ctx.context_id, [loss])
    (g,) = _grads(a, ctx.context_id, [x])
    np.testing.assert_allclose(g.numpy(), np.full(5, float(sum(range(1, 13)))))


def test_contexts_in_many_threads_are_independent(cluster):
    a = cluster.workers[0]
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            ctx = a.container.new_context()
            x = gw.full((3,), float(k), dtype=gw.float64, requires_grad=True)
            y = cluster.rpc(0, 1 + k % 3, lambda t: t * t, x)
            a.engine.backward(ctx.context_id, [y.sum()])
            results[k] = a.container.get(ctx.context_id).gradients()[x].numpy()
            a.container.release(ctx.context_id)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    for k in range(16):
        np.testing.assert_allclose(results[k], np.full(3, 2.0 * k))


def test_context_errors(cluster):
    a = cluster.workers[0]
    ctx = a.container.new_context()
    with pytest.raises(ContextError, match="do not nest"):
        a.container.new_context()
    with pytest.raises(ValueError, match="at least one root"):
        a.engine.backward(ctx.context_id, [])
    with pytest.raises(RuntimeError, match="does not require grad"):
        a.engine.backward(ctx.context_id, [gw.ones(1)])
    with pytest.raises(RuntimeError, match="scalar outputs"):
        a.engine.backward(ctx.context_id, [_rand(3) * 2])
    with pytest.raises(ContextError, match="not known"):
        a.engine.backward(12345, [(_rand(1) * 2).sum()])
    assert ctx.context_id >> 48 == 0
    a.container.release(ctx.context_id)
    with pytest.raises(ContextError, match="released"):
        a.container.get(ctx.context_id)
