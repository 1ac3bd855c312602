"""The sparse COO surface on its own: construction checks, layouts, in-place arithmetic,
copies, pickling, and clear errors for what sparse tensors do not support."""

from __future__ import annotations

import copy
import io
import pickle

import gradwire as gw
import numpy as np
import pytest

I = [[2, 0, 2], [1, 3, 1]]  # noqa: E741 - an index matrix
V = [1.0, 2.0, 3.0]


def _s() -> gw.Tensor:
    return gw.sparse_coo_tensor(I, V, (3, 4))


def _dense() -> np.ndarray:
    out = np.zeros((3, 4), np.float32)
    np.add.at(out, tuple(np.array(I)), V)
    return out


def test_layouts_and_metadata() -> None:
    s = _s()
    assert s.layout is gw.sparse_coo and gw.zeros(2).layout is gw.strided
    assert repr(gw.sparse_coo) == "gradwire.sparse_coo"
    assert s.is_sparse and not gw.zeros(2).is_sparse
    assert (s.shape, s.dtype, s.ndim, s.numel(), s._nnz()) == ((3, 4), gw.float32, 2, 12, 3)
    assert gw.zeros(2, 3).sparse_dim() == 0 and gw.zeros(2, 3).dense_dim() == 2
    assert "nnz=3" in repr(s) and "layout=gradwire.sparse_coo" in repr(s)


@pytest.mark.parametrize(
    ("indices", "values", "size", "error", "message"),
    [
        ([[0, 5]], [1.0, 2.0], (4,), ValueError, "for dim 0, size is 4 but found index 5"),
        ([[0, -1]], [1.0, 2.0], (4,), ValueError, "found index -1"),
        ([[0, 1]], [1.0], (4,), ValueError, "2 columns .nnz. but values have 1 rows"),
        ([0, 1], [1.0, 2.0], (4,), ValueError, "indices must be 2-D"),
        ([[0.5, 1.0]], [1.0, 2.0], (4,), TypeError, "indices must be integers"),
        ([[0, 1]], [[1.0], [2.0]], (4, 2), ValueError, "dense shape"),
        ([[0, 1]], [1.0, 2.0], (4, 2), ValueError, "has 2 dims but indices give 1 sparse"),
    ],
)
def test_bad_construction_is_refused_saying_what_is_wrong(
    indices: object, values: object, size: object, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        gw.sparse_coo_tensor(indices, values, size)


def test_a_false_is_coalesced_claim_is_refused() -> None:
    with pytest.raises(ValueError, match="not sorted and unique"):
        gw.sparse_coo_tensor(I, V, (3, 4), is_coalesced=True)
    ok = gw.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (3,), is_coalesced=True)
    assert ok.is_coalesced()


def test_values_and_indices_need_coalesced_as_in_pytorch() -> None:
    s = _s()
    with pytest.raises(RuntimeError, match="uncoalesced tensor, please call .coalesce"):
        s.values()
    with pytest.raises(RuntimeError, match="uncoalesced"):
        s.indices()
    c = s.coalesce()
    assert c.indices().tolist() == [[0, 2], [3, 1]] and c.values().tolist() == [2.0, 4.0]
    assert c.coalesce() is c
    assert s._values().tolist() == V  # the raw parts, duplicates and all


def test_unsupported_operations_raise_not_implemented_naming_the_op() -> None:
    s = _s()
    with pytest.raises(NotImplementedError, match="Exp is not supported on sparse COO"):
        s.exp()
    with pytest.raises(NotImplementedError, match="to_dense"):
        s.reshape(12)
    with pytest.raises(NotImplementedError, match="sparse COO"):
        s.matmul(gw.ones(4, 2))
    with pytest.raises(TypeError, match="Use Tensor.to_dense"):
        s.numpy()
    with pytest.raises(RuntimeError, match="doesn't have storage"):
        s.data_ptr()
    with pytest.raises(RuntimeError, match="do not have strides"):
        s.stride()
    assert not s.is_contiguous()
    with pytest.raises(NotImplementedError, match="mul of two sparse"):
        s * s


def test_in_place_arithmetic_without_autograd() -> None:
    d = gw.ones(3, 4)
    buffer = d._data
    d.add_(_s(), alpha=2)  # a scatter into the same buffer
    assert d._data is buffer
    np.testing.assert_array_equal(d.numpy(), 1 + 2 * _dense())
    d.sub_(_s())
    np.testing.assert_array_equal(d.numpy(), 1 + _dense())
    s = _s()
    s.add_(_s())
    np.testing.assert_array_equal(s.to_dense().numpy(), 2 * _dense())
    s.mul_(0.5)
    s.div_(2)
    np.testing.assert_array_equal(s.to_dense().numpy(), 0.5 * _dense())
    s.zero_()
    assert s._nnz() == 0 and s.shape == (3, 4) and not s.to_dense().numpy().any()
    with pytest.raises(RuntimeError, match="add_.sparse, dense. is not supported"):
        _s().add_(gw.ones(3, 4))
    leaf = gw.ones(3, 4, requires_grad=True)
    with pytest.raises(NotImplementedError, match="in-place add_ recorded by autograd"):
        leaf.add_(_s())


def test_copies_moves_and_pickles_keep_the_values() -> None:
    s = _s().requires_grad_()
    for other in (
        s.detach().clone(),
        copy.deepcopy(s),
        pickle.loads(pickle.dumps(s)),
        s.to(gw.float64),
    ):
        assert other.is_sparse
        np.testing.assert_array_equal(other.detach().to_dense().numpy(), _dense())
    assert pickle.loads(pickle.dumps(s)).requires_grad
    assert s.to(gw.float64).dtype == gw.float64
    c = s.detach().clone()
    c._values().mul_(0)  # the clone owns its values
    np.testing.assert_array_equal(s.detach().to_dense().numpy(), _dense())
    assert pickle.loads(pickle.dumps(gw.sparse_coo)) is gw.sparse_coo


def test_save_and_load_a_sparse_tensor() -> None:
    buf = io.BytesIO()
    gw.save({"g": _s()}, buf)
    buf.seek(0)
    got = gw.load(buf)["g"]
    assert got.is_sparse
    np.testing.assert_array_equal(got.to_dense().numpy(), _dense())


def test_to_sparse_round_trip_and_hybrid() -> None:
    d = gw.tensor([[0.0, 1.0], [0.0, 0.0], [2.0, 3.0]])
    s = d.to_sparse()
    assert s.is_coalesced() and s._nnz() == 3
    np.testing.assert_array_equal(s.to_dense().numpy(), d.numpy())
    h = d.to_sparse(1)
    assert (h.sparse_dim(), h.dense_dim(), h._nnz()) == (1, 1, 2)
    np.testing.assert_array_equal(h.to_dense().numpy(), d.numpy())
    assert s.to_sparse() is s
