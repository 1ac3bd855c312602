"""One worker of ``test_netns.py``, run inside its own network namespace (not imported by pytest).

    python netns_scenario.py ROLE RANK MASTER LISTEN LINK OUT
ROLE "driver" (rank 0) trains with distributed autograd across the link, cuts its own end of the
veth pair (``ip link set LINK down``) mid-training, restores it, checks that everything healed and
writes what it saw as JSON to OUT; ROLE "peer" (rank 1) serves until the driver's graceful
shutdown. Both end with a graceful ``rpc.shutdown()``, whose completion is itself checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import gradwire as gw
import gradwire.distributed.autograd as dist_autograd
from gradwire.distributed import rpc

TIMEOUT = 2.0
#: The distinct ways a step failed, in order (reported when the link does not heal).
FAILURES: list[str] = []
CUT_SECONDS = 4.0


def forward(x: gw.Tensor, w: gw.Tensor) -> gw.Tensor:
    return (x * w).sum()


def num_contexts() -> int:
    return int(rpc.get_debug_info()["num_autograd_contexts"])


def lost_peers() -> list[str]:
    return list(rpc.get_debug_info().get("peers_lost", []))


def _outcome(what: str, run: Any) -> tuple[str, float]:
    """``("ok" or the exception's type, seconds)`` of ``run(note)``; a failure's phase (what
    ``note`` last said) and message go to FAILURES once."""
    started = time.monotonic()
    phase = [what]
    try:
        run(phase.append)
    except Exception as exc:  # noqa: BLE001 - the scenario reports what it saw
        why = f"{phase[-1]} after {time.monotonic() - started:.2f} s: {type(exc).__name__}: {exc}"
        if why not in FAILURES:
            FAILURES.append(why)
        return type(exc).__name__, time.monotonic() - started
    return "ok", time.monotonic() - started


def _step(w: gw.Tensor) -> tuple[str, float]:
    """One dist-autograd step across the link."""

    def run(note: Any) -> None:
        with dist_autograd.context() as ctx:
            x = gw.ones(1 << 16)  # 256 KiB: over the bulk lane's threshold
            loss = rpc.rpc_sync("peer", forward, (x, w), timeout=TIMEOUT)
            note("backward")
            dist_autograd.backward(ctx, [loss])
            dist_autograd.get_gradients(ctx)

    return _outcome("forward", run)


def _async_call() -> tuple[str, float]:
    """An rpc_async (the call pipe) of the same call, outside any context."""
    x, w = gw.ones(1 << 16), gw.ones(1 << 16)
    return _outcome(
        "rpc_async", lambda _note: rpc.rpc_async("peer", forward, (x, w), timeout=TIMEOUT).wait()
    )


def _until(check: Any, timeout: float) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"not within {timeout} s")
        time.sleep(0.1)
    return time.monotonic() - start


def driver(link: str) -> dict[str, Any]:
    w = gw.ones(1 << 16, requires_grad=True)
    before = [_step(w) for _ in range(3)]
    subprocess.run(["ip", "link", "set", link, "down"], check=True)
    cut = time.monotonic()
    during = []
    while time.monotonic() - cut < CUT_SECONDS:
        during.append(_step(w))
        during.append(_async_call())
    lost_during = lost_peers()
    subprocess.run(["ip", "link", "set", link, "up"], check=True)
    restored = time.monotonic()
    tries: list[tuple[str, float]] = []

    def healed() -> bool:
        tries.append(_step(w))
        return tries[-1][0] == "ok"

    try:
        healed_in = _until(healed, 30.0)
    except TimeoutError:
        raise TimeoutError(
            f"no step succeeded within 30 s of the restore ({len(tries)} tries); the steps "
            f"failed with: {FAILURES}"
        ) from None
    after = [_step(w) for _ in range(3)]
    back_in = _until(lambda: not lost_peers(), 30.0)
    peer_lost = rpc.rpc_sync("peer", lost_peers, timeout=10)
    released_in = _until(lambda: rpc.rpc_sync("peer", num_contexts, timeout=10) == 0, 30.0)
    return {
        "before": before,
        "during": during,
        "lost_during": lost_during,
        "healed_in_s": healed_in,
        "after": after,
        "lost_cleared_in_s": back_in,
        "peer_lost_after": peer_lost,
        "peer_contexts_released_in_s": released_in,
        "since_restore_s": time.monotonic() - restored,
        "failures": FAILURES,
    }


def main() -> None:
    role, rank, master, listen, link, out = sys.argv[1:7]
    options = rpc.GrpcRpcBackendOptions(
        init_method=f"tcp://{master}",
        listen_address=listen,
        token="netns-token",
        rpc_timeout=10.0,
        init_timeout=60.0,
        peer_lost_seconds=1.5,
        use_unix_socket=False,
        shm_transfer=False,
    )
    rpc.init_rpc(role, int(rank), 2, rpc_backend_options=options)
    result: dict[str, Any] = {}
    if role == "driver":
        result = driver(link)
    started = time.monotonic()
    rpc.shutdown()  # graceful: waits for the other worker
    result["shutdown_s"] = time.monotonic() - started
    with open(out + f".{role}", "w") as f:
        json.dump(result, f)
    os._exit(0)


if __name__ == "__main__":
    main()
