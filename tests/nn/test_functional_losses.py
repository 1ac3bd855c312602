"""nll_loss, cross_entropy (weight, ignore_index, reduction, label_smoothing, probabilities),
NLLLoss/CrossEntropyLoss modules, relu(inplace): gradcheck, hand values and PyTorch's values."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest
from gradwire import nn
from gradwire.autograd import gradcheck
from gradwire.nn import functional as F
from torch_oracle import torch_values

RNG = np.random.default_rng(11)
X2 = RNG.standard_normal((5, 4))
T2 = np.array([1, 0, 3, -100, 2])
X4 = RNG.standard_normal((2, 4, 3, 2))
T4 = RNG.integers(0, 4, (2, 3, 2))
T4[0, 1, 1] = 2
T4[1, 0, 0] = -1  # ignored below with ignore_index=-1
X1 = RNG.standard_normal(4)
W = np.array([0.5, 2.0, 1.0, 1.5])
P2 = RNG.random((5, 4))
P2 /= P2.sum(1, keepdims=True)

# (name, input, target, kwargs) run by both sides
CASES = [
    ("mean", X2, T2, {}),
    ("sum_w", X2, T2, {"weight": "W", "reduction": "sum"}),
    ("none_w", X2, T2, {"weight": "W", "reduction": "none"}),
    ("mean_w", X2, T2, {"weight": "W"}),
    ("ign", X4, T4, {"ignore_index": -1}),
    ("ign_w_none", X4, T4, {"ignore_index": -1, "weight": "W", "reduction": "none"}),
    ("unbatched", X1, np.array(2), {}),
    ("unbatched_w", X1, np.array(3), {"weight": "W"}),
]
CE_ONLY = [
    ("ls", X2, T2, {"label_smoothing": 0.2}),
    ("ls_w", X2, T2, {"label_smoothing": 0.1, "weight": "W"}),
    (
        "ls_w_sum",
        X4,
        T4,
        {"label_smoothing": 0.3, "weight": "W", "ignore_index": -1, "reduction": "sum"},
    ),
    ("probs", X2, P2, {}),
    ("probs_w_ls", X2, P2, {"weight": "W", "label_smoothing": 0.2, "reduction": "none"}),
]


def _kwargs(kw):
    return {k: (gw.tensor(W) if v == "W" else v) for k, v in kw.items()}


def _inputs(x, t):
    target = gw.tensor(t) if t.dtype.kind == "f" else gw.tensor(t.astype(np.int64))
    return gw.tensor(x, requires_grad=True), target


def _run(fn, x, t, kw):
    xi, ti = _inputs(x, t)
    out = fn(xi, ti, **_kwargs(kw))
    out.backward(gw.ones_like(out))
    return out.detach().numpy(), xi.grad.numpy()


# ------------------------------------------------------------------ gradwire alone
@pytest.mark.parametrize("name,x,t,kw", CASES, ids=[c[0] for c in CASES])
def test_nll_and_cross_entropy_gradcheck(name, x, t, kw):
    _, target = _inputs(x, t)
    kwargs = _kwargs(kw)
    xi = gw.tensor(x, requires_grad=True)
    assert gradcheck(lambda i: F.nll_loss(i, target, **kwargs), (xi,))
    assert gradcheck(lambda i: F.cross_entropy(i, target, **kwargs), (xi,))


@pytest.mark.parametrize("name,x,t,kw", CE_ONLY, ids=[c[0] for c in CE_ONLY])
def test_cross_entropy_smoothing_and_probabilities_gradcheck(name, x, t, kw):
    _, target = _inputs(x, t)
    kwargs = _kwargs(kw)
    assert gradcheck(
        lambda i: F.cross_entropy(i, target, **kwargs), (gw.tensor(x, requires_grad=True),)
    )


def test_weighted_mean_divides_by_the_weight_of_kept_targets():
    x = np.log(np.array([[0.1, 0.9], [0.6, 0.4], [0.5, 0.5]]))
    t = gw.tensor([1, 0, 1])
    w = gw.tensor([1.0, 3.0], dtype=gw.float64)
    got = F.nll_loss(gw.tensor(x), t, weight=w, ignore_index=0).item()
    assert got == pytest.approx(-(3 * np.log(0.9) + 3 * np.log(0.5)) / 6)
    per = F.nll_loss(gw.tensor(x), t, weight=w, reduction="none").numpy()
    np.testing.assert_allclose(per, [-3 * np.log(0.9), -np.log(0.6), -3 * np.log(0.5)])
    all_ignored = F.nll_loss(gw.tensor(x), gw.tensor([-100, -100, -100]))
    assert np.isnan(all_ignored.item())
    ce = F.cross_entropy(gw.tensor(x), t).item()
    assert ce == pytest.approx(-(np.log(0.9) + np.log(0.6) + np.log(0.5)) / 3)


def test_loss_modules_take_pytorchs_arguments():
    x, t = gw.tensor(X2), gw.tensor(T2)
    ce = nn.CrossEntropyLoss(weight=gw.tensor(W), label_smoothing=0.1, reduction="sum")
    assert "weight" in dict(ce.named_buffers())
    assert ce(x, t).item() == pytest.approx(
        F.cross_entropy(x, t, gw.tensor(W), label_smoothing=0.1, reduction="sum").item()
    )
    t = gw.tensor([1, 0, 3, 2, 2])
    nll = nn.NLLLoss(ignore_index=3, reduction="none")
    np.testing.assert_allclose(
        nll(x.log_softmax(1), t).numpy(),
        F.nll_loss(x.log_softmax(1), t, ignore_index=3, reduction="none").numpy(),
    )
    assert nn.NLLLoss(size_average=False).reduction == "sum"
    assert nn.CrossEntropyLoss(reduce=False).reduction == "none"


def test_clear_errors():
    x = gw.tensor(X2)
    with pytest.raises(TypeError, match="integer class indices"):
        F.nll_loss(x, gw.tensor([0.0, 1, 2, 3, 0]))
    with pytest.raises(ValueError, match="target of shape"):
        F.nll_loss(x, gw.tensor([0, 1]))
    with pytest.raises(IndexError, match="Target 4 is out of bounds"):
        F.cross_entropy(x, gw.tensor([0, 1, 4, 0, 0]))
    with pytest.raises(IndexError, match="Target -2 is out of bounds"):
        F.cross_entropy(x, gw.tensor([0, 1, -2, 0, 0]))
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        F.nll_loss(x, gw.tensor(T2), reduction="avg")
    with pytest.raises(RuntimeError, match="weight tensor should be defined"):
        F.nll_loss(x, gw.tensor(T2), weight=gw.ones(3))
    with pytest.raises(ValueError, match="label_smoothing"):
        F.cross_entropy(x, gw.tensor(T2), label_smoothing=1.5)
    with pytest.raises(ValueError, match="input's shape"):
        F.cross_entropy(x, gw.tensor(P2[:2]))


def test_relu_inplace_writes_into_the_input_and_keeps_gradients():
    x = gw.tensor([-1.0, 2.0, -3.0], dtype=gw.float64, requires_grad=True)
    h = x * 2
    out = F.relu(h, inplace=True)
    assert out is h and h.detach().numpy().tolist() == [0.0, 4.0, 0.0]
    h.sum().backward()
    assert x.grad.numpy().tolist() == [0.0, 2.0, 0.0]
    y = gw.tensor([-1.0, 1.0])
    nn.ReLU(inplace=True)(y)
    assert y.numpy().tolist() == [0.0, 1.0] and repr(nn.ReLU(True)) == "ReLU(inplace=True)"
    z = gw.tensor([-1.0, 1.0])
    F.relu(z)
    assert z.numpy().tolist() == [-1.0, 1.0]
    x, w = gw.tensor(X2, requires_grad=True), gw.tensor(X2[:3], requires_grad=True)
    assert gradcheck(F.linear, (x, w, gw.tensor(W[:3], requires_grad=True)))
    assert F.linear(x, w).shape == (5, 3)


# ------------------------------------------------------------------ PyTorch
def _torch_src():
    lines = ["F = torch.nn.functional", "W = torch.tensor(inputs['W'])"]
    for fn, cases in (("nll_loss", CASES), ("cross_entropy", CASES + CE_ONLY)):
        for name, _, _t, kw in cases:
            kws = ", ".join(f"{k}={'W' if v == 'W' else repr(v)}" for k, v in kw.items())
            tgt = f"torch.tensor(inputs['t_{name}'])"
            lines += [
                f"x = torch.tensor(inputs['x_{name}'], requires_grad=True)",
                f"y = F.{fn}(x, {tgt}, {kws})",
                "y.backward(torch.ones_like(y))",
                f"out['{fn}_{name}_y'] = y; out['{fn}_{name}_g'] = x.grad",
            ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def torch_out():
    inputs = {"W": W}
    for name, x, t, _ in CASES + CE_ONLY:
        inputs[f"x_{name}"], inputs[f"t_{name}"] = (
            x,
            (t if t.dtype.kind == "f" else t.astype(np.int64)),
        )
    return torch_values(_torch_src(), inputs)


@pytest.mark.parametrize(
    "fn,case",
    [("nll_loss", c) for c in CASES] + [("cross_entropy", c) for c in CASES + CE_ONLY],
    ids=[f"nll-{c[0]}" for c in CASES] + [f"ce-{c[0]}" for c in CASES + CE_ONLY],
)
def test_losses_match_torch(torch_out, fn, case):
    name, x, t, kw = case
    y, g = _run(getattr(F, fn), x, t, kw)
    np.testing.assert_allclose(y, torch_out[f"{fn}_{name}_y"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, torch_out[f"{fn}_{name}_g"], rtol=1e-10, atol=1e-12)
