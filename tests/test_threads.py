"""gradwire.set_num_threads / get_num_threads: PyTorch's thread knob, applied to NumPy's BLAS."""

from __future__ import annotations

import subprocess
import sys

import gradwire as gw
import numpy as np
import pytest

_CHILD = """
import gradwire as gw
before = gw.get_num_threads()
gw.set_num_threads(1)
one = gw.get_num_threads()
a = gw.randn(64, 64)
ok = bool(((a @ a).numpy() == a.numpy() @ a.numpy()).all())
gw.set_num_threads(2)
print(before, one, gw.get_num_threads(), ok)
"""


def test_the_limit_is_what_get_num_threads_reports_and_products_stay_exact() -> None:
    # In a child process: the limit is process-wide and would outlive this test otherwise.
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    before, one, two, ok = int(out[0]), int(out[1]), int(out[2]), out[3]
    assert before >= 1 and one == 1 and two == 2 and ok == "True"


@pytest.mark.parametrize("bad", [0, -3])
def test_a_number_that_is_not_positive_is_refused(bad: int) -> None:
    with pytest.raises(RuntimeError, match="positive integer"):
        gw.set_num_threads(bad)


@pytest.mark.parametrize("bad", [1.5, True, "2", None])
def test_a_value_that_is_not_an_int_is_refused_naming_its_type(bad: object) -> None:
    with pytest.raises(RuntimeError, match=f"expects an int, but got {type(bad).__name__}"):
        gw.set_num_threads(bad)  # type: ignore[arg-type]


def test_an_integer_like_value_is_taken() -> None:
    threads = gw.get_num_threads()
    gw.set_num_threads(np.int64(threads))  # what it was: nothing changes for other tests
    assert gw.get_num_threads() == threads


_CASES = [1, 2, 0, -3, 1.5, True, "2", None]


def test_pytorch_takes_and_refuses_the_same_values() -> None:
    from torch_oracle import torch_python, torch_values

    threads = gw.get_num_threads()
    ours = []
    try:
        for v in _CASES:
            try:
                gw.set_num_threads(v)  # type: ignore[arg-type]
                ours.append(gw.get_num_threads() == v)
            except RuntimeError:
                ours.append(False)
    finally:
        gw.set_num_threads(threads)
    assert ours == [True, True, False, False, False, False, False, False]
    if torch_python() is None:
        pytest.skip("the PyTorch side needs torch (GRADWIRE_TORCH_PYTHON); gradwire's side ran")
    theirs = torch_values(
        f"cases = {_CASES!r}\n"
        "start = torch.get_num_threads()\n"
        "taken = []\n"
        "for v in cases:\n"
        "    try:\n"
        "        torch.set_num_threads(v)\n"
        "        taken.append(torch.get_num_threads() == v)\n"
        "    except RuntimeError:\n"
        "        taken.append(False)\n"
        "torch.set_num_threads(start)\n"
        "out['taken'] = np.array(taken)\n"
    )["taken"].tolist()
    assert theirs == ours
