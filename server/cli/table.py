"""DebugInfo and ControlEvent as text for people (``gradwire inspect``)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

from gradwire._proto import worker_pb2 as pb

from .dot import AUTOGRAD_KEY, RREF_KEY

__all__ = ["render_worker", "render_cluster", "render_event", "debug_info_dict"]


def _columns(rows: Sequence[Sequence[Any]], indent: str = "  ") -> list[str]:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def _graph_summary(key: str, raw: str) -> str:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return "(not valid JSON)"
    if key == AUTOGRAD_KEY and isinstance(data, dict):
        contexts = data.get("contexts") or []
        nodes = sum(len(c.get("nodes") or []) for c in contexts if isinstance(c, dict))
        return f"{len(contexts)} context(s), {nodes} node(s); see --dot autograd"
    if key == RREF_KEY and isinstance(data, dict):
        parts = [f"{len(data.get(k) or [])} {k}" for k in ("owners", "users", "pending_children")]
        return ", ".join(parts) + "; see --dot rrefs"
    return raw


def render_worker(info: pb.DebugInfo) -> str:
    """A worker's state as a few aligned sections.

    Args:
        info: the answer of GetDebugInfo.

    Returns:
        Text ending with a newline.
    """
    extra = dict(info.extra)
    lines = [f"worker {info.worker} (id {info.worker_id})  state {info.state}"]
    if extra.get("session"):
        lines[0] += f"  session {extra.pop('session')}"
    lines += _columns(
        [
            ("calls", "served", info.calls_served, "in flight", info.calls_in_flight),
            ("", "failed", info.calls_failed, "own pending", extra.pop("calls_pending", "-")),
            ("rrefs", "owner rrefs", info.num_owner_rrefs, "forks", info.num_forks),
            (
                "",
                "pending users",
                info.num_pending_users,
                "pending children",
                info.num_pending_children,
            ),
            ("autograd", "contexts", info.num_autograd_contexts, "", ""),
        ]
    )
    if info.peers:
        lines.append("peers")
        lines += _columns(
            [("ID", "NAME", "ADDRESS", "CHANNEL")]
            + [(p.id, p.name, p.address, p.channel_state) for p in info.peers]
        )
    if extra:
        lines.append("extra")
        lines += _columns(
            [
                (k, _graph_summary(k, v) if k in (AUTOGRAD_KEY, RREF_KEY) else v)
                for k, v in sorted(extra.items())
            ]
        )
    return "\n".join(lines) + "\n"


def render_cluster(infos: Sequence[pb.DebugInfo | tuple[str, str]]) -> str:
    """One row per worker; an unreachable one as ``(name, error)``."""
    rows: list[Sequence[Any]] = [
        ("ID", "NAME", "STATE", "SERVED", "IN FLIGHT", "FAILED", "OWNER RREFS", "FORKS",
         "PENDING USERS", "PENDING CHILDREN", "CONTEXTS")
    ]  # fmt: skip
    for i in infos:
        if isinstance(i, tuple):
            rows.append(("-", i[0], f"UNREACHABLE: {i[1]}", *[""] * 8))
            continue
        rows.append(
            (i.worker_id, i.worker, i.state, i.calls_served, i.calls_in_flight, i.calls_failed,
             i.num_owner_rrefs, i.num_forks, i.num_pending_users, i.num_pending_children,
             i.num_autograd_contexts)
        )  # fmt: skip
    return "\n".join(_columns(rows, indent="")) + "\n"


def _gid(g: pb.GloballyUniqueId) -> str:
    return f"{g.created_on}:{g.local_id}"


def render_event(event: pb.ControlEvent) -> str:
    """One line per control message: time, direction, kind, peer and ids."""
    when = datetime.datetime.fromtimestamp(event.time or 0).strftime("%H:%M:%S.%f")[:-3]
    parts = [when, f"{event.direction or '?':<8}", f"{event.kind:<14}", f"peer={event.peer}"]
    if event.HasField("rref_id"):
        parts.append(f"rref={_gid(event.rref_id)}")
    if event.HasField("fork_id"):
        parts.append(f"fork={_gid(event.fork_id)}")
    if event.context_id:
        parts.append(f"context={event.context_id}")
    return "  ".join(parts)


def debug_info_dict(info: pb.DebugInfo) -> dict[str, Any]:
    """DebugInfo as plain JSON-able data (``inspect --json``); JSON extras decoded."""
    from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped,unused-ignore]

    out = MessageToDict(
        info, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    for key in (AUTOGRAD_KEY, RREF_KEY):
        raw = out.get("extra", {}).get(key)
        if raw:
            try:
                out["extra"][key] = json.loads(raw)
            except json.JSONDecodeError:
                pass
    return out
