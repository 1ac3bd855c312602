"""Factories, dtype inference as in PyTorch, dtype objects and the seeded generator."""

from __future__ import annotations

import pickle

import gradwire as gw
import numpy as np
import pytest


def test_tensor_infers_dtypes_like_torch():
    assert gw.tensor([1.0, 2.0]).dtype == gw.float32
    assert gw.tensor(1.5).dtype == gw.float32
    assert gw.tensor([1, 2]).dtype == gw.int64
    assert gw.tensor([True, False]).dtype == gw.bool
    assert gw.tensor([1, 2.5]).dtype == gw.float32
    assert gw.tensor(1 + 2j).dtype == gw.complex64
    # NumPy arrays keep their dtype.
    assert gw.tensor(np.array([1.0, 2.0])).dtype == gw.float64
    assert gw.tensor(np.array([1, 2], dtype=np.int32)).dtype == gw.int32


def test_tensor_with_explicit_dtype_and_values():
    t = gw.tensor([[1, 2], [3, 4]], dtype=gw.float64)
    assert t.dtype == gw.float64 and t.shape == (2, 2) and t.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert gw.tensor([1.9], dtype=gw.int32).tolist() == [1]


def test_tensor_copies_its_data():
    arr = np.zeros(3)
    t = gw.tensor(arr)
    arr[0] = 5
    assert t.tolist() == [0.0, 0.0, 0.0]


def test_tensor_from_tensors_and_from_a_tensor():
    assert gw.tensor([gw.tensor(1.0), gw.tensor(2.0)]).tolist() == [1.0, 2.0]
    src = gw.ones(2, requires_grad=True)
    copy = gw.tensor(src)
    assert copy.tolist() == [1.0, 1.0] and not copy.requires_grad and copy.is_leaf


def test_tensor_rejects_ragged_and_unsupported_data():
    with pytest.raises((ValueError, TypeError)):
        gw.tensor([[1, 2], [3]])
    with pytest.raises(TypeError, match="unsupported dtype"):
        gw.tensor(np.array(["a"]))


def test_default_dtype_can_be_switched_to_float64_and_back():
    try:
        gw.set_default_dtype(gw.float64)
        assert gw.get_default_dtype() == gw.float64
        assert gw.tensor([1.0]).dtype == gw.float64 and gw.ones(2).dtype == gw.float64
        assert gw.tensor(1j).dtype == gw.complex128
    finally:
        gw.set_default_dtype(gw.float32)
    assert gw.ones(2).dtype == gw.float32
    with pytest.raises(TypeError):
        gw.set_default_dtype(gw.int64)


@pytest.mark.parametrize(
    "make,expected",
    [
        (lambda: gw.zeros(2, 3), np.zeros((2, 3))),
        (lambda: gw.zeros((2, 3)), np.zeros((2, 3))),
        (lambda: gw.ones([2, 3]), np.ones((2, 3))),
        (lambda: gw.ones(()), np.ones(())),
        (lambda: gw.full((2, 2), 1.5), np.full((2, 2), 1.5)),
        (lambda: gw.arange(5), np.arange(5)),
        (lambda: gw.arange(1, 7, 2), np.arange(1, 7, 2)),
        (lambda: gw.arange(0, 1, 0.25), np.arange(0, 1, 0.25)),
        (lambda: gw.eye(3), np.eye(3)),
        (lambda: gw.eye(2, 3), np.eye(2, 3)),
        (lambda: gw.linspace(0, 1, 5), np.linspace(0, 1, 5)),
    ],
)
def test_factories_match_numpy(make, expected):
    t = make()
    assert t.shape == expected.shape
    np.testing.assert_allclose(t.numpy(), expected)


def test_factory_dtypes_follow_torch():
    assert gw.zeros(2).dtype == gw.float32
    assert gw.ones(2, dtype=gw.float64).dtype == gw.float64
    assert gw.empty(2, 3).dtype == gw.float32 and gw.empty(2, 3).shape == (2, 3)
    assert gw.full((2,), 3).dtype == gw.int64
    assert gw.full((2,), 3.0).dtype == gw.float32
    assert gw.full((2,), True).dtype == gw.bool
    assert gw.arange(3).dtype == gw.int64
    assert gw.arange(3.0).dtype == gw.float32
    assert gw.linspace(0, 1, 3).dtype == gw.float32
    assert gw.eye(2).dtype == gw.float32
    assert gw.rand(2).dtype == gw.float32 and gw.randn(2, dtype=gw.float64).dtype == gw.float64


def test_factories_can_make_leaves_that_require_grad():
    for t in (
        gw.zeros(2, requires_grad=True),
        gw.randn(2, requires_grad=True),
        gw.arange(3.0, requires_grad=True),
        gw.linspace(0, 1, 2, requires_grad=True),
    ):
        assert t.requires_grad and t.is_leaf and t.grad_fn is None


def test_factories_reject_bad_arguments():
    with pytest.raises(RuntimeError, match="negative dimension"):
        gw.zeros(-1)
    with pytest.raises(RuntimeError, match="step must be nonzero"):
        gw.arange(0, 3, 0)
    with pytest.raises(RuntimeError, match="only Tensors of floating point"):
        gw.arange(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="floating point"):
        gw.randn(2, dtype=gw.int64)


def test_like_factories_copy_shape_and_dtype():
    src = gw.ones(2, 3, dtype=gw.float64)
    for fn in (gw.zeros_like, gw.ones_like, gw.empty_like, gw.rand_like, gw.randn_like):
        t = fn(src)
        assert t.shape == (2, 3) and t.dtype == gw.float64 and not t.requires_grad
    assert gw.zeros_like(src).tolist() == [[0.0] * 3] * 2
    assert gw.ones_like(src, dtype=gw.int64).dtype == gw.int64
    full = gw.full_like(src, 7)
    assert full.tolist() == [[7.0] * 3] * 2 and full.dtype == gw.float64
    assert gw.zeros_like(src, requires_grad=True).requires_grad


def test_rand_and_randn_ranges_and_statistics():
    gw.manual_seed(0)
    u = gw.rand(10_000)
    assert 0.0 <= u.min().item() and u.max().item() < 1.0
    assert abs(u.mean().item() - 0.5) < 0.02
    n = gw.randn(10_000, dtype=gw.float64)
    assert abs(n.mean().item()) < 0.05 and abs(n.std().item() - 1) < 0.05


def test_manual_seed_makes_random_factories_reproducible():
    gw.manual_seed(1234)
    first = (gw.rand(4).tolist(), gw.randn(2, 2).tolist(), gw.randint(0, 10, (5,)).tolist())
    gw.manual_seed(1234)
    second = (gw.rand(4).tolist(), gw.randn(2, 2).tolist(), gw.randint(0, 10, (5,)).tolist())
    assert first == second
    gw.manual_seed(4321)
    assert gw.rand(4).tolist() != first[0]


def test_dtype_objects_behave_like_torch_dtypes():
    assert gw.float32 is gw.float and gw.float64 is gw.double and gw.int64 is gw.long
    assert gw.int32 is gw.int and gw.float16 is gw.half
    assert gw.complex64 is gw.cfloat and gw.complex128 is gw.cdouble
    assert repr(gw.float32) == "gradwire.float32"
    assert gw.float64.is_floating_point and not gw.int64.is_floating_point
    assert gw.complex128.is_complex and not gw.float64.is_complex
    assert gw.float64.itemsize == 8 and gw.bool.itemsize == 1
    assert isinstance(gw.float32, gw.dtype)
    assert pickle.loads(pickle.dumps(gw.complex64)) is gw.complex64
    for d in (
        gw.float16,
        gw.float32,
        gw.float64,
        gw.complex64,
        gw.complex128,
        gw.int32,
        gw.int64,
        gw.bool,
    ):
        assert gw.zeros(1, dtype=d).dtype is d


def test_as_tensor_shares_ndarray_memory_when_possible():
    arr = np.zeros(3)
    t = gw.as_tensor(arr)
    arr[1] = 4.0
    assert t.tolist() == [0.0, 4.0, 0.0]
    assert gw.as_tensor(t) is t
