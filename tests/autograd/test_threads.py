"""Multithreaded backward: separate graphs are independent; a shared graph is freed once."""

from __future__ import annotations

import threading

import gradwire as gw
import numpy as np


def run_threads(target, n):
    errors = []

    def wrapped(i):
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return errors


def train_fn_grad():
    # The seed's train_fn: forward, then backward on its own graph.
    x = gw.ones(5, 5, requires_grad=True)
    y = (x + 3) * (x + 4) * 0.5
    y.sum().backward()
    return x.grad.numpy().copy()


def test_concurrent_backward_on_separate_graphs_matches_single_thread():
    expected = train_fn_grad()
    np.testing.assert_allclose(expected, np.full((5, 5), 4.5))  # d/dx (x+3)(x+4)/2 = x + 3.5
    results = [None] * 10
    barrier = threading.Barrier(10)

    def worker(i):
        barrier.wait()
        for _ in range(20):
            results[i] = train_fn_grad()

    assert run_threads(worker, 10) == []
    for r in results:
        np.testing.assert_array_equal(r, expected)


def test_concurrent_autograd_grad_with_create_graph_on_separate_graphs():
    results = {}

    def worker(i):
        x = gw.tensor([float(i + 1)], dtype=gw.float64, requires_grad=True)
        for _ in range(10):
            (g,) = gw.autograd.grad(x**3, x, create_graph=True)
            (gg,) = gw.autograd.grad(g, x)
        results[i] = (g.item(), gg.item())

    assert run_threads(worker, 8) == []
    assert results == {i: (3.0 * (i + 1) ** 2, 6.0 * (i + 1)) for i in range(8)}


def test_shared_leaf_accumulates_every_threads_gradient():
    w = gw.ones(3, requires_grad=True)
    barrier = threading.Barrier(8)

    def worker(i):
        barrier.wait()
        for _ in range(25):
            (w * 2).sum().backward()

    assert run_threads(worker, 8) == []
    assert w.grad.tolist() == [400.0, 400.0, 400.0]


def _race_backward_over_a_shared_graph(n_threads):
    x = gw.ones(4, 4, dtype=gw.float64, requires_grad=True)
    shared = (x * 2).exp()  # first part of the graph, built in one thread
    barrier = threading.Barrier(n_threads)
    ok, freed = [], []

    def worker(i):
        y = (shared * 3).sum()  # second part, per thread
        barrier.wait()
        try:
            y.backward()
            ok.append(i)
        except RuntimeError as exc:
            assert "retain_graph=True" in str(exc)
            freed.append(i)

    assert run_threads(worker, n_threads) == []
    return x, ok, freed


def test_shared_graph_without_retain_graph_one_thread_wins_the_others_get_the_freed_error():
    for _ in range(10):
        x, ok, freed = _race_backward_over_a_shared_graph(4)
        assert len(ok) == 1 and len(freed) == 3
        # The one successful pass is the whole gradient: nothing half-written or doubled.
        np.testing.assert_allclose(x.grad.numpy(), np.full((4, 4), 6 * np.exp(2.0)))


def test_shared_graph_with_retain_graph_every_thread_contributes():
    x = gw.ones(3, dtype=gw.float64, requires_grad=True)
    shared = (x * 2).exp()
    barrier = threading.Barrier(4)

    def worker(i):
        y = (shared * 3).sum()
        barrier.wait()
        y.backward(retain_graph=True)

    assert run_threads(worker, 4) == []
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 4 * 6 * np.exp(2.0)))
