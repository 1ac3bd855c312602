"""DistributedOptimizer over an ``nn.Embedding(sparse=True)`` held by another worker: the
dist-autograd context's gradient of the table is sparse, and SGD (with momentum), Adagrad and
SparseAdam step it there as the same optimizer steps a local replica. One 2-worker cluster run
feeds every test."""

from __future__ import annotations

from typing import Any

import gradwire as gw
import gradwire.distributed.autograd as dist_autograd
import numpy as np
import pytest
from gradwire.distributed import rpc
from gradwire.distributed.optim import DistributedOptimizer
from gradwire.distributed.rpc._testing import run_cluster

ROWS, DIM = 8, 3
SCHEDULE = [[1, 5, 1], [5, 5, 2, 6], [0, 1, 1]]  # rows looked up per step; 3, 4, 7 never
OPTIMIZERS = {
    "SGD": {"lr": 0.1, "momentum": 0.9, "nesterov": True},
    "Adagrad": {"lr": 0.2, "lr_decay": 0.1, "initial_accumulator_value": 0.1},
    "SparseAdam": {"lr": 0.05, "betas": (0.8, 0.99)},
}


def _start() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((ROWS, DIM))


def _weights(t: int) -> gw.Tensor:
    rows = SCHEDULE[t]
    return gw.tensor(np.random.default_rng(100 + t).standard_normal((len(rows), DIM)))


# -- run on worker1, the owner of the table ----------------------------------------------------


def make_table() -> gw.nn.Embedding:
    return gw.nn.Embedding.from_pretrained(gw.tensor(_start()), freeze=False, sparse=True)


def weight_rref(table: Any) -> Any:
    return rpc.RRef(table.local_value().weight)


def lookup(table: Any, rows: gw.Tensor) -> gw.Tensor:
    return table.local_value()(rows)


def table_value(table: Any) -> np.ndarray:
    return table.local_value().weight.detach().numpy().copy()


def context_grad_is_sparse(table: Any, cid: int) -> bool:
    grads = dist_autograd.get_gradients(cid)
    return bool(grads[table.local_value().weight].is_sparse)


# -- run on worker0 ----------------------------------------------------------------------------


def _distributed(name: str) -> dict[str, Any]:
    table = rpc.remote("worker1", make_table)
    opt = DistributedOptimizer(
        getattr(gw.optim, name),
        [rpc.rpc_sync("worker1", weight_rref, (table,))],
        **OPTIMIZERS[name],
    )
    tables, sparse = [], []
    for t, rows in enumerate(SCHEDULE):
        with dist_autograd.context() as cid:
            out = rpc.rpc_sync("worker1", lookup, (table, gw.tensor(rows)))
            dist_autograd.backward(cid, [(out * _weights(t)).sum()])
            sparse.append(rpc.rpc_sync("worker1", context_grad_is_sparse, (table, cid)))
            opt.step(cid)
        tables.append(rpc.rpc_sync("worker1", table_value, (table,)))
    return {"tables": tables, "sparse": sparse}


def _local(name: str) -> list[np.ndarray]:
    emb = make_table()
    opt = getattr(gw.optim, name)(emb.parameters(), **OPTIMIZERS[name])
    tables = []
    for t, rows in enumerate(SCHEDULE):
        opt.zero_grad()
        (emb(gw.tensor(rows)) * _weights(t)).sum().backward()
        opt.step()
        tables.append(emb.weight.detach().numpy().copy())
    return tables


def _refused() -> str:
    table = rpc.remote("worker1", make_table)
    opt = DistributedOptimizer(gw.optim.Adam, [rpc.rpc_sync("worker1", weight_rref, (table,))])
    with dist_autograd.context() as cid:
        out = rpc.rpc_sync("worker1", lookup, (table, gw.tensor([2, 2])))
        dist_autograd.backward(cid, [out.sum()])
        try:
            opt.step(cid)
        except RuntimeError as exc:
            return str(exc)
    return "no error"


def cluster_body(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    runs = {name: {**_distributed(name), "local": _local(name)} for name in OPTIMIZERS}
    return {"runs": runs, "refused": _refused()}


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    results = run_cluster(2, cluster_body, timeout=90.0)
    assert all(r.error is None for r in results), [r.error for r in results]
    return results[0].value


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_remote_sparse_table_steps_as_a_local_replica(cluster, name):
    run = cluster["runs"][name]
    assert run["sparse"] == [True] * len(SCHEDULE)  # the context's gradient was sparse
    for t, (got, ref) in enumerate(zip(run["tables"], run["local"])):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14, err_msg=f"step {t}")
    start = _start()
    moved = {r for r in range(ROWS) if not np.array_equal(run["tables"][-1][r], start[r])}
    assert moved == {0, 1, 2, 5, 6}  # the rows looked up, and only those


def test_an_optimizer_without_sparse_support_refuses_over_rpc(cluster):
    message = cluster["refused"]
    assert "Adam does not support sparse gradients, please consider SparseAdam instead" in message
    assert "worker1" in message
