"""EmbeddingBag and functional.embedding_bag: gradcheck, PyTorch's values and gradients for every
mode (offsets, 2-D bags, per-sample weights, padding, empty bags, the last offset), errors."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest
from gradwire import nn
from gradwire.autograd import gradcheck, gradgradcheck
from gradwire.errors import ArgumentError
from gradwire.nn import functional as F
from torch_oracle import torch_values

RNG = np.random.default_rng(5)
W = RNG.standard_normal((7, 3))
IDX = np.array([1, 2, 4, 5, 4, 3, 2, 6, 1, 1])
G_OUT = RNG.standard_normal((5, 3))
PSW = RNG.standard_normal(IDX.shape)

# name -> keyword arguments of embedding_bag (offsets as a list; "2d" reshapes the indices)
CASES = {
    "sum": {"offsets": [0, 4, 4, 7, 9], "mode": "sum"},
    "mean": {"offsets": [0, 4, 4, 7, 9], "mode": "mean"},
    "max": {"offsets": [0, 4, 4, 7, 9], "mode": "max"},
    "mean-padding": {"offsets": [0, 4, 4, 7, 9], "mode": "mean", "padding_idx": 1},
    "max-padding": {"offsets": [0, 4, 4, 7, 9], "mode": "max", "padding_idx": 4},
    "sum-weights": {"offsets": [0, 4, 4, 7, 9], "mode": "sum", "psw": True},
    "sum-weights-padding": {
        "offsets": [0, 4, 4, 7, 9],
        "mode": "sum",
        "psw": True,
        "padding_idx": 2,
    },
    "mean-last-offset": {
        "offsets": [0, 4, 4, 7, 9, 10],
        "mode": "mean",
        "include_last_offset": True,
    },
    "sum-2d": {"offsets": None, "mode": "sum", "2d": True},
    "max-2d": {"offsets": None, "mode": "max", "2d": True},
}

SNIPPET = """
import torch.nn.functional as F
for name, case in %r.items():
    case = dict(case)
    w = torch.tensor(inputs["w"], requires_grad=True)
    idx = torch.tensor(inputs["idx"])
    psw = torch.tensor(inputs["psw"], requires_grad=True) if case.pop("psw", False) else None
    offsets = case.pop("offsets")
    if case.pop("2d", False):
        idx, ps = idx.reshape(5, 2), (psw.reshape(5, 2) if psw is not None else None)
    else:
        ps = psw
    offsets = None if offsets is None else torch.tensor(offsets)
    y = F.embedding_bag(idx, w, offsets, per_sample_weights=ps, **case)
    (y * torch.tensor(inputs["g"][: y.shape[0]])).sum().backward()
    out[name + "/y"], out[name + "/gw"] = y, w.grad
    if psw is not None:
        out[name + "/gpsw"] = psw.grad
"""


def _run(case: dict, w: gw.Tensor, psw: gw.Tensor | None) -> gw.Tensor:
    case = dict(case)
    case.pop("psw", None)
    offsets = case.pop("offsets")
    idx = gw.tensor(IDX)
    ps = psw
    if case.pop("2d", False):
        idx = idx.reshape(5, 2)
        ps = psw.reshape(5, 2) if psw is not None else None
    off = None if offsets is None else gw.tensor(offsets)
    return F.embedding_bag(idx, w, off, per_sample_weights=ps, **case)


@pytest.fixture(scope="module")
def torch_ref():
    return torch_values(SNIPPET % (CASES,), {"w": W, "idx": IDX, "g": G_OUT, "psw": PSW})


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_values_and_gradients(torch_ref, name):
    case = CASES[name]
    w = gw.tensor(W, requires_grad=True)
    psw = gw.tensor(PSW, requires_grad=True) if case.get("psw") else None
    y = _run(case, w, psw)
    (y * gw.tensor(G_OUT[: y.shape[0]])).sum().backward()
    np.testing.assert_allclose(y.detach().numpy(), torch_ref[f"{name}/y"], rtol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), torch_ref[f"{name}/gw"], rtol=1e-12)
    if psw is not None:
        np.testing.assert_allclose(psw.grad.numpy(), torch_ref[f"{name}/gpsw"], rtol=1e-12)
    assert y.grad_fn.name() == "EmbeddingBagBackward0"


@pytest.mark.parametrize("name", ["sum", "mean-padding", "max", "sum-weights", "max-2d"])
def test_gradcheck_and_second_derivatives(name):
    case = CASES[name]
    w = gw.tensor(W, requires_grad=True)
    if case.get("psw"):
        psw = gw.tensor(PSW, requires_grad=True)
        assert gradcheck(lambda w, p: _run(case, w, p), (w, psw))
        assert gradgradcheck(lambda w, p: _run(case, w, p) ** 2, (w, psw))
    else:
        assert gradcheck(lambda w: _run(case, w, None), (w,))
        assert gradgradcheck(lambda w: _run(case, w, None) ** 2, (w,))


def test_scale_grad_by_freq_divides_each_rows_gradient_by_its_count():
    # The documented rule (PyTorch 2.13's CPU kernel divides by the count of another index).
    w = gw.ones(7, 1, requires_grad=True)
    out = F.embedding_bag(
        gw.tensor(IDX), w, gw.tensor([0, 4, 7]), mode="sum", scale_grad_by_freq=True
    )
    out.sum().backward()
    np.testing.assert_allclose(w.grad.numpy().ravel(), [0, 1, 1, 1, 1, 1, 1])


def test_module_defaults_from_pretrained_and_repr():
    bag = nn.EmbeddingBag(10, 4, padding_idx=2)
    assert bag.mode == "mean" and bag.weight.shape == (10, 4)
    np.testing.assert_array_equal(bag.weight.detach().numpy()[2], np.zeros(4))
    assert repr(bag) == "EmbeddingBag(10, 4, mode='mean', padding_idx=2)"
    out = bag(gw.tensor([[0, 1, 3], [3, 3, 9]]))
    assert out.shape == (2, 4)
    out.sum().backward()
    assert bag.weight.grad is not None and not bag.weight.grad.numpy()[2].any()
    table = gw.tensor(W)
    frozen = nn.EmbeddingBag.from_pretrained(table, mode="sum")
    assert not frozen.weight.requires_grad
    np.testing.assert_allclose(
        frozen(gw.tensor([1, 2, 4]), gw.tensor([0, 1])).numpy(), [W[1], W[2] + W[4]]
    )
    assert nn.EmbeddingBag.from_pretrained(table, freeze=False).weight.requires_grad


def test_errors_use_pytorchs_words():
    w = gw.tensor(W)
    idx, off = gw.tensor(IDX), gw.tensor([0, 4])
    with pytest.raises(ValueError, match="mode has to be one of sum, mean or max"):
        F.embedding_bag(idx, w, off, mode="avg")
    with pytest.raises(NotImplementedError, match="only supported for mode='sum'"):
        F.embedding_bag(idx, w, off, mode="max", per_sample_weights=gw.ones(10))
    with pytest.raises(ValueError, match="must have the same shape as the input"):
        F.embedding_bag(idx, w, off, mode="sum", per_sample_weights=gw.ones(9))
    with pytest.raises(ValueError, match="if input is 2D, then offsets has to be None"):
        F.embedding_bag(idx.reshape(2, 5), w, off)
    with pytest.raises(ValueError, match="offsets has to be a 1D Tensor but got None"):
        F.embedding_bag(idx, w)
    with pytest.raises(RuntimeError, match="offsets\\[0\\] has to be 0"):
        F.embedding_bag(idx, w, gw.tensor([1, 4]))
    with pytest.raises(RuntimeError, match="can not be greater than input's length 10"):
        F.embedding_bag(idx, w, gw.tensor([0, 11]))
    with pytest.raises(RuntimeError, match="not in the valid range \\[0, 7\\)"):
        F.embedding_bag(gw.tensor([1, 7]), w, gw.tensor([0]))
    with pytest.raises(ValueError, match="max mode does not support scaling"):
        F.embedding_bag(idx, w, off, mode="max", scale_grad_by_freq=True)
    with pytest.raises(ArgumentError, match="Long or Int"):
        F.embedding_bag(gw.tensor([1.0]), w, gw.tensor([0]))
    with pytest.raises(ValueError, match="max mode does not support sparse weights"):
        F.embedding_bag(idx, w, off, mode="max", sparse=True)
