"""Embedding, the recurrent layers (RNN, LSTM, GRU and their cells) and Dropout: gradcheck,
shapes, errors, dropout statistics, and PyTorch's values and gradients where torch imports."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest
from gradwire import nn
from gradwire.autograd import gradcheck, gradgradcheck
from gradwire.errors import ArgumentError
from gradwire.nn import functional as F
from torch_oracle import torch_values

RNG = np.random.default_rng(11)


def t64(shape, grad=True):
    return gw.tensor(RNG.standard_normal(shape), requires_grad=grad)


def flat(result):
    """The tensors of a recurrent module's result, in order: out, h_n[, c_n] or h[, c]."""
    if isinstance(result, gw.Tensor):
        return [result]
    return [t for part in result for t in flat(part)]


# ------------------------------------------------------------------ embedding
def test_embedding_gradcheck_with_duplicates_padding_and_frequency_scaling():
    idx = gw.tensor([[1, 3, 1], [0, 3, 3]])
    w = t64((5, 2))
    assert gradcheck(lambda w: F.embedding(idx, w), (w,))
    assert gradgradcheck(lambda w: F.embedding(idx, w) ** 2, (w,))
    # The padding row gets no gradient by design (not a true gradient): checked by hand below,
    # and gradcheck holds when the padding row is not looked up.
    assert gradcheck(lambda w: F.embedding(idx, w, padding_idx=4), (w,))
    # scale_grad_by_freq divides a row's gradient by its count in the batch (not a true
    # gradient, so by hand): row 1 appears twice, row 3 three times.
    F.embedding(idx, w, scale_grad_by_freq=True).sum().backward()
    np.testing.assert_allclose(w.grad.numpy()[[0, 1, 3]], 1.0)
    np.testing.assert_array_equal(w.grad.numpy()[[2, 4]], 0.0)


def test_embedding_backward_accumulates_duplicates_and_skips_the_padding_row():
    emb = nn.Embedding(6, 3, padding_idx=-2)  # row 4
    assert emb.padding_idx == 4
    np.testing.assert_array_equal(emb.weight.detach().numpy()[4], 0)
    out = emb(gw.tensor([[4, 1], [1, 1]]))
    assert out.shape == (2, 2, 3)
    out.sum().backward()
    grad = emb.weight.grad.numpy()
    np.testing.assert_array_equal(grad[1], 3)
    np.testing.assert_array_equal(grad[4], 0)
    np.testing.assert_array_equal(grad[[0, 2, 3, 5]], 0)
    assert emb(gw.tensor(2)).shape == (3,)


def test_embedding_init_is_standard_normal():
    w = nn.Embedding(4000, 25).weight.detach().numpy()
    assert abs(w.mean()) < 0.01 and abs(w.std() - 1) < 0.01


def test_from_pretrained_freezes_and_keeps_the_values():
    table = gw.tensor(np.arange(12.0).reshape(4, 3))
    emb = nn.Embedding.from_pretrained(table, padding_idx=0)
    assert not emb.weight.requires_grad
    np.testing.assert_array_equal(emb(gw.tensor([0, 2])).numpy(), [[0, 1, 2], [6, 7, 8]])
    trainable = nn.Embedding.from_pretrained(table, freeze=False)
    assert trainable.weight.requires_grad


def test_embedding_errors():
    emb = nn.Embedding(5, 2)
    with pytest.raises(IndexError, match="index out of range.*5 is outside"):
        emb(gw.tensor([1, 5]))
    with pytest.raises(IndexError, match="-1"):
        emb(gw.tensor([-1]))
    with pytest.raises(RuntimeError, match="Long, Int"):
        emb(gw.tensor([1.0]))
    with pytest.raises(NotImplementedError, match="max_norm"):
        nn.Embedding(5, 2, max_norm=1.0)
    with pytest.raises(ValueError, match="Padding_idx must be within num_embeddings"):
        nn.Embedding(5, 2, padding_idx=5)
    with pytest.raises(ValueError, match="2-dimensional"):
        nn.Embedding.from_pretrained(gw.ones(3))


# ------------------------------------------------------------------ recurrent: gradcheck
def _gradcheck_module(mod, x, states):
    params = list(mod.parameters())

    def fn(x, *rest):
        st = rest[: len(states)]
        if not st:
            return tuple(flat(mod(x)))
        return tuple(flat(mod(x, tuple(st) if len(st) == 2 else st[0])))

    assert gradcheck(fn, (x, *states, *params))


@pytest.mark.parametrize(
    "make, x_shape, state_shapes",
    [
        (lambda: nn.LSTMCell(2, 3, dtype=gw.float64), (2, 2), [(2, 3), (2, 3)]),
        (lambda: nn.GRUCell(2, 3, dtype=gw.float64), (2, 2), [(2, 3)]),
        (lambda: nn.RNNCell(2, 3, dtype=gw.float64), (2, 2), [(2, 3)]),
        (lambda: nn.RNNCell(2, 3, nonlinearity="relu", dtype=gw.float64), (2,), [(3,)]),
        (lambda: nn.LSTM(2, 3, num_layers=2, dtype=gw.float64), (3, 2, 2), [(2, 2, 3)] * 2),
        (lambda: nn.GRU(2, 3, num_layers=2, dtype=gw.float64), (3, 2, 2), [(2, 2, 3)]),
        (lambda: nn.RNN(2, 3, num_layers=2, dtype=gw.float64), (3, 2, 2), [(2, 2, 3)]),
        (lambda: nn.LSTM(2, 2, bidirectional=True, bias=False, dtype=gw.float64), (3, 1, 2), []),
        (
            lambda: nn.GRU(2, 2, bidirectional=True, batch_first=True, dtype=gw.float64),
            (1, 3, 2),
            [],
        ),
    ],
    ids=[
        "LSTMCell",
        "GRUCell",
        "RNNCell",
        "RNNCell-relu-unbatched",
        "LSTM2",
        "GRU2",
        "RNN2",
        "LSTM-bi-nobias",
        "GRU-bi-batch_first",
    ],
)
def test_recurrent_gradcheck(make, x_shape, state_shapes):
    gw.manual_seed(3)
    mod = make()
    # Keep relu pre-activations away from the kink at 0, where differences are not defined.
    x = t64(x_shape)
    _gradcheck_module(mod, x, [t64(s) for s in state_shapes])


# ------------------------------------------------------------------ recurrent: shapes, errors
def test_lstm_shapes_batch_first_unbatched_and_state_in_out():
    lstm = nn.LSTM(4, 5, num_layers=2, batch_first=True)
    names = [n for n, _ in lstm.named_parameters()]
    assert names[:4] == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]
    assert lstm.weight_ih_l0.shape == (20, 4) and lstm.weight_ih_l1.shape == (20, 5)
    bound = 1 / np.sqrt(5)
    assert all(np.abs(p.detach().numpy()).max() <= bound for p in lstm.parameters())
    out, (h, c) = lstm(gw.randn(3, 7, 4))
    assert out.shape == (3, 7, 5) and h.shape == c.shape == (2, 3, 5)
    np.testing.assert_array_equal(out[:, -1].detach().numpy(), h[1].detach().numpy())
    out2, (h2, c2) = lstm(gw.randn(3, 7, 4), (h, c))
    assert out2.shape == (3, 7, 5) and h2.shape == (2, 3, 5)
    single, (hs, cs) = lstm(gw.randn(7, 4))
    assert single.shape == (7, 5) and hs.shape == cs.shape == (2, 5)
    bi = nn.GRU(4, 5, num_layers=3, bidirectional=True)
    out, h = bi(gw.randn(6, 2, 4))
    assert out.shape == (6, 2, 10) and h.shape == (6, 2, 5)
    assert bi.weight_ih_l1_reverse.shape == (15, 10)
    # The reverse direction's final state is its output at the first timestep.
    np.testing.assert_array_equal(out[0, :, 5:].detach().numpy(), h[5].detach().numpy())


def test_cells_match_one_step_of_the_layer():
    gw.manual_seed(5)
    layer, cell = nn.GRU(3, 4, dtype=gw.float64), nn.GRUCell(3, 4, dtype=gw.float64)
    cell.load_state_dict({k[:-3]: v for k, v in layer.state_dict().items()})
    x, h = t64((1, 2, 3), False), t64((1, 2, 4), False)
    np.testing.assert_allclose(
        cell(x[0], h[0]).detach().numpy(), layer(x, h)[1][0].detach().numpy(), rtol=1e-12
    )


def test_rnn_by_hand():
    rnn = nn.RNN(1, 1, bias=False, dtype=gw.float64)
    rnn.load_state_dict({"weight_ih_l0": gw.tensor([[2.0]]), "weight_hh_l0": gw.tensor([[0.5]])})
    out, h = rnn(gw.tensor([[1.0], [0.0]], dtype=gw.float64))
    h1 = np.tanh(2.0)
    np.testing.assert_allclose(out.detach().numpy().ravel(), [h1, np.tanh(0.5 * h1)], rtol=1e-12)


def test_recurrent_errors():
    lstm = nn.LSTM(3, 4)
    with pytest.raises(RuntimeError, match="Expected 3, got 5"):
        lstm(gw.randn(2, 2, 5))
    with pytest.raises(ValueError, match="2D or 3D"):
        lstm(gw.randn(1, 2, 2, 3))
    with pytest.raises(RuntimeError, match=r"Expected hidden\[1\] size \(1, 2, 4\)"):
        lstm(gw.randn(2, 2, 3), (gw.zeros(1, 2, 4), gw.zeros(1, 3, 4)))
    with pytest.raises(ArgumentError, match="float64"):
        lstm(gw.randn(2, 2, 3, dtype=gw.float64))
    with pytest.raises(ValueError, match="dropout"):
        nn.GRU(3, 4, dropout=1.5)
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNN(3, 4, nonlinearity="sigmoid")
    with pytest.raises(NotImplementedError, match="proj_size"):
        nn.LSTM(3, 4, proj_size=2)
    with pytest.raises(RuntimeError, match="Expected hidden size"):
        nn.LSTMCell(3, 4)(gw.randn(2, 3), (gw.zeros(2, 4), gw.zeros(3, 4)))
    x = gw.randn(2, 1, 3, requires_grad=True)
    out, _ = lstm(x)
    with pytest.raises(NotImplementedError, match="create_graph=True"):
        gw.autograd.grad(out.sum(), x, create_graph=True)


def test_dropout_between_layers_only_in_training():
    gw.manual_seed(0)
    lstm = nn.LSTM(3, 8, num_layers=2, dropout=0.5)
    x = gw.randn(4, 2, 3)
    lstm.eval()
    a, b = lstm(x)[0].detach().numpy(), lstm(x)[0].detach().numpy()
    np.testing.assert_array_equal(a, b)
    lstm.train()
    gw.manual_seed(1)
    c = lstm(x)[0].detach().numpy()
    gw.manual_seed(1)
    np.testing.assert_array_equal(c, lstm(x)[0].detach().numpy())
    assert not np.allclose(a, c)


# ------------------------------------------------------------------ dropout
def test_dropout_statistics_scaling_and_gradient():
    gw.manual_seed(0)
    x = gw.ones(200, 500, requires_grad=True)
    y = F.dropout(x, p=0.3)
    vals = y.detach().numpy()
    kept = vals != 0
    assert abs(1 - kept.mean() - 0.3) < 0.01
    np.testing.assert_allclose(vals[kept], 1 / 0.7, rtol=1e-6)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), vals)
    assert gradcheck(lambda t: F.dropout(t, 0.5) if gw.manual_seed(4) else None, (t64((3, 4)),))


def test_dropout_eval_identity_edges_and_reproducibility():
    x = gw.randn(5, 6)
    drop = nn.Dropout(0.4)
    assert drop.eval()(x) is x
    assert F.dropout(x, 0.4, training=False) is x
    assert F.dropout(x, 0.0) is x
    np.testing.assert_array_equal(F.dropout(x, 1.0).numpy(), 0)
    drop.train()
    gw.manual_seed(9)
    a = drop(x).numpy()
    gw.manual_seed(9)
    np.testing.assert_array_equal(a, drop(x).numpy())
    y = x.clone()
    assert F.dropout(y, 0.5, inplace=True) is y
    assert ((y.numpy() == 0) | np.isclose(y.numpy(), 2 * x.numpy())).all()
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            F.dropout(x, bad)
        with pytest.raises(ValueError, match="between 0 and 1"):
            nn.Dropout2d(bad)


def test_dropout2d_zeroes_whole_channels():
    gw.manual_seed(2)
    x = gw.ones(40, 30, 3, 4)
    y = nn.Dropout2d(0.5)(x).numpy()
    per_channel = y.reshape(40, 30, -1)
    assert (per_channel.min(-1) == per_channel.max(-1)).all()  # each channel all 0 or all 2
    assert set(np.unique(y)) == {0.0, 2.0}
    assert abs((per_channel[..., 0] == 0).mean() - 0.5) < 0.05
    with pytest.warns(UserWarning, match=r"\(N, C, L\)"):
        z = F.dropout2d(gw.ones(6, 5, 7)).numpy()
    assert (z.min(-1) == z.max(-1)).all()
    with pytest.raises(ValueError, match="3-D or 4-D"):
        F.dropout2d(gw.ones(2, 3, 4, 5, 6))


# ------------------------------------------------------------------ against PyTorch
CASES = {
    "lstm": (
        "nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True, dtype=dt)",
        (2, 5, 3),
        [(4, 2, 4), (4, 2, 4)],
    ),
    "gru": ("nn.GRU(3, 4, num_layers=2, dtype=dt)", (5, 2, 3), [(2, 2, 4)]),
    "rnn": ("nn.RNN(3, 4, 2, 'relu', False, dtype=dt)", (5, 3), []),
    "rnn_bi": ("nn.RNN(3, 4, bidirectional=True, dtype=dt)", (4, 2, 3), [(2, 2, 4)]),
    "lstmcell": ("nn.LSTMCell(3, 4, dtype=dt)", (2, 3), [(2, 4), (2, 4)]),
    "grucell": ("nn.GRUCell(3, 4, dtype=dt)", (2, 3), [(2, 4)]),
    "rnncell": ("nn.RNNCell(3, 4, nonlinearity='relu', dtype=dt)", (3,), [(4,)]),
}
INPUTS = {}
for _name, (_, _xs, _ss) in CASES.items():
    INPUTS[f"{_name}/x"] = RNG.standard_normal(_xs)
    for _i, _s in enumerate(_ss):
        INPUTS[f"{_name}/s{_i}"] = RNG.standard_normal(_s)
INPUTS["emb/idx"] = np.array([[2, 0, 7], [7, 7, 2]])
INPUTS["emb/g"] = RNG.standard_normal((2, 3, 4))

SNIPPET = """
import torch.nn as nn
dt = torch.float64
cases = %r
def flat(r):
    return [r] if isinstance(r, torch.Tensor) else [t for p in r for t in flat(p)]
torch.manual_seed(0)
for name, (ctor, _, shapes) in cases.items():
    mod = eval(ctor, {"nn": nn, "dt": dt})
    for k, v in mod.state_dict().items():
        out[f"{name}/sd/{k}"] = v.clone()
    x = torch.tensor(inputs[f"{name}/x"], requires_grad=True)
    st = [torch.tensor(inputs[f"{name}/s{i}"], requires_grad=True) for i in range(len(shapes))]
    res = flat(mod(x, (tuple(st) if len(st) == 2 else st[0]) if st else None))
    loss = sum((r * (i + 1) * torch.cos(r)).sum() for i, r in enumerate(res))
    loss.backward()
    for i, r in enumerate(res):
        out[f"{name}/out{i}"] = r
    out[f"{name}/gx"] = x.grad
    for i, s in enumerate(st):
        out[f"{name}/gs{i}"] = s.grad
    for k, p in mod.named_parameters():
        out[f"{name}/grad/{k}"] = p.grad
emb = nn.Embedding(10, 4, padding_idx=7, dtype=dt)
y = emb(torch.tensor(inputs["emb/idx"]))
(y * torch.tensor(inputs["emb/g"])).sum().backward()
out["emb/w"], out["emb/y"], out["emb/gw"] = emb.weight, y, emb.weight.grad
"""


@pytest.fixture(scope="module")
def torch_ref():
    return torch_values(SNIPPET % (CASES,), INPUTS)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_outputs_states_and_gradients(torch_ref, name):
    ctor, _, shapes = CASES[name]
    mod = eval(ctor, {"nn": nn, "dt": gw.float64})
    sd = {
        k[len(name) + 4 :]: gw.tensor(v)
        for k, v in torch_ref.items()
        if k.startswith(f"{name}/sd/")
    }
    mod.load_state_dict(sd)
    x = gw.tensor(INPUTS[f"{name}/x"], requires_grad=True)
    st = [gw.tensor(INPUTS[f"{name}/s{i}"], requires_grad=True) for i in range(len(shapes))]
    res = flat(mod(x, (tuple(st) if len(st) == 2 else st[0]) if st else None))
    loss = sum((r * (i + 1) * r.cos()).sum() for i, r in enumerate(res))
    loss.backward()
    for i, r in enumerate(res):
        np.testing.assert_allclose(
            r.detach().numpy(), torch_ref[f"{name}/out{i}"], rtol=1e-10, atol=1e-12
        )
    np.testing.assert_allclose(x.grad.numpy(), torch_ref[f"{name}/gx"], rtol=1e-9, atol=1e-12)
    for i, s in enumerate(st):
        np.testing.assert_allclose(
            s.grad.numpy(), torch_ref[f"{name}/gs{i}"], rtol=1e-9, atol=1e-12
        )
    for k, p in mod.named_parameters():
        np.testing.assert_allclose(
            p.grad.numpy(), torch_ref[f"{name}/grad/{k}"], rtol=1e-9, atol=1e-12
        )


def test_embedding_matches_torch(torch_ref):
    emb = nn.Embedding.from_pretrained(gw.tensor(torch_ref["emb/w"]), freeze=False, padding_idx=7)
    y = emb(gw.tensor(INPUTS["emb/idx"]))
    (y * gw.tensor(INPUTS["emb/g"])).sum().backward()
    np.testing.assert_allclose(y.detach().numpy(), torch_ref["emb/y"], rtol=1e-12)
    np.testing.assert_allclose(emb.weight.grad.numpy(), torch_ref["emb/gw"], rtol=1e-12)
    np.testing.assert_array_equal(torch_ref["emb/w"][7], 0)  # torch zeroes the padding row too
