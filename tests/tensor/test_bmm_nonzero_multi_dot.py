"""bmm, nonzero and linalg.multi_dot: gradcheck, and values and gradients against PyTorch's."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest
from gradwire.autograd import gradcheck
from torch_oracle import torch_values


def test_bmm_and_multi_dot_gradcheck() -> None:
    a = gw.randn(2, 3, 4, dtype=gw.float64, requires_grad=True)
    b = gw.randn(2, 4, 5, dtype=gw.float64, requires_grad=True)
    assert gradcheck(gw.bmm, (a, b))
    x = gw.randn(4, dtype=gw.float64, requires_grad=True)
    m = gw.randn(4, 3, dtype=gw.float64, requires_grad=True)
    y = gw.randn(3, dtype=gw.float64, requires_grad=True)
    assert gradcheck(lambda x, m, y: gw.linalg.multi_dot([x, m, y]), (x, m, y))


def test_errors() -> None:
    with pytest.raises(RuntimeError, match="3D"):
        gw.bmm(gw.ones(2, 3), gw.ones(3, 2))
    with pytest.raises(RuntimeError, match="batches"):
        gw.bmm(gw.ones(2, 3, 4), gw.ones(3, 4, 2))
    with pytest.raises(RuntimeError, match="at least 2"):
        gw.linalg.multi_dot([gw.ones(2, 2)])
    with pytest.raises(RuntimeError, match="2D"):
        gw.linalg.multi_dot([gw.ones(2, 2), gw.ones(2), gw.ones(2, 2)])


def test_values_and_gradients_match_pytorch() -> None:
    rng = np.random.default_rng(0)
    inputs = {
        "a": rng.standard_normal((2, 3, 4)),
        "b": rng.standard_normal((2, 4, 5)),
        "m1": rng.standard_normal((3, 4)),
        "m2": rng.standard_normal((4, 4)),
        "m3": rng.standard_normal((4, 2)),
        "z": np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]]),
    }
    ref = torch_values(
        "a = torch.tensor(inputs['a'], requires_grad=True)\n"
        "b = torch.tensor(inputs['b'], requires_grad=True)\n"
        "ms = [torch.tensor(inputs[k], requires_grad=True) for k in ('m1', 'm2', 'm3')]\n"
        "out['bmm'] = torch.bmm(a, b); out['bmm'].sum().backward()\n"
        "out['ga'] = a.grad; out['gb'] = b.grad\n"
        "out['md'] = torch.linalg.multi_dot(ms); out['md'].pow(2).sum().backward()\n"
        "out['g1'] = ms[0].grad; out['g3'] = ms[2].grad\n"
        "out['nz'] = torch.nonzero(torch.tensor(inputs['z']))\n"
        "out['nzt'] = torch.stack(torch.tensor(inputs['z']).nonzero(as_tuple=True))\n",
        inputs,
    )
    a = gw.tensor(inputs["a"], requires_grad=True)
    b = gw.tensor(inputs["b"], requires_grad=True)
    out = gw.bmm(a, b)
    out.sum().backward()
    ms = [gw.tensor(inputs[k], requires_grad=True) for k in ("m1", "m2", "m3")]
    md = gw.linalg.multi_dot(ms)
    md.pow(2).sum().backward()
    z = gw.tensor(inputs["z"])
    got = {
        "bmm": out,
        "ga": a.grad,
        "gb": b.grad,
        "md": md,
        "g1": ms[0].grad,
        "g3": ms[2].grad,
        "nz": gw.nonzero(z),
        "nzt": gw.stack(z.nonzero(as_tuple=True)),
    }
    for key, value in got.items():
        np.testing.assert_allclose(value.detach().numpy(), ref[key], rtol=1e-12, err_msg=key)
    assert gw.nonzero(z).dtype == gw.int64
