"""Tensor metadata, repr, conversion to/from NumPy, devices, views and in-place version counters."""

from __future__ import annotations

import copy
import pickle

import gradwire as gw
import numpy as np
import pytest


# ------------------------------------------------------------------ metadata
def test_shape_ndim_numel_and_friends():
    t = gw.zeros(2, 3, 4)
    assert t.shape == (2, 3, 4) and t.size() == (2, 3, 4) and t.size(1) == 3
    assert t.ndim == 3 and t.dim() == 3 and t.numel() == 24 and len(t) == 2
    assert t.device == gw.device("cpu") and str(t.device) == "cpu" and not t.is_cuda
    assert t.is_floating_point() and not t.is_complex()
    assert t.is_contiguous() and not t.transpose(0, 2).is_contiguous()
    assert t.stride() == (12, 4, 1)


# ------------------------------------------------------------------ repr
@pytest.mark.parametrize(
    "make,expected",
    [
        (lambda: gw.tensor([1.0, 2.0], requires_grad=True), "tensor([1., 2.], requires_grad=True)"),
        (lambda: gw.tensor([1.0, 2.0]), "tensor([1., 2.])"),
        (lambda: gw.tensor([1.5, 2.25]), "tensor([1.5000, 2.2500])"),
        (lambda: gw.tensor([1, 2]), "tensor([1, 2])"),
        (lambda: gw.tensor([True, False]), "tensor([ True, False])"),
        (lambda: gw.tensor(3.0), "tensor(3.)"),
        (
            lambda: gw.tensor([1.0, 2.0], dtype=gw.float64),
            "tensor([1., 2.], dtype=gradwire.float64)",
        ),
        (lambda: gw.tensor([1, 2], dtype=gw.int32), "tensor([1, 2], dtype=gradwire.int32)"),
        (lambda: gw.tensor([[1.0, 2.0], [3.0, 4.0]]), "tensor([[1., 2.],\n        [3., 4.]])"),
        (
            lambda: gw.tensor([1.0, 2.0], requires_grad=True) * 2,
            "tensor([2., 4.], grad_fn=<MulBackward0>)",
        ),
        (
            lambda: gw.tensor([1.0, 2.0], requires_grad=True).sum(),
            "tensor(3., grad_fn=<SumBackward0>)",
        ),
        (
            lambda: gw.tensor([1.0, 2.0], requires_grad=True) + 1,
            "tensor([2., 3.], grad_fn=<AddBackward0>)",
        ),
    ],
)
def test_repr_looks_like_torch(make, expected):
    assert repr(make()) == expected


@pytest.mark.parametrize(
    "make,expected",
    [
        (lambda: gw.tensor([-1.0, 2.0]), "tensor([-1.,  2.])"),
        (lambda: gw.tensor([float("inf"), 1.5]), "tensor([   inf, 1.5000])"),
        (lambda: gw.tensor(float("nan")), "tensor(nan)"),
        (lambda: gw.tensor([]), "tensor([])"),
        (lambda: gw.zeros(0, 3), "tensor([], size=(0, 3))"),
        (lambda: gw.tensor([], dtype=gw.int64), "tensor([], dtype=gradwire.int64)"),
        (lambda: gw.tensor([1e-5, 1.0]), "tensor([1.0000e-05, 1.0000e+00])"),
    ],
)
def test_repr_edge_cases_like_torch(make, expected):
    assert repr(make()) == expected


def test_repr_implies_the_current_default_dtype():
    try:
        gw.set_default_dtype(gw.float64)
        assert repr(gw.ones(2)) == "tensor([1., 1.])"
        assert repr(gw.ones(2, dtype=gw.float32)) == "tensor([1., 1.], dtype=gradwire.float32)"
    finally:
        gw.set_default_dtype(gw.float32)


def test_repr_of_large_tensors_is_summarized():
    text = repr(gw.arange(5000))
    assert text.startswith("tensor([   0,    1,    2,") and "..." in text and len(text) < 200


# ------------------------------------------------------------------ numpy interop
def test_numpy_shares_memory_both_ways():
    t = gw.zeros(3)
    arr = t.numpy()
    arr[0] = 5.0
    assert t.tolist() == [5.0, 0.0, 0.0]
    t.add_(1)
    assert arr.tolist() == [6.0, 1.0, 1.0]


def test_numpy_refuses_tensors_that_require_grad():
    x = gw.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"detach\(\).numpy\(\)"):
        x.numpy()
    with pytest.raises(RuntimeError, match="requires grad"):
        (x * 2).numpy()
    assert x.detach().numpy().tolist() == [1.0, 1.0]


def test_from_numpy_shares_memory_and_keeps_dtype():
    arr = np.arange(3.0)
    t = gw.from_numpy(arr)
    arr[0] = 9.0
    assert t.tolist() == [9.0, 1.0, 2.0] and t.dtype == gw.float64
    t.mul_(2)
    assert arr.tolist() == [18.0, 2.0, 4.0]
    with pytest.raises(TypeError, match="numpy.ndarray"):
        gw.from_numpy([1, 2])


def test_item_and_tolist():
    assert gw.tensor([2.5]).item() == 2.5
    assert isinstance(gw.tensor(3).item(), int) and gw.tensor(3).item() == 3
    assert gw.tensor(True).item() is True
    assert gw.tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert gw.tensor(2.5).tolist() == 2.5
    with pytest.raises(RuntimeError, match="2 elements cannot be converted to Scalar"):
        gw.ones(2).item()
    assert float(gw.tensor([1.5])) == 1.5 and int(gw.tensor(7)) == 7
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(gw.ones(2))


def test_pickle_and_deepcopy_keep_values_and_leaf_requires_grad():
    x = gw.tensor([1.0, 2.0], requires_grad=True)
    y = pickle.loads(pickle.dumps(x))
    assert y.tolist() == [1.0, 2.0] and y.requires_grad and y.is_leaf
    z = copy.deepcopy(x)
    assert z.tolist() == [1.0, 2.0] and z.requires_grad and not np.shares_memory(z._data, x._data)
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(x * 2)


# ------------------------------------------------------------------ devices
def test_to_cpu_is_a_no_op_and_to_dtype_is_differentiable():
    x = gw.ones(2, requires_grad=True)
    assert x.to("cpu") is x and x.cpu() is x and x.to(gw.device("cpu")) is x
    y = x.to(gw.float64)
    assert y.dtype == gw.float64 and y.grad_fn.name() == "ToCopyBackward0"
    y.sum().backward()
    assert x.grad.dtype == gw.float32 and x.grad.tolist() == [1.0, 1.0]


def test_to_copy_true_makes_a_new_tensor():
    x = gw.ones(2)
    y = x.to("cpu", copy=True)
    assert y is not x and not np.shares_memory(y._data, x._data)


@pytest.mark.skipif(gw.is_cuda_available(), reason="checks the error raised without a GPU")
def test_cuda_without_a_gpu_is_a_clear_error():
    for move in (lambda t: t.cuda(), lambda t: t.to("cuda"), lambda t: t.to("cuda:1")):
        with pytest.raises(RuntimeError, match="needs a CUDA device, but none is available"):
            move(gw.ones(2))
    with pytest.raises(RuntimeError, match="CUDA device"):
        gw.zeros(2, device="cuda")


def test_bad_device_strings_are_rejected():
    with pytest.raises(ValueError, match="unknown device"):
        gw.ones(2).to("tpu")


@pytest.mark.gpu
@pytest.mark.skipif(not gw.is_cuda_available(), reason="needs CuPy and a CUDA device")
def test_cuda_round_trip_keeps_values_and_gradients():
    x = gw.tensor([1.0, 2.0], requires_grad=True)
    y = x.cuda()
    assert y.device == gw.device("cuda:0") and y.is_cuda
    with pytest.raises(TypeError, match="cpu"):
        y.detach().numpy()
    (y * y).sum().backward()
    assert x.grad.device.type == "cpu" and x.grad.tolist() == [2.0, 4.0]
    assert "device='cuda:0'" in repr(y.detach())


@pytest.mark.gpu
@pytest.mark.skipif(not gw.is_cuda_available(), reason="needs CuPy and a CUDA device")
def test_cuda_ops_match_cpu():
    a = gw.randn(3, 4, dtype=gw.float64)
    b = gw.randn(4, 2, dtype=gw.float64)
    np.testing.assert_allclose((a.cuda() @ b.cuda()).exp().cpu().numpy(), (a @ b).exp().numpy())


# ------------------------------------------------------------------ views
@pytest.mark.parametrize(
    "make_view",
    [
        lambda b: b[1],
        lambda b: b[:, 1:],
        lambda b: b.view(6),
        lambda b: b.reshape(3, 2),
        lambda b: b.t(),
        lambda b: b.transpose(0, 1),
        lambda b: b.permute(1, 0),
        lambda b: b.unsqueeze(0),
        lambda b: b[None].squeeze(0),
        lambda b: b.flatten(),
        lambda b: b[0].expand(4, 3),
        lambda b: b.detach(),
    ],
)
def test_views_share_memory_and_version_with_their_base(make_view):
    base = gw.zeros(2, 3)
    v = make_view(base)
    assert np.shares_memory(v._data, base._data)
    before = base._version
    base.add_(1)
    assert v._version == before + 1  # one counter for the base and all its views
    assert float(v.sum().item()) == v.numel()  # and the data is the same


def test_in_place_through_a_view_writes_the_base_and_bumps_its_version():
    base = gw.zeros(2, 3)
    row = base[1]
    v0 = base._version
    row.add_(5)
    assert base.tolist() == [[0, 0, 0], [5, 5, 5]]
    assert base._version == v0 + 1
    col = base[:, 0]
    col.fill_(7)
    base.view(6)[5] = -1.0
    assert base.tolist() == [[7, 0, 0], [7, 5, -1]]
    assert base._version == v0 + 3


def test_indexing_with_arrays_copies_rather_than_views():
    base = gw.zeros(3)
    picked = base[[0, 1]]
    picked.add_(1)
    assert base.tolist() == [0.0, 0.0, 0.0]


# ------------------------------------------------------------------ in-place and versions
@pytest.mark.parametrize(
    "op,expected",
    [
        (lambda t: t.add_(2), [3.0, 4.0, 5.0]),
        (lambda t: t.add_(gw.tensor([1.0, 1.0, 1.0]), alpha=2), [3.0, 4.0, 5.0]),
        (lambda t: t.sub_(1), [0.0, 1.0, 2.0]),
        (lambda t: t.mul_(gw.tensor([2.0, 0.0, 1.0])), [2.0, 0.0, 3.0]),
        (lambda t: t.div_(2), [0.5, 1.0, 1.5]),
        (lambda t: t.zero_(), [0.0, 0.0, 0.0]),
        (lambda t: t.fill_(4.5), [4.5, 4.5, 4.5]),
        (lambda t: t.copy_(gw.tensor([7, 8, 9])), [7.0, 8.0, 9.0]),
        (lambda t: t.clamp_(1.5, 2.5), [1.5, 2.0, 2.5]),
        (lambda t: t.__setitem__(1, 10.0), [1.0, 10.0, 3.0]),
        (lambda t: t.__setitem__(slice(0, 2), gw.tensor([5.0, 6.0])), [5.0, 6.0, 3.0]),
    ],
)
def test_in_place_ops_update_values_and_bump_the_version_once(op, expected):
    t = gw.tensor([1.0, 2.0, 3.0])
    data = t._data
    before = t._version
    out = op(t)
    assert out is None or out is t
    assert t.tolist() == expected
    assert t._data is data  # really in place
    assert t._version == before + 1


def test_augmented_assignment_is_in_place():
    t = gw.ones(2)
    alias = t
    t += 1
    t *= 3
    t -= 1
    t /= 5
    assert alias is t and t.tolist() == [1.0, 1.0] and t._version == 4


def test_in_place_ops_refuse_unsafe_casts_and_bad_shapes():
    with pytest.raises(RuntimeError, match="can't be cast"):
        gw.tensor([1, 2]).add_(1.5)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        gw.ones(2).add_(gw.ones(3, 2))


def test_detach_shares_data_and_version_but_leaves_the_graph():
    x = gw.ones(3, requires_grad=True)
    d = x.detach()
    assert not d.requires_grad and d.is_leaf and np.shares_memory(d._data, x._data)
    d.add_(1)
    assert x._version == 1 and x.tolist() == [2.0, 2.0, 2.0]
