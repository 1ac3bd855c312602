"""A small distributed-autograd job for gradwire run: real control messages to watch.

Each round opens a dist autograd context, multiplies a tensor on every other worker, runs the
distributed backward pass, checks the gradient, and leaves the context, which sends
ReleaseContext to the workers the context touched (visible with ``gradwire inspect --watch`` or
grpcurl's WatchControl on any of them).

    gradwire run deploy/jobs/autograd_rounds.py [ROUNDS] [PAUSE_SECONDS]
"""

from __future__ import annotations

import operator
import sys
import time

import gradwire as gw
from gradwire.distributed import autograd as dist_autograd
from gradwire.distributed import rpc

__all__ = ["main"]


def main() -> int:
    """Entry point for ``gradwire run``."""
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
    me = rpc.get_worker_info().name
    others = [p["name"] for p in rpc.get_debug_info()["peers"] if p["name"] != me]
    for i in range(rounds):
        x = gw.ones(3, requires_grad=True)
        with dist_autograd.context() as ctx:
            ys = [rpc.rpc_sync(name, operator.mul, (x, x)) for name in others]
            dist_autograd.backward(ctx, [sum(y.sum() for y in ys)])
            grad = dist_autograd.get_gradients(ctx)[x]
            expected = 2.0 * len(others)
            if not gw.allclose(grad, gw.full((3,), expected)):
                print(f"autograd_rounds: wrong gradient {grad} (expected {expected})", flush=True)
                return 1
        print(
            f"autograd_rounds: round {i + 1}: context {ctx} ok on {', '.join(others)}", flush=True
        )
        time.sleep(pause)
    return 0


if __name__ == "__main__":
    sys.exit(main())
