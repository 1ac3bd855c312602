"""Integrity over the wire: a peer holding the token sends hand-made pickles to a real worker.

The worker ("solo", this process) serves on loopback TCP; the attacker writes raw ``Call``
frames whose payload is one of ``tests/wire/crafted.py``'s pickles (no gradwire pickler writes
them). Under the default policy each is answered with a PolicyError naming its target, the
target is unchanged and the worker goes on serving; with ``trust_everything=True`` the same
frame changes the target (then the test puts it back).
"""

from __future__ import annotations

import operator
import pickle
from collections.abc import Iterator
from typing import Any

import gradwire.futures
import gradwire.nn.functional as F
import grpc
import pytest
from gradwire._proto import worker_pb2 as pb
from gradwire._wire.framing import decode_frame, encode_frame, split
from gradwire.distributed import rpc
from wire.crafted import build_on, call_body, op_global, reduce_of

from .conftest import solo_options

TOKEN = "test-token"


@pytest.fixture(scope="module", params=["default", "trusted"])
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    trusted = request.param == "trusted"
    rpc.init_rpc(
        "solo", 0, 1, solo_options(use_unix_socket=False, trust_everything=trusted, token=TOKEN)
    )
    try:
        yield request.param
    finally:
        rpc.shutdown(graceful=False)


def _send(data: bytes) -> pb.ReplyHeader:
    """One raw Call frame calling ``operator.truth`` with ``data`` as its pickled body."""
    first = pb.FrameHeader(
        call=pb.CallHeader(message_id=7, function="operator:truth", kind=pb.CALL_KIND_PYTHON)
    )
    first.payload.pickle_nbytes = len(data)
    frame = next(split(first, [data], 1 << 20))
    address = str(rpc.get_debug_info()["peers"][0]["address"])
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/gradwire.v1.Worker/Call", encode_frame, decode_frame)
        reply = call(frame, timeout=20, metadata=[("x-gradwire-token", TOKEN)])
    return reply.header.reply


CASES: list[tuple[str, Any, Any, str, Any, Any]] = [
    # (label, opcodes(proto), target, attribute, value the attack sets, reads the target)
    (
        "a gradwire nn method replaced",
        lambda p: build_on(op_global("gradwire.nn", "Linear", p), (None, {"forward": F.relu}), p),
        lambda: gradwire.nn.Linear,
        "forward",
        F.relu,
        lambda: gradwire.nn.Linear.__dict__["forward"],
    ),
    (
        "Future's method's defaults",
        lambda p: build_on(
            op_global("gradwire.futures", "Future.wait", p), (None, {"__defaults__": (0.0,)}), p
        ),
        lambda: gradwire.futures.Future.wait,
        "__defaults__",
        (0.0,),
        lambda: gradwire.futures.Future.wait.__defaults__,
    ),
    (
        "a class renamed",
        lambda p: build_on(
            op_global("gradwire.futures", "Future", p), (None, {"__module__": "__main__"}), p
        ),
        lambda: gradwire.futures.Future,
        "__module__",
        "__main__",
        lambda: gradwire.futures.Future.__module__,
    ),
    (
        "an operator of a standard-library class",
        lambda p: build_on(
            op_global("fractions", "Fraction", p), (None, {"__add__": operator.sub}), p
        ),
        lambda: __import__("fractions").Fraction,
        "__add__",
        operator.sub,
        lambda: __import__("fractions").Fraction.__dict__["__add__"],
    ),
    (
        "a cached numpy.finfo",
        lambda p: build_on(
            reduce_of("numpy", "finfo", (__import__("numpy").float32,), p), {"eps": 0.5}, p
        ),
        lambda: __import__("numpy").finfo(__import__("numpy").float32),
        "eps",
        0.5,
        lambda: __import__("numpy").finfo(__import__("numpy").float32).eps,
    ),
]


@pytest.mark.parametrize("proto", [0, 2, pickle.HIGHEST_PROTOCOL])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_a_peer_cannot_change_the_worker_over_grpc(mode: str, case: Any, proto: int) -> None:
    label, opcodes, target, attr, value, read = case
    obj = target()
    before = read()
    had = attr in vars(obj) if isinstance(obj, type) else True
    try:
        reply = _send(call_body(opcodes(proto), proto))
        if mode == "default":
            assert reply.HasField("error"), label
            assert reply.error.type_name.endswith("PolicyError"), reply.error
            assert "did not create" in reply.error.message, reply.error.message
            assert read() is before or read() == before, f"{label}: changed although refused"
        else:
            assert read() == value, f"{label}: the trusted worker did not change it"
    finally:
        if had:
            setattr(obj, attr, before)
        else:
            delattr(obj, attr)
    assert rpc.rpc_sync("solo", operator.add, (1, 2)) == 3  # still serving
