"""What producers put in Agent.debug_info() reaches DebugInfo as the inspect contract says."""

from __future__ import annotations

import json

from gradwire.server.servicer import DEBUG_COUNTERS, debug_info_message

BASE = {
    "worker": "w",
    "worker_id": 1,
    "state": "RUNNING",
    "calls_served": 3,
    "calls_in_flight": 0,
    "calls_failed": 1,
    "peers": [{"name": "w", "id": 1, "address": "a:1", "channel_state": "READY"}],
}


def test_counters_fill_their_fields_and_structures_travel_as_json() -> None:
    graph = {"contexts": [{"context_id": 5, "nodes": [], "edges": []}]}
    msg = debug_info_message(
        {
            **BASE,
            "num_owner_rrefs": 2,
            "num_autograd_contexts": 4,
            "autograd_graph": graph,
            "session": "s",
        }
    )
    assert msg.num_owner_rrefs == 2 and msg.num_autograd_contexts == 4 and msg.num_forks == 0
    assert json.loads(msg.extra["autograd_graph"]) == graph
    assert msg.extra["session"] == "s"
    assert not set(DEBUG_COUNTERS) & set(msg.extra)
