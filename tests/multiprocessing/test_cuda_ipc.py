"""CUDA tensor sharing: the GPU-free reference-count bookkeeping, and a GPU round trip."""

from __future__ import annotations

import gc
import os
import weakref
from multiprocessing.reduction import ForkingPickler

import gradwire.multiprocessing as gmp
import gwmp_workers as w
import pytest
from gradwire._backend import cupy_or_none
from gradwire._tensor import Tensor
from gradwire.multiprocessing import _cuda_refcount

TIMEOUT = 60


class Memory:
    """Stands in for a CuPy allocation: all the registry needs is something to hold."""


def test_slot_is_held_until_released_then_reused():
    reg = _cuda_refcount.ProducerRegistry(slots_per_block=4)
    other = reg.register(Memory())  # keeps the block in use
    mem = Memory()
    alive = weakref.ref(mem)
    ref = reg.register(mem)
    del mem
    assert reg.collect() == 0 and alive() is not None and reg.held() == 2
    _cuda_refcount.release_slot(ref)
    assert reg.collect() == 1 and reg.held() == 1
    gc.collect()
    assert alive() is None
    again = reg.register(Memory())
    assert (again.block, again.slot) == (ref.block, ref.slot)  # the freed slot is reused
    for r in (other, again):
        _cuda_refcount.release_slot(r)
    assert reg.collect() == 2


def test_an_idle_registry_gives_its_blocks_back() -> None:
    reg = _cuda_refcount.ProducerRegistry(slots_per_block=2)
    refs = [reg.register(Memory()) for _ in range(3)]
    paths = sorted({os.path.join("/dev/shm", r.block) for r in refs})
    assert len(paths) == 2 and all(os.path.exists(p) for p in paths)
    for r in refs:
        _cuda_refcount.release_slot(r)
    assert reg.collect() == 3 and reg.held() == 0
    assert not any(os.path.exists(p) for p in paths)  # nothing left in /dev/shm
    again = reg.register(Memory())  # the next send makes a new block
    assert os.path.exists(os.path.join("/dev/shm", again.block))
    _cuda_refcount.release_slot(again)
    assert reg.collect() == 1


def test_blocks_grow_when_slots_run_out():
    reg = _cuda_refcount.ProducerRegistry(slots_per_block=2)
    refs = [reg.register(Memory()) for _ in range(3)]
    assert len({r.block for r in refs}) == 2
    assert len({(r.block, r.slot) for r in refs}) == 3


def test_consumer_in_another_process_releases_slots():
    reg = _cuda_refcount.ProducerRegistry(slots_per_block=8)
    mems = [Memory() for _ in range(3)]
    refs = [reg.register(m) for m in mems]
    alive = [weakref.ref(m) for m in mems]
    del mems
    ctx = gmp.get_context("spawn")
    done = ctx.Queue()
    p = ctx.Process(target=w.release_slots, args=(refs, 2, done))
    p.start()
    assert done.get(timeout=TIMEOUT) is True
    p.join(TIMEOUT)
    assert reg.collect() == 2 and reg.held() == 1
    gc.collect()
    assert [a() is None for a in alive] == [True, True, False]


def test_release_after_the_producer_is_gone_is_harmless():
    ref = _cuda_refcount.SlotRef("gradwire_fs_gone_0000", 3, 1)
    _cuda_refcount.release_slot(ref)


def test_cuda_like_tensor_without_cupy_is_a_clear_error():
    if cupy_or_none() is not None:
        pytest.skip("a GPU is present")

    class FakeDeviceArray:
        __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False)}

    t = Tensor._wrap(FakeDeviceArray())
    with pytest.raises(RuntimeError, match="needs CuPy and a visible CUDA device"):
        ForkingPickler.dumps(t)


@pytest.mark.gpu
def test_cuda_tensor_round_trip_keeps_producer_memory_until_released():
    cp = cupy_or_none()
    if cp is None:
        pytest.skip("no CUDA device")
    t = Tensor._wrap(cp.ones(16, dtype=cp.float32))
    ctx = gmp.get_context("spawn")
    q, report = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=w.cuda_consumer, args=(q, report))
    p.start()
    q.put(t)
    assert report.get(timeout=TIMEOUT) == 16.0
    assert report.get(timeout=TIMEOUT) == "released"
    p.join(TIMEOUT)
    assert float(t._data.sum()) == 32.0  # the consumer wrote into the producer's memory
    assert _cuda_refcount.registry().collect() >= 1
