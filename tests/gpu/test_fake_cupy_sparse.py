"""Sparse COO tensors on CUDA devices, on the TEST-ONLY CuPy stand-in (no GPU here): built,
coalesced, densified, added, selected and summed on their own device (cuda:1 with cuda:0
current), embeddings giving sparse gradients there, and moves between devices."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("fake_cupy_module")


def _pair(device: str) -> tuple[gw.Tensor, np.ndarray]:
    i = [[4, 0, 2, 0], [1, 3, 2, 3]]
    v = [1.0, 2.0, 3.0, 4.0]
    expected = np.zeros((5, 4), np.float32)
    np.add.at(expected, tuple(np.array(i)), v)
    return gw.sparse_coo_tensor(i, v, (5, 4), device=device), expected


def test_sparse_ops_run_on_the_tensors_device() -> None:
    s, expected = _pair("cuda:1")
    assert str(s.device) == "cuda:1" and s.is_sparse
    assert str(s._values().device) == "cuda:1" and str(s._indices().device) == "cuda:1"
    np.testing.assert_array_equal(s.to_dense().cpu().numpy(), expected)
    c = s.coalesce()
    assert c.is_coalesced() and str(c.device) == "cuda:1"
    assert c._nnz() == 3
    d = gw.ones(5, 4, device="cuda:1")
    np.testing.assert_array_equal((d + s).cpu().numpy(), expected + 1)
    np.testing.assert_array_equal((s + s).to_dense().cpu().numpy(), 2 * expected)
    np.testing.assert_array_equal((s * 3).to_dense().cpu().numpy(), 3 * expected)
    picked = s.index_select(0, gw.tensor([4, 0], device="cuda:1"))
    np.testing.assert_array_equal(picked.to_dense().cpu().numpy(), expected[[4, 0]])
    np.testing.assert_array_equal(gw.sparse.sum(s, 1).to_dense().cpu().numpy(), expected.sum(1))
    assert gw.sparse.sum(s).item() == pytest.approx(expected.sum())


def test_moves_between_devices_keep_the_values() -> None:
    s, expected = _pair("cuda:1")
    for target in ("cuda:0", "cpu", "cuda:1"):
        moved = s.to(target)
        assert moved.is_sparse and str(moved.device) == target
        np.testing.assert_array_equal(moved.to_dense().cpu().numpy(), expected)
    back = s.cpu().cuda(0)
    assert str(back.device) == "cuda:0"


def test_an_embedding_on_cuda1_gets_a_sparse_gradient_there() -> None:
    emb = gw.nn.Embedding(6, 2, sparse=True).to("cuda:1")
    emb(gw.tensor([[1, 1], [5, 0]], device="cuda:1")).sum().backward()
    g = emb.weight.grad
    assert g.is_sparse and str(g.device) == "cuda:1"
    dense = g.to_dense().cpu().numpy()
    np.testing.assert_array_equal(dense[:, 0], [1.0, 2.0, 0.0, 0.0, 0.0, 1.0])
    with gw.no_grad():
        emb.weight.add_(g, alpha=-0.5)  # scatters into the table on its device
    assert str(emb.weight.device) == "cuda:1"
