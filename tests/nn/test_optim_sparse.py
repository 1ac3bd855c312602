"""SGD, Adagrad and SparseAdam on sparse gradients (``nn.Embedding(sparse=True)``): PyTorch's
trajectories step by step, rows without a gradient left alone, the sparse state, zero_grad."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest
from gradwire._sparse_coo import SparseCOO
from torch_oracle import torch_values

ROWS, DIM = 10, 3
# The rows looked up at each step (repeats sum in the gradient); None: a step whose sparse
# gradient is empty (zero_grad(set_to_none=False) and no backward): it still counts as a step.
SCHEDULE: list[list[int] | None] = [[1, 4, 1, 7], [4, 4, 2, 4], None, [0, 1, 9, 1, 1], [7, 3, 7]]
NEVER = [5, 6, 8]  # never looked up

CASES = [
    ("SGD", {"lr": 0.1}, "float64"),
    ("SGD", {"lr": 0.1, "maximize": True}, "float64"),
    ("SGD", {"lr": 0.1, "momentum": 0.9}, "float64"),
    ("SGD", {"lr": 0.1, "momentum": 0.8, "dampening": 0.3}, "float64"),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}, "float64"),
    ("SGD", {"lr": 0.05, "momentum": 0.5, "nesterov": True, "maximize": True}, "float64"),
    ("Adagrad", {"lr": 0.1}, "float64"),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.2}, "float64"),
    ("Adagrad", {"lr": 0.1, "initial_accumulator_value": 0.5}, "float64"),
    (
        "Adagrad",
        {
            "lr": 0.5,
            "lr_decay": 0.1,
            "initial_accumulator_value": 0.3,
            "eps": 1e-3,
            "maximize": True,
        },
        "float64",
    ),
    ("SparseAdam", {"lr": 0.05}, "float64"),
    ("SparseAdam", {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-6}, "float64"),
    ("SparseAdam", {"lr": 0.05, "maximize": True}, "float64"),
    ("SGD", {"lr": 0.1, "momentum": 0.9}, "float32"),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.1}, "float32"),
    ("SparseAdam", {"lr": 0.05}, "float32"),
]
IDS = [f"{n}-{kw}-{dt}" for n, kw, dt in CASES]
TOL = {"float64": dict(rtol=1e-12, atol=1e-14), "float32": dict(rtol=2e-6, atol=1e-6)}


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {"table": rng.standard_normal((ROWS, DIM))}
    for t, rows in enumerate(SCHEDULE):
        if rows is not None:  # a different weight per lookup: duplicate rows differ
            out[f"w{t}"] = rng.standard_normal((len(rows), DIM))
    return out


def _run(
    name: str, kwargs: dict, dtype: str
) -> tuple[list[np.ndarray], gw.optim.Optimizer, gw.Tensor]:
    """The table after each step, the optimizer and the weight."""
    inputs = _inputs()
    dt = getattr(gw, dtype)
    emb = gw.nn.Embedding.from_pretrained(
        gw.tensor(inputs["table"]).to(dt), freeze=False, sparse=True
    )
    opt = getattr(gw.optim, name)(emb.parameters(), **kwargs)
    tables = []
    for t, rows in enumerate(SCHEDULE):
        opt.zero_grad(set_to_none=False)
        if rows is not None:
            (emb(gw.tensor(rows)) * gw.tensor(inputs[f"w{t}"]).to(dt)).sum().backward()
            assert emb.weight.grad.is_sparse
        opt.step()
        tables.append(emb.weight.detach().numpy().copy())
    return tables, opt, emb.weight


@pytest.fixture(scope="module")
def torch_out() -> dict[str, np.ndarray]:
    src = f"""
for k, (name, kwargs, dtype) in enumerate({CASES!r}):
    dt = getattr(torch, dtype)
    emb = torch.nn.Embedding.from_pretrained(
        torch.tensor(inputs["table"]).to(dt), freeze=False, sparse=True
    )
    opt = getattr(torch.optim, name)(emb.parameters(), **kwargs)
    for t, rows in enumerate({SCHEDULE!r}):
        opt.zero_grad(set_to_none=False)
        if rows is not None:
            (emb(torch.tensor(rows)) * torch.tensor(inputs[f"w{{t}}"]).to(dt)).sum().backward()
        opt.step()
        out[f"{{k}}_{{t}}"] = emb.weight.clone()
"""
    return torch_values(src, _inputs())


@pytest.mark.parametrize("k", range(len(CASES)), ids=IDS)
def test_table_matches_torch_after_every_step(torch_out, k):
    name, kwargs, dtype = CASES[k]
    tables, _, weight = _run(name, kwargs, dtype)
    assert weight._data.dtype == np.dtype(dtype)
    for t, table in enumerate(tables):
        np.testing.assert_allclose(
            table, torch_out[f"{k}_{t}"], **TOL[dtype], err_msg=f"after step {t}"
        )


@pytest.mark.parametrize("k", range(len(CASES)), ids=IDS)
def test_rows_without_a_gradient_do_not_move(k):
    name, kwargs, dtype = CASES[k]
    tables, _, _ = _run(name, kwargs, dtype)
    w0 = _inputs()["table"].astype(dtype)
    before = [w0, *tables[:-1]]
    seen: set[int] = set()
    for t, rows in enumerate(SCHEDULE):
        seen |= set(rows or [])
        moved = {r for r in range(ROWS) if not np.array_equal(tables[t][r], before[t][r])}
        # With momentum every row the buffer holds keeps moving; otherwise only this step's.
        expected = seen if kwargs.get("momentum") else set(rows or [])
        assert moved == expected, f"step {t}"
    for r in NEVER:
        np.testing.assert_array_equal(tables[-1][r], w0[r])


def test_sgd_momentum_buffer_is_sparse_over_the_rows_seen():
    _, opt, weight = _run("SGD", {"lr": 0.1, "momentum": 0.9}, "float64")
    buf = opt.state[weight]["momentum_buffer"]
    assert isinstance(buf, SparseCOO) and buf.coalesced
    assert buf.indices.tolist() == [[0, 1, 2, 3, 4, 7, 9]]
    # The buffer's value is sum over steps of momentum**age * gradient, at its rows.
    inputs = _inputs()
    ref = np.zeros((ROWS, DIM))
    for t, rows in enumerate(SCHEDULE):
        ref *= 0.9
        if rows is not None:
            np.add.at(ref, rows, inputs[f"w{t}"])
    np.testing.assert_allclose(buf.values, ref[buf.indices[0]], rtol=1e-13)


def test_adagrad_and_sparse_adam_state_changes_only_at_the_rows_seen():
    _, opt, weight = _run("Adagrad", {"lr": 0.1, "initial_accumulator_value": 0.5}, "float64")
    total = opt.state[weight]["sum"]
    assert opt.state[weight]["step"] == len(SCHEDULE)
    np.testing.assert_array_equal(total[NEVER], np.full((len(NEVER), DIM), 0.5))
    assert (total[[0, 1, 2, 3, 4, 7, 9]] > 0.5).all()
    _, opt, weight = _run("SparseAdam", {"lr": 0.05}, "float64")
    state = opt.state[weight]
    assert state["step"] == len(SCHEDULE)  # the empty-gradient step counts, as in PyTorch
    for key in ("exp_avg", "exp_avg_sq"):
        np.testing.assert_array_equal(state[key][NEVER], 0.0)
        assert (state[key][[0, 1, 2, 3, 4, 7, 9]] != 0).all()


@pytest.mark.parametrize(
    "name,kwargs", [("SGD", {"lr": 0.1, "momentum": 0.9}), ("Adagrad", {}), ("SparseAdam", {})]
)
def test_step_with_grads_equals_step(name, kwargs):
    tables, _, _ = _run(name, kwargs, "float64")
    inputs = _inputs()
    emb = gw.nn.Embedding.from_pretrained(gw.tensor(inputs["table"]), freeze=False, sparse=True)
    opt = getattr(gw.optim, name)(emb.parameters(), **kwargs)
    for t, rows in enumerate(SCHEDULE):
        if rows is None:
            continue
        emb.weight.grad = None
        (emb(gw.tensor(rows)) * gw.tensor(inputs[f"w{t}"])).sum().backward()
        grad, emb.weight.grad = emb.weight.grad, None
        opt.step_with_grads({emb.weight: grad})
        if t == 1:  # the next step of the reference had an empty gradient
            opt.step_with_grads(
                {
                    emb.weight: gw.sparse_coo_tensor(
                        [[]], gw.zeros(0, DIM, dtype=gw.float64), (ROWS, DIM)
                    )
                }
            )
    np.testing.assert_array_equal(emb.weight.detach().numpy(), tables[-1])


def test_zero_grad_keeps_an_empty_sparse_gradient_that_accumulates_again():
    emb = gw.nn.Embedding(ROWS, DIM, sparse=True)
    opt = gw.optim.SGD(emb.parameters(), lr=0.1)
    emb(gw.tensor([1, 1, 4])).sum().backward()
    opt.zero_grad(set_to_none=False)
    grad = emb.weight.grad
    assert grad.is_sparse and grad._nnz() == 0 and tuple(grad.shape) == (ROWS, DIM)
    emb(gw.tensor([2])).sum().backward()
    dense = emb.weight.grad.to_dense().numpy()
    assert dense[2].tolist() == [1.0] * DIM and dense.sum() == DIM  # rows 1 and 4 are gone
    opt.zero_grad()
    assert emb.weight.grad is None


def test_sgd_state_dict_round_trip_with_a_sparse_buffer(tmp_path):
    kwargs = {"lr": 0.1, "momentum": 0.9, "nesterov": True}
    tables, opt, weight = _run("SGD", kwargs, "float64")
    saved = opt.state_dict()
    buf = saved["state"][0]["momentum_buffer"]
    # a sparse tensor, as PyTorch's, so gw.save and gw.load (weights_only by default) carry it
    assert isinstance(buf, gw.Tensor) and buf.is_sparse
    assert buf._data is not opt.state[weight]["momentum_buffer"]
    gw.save(saved, tmp_path / "optim.pt")
    fresh = gw.optim.SGD([weight], **kwargs)
    fresh.load_state_dict(gw.load(tmp_path / "optim.pt"))
    assert isinstance(fresh.state[weight]["momentum_buffer"], SparseCOO)
    weight.grad = gw.sparse_coo_tensor([[3]], gw.ones(1, DIM, dtype=gw.float64), (ROWS, DIM))
    opt.step()
    after_opt = weight.detach().numpy().copy()
    weight._data[...] = tables[-1]
    fresh.step()
    np.testing.assert_array_equal(weight.detach().numpy(), after_opt)
    assert not np.array_equal(after_opt, tables[-1])
