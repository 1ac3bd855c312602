"""Sparse COO tensors against PyTorch: one program, written against PyTorch's API, runs under
PyTorch (tests/torch_oracle.py) and under gradwire (``torch`` bound to ``gradwire``); every
value and gradient it records must agree. gradwire's side always runs; PyTorch's where torch
imports (or GRADWIRE_TORCH_PYTHON names an interpreter that has it)."""

from __future__ import annotations

import textwrap
from typing import Any

import gradwire as gw
import numpy as np
import pytest
from torch_oracle import torch_values

RNG = np.random.default_rng(41)
DENSE = RNG.standard_normal((5, 4)).astype(np.float32)
DENSE[1, :] = 0.0
DENSE[3, 2] = 0.0
INPUTS: dict[str, Any] = {
    # duplicates, unsorted: an uncoalesced tensor
    "i": np.array([[4, 0, 2, 0, 4, 1], [1, 3, 2, 3, 0, 1]], np.int64),
    "v": RNG.standard_normal(6).astype(np.float32),
    "d": DENSE,
    "hi": np.array([[5, 0, 5, 2]], np.int64),  # hybrid: one sparse dim, one dense dim
    "hv": RNG.standard_normal((4, 3)).astype(np.float32),
    "W": RNG.standard_normal((7, 3)).astype(np.float32),
    "idx": np.array([[1, 2, 1], [6, 2, 0]], np.int64),
    "go": RNG.standard_normal((2, 3, 3)).astype(np.float32),
    "bag_idx": np.array([1, 2, 4, 5, 4, 3, 2, 6], np.int64),
    "bag_off": np.array([0, 4, 4], np.int64),
    "psw": RNG.standard_normal(8).astype(np.float32),
}

PROGRAM = textwrap.dedent(
    """
    F = torch.nn.functional
    i, v, d = torch.tensor(inputs["i"]), torch.tensor(inputs["v"]), torch.tensor(inputs["d"])
    s = torch.sparse_coo_tensor(i, v, (5, 4))
    out["dense"] = s.to_dense()
    out["flags"] = [int(s.is_sparse), int(s.is_coalesced()), s.sparse_dim(), s.dense_dim()]
    c = s.coalesce()
    out["c_indices"], out["c_values"] = c.indices(), c.values()
    out["c_flags"] = [int(c.is_coalesced()), c._nnz()]
    out["inferred_size"] = list(torch.sparse_coo_tensor(i, v).shape)

    out["add_ss"] = (s + s).to_dense()
    out["add_ss_coalesced"] = (c + c).to_dense()
    out["add_ds"] = d + s
    out["add_alpha"] = torch.add(d, s, alpha=2.5)
    out["sub_ss"] = (s - c).to_dense()
    out["mul_scalar"] = (s * 2.5).to_dense()
    out["rmul_scalar"] = (3 * s).to_dense()
    out["div_scalar"] = (s / 4).to_dense()
    out["neg"] = (-s).to_dense()
    out["mul_dense"] = (c * d).to_dense()
    out["isel0"] = s.index_select(0, torch.tensor([4, 1, 0, 4])).to_dense()
    out["isel1"] = s.index_select(1, torch.tensor([3, 0])).to_dense()
    h = torch.sparse_coo_tensor(torch.tensor(inputs["hi"]), torch.tensor(inputs["hv"]), (6, 3))
    out["h_dense"] = h.to_dense()
    out["h_isel_dense_dim"] = h.index_select(1, torch.tensor([2, 0])).to_dense()
    out["h_flags"] = [h.sparse_dim(), h.dense_dim()]
    out["sum_all"] = torch.sparse.sum(s)
    out["sum0"] = torch.sparse.sum(s, 0).to_dense()
    out["sum1"] = torch.sparse.sum(s, dim=1).to_dense()
    out["h_sum_sparse_dim"] = torch.sparse.sum(h, 0)
    out["h_sum_dense_dim"] = torch.sparse.sum(h, 1).to_dense()
    out["method_sum"] = s.sum()
    ds = d.to_sparse()
    out["to_sparse_indices"], out["to_sparse_values"] = ds.indices(), ds.values()
    ds1 = d.to_sparse(1)
    out["to_sparse1_indices"], out["to_sparse1_values"] = ds1.indices(), ds1.values()
    out["sparse_mask"] = d.sparse_mask(c).to_dense()

    # gradients
    vv = torch.tensor(inputs["v"], requires_grad=True)
    (torch.sparse_coo_tensor(i, vv, (5, 4)).to_dense() * d).sum().backward()
    out["g_values"] = vv.grad
    leaf = torch.sparse_coo_tensor(i, v, (5, 4), requires_grad=True)
    (leaf * 3).to_dense().pow(2).sum().backward()
    out["g_leaf"], out["g_leaf_sparse"] = leaf.grad.to_dense(), int(leaf.grad.is_sparse)
    leaf2 = torch.sparse_coo_tensor(i, v, (5, 4), requires_grad=True)
    torch.sparse.sum(leaf2).backward()
    out["g_sum_all"], out["g_sum_all_sparse"] = leaf2.grad.to_dense(), int(leaf2.grad.is_sparse)
    leaf3 = torch.sparse_coo_tensor(i, v, (5, 4), requires_grad=True)
    (torch.sparse.sum(leaf3, 1).to_dense() * torch.arange(5.0)).sum().backward()
    out["g_sum1"] = leaf3.grad.to_dense()
    hl = torch.sparse_coo_tensor(torch.tensor(inputs["hi"]), torch.tensor(inputs["hv"]), (6, 3), requires_grad=True)
    (torch.sparse.sum(hl, 1).to_dense() * torch.arange(6.0)).sum().backward()
    out["g_h_sum_dense_dim"] = hl.grad.to_dense()
    dl = torch.tensor(inputs["d"], requires_grad=True)
    sl = torch.sparse_coo_tensor(i, v, (5, 4), requires_grad=True)
    (dl + sl).pow(2).sum().backward()
    out["g_dense_plus"], out["g_sparse_plus"] = dl.grad, sl.grad
    out["g_sparse_plus_sparse"] = int(sl.grad.is_sparse)

    # embeddings with sparse gradients
    W = torch.tensor(inputs["W"], requires_grad=True)
    seen = []
    W.register_hook(lambda g: seen.append(int(g.is_sparse)))
    idx, go = torch.tensor(inputs["idx"]), torch.tensor(inputs["go"])
    (F.embedding(idx, W, padding_idx=2, sparse=True) * go).sum().backward()
    out["emb_grad"], out["emb_sparse"], out["hook_sparse"] = W.grad.to_dense(), int(W.grad.is_sparse), seen
    (F.embedding(idx, W, sparse=True) * go).sum().backward()  # accumulates: still sparse
    out["emb_grad2"], out["emb_sparse2"] = W.grad.to_dense(), int(W.grad.is_sparse)
    (W * 2).sum().backward()  # a dense gradient meets the sparse .grad: dense
    out["emb_grad3"], out["emb_sparse3"] = W.grad, int(W.grad.is_sparse)
    W2 = torch.tensor(inputs["W"], requires_grad=True)
    (F.embedding(idx, W2, sparse=True).sum() + (W2 * 3).sum()).backward()  # one pass, both
    out["emb_mixed"], out["emb_mixed_sparse"] = W2.grad, int(W2.grad.is_sparse)
    emb = torch.nn.Embedding(7, 3, sparse=True)
    with torch.no_grad():
        emb.weight.copy_(torch.tensor(inputs["W"]))
    emb(idx).pow(2).sum().backward()
    out["module_grad"] = emb.weight.grad.to_dense()

    bi, bo, psw = torch.tensor(inputs["bag_idx"]), torch.tensor(inputs["bag_off"]), torch.tensor(inputs["psw"])
    for mode in ("sum", "mean"):  # "max" with sparse=True: PyTorch's ValueError
        Wb = torch.tensor(inputs["W"], requires_grad=True)
        y = F.embedding_bag(bi, Wb, bo, mode=mode, sparse=True)
        (y * torch.arange(9.0).reshape(3, 3)).sum().backward()
        out["bag_" + mode], out["bag_" + mode + "_grad"] = y, Wb.grad.to_dense()
        out["bag_" + mode + "_sparse"] = int(Wb.grad.is_sparse)
    Wp = torch.tensor(inputs["W"], requires_grad=True)
    F.embedding_bag(bi, Wp, bo, mode="sum", sparse=True, per_sample_weights=psw).sum().backward()
    out["bag_psw_grad"] = Wp.grad.to_dense()
    bag = torch.nn.EmbeddingBag(7, 3, mode="mean", sparse=True, padding_idx=4)
    with torch.no_grad():
        bag.weight.copy_(torch.tensor(inputs["W"]))
    bag(bi, bo).sum().backward()
    out["bag_module_grad"] = bag.weight.grad.to_dense()
    """
)


def _gradwire_values() -> dict[str, np.ndarray]:
    out: dict[str, Any] = {}
    exec(
        compile(PROGRAM, "<sparse program>", "exec"),
        {"torch": gw, "np": np, "inputs": INPUTS, "out": out},
    )  # noqa: S102

    def arr(value: Any) -> Any:
        if isinstance(value, gw.Tensor):
            assert not value.is_sparse, "the program densifies what it records"
            return value.detach().numpy()
        if isinstance(value, list):
            return [arr(x) for x in value]
        return value

    return {k: np.asarray(arr(v)) for k, v in out.items()}


@pytest.fixture(scope="module")
def both() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    mine = _gradwire_values()
    theirs = torch_values(PROGRAM, INPUTS)
    return mine, theirs


#: what the program records, per mode as well ("bag_sum", ...): checked against both sides
KEYS = sorted(
    line.split('out["')[1].split('"]')[0]
    for line in PROGRAM.splitlines()
    if line.strip().startswith('out["')
) + [f"bag_{m}{part}" for m in ("sum", "mean") for part in ("", "_grad", "_sparse")]


def test_gradwire_runs_the_whole_program_on_its_own() -> None:
    mine = _gradwire_values()
    assert mine["flags"].tolist() == [1, 0, 2, 0]
    np.testing.assert_allclose(mine["add_ds"], INPUTS["d"] + mine["dense"], rtol=1e-6)
    assert mine["emb_sparse"] == 1 and mine["emb_sparse3"] == 0


@pytest.mark.parametrize("key", sorted(k for k in set(KEYS) if '"' not in k))
def test_matches_pytorch(both: tuple[dict[str, Any], dict[str, np.ndarray]], key: str) -> None:
    mine, theirs = both
    assert set(mine) == set(theirs)
    assert key in mine
    np.testing.assert_allclose(
        np.asarray(mine[key], dtype=np.float64),
        np.asarray(theirs[key], dtype=np.float64),
        rtol=1e-5,
        atol=1e-5,
        err_msg=key,
    )
