"""Sparse tensors between processes with gradwire.multiprocessing: the indices and values move
to shared memory (both sharing strategies), so a write on one side is seen on the other."""

from __future__ import annotations

from typing import Any

import gradwire as gw
import gradwire.multiprocessing as mp
import numpy as np
import pytest


def _child(q: Any, r: Any) -> None:
    s = q.get()
    r.put((s.is_sparse, s.is_shared(), s.is_coalesced(), s.to_dense().numpy().tolist()))
    s._values().mul_(10)  # in place, in the shared values
    r.put("written")


@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
def test_a_sparse_tensor_is_shared_with_a_child_process(strategy: str) -> None:
    before = mp.get_sharing_strategy()
    mp.set_sharing_strategy(strategy)
    try:
        ctx = mp.get_context("spawn")
        q, r = ctx.Queue(), ctx.Queue()
        s = gw.sparse_coo_tensor([[0, 2]], [1.0, 5.0], (4,)).coalesce()
        p = ctx.Process(target=_child, args=(q, r))
        p.start()
        q.put(s)
        assert r.get(timeout=60) == (True, True, True, [1.0, 0.0, 5.0, 0.0])
        assert r.get(timeout=60) == "written"
        p.join(timeout=60)
        assert p.exitcode == 0
    finally:
        mp.set_sharing_strategy(before)
    assert s.is_shared()
    np.testing.assert_array_equal(s.to_dense().numpy(), [10.0, 0.0, 50.0, 0.0])


def test_share_memory_moves_both_parts() -> None:
    s = gw.sparse_coo_tensor([[1, 3]], [[1.0, 2.0], [3.0, 4.0]], (5, 2))
    assert not s.is_shared()
    dense = s.to_dense().numpy().copy()
    assert s.share_memory_() is s and s.is_shared()
    np.testing.assert_array_equal(s.to_dense().numpy(), dense)
