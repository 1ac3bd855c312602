"""Messages of the RRef protocol as plain frozen dataclasses (no protobuf).

Each class mirrors one proto message of ``gradwire.v1`` field for field, plus ``dest``: the worker
id the message must be delivered to. The state machine returns them; the agent maps them to the
proto messages and RPCs, and maps received protos back to them (with ``dest`` set to its own id)
before calling ``RRefProtocol.handle``.

==============  ==================  ==================================================
class           proto / RPC         direction
==============  ==================  ==================================================
ForkRequest     ForkRequest         child user -> owner (request, retried until answered)
ForkAccepted    ForkAccepted        owner -> child (the response of ForkRequest)
ChildAck        ChildAck            child -> parent (request, retried until Ack)
RRefDelete      RRefDelete          user -> owner (request, retried until Ack)
RemoteAck       RemoteAck           owner -> remote() caller (the response of RemoteCall)
==============  ==================  ==================================================

Every handler of these messages is idempotent, so an agent may retry any of them (and a network
may duplicate or reorder them) without changing the outcome.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from .ids import ForkId, RRefId

__all__ = [
    "MessageKind",
    "ControlMessage",
    "ForkRequest",
    "ForkAccepted",
    "ChildAck",
    "RRefDelete",
    "RemoteAck",
    "RRefForkData",
    "Effects",
]


class MessageKind(enum.Enum):
    """Kinds of control message; values are the names used by the WatchControl stream."""

    # A child that received a fork from a non-owner asks the owner to record it.
    FORK_REQUEST = "ForkRequest"
    # The owner recorded the fork (or, with known=False, no longer knows the RRef).
    FORK_ACCEPTED = "ForkAccepted"
    # The child was confirmed by the owner; its parent may release the fork it held (G2).
    CHILD_ACK = "ChildAck"
    # A confirmed user is gone (G1).
    RREF_DELETE = "RRefDelete"
    # The owner processed a remote() call and recorded the caller's fork.
    REMOTE_ACK = "RemoteAck"


@dataclass(frozen=True, slots=True)
class ControlMessage:
    """Fields every control message has: where it goes and which fork of which RRef."""

    kind: ClassVar[MessageKind]
    dest: int
    rref_id: RRefId
    fork_id: ForkId


@dataclass(frozen=True, slots=True)
class ForkRequest(ControlMessage):
    """Child ``child_id`` holds fork ``fork_id``; ``parent_id`` must get the ChildAck."""

    kind: ClassVar[MessageKind] = MessageKind.FORK_REQUEST
    child_id: int
    parent_id: int


@dataclass(frozen=True, slots=True)
class ForkAccepted(ControlMessage):
    """The owner's answer to a ForkRequest; ``known`` is False if the RRef is already gone."""

    kind: ClassVar[MessageKind] = MessageKind.FORK_ACCEPTED
    known: bool = True


@dataclass(frozen=True, slots=True)
class ChildAck(ControlMessage):
    """Child ``child_id`` was confirmed by the owner; the parent may drop its hold (G2)."""

    kind: ClassVar[MessageKind] = MessageKind.CHILD_ACK
    child_id: int


@dataclass(frozen=True, slots=True)
class RRefDelete(ControlMessage):
    """User ``user_id`` dropped fork ``fork_id`` (G1)."""

    kind: ClassVar[MessageKind] = MessageKind.RREF_DELETE
    user_id: int


@dataclass(frozen=True, slots=True)
class RemoteAck(ControlMessage):
    """The owner created (or is creating) the OwnerRRef of a remote() and knows its fork."""

    kind: ClassVar[MessageKind] = MessageKind.REMOTE_ACK


@dataclass(frozen=True, slots=True)
class RRefForkData:
    """A fork travelling inside a payload (proto ``RRefForkData``): the receiver becomes it."""

    owner_id: int
    rref_id: RRefId
    fork_id: ForkId
    parent_id: int
    type_name: str = ""


@dataclass(slots=True)
class Effects:
    """What one call into the state machine produced, collected under its lock.

    ``messages`` go back to the agent; ``callbacks`` and the ``deleted`` notifications run after
    the lock is released, so user callbacks can call back into the state machine.
    """

    messages: list[ControlMessage] = field(default_factory=list)
    callbacks: list[Callable[[], None]] = field(default_factory=list)
    deleted: list[RRefId] = field(default_factory=list)
