"""Every tensor method on the right current device, on the TEST-ONLY CuPy stand-in.

CuPy launches each kernel on the *current* device; without peer access an array of another
device is refused. The stand-in (tests/fake_cupy) refuses the same way for operators, methods
that run a kernel, ``__setitem__`` and advanced indexing, so each case below runs on a
``cuda:1`` tensor while ``cuda:0`` is current, and must give the CPU's values on ``cuda:1``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import gradwire as gw
import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("fake_cupy_module")


def _idx(values: Any, dev: str) -> gw.Tensor:
    return gw.tensor(values).to(dev)


def _linear(dev: str) -> gw.nn.Module:
    gw.manual_seed(0)
    return gw.nn.Linear(4, 2).to(dev)


def _step(opt_cls: Any, dev: str, x: gw.Tensor, **kw: Any) -> gw.Tensor:
    m = _linear(dev)
    opt = opt_cls(m.parameters(), **kw)
    for _ in range(2):
        opt.zero_grad()
        m(x).sum().backward()
        opt.step()
    return m.weight.detach()


def _bn(dev: str, x: gw.Tensor) -> gw.Tensor:
    bn = gw.nn.BatchNorm1d(4).to(dev)
    bn(x)
    return bn.running_mean


def _state_dict(dev: str, x: gw.Tensor) -> gw.Tensor:
    m = _linear(dev)
    m.load_state_dict({"weight": gw.ones(2, 4), "bias": gw.zeros(2)})
    return m(x)


def _grad(fn: Callable[[gw.Tensor], gw.Tensor]) -> Callable[[gw.Tensor, str], gw.Tensor]:
    def run(t: gw.Tensor, dev: str) -> gw.Tensor:
        leaf = t.clone().requires_grad_()
        fn(leaf).sum().backward()
        return leaf.grad

    return run


# name -> f(tensor on dev, dev) -> a tensor (or a value) to compare with the CPU's
CASES: dict[str, Callable[[gw.Tensor, str], Any]] = {
    "fill_": lambda t, d: t.fill_(1.5),
    "zero_": lambda t, d: t.zero_(),
    "copy_ (same device)": lambda t, d: t.copy_(gw.ones(3, 4).to(d)),
    "copy_ (from the CPU)": lambda t, d: t.copy_(gw.ones(3, 4)),
    "clamp_": lambda t, d: t.clamp_(0.5, 2.0),
    "add_ (fast path)": lambda t, d: t.add_(1.0),
    "add_ tensor": lambda t, d: t.add_(t),
    "mul_": lambda t, d: t.mul_(2.0),
    "sub_": lambda t, d: t.sub_(t * 0.5),
    "div_": lambda t, d: t.div_(2.0),
    "+=": lambda t, d: t.__iadd__(1.0),
    "relu_": lambda t, d: (t - 1).relu_(),
    "setitem basic": lambda t, d: (t.__setitem__(0, 5.0), t)[1],
    "setitem advanced": lambda t, d: (t.__setitem__(_idx([0, 2], d), 5.0), t)[1],
    "getitem advanced": lambda t, d: t[_idx([0, 2], d)],
    "getitem mask": lambda t, d: t[t > 1],
    "deepcopy": lambda t, d: copy.deepcopy(t),
    "clone": lambda t, d: t.clone(),
    "to(dtype)": lambda t, d: t.to(gw.float64),
    "half": lambda t, d: t.half(),
    "contiguous": lambda t, d: t.T.contiguous(),
    "reshape (copy)": lambda t, d: t.T.reshape(12),
    "equal": lambda t, d: t.equal(t),
    "allclose": lambda t, d: t.allclose(t + 1e-9),
    "nonzero": lambda t, d: (t - 1).nonzero(),
    "all": lambda t, d: t.all(),
    "any": lambda t, d: (t > 2).any(),
    "~": lambda t, d: ~(t > 1),
    "&": lambda t, d: (t > 1) & (t < 3),
    "masked_fill": lambda t, d: t.masked_fill(t > 1, 0.0),
    "where (scalar)": lambda t, d: gw.where(t > 1, t, 0.0),
    "gather": lambda t, d: t.gather(1, _idx([[0], [1], [2]], d)),
    "scatter": lambda t, d: t.scatter(1, _idx([[0], [1], [2]], d), 1.0),
    "scatter_": lambda t, d: t.scatter_(1, _idx([[0], [1], [2]], d), 1.0),
    "index_select": lambda t, d: t.index_select(0, _idx([0, 2], d)),
    "item": lambda t, d: t[1, 1].item(),
    "tolist": lambda t, d: t.tolist(),
    "backward": _grad(lambda w: w * w),
    "backward, advanced index": _grad(lambda w: w[_idx([0, 0, 2], w.device)]),
    "init.zeros_": lambda t, d: gw.nn.init.zeros_(t),
    "init.constant_": lambda t, d: gw.nn.init.constant_(t, 0.25),
    "Linear": lambda t, d: _linear(d)(t),
    "BatchNorm1d running stats": lambda t, d: _bn(d, t),
    "load_state_dict": lambda t, d: _state_dict(d, t),
    "SGD with momentum": lambda t, d: _step(gw.optim.SGD, d, t, lr=0.1, momentum=0.9),
    "Adam": lambda t, d: _step(gw.optim.Adam, d, t, lr=0.1),
    "cross_entropy": lambda t, d: gw.nn.functional.cross_entropy(t, _idx([0, 1, 2], d)),
}


def _host(value: Any) -> Any:
    if isinstance(value, gw.Tensor):
        return value.cpu().detach().numpy()
    if isinstance(value, tuple):
        return tuple(_host(v) for v in value)
    return value


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_method_on_cuda1_runs_there_while_cuda0_is_current(name: str) -> None:
    import fake_cupy

    case = CASES[name]
    start = np.arange(12, dtype=np.float32).reshape(3, 4) / 3
    want = case(gw.tensor(start), "cpu")
    assert fake_cupy.cuda.current_device() == 0
    got = case(gw.tensor(start).to("cuda:1"), "cuda:1")
    assert fake_cupy.cuda.current_device() == 0  # the method left the current device alone
    if isinstance(got, gw.Tensor):
        assert str(got.device) == "cuda:1", name
    np.testing.assert_allclose(_host(got), _host(want), rtol=1e-6, err_msg=name)


def test_tensors_made_from_scalars_land_beside_their_tensor() -> None:
    t = gw.ones(2, 2).to("cuda:1")
    for made in (t > 1, gw.where(t > 1, t, 0.0), gw.zeros_like(t), t + 1.0):
        assert str(made.device) == "cuda:1"


def test_the_stand_in_refuses_unscoped_kernels_like_cupy(fake_cupy_module: Any) -> None:
    """The rule the cases above rely on: the stand-in refuses a kernel on an array of a
    device that is not current, and lets views and copies through."""
    with fake_cupy_module.cuda.Device(1):
        a = fake_cupy_module.arange(6.0).reshape(2, 3)
    for kernel in (
        lambda: a.sum(),
        lambda: a.astype(np.float32),
        lambda: a.__setitem__(0, 1.0),
        lambda: a[fake_cupy_module.asarray([0])],
        lambda: a.T.reshape(6),
        lambda: a + 1,
    ):
        with pytest.raises(ValueError, match="Peer access is unavailable"):
            kernel()
    assert a.T.shape == (3, 2) and a[0].shape == (3,) and a.reshape(6).shape == (6,)
    assert a.get().sum() == 15.0
    assert a.copy().device.id == 0  # CuPy: a copy lands on the current device
    assert copy.deepcopy(a).device.id == 1  # ... a deep copy on the array's own
