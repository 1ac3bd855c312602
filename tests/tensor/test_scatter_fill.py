"""gather / scatter / index_select / view_as and the in-place random fills, against hand-made
values, gradcheck, and PyTorch's values where torch imports."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest
from gradwire.autograd import gradcheck
from torch_oracle import torch_values

X = np.arange(12.0).reshape(3, 4)
IDX = np.array([[0, 3], [2, 0], [1, 1]])
COL = np.array([[1], [0], [3]])


def test_gather_picks_along_the_dimension_and_accumulates_its_gradient() -> None:
    x = gw.tensor(X, requires_grad=True)
    out = x.gather(1, gw.tensor(IDX))
    assert out.tolist() == [[0.0, 3.0], [6.0, 4.0], [9.0, 9.0]]
    out.sum().backward()
    assert x.grad.tolist() == [[1, 0, 0, 1], [1, 0, 1, 0], [0, 2, 0, 0]]
    assert gradcheck(
        lambda t: t.gather(0, gw.tensor([[0, 2, 1, 0]])), (gw.tensor(X, requires_grad=True),)
    )


def test_scatter_writes_values_and_sources_and_its_gradients_reach_both() -> None:
    z = gw.zeros(3, 4).scatter_(1, gw.tensor(COL), 1.0)
    assert z.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1]]
    base = gw.tensor(X, requires_grad=True)
    src = gw.full((3, 2), 5.0, requires_grad=True)
    out = base.scatter(1, gw.tensor(COL), src)
    assert out[:, 1].tolist() == [5.0, 5.0, 9.0] and base[0, 1].item() == 1.0  # self unchanged
    out.sum().backward()
    assert base.grad.tolist() == [[1, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 0]]
    assert src.grad.tolist() == [[1, 0], [1, 0], [1, 0]]


def test_index_select_and_view_as() -> None:
    x = gw.tensor(X)
    assert x.index_select(0, gw.tensor([2, 0])).tolist() == [X[2].tolist(), X[0].tolist()]
    assert x.index_select(1, gw.tensor([1])).shape == (3, 1)
    assert x.view_as(gw.zeros(4, 3)).shape == (4, 3)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda x: x.gather(1, gw.tensor([[4]])), IndexError, "out of bounds for dimension 1"),
        (lambda x: x.gather(1, gw.tensor([1, 2])), RuntimeError, "same number of dimensions"),
        (lambda x: x.gather(2, gw.tensor([[0]])), IndexError, "dimension 2 is out of range"),
        (lambda x: x.gather(1, gw.tensor([[0.5]])), TypeError, "integer"),
        (lambda x: x.scatter_(1, gw.tensor([[0]])), TypeError, "exactly one of src"),
        (lambda x: x.index_select(0, gw.tensor([[0]])), TypeError, "1-D integer"),
        (lambda x: x.random_(3, 3), ValueError, "from=3 >= to=3"),
    ],
)
def test_bad_arguments_are_named(call, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        call(gw.tensor(X))


def test_random_fills_stay_in_range_and_follow_manual_seed() -> None:
    gw.manual_seed(3)
    a = gw.zeros(1000).uniform_(-2, 3)
    assert -2 <= a.min().item() and a.max().item() < 3 and abs(a.mean().item() - 0.5) < 0.15
    gw.manual_seed(3)
    assert gw.zeros(1000).uniform_(-2, 3).tolist() == a.tolist()
    n = gw.zeros(4000).normal_(1.0, 2.0)
    assert abs(n.mean().item() - 1.0) < 0.15 and abs(n.std().item() - 2.0) < 0.15
    r = gw.zeros(500, dtype=gw.int64).random_(0, 5)
    assert set(r.tolist()) == {0, 1, 2, 3, 4}
    assert set(gw.zeros(200, dtype=gw.int64).random_(3).tolist()) == {0, 1, 2}
    w = gw.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        w.uniform_()
    w.data.uniform_(-0.1, 0.1)  # the tutorials' idiom
    assert (w.abs() <= 0.1).all().item()


def test_the_index_ops_match_pytorch() -> None:
    theirs = torch_values(
        """
        x = torch.tensor(inputs["x"], requires_grad=True)
        idx, col = torch.tensor(inputs["idx"]), torch.tensor(inputs["col"])
        g = x.gather(1, idx)
        s = x.scatter(1, col, x[:, :1] * 3)
        i = x.index_select(1, torch.tensor([3, 0, 3]))
        (g.sum() * 2 + (s * s).sum() + i.sum()).backward()
        out.update(g=g, s=s, i=i, grad=x.grad, z=torch.zeros(3, 4).scatter_(0, torch.tensor([[0, 2, 0, 1]]), 7.0))
        """,
        {"x": X, "idx": IDX, "col": COL},
    )
    x = gw.tensor(X, requires_grad=True)
    idx, col = gw.tensor(IDX), gw.tensor(COL)
    g = x.gather(1, idx)
    s = x.scatter(1, col, x[:, :1] * 3)
    i = x.index_select(1, gw.tensor([3, 0, 3]))
    (g.sum() * 2 + (s * s).sum() + i.sum()).backward()
    z = gw.zeros(3, 4).scatter_(0, gw.tensor([[0, 2, 0, 1]]), 7.0)
    for name, mine in {"g": g, "s": s, "i": i, "grad": x.grad, "z": z}.items():
        np.testing.assert_allclose(mine.detach().numpy(), theirs[name], err_msg=name)
