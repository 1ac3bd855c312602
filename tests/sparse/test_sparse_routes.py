"""Sparse tensors between real workers on every route: small ones in the call stream, large
values through shared memory (same host) or the bulk lane (TCP, shared memory off); in
arguments, results, RRef values and distributed-autograd gradients, which arrive sparse and
accumulate sparse in the context as PyTorch's do."""

from __future__ import annotations

from typing import Any

import gradwire as gw
import gradwire.distributed.autograd as dist_autograd
import numpy as np
import pytest
from gradwire._wire import bulk, shm
from gradwire.distributed import rpc
from gradwire.distributed.rpc._testing import run_cluster

ROWS, DIM = 50_000, 64
PEER = "worker1"


def _sparse(nnz: int, seed: int) -> gw.Tensor:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, ROWS, size=(1, nnz))
    return gw.sparse_coo_tensor(
        idx, rng.standard_normal((nnz, DIM)).astype(np.float32), (ROWS, DIM)
    )


def _echo(x: Any) -> Any:
    return x


def _make(nnz: int, seed: int) -> gw.Tensor:
    return _sparse(nnz, seed)


def _lookup(table: gw.Tensor, idx: gw.Tensor) -> gw.Tensor:
    """On the peer: rows of the caller's table, with a sparse gradient for it."""
    return gw.nn.functional.embedding(idx, table, sparse=True)


def _route_counts() -> dict[str, int]:
    s, b = shm.stats(), bulk.stats()
    return {"shm": s.get("sent", 0), "bulk": b.get("sent", 0)}


def _same(a: gw.Tensor, b: gw.Tensor) -> None:
    assert a.is_sparse and b.is_sparse and a.shape == b.shape
    np.testing.assert_array_equal(a._indices().numpy(), b._indices().numpy())
    np.testing.assert_array_equal(a._values().numpy(), b._values().numpy())


def _body(rank: int, world: int, route: str) -> dict[str, Any]:
    if rank != 0:
        return {}
    out: dict[str, Any] = {}
    small, large = _sparse(10, 1), _sparse(4096, 2)  # values: 2.5 KiB and 1 MiB
    before = _route_counts()
    _same(rpc.rpc_sync(PEER, _echo, (small,)), small)
    out["small"] = {k: _route_counts()[k] - v for k, v in before.items()}
    before = _route_counts()
    _same(rpc.rpc_sync(PEER, _echo, (large,)), large)
    out["large"] = {k: _route_counts()[k] - v for k, v in before.items()}
    # an RRef's value, made on the peer
    _same(rpc.remote(PEER, _make, (4096, 3)).to_here(), _sparse(4096, 3))
    # a gradient crossing back in a distributed backward: sparse, accumulated sparse
    table = gw.randn(ROWS, DIM, requires_grad=True)
    idx = gw.tensor([[5, 9, 5], [ROWS - 1, 0, 9]])
    with dist_autograd.context() as ctx:
        for _ in range(2):
            rows = rpc.rpc_sync(PEER, _lookup, (table, idx))
            dist_autograd.backward(ctx, [rows.sum()])
        grad = dist_autograd.get_gradients(ctx)[table]
        out["grad_sparse"] = grad.is_sparse
        dense = grad.to_dense().numpy()
    expected = np.zeros((ROWS, DIM), np.float32)
    np.add.at(expected, idx.numpy().reshape(-1), 2.0)
    np.testing.assert_array_equal(dense, expected)
    return out


@pytest.mark.parametrize(
    ("route", "options"),
    [
        ("shm", {}),
        ("bulk", {"use_unix_socket": False, "shm_transfer": False}),
        ("stream", {"use_unix_socket": False, "shm_transfer": False, "bulk_transfer": False}),
    ],
)
def test_sparse_tensors_take_every_route_and_arrive_equal(
    route: str, options: dict[str, Any]
) -> None:
    results = run_cluster(2, _body, route, options=options, timeout=120)
    got = results[0].value
    assert got["grad_sparse"] is True
    assert got["small"] == {"shm": 0, "bulk": 0}  # small parts stay in the stream
    expected = {"shm": {"shm": 1, "bulk": 0}, "bulk": {"shm": 0, "bulk": 1}}
    assert got["large"] == expected.get(route, {"shm": 0, "bulk": 0})
