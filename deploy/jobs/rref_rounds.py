"""A small RRef + distributed-autograd job for gradwire run: real RRef control messages to watch.

Needs three workers: this driver, an owner (the next worker) and a third one. Each round the
driver creates a value on the owner with ``remote()`` (an OwnerRRef there, a UserRRef here),
hands the RRef to the third worker, which fetches it (user to user: a ForkRequest to the owner,
then a ChildAck back), and runs a distributed-autograd round through the owner. The RRefs are
kept until the end, so ``gradwire inspect`` or grpcurl's GetDebugInfo on the owner shows them
and their forks while the job runs; dropping them sends RRefDelete.

    gradwire run deploy/jobs/rref_rounds.py [ROUNDS] [PAUSE_SECONDS]
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
    if len(others) < 2:
        print("rref_rounds: needs at least 3 workers (driver, owner, third)", flush=True)
        return 2
    owner, third = others[0], others[1]
    kept = []
    for i in range(rounds):
        rref = rpc.remote(owner, gw.full, ((3,), float(i + 1)))
        fetched = rpc.rpc_sync(third, rpc.RRef.to_here, (rref,))  # a fork: user to user
        kept.append(rref)
        x = gw.ones(3, requires_grad=True)
        with dist_autograd.context() as ctx:
            y = rpc.rpc_sync(owner, operator.mul, (x, fetched))
            dist_autograd.backward(ctx, [y.sum()])
            grad = dist_autograd.get_gradients(ctx)[x]
        if not gw.allclose(grad, gw.full((3,), float(i + 1))):
            print(f"rref_rounds: wrong gradient {grad} in round {i + 1}", flush=True)
            return 1
        print(
            f"rref_rounds: round {i + 1}: {rref} owned by {owner}, fetched by {third}, "
            f"context {ctx} ok",
            flush=True,
        )
        time.sleep(pause)
    kept.clear()  # the UserRRefs go: RRefDelete to the owner
    return 0


if __name__ == "__main__":
    sys.exit(main())
