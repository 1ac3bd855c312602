"""Categorical, Tensor.multinomial and the legacy typed constructors: gradcheck, sample
statistics, errors, and PyTorch's log_prob/entropy values and gradients."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest
from gradwire.autograd import gradcheck
from gradwire.distributions import Categorical
from torch_oracle import torch_values

RNG = np.random.default_rng(5)
PROBS = RNG.random((3, 4)) + 0.05
LOGITS = RNG.standard_normal((3, 4))
VALUES = np.array([[0, 3, 1], [2, 2, 0]])  # (2, 3): a sample dimension over batch (3,)


def t64(a):
    return gw.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)


# ------------------------------------------------------------------ Categorical
def test_log_prob_and_entropy_gradcheck_from_probs_and_logits():
    v = gw.tensor(VALUES)
    assert gradcheck(lambda p: Categorical(probs=p).log_prob(v), (t64(PROBS),))
    assert gradcheck(lambda p: Categorical(probs=p).entropy(), (t64(PROBS),))
    assert gradcheck(lambda lg: Categorical(logits=lg).log_prob(v), (t64(LOGITS),))
    assert gradcheck(lambda lg: Categorical(logits=lg).entropy(), (t64(LOGITS),))


def test_values_by_hand_shapes_and_normalisation():
    m = Categorical(probs=gw.tensor([1.0, 1.0, 2.0], dtype=gw.float64))
    np.testing.assert_allclose(m.probs.numpy(), [0.25, 0.25, 0.5])
    np.testing.assert_allclose(m.logits.numpy(), np.log([0.25, 0.25, 0.5]))
    assert m.log_prob(gw.tensor(2)).item() == pytest.approx(np.log(0.5))
    assert m.entropy().item() == pytest.approx(-(2 * 0.25 * np.log(0.25) + 0.5 * np.log(0.5)))
    assert m.batch_shape == () and m.event_shape == () and m.sample().shape == ()
    mb = Categorical(logits=gw.tensor(LOGITS))
    assert mb.batch_shape == (3,) and mb.sample().shape == (3,)
    assert mb.sample((5, 2)).shape == (5, 2, 3) and mb.sample().dtype == gw.int64
    assert mb.log_prob(gw.tensor(VALUES)).shape == (2, 3)
    np.testing.assert_allclose(mb.probs.numpy().sum(-1), 1.0, rtol=1e-6)
    zero = Categorical(probs=gw.tensor([0.0, 1.0]))
    assert (
        zero.entropy().item() == pytest.approx(0.0, abs=1e-6)
        and zero.sample((20,)).numpy().tolist() == [1] * 20
    )
    assert mb.mode.shape == (3,) and mb.enumerate_support().shape == (4, 3)
    with pytest.raises(ValueError, match="not both"):
        Categorical(probs=gw.tensor(PROBS), logits=gw.tensor(LOGITS))
    with pytest.raises(ValueError, match="support"):
        Categorical(probs=gw.tensor(PROBS), validate_args=True).log_prob(gw.tensor([4, 0, 0]))


def test_sample_frequencies_follow_the_probabilities():
    gw.manual_seed(0)
    p = np.array([0.1, 0.2, 0.7])
    draws = Categorical(probs=gw.tensor(p)).sample((20000,)).numpy()
    freq = np.bincount(draws, minlength=3) / draws.size
    np.testing.assert_allclose(freq, p, atol=0.015)


def test_policy_gradient_step_through_log_prob():
    logits = gw.zeros(4, requires_grad=True)
    m = Categorical(logits=logits)
    a = m.sample()
    (-m.log_prob(a) * 2.0).backward()
    g = logits.grad.numpy()
    expect = 2.0 * (np.full(4, 0.25) - np.eye(4)[a.item()])
    np.testing.assert_allclose(g, expect, rtol=1e-6)


# ------------------------------------------------------------------ multinomial
def test_multinomial_with_replacement_statistics():
    gw.manual_seed(1)
    p = gw.tensor([[1.0, 0.0, 3.0], [0.0, 5.0, 5.0]])
    out = p.multinomial(20000, replacement=True)
    assert out.shape == (2, 20000) and out.dtype == gw.int64
    f0 = np.bincount(out.numpy()[0], minlength=3) / 20000
    f1 = np.bincount(out.numpy()[1], minlength=3) / 20000
    np.testing.assert_allclose(f0, [0.25, 0.0, 0.75], atol=0.015)
    np.testing.assert_allclose(f1, [0.0, 0.5, 0.5], atol=0.015)


def test_multinomial_without_replacement_draws_distinct_categories():
    gw.manual_seed(2)
    p = gw.tensor([0.5, 0.3, 0.2, 0.0])
    firsts = []
    for _ in range(4000):
        s = gw.multinomial(p, 3).numpy()
        assert sorted(s.tolist()) == [0, 1, 2]
        firsts.append(s[0])
    np.testing.assert_allclose(np.bincount(firsts, minlength=3) / 4000, [0.5, 0.3, 0.2], atol=0.03)
    # second draw given first = 0: 0.3/0.5 and 0.2/0.5
    assert gw.multinomial(gw.tensor([0.0, 1.0]), 1).item() == 1


def test_multinomial_errors():
    with pytest.raises(RuntimeError, match="without replacement"):
        gw.tensor([0.5, 0.5]).multinomial(3)
    with pytest.raises(RuntimeError, match="not enough non-negative category"):
        gw.tensor([0.5, 0.0, 0.0]).multinomial(2)
    with pytest.raises(RuntimeError, match="element < 0"):
        gw.tensor([0.5, -0.1]).multinomial(1)
    with pytest.raises(RuntimeError, match="sum of probabilities"):
        gw.tensor([0.0, 0.0]).multinomial(1, True)
    with pytest.raises(RuntimeError, match="1 or 2 dim"):
        gw.ones(2, 2, 2).multinomial(1)
    with pytest.raises(RuntimeError, match="n_sample <= 0"):
        gw.ones(2).multinomial(0)


# ------------------------------------------------------------------ legacy constructors
def test_legacy_typed_constructors():
    a = gw.LongTensor([1, 2, 3])
    assert a.dtype == gw.int64 and a.numpy().tolist() == [1, 2, 3]
    b = gw.FloatTensor([[1, 2]])
    assert b.dtype == gw.float32 and b.shape == (1, 2)
    assert gw.FloatTensor(2, 3).shape == (2, 3) and gw.FloatTensor(2, 3).sum().item() == 0.0
    assert gw.LongTensor().shape == (0,)
    assert gw.DoubleTensor([1]).dtype == gw.float64 and gw.IntTensor([1]).dtype == gw.int32
    assert gw.BoolTensor([True, False]).dtype == gw.bool
    assert isinstance(a, gw.LongTensor) and not isinstance(a, gw.FloatTensor)
    assert gw.LongTensor(a) is a
    with pytest.raises(TypeError, match="dtype"):
        gw.FloatTensor(a)
    with pytest.raises(TypeError, match="sizes"):
        gw.FloatTensor(2, "x")


# ------------------------------------------------------------------ PyTorch
TORCH_SRC = """
from torch.distributions import Categorical
v = torch.tensor(inputs['v'])
for kind in ('probs', 'logits'):
    p = torch.tensor(inputs[kind], requires_grad=True)
    m = Categorical(**{kind: p})
    lp = m.log_prob(v); lp.backward(torch.ones_like(lp))
    out[kind + '_lp'] = lp; out[kind + '_lp_g'] = p.grad.clone()
    p.grad = None
    h = Categorical(**{kind: p}).entropy(); h.sum().backward()
    out[kind + '_h'] = h; out[kind + '_h_g'] = p.grad
    out[kind + '_probs'] = m.probs; out[kind + '_logits'] = m.logits
"""


@pytest.fixture(scope="module")
def torch_out():
    return torch_values(TORCH_SRC, {"probs": PROBS, "logits": LOGITS, "v": VALUES})


@pytest.mark.parametrize("kind", ["probs", "logits"])
def test_categorical_matches_torch(torch_out, kind):
    v = gw.tensor(VALUES)
    p = t64(PROBS if kind == "probs" else LOGITS)
    m = Categorical(**{kind: p})
    lp = m.log_prob(v)
    lp.backward(gw.ones_like(lp))
    close = dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lp.detach().numpy(), torch_out[kind + "_lp"], **close)
    np.testing.assert_allclose(p.grad.numpy(), torch_out[kind + "_lp_g"], **close)
    p.grad = None
    h = Categorical(**{kind: p}).entropy()
    h.sum().backward()
    np.testing.assert_allclose(h.detach().numpy(), torch_out[kind + "_h"], **close)
    np.testing.assert_allclose(p.grad.numpy(), torch_out[kind + "_h_g"], **close)
    np.testing.assert_allclose(m.probs.detach().numpy(), torch_out[kind + "_probs"], **close)
    np.testing.assert_allclose(m.logits.detach().numpy(), torch_out[kind + "_logits"], **close)
