"""Drive a fuzz target: start it, send raw requests, judge the answers, read its memory.

The verdicts: a hostile request must be answered (never a crash, never UNKNOWN / INTERNAL /
UNAVAILABLE) with OK, or with a refusal code and a non-empty message; a user-level refusal of
``Call`` / ``PythonCall`` travels inside the reply frame as a RemoteException with a message.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from gradwire._wire import calls
from gradwire._wire.framing import Assembler, decode_frame, unpack_batch
from gradwire._wire.policy import CallablePolicy
from gradwire.distributed.rpc._testing import free_port

from .fuzzgen import GENERATORS, METHODS, Case, valid_echo_frame

__all__ = ["Target", "start_target", "fuzz_method", "Verdict", "REFUSALS", "rss_kib"]

SERVICE = "/gradwire.v1.Worker/"
#: Codes that are a clear refusal of a bad request.
REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
#: Methods that legitimately wait (a stream of events, a barrier, a value that may come later).
WAITING = {"WatchControl", "Barrier", "FetchRRef", "Fetch"}
_STREAM_IN = {"PythonCall", "CallStream", "CallPipe", "RemoteCall", "PropagateGradients"}
#: Methods whose replies are call replies (a ReplyHeader, maybe carrying an error).
_CALLS = ("Call", "CallStream", "CallPipe", "PythonCall")
_STREAM_OUT = {"PythonCall", "CallStream", "CallPipe", "FetchReply", "FetchRRef", "WatchControl"}


@dataclasses.dataclass
class Target:
    """A fuzz target process and a channel to it."""

    proc: subprocess.Popen[str]
    address: str
    token: str
    max_bytes: int
    channel: grpc.Channel
    #: The fast lane's address and a channel to it (Call and Gradients only).
    lane: str = ""
    lane_channel: grpc.Channel | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 30.0) -> str:
        """Close its stdin (it shuts down) and return what it printed last."""
        self.channel.close()
        if self.lane_channel is not None:
            self.lane_channel.close()
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        assert self.proc.stdout is not None
        return self.proc.stdout.read()


def start_target(max_bytes: int = 16 << 20, timeout: float = 60.0) -> Target:
    """Start ``fuzz_target.py`` and wait (at most ``timeout``) until it serves."""
    token = os.urandom(8).hex()
    script = Path(__file__).with_name("fuzz_target.py")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(free_port()), token, str(max_bytes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    if not line or not line[0].startswith("READY"):
        proc.kill()
        raise RuntimeError(f"fuzz target did not start: {line!r}")
    address, lane = line[0].split()[1:3]
    opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.enable_http_proxy", 0)]
    channel = grpc.insecure_channel(address, options=opts)
    return Target(
        proc, address, token, max_bytes, channel, lane, grpc.insecure_channel(lane, options=opts)
    )


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak resident set) of ``pid``, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def invoke(
    channel: grpc.Channel, method: str, messages: list[bytes], metadata: Any, timeout: float
) -> tuple[grpc.StatusCode, str, list[bytes]]:
    """Send raw ``messages`` to ``method``; (code, details, raw responses)."""
    path = SERVICE + method
    s_in, s_out = method in _STREAM_IN, method in _STREAM_OUT
    try:
        if s_in and s_out:
            out = list(
                channel.stream_stream(path)(iter(messages), timeout=timeout, metadata=metadata)
            )
        elif s_in:
            out = [channel.stream_unary(path)(iter(messages), timeout=timeout, metadata=metadata)]
        elif s_out:
            out = list(channel.unary_stream(path)(messages[0], timeout=timeout, metadata=metadata))
        else:
            out = [channel.unary_unary(path)(messages[0], timeout=timeout, metadata=metadata)]
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", []
    return grpc.StatusCode.OK, "", out


def echo_roundtrip(target: Target, value: np.ndarray) -> np.ndarray:
    """A valid call of the target's ``echo``; returns what came back (raises on any error)."""
    md = (("x-gradwire-token", target.token), ("x-gradwire-caller", "0"))
    code, details, out = invoke(target.channel, "Call", [valid_echo_frame(value)], md, 10.0)
    assert code == grpc.StatusCode.OK, f"valid call refused: {code} {details}"
    asm = Assembler(1 << 30)
    assert asm.feed(decode_frame(out[0]))
    assert asm.message is not None
    reply = asm.message.header.reply
    assert not reply.HasField("error"), reply.error.message
    body, _ = calls.decode_body(asm.message, {"policy": CallablePolicy()})
    return body


@dataclasses.dataclass
class Verdict:
    """What one method's fuzzing saw."""

    method: str
    cases: int = 0
    outcomes: Counter[str] = dataclasses.field(default_factory=Counter)
    bad: list[str] = dataclasses.field(default_factory=list)


def _judge(method: str, case: Case, code: grpc.StatusCode, details: str, out: list[bytes]) -> str:
    """'' when the answer is acceptable, else why not."""
    if code == grpc.StatusCode.OK:
        if method == "CallPipe":  # batches of replies, one per call
            try:
                out = [bytes(f) for batch in out for f in unpack_batch(batch)]
            except Exception as exc:  # noqa: BLE001 - a batch we cannot split is a bug
                return f"unsplittable reply batch: {exc}"
        if method in _CALLS:
            for raw in out if method in ("CallStream", "CallPipe") else out[:1]:
                try:
                    reply = decode_frame(raw).header.reply
                except Exception as exc:  # noqa: BLE001 - a reply we cannot parse is a bug
                    return f"unparsable reply: {exc}"
                if reply.HasField("error") and not reply.error.message:
                    return f"error reply without a message ({reply.error.type_name})"
        return ""
    if code in REFUSALS:
        return "" if details.strip() else f"{code.name} without a message"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and (
        method in WAITING or "fetch_request" in case.label
    ):  # a fetch may come before the RemoteCall that creates its RRef: it waits, as Fetch does
        return ""
    return f"{code.name}: {details}"


def fuzz_method(
    target: Target, method: str, seconds: float, seed: int, lane: bool = False
) -> Verdict:
    """Fuzz ``method`` for ``seconds`` (on the fast lane when ``lane``); a valid echo every 25
    cases must still work."""
    channel = target.lane_channel if lane else target.channel
    assert channel is not None, "the target has no fast lane"
    rng = random.Random(seed)
    make = GENERATORS[method]
    verdict = Verdict(method)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        case = make(rng)
        # A fetch of an RRef that does not exist waits for it (as it would for a RemoteCall
        # still on its way): its answer is the deadline, so the deadline is short.
        waits = method in WAITING or "fetch_request" in case.label
        timeout = 0.5 if waits else 10.0
        caller = rng.choice(["0", "0", "0", "-7", "999", "x", str(2**70)])
        md = (("x-gradwire-token", target.token), ("x-gradwire-caller", caller))
        code, details, out = invoke(channel, method, case.messages, md, timeout)
        verdict.cases += 1
        outcome = code.name
        if code == grpc.StatusCode.OK and method in _CALLS and out:
            try:
                first = unpack_batch(out[0])[0] if method == "CallPipe" else out[0]
                reply = decode_frame(first).header.reply  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - _judge reports it
                outcome = "unparsable"
            else:
                outcome = (
                    "reply-error:" + reply.error.type_name if reply.HasField("error") else "OK"
                )
        verdict.outcomes[outcome] += 1
        why = _judge(method, case, code, details, out)
        if why:
            head = b"".join(case.messages)[:160].hex()
            verdict.bad.append(f"{method} [{case.label}] caller={caller}: {why} (bytes {head})")
        if verdict.cases % 25 == 0:
            value = np.arange(rng.randint(1, 100), dtype="float64")
            np.testing.assert_array_equal(echo_roundtrip(target, value), value)
    return verdict


def methods() -> list[str]:
    """Every Worker method the fuzzer knows."""
    return list(METHODS)


__all__ += ["invoke", "echo_roundtrip", "methods"]
