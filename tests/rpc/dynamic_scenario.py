"""One join/leave scenario of a dynamic group, run on gradwire or on PyTorch (the same code):
``python dynamic_scenario.py gradwire|torch PORT`` prints the outcomes as JSON.

PyTorch is only imported by the interpreter that runs its side (GRADWIRE_TORCH_PYTHON); the
test compares the outcomes (test_dynamic_membership.py).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import operator
import os
import queue
import sys
import time
import traceback
from typing import Any

STEPS = ("joined", "checked", "b-left", "dup-tried")


def _rpc(framework: str) -> Any:
    if framework == "torch":
        import torch.distributed.rpc as rpc  # type: ignore[import-not-found]

        return rpc
    from gradwire.distributed import rpc

    return rpc


def _options(rpc: Any, framework: str) -> Any:
    if framework == "torch":
        return rpc.TensorPipeRpcBackendOptions(rpc_timeout=20, init_method="env://")
    return rpc.GrpcRpcBackendOptions(rpc_timeout=20, init_timeout=20, init_method="env://")


def _outcome(fn: Any) -> list[Any]:
    """["ok", value] or the class of the error as PyTorch programs catch it."""
    try:
        return ["ok", fn()]
    except RuntimeError:
        return ["RuntimeError", None]
    except Exception as exc:  # noqa: BLE001 - recorded
        return [type(exc).__name__, None]


def _member(framework: str, label: str, name: str, rank: int, out: Any, ev: dict[str, Any]) -> None:
    os.environ.pop("WORLD_SIZE", None)

    def post(what: str, value: Any) -> None:
        out.put((label, what, value))

    try:
        rpc = _rpc(framework)
        joined = _outcome(
            lambda: rpc.init_rpc(name, rank=rank, rpc_backend_options=_options(rpc, framework))
        )
        post("init", joined)
        if joined[0] != "ok":
            return
        ev[f"{label}-joined"].set()
        infos = lambda: sorted(  # noqa: E731
            w.name for w in rpc.api._get_current_rpc_agent().get_worker_infos()
        )
        if label == "h":
            ev["b-joined"].wait(60)
            post("members_after_joins", infos())
            ev["b-left"].wait(60)
            post("members_after_leave", infos())
            post("call_departed", _outcome(lambda: rpc.rpc_sync("b", operator.add, (1, 2))))
        elif label == "a":
            ev["b-joined"].wait(60)
            post("info_of_later_joiner", _outcome(lambda: rpc.get_worker_info("b").id))
            post("call_later_joiner", _outcome(lambda: rpc.rpc_sync("b", operator.add, (1, 2))))
        elif label == "b":
            post("call_host", _outcome(lambda: rpc.rpc_sync("h", operator.add, (2, 2))))
            ev["go-b-leave"].wait(60)
            post("shutdown", _outcome(rpc.shutdown))
            ev["b-left"].set()
            return
        ev["dup-tried"].wait(60)
        rpc.shutdown()  # not compared: PyTorch may wait here for the refused joiner's lock
    except BaseException:  # noqa: BLE001 - reported
        post("crash", traceback.format_exc())


def main(framework: str, port: str) -> dict[str, Any]:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
    os.environ.pop("WORLD_SIZE", None)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ev = {
        k: ctx.Event()
        for k in ("h-joined", "a-joined", "b-joined", "go-b-leave", "b-left", "dup-tried")
    }
    procs = []
    results: dict[str, Any] = {}

    def start(label: str, name: str, rank: int) -> None:
        p = ctx.Process(target=_member, args=(framework, label, name, rank, out, ev), daemon=True)
        p.start()
        procs.append(p)

    def collect(keys: set[str], seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while not keys <= set(results) and time.monotonic() < deadline:
            try:
                label, what, value = out.get(timeout=0.5)
            except queue.Empty:
                continue
            results[f"{label}.{what}"] = value

    start("h", "h", 0)
    ev["h-joined"].wait(60)
    start("a", "a", 1)
    ev["a-joined"].wait(60)
    start("b", "b", 2)
    collect({"h.members_after_joins", "a.call_later_joiner", "b.call_host"})
    ev["go-b-leave"].set()
    collect({"b.shutdown", "h.call_departed"})
    start("dup", "a", 3)  # a second worker named "a"
    collect({"dup.init"})
    ev["dup-tried"].set()
    deadline = time.monotonic() + 5  # their last shutdown is not compared
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
    return results


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2]), sort_keys=True))
