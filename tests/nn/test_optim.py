"""AdamW, RMSprop and Adagrad: hand-written references, PyTorch's trajectories, state dicts."""

from __future__ import annotations

import itertools

import gradwire as gw
import numpy as np
import pytest
from gradwire.distributed.optim.optimizer import _updates_from_grads
from torch_oracle import torch_values

STEPS = 5
SHAPES = [(3, 4), (5,)]


def _combos(base: dict, **options: list) -> list[dict]:
    keys = list(options)
    return [{**base, **dict(zip(keys, vals))} for vals in itertools.product(*options.values())]


CASES = (
    [
        ("AdamW", kw)
        for kw in _combos(
            {"lr": 0.01}, amsgrad=[False, True], maximize=[False, True], weight_decay=[0.0, 0.1]
        )
    ]
    + [("AdamW", {"betas": (0.8, 0.95), "eps": 1e-6})]
    + [
        ("RMSprop", kw)
        for kw in _combos(
            {"lr": 0.01},
            momentum=[0.0, 0.9],
            centered=[False, True],
            weight_decay=[0.0, 0.1],
            maximize=[False, True],
        )
    ]
    + [("RMSprop", {"alpha": 0.9, "eps": 1e-4})]
    + [
        ("Adagrad", kw)
        for kw in _combos(
            {"lr": 0.1},
            lr_decay=[0.0, 0.1],
            weight_decay=[0.0, 0.1],
            initial_accumulator_value=[0.0, 0.5],
            maximize=[False, True],
        )
    ]
    + [("Adagrad", {"eps": 1e-3})]
)


def _data(seed: int = 0) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s) for s in SHAPES]
    grads = [[rng.standard_normal(s) for s in SHAPES] for _ in range(STEPS)]
    return params, grads


COMPLEX_CASES = [
    ("Adam", {"lr": 0.1, "amsgrad": True}),
    ("AdamW", {"lr": 0.1, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.1, "momentum": 0.5, "centered": True}),
    ("Adagrad", {"lr": 0.1, "weight_decay": 0.1}),
]


def _complex_data() -> tuple[np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(9)
    z = rng.standard_normal(6) + 1j * rng.standard_normal(6)
    return z, [rng.standard_normal(6) + 1j * rng.standard_normal(6) for _ in range(STEPS)]


def _run_gradwire(name: str, kwargs: dict, params0, grads, dtype=np.float64) -> list[np.ndarray]:
    params = [gw.nn.Parameter(gw.tensor(p.astype(dtype))) for p in params0]
    opt = getattr(gw.optim, name)(params, **kwargs)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = gw.tensor(g.astype(dtype))
        opt.step()
    return [p.detach().numpy().copy() for p in params]


@pytest.fixture(scope="module")
def torch_out() -> dict[str, np.ndarray]:
    params, grads = _data()
    inputs = {f"p{i}": p for i, p in enumerate(params)}
    inputs.update({f"g{t}_{i}": g for t, step in enumerate(grads) for i, g in enumerate(step)})
    src = f"""
cases = {CASES!r}
for k, (name, kwargs) in enumerate(cases):
    ps = [torch.tensor(inputs[f"p{{i}}"], requires_grad=True) for i in range({len(SHAPES)})]
    opt = getattr(torch.optim, name)(ps, **kwargs)
    for t in range({STEPS}):
        for i, p in enumerate(ps):
            p.grad = torch.tensor(inputs[f"g{{t}}_{{i}}"])
        opt.step()
    for i, p in enumerate(ps):
        out[f"{{k}}_{{i}}"] = p
for name, kwargs in {COMPLEX_CASES!r}:
    p = torch.tensor(inputs["z"], requires_grad=True)
    opt = getattr(torch.optim, name)([p], **kwargs)
    for t in range({STEPS}):
        p.grad = torch.tensor(inputs[f"gz{{t}}"])
        opt.step()
    out["complex_" + name] = p
"""
    z, gz = _complex_data()
    inputs["z"] = z
    inputs.update({f"gz{t}": g for t, g in enumerate(gz)})
    return torch_values(src, inputs)


@pytest.mark.parametrize("k", range(len(CASES)), ids=[f"{n}-{kw}" for n, kw in CASES])
def test_matches_torch_trajectory(torch_out, k):
    name, kwargs = CASES[k]
    params, grads = _data()
    got = _run_gradwire(name, kwargs, params, grads)
    for i, g in enumerate(got):
        np.testing.assert_allclose(g, torch_out[f"{k}_{i}"], rtol=1e-10, atol=1e-12)


# -- hand-written references (NumPy, one line per formula of PyTorch's documentation) --------


def _ref_adamw(p, grads, lr, betas, eps, wd, amsgrad=False, maximize=False):
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    vmax = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = -g if maximize else g
        p = p * (1 - lr * wd)
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        vmax = np.maximum(vmax, v)
        vhat = (vmax if amsgrad else v) / (1 - betas[1] ** t)
        p = p - lr * (m / (1 - betas[0] ** t)) / (np.sqrt(vhat) + eps)
    return p


def _ref_rmsprop(p, grads, lr, alpha, eps, wd, momentum, centered):
    v = np.zeros_like(p)
    gavg = np.zeros_like(p)
    buf = np.zeros_like(p)
    for g in grads:
        g = g + wd * p
        v = alpha * v + (1 - alpha) * g * g
        if centered:
            gavg = alpha * gavg + (1 - alpha) * g
            denom = np.sqrt(v - gavg * gavg) + eps
        else:
            denom = np.sqrt(v) + eps
        if momentum:
            buf = momentum * buf + g / denom
            p = p - lr * buf
        else:
            p = p - lr * g / denom
    return p


def _ref_adagrad(p, grads, lr, lr_decay, wd, init, eps):
    s = np.full_like(p, init)
    for t, g in enumerate(grads, start=1):
        g = g + wd * p
        clr = lr / (1 + (t - 1) * lr_decay)
        s = s + g * g
        p = p - clr * g / (np.sqrt(s) + eps)
    return p


@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("maximize", [False, True])
def test_adamw_against_a_hand_written_reference(amsgrad, maximize):
    params, grads = _data(1)
    kw = dict(
        lr=0.02, betas=(0.85, 0.99), eps=1e-7, weight_decay=0.3, amsgrad=amsgrad, maximize=maximize
    )
    got = _run_gradwire("AdamW", kw, params, grads)
    for i, p in enumerate(params):
        ref = _ref_adamw(p, [s[i] for s in grads], 0.02, (0.85, 0.99), 1e-7, 0.3, amsgrad, maximize)
        np.testing.assert_allclose(got[i], ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "momentum,centered", [(0.0, False), (0.9, False), (0.0, True), (0.5, True)]
)
def test_rmsprop_against_a_hand_written_reference(momentum, centered):
    params, grads = _data(2)
    kw = dict(lr=0.01, alpha=0.95, eps=1e-6, weight_decay=0.1, momentum=momentum, centered=centered)
    got = _run_gradwire("RMSprop", kw, params, grads)
    for i, p in enumerate(params):
        ref = _ref_rmsprop(p, [s[i] for s in grads], 0.01, 0.95, 1e-6, 0.1, momentum, centered)
        np.testing.assert_allclose(got[i], ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("lr_decay,init", [(0.0, 0.0), (0.2, 0.3)])
def test_adagrad_against_a_hand_written_reference(lr_decay, init):
    params, grads = _data(3)
    kw = dict(
        lr=0.1, lr_decay=lr_decay, weight_decay=0.05, initial_accumulator_value=init, eps=1e-9
    )
    got = _run_gradwire("Adagrad", kw, params, grads)
    for i, p in enumerate(params):
        ref = _ref_adagrad(p, [s[i] for s in grads], 0.1, lr_decay, 0.05, init, 1e-9)
        np.testing.assert_allclose(got[i], ref, rtol=1e-12, atol=1e-14)


def test_first_adamw_step_is_decay_then_a_sign_step():
    p = gw.nn.Parameter(gw.tensor([2.0, -3.0, 0.5], dtype=gw.float64))
    opt = gw.optim.AdamW([p], lr=0.1, weight_decay=0.5, eps=0.0)
    p.grad = gw.tensor([0.3, -7.0, 1e-3], dtype=gw.float64)
    opt.step()
    # decay 1 - 0.1 * 0.5 = 0.95, then the bias-corrected step is lr * g / |g| = 0.1 * sign(g)
    np.testing.assert_allclose(p.detach().numpy(), [1.9 - 0.1, -2.85 + 0.1, 0.475 - 0.1])


def test_defaults_are_pytorchs():
    p = gw.nn.Parameter(gw.zeros(2))
    d = gw.optim.AdamW([p]).defaults
    assert (d["lr"], d["betas"], d["eps"], d["weight_decay"], d["amsgrad"]) == (
        1e-3,
        (0.9, 0.999),
        1e-8,
        1e-2,
        False,
    )
    d = gw.optim.RMSprop([p]).defaults
    assert (d["lr"], d["alpha"], d["eps"], d["weight_decay"], d["momentum"], d["centered"]) == (
        1e-2,
        0.99,
        1e-8,
        0.0,
        0.0,
        False,
    )
    d = gw.optim.Adagrad([p]).defaults
    assert (
        d["lr"],
        d["lr_decay"],
        d["weight_decay"],
        d["initial_accumulator_value"],
        d["eps"],
    ) == (
        1e-2,
        0.0,
        0.0,
        0.0,
        1e-10,
    )


@pytest.mark.parametrize(
    "name,kwargs,match",
    [
        ("AdamW", {"lr": -1.0}, "learning rate"),
        ("AdamW", {"betas": (1.0, 0.9)}, "beta"),
        ("RMSprop", {"alpha": -0.1}, "alpha"),
        ("RMSprop", {"momentum": -0.1}, "momentum"),
        ("Adagrad", {"lr_decay": -0.1}, "lr_decay"),
        ("Adagrad", {"initial_accumulator_value": -1.0}, "initial_accumulator_value"),
    ],
)
def test_bad_hyperparameters_are_value_errors(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        getattr(gw.optim, name)([gw.nn.Parameter(gw.zeros(2))], **kwargs)


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("AdamW", {"amsgrad": True}),
        ("RMSprop", {"momentum": 0.9, "centered": True}),
        ("Adagrad", {"lr_decay": 0.1, "initial_accumulator_value": 0.1}),
    ],
)
def test_state_dict_round_trip_resumes_the_same_trajectory(name, kwargs):
    params, grads = _data(4)
    straight = _run_gradwire(name, kwargs, params, grads)
    cls = getattr(gw.optim, name)
    ps = [gw.nn.Parameter(gw.tensor(p)) for p in params]
    opt = cls(ps, **kwargs)
    for step in grads[:2]:
        for p, g in zip(ps, step):
            p.grad = gw.tensor(g)
        opt.step()
    saved = opt.state_dict()
    assert saved["param_groups"][0]["params"] == [0, 1]
    fresh = cls(ps, **{**kwargs, "lr": 123.0})
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    for step in grads[2:]:
        for p, g in zip(ps, step):
            p.grad = gw.tensor(g)
        fresh.step()
    for p, ref in zip(ps, straight):
        np.testing.assert_allclose(p.detach().numpy(), ref, rtol=1e-13)


def test_adagrad_state_exists_from_construction():
    p = gw.nn.Parameter(gw.zeros(3))
    opt = gw.optim.Adagrad([p], initial_accumulator_value=0.25)
    state = opt.state_dict()["state"][0]
    assert state["step"] == 0
    np.testing.assert_array_equal(state["sum"], np.full(3, 0.25, np.float32))


@pytest.mark.parametrize("name", ["AdamW", "RMSprop", "Adagrad"])
def test_step_with_grads_is_step_and_dist_optimizer_uses_it(name):
    params, grads = _data(5)
    ref = _run_gradwire(name, {}, params, grads)
    ps = [gw.nn.Parameter(gw.tensor(p)) for p in params]
    opt = getattr(gw.optim, name)(ps)
    for step in grads:
        opt.step_with_grads({p: gw.tensor(g) for p, g in zip(ps, step)})
    for p, r in zip(ps, ref):
        np.testing.assert_array_equal(p.detach().numpy(), r)
    assert _updates_from_grads(type(opt))


@pytest.mark.parametrize("name", ["AdamW", "RMSprop", "Adagrad"])
def test_float32_params_stay_float32_and_groups_keep_their_lr(name):
    a, b = gw.nn.Parameter(gw.ones(2)), gw.nn.Parameter(gw.ones(2))
    opt = getattr(gw.optim, name)([{"params": [a]}, {"params": [b], "lr": 0.0}])
    a.grad, b.grad = gw.ones(2), gw.ones(2)
    opt.step()
    assert a.dtype == gw.float32 and a._data.dtype == np.float32
    assert (a.detach().numpy() < 1).all()
    np.testing.assert_array_equal(b.detach().numpy(), [1.0, 1.0])  # lr 0: untouched


def _run_complex(name: str, kwargs: dict, z, gz, as_pairs: bool) -> np.ndarray:
    start = z.view(np.float64) if as_pairs else z
    p = gw.nn.Parameter(gw.tensor(start))
    opt = getattr(gw.optim, name)([p], **kwargs)
    for g in gz:
        p.grad = gw.tensor(g.view(np.float64) if as_pairs else g)
        opt.step()
    return p.detach().numpy()


@pytest.mark.parametrize("case", COMPLEX_CASES, ids=[c[0] for c in COMPLEX_CASES])
def test_complex_parameters_are_pairs_of_reals(case):
    z, gz = _complex_data()
    got = _run_complex(*case, z, gz, as_pairs=False)
    ref = _run_complex(*case, z, gz, as_pairs=True)
    np.testing.assert_allclose(got.view(np.float64), ref, rtol=1e-13)


@pytest.mark.parametrize("case", COMPLEX_CASES, ids=[c[0] for c in COMPLEX_CASES])
def test_complex_parameters_match_torch(torch_out, case):
    z, gz = _complex_data()
    got = _run_complex(*case, z, gz, as_pairs=False)
    np.testing.assert_allclose(got, torch_out["complex_" + case[0]], rtol=1e-10, atol=1e-12)
