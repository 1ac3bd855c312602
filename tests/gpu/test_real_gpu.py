"""The current-device cases of test_current_device.py on a real GPU (``pytest -m gpu``).

Skipped without CuPy and a CUDA device (this project has none: scripts/gpu_check.sh runs them
on the first machine with one). With one GPU the cases run on ``cuda:0``; with two, on
``cuda:1`` while ``cuda:0`` is current, as the stand-in runs them.
"""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest

from .test_current_device import CASES, _host

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gw.is_cuda_available(), reason="needs CuPy and a CUDA device"),
]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_method_on_the_last_gpu_matches_the_cpu(name: str) -> None:
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    dev = f"cuda:{min(count, 2) - 1}"
    start = np.arange(12, dtype=np.float32).reshape(3, 4) / 3
    want = CASES[name](gw.tensor(start), "cpu")
    with cupy.cuda.Device(0):
        got = CASES[name](gw.tensor(start).to(dev), dev)
    if isinstance(got, gw.Tensor):
        assert str(got.device) == dev, name
    np.testing.assert_allclose(_host(got), _host(want), rtol=1e-5, err_msg=name)
