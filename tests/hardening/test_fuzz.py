"""Fuzzing every Worker RPC: random and mutated requests against a real worker process.

Default run: ``GRADWIRE_FUZZ_SECONDS`` (2) seconds per method. Long run (``-m slow``):
``GRADWIRE_FUZZ_SLOW_SECONDS`` (60) per method. ``GRADWIRE_FUZZ_SEED`` fixes the seed (the seed
of a failing run is in the assertion message).

What must hold: the worker never crashes; every hostile request is answered with OK, a clear
refusal (INVALID_ARGUMENT, FAILED_PRECONDITION, NOT_FOUND, RESOURCE_EXHAUSTED, UNAUTHENTICATED)
with a message, or a RemoteException in the reply frame, never UNKNOWN / INTERNAL / UNAVAILABLE;
valid calls keep working in between; its peak resident memory stays within a few
``max_message_bytes`` of where it started; and without the token no decoder is reached.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from gradwire._wire import framing
from gradwire.distributed import rpc
from gradwire.distributed.rpc._testing import free_port
from gradwire.server.fast_lane import FAST_LANE_METHODS

from .fuzz_client import Target, echo_roundtrip, fuzz_method, invoke, methods, rss_kib, start_target
from .fuzzgen import GENERATORS

MAX_BYTES = 16 << 20
SEED = int(os.environ.get("GRADWIRE_FUZZ_SEED", random.randrange(1 << 30)))


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    t = start_target(MAX_BYTES)
    for _ in range(20):  # warm up: imports, pools, the first channel
        echo_roundtrip(t, np.arange(100.0))
    t.baseline = rss_kib(t.pid)  # type: ignore[attr-defined]
    yield t
    if t.proc.poll() is None:
        t.stop()


def _check(target: Target, method: str, seconds: float, lane: bool = False) -> None:
    verdict = fuzz_method(target, method, seconds, SEED, lane)
    assert target.proc.poll() is None, (
        f"fuzz target died (exit {target.proc.returncode}), seed {SEED}"
    )
    assert not verdict.bad, f"seed {SEED}, {verdict.cases} cases:\n" + "\n".join(verdict.bad[:10])
    assert verdict.cases > 0
    # Peak resident memory: hostile sizes must be refused before anything is allocated.
    peak = rss_kib(target.pid)["VmHWM"]
    budget = target.baseline["VmRSS"] + 4 * MAX_BYTES // 1024 + 128 * 1024  # type: ignore[attr-defined]
    assert peak < budget, (
        f"peak RSS {peak} KiB over budget {budget} KiB after {method}, seed {SEED}"
    )
    print(f"{method}: {verdict.cases} cases {dict(verdict.outcomes)} peak {peak} KiB")


def test_every_worker_method_is_fuzzed() -> None:
    from gradwire._proto import worker_pb2

    service = worker_pb2.DESCRIPTOR.services_by_name["Worker"]
    assert {m.name for m in service.methods} == set(methods())


@pytest.mark.parametrize("method", methods())
def test_fuzz_method(target: Target, method: str) -> None:
    _check(target, method, float(os.environ.get("GRADWIRE_FUZZ_SECONDS", "2")))


@pytest.mark.parametrize("method", FAST_LANE_METHODS)
def test_fuzz_fast_lane(target: Target, method: str) -> None:
    """The same cases on the fast lane (the synchronous server same-host peers use)."""
    _check(target, method, float(os.environ.get("GRADWIRE_FUZZ_SECONDS", "2")), lane=True)


SLOW_SECONDS = float(os.environ.get("GRADWIRE_FUZZ_SLOW_SECONDS", "60"))


@pytest.mark.slow
@pytest.mark.timeout(SLOW_SECONDS + 300)
@pytest.mark.parametrize("method", methods())
def test_fuzz_method_long(target: Target, method: str) -> None:
    _check(target, method, SLOW_SECONDS)


@pytest.mark.slow
@pytest.mark.timeout(SLOW_SECONDS + 300)
@pytest.mark.parametrize("method", FAST_LANE_METHODS)
def test_fuzz_fast_lane_long(target: Target, method: str) -> None:
    _check(target, method, SLOW_SECONDS, lane=True)


def test_target_still_serves_and_shuts_down(target: Target) -> None:
    value = np.arange(1000, dtype="int64")
    np.testing.assert_array_equal(echo_roundtrip(target, value), value)
    out = target.stop()
    assert target.proc.returncode == 0, out
    assert "BYE" in out


# -- without the token no decoder is reached --------------------------------------------------


class _Counting:
    """Stands for a protobuf class in the servicer module: counts FromString, delegates the rest."""

    def __init__(self, cls: Any, counts: dict[str, int]) -> None:
        self._cls, self._counts = cls, counts

    def FromString(self, data: bytes) -> Any:  # noqa: N802 - the protobuf name
        self._counts["proto"] += 1
        return self._cls.FromString(data)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._cls(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cls, name)


class _CountingModule:
    def __init__(self, module: Any, counts: dict[str, int]) -> None:
        self._module, self._counts = module, counts

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if isinstance(value, type) and hasattr(value, "FromString"):
            return _Counting(value, self._counts)
        return value


def test_no_decoder_is_reached_without_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-process worker whose every request decoder counts its calls."""
    from gradwire.server import servicer

    counts = {"frame": 0, "proto": 0, "assembler": 0}
    real_decode, real_feed = framing.decode_frame, framing.Assembler.feed

    def decode(data: bytes) -> Any:
        counts["frame"] += 1
        return real_decode(data)

    def feed(self: Any, frame: Any) -> bool:
        counts["assembler"] += 1
        return real_feed(self, frame)

    monkeypatch.setattr(servicer, "decode_frame", decode)
    monkeypatch.setattr(servicer, "pb", _CountingModule(servicer.pb, counts))
    monkeypatch.setattr(framing.Assembler, "feed", feed)
    options = rpc.GrpcRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{free_port()}",
        token="the-token",
        init_timeout=20,
        rpc_timeout=10,
        use_unix_socket=False,
    )
    rpc.init_rpc("guarded", 0, 1, options)
    try:
        address = rpc.get_debug_info()["peers"][0]["address"]
        rng = random.Random(SEED)
        with grpc.insecure_channel(address) as channel:
            for _ in range(3):
                for method in methods():
                    case = GENERATORS[method](rng)
                    for md in ((), (("x-gradwire-token", "wrong"),)):
                        code, details, _ = invoke(channel, method, case.messages, md, 5.0)
                        assert code == grpc.StatusCode.UNAUTHENTICATED, (method, code, details)
                        assert "cluster token" in details
            assert counts == {"frame": 0, "proto": 0, "assembler": 0}, counts
            # The same counters do move once the token is right (the instrumentation works).
            md = (("x-gradwire-token", "the-token"),)
            invoke(channel, "GetDebugInfo", [b""], md, 5.0)
            invoke(channel, "Call", [b"\x00\x00\x00\x00"], md, 5.0)
        assert counts["proto"] >= 1 and counts["frame"] >= 1, counts
    finally:
        rpc.shutdown(graceful=False)
