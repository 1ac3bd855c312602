"""Regressions the fuzzer found in the Assembler: sizes checked, exactly, before allocating."""

from __future__ import annotations

import tracemalloc

import pytest
from gradwire._proto import worker_pb2 as pb
from gradwire._wire.framing import Assembler, Frame
from gradwire.errors import MessageTooLargeError, SerializationError


def _first(**payload: object) -> pb.FrameHeader:
    return pb.FrameHeader(call=pb.CallHeader(function="m:f"), payload=pb.Payload(**payload))


def test_negative_pickle_size_is_refused() -> None:
    with pytest.raises(SerializationError, match="negative pickle size"):
        Assembler(1 << 20).feed(Frame(_first(pickle_nbytes=-1), [b""]))


def test_huge_pickle_size_is_refused_before_allocating() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(MessageTooLargeError):
            Assembler(1 << 20).feed(Frame(_first(pickle_nbytes=1 << 31), [b""]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize("shape", [[2**32, 2**32], [2**21, 2**21, 2**21], [2**63 - 1, 2]])
def test_shapes_whose_int64_product_wraps_are_refused(shape: list[int]) -> None:
    wrapped = 1
    for d in shape:
        wrapped = (wrapped * d + 2**63) % 2**64 - 2**63
    meta = pb.TensorMeta(dtype="int8", shape=shape, nbytes=wrapped)
    with pytest.raises(SerializationError, match="announced"):
        Assembler(1 << 20).feed(Frame(_first(tensors=[meta]), [b""]))


def test_too_many_dimensions_are_refused() -> None:
    meta = pb.TensorMeta(dtype="int8", shape=[1] * 65, nbytes=1)
    with pytest.raises(SerializationError, match="dimensions"):
        Assembler(1 << 20).feed(Frame(_first(tensors=[meta]), [b""]))
