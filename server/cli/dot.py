"""Graphviz DOT of the distributed autograd graph and of RRef fork trees, from DebugInfo.extra.

The JSON contract (each worker describes only what it holds; ``gradwire inspect --dot`` merges
the workers it can reach). Ids of RRefs and forks are ``"created_on:local_id"`` strings (ints
are accepted); message ids are ints or strings, compared as strings.

``extra["autograd_graph"]``: the live distributed-autograd contexts of this worker::

    {"contexts": [
        {"context_id": 281474976710657,
         "nodes": [
            {"id": "7", "name": "MulBackward", "kind": "op"},
            {"id": "9", "name": "AccumulateGrad", "kind": "leaf"},
            {"id": "3", "name": "SendRpcBackward", "kind": "send", "message_id": 12, "peer": "ps"},
            {"id": "4", "name": "RecvRpcBackward", "kind": "recv", "message_id": 13, "peer": "ps"}
         ],
         "edges": [["4", "7"], ["7", "9"]]}]}

``id`` is unique within the worker and context; ``kind`` is ``op``, ``leaf`` (AccumulateGrad),
``send`` (the SendRpcBackward recorded where a tensor left for ``peer``) or ``recv`` (the
RecvRpcBackward where it arrived from ``peer``); an edge ``[a, b]`` means gradients flow from
node ``a`` to node ``b`` (``b`` is one of ``a``'s next functions). A ``recv`` on worker B and
the ``send`` on worker A with the same context and message id are joined by an edge recv -> send
between the two clusters (the gradient crossing the network).

``extra["rref_forks"]``: the RRefs this worker owns, the forks it holds, and the forks it keeps
alive for a child until the child's ChildAck::

    {"owners": [{"rref_id": "0:3", "type": "Tensor", "forks": ["1:4", "2:7"]}],
     "users": [{"rref_id": "0:3", "fork_id": "1:4", "owner": "ps", "parent": "ps",
                "state": "confirmed"}],
     "pending_children": [{"rref_id": "0:3", "fork_id": "2:7", "child": "trainer1"}]}

``owner``, ``parent`` and ``child`` are worker names; ``state`` is free text (``pending``,
``confirmed``, ``dropped``); ``type`` is optional. The fork tree has the OwnerRRef in the owner's
cluster, each UserRRef in its holder's cluster, and an edge from the parent (the owner or the
parent's own fork of that RRef) to every fork; forks the owner counts but no inspected worker
shows, and pending children, are dashed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DotInputError",
    "AUTOGRAD_KEY",
    "RREF_KEY",
    "parse_extra",
    "render_autograd",
    "render_rrefs",
]

AUTOGRAD_KEY = "autograd_graph"
RREF_KEY = "rref_forks"
_KINDS = {"op", "leaf", "send", "recv"}
_SHAPES = {"op": "box", "leaf": "ellipse", "send": "cds", "recv": "invhouse"}


class DotInputError(ValueError):
    """A worker's JSON does not follow the contract (the message names worker and key)."""


def _q(text: Any) -> str:
    s = str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{s}"'


def parse_extra(worker: str, extra: Mapping[str, str], key: str) -> dict[str, Any]:
    """The JSON object under ``extra[key]`` of ``worker`` ({} when absent).

    Raises:
        DotInputError: not valid JSON or not an object.
    """
    raw = extra.get(key)
    if raw is None or raw == "":
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DotInputError(f"worker {worker!r}: extra[{key!r}] is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise DotInputError(f"worker {worker!r}: extra[{key!r}] must be a JSON object")
    return value


def _need(obj: Any, name: str, where: str) -> Any:
    if not isinstance(obj, dict) or name not in obj:
        raise DotInputError(f"{where}: missing {name!r}")
    return obj[name]


def _list(obj: Any, name: str, where: str) -> list[Any]:
    value = obj.get(name, []) if isinstance(obj, dict) else None
    if not isinstance(value, list):
        raise DotInputError(f"{where}: {name!r} must be a list")
    return value


@dataclass
class _Graph:
    """DOT text assembled per cluster, so every worker becomes one subgraph."""

    title: str
    clusters: dict[str, list[str]] = field(default_factory=dict)
    edges: list[str] = field(default_factory=list)
    missing: set[str] = field(default_factory=set)

    def node(self, worker: str, node_id: str, **attrs: Any) -> None:
        body = " ".join(f"{k}={_q(v)}" for k, v in attrs.items())
        self.clusters.setdefault(worker, []).append(f"    {_q(node_id)} [{body}];")

    def edge(self, a: str, b: str, **attrs: Any) -> None:
        body = " ".join(f"{k}={_q(v)}" for k, v in attrs.items())
        self.edges.append(f"  {_q(a)} -> {_q(b)}" + (f" [{body}]" if body else "") + ";")

    def text(self, name: str) -> str:
        lines = [f"digraph {name} {{", f"  label={_q(self.title)};", "  labelloc=t;"]
        lines.append('  node [fontname="Helvetica" fontsize=10];')
        for i, (worker, body) in enumerate(sorted(self.clusters.items())):
            style = "dashed" if worker in self.missing else "rounded"
            note = " (not inspected)" if worker in self.missing else ""
            lines += [
                f"  subgraph cluster_{i} {{",
                f"    label={_q(worker + note)};",
                f"    style={_q(style)};",
                *body,
                "  }",
            ]
        lines += self.edges
        lines.append("}")
        return "\n".join(lines) + "\n"


def render_autograd(views: Mapping[str, Mapping[str, str]], context_id: int | None = None) -> str:
    """DOT of the distributed autograd graph over the workers in ``views``.

    Args:
        views: worker name -> that worker's ``DebugInfo.extra``.
        context_id: draw only this context (None: every context found).

    Returns:
        The DOT text: one cluster per worker, send/recv edges between clusters.

    Raises:
        DotInputError: a worker's JSON breaks the contract, or ``context_id`` is nowhere.

    Example:
        >>> print(render_autograd({"w0": {"autograd_graph": '{"contexts": []}'}}))
    """
    g = _Graph("distributed autograd" + (f", context {context_id}" if context_id else ""))
    sends: dict[tuple[int, str], str] = {}
    recvs: list[tuple[int, str, str, str, str]] = []  # ctx, msg, node, worker, peer
    seen_contexts: set[int] = set()
    for worker, extra in sorted(views.items()):
        data = parse_extra(worker, extra, AUTOGRAD_KEY)
        where = f"worker {worker!r} {AUTOGRAD_KEY}"
        for ctx in _list(data, "contexts", where):
            cid = int(_need(ctx, "context_id", where))
            if context_id is not None and cid != context_id:
                continue
            seen_contexts.add(cid)
            cwhere = f"{where} context {cid}"
            ids: set[str] = set()
            for n in _list(ctx, "nodes", cwhere):
                nid, kind = str(_need(n, "id", cwhere)), n.get("kind", "op")
                if kind not in _KINDS:
                    raise DotInputError(f"{cwhere}: node {nid!r} has kind {kind!r}")
                ids.add(nid)
                full = f"{worker}/{cid}/{nid}"
                label = str(n.get("name", kind))
                if kind in ("send", "recv"):
                    msg = str(_need(n, "message_id", f"{cwhere} node {nid!r}"))
                    peer = str(n.get("peer", "?"))
                    label += f"\nmsg {msg} {'to' if kind == 'send' else 'from'} {peer}"
                    if kind == "send":
                        sends[(cid, msg)] = full
                    else:
                        recvs.append((cid, msg, full, worker, peer))
                g.node(worker, full, label=label, shape=_SHAPES[kind])
            for e in _list(ctx, "edges", cwhere):
                if not (isinstance(e, list) and len(e) == 2):
                    raise DotInputError(f"{cwhere}: an edge must be [from, to], got {e!r}")
                a, b = str(e[0]), str(e[1])
                for end in (a, b):
                    if end not in ids:
                        raise DotInputError(f"{cwhere}: edge {e!r} names unknown node {end!r}")
                g.edge(f"{worker}/{cid}/{a}", f"{worker}/{cid}/{b}")
    if context_id is not None and not seen_contexts:
        raise DotInputError(f"no inspected worker has autograd context {context_id}")
    for cid, msg, node, _worker, peer in recvs:
        send = sends.get((cid, msg))
        if send is None:  # the sender was not inspected: a stand-in in its cluster
            send = f"{peer}/{cid}/send-{msg}"
            g.node(peer, send, label=f"SendRpcBackward\nmsg {msg}", shape="cds", style="dashed")
            if peer not in views:
                g.missing.add(peer)
        g.edge(node, send, label=f"msg {msg}", color="blue", penwidth="2")
    if len(seen_contexts) > 1:
        g.title += f" ({len(seen_contexts)} contexts)"
    return g.text("autograd")


def _rref_parts(
    views: Mapping[str, Mapping[str, str]],
) -> Iterable[tuple[str, str, dict[str, Any]]]:
    for worker, extra in sorted(views.items()):
        yield worker, f"worker {worker!r} {RREF_KEY}", parse_extra(worker, extra, RREF_KEY)


def render_rrefs(views: Mapping[str, Mapping[str, str]], rref_id: str | None = None) -> str:
    """DOT of the fork trees of the RRefs seen on the workers in ``views``.

    Args:
        views: worker name -> that worker's ``DebugInfo.extra``.
        rref_id: draw only this RRef (``"created_on:local_id"``; None: all).

    Returns:
        The DOT text: one cluster per worker, fork edges between clusters.

    Raises:
        DotInputError: a worker's JSON breaks the contract, or ``rref_id`` is nowhere.
    """
    g = _Graph("RRef fork tree" + (f" of {rref_id}" if rref_id else "s"))
    owners: dict[str, tuple[str, str]] = {}  # rref -> (owner worker, node)
    users: dict[tuple[str, str], str] = {}  # (rref, fork) -> node
    holders: dict[tuple[str, str], list[str]] = {}  # (rref, worker) -> fork nodes
    owner_forks: dict[str, list[str]] = {}
    links: list[tuple[str, str, str, str, str]] = []  # rref, fork, node, parent, owner
    pending: list[tuple[str, str, str, str]] = []  # rref, fork, parent worker, child
    for worker, where, data in _rref_parts(views):
        for o in _list(data, "owners", where):
            rid = str(_need(o, "rref_id", where))
            if rref_id is not None and rid != rref_id:
                continue
            node = f"{worker}/owner/{rid}"
            owners[rid] = (worker, node)
            owner_forks[rid] = [str(f) for f in o.get("forks", [])]
            label = f"OwnerRRef {rid}" + (f"\n{o['type']}" if o.get("type") else "")
            g.node(worker, node, label=label, shape="doubleoctagon")
        for u in _list(data, "users", where):
            rid, fid = str(_need(u, "rref_id", where)), str(_need(u, "fork_id", where))
            if rref_id is not None and rid != rref_id:
                continue
            node = f"{worker}/user/{rid}/{fid}"
            users[(rid, fid)] = node
            holders.setdefault((rid, worker), []).append(node)
            state = u.get("state", "")
            g.node(
                worker,
                node,
                label=f"UserRRef {rid}\nfork {fid}" + (f"\n{state}" if state else ""),
                shape="box",
                style="dashed" if state == "pending" else "solid",
            )
            links.append(
                (rid, fid, node, str(_need(u, "parent", where)), str(_need(u, "owner", where)))
            )
        for c in _list(data, "pending_children", where):
            rid = str(_need(c, "rref_id", where))
            if rref_id is None or rid == rref_id:
                pending.append((rid, str(_need(c, "fork_id", where)), worker, str(c.get("child"))))
    if rref_id is not None and rref_id not in owners and not any(k[0] == rref_id for k in users):
        raise DotInputError(f"no inspected worker knows RRef {rref_id}")

    def owner_node(rid: str, owner: str) -> str:
        if rid not in owners:
            node = f"{owner}/owner/{rid}"
            g.node(owner, node, label=f"OwnerRRef {rid}", shape="doubleoctagon", style="dashed")
            owners[rid] = (owner, node)
            if owner not in views:
                g.missing.add(owner)
        return owners[rid][1]

    def parent_node(rid: str, parent: str, owner: str) -> str:
        if parent == owner:
            return owner_node(rid, owner)
        held = holders.get((rid, parent))
        if held:
            return held[0]
        node = f"{parent}/user/{rid}/?"
        if (rid, parent) not in holders:
            g.node(parent, node, label=f"UserRRef {rid}\n(fork not shown)", style="dashed")
            holders[(rid, parent)] = []
            if parent not in views:
                g.missing.add(parent)
        return node

    held_for = {(rid, fid, parent) for rid, fid, parent, _child in pending}
    drawn: set[tuple[str, str]] = set()
    for rid, fid, node, parent, owner in links:
        if (rid, fid, parent) in held_for:  # the parent still keeps its fork alive for this one
            drawn.add((rid, fid))
            g.edge(
                parent_node(rid, parent, owner),
                node,
                label=f"fork {fid}\nawaiting ChildAck",
                style="dashed",
                color="orange",
            )
        else:
            g.edge(parent_node(rid, parent, owner), node, label=f"fork {fid}")
    for rid, forks in owner_forks.items():
        for fid in forks:
            if (rid, fid) not in users:
                node = f"?/user/{rid}/{fid}"
                g.node("unknown holder", node, label=f"fork {fid}", style="dashed")
                g.missing.add("unknown holder")
                g.edge(owners[rid][1], node, style="dashed", label="counted by owner")
    for rid, fid, parent, child in pending:
        if (rid, fid) in drawn:
            continue
        target = users.get((rid, fid))
        if target is None:
            target = f"{child}/user/{rid}/{fid}"
            g.node(child, target, label=f"UserRRef {rid}\nfork {fid}", style="dashed")
            if child not in views:
                g.missing.add(child)
        source = holders.get((rid, parent)) or [owners.get(rid, (parent, ""))[1]]
        if source[0]:
            g.edge(source[0], target, style="dashed", color="orange", label="awaiting ChildAck")
    return g.text("rrefs")
