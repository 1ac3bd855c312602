"""A one-worker gradwire cluster in its own process, the target of the fuzzer.

Run as a script: ``python fuzz_target.py PORT TOKEN MAX_MESSAGE_BYTES``. It prints one line
``READY <address> <pid>`` once serving, then serves until its stdin closes, then shuts down
and prints ``BYE <calls_served>``. Its functions (``echo``, ``bump``) are what valid calls run.
"""

from __future__ import annotations

import logging
import sys
import threading

__all__ = ["echo", "bump", "main"]

_bumps = 0
_lock = threading.Lock()


def echo(x: object) -> object:
    """Return the argument (valid calls interleaved with the hostile ones)."""
    return x


def bump() -> int:
    """A non-idempotent counter: how many times it ran."""
    global _bumps
    with _lock:
        _bumps += 1
        return _bumps


def main(argv: list[str]) -> int:
    port, token, max_bytes = int(argv[0]), argv[1], int(argv[2])
    logging.basicConfig(level=logging.CRITICAL)
    from gradwire.distributed import rpc

    options = rpc.GrpcRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}",
        token=token,
        rpc_timeout=10.0,
        init_timeout=30.0,
        max_message_bytes=max_bytes,
        use_unix_socket=True,  # for the fast lane; the TCP address is fuzzed as well
        shm_transfer=False,
    )
    rpc.init_rpc("target", 0, 1, options)
    from gradwire._runtime.agent import current

    agent = current()
    print(f"READY {agent.address} {agent.local_call_address}", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    served = rpc.get_debug_info()["calls_served"]
    rpc.shutdown(graceful=False)
    print(f"BYE {served}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
