"""Graceful shutdown and inspection of the RRef service.

Shutdown (``Agent.shutdown``): after the first barrier every user call has been answered, so no
new fork can arrive; ``drain`` then settles what is pending (confirmations, child acks), sends
the delete of every UserRRef still alive (``release_all_users``, including RRefs kept alive by
reference cycles: a full collection runs first) and waits until they are answered. After the
second barrier every worker did so, and ``check_leaks`` lists the OwnerRRefs whose forks are still
known (PyTorch's RRef leak).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from ...errors import RRefLeakError
from ..cluster.context import WorkerContext
from .ids import GloballyUniqueId
from .messages import ControlMessage
from .protocol import RRefProtocol


class ServiceView(Protocol):
    """What these functions read of ``service.RRefService`` (which imports this module)."""

    ctx: WorkerContext
    protocol: RRefProtocol

    def flush_releases(self, timeout: float) -> bool: ...

    def send(self, messages: Iterable[ControlMessage]) -> None: ...

    def pending_quiet(self, users_too: bool) -> bool: ...

    def wait_changed(self, seconds: float) -> None: ...

    def parent_of(self, fork_id: GloballyUniqueId) -> int | None: ...

    def forget_parents_except(self, live: set[GloballyUniqueId]) -> None: ...


__all__ = ["drain", "check_leaks", "fork_tree"]

log = logging.getLogger(__name__)


def drain(svc: ServiceView, deadline: float) -> bool:
    """Settle, delete every user, settle again (before ``deadline``, monotonic).

    Returns:
        True if nothing was left pending.
    """
    gc.collect()  # RRefs caught in reference cycles are released too
    svc.flush_releases(max(0.0, deadline - time.monotonic()))
    _settle(svc, deadline, users_too=True)
    svc.send(svc.protocol.release_all_users())
    drained = _settle(svc, deadline, users_too=False)
    if not drained:
        report = svc.protocol.pending()
        log.warning(
            "shutdown of %s: RRef messages still pending (users %s, children %s, deletes %s)",
            svc.ctx.name,
            report.pending_users,
            report.pending_children,
            report.deferred_deletes,
        )
    return drained


def _settle(svc: ServiceView, deadline: float, users_too: bool) -> bool:
    while not svc.pending_quiet(users_too):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        svc.wait_changed(min(left, 0.02))
    return True


def check_leaks(svc: ServiceView, mode: str | None = None) -> RRefLeakError | None:
    """Report OwnerRRefs that another worker still holds a fork of, as ``mode`` says.

    PyTorch's rule: a leak is a fork the owner still knows after every worker deleted its
    UserRRefs (a user kept alive past the drain). An OwnerRRef that only code on its owner
    still refers to is not one (its value simply goes away with the process).

    Args:
        mode: "error", "warn" or "off"; None: the ``rref_leak_check`` option.

    Returns:
        The error to raise when the check is strict ("error") and found leaks, else None.
    """
    mode = mode or svc.ctx.options.rref_leak_check
    if mode == "off":
        return None
    leaks = [leak for leak in svc.protocol.leaked_owner_rrefs() if leak.forks]
    if not leaks:
        return None
    # PyTorch's wording first (its tests match "Leaking RRef"), one line per fork.
    lines = tuple(
        f"Leaking RRef {leak.rref_id!r} with fork Id {fork!r}"
        for leak in leaks
        for fork in leak.forks
    )
    text = (
        "\n".join(lines) + f"\nworker {svc.ctx.name!r} shut down with {len(leaks)} OwnerRRef(s) "
        "still referenced by a UserRRef of another worker (a UserRRef alive past "
        "rpc.shutdown()'s deletion of every UserRRef)"
    )
    if mode == "error":
        return RRefLeakError(text, lines)
    log.warning("%s", text)
    return None


def fork_tree(svc: ServiceView) -> dict[str, Any]:
    """The ``rref_forks`` JSON of ``gradwire inspect`` (see ``gradwire.server.cli.dot``)."""
    owners, users, children, _ = svc.protocol.snapshot()
    name = svc.ctx.peer_name
    records = svc.protocol._users.users  # noqa: SLF001 - read-only, for the owner of each fork
    user_rows = []
    for fork_id, rref_id, state, dropped, _n in users:  # type: ignore[attr-defined]
        rec = records.get(fork_id)
        parent = svc.parent_of(fork_id)
        user_rows.append(
            {
                "rref_id": str(rref_id),
                "fork_id": str(fork_id),
                "owner": name(rec.owner_id) if rec is not None else "",
                "parent": name(parent) if parent is not None else "",
                "state": "dropped" if dropped else state,
            }
        )
    svc.forget_parents_except({u[0] for u in users})  # type: ignore[attr-defined]
    return {
        "owners": [
            {"rref_id": str(o[0]), "forks": [str(f) for f in o[2]], "local_refs": o[3]}
            for o in owners  # type: ignore[attr-defined]
        ],
        "users": user_rows,
        "pending_children": [
            {"rref_id": str(c.rref_id), "fork_id": str(c.fork_id), "child": name(c.child_id)}
            for c in children  # type: ignore[attr-defined]
        ],
    }
