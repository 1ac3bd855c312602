"""RRef protocol data <-> protobuf: ids, fork data and the control requests.

The state machine speaks frozen dataclasses (``rref_messages``, ``rref_ids``); the wire speaks
``gradwire.v1`` messages. Every conversion lives here.
"""

from __future__ import annotations

from typing import Any

from ..._proto import worker_pb2 as pb
from .ids import GloballyUniqueId
from .messages import ChildAck, ControlMessage, ForkRequest, RRefDelete, RRefForkData

__all__ = ["to_gid", "from_gid", "fork_data_to_pb", "fork_data_from_pb", "request_of", "REQUESTS"]

#: Control messages sent as requests: message class -> (Worker method, response type).
REQUESTS: dict[type, tuple[str, Any]] = {
    ForkRequest: ("ForkRequest", pb.ForkAccepted),
    ChildAck: ("ChildAck", pb.Ack),
    RRefDelete: ("RRefDelete", pb.Ack),
}


def to_gid(gid: GloballyUniqueId) -> pb.GloballyUniqueId:
    """A protocol id as the wire's GloballyUniqueId."""
    return pb.GloballyUniqueId(created_on=gid.created_on, local_id=gid.local_id)


def from_gid(gid: pb.GloballyUniqueId) -> GloballyUniqueId:
    """The wire's GloballyUniqueId as a protocol id."""
    return GloballyUniqueId.from_fields(gid.created_on, gid.local_id)


def fork_data_to_pb(data: RRefForkData) -> pb.RRefForkData:
    """An RRefForkData for a payload's side table."""
    return pb.RRefForkData(
        owner_id=data.owner_id,
        rref_id=to_gid(data.rref_id),
        fork_id=to_gid(data.fork_id),
        parent_id=data.parent_id,
        type_name=data.type_name,
    )


def fork_data_from_pb(msg: pb.RRefForkData) -> RRefForkData:
    """The RRefForkData a received payload carries."""
    return RRefForkData(
        int(msg.owner_id),
        from_gid(msg.rref_id),
        from_gid(msg.fork_id),
        int(msg.parent_id),
        msg.type_name,
    )


def request_of(msg: ControlMessage) -> Any:
    """The protobuf request of a ForkRequest, ChildAck or RRefDelete."""
    ids = {"rref_id": to_gid(msg.rref_id), "fork_id": to_gid(msg.fork_id)}
    if isinstance(msg, ForkRequest):
        return pb.ForkRequest(**ids, child_id=msg.child_id, parent_id=msg.parent_id)
    if isinstance(msg, ChildAck):
        return pb.ChildAck(**ids, child_id=msg.child_id)
    assert isinstance(msg, RRefDelete)
    return pb.RRefDelete(**ids, user_id=msg.user_id)
