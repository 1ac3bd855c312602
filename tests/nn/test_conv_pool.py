"""Conv2d, MaxPool2d, AvgPool2d and AdaptiveAvgPool2d: gradcheck, values against a naive
loop reference, shapes, errors, and PyTorch's values and gradients where torch imports."""

from __future__ import annotations

import math

import gradwire as gw
import numpy as np
import pytest
from gradwire import nn
from gradwire.autograd import gradcheck, gradgradcheck
from gradwire.errors import ArgumentError
from gradwire.nn import functional as F
from torch_oracle import torch_values

RNG = np.random.default_rng(21)


def t64(a, grad=True):
    return gw.tensor(np.array(a, dtype=np.float64), requires_grad=grad)


def naive_conv(x, w, b, stride, pad, dil, groups):
    """Direct loops over every output element (tiny shapes only)."""
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dil
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, ho, wo))
    og = o // groups
    for oc in range(o):
        g = oc // og
        for i in range(ho):
            for j in range(wo):
                win = xp[:, g * cg : (g + 1) * cg, i * sh : i * sh + dh * (kh - 1) + 1 : dh]
                win = win[..., j * sw : j * sw + dw * (kw - 1) + 1 : dw]
                out[:, oc, i, j] = (win * w[oc]).sum(axis=(1, 2, 3)) + (0 if b is None else b[oc])
    return out


def naive_pool(x, k, s, p, reduce, ceil=False, include_pad=True):
    n, c, h, w = x.shape
    outs = []
    for size in (h, w):
        o = -(-(size + 2 * p - k) // s) + 1 if ceil else (size + 2 * p - k) // s + 1
        if ceil and (o - 1) * s >= size + p:
            o -= 1
        outs.append(o)
    res = np.zeros((n, c, *outs))
    for i in range(outs[0]):
        for j in range(outs[1]):
            r0, c0 = i * s - p, j * s - p
            r1, c1 = min(r0 + k, h + p), min(c0 + k, w + p)
            win = x[:, :, max(r0, 0) : min(r1, h), max(c0, 0) : min(c1, w)]
            if reduce == "max":
                res[:, :, i, j] = win.max(axis=(2, 3))
            else:
                div = (r1 - r0) * (c1 - c0) if include_pad else win.shape[2] * win.shape[3]
                res[:, :, i, j] = win.sum(axis=(2, 3)) / div
    return res


# (in_channels, out_channels, kernel, stride, padding, dilation, groups, bias)
CONV_CASES = [
    (3, 4, (3, 3), 1, 0, 1, 1, True),
    (3, 4, (3, 2), 2, 1, 1, 1, False),
    (4, 6, (2, 3), (2, 1), (1, 2), (2, 1), 2, True),
    (4, 4, (3, 3), 1, 1, 2, 4, True),
    (2, 3, (1, 1), 3, 0, 1, 1, True),
    (3, 2, (3, 3), 1, "same", 1, 1, True),
    (3, 2, (2, 2), 1, "same", 2, 1, False),
]
CONV_IDS = [f"case{i}" for i in range(len(CONV_CASES))]


def conv_inputs(case, dtype=np.float64):
    cin, cout, k, _, _, _, groups, bias = case
    x = RNG.standard_normal((2, cin, 7, 6)).astype(dtype)
    w = RNG.standard_normal((cout, cin // groups, *k)).astype(dtype)
    b = RNG.standard_normal(cout).astype(dtype) if bias else None
    return x, w, b


def conv_kwargs(case):
    _, _, _, stride, padding, dilation, groups, _ = case
    return dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


CONV_DATA = [conv_inputs(c) for c in CONV_CASES]


# ------------------------------------------------------------------ gradcheck
@pytest.mark.parametrize("case, data", list(zip(CONV_CASES, CONV_DATA)), ids=CONV_IDS)
def test_conv2d_gradcheck(case, data):
    x, w, b = data
    kw = conv_kwargs(case)
    if b is None:
        assert gradcheck(lambda x_, w_: F.conv2d(x_, w_, None, **kw), (t64(x), t64(w)))
    else:
        assert gradcheck(lambda x_, w_, b_: F.conv2d(x_, w_, b_, **kw), (t64(x), t64(w), t64(b)))


def test_conv2d_second_derivatives():
    x, w, b = CONV_DATA[2]
    kw = conv_kwargs(CONV_CASES[2])
    assert gradgradcheck(lambda x_, w_, b_: F.conv2d(x_, w_, b_, **kw), (t64(x), t64(w), t64(b)))


POOL_X = RNG.standard_normal((2, 3, 7, 6))


@pytest.mark.parametrize(
    "kw",
    [
        dict(kernel_size=2),
        dict(kernel_size=3, stride=2, padding=1),
        dict(kernel_size=(3, 2), stride=(2, 1), ceil_mode=True),
        dict(kernel_size=2, stride=1, dilation=2, padding=1),
    ],
)
def test_max_pool2d_gradcheck(kw):
    assert gradcheck(lambda x: F.max_pool2d(x, **kw), (t64(POOL_X),))
    assert gradgradcheck(lambda x: F.max_pool2d(x, **kw), (t64(POOL_X[:1]),))


@pytest.mark.parametrize(
    "kw",
    [
        dict(kernel_size=2),
        dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
        dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
        dict(kernel_size=(2, 3), stride=1, divisor_override=5),
    ],
)
def test_avg_pool2d_gradcheck(kw):
    assert gradcheck(lambda x: F.avg_pool2d(x, **kw), (t64(POOL_X),))
    assert gradgradcheck(lambda x: F.avg_pool2d(x, **kw), (t64(POOL_X[:1]),))


@pytest.mark.parametrize("size", [1, 3, (7, 2), (None, 4), (5, 5)])
def test_adaptive_avg_pool2d_gradcheck(size):
    assert gradcheck(lambda x: F.adaptive_avg_pool2d(x, size), (t64(POOL_X),))


# ------------------------------------------------------------------ values by hand
@pytest.mark.parametrize("case, data", list(zip(CONV_CASES, CONV_DATA)), ids=CONV_IDS)
def test_conv2d_matches_a_direct_loop(case, data):
    x, w, b = data
    kw = conv_kwargs(case)
    got = F.conv2d(t64(x, False), t64(w, False), None if b is None else t64(b, False), **kw)
    pad = kw["padding"]
    if pad == "same":
        d = kw["dilation"]
        totals = [d * (k - 1) for k in w.shape[2:]]
        x = np.pad(x, ((0, 0), (0, 0), *[(t // 2, t - t // 2) for t in totals]))
        pad = 0

    def pair(v):
        return v if isinstance(v, tuple) else (v, v)

    want = naive_conv(x, w, b, pair(kw["stride"]), pair(pad), pair(kw["dilation"]), kw["groups"])
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_conv2d_float32_matches_float64():
    x, w, b = CONV_DATA[2]
    kw = conv_kwargs(CONV_CASES[2])
    args32 = [gw.tensor(a.astype(np.float32), requires_grad=True) for a in (x, w, b)]
    y32 = F.conv2d(*args32, **kw)
    y32.sum().backward()
    args64 = [t64(a) for a in (x, w, b)]
    y64 = F.conv2d(*args64, **kw)
    y64.sum().backward()
    assert y32.dtype == gw.float32 and args32[0].grad.dtype == gw.float32
    np.testing.assert_allclose(y32.detach().numpy(), y64.detach().numpy(), rtol=1e-4, atol=1e-4)
    for a32, a64 in zip(args32, args64):
        np.testing.assert_allclose(a32.grad.numpy(), a64.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_conv2d_frozen_weight_and_non_contiguous_input():
    x, w, b = CONV_DATA[1]
    kw = conv_kwargs(CONV_CASES[1])
    xt = t64(np.ascontiguousarray(x.transpose(0, 1, 3, 2)))  # a transposed view feeds conv
    assert gradcheck(lambda a: F.conv2d(a.transpose(2, 3), t64(w, False), None, **kw), (xt,))
    wt = t64(w)
    assert gradcheck(lambda w_: F.conv2d(t64(x, False), w_, None, **kw), (wt,))
    with gw.no_grad():
        assert F.conv2d(t64(x), wt, None, **kw).grad_fn is None


@pytest.mark.parametrize("groups", [1, 2])
def test_conv2d_weight_grad_of_a_larger_layer(groups):
    # Large enough for the single-GEMM weight gradient (small ones take a per-image path).
    x = RNG.standard_normal((2, 8, 32, 32))
    w = RNG.standard_normal((16, 8 // groups, 3, 3))
    g = RNG.standard_normal((2, 16, 32, 32))
    wt = t64(w)
    F.conv2d(t64(x, False), wt, padding=1, groups=groups).backward(gw.tensor(g))
    win = np.lib.stride_tricks.sliding_window_view(
        np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3)
    )
    og, cg = 16 // groups, 8 // groups
    want = np.concatenate(
        [
            np.einsum(
                "nohw,nchwij->ocij", g[:, i * og : (i + 1) * og], win[:, i * cg : (i + 1) * cg]
            )
            for i in range(groups)
        ]
    )
    np.testing.assert_allclose(wt.grad.numpy(), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("k, s, p, ceil", [(2, 2, 0, False), (3, 2, 1, True), (3, 1, 1, False)])
def test_pools_match_a_direct_loop(k, s, p, ceil):
    x = t64(POOL_X, False)
    want_max = naive_pool(POOL_X, k, s, p, "max", ceil)
    np.testing.assert_allclose(F.max_pool2d(x, k, s, p, ceil_mode=ceil).numpy(), want_max)
    for inc in (True, False):
        got = F.avg_pool2d(x, k, s, p, ceil_mode=ceil, count_include_pad=inc).numpy()
        np.testing.assert_allclose(got, naive_pool(POOL_X, k, s, p, "avg", ceil, inc), rtol=1e-12)


def test_max_pool2d_indices_and_gradient_go_to_the_maximum():
    x = gw.tensor([[[[1.0, 5.0, 2.0], [3.0, 4.0, 9.0], [0.0, 8.0, 7.0]]]], requires_grad=True)
    values, indices = F.max_pool2d(x, 2, stride=1, return_indices=True)
    assert values.tolist() == [[[[5.0, 9.0], [8.0, 9.0]]]]
    assert indices.tolist() == [[[[1, 5], [7, 5]]]] and indices.grad_fn is None
    values.sum().backward()
    assert x.grad.tolist() == [[[[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [0.0, 1.0, 0.0]]]]
    ties = gw.tensor([[[[2.0, 2.0], [float("nan"), 1.0]]]], requires_grad=True)
    tv, ti = F.max_pool2d(ties, 2, return_indices=True)
    assert math.isnan(tv.item()) and ti.item() == 2  # a NaN wins, as in PyTorch
    assert F.max_pool2d(gw.tensor([[[[2.0, 2.0]]]]), (1, 2), return_indices=True)[1].item() == 0


def test_adaptive_avg_pool2d_uneven_windows_by_hand():
    x = gw.arange(5.0).reshape(1, 1, 1, 5)
    # Windows [0, 2), [1, 4), [3, 5) for 5 -> 3.
    got = F.adaptive_avg_pool2d(x, (1, 3))
    np.testing.assert_allclose(got.numpy().ravel(), [0.5, 2.0, 3.5])


# ------------------------------------------------------------------ modules and shapes
def test_conv2d_module_shapes_init_and_repr():
    gw.manual_seed(0)
    conv = nn.Conv2d(4, 8, (3, 2), stride=2, padding=1, groups=2)
    assert conv.weight.shape == (8, 2, 3, 2) and conv.bias.shape == (8,)
    bound = 1 / math.sqrt(2 * 3 * 2)  # kaiming_uniform_(a=sqrt(5)) and the bias share it
    assert np.abs(conv.weight.detach().numpy()).max() <= bound
    assert np.abs(conv.bias.detach().numpy()).max() <= bound
    assert conv(gw.randn(5, 4, 9, 8)).shape == (5, 8, 5, 5)
    assert conv(gw.randn(4, 9, 8)).shape == (8, 5, 5)
    assert repr(conv) == (
        "Conv2d(4, 8, kernel_size=(3, 2), stride=(2, 2), padding=(1, 1), groups=2)"
    )
    same = nn.Conv2d(3, 5, 4, padding="same", bias=False, dtype=gw.float64)
    assert same.bias is None and same.weight.dtype == gw.float64
    assert same(gw.randn(2, 3, 7, 6, dtype=gw.float64)).shape == (2, 5, 7, 6)
    assert [n for n, _ in conv.named_parameters()] == ["weight", "bias"]


def test_pool_module_shapes_and_repr():
    x = gw.randn(2, 3, 9, 8)
    assert nn.MaxPool2d(2)(x).shape == (2, 3, 4, 4)
    assert nn.MaxPool2d(3, 2, ceil_mode=True)(x).shape == (2, 3, 4, 4)
    vals, idx = nn.MaxPool2d(2, return_indices=True)(x[0])
    assert vals.shape == idx.shape == (3, 4, 4)
    assert nn.AvgPool2d(3, 1, 1)(x).shape == (2, 3, 9, 8)
    assert nn.AdaptiveAvgPool2d((5, None))(x).shape == (2, 3, 5, 8)
    assert nn.AdaptiveAvgPool2d(1)(x[0]).shape == (3, 1, 1)
    assert repr(nn.MaxPool2d(2)) == (
        "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)"
    )
    assert repr(nn.AvgPool2d(3)) == "AvgPool2d(kernel_size=3, stride=3, padding=0)"
    assert repr(nn.AdaptiveAvgPool2d((2, None))) == "AdaptiveAvgPool2d(output_size=(2, None))"


def test_small_cnn_trains():
    gw.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
    )
    x = gw.randn(8, 1, 8, 8)
    target = gw.randn(8, 4, 1, 1)
    opt = gw.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = F.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


# ------------------------------------------------------------------ errors
def test_conv2d_errors_name_the_problem():
    x, w = gw.randn(2, 3, 5, 5), gw.randn(4, 3, 3, 3)
    with pytest.raises(RuntimeError, match="to have 3 channels, but got 2 channels"):
        F.conv2d(gw.randn(2, 2, 5, 5), w)
    with pytest.raises(RuntimeError, match="divisible by 3 at dimension 0"):
        F.conv2d(gw.randn(2, 3, 5, 5), gw.randn(4, 1, 3, 3), groups=3)
    with pytest.raises(RuntimeError, match="Kernel size can't be greater"):
        F.conv2d(gw.randn(1, 3, 2, 2), w)
    with pytest.raises(RuntimeError, match="Expected 3D \\(unbatched\\) or 4D"):
        F.conv2d(gw.randn(3, 5), w)
    with pytest.raises(RuntimeError, match="bias to be 1-dimensional with 4 elements"):
        F.conv2d(x, w, gw.randn(3))
    with pytest.raises(RuntimeError, match="same dtype"):
        F.conv2d(x.double(), w)
    with pytest.raises(ArgumentError, match="non-positive stride"):
        F.conv2d(x, w, stride=0)
    with pytest.raises(ValueError, match="strided convolutions"):
        F.conv2d(x, w, padding="same", stride=2)
    with pytest.raises(ValueError, match="Invalid padding string"):
        F.conv2d(x, w, padding="full")


def test_conv2d_module_errors():
    with pytest.raises(ValueError, match="in_channels must be divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="out_channels must be divisible by groups"):
        nn.Conv2d(4, 3, 3, groups=2)
    with pytest.raises(NotImplementedError, match="padding_mode='reflect'"):
        nn.Conv2d(3, 4, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="padding_mode must be one of"):
        nn.Conv2d(3, 4, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match="strided convolutions"):
        nn.Conv2d(3, 4, 3, stride=2, padding="same")
    with pytest.raises(TypeError, match="kernel_size must be an int or a tuple"):
        nn.Conv2d(3, 4, (3, 3, 3))


def test_pool_errors():
    x = gw.randn(1, 2, 4, 4)
    with pytest.raises(RuntimeError, match="pad should be at most half"):
        F.max_pool2d(x, 2, padding=2)
    with pytest.raises(RuntimeError, match="Output size is too small"):
        F.avg_pool2d(x, 5)
    with pytest.raises(RuntimeError, match="divisor must be not zero"):
        F.avg_pool2d(x, 2, divisor_override=0)
    with pytest.raises(RuntimeError, match="3D \\(C, H, W\\) or 4D"):
        F.max_pool2d(gw.randn(4, 4), 2)
    with pytest.raises(RuntimeError, match="output_size must be positive"):
        F.adaptive_avg_pool2d(x, 0)


# ------------------------------------------------------------------ PyTorch differential
POOL_CASES = [
    ("max_pool2d", dict(kernel_size=2)),
    ("max_pool2d", dict(kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=True)),
    ("max_pool2d", dict(kernel_size=(2, 3), stride=1, dilation=(2, 1), padding=(1, 1))),
    ("avg_pool2d", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("avg_pool2d", dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("avg_pool2d", dict(kernel_size=2, divisor_override=3)),
    ("adaptive_avg_pool2d", dict(output_size=(4, 5))),
    ("adaptive_avg_pool2d", dict(output_size=(None, 3))),
]


def _gradwire_conv(case, data, g):
    x, w, b = (None if a is None else t64(a) for a in data)
    y = F.conv2d(x, w, b, **conv_kwargs(case))
    y.backward(gw.tensor(g))
    grads = [x.grad.numpy(), w.grad.numpy()] + ([] if b is None else [b.grad.numpy()])
    return y.detach().numpy(), grads


@pytest.fixture(scope="module")
def torch_results():
    inputs, lines = {}, []
    for i, (case, (x, w, b)) in enumerate(zip(CONV_CASES, CONV_DATA)):
        inputs[f"x{i}"], inputs[f"w{i}"] = x, w
        bias = "None"
        if b is not None:
            inputs[f"b{i}"] = b
            bias = f"torch.tensor(inputs['b{i}'], requires_grad=True)"
        lines += [
            f"x = torch.tensor(inputs['x{i}'], requires_grad=True)",
            f"w = torch.tensor(inputs['w{i}'], requires_grad=True)",
            f"b = {bias}",
            f"y = torch.nn.functional.conv2d(x, w, b, **{conv_kwargs(case)!r})",
            f"g = torch.tensor(np.random.default_rng({i}).standard_normal(tuple(y.shape)))",
            "y.backward(g)",
            f"out['conv_y{i}'] = y; out['conv_g{i}'] = g",
            f"out['conv_gx{i}'] = x.grad; out['conv_gw{i}'] = w.grad",
            f"out['conv_gb{i}'] = b.grad if b is not None else np.zeros(0)",
        ]
    inputs["pool_x"] = POOL_X
    for i, (fn, kw) in enumerate(POOL_CASES):
        lines += [
            "x = torch.tensor(inputs['pool_x'], requires_grad=True)",
            f"y = torch.nn.functional.{fn}(x, **{kw!r})",
            f"g = torch.tensor(np.random.default_rng({100 + i}).standard_normal(tuple(y.shape)))",
            "y.backward(g)",
            f"out['pool_y{i}'] = y; out['pool_g{i}'] = g; out['pool_gx{i}'] = x.grad",
        ]
    lines += [
        "torch.manual_seed(0)",
        "conv = torch.nn.Conv2d(4, 6, (3, 2), groups=2)",
        "out['init_w_shape'] = np.array(conv.weight.shape)",
        "out['init_w_absmax'] = conv.weight.detach().abs().max()",
    ]
    return torch_values("\n".join(lines), inputs)


@pytest.mark.parametrize("i", range(len(CONV_CASES)), ids=CONV_IDS)
def test_conv2d_matches_torch(torch_results, i):
    got_y, grads = _gradwire_conv(CONV_CASES[i], CONV_DATA[i], torch_results[f"conv_g{i}"])
    assert got_y.shape == torch_results[f"conv_y{i}"].shape  # gradwire side: the shape
    np.testing.assert_allclose(got_y, torch_results[f"conv_y{i}"], rtol=1e-10, atol=1e-10)
    want = [torch_results[f"conv_gx{i}"], torch_results[f"conv_gw{i}"]]
    if CONV_DATA[i][2] is not None:
        want.append(torch_results[f"conv_gb{i}"])
    for got, exp in zip(grads, want):
        np.testing.assert_allclose(got, exp, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("i", range(len(POOL_CASES)), ids=[c[0] for c in POOL_CASES])
def test_pools_match_torch(torch_results, i):
    fn, kw = POOL_CASES[i]
    x = t64(POOL_X)
    y = getattr(F, fn)(x, **kw)
    y.backward(gw.tensor(torch_results[f"pool_g{i}"]))
    np.testing.assert_allclose(y.detach().numpy(), torch_results[f"pool_y{i}"], rtol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), torch_results[f"pool_gx{i}"], rtol=1e-12)


def test_conv2d_init_matches_torch_bounds(torch_results):
    conv = nn.Conv2d(4, 6, (3, 2), groups=2)
    assert tuple(torch_results["init_w_shape"]) == conv.weight.shape
    bound = 1 / math.sqrt(2 * 3 * 2)
    assert float(torch_results["init_w_absmax"]) <= bound
    assert np.abs(conv.weight.detach().numpy()).max() <= bound
