"""Globally unique ids for the RRef protocol: RRefId and ForkId.

Both are a ``GloballyUniqueId`` {created_on, local_id}: the worker that minted the id and a
counter local to that worker. Uniqueness needs no coordination because no two workers share a
``created_on`` and a worker never reuses a counter value within one RPC session. The protocol
relies on two consequences:

- an id is never reused, so a tombstone for a deleted RRef or fork can never hide a newer one;
- ``rref_id.created_on`` tells the owner who minted an RRef: if it is the owner itself the RRef
  was created locally (``RRef(value)``, ``remote()`` to self, a return value), so an unknown id
  means "already deleted"; otherwise the RRef comes from a ``remote()`` whose RemoteCall may
  simply not have arrived yet.

This module is pure data: no protobuf import. ``to_fields`` / ``from_fields`` convert to and
from the plain ints of the proto message ``gradwire.v1.GloballyUniqueId``.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

__all__ = ["GloballyUniqueId", "RRefId", "ForkId", "IdGenerator"]


@dataclass(frozen=True, order=True, slots=True)
class GloballyUniqueId:
    """An id minted by worker ``created_on`` from its local counter ``local_id``."""

    created_on: int
    local_id: int

    def to_fields(self) -> tuple[int, int]:
        """Return ``(created_on, local_id)``, the fields of the proto message."""
        return (self.created_on, self.local_id)

    @classmethod
    def from_fields(cls, created_on: int, local_id: int) -> GloballyUniqueId:
        """Build an id from the proto message's two int fields."""
        return cls(int(created_on), int(local_id))

    def __str__(self) -> str:
        return f"{self.created_on}:{self.local_id}"


# Distinct names for readability; the protocol never compares an RRefId with a ForkId.
RRefId = GloballyUniqueId
ForkId = GloballyUniqueId


class IdGenerator:
    """Mints ids for one worker; thread-safe.

    Args:
        worker_id: the minting worker's id (its rank).

    Example:
        >>> gen = IdGenerator(3)
        >>> gen.next_id()
        GloballyUniqueId(created_on=3, local_id=0)
    """

    def __init__(self, worker_id: int) -> None:
        self._worker_id = worker_id
        # From 0, as PyTorch: its programs and tests read ids (``str(rref)``, error messages).
        self._counter = itertools.count(0)
        self._lock = threading.Lock()

    def next_id(self) -> GloballyUniqueId:
        """Return a fresh id never returned before by this generator."""
        with self._lock:
            return GloballyUniqueId(self._worker_id, next(self._counter))
