"""``%`` and ``//`` on tensors follow Python's (and PyTorch's) floor rules."""

from __future__ import annotations

import gradwire as gw
import numpy as np
from gradwire.autograd import gradcheck
from torch_oracle import torch_values

A = np.array([-5.0, 5.0, 7.5, -7.5, 0.0])
B = np.array([3.0, -3.0, 2.0, 2.5, -1.5])


def test_remainder_takes_the_sign_of_the_divisor_and_has_a_gradient() -> None:
    assert (gw.tensor(A) % gw.tensor(B)).tolist() == [1.0, -1.0, 1.5, 0.0, -0.0]
    assert (gw.arange(7) % 3).tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert (7 % gw.tensor([3, -4])).tolist() == [1, -1]
    assert gw.remainder(gw.tensor([5]), 2).tolist() == [1]
    a = gw.tensor(A[:3], requires_grad=True)
    b = gw.tensor(B[:3], requires_grad=True)
    assert gradcheck(lambda x, y: x % y, (a, b))


def test_floor_divide_floors_and_gives_no_gradient() -> None:
    assert (gw.arange(7) // 3).tolist() == [0, 0, 0, 1, 1, 1, 2]
    assert (gw.tensor([-7, 7]) // 2).tolist() == [-4, 3]
    q = gw.tensor(A, requires_grad=True) // 2
    assert not q.requires_grad and q.tolist() == (A // 2).tolist()


def test_they_match_pytorch() -> None:
    theirs = torch_values(
        """
        a = torch.tensor(inputs["a"], requires_grad=True)
        b = torch.tensor(inputs["b"], requires_grad=True)
        r = a % b
        (r * r).sum().backward()
        out.update(r=r, q=torch.floor_divide(a, b), ga=a.grad, gb=b.grad, i=torch.arange(-6, 6) % 4)
        """,
        {"a": A, "b": B},
    )
    a, b = gw.tensor(A, requires_grad=True), gw.tensor(B, requires_grad=True)
    r = a % b
    (r * r).sum().backward()
    mine = {
        "r": r,
        "q": gw.floor_divide(a, b),
        "ga": a.grad,
        "gb": b.grad,
        "i": gw.arange(-6, 6) % 4,
    }
    for key, value in mine.items():
        np.testing.assert_allclose(value.detach().numpy(), theirs[key], err_msg=key)
