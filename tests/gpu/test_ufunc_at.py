"""Scatter-accumulate (``ufunc.at``) where CuPy refuses the dtype, on the stand-in.

CuPy's ``add.at`` takes no complex, bool or 8/16-bit integer array and its ``maximum.at`` /
``minimum.at`` no float16 (test_real_cupy_prekernel.py reads the limits off real CuPy; the
stand-in refuses the same). ``gradwire._backend.ufunc_at`` runs those through a wider dtype;
each result must equal NumPy's ``ufunc.at`` on the same data, and the gradients that go
through it must equal the CPU's.
"""

from __future__ import annotations

from typing import Any

import gradwire as gw
import numpy as np
import pytest
from gradwire._backend import ufunc_at

pytestmark = pytest.mark.usefixtures("fake_cupy_module")

CASES = [
    ("add", "complex64"),
    ("add", "complex128"),
    ("add", "bool"),
    ("add", "int8"),
    ("add", "int16"),
    ("add", "uint8"),
    ("add", "float32"),
    ("maximum", "float16"),
    ("minimum", "float16"),
    ("maximum", "int8"),
    ("minimum", "bool"),
]


def _data(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.integers(-100, 100, size=shape) + (
        1j * rng.integers(-5, 5, size=shape) if dtype.startswith("complex") else 0
    )
    if dtype == "bool":
        return values.real > 0
    return values.astype(dtype)  # int8 wraps, as the scatter's cast back does


@pytest.mark.parametrize(("ufunc", "dtype"), CASES)
def test_ufunc_at_on_a_dtype_cupy_refuses_matches_numpy(
    ufunc: str, dtype: str, fake_cupy_module: Any
) -> None:
    cp = fake_cupy_module
    target = _data(dtype, (5, 3), 0)
    values = _data(dtype, (6, 3), 1)
    index = np.array([0, 4, 4, 1, 0, 4])  # repeated: the accumulation is the point
    want = target.copy()
    getattr(np, ufunc).at(want, index, values)
    with cp.cuda.Device(1):
        on_device = cp.asarray(target)
        ufunc_at(ufunc, on_device, cp.asarray(index), cp.asarray(values))
    assert on_device.device.id == 1 and on_device.dtype == want.dtype
    np.testing.assert_array_equal(on_device.get(), want)


def test_complex_maximum_scatter_is_refused_clearly(fake_cupy_module: Any) -> None:
    cp = fake_cupy_module
    target = cp.asarray(np.zeros(3, np.complex64))
    with pytest.raises(TypeError, match="maximum scatter of complex CUDA tensors"):
        ufunc_at("maximum", target, cp.asarray(np.array([0])), cp.asarray(np.ones(1, np.complex64)))


def test_the_backward_of_complex_advanced_indexing_matches_the_cpu() -> None:
    grads = {}
    for dev in ("cpu", "cuda:1"):
        x = gw.tensor(np.arange(6) * (1 + 2j), dtype=gw.complex64).to(dev).requires_grad_()
        weights = gw.tensor([1 + 1j, 2, 3j], dtype=gw.complex64).to(dev)
        (x[gw.tensor([0, 0, 3]).to(dev)] * weights).sum().real.backward()
        assert str(x.grad.device) == dev
        grads[dev] = x.grad.cpu().numpy()
    np.testing.assert_array_equal(grads["cuda:1"], grads["cpu"])
    assert grads["cpu"][0] == (3 - 1j)  # two entries of index 0 accumulated


@pytest.mark.parametrize("mode", ["max", "sum", "mean"])
def test_embedding_bag_in_half_precision_matches_the_cpu(mode: str) -> None:
    gw.manual_seed(0)
    cpu_bag = gw.nn.EmbeddingBag(5, 3, mode=mode).half()
    outs, grads = {}, {}
    for dev in ("cpu", "cuda:1"):
        bag = gw.nn.EmbeddingBag(5, 3, mode=mode).half().to(dev)
        with gw.no_grad():
            bag.weight.copy_(cpu_bag.weight.to(dev))
        out = bag(gw.tensor([0, 1, 2, 2, 4, 4]).to(dev), gw.tensor([0, 2, 4]).to(dev))
        (out.float() * gw.arange(9.0).reshape(3, 3).to(dev)).sum().backward()
        outs[dev] = out.detach().cpu().float().numpy()
        grads[dev] = bag.weight.grad.cpu().float().numpy()
    np.testing.assert_array_equal(outs["cuda:1"], outs["cpu"])
    np.testing.assert_array_equal(grads["cuda:1"], grads["cpu"])
