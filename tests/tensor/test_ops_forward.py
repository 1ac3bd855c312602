"""Forward values of every op against NumPy, including broadcasting and result dtypes."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest

RNG = np.random.default_rng(7)
A = RNG.standard_normal((3, 1, 4))
B = RNG.standard_normal((2, 4))
P = np.abs(RNG.standard_normal((2, 3))) + 0.5  # positive, for log/sqrt/pow
M = RNG.standard_normal((3, 4))
Z = RNG.standard_normal((3, 2)) + 1j * RNG.standard_normal((3, 2))


def T(a):
    return gw.tensor(a)


def check(got, expected, dtype=None):
    assert isinstance(got, gw.Tensor)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-12)
    assert got.shape == np.shape(expected)
    if dtype is not None:
        assert got.dtype == dtype


BINARY = [
    ("add", lambda a, b: a + b, np.add),
    ("sub", lambda a, b: a - b, np.subtract),
    ("mul", lambda a, b: a * b, np.multiply),
    ("div", lambda a, b: a / b, np.divide),
    ("maximum", gw.maximum, np.maximum),
    ("minimum", gw.minimum, np.minimum),
]


@pytest.mark.parametrize("name,op,ref", BINARY, ids=[b[0] for b in BINARY])
def test_binary_ops_broadcast_like_numpy(name, op, ref):
    check(op(T(A), T(B)), ref(A, B), gw.float64)
    check(op(T(A), T(np.float64(1.5))), ref(A, 1.5))


def test_arithmetic_with_python_scalars_on_both_sides():
    check(2.0 + T(M), 2.0 + M)
    check(2.0 - T(M), 2.0 - M)
    check(T(M) - 2, M - 2)
    check(3 * T(M), 3 * M)
    check(1.0 / T(P), 1.0 / P)
    check(T(P) ** 2, P**2)
    check(T(P) ** 0.5, P**0.5)
    check(2.0 ** T(M), 2.0**M)
    check(T(P) ** T(M[:2, :3]), P ** M[:2, :3])
    check(-T(M), -M)
    check(T(M).neg(), -M)
    check(gw.pow(T(P), 3), P**3)


def test_add_and_sub_with_alpha():
    check(T(M).add(T(M[0]), alpha=2), M + 2 * M[0])
    check(T(M).sub(T(M[0]), alpha=0.5), M - 0.5 * M[0])


UNARY = [
    ("exp", np.exp, M),
    ("log", np.log, P),
    ("sqrt", np.sqrt, P),
    ("abs", np.abs, M),
    ("sin", np.sin, M),
    ("cos", np.cos, M),
    ("tanh", np.tanh, M),
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), M),
    ("relu", lambda x: np.maximum(x, 0), M),
]


@pytest.mark.parametrize("name,ref,data", UNARY, ids=[u[0] for u in UNARY])
def test_unary_ops_match_numpy(name, ref, data):
    check(getattr(T(data), name)(), ref(data), gw.float64)
    check(getattr(gw, name)(T(data)), ref(data))


def test_sigmoid_is_stable_for_large_inputs():
    out = gw.tensor([-1000.0, 0.0, 1000.0]).sigmoid()
    assert out.tolist() == [0.0, 0.5, 1.0]


@pytest.mark.parametrize("name,ref", [("exp", np.exp), ("sin", np.sin), ("sqrt", np.sqrt)])
def test_complex_unary_ops_match_numpy(name, ref):
    check(getattr(T(Z), name)(), ref(Z), gw.complex128)


def test_softmax_and_log_softmax():
    e = np.exp(M - M.max(1, keepdims=True))
    sm = e / e.sum(1, keepdims=True)
    check(T(M).softmax(1), sm)
    check(T(M).log_softmax(1), np.log(sm))
    check(gw.softmax(T(M), dim=0), np.exp(M) / np.exp(M).sum(0, keepdims=True))
    # Large logits must not overflow.
    big = gw.tensor([1000.0, 1000.0]).softmax(0)
    assert big.tolist() == [0.5, 0.5]


def test_clamp_variants():
    check(T(M).clamp(-0.5, 0.5), np.clip(M, -0.5, 0.5))
    check(T(M).clamp(min=0.1), np.maximum(M, 0.1))
    check(T(M).clamp(max=0.1), np.minimum(M, 0.1))
    check(T(M).clamp(T(np.full(4, -0.2)), T(np.full((3, 1), 0.3))), np.clip(M, -0.2, 0.3))
    with pytest.raises(RuntimeError, match="At least one of 'min' or 'max'"):
        T(M).clamp()


def test_where_picks_by_condition_with_broadcasting():
    cond = A > 0
    check(gw.where(T(cond), T(A), T(B)), np.where(cond, A, B))
    check(gw.where(T(cond), T(A), 0.0), np.where(cond, A, 0.0))
    assert gw.where(gw.tensor([True, False]), 1.0, 2.0).dtype == gw.float32


@pytest.mark.parametrize(
    "sa,sb",
    [((3, 4), (4, 2)), ((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 2)), ((2, 1, 3, 4), (5, 4, 2))],
)
def test_matmul_shapes_match_numpy(sa, sb):
    a, b = RNG.standard_normal(sa), RNG.standard_normal(sb)
    check(T(a) @ T(b), a @ b)
    check(gw.matmul(T(a), T(b)), a @ b)


def test_matmul_shape_mismatch_is_a_clear_error():
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        gw.ones(2, 3) @ gw.ones(2, 3)
    with pytest.raises(RuntimeError, match="at least 1D"):
        gw.tensor(1.0) @ gw.ones(2)


@pytest.mark.parametrize("name", ["sum", "mean", "prod", "var"])
def test_reductions_with_dim_and_keepdim(name):
    x = RNG.standard_normal((2, 3, 4))
    ref = {
        "sum": np.sum,
        "mean": np.mean,
        "prod": np.prod,
        "var": lambda a, **k: np.var(a, ddof=1, **k),
    }[name]
    check(getattr(T(x), name)(), ref(x))
    check(getattr(T(x), name)(1), ref(x, axis=1))
    check(getattr(T(x), name)(-1, keepdim=True), ref(x, axis=-1, keepdims=True))
    if name != "prod":
        check(getattr(T(x), name)((0, 2)), ref(x, axis=(0, 2)))


def test_var_and_std_corrections():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    assert T(x).var().item() == pytest.approx(np.var(x, ddof=1))
    assert T(x).var(unbiased=False).item() == pytest.approx(np.var(x))
    assert T(x).var(correction=0).item() == pytest.approx(np.var(x))
    assert T(x).std().item() == pytest.approx(np.std(x, ddof=1))


def test_max_min_all_and_by_dim():
    x = np.array([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    assert T(x).max().item() == 7.0
    assert T(x).min().item() == 0.0
    values, indices = T(x).max(1)
    assert values.tolist() == [5.0, 7.0] and indices.tolist() == [1, 0]
    assert indices.dtype == gw.int64
    out = T(x).min(dim=0, keepdim=True)
    assert out.values.tolist() == [[1.0, 0.0, 2.0]] and out.indices.tolist() == [[0, 1, 0]]
    assert T(x).argmax().item() == 3
    assert T(x).argmax(1).tolist() == [1, 0]
    assert T(x).argmin(0).tolist() == [0, 1, 0]


def test_comparisons_give_bool_tensors():
    a, b = gw.tensor([1.0, 2.0, 3.0]), gw.tensor([2.0, 2.0, 2.0])
    assert (a == b).tolist() == [False, True, False]
    assert (a != b).tolist() == [True, False, True]
    assert (a < b).tolist() == [True, False, False]
    assert (a <= b).tolist() == [True, True, False]
    assert (a > 2).tolist() == [False, False, True]
    assert (a >= 2).dtype == gw.bool
    assert not (a > 0).requires_grad


def test_integer_ops_follow_pytorch_promotion():
    i = gw.tensor([1, 2, 3])
    assert (i + 1).dtype == gw.int64
    assert (i * 1.5).dtype == gw.float32
    assert (i / 2).dtype == gw.float32 and (i / 2).tolist() == [0.5, 1.0, 1.5]
    assert (i + gw.tensor([1.0, 1.0, 1.0])).dtype == gw.float32
    assert (gw.ones(3) + gw.tensor(1.0, dtype=gw.float64)).dtype == gw.float32
    assert (i + gw.tensor(1.0, dtype=gw.float64)).dtype == gw.float64
    assert (gw.ones(3, dtype=gw.int32) + 5).dtype == gw.int32
    assert (gw.ones(2) * 1j).dtype == gw.complex64
    assert (gw.ones(2, dtype=gw.float16) * 2.5).dtype == gw.float16
    assert i.exp().dtype == gw.float32
    assert (i**0.5).dtype == gw.float32
    assert (i**2).dtype == gw.int64


def test_movement_ops_match_numpy():
    x = RNG.standard_normal((2, 3, 4))
    check(T(x).reshape(4, 6), x.reshape(4, 6))
    check(T(x).reshape(-1), x.reshape(-1))
    check(T(x).view(6, 4), x.reshape(6, 4))
    check(T(x).flatten(), x.reshape(-1))
    check(T(x).flatten(1), x.reshape(2, 12))
    check(T(x).transpose(0, 2), x.transpose(2, 1, 0))
    check(T(x).permute(2, 0, 1), x.transpose(2, 0, 1))
    check(T(x).T, x.T)
    check(T(M).t(), M.T)
    check(T(x)[:, None].squeeze(1), x)
    check(T(x).unsqueeze(-1), x[..., None])
    check(T(np.ones((3, 1, 4))).squeeze(), np.ones((3, 4)))
    check(T(np.ones((3, 1))).expand(2, 3, 4), np.ones((2, 3, 4)))
    check(T(M).contiguous(), M)
    check(T(M).clone(), M)


def test_view_of_non_contiguous_tensor_is_rejected_but_reshape_copies():
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        gw.ones(2, 3).t().view(6)
    assert gw.ones(2, 3).t().reshape(6).shape == (6,)


def test_indexing_matches_numpy():
    x = np.arange(24.0).reshape(2, 3, 4)
    check(T(x)[1], x[1])
    check(T(x)[:, 1:, ::2], x[:, 1:, ::2])
    check(T(x)[..., -1], x[..., -1])
    check(T(x)[None, 0], x[None, 0])
    check(T(x)[gw.tensor([1, 1, 0])], x[[1, 1, 0]])
    check(T(x)[[0, 1], [2, 0]], x[[0, 1], [2, 0]])
    check(T(x)[:, [0, 0, 2]], x[:, [0, 0, 2]])
    mask = x > 10
    check(T(x)[T(mask)], x[mask])
    with pytest.raises(IndexError):
        T(x)[5]


def test_cat_stack_split_chunk():
    a, b = RNG.standard_normal((2, 3)), RNG.standard_normal((2, 2))
    check(gw.cat([T(a), T(b)], 1), np.concatenate([a, b], 1))
    check(gw.stack([T(a), T(a)], -1), np.stack([a, a], -1))
    parts = T(np.arange(10.0)).split(4)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    parts = T(np.arange(10.0)).split([3, 7])
    assert [p.shape for p in parts] == [(3,), (7,)]
    chunks = T(np.arange(10.0).reshape(2, 5)).chunk(2, dim=-1)
    assert [c.shape for c in chunks] == [(2, 3), (2, 2)]
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        gw.stack([gw.ones(2), gw.ones(3)])
    with pytest.raises(RuntimeError, match="split_with_sizes"):
        gw.ones(5).split([2, 2])


def test_complex_parts_and_conj():
    check(T(Z).real, Z.real, gw.float64)
    check(T(Z).imag, Z.imag, gw.float64)
    check(T(Z).conj(), Z.conj(), gw.complex128)
    check(gw.real(T(Z)), Z.real)
    with pytest.raises(RuntimeError, match="imag is not implemented"):
        _ = gw.ones(2).imag


def test_to_dtype_converts_values():
    x = gw.tensor([1.7, -2.2])
    assert x.to(gw.int64).tolist() == [1, -2]
    assert x.to(gw.float64).dtype == gw.float64
    assert x.double().dtype == gw.float64 and x.long().dtype == gw.int64
    assert x.to(gw.complex64).tolist() == [complex(np.float32(1.7)), complex(np.float32(-2.2))]
    assert x.to(gw.float32) is x  # nothing to do: the same tensor, as in PyTorch
