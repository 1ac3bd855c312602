"""What the integrity checks cost a callee: ``pickler.loads`` of typical call bodies, with the
checks (the opcode scan, and the checked unpickler where a payload needs it) and without them
(the C unpickler alone, as before issue 36), alternating in rounds in one process.

    python benchmarks/integrity_bench.py [--rounds 7] [--loops 2000]

Bodies: a noop call's (plain: never scanned), a call with a tensor argument (side table: scanned),
keyword arguments naming a function (scanned, C unpickler), a dataclass argument (scanned, then
the checked unpickler), and an object array of 64 items (the checked unpickler). Each cell is the
median over rounds of the mean microseconds per ``loads``; the ratio is with/without.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import gradwire as gw
import numpy as np
from gradwire._wire import integrity, pickler
from gradwire._wire.policy import CallablePolicy


@dataclasses.dataclass
class Config:
    lr: float
    layers: list[int]
    name: str


def _bodies() -> dict[str, tuple[bytes, Any]]:
    out: dict[str, tuple[bytes, Any]] = {}
    samples = {
        "noop (plain)": (None, (), {}),
        "tensor argument": (None, (gw.ones(4),), {}),
        "kwargs with a function": (None, (1,), {"fn": gw.relu, "dim": 0}),
        "dataclass argument": (None, (Config(0.1, [4, 4], "m"),), {}),
        "object array (64)": (None, (np.array([Config(0.1, [i], "x") for i in range(64)]),), {}),
    }
    for label, body in samples.items():
        ctx = pickler.EncodeContext()
        data = pickler.dumps(body, ctx)
        payload = pickler.pb.Payload()
        payload.tensors.extend(meta for meta, _ in ctx.tensors)
        arrays = [np.frombuffer(buf, dtype=np.uint8).copy() for _, buf in ctx.tensors]
        out[label] = (data, (payload, arrays))
    return out


def _time(fn: Callable[[], Any], loops: int) -> float:
    start = time.perf_counter()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - start) / loops * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--loops", type=int, default=2000)
    args = parser.parse_args()
    policy = CallablePolicy()
    bodies = _bodies()
    real_scan = integrity.scan
    results: dict[str, dict[str, list[float]]] = {k: {"with": [], "without": []} for k in bodies}
    for round_no in range(args.rounds):
        # alternate which goes first, so a warming cache or a busy moment hits both alike
        for mode in ("with", "without") if round_no % 2 == 0 else ("without", "with"):
            if mode == "without":  # as before: every payload to the C unpickler, no scan
                integrity.scan = lambda data, resolve=None: False  # type: ignore[assignment]
            try:
                for label, (data, (payload, arrays)) in bodies.items():

                    def once(
                        data: bytes = data, payload: Any = payload, arrays: Any = arrays
                    ) -> Any:
                        ctx = pickler.DecodeContext(
                            policy=policy, payload=payload, arrays=list(arrays), worker="w"
                        )
                        return pickler.loads(data, ctx)

                    once()
                    results[label][mode].append(_time(once, args.loops))
            finally:
                integrity.scan = real_scan  # type: ignore[assignment]
    print(f"{'body':28} {'with (us)':>10} {'without (us)':>13} {'ratio':>6}  checked path")
    for label, (data, _) in bodies.items():
        w = statistics.median(results[label]["with"])
        wo = statistics.median(results[label]["without"])
        resolve = lambda module, name: pickler.resolve_global(policy, module, name, "w")  # noqa: E731
        path = "no scan" if "plain" in label else ("yes" if integrity.scan(data, resolve) else "C")
        print(f"{label:28} {w:10.1f} {wo:13.1f} {w / wo:6.2f}  {path}")


if __name__ == "__main__":
    main()
