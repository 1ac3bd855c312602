"""SGD, Adagrad and SparseAdam on a sparse gradient of an embedding on cuda:1 (cuda:0 current),
on the TEST-ONLY CuPy stand-in: the table and the state stay on cuda:1, the current device is
left alone, and the table after each step is the CPU's."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("fake_cupy_module")

CASES = {
    "SGD": {"lr": 0.1, "momentum": 0.9, "nesterov": True},
    "Adagrad": {"lr": 0.1, "lr_decay": 0.1},
    "SparseAdam": {"lr": 0.05},
}
SCHEDULE = [[1, 4, 1], [4, 0, 4, 2], [1]]


def _run(name: str, device: str) -> tuple[list[np.ndarray], gw.optim.Optimizer, gw.Tensor]:
    start = np.arange(18, dtype=np.float32).reshape(6, 3) / 7
    emb = gw.nn.Embedding.from_pretrained(gw.tensor(start), freeze=False, sparse=True).to(device)
    opt = getattr(gw.optim, name)(emb.parameters(), **CASES[name])
    tables = []
    for t, rows in enumerate(SCHEDULE):
        opt.zero_grad(set_to_none=False)
        weights = gw.tensor(np.linspace(-1, 1, len(rows) * 3, dtype=np.float32).reshape(-1, 3) + t)
        (emb(gw.tensor(rows, device=device)) * weights.to(device)).sum().backward()
        opt.step()
        tables.append(emb.weight.detach().cpu().numpy().copy())
    return tables, opt, emb.weight


@pytest.mark.parametrize("name", list(CASES))
def test_sparse_steps_on_cuda1_match_the_cpu(name: str) -> None:
    import fake_cupy

    want, _, _ = _run(name, "cpu")
    got, opt, weight = _run(name, "cuda:1")
    assert fake_cupy.cuda.current_device() == 0
    assert str(weight.device) == "cuda:1" and str(weight.grad.device) == "cuda:1"
    for key, value in opt.state[weight].items():
        if key != "step":
            arrays = (value.indices, value.values) if hasattr(value, "nnz") else (value,)
            assert all(a.device.id == 1 for a in arrays), key
    for t, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, err_msg=f"step {t}")  # summation order differs
    start = np.arange(18, dtype=np.float32).reshape(6, 3) / 7
    np.testing.assert_array_equal(got[-1][[3, 5]], start[[3, 5]])  # never looked up
