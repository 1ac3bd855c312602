"""BatchNorm1d/2d, LayerNorm, Flatten, Softmax and LogSoftmax: gradcheck, running statistics
by hand, train/eval behaviour, and PyTorch's values and gradients where torch imports."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest
from gradwire import nn
from gradwire.autograd import gradcheck, gradgradcheck
from gradwire.nn import functional as F
from torch_oracle import torch_values

RNG = np.random.default_rng(7)
X2 = RNG.standard_normal((6, 3))
X3 = RNG.standard_normal((4, 3, 5))
X4 = RNG.standard_normal((4, 3, 2, 3))
W = RNG.standard_normal(3)
B = RNG.standard_normal(3)
LN_X = RNG.standard_normal((2, 3, 4))
LN_W = RNG.standard_normal(4)
LN_B = RNG.standard_normal(4)
G4 = RNG.standard_normal((4, 3, 2, 3))


def t64(a, grad=True):
    return gw.tensor(np.array(a, dtype=np.float64), requires_grad=grad)


# ------------------------------------------------------------------ gradcheck
@pytest.mark.parametrize("x", [X2, X3, X4], ids=["NC", "NCL", "NCHW"])
def test_batch_norm_train_gradcheck(x):
    def fn(inp, w, b):
        return F.batch_norm(inp, None, None, w, b, training=True)

    assert gradcheck(fn, (t64(x), t64(W), t64(B)))


def test_batch_norm_eval_and_layer_norm_gradcheck():
    rm, rv = t64(RNG.standard_normal(3), False), t64(RNG.random(3) + 0.5, False)
    assert gradcheck(
        lambda i, w, b: F.batch_norm(i, rm, rv, w, b, training=False), (t64(X4), t64(W), t64(B))
    )
    assert gradcheck(lambda i, w, b: F.layer_norm(i, (4,), w, b), (t64(LN_X), t64(LN_W), t64(LN_B)))
    assert gradcheck(lambda i: F.layer_norm(i, (3, 4)), (t64(LN_X),))
    assert gradgradcheck(lambda i: F.layer_norm(i, (4,)), (t64(LN_X[0]),))


# ------------------------------------------------------------------ statistics by hand
def test_running_statistics_after_steps_match_a_hand_computation():
    bn = nn.BatchNorm2d(3, momentum=0.3).double()
    rm, rv = np.zeros(3), np.ones(3)
    for step in range(3):
        x = RNG.standard_normal((5, 3, 2, 2)) * (step + 1) + step
        y = bn(gw.tensor(x))
        mean = x.mean(axis=(0, 2, 3))
        var_b = x.var(axis=(0, 2, 3))
        var_u = x.var(axis=(0, 2, 3), ddof=1)
        rm, rv = 0.7 * rm + 0.3 * mean, 0.7 * rv + 0.3 * var_u
        expect = (x - mean[None, :, None, None]) / np.sqrt(var_b[None, :, None, None] + 1e-5)
        np.testing.assert_allclose(y.detach().numpy(), expect, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-12)
    np.testing.assert_allclose(bn.running_var.numpy(), rv, rtol=1e-12)
    assert bn.num_batches_tracked.item() == 3 and bn.num_batches_tracked.dtype == gw.int64


def test_momentum_none_is_a_cumulative_average():
    bn = nn.BatchNorm1d(2, momentum=None).double()
    xs = [RNG.standard_normal((4, 2)) + i for i in range(3)]
    for x in xs:
        bn(gw.tensor(x))
    np.testing.assert_allclose(
        bn.running_mean.numpy(), np.mean([x.mean(0) for x in xs], axis=0), rtol=1e-12
    )
    np.testing.assert_allclose(
        bn.running_var.numpy(), np.mean([x.var(0, ddof=1) for x in xs], axis=0), rtol=1e-12
    )


def test_eval_uses_running_statistics_and_leaves_them_alone():
    bn = nn.BatchNorm1d(3).double()
    with gw.no_grad():
        bn.running_mean.copy_(gw.tensor([1.0, -1.0, 0.5], dtype=gw.float64))
        bn.running_var.copy_(gw.tensor([4.0, 1.0, 0.25], dtype=gw.float64))
        bn.weight.fill_(2.0)
        bn.bias.fill_(1.0)
    bn.eval()
    x = RNG.standard_normal((2, 3, 4))
    y = bn(gw.tensor(x)).detach().numpy()
    rm, rv = np.array([1.0, -1.0, 0.5]), np.array([4.0, 1.0, 0.25])
    expect = (x - rm[:, None]) / np.sqrt(rv[:, None] + 1e-5) * 2 + 1
    np.testing.assert_allclose(y, expect, rtol=1e-12)
    assert bn.num_batches_tracked.item() == 0
    np.testing.assert_allclose(bn.running_mean.numpy(), rm)
    bn(gw.tensor(x[:1, :, :1]))  # one value per channel is fine in eval
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn.train()(gw.tensor(x[:1, :, :1]))


def test_without_tracking_batch_statistics_are_used_in_eval_too():
    bn = nn.BatchNorm1d(3, affine=False, track_running_stats=False).double().eval()
    assert bn.running_mean is None and bn.weight is None
    assert list(bn.state_dict()) == [] and list(bn.parameters()) == []
    x = RNG.standard_normal((5, 3))
    expect = (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5)
    np.testing.assert_allclose(bn(gw.tensor(x)).numpy(), expect, rtol=1e-10)


def test_buffers_state_dict_and_input_checks():
    bn = nn.BatchNorm2d(4)
    assert list(bn.state_dict()) == [
        "weight",
        "bias",
        "running_mean",
        "running_var",
        "num_batches_tracked",
    ]
    assert [n for n, _ in bn.named_buffers()] == [
        "running_mean",
        "running_var",
        "num_batches_tracked",
    ]
    assert bn.weight.dtype == gw.float32 and bn.running_var.numpy().tolist() == [1.0] * 4
    with pytest.raises(ValueError, match="expected 4D input"):
        bn(gw.zeros(2, 4))
    with pytest.raises(ValueError, match="expected 2D or 3D input"):
        nn.BatchNorm1d(4)(gw.zeros(2, 4, 1, 1))
    assert "momentum=0.1" in repr(bn)


def test_layer_norm_module_shapes_and_errors():
    ln = nn.LayerNorm([3, 4])
    assert ln.weight.shape == (3, 4) and ln.bias.shape == (3, 4)
    y = ln(gw.tensor(LN_X.astype(np.float32)))
    flat = y.detach().numpy().reshape(2, -1)
    np.testing.assert_allclose(flat.mean(1), 0, atol=1e-6)
    np.testing.assert_allclose(flat.var(1), 1, atol=1e-3)
    assert nn.LayerNorm(4, bias=False).bias is None
    assert nn.LayerNorm(4, elementwise_affine=False).weight is None
    with pytest.raises(RuntimeError, match="normalized_shape"):
        ln(gw.zeros(2, 4, 3))


def test_flatten_softmax_log_softmax_modules():
    x = gw.tensor(X4)
    assert nn.Flatten()(x).shape == (4, 18)
    assert nn.Flatten(0, 2)(x).shape == (24, 3)
    assert gw.flatten(x, 1, 2).shape == (4, 6, 3)
    assert F.flatten(x).shape == (72,)
    s = nn.Softmax(dim=1)(x)
    np.testing.assert_allclose(s.numpy().sum(1), 1.0)
    np.testing.assert_allclose(nn.LogSoftmax(dim=1)(x).exp().numpy(), s.numpy(), rtol=1e-12)
    with pytest.warns(UserWarning, match="Implicit dimension"):
        implicit = F.softmax(gw.tensor(X2))
    np.testing.assert_allclose(implicit.numpy().sum(1), 1.0)
    assert F.softmax(gw.tensor(X2), 1, dtype=gw.float32).dtype == gw.float32
    assert repr(nn.Softmax(0)) == "Softmax(dim=0)"
    assert gradcheck(lambda i: F.log_softmax(i, 0), (t64(X2),))


# ------------------------------------------------------------------ PyTorch
TORCH_SRC = """
F = torch.nn.functional

bn = torch.nn.BatchNorm2d(3).double()
with torch.no_grad():
    bn.weight.copy_(torch.tensor(inputs['w'])); bn.bias.copy_(torch.tensor(inputs['b']))
x = torch.tensor(inputs['x4'], requires_grad=True)
y = bn(x); (y * torch.tensor(inputs['g4'])).sum().backward()
out['bn_train_y'] = y; out['bn_train_gx'] = x.grad.clone(); out['bn_train_gw'] = bn.weight.grad.clone()
out['bn_train_gb'] = bn.bias.grad.clone()
y = bn(x * 2 + 1)
out['bn_rm'] = bn.running_mean.clone(); out['bn_rv'] = bn.running_var.clone()
bn.eval(); bn.weight.grad = None; x.grad = None
y = bn(x); (y * torch.tensor(inputs['g4'])).sum().backward()
out['bn_eval_y'] = y; out['bn_eval_gx'] = x.grad; out['bn_eval_gw'] = bn.weight.grad

bn1 = torch.nn.BatchNorm1d(3, momentum=None).double()
bn1(torch.tensor(inputs['x3'])); bn1(torch.tensor(inputs['x2']))
out['bn1_rm'] = bn1.running_mean; out['bn1_rv'] = bn1.running_var

ln_x = torch.tensor(inputs['ln_x'], requires_grad=True)
ln_w = torch.tensor(inputs['ln_w'], requires_grad=True)
ln_b = torch.tensor(inputs['ln_b'], requires_grad=True)
y = F.layer_norm(ln_x, (4,), ln_w, ln_b)
(y * torch.tensor(inputs['ln_x'])).sum().backward()
out['ln_y'] = y; out['ln_gx'] = ln_x.grad; out['ln_gw'] = ln_w.grad; out['ln_gb'] = ln_b.grad

for name, fn in (('sm', F.softmax), ('lsm', F.log_softmax)):
    for d in (0, 1, 2):
        xx = torch.tensor(inputs['ln_x'], requires_grad=True)
        y = fn(xx, dim=d); (y * torch.tensor(inputs['ln_w'])).sum().backward()
        out[f'{name}{d}_y'] = y; out[f'{name}{d}_g'] = xx.grad
"""


@pytest.fixture(scope="module")
def torch_out():
    return torch_values(
        TORCH_SRC,
        {
            "x4": X4,
            "x3": X3,
            "x2": X2,
            "w": W,
            "b": B,
            "g4": G4,
            "ln_x": LN_X,
            "ln_w": LN_W,
            "ln_b": LN_B,
        },
    )


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a), b, rtol=1e-9, atol=1e-11)


def test_batch_norm_matches_torch_in_train_and_eval(torch_out):
    bn = nn.BatchNorm2d(3).double()
    with gw.no_grad():
        bn.weight.copy_(gw.tensor(W))
        bn.bias.copy_(gw.tensor(B))
    x = gw.tensor(X4, requires_grad=True)
    y = bn(x)
    (y * gw.tensor(G4)).sum().backward()
    _close(y.detach(), torch_out["bn_train_y"])
    _close(x.grad, torch_out["bn_train_gx"])
    _close(bn.weight.grad, torch_out["bn_train_gw"])
    _close(bn.bias.grad, torch_out["bn_train_gb"])
    bn(x * 2 + 1)
    _close(bn.running_mean, torch_out["bn_rm"])
    _close(bn.running_var, torch_out["bn_rv"])
    bn.eval()
    bn.weight.grad = x.grad = None
    y = bn(x)
    (y * gw.tensor(G4)).sum().backward()
    _close(y.detach(), torch_out["bn_eval_y"])
    _close(x.grad, torch_out["bn_eval_gx"])
    _close(bn.weight.grad, torch_out["bn_eval_gw"])
    bn1 = nn.BatchNorm1d(3, momentum=None).double()
    bn1(gw.tensor(X3))
    bn1(gw.tensor(X2))
    _close(bn1.running_mean, torch_out["bn1_rm"])
    _close(bn1.running_var, torch_out["bn1_rv"])


def test_layer_norm_and_softmax_match_torch(torch_out):
    x, w, b = t64(LN_X), t64(LN_W), t64(LN_B)
    y = F.layer_norm(x, (4,), w, b)
    (y * gw.tensor(LN_X)).sum().backward()
    _close(y.detach(), torch_out["ln_y"])
    for got, key in ((x.grad, "ln_gx"), (w.grad, "ln_gw"), (b.grad, "ln_gb")):
        _close(got, torch_out[key])
    for name, fn in (("sm", F.softmax), ("lsm", F.log_softmax)):
        for d in (0, 1, 2):
            xx = t64(LN_X)
            y = fn(xx, dim=d)
            (y * gw.tensor(LN_W)).sum().backward()
            _close(y.detach(), torch_out[f"{name}{d}_y"])
            _close(xx.grad, torch_out[f"{name}{d}_g"])
