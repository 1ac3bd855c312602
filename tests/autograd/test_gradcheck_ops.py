"""Every differentiable op against float64 (and complex128) central differences.

Each case is (name, function, input factory). Inputs are made fresh per test from a seeded
generator so that a failure reproduces; shapes exercise broadcasting, 0-d tensors and scalars.
"""

from __future__ import annotations

import zlib

import gradwire as gw
import numpy as np
import pytest
from gradwire.autograd import gradcheck, gradgradcheck
from gradwire.autograd.gradcheck import GradcheckError

F64, C128 = gw.float64, gw.complex128


def leaf(arr):
    return gw.tensor(np.asarray(arr), requires_grad=True)


def rnd(rng, *shape, complex_=False, positive=False, away_from_zero=False):
    data = rng.standard_normal(shape)
    if complex_:
        data = data + 1j * rng.standard_normal(shape)
    if positive:
        data = np.abs(data) + 0.5
    if away_from_zero:
        # Keep |x| >= 0.3 so kinks (abs, relu, clamp) are not straddled by the finite step.
        data = np.where(np.abs(data) < 0.3, 0.3 * np.sign(data + 1e-12) + data, data)
    return leaf(data)


def distinct(rng, *shape):
    """Values with pairwise gaps, so max/min/maximum have no ties near the finite step."""
    n = int(np.prod(shape)) if shape else 1
    return leaf((rng.permutation(n) * 0.37 - 1.0).reshape(shape))


def idx(values):
    return gw.tensor(values, dtype=gw.int64)


# (name, fn, inputs(rng)) ---------------------------------------------------------------------
REAL_CASES = [
    # arithmetic with broadcasting: (3,1,4) with (2,4), with a 0-d tensor and with a scalar
    ("add_bcast", lambda a, b: a + b, lambda r: (rnd(r, 3, 1, 4), rnd(r, 2, 4))),
    ("add_0d", lambda a, b: a + b, lambda r: (rnd(r, 2, 3), rnd(r))),
    ("add_alpha", lambda a, b: a.add(b, alpha=-2.5), lambda r: (rnd(r, 3, 1), rnd(r, 4))),
    ("radd_scalar", lambda a: 2.5 + a, lambda r: (rnd(r, 3),)),
    ("sub_bcast", lambda a, b: a - b, lambda r: (rnd(r, 3, 1, 4), rnd(r, 2, 4))),
    ("rsub_scalar", lambda a: 1.5 - a, lambda r: (rnd(r, 2, 3),)),
    ("mul_bcast", lambda a, b: a * b, lambda r: (rnd(r, 3, 1, 4), rnd(r, 2, 4))),
    ("mul_self", lambda a: a * a, lambda r: (rnd(r, 3),)),
    ("mul_0d_0d", lambda a, b: a * b, lambda r: (rnd(r), rnd(r))),
    ("div_bcast", lambda a, b: a / b, lambda r: (rnd(r, 3, 1, 4), rnd(r, 2, 4, positive=True))),
    ("rdiv_scalar", lambda a: 2.0 / a, lambda r: (rnd(r, 3, positive=True),)),
    ("div_scalar", lambda a: a / 4.0, lambda r: (rnd(r, 3),)),
    ("neg", lambda a: -a, lambda r: (rnd(r, 2, 3),)),
    ("pow_int", lambda a: a**3, lambda r: (rnd(r, 2, 3),)),
    ("pow_float", lambda a: a**2.5, lambda r: (rnd(r, 2, 3, positive=True),)),
    ("pow_neg", lambda a: a.pow(-1.5), lambda r: (rnd(r, 4, positive=True),)),
    ("pow_zero", lambda a: a**0, lambda r: (rnd(r, 3),)),
    ("pow_0d", lambda a: a**2.5, lambda r: (rnd(r, positive=True),)),
    ("pow_tensor_bcast", lambda a, b: a**b, lambda r: (rnd(r, 3, 1, positive=True), rnd(r, 4))),
    ("rpow_scalar_base", lambda a: 2.0**a, lambda r: (rnd(r, 3),)),
    (
        "pow_tensor_base_only",
        lambda a: a ** gw.tensor([1.0, 2.0, 3.0], dtype=F64),
        lambda r: (rnd(r, 3),),
    ),
    # elementwise math
    ("exp", lambda a: a.exp(), lambda r: (rnd(r, 2, 3),)),
    ("log", lambda a: a.log(), lambda r: (rnd(r, 2, 3, positive=True),)),
    ("sqrt", lambda a: a.sqrt(), lambda r: (rnd(r, 2, 3, positive=True),)),
    ("abs", lambda a: a.abs(), lambda r: (rnd(r, 2, 3, away_from_zero=True),)),
    ("sin", lambda a: a.sin(), lambda r: (rnd(r, 2, 3),)),
    ("cos", lambda a: a.cos(), lambda r: (rnd(r, 2, 3),)),
    ("tanh", lambda a: a.tanh(), lambda r: (rnd(r, 2, 3),)),
    ("sigmoid", lambda a: a.sigmoid(), lambda r: (rnd(r, 2, 3),)),
    ("relu", lambda a: a.relu(), lambda r: (rnd(r, 2, 3, away_from_zero=True),)),
    ("gw_exp_functional", lambda a: gw.exp(gw.sin(a)), lambda r: (rnd(r, 3),)),
    ("softmax_dim1", lambda a: a.softmax(1), lambda r: (rnd(r, 3, 4),)),
    ("softmax_dim0", lambda a: a.softmax(0), lambda r: (rnd(r, 3, 4),)),
    ("log_softmax", lambda a: a.log_softmax(-1), lambda r: (rnd(r, 3, 4),)),
    ("clamp_both", lambda a: a.clamp(-0.5, 0.5), lambda r: (distinct(r, 3, 4),)),
    ("clamp_min", lambda a: a.clamp(min=0.1), lambda r: (distinct(r, 3, 4),)),
    ("clamp_max", lambda a: a.clamp(max=0.1), lambda r: (distinct(r, 3, 4),)),
    (
        "clamp_tensor_bounds",
        lambda a, lo, hi: a.clamp(lo, hi),
        lambda r: (distinct(r, 3, 4), leaf(np.full(4, -0.5) + 0.011), leaf(np.full((3, 1), 0.6))),
    ),
    (
        "maximum_bcast",
        lambda a, b: gw.maximum(a, b),
        lambda r: (distinct(r, 3, 1, 4), leaf(np.arange(8.0).reshape(2, 4) * 0.29 - 1.013)),
    ),
    (
        "minimum_bcast",
        lambda a, b: gw.minimum(a, b),
        lambda r: (distinct(r, 3, 1, 4), leaf(np.arange(8.0).reshape(2, 4) * 0.29 - 1.013)),
    ),
    (
        "where_bcast",
        lambda a, b: gw.where(a.detach() > 0, a, b),
        lambda r: (rnd(r, 3, 1, 4), rnd(r, 2, 4)),
    ),
    ("where_scalar_other", lambda a: gw.where(a.detach() > 0, a, 0.0), lambda r: (rnd(r, 3, 4),)),
    (
        "where_condition_wider_than_both",
        lambda a, b: gw.where(gw.tensor([[True, False, True], [False, True, True]]), a, b),
        lambda r: (rnd(r, 3), rnd(r, 1)),
    ),
    # matmul
    ("matmul_2d", lambda a, b: a @ b, lambda r: (rnd(r, 3, 4), rnd(r, 4, 2))),
    ("matmul_1d_1d", lambda a, b: a @ b, lambda r: (rnd(r, 4), rnd(r, 4))),
    ("matmul_2d_1d", lambda a, b: a @ b, lambda r: (rnd(r, 3, 4), rnd(r, 4))),
    ("matmul_1d_2d", lambda a, b: a @ b, lambda r: (rnd(r, 4), rnd(r, 4, 2))),
    ("matmul_batched_bcast", lambda a, b: a @ b, lambda r: (rnd(r, 2, 1, 3, 4), rnd(r, 5, 4, 2))),
    ("matmul_batched_1d", lambda a, b: a.matmul(b), lambda r: (rnd(r, 2, 3, 4), rnd(r, 4))),
    ("matmul_1d_batched", lambda a, b: gw.matmul(a, b), lambda r: (rnd(r, 4), rnd(r, 2, 4, 3))),
    # reductions
    ("sum_all", lambda a: a.sum(), lambda r: (rnd(r, 3, 4),)),
    ("sum_dim", lambda a: a.sum(1), lambda r: (rnd(r, 3, 4),)),
    ("sum_dims_keepdim", lambda a: a.sum((0, 2), keepdim=True), lambda r: (rnd(r, 2, 3, 4),)),
    ("sum_0d", lambda a: a.sum(), lambda r: (rnd(r),)),
    ("mean_all", lambda a: a.mean(), lambda r: (rnd(r, 3, 4),)),
    ("mean_dim_neg", lambda a: a.mean(-1), lambda r: (rnd(r, 3, 4),)),
    ("mean_dims_keepdim", lambda a: a.mean((0, 2), keepdim=True), lambda r: (rnd(r, 2, 3, 4),)),
    ("max_all", lambda a: a.max(), lambda r: (distinct(r, 3, 4),)),
    ("min_all", lambda a: a.min(), lambda r: (distinct(r, 3, 4),)),
    ("max_dim", lambda a: a.max(1).values, lambda r: (distinct(r, 3, 4),)),
    ("max_dim_keepdim", lambda a: a.max(0, keepdim=True)[0], lambda r: (distinct(r, 3, 4),)),
    ("min_dim", lambda a: a.min(dim=-1).values, lambda r: (distinct(r, 3, 4),)),
    ("min_dim_keepdim", lambda a: a.min(1, keepdim=True).values, lambda r: (distinct(r, 2, 3),)),
    ("prod_all", lambda a: a.prod(), lambda r: (rnd(r, 2, 3),)),
    ("prod_dim", lambda a: a.prod(1), lambda r: (rnd(r, 3, 4),)),
    ("prod_dim_keepdim", lambda a: a.prod(0, keepdim=True), lambda r: (rnd(r, 3, 4),)),
    (
        "prod_with_zeros",
        lambda a: a.prod(1),
        lambda r: (leaf([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0], [1.5, 2.0, -1.0]]),),
    ),
    ("var_all", lambda a: a.var(), lambda r: (rnd(r, 3, 4),)),
    ("var_dim", lambda a: a.var(1), lambda r: (rnd(r, 3, 4),)),
    (
        "var_dim_keepdim_biased",
        lambda a: a.var(0, keepdim=True, unbiased=False),
        lambda r: (rnd(r, 3, 4),),
    ),
    ("var_dims", lambda a: a.var((0, 2)), lambda r: (rnd(r, 2, 3, 4),)),
    ("std_dim", lambda a: a.std(1), lambda r: (rnd(r, 3, 4),)),
    # movement
    ("reshape", lambda a: a.reshape(4, 3), lambda r: (rnd(r, 3, 4),)),
    ("reshape_infer", lambda a: a.reshape(-1), lambda r: (rnd(r, 3, 4),)),
    ("view", lambda a: a.view(2, 6), lambda r: (rnd(r, 3, 4),)),
    ("view_infer", lambda a: a.view(-1, 2), lambda r: (rnd(r, 3, 4),)),
    ("flatten", lambda a: a.flatten(), lambda r: (rnd(r, 2, 3, 4),)),
    ("flatten_range", lambda a: a.flatten(1), lambda r: (rnd(r, 2, 3, 4),)),
    ("flatten_0d", lambda a: a.flatten(), lambda r: (rnd(r),)),
    ("squeeze_all", lambda a: a.squeeze(), lambda r: (rnd(r, 3, 1, 4, 1),)),
    ("squeeze_dim", lambda a: a.squeeze(1), lambda r: (rnd(r, 3, 1, 4),)),
    ("unsqueeze", lambda a: a.unsqueeze(-1), lambda r: (rnd(r, 3, 4),)),
    ("unsqueeze_0d", lambda a: a.unsqueeze(0), lambda r: (rnd(r),)),
    ("transpose", lambda a: a.transpose(0, 2), lambda r: (rnd(r, 2, 3, 4),)),
    ("permute", lambda a: a.permute(2, 0, 1), lambda r: (rnd(r, 2, 3, 4),)),
    ("t", lambda a: a.t(), lambda r: (rnd(r, 3, 4),)),
    ("T", lambda a: a.T, lambda r: (rnd(r, 2, 3, 4),)),
    ("expand", lambda a: a.expand(2, 3, 4), lambda r: (rnd(r, 3, 1),)),
    ("expand_keep", lambda a: a.expand(2, -1, 4), lambda r: (rnd(r, 3, 1),)),
    ("expand_0d", lambda a: a.expand(3), lambda r: (rnd(r),)),
    ("index_int", lambda a: a[1], lambda r: (rnd(r, 3, 4),)),
    ("index_slices", lambda a: a[1:, ::2], lambda r: (rnd(r, 3, 4),)),
    ("index_neg_ellipsis_none", lambda a: a[..., None, -1], lambda r: (rnd(r, 3, 4),)),
    ("index_tensor_repeated", lambda a: a[idx([0, 2, 0, 0])], lambda r: (rnd(r, 3, 4),)),
    ("index_list_repeated", lambda a: a[[1, 1, 2]], lambda r: (rnd(r, 3, 4),)),
    (
        "index_two_arrays_repeated",
        lambda a: a[idx([0, 2, 0]), idx([1, 1, 1])],
        lambda r: (rnd(r, 3, 4),),
    ),
    ("index_slice_and_array", lambda a: a[1:, [0, 0, 3]], lambda r: (rnd(r, 3, 4),)),
    ("index_bool_mask", lambda a: a[a.detach() > 0], lambda r: (rnd(r, 3, 4),)),
    ("cat_dim1", lambda a, b: gw.cat([a, b], 1), lambda r: (rnd(r, 3, 4), rnd(r, 3, 2))),
    ("cat_neg_same_input", lambda a: gw.cat([a, a * 2], -1), lambda r: (rnd(r, 3, 2),)),
    ("stack", lambda a, b: gw.stack([a, b], 1), lambda r: (rnd(r, 3, 4), rnd(r, 3, 4))),
    ("stack_last", lambda a, b: gw.stack([a, b], -1), lambda r: (rnd(r, 3), rnd(r, 3))),
    ("split_size", lambda a: a.split(2, 1), lambda r: (rnd(r, 3, 5),)),
    ("split_sections", lambda a: a.split([1, 4], 1), lambda r: (rnd(r, 3, 5),)),
    ("chunk", lambda a: a.chunk(3, 0), lambda r: (rnd(r, 5, 2),)),
    ("chunk_used_once", lambda a: a.chunk(2, 1)[1], lambda r: (rnd(r, 2, 4),)),
    ("clone", lambda a: a.clone(), lambda r: (rnd(r, 3, 4),)),
    ("contiguous", lambda a: a.t().contiguous(), lambda r: (rnd(r, 3, 4),)),
    ("to_complex_and_back", lambda a: (a.to(C128) * (1 + 2j)).real, lambda r: (rnd(r, 3),)),
    ("double_noop_to", lambda a: a.to(F64) * 2, lambda r: (rnd(r, 3),)),
    ("conj_real_noop", lambda a: a.conj() * 3, lambda r: (rnd(r, 3),)),
    ("real_of_real", lambda a: a.real * 3, lambda r: (rnd(r, 3),)),
]

COMPLEX_CASES = [
    (
        "add_bcast",
        lambda a, b: a + b,
        lambda r: (rnd(r, 3, 1, 4, complex_=True), rnd(r, 2, 4, complex_=True)),
    ),
    ("sub", lambda a, b: a - b, lambda r: (rnd(r, 3, complex_=True), rnd(r, 3, complex_=True))),
    (
        "mul_bcast",
        lambda a, b: a * b,
        lambda r: (rnd(r, 3, 1, 4, complex_=True), rnd(r, 2, 4, complex_=True)),
    ),
    ("mul_scalar", lambda a: a * (2 - 3j), lambda r: (rnd(r, 3, complex_=True),)),
    (
        "div",
        lambda a, b: a / b,
        lambda r: (rnd(r, 3, complex_=True), rnd(r, 3, complex_=True, positive=False)),
    ),
    ("neg", lambda a: -a, lambda r: (rnd(r, 3, complex_=True),)),
    ("pow_int", lambda a: a**3, lambda r: (rnd(r, 3, complex_=True),)),
    (
        "pow_tensor",
        lambda a, b: a**b,
        lambda r: (rnd(r, 3, complex_=True), rnd(r, 3, complex_=True)),
    ),
    ("exp", lambda a: a.exp(), lambda r: (rnd(r, 3, complex_=True),)),
    ("log", lambda a: a.log(), lambda r: (rnd(r, 3, complex_=True),)),
    ("sqrt", lambda a: a.sqrt(), lambda r: (rnd(r, 3, complex_=True),)),
    ("sin", lambda a: a.sin(), lambda r: (rnd(r, 3, complex_=True),)),
    ("cos", lambda a: a.cos(), lambda r: (rnd(r, 3, complex_=True),)),
    ("tanh", lambda a: a.tanh(), lambda r: (rnd(r, 3, complex_=True),)),
    ("sigmoid", lambda a: a.sigmoid(), lambda r: (rnd(r, 3, complex_=True),)),
    ("conj", lambda a: a.conj(), lambda r: (rnd(r, 3, complex_=True),)),
    (
        "matmul",
        lambda a, b: a @ b,
        lambda r: (rnd(r, 3, 4, complex_=True), rnd(r, 4, 2, complex_=True)),
    ),
    (
        "matmul_1d",
        lambda a, b: a @ b,
        lambda r: (rnd(r, 4, complex_=True), rnd(r, 4, complex_=True)),
    ),
    ("sum_dim", lambda a: a.sum(1), lambda r: (rnd(r, 3, 4, complex_=True),)),
    ("mean", lambda a: a.mean(), lambda r: (rnd(r, 3, 4, complex_=True),)),
    ("prod_dim", lambda a: a.prod(0), lambda r: (rnd(r, 3, 2, complex_=True),)),
    ("reshape_t", lambda a: a.reshape(2, 3).t(), lambda r: (rnd(r, 6, complex_=True),)),
    ("index_repeated", lambda a: a[[0, 0, 2]], lambda r: (rnd(r, 3, 2, complex_=True),)),
    ("expand", lambda a: a.expand(2, 3), lambda r: (rnd(r, 3, complex_=True),)),
    (
        "cat_stack",
        lambda a, b: gw.stack([gw.cat([a, b]), gw.cat([b, a])]),
        lambda r: (rnd(r, 2, complex_=True), rnd(r, 2, complex_=True)),
    ),
    ("clone", lambda a: a.clone(), lambda r: (rnd(r, 3, complex_=True),)),
    # cross-domain: C -> R
    ("abs", lambda a: a.abs(), lambda r: (rnd(r, 3, complex_=True),)),
    ("real", lambda a: a.real, lambda r: (rnd(r, 3, complex_=True),)),
    ("imag", lambda a: a.imag, lambda r: (rnd(r, 3, complex_=True),)),
    ("abs_squared_sum", lambda a: (a.abs() ** 2).sum(), lambda r: (rnd(r, 3, complex_=True),)),
    # cross-domain: R -> C (a real input times a complex tensor)
    ("real_times_complex", lambda x, z: x * z, lambda r: (rnd(r, 3, 1), rnd(r, 4, complex_=True))),
    (
        "real_times_complex_const",
        lambda x: x * gw.tensor([1 + 2j, 3j, -1.0], dtype=C128),
        lambda r: (rnd(r, 3),),
    ),
    ("real_to_complex_cast", lambda x: x.to(C128).exp(), lambda r: (rnd(r, 3),)),
]


def _seed(name):
    return zlib.crc32(name.encode())


def _run(fn, make, seed):
    rng = np.random.default_rng(seed)
    inputs = make(rng)
    assert gradcheck(fn, inputs)


@pytest.mark.parametrize("name,fn,make", REAL_CASES, ids=[c[0] for c in REAL_CASES])
def test_gradcheck_real(name, fn, make):
    _run(fn, make, seed=_seed(name))


@pytest.mark.parametrize("name,fn,make", COMPLEX_CASES, ids=[c[0] for c in COMPLEX_CASES])
def test_gradcheck_complex(name, fn, make):
    _run(fn, make, seed=_seed(name))


GRADGRAD = [
    "mul_bcast",
    "div_bcast",
    "pow_float",
    "pow_tensor_bcast",
    "exp",
    "log",
    "sqrt",
    "sin",
    "tanh",
    "sigmoid",
    "softmax_dim1",
    "log_softmax",
    "matmul_batched_bcast",
    "matmul_1d_1d",
    "sum_dims_keepdim",
    "mean_all",
    "var_dim",
    "max_dim",
    "index_tensor_repeated",
    "cat_dim1",
    "stack",
    "expand",
    "permute",
    "where_bcast",
    "maximum_bcast",
    "clamp_both",
    "prod_all",
    "prod_dim",
]
COMPLEX_GRADGRAD = ["prod_dim", "mul_bcast", "div", "exp", "abs", "matmul", "real_times_complex"]


@pytest.mark.parametrize("name", GRADGRAD)
def test_gradgradcheck_real(name):
    (fn, make) = next((c[1], c[2]) for c in REAL_CASES if c[0] == name)
    inputs = make(np.random.default_rng(_seed(name)))
    assert gradgradcheck(fn, inputs)


@pytest.mark.parametrize("name", COMPLEX_GRADGRAD)
def test_gradgradcheck_complex(name):
    (fn, make) = next((c[1], c[2]) for c in COMPLEX_CASES if c[0] == name)
    inputs = make(np.random.default_rng(_seed(name)))
    assert gradgradcheck(fn, inputs)


def test_gradcheck_detects_a_wrong_backward():
    class WrongSquare(gw.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x  # should be 2 * x

    x = leaf([1.0, 2.0])
    with pytest.raises(GradcheckError, match="Jacobian mismatch"):
        gradcheck(WrongSquare.apply, (x,))
    assert gradcheck(WrongSquare.apply, (x,), raise_exception=False) is False


def test_gradcheck_detects_a_wrong_complex_convention():
    class NotConjugated(gw.autograd.Function):
        @staticmethod
        def forward(ctx, z):
            return z * (2 + 1j)

        @staticmethod
        def backward(ctx, g):
            return g * (2 + 1j)  # the conjugate Wirtinger rule wants g * conj(2 + 1j)

    z = leaf(np.array([1 + 1j, 2 - 1j]))
    assert gradcheck(NotConjugated.apply, (z,), raise_exception=False) is False


def _scalar_loss(out):
    outs = out if isinstance(out, tuple) else (out,)
    total = None
    for o in outs:
        s = (o * o.conj()).real.sum() if o.is_complex() else (o * o).sum()
        total = s if total is None else total + s
    return total


@pytest.mark.parametrize(
    "name,fn,make",
    REAL_CASES + COMPLEX_CASES,
    ids=[c[0] for c in REAL_CASES] + ["c_" + c[0] for c in COMPLEX_CASES],
)
def test_plain_backward_frees_the_graph_and_matches_autograd_grad(name, fn, make):
    # gradcheck keeps graphs alive (retain_graph); this walks each op once without it, as
    # training code does, so freeing saved values cannot break a backward.
    inputs = make(np.random.default_rng(_seed(name)))
    expected = gw.autograd.grad(_scalar_loss(fn(*inputs)), inputs, allow_unused=True)
    loss = _scalar_loss(fn(*inputs))
    loss.backward()
    for x, e in zip(inputs, expected):
        if e is None:
            assert x.grad is None
        else:
            np.testing.assert_allclose(x.grad.numpy(), e.numpy(), rtol=1e-12, atol=1e-12)
