"""Sparse gradients where PyTorch refuses them (same messages, RuntimeErrors, nothing moved),
SparseAdam's argument checks, and the mixed cases PyTorch does run: a sparse gradient on a
dense momentum buffer, complex parameters."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest
from torch_oracle import torch_values

REFUSING = ["Adam", "AdamW", "RMSprop", "Adadelta", "Adamax", "Rprop"]
SPARSE_ADAM_CTOR = {
    "lr0": {"lr": 0.0},
    "lr_negative": {"lr": -1.0},
    "eps0": {"eps": 0.0},
    "beta0": {"betas": (1.0, 0.5)},
    "beta1": {"betas": (0.5, -0.1)},
}


def _sparse_grad(lib, rows, values, shape):
    return lib.sparse_coo_tensor([rows], lib.tensor(np.asarray(values)), shape)


@pytest.fixture(scope="module")
def torch_out() -> dict[str, np.ndarray]:
    src = f"""
def err(f):
    try:
        f()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "none", ""

def record(key, f):
    out[key + "_type"], out[key + "_msg"] = err(f)

def sparse_step(name, **kwargs):
    emb = torch.nn.Embedding(5, 2, sparse=True)
    opt = getattr(torch.optim, name)(emb.parameters(), **kwargs)
    emb(torch.tensor([1, 1, 3])).sum().backward()
    opt.step()

for name in {REFUSING!r}:
    record(name, lambda: sparse_step(name))
record("SGD_wd", lambda: sparse_step("SGD", lr=0.1, weight_decay=0.1))
record("Adagrad_wd", lambda: sparse_step("Adagrad", weight_decay=0.1))

def dense_to_sparse_adam():
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    torch.optim.SparseAdam([p]).step()
record("SparseAdam_dense", dense_to_sparse_adam)
for key, kwargs in {SPARSE_ADAM_CTOR!r}.items():
    record("ctor_" + key, lambda: torch.optim.SparseAdam([torch.nn.Parameter(torch.zeros(2))], **kwargs))
record("ctor_complex", lambda: torch.optim.SparseAdam(
    [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))]))
record("ctor_sparse", lambda: torch.optim.SparseAdam([torch.zeros(3).to_sparse()]))

def mixed(first_sparse, nesterov):
    p = torch.nn.Parameter(torch.tensor(inputs["p"]))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.5, nesterov=nesterov)
    dense = torch.tensor(inputs["g"])
    sparse = torch.sparse_coo_tensor([[0, 2, 0]], torch.tensor(inputs["v"]), (4, 2))
    for g in ([sparse, dense] if first_sparse else [dense, sparse]):
        p.grad = g
        opt.step()
    out[f"mixed_{{first_sparse}}_{{nesterov}}"] = p
record("sparse_then_dense", lambda: mixed(True, False))
record("dense_then_sparse_nesterov", lambda: mixed(False, True))
mixed(False, False)

for name, kwargs in [("Adagrad", {{"lr": 0.1, "initial_accumulator_value": 0.2}}),
                     ("SGD", {{"lr": 0.1, "momentum": 0.9, "nesterov": True}})]:
    z = torch.nn.Parameter(torch.tensor(inputs["z"]))
    opt = getattr(torch.optim, name)([z], **kwargs)
    for t in range(3):
        z.grad = torch.sparse_coo_tensor([[0, 3, 0, 1]], torch.tensor(inputs[f"zv{{t}}"]), (4, 2))
        opt.step()
    out["complex_" + name] = z
"""
    return torch_values(src, _inputs())


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    out = {
        "p": rng.standard_normal((4, 2)),
        "g": rng.standard_normal((4, 2)),
        "v": rng.standard_normal((3, 2)),
        "z": rng.standard_normal((4, 2)) + 1j * rng.standard_normal((4, 2)),
    }
    for t in range(3):
        out[f"zv{t}"] = rng.standard_normal((4, 2)) + 1j * rng.standard_normal((4, 2))
    return out


def _sparse_step(name: str, **kwargs) -> tuple[gw.nn.Embedding, gw.optim.Optimizer]:
    emb = gw.nn.Embedding(5, 2, sparse=True)
    opt = getattr(gw.optim, name)(emb.parameters(), **kwargs)
    emb(gw.tensor([1, 1, 3])).sum().backward()
    return emb, opt


@pytest.mark.parametrize("name", REFUSING)
def test_other_optimizers_refuse_a_sparse_grad_with_pytorchs_message(torch_out, name):
    emb, opt = _sparse_step(name)
    before = emb.weight.detach().numpy().copy()
    with pytest.raises(RuntimeError) as exc:
        opt.step()
    assert str(torch_out[name + "_type"]) == "RuntimeError"
    assert str(exc.value) == str(torch_out[name + "_msg"])
    np.testing.assert_array_equal(emb.weight.detach().numpy(), before)
    assert not opt.state.get(emb.weight)


def test_a_refused_step_moves_no_parameter_of_any_group():
    dense = gw.nn.Parameter(gw.ones(3))
    emb = gw.nn.Embedding(5, 2, sparse=True)
    opt = gw.optim.Adam([{"params": [dense]}, {"params": [emb.weight], "lr": 0.5}])
    dense.grad = gw.ones(3)
    emb(gw.tensor([2])).sum().backward()
    with pytest.raises(RuntimeError, match="consider SparseAdam"):
        opt.step()
    np.testing.assert_array_equal(dense.detach().numpy(), [1.0, 1.0, 1.0])
    assert not opt.state  # no state made either: the step can be retried after a fix
    emb.weight.grad = None
    opt.step()
    assert (dense.detach().numpy() < 1).all()


def test_sgd_refuses_weight_decay_with_a_sparse_grad(torch_out):
    emb, opt = _sparse_step("SGD", lr=0.1, weight_decay=0.1)
    before = emb.weight.detach().numpy().copy()
    with pytest.raises(RuntimeError, match="weight_decay option is not compatible with sparse"):
        opt.step()
    # PyTorch refuses too (a RuntimeError from sparse + dense), with a less telling message.
    assert str(torch_out["SGD_wd_type"]) == "RuntimeError"
    assert "add(sparse, dense)" in str(torch_out["SGD_wd_msg"])
    np.testing.assert_array_equal(emb.weight.detach().numpy(), before)


def test_adagrad_refuses_weight_decay_with_a_sparse_grad(torch_out):
    emb, opt = _sparse_step("Adagrad", weight_decay=0.1)
    with pytest.raises(RuntimeError) as exc:
        opt.step()
    assert str(exc.value) == str(torch_out["Adagrad_wd_msg"])
    assert opt.state[emb.weight]["step"] == 0  # refused before the step was counted


def test_sparse_adam_refuses_a_dense_grad(torch_out):
    p = gw.nn.Parameter(gw.zeros(3))
    p.grad = gw.ones(3)
    opt = gw.optim.SparseAdam([p])
    with pytest.raises(RuntimeError) as exc:
        opt.step()
    assert str(exc.value) == str(torch_out["SparseAdam_dense_msg"])
    np.testing.assert_array_equal(p.detach().numpy(), [0.0, 0.0, 0.0])


@pytest.mark.parametrize("key", list(SPARSE_ADAM_CTOR))
def test_sparse_adam_argument_checks_are_pytorchs(torch_out, key):
    with pytest.raises(ValueError) as exc:
        gw.optim.SparseAdam([gw.nn.Parameter(gw.zeros(2))], **SPARSE_ADAM_CTOR[key])
    assert str(torch_out[f"ctor_{key}_type"]) == "ValueError"
    assert str(exc.value) == str(torch_out[f"ctor_{key}_msg"])


def test_sparse_adam_refuses_complex_and_sparse_params(torch_out):
    with pytest.raises(ValueError) as exc:
        gw.optim.SparseAdam(
            [gw.nn.Parameter(gw.zeros(2)), gw.nn.Parameter(gw.zeros(2, dtype=gw.complex64))]
        )
    assert str(exc.value) == str(torch_out["ctor_complex_msg"])
    with pytest.raises(ValueError) as exc:
        gw.optim.SparseAdam([gw.zeros(3).to_sparse()])
    assert str(exc.value) == str(torch_out["ctor_sparse_msg"])


def test_sparse_adam_defaults_and_repr_are_pytorchs():
    opt = gw.optim.SparseAdam([gw.nn.Parameter(gw.zeros(2))])
    assert opt.defaults == {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "maximize": False}
    assert repr(opt).startswith("SparseAdam (\nParameter Group 0\n    betas: (0.9, 0.999)")
    assert "SparseAdam" in gw.optim.__all__ and gw.optim.SparseAdam.__module__.endswith(
        "sparse_adam"
    )


def _mixed(first_sparse: bool, nesterov: bool) -> gw.nn.Parameter:
    inputs = _inputs()
    p = gw.nn.Parameter(gw.tensor(inputs["p"]))
    opt = gw.optim.SGD([p], lr=0.1, momentum=0.5, nesterov=nesterov)
    dense = gw.tensor(inputs["g"])
    sparse = _sparse_grad(gw, [0, 2, 0], inputs["v"], (4, 2))
    for g in [sparse, dense] if first_sparse else [dense, sparse]:
        p.grad = g
        opt.step()
    return p


def test_sgd_sparse_grad_on_a_dense_buffer_matches_torch(torch_out):
    got = _mixed(first_sparse=False, nesterov=False).detach().numpy()
    np.testing.assert_allclose(got, torch_out["mixed_False_False"], rtol=1e-12)


@pytest.mark.parametrize(
    "first_sparse,nesterov,key",
    [(True, False, "sparse_then_dense"), (False, True, "dense_then_sparse_nesterov")],
)
def test_sgd_refuses_the_mixes_pytorch_refuses(torch_out, first_sparse, nesterov, key):
    assert str(torch_out[key + "_type"]) == "RuntimeError"
    with pytest.raises(RuntimeError, match="momentum buffer"):
        _mixed(first_sparse, nesterov)


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("Adagrad", {"lr": 0.1, "initial_accumulator_value": 0.2}),
        ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    ],
)
def test_complex_params_with_sparse_grads_match_torch(torch_out, name, kwargs):
    # PyTorch's sparse Adagrad squares and roots complex values as complex numbers (its dense
    # path uses pairs of reals); gradwire follows each path.
    inputs = _inputs()
    z = gw.nn.Parameter(gw.tensor(inputs["z"]))
    opt = getattr(gw.optim, name)([z], **kwargs)
    for t in range(3):
        z.grad = _sparse_grad(gw, [0, 3, 0, 1], inputs[f"zv{t}"], (4, 2))
        opt.step()
    got = z.detach().numpy()
    assert got.dtype == np.complex128
    np.testing.assert_allclose(got, torch_out["complex_" + name], rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(got[2], inputs["z"][2])  # row 2 had no gradient
