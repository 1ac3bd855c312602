"""A job for ``gradwire run`` that stands in for the RRef and dist-autograd producers.

It adds the documented inspect contract to this worker's ``Agent.debug_info()`` (counters and
the ``autograd_graph`` / ``rref_forks`` JSON), emits a ControlEvent every 50 ms through the real
``emit_control_event`` -> WatchControl path, prints READY, and returns once the file named by
its first argument exists (or after 60 s).
"""

from __future__ import annotations

import os
import sys
import time

from gradwire._proto import worker_pb2 as pb
from gradwire._runtime import agent as _agent

__all__ = ["main", "AUTOGRAD", "RREFS"]

AUTOGRAD = {
    "contexts": [
        {
            "context_id": 7,
            "nodes": [
                {
                    "id": "r1",
                    "name": "RecvRpcBackward",
                    "kind": "recv",
                    "message_id": 11,
                    "peer": "w1",
                },
                {"id": "m1", "name": "MulBackward", "kind": "op"},
                {"id": "a1", "name": "AccumulateGrad", "kind": "leaf"},
            ],
            "edges": [["r1", "m1"], ["m1", "a1"]],
        }
    ]
}
RREFS = {
    "owners": [{"rref_id": "0:1", "type": "Tensor", "forks": ["1:5"]}],
    "users": [],
    "pending_children": [],
}


def main() -> int:
    """Serve the contract until the stop file appears."""
    agent = _agent.current()
    plain = agent.debug_info

    def debug_info() -> dict[str, object]:
        return {
            **plain(),
            "num_owner_rrefs": 1,
            "num_forks": 1,
            "autograd_graph": AUTOGRAD,
            "rref_forks": RREFS,
        }

    agent.debug_info = debug_info  # type: ignore[method-assign]
    stop = sys.argv[1]
    print("READY", flush=True)
    deadline = time.monotonic() + 60
    n = 0
    while not os.path.exists(stop) and time.monotonic() < deadline:
        n += 1
        kind, direction = (("ForkRequest", "received"), ("ChildAck", "sent"))[n % 2]
        agent.emit_control_event(
            pb.ControlEvent(
                kind=kind,
                direction=direction,
                peer="w1",
                rref_id=pb.GloballyUniqueId(created_on=0, local_id=1),
                fork_id=pb.GloballyUniqueId(created_on=1, local_id=n),
                time=time.time(),
            )
        )
        time.sleep(0.05)
    return 0
