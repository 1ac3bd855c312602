"""``examples/sparse_embedding_ps.py`` on a small table: it exits 0 (the loss fell, the table's
gradients were sparse, sampled rows no trainer looked up did not move), and the gradient bytes it
prints per step are far below a dense gradient of the table. The same program on PyTorch where
it imports, to the same figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from torch_oracle import require_torch_python

PROGRAM = Path(__file__).resolve().parents[2] / "examples" / "sparse_embedding_ps.py"
ROWS, DIM, TRAINERS = 100_000, 64, 2
DENSE = ROWS * DIM * 4
TABLE_GRAD = re.compile(r"^(trainer\d+): table gradient .*= ([\d,]+) B; dense: ([\d,]+) B", re.M)
SENT = re.compile(r"^(trainer\d+): sent to the ps per step: ([\d,]+) B", re.M)


def _run(python: str, env: dict[str, str], *flags: str) -> str:
    done = subprocess.run(
        [python, str(PROGRAM), "--rows", str(ROWS), "--dim", str(DIM), "--steps", "8", *flags],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    return done.stdout


def _figures(out: str) -> dict[str, tuple[int, int]]:
    """Per trainer: (the table gradient's bytes, the bytes sent to the ps) per step."""
    grads = {
        name: (int(total.replace(",", "")), int(dense.replace(",", "")))
        for name, total, dense in TABLE_GRAD.findall(out)
    }
    sent = {name: int(b.replace(",", "")) for name, b in SENT.findall(out)}
    assert sorted(grads) == sorted(sent) == [f"trainer{r}" for r in range(1, TRAINERS + 1)], out
    assert all(dense == DENSE for _, dense in grads.values()), out
    return {name: (grads[name][0], sent[name]) for name in grads}


def _check(out: str) -> dict[str, tuple[int, int]]:
    assert "never looked up: 0 changed (ok)" in out, out
    assert out.rstrip().endswith("ok"), out
    figures = _figures(out)
    for table_grad, sent in figures.values():
        # 5,120 rows of 64 float32 and their int64 indices; the (256, 64) gradient of the bags
        assert table_grad == 256 * 20 * (DIM * 4 + 8) and table_grad < DENSE / 10, out
        assert sent == 256 * DIM * 4 and sent < DENSE / 100, out
    return figures


@pytest.mark.parametrize("flags", [(), ("--tcp",)], ids=["defaults", "tcp"])
def test_the_example_trains_with_sparse_table_gradients(flags: tuple[str, ...]) -> None:
    out = _run(sys.executable, {}, *flags)
    _check(out)
    # gradwire's transport counters: the bags' 64 KiB gradient rode in the gradients frame
    assert out.count("by shared memory or the bulk lane: 0 B (transport counters)") == TRAINERS


def test_the_same_program_on_pytorch_gives_the_same_figures() -> None:
    python = require_torch_python()
    assert _check(_run(python, {"SPARSE_PS_USE_TORCH": "1"})) == _check(_run(sys.executable, {}))
