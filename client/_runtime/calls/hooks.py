"""The seam for distributed autograd: hooks around every call and reply.

The caller and the callee call each registered hook with the outgoing header and the tensors that the pickler
pulled out of the payload, *before* the message is framed, so a hook can set
``CallHeader.autograd`` / ``ReplyHeader.autograd`` (context id and a message id) and record the
send function of tensors that require grad. On receipt it calls the matching hook with the
rebuilt tensors before the function runs (or before the caller sees the result), so recv
functions can be attached. Hooks run in the thread that encodes or decodes the message and must
be fast and non-blocking.

Example (``dist_autograd.service.DistAutogradService`` is such a hook)::

    class DistAutogradHook(CallHook):
        def on_send_call(self, header, tensors, peer): ...
        def on_recv_call(self, header, tensors, peer): ...

    hooks.register(DistAutogradHook())
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from ..._proto import worker_pb2 as pb
from ...autograd import _profiling
from ...futures import Future
from . import profiling

__all__ = [
    "CallHook",
    "register",
    "unregister",
    "registered",
    "needed",
    "watching",
    "send_call",
    "recv_call",
    "send_reply",
    "recv_reply",
    "scope",
    "call_started",
]


class CallHook:
    """Base class of hooks; override what you need (the defaults do nothing).

    Args of every method:
        header: the CallHeader or ReplyHeader of the message (mutable on send).
        tensors: the tensors of the payload in side-table order (gradwire Tensors and ndarrays).
        peer: worker id of the other side.

    Attributes:
        context_only: True when ``on_recv_call``, ``scope``, ``on_send_reply`` and
            ``on_recv_reply`` do nothing for a message with no tensors whose call carries no
            autograd context; such messages then skip the hooks (see :func:`needed`).
    """

    context_only = False

    def on_send_call(self, header: pb.CallHeader, tensors: Sequence[Any], peer: int) -> None:
        """Before a call leaves this worker."""

    def on_recv_call(self, header: pb.CallHeader, tensors: Sequence[Any], peer: int) -> None:
        """After a call's payload is decoded, before its function runs."""

    def on_send_reply(
        self, call: pb.CallHeader, header: pb.ReplyHeader, tensors: Sequence[Any], peer: int
    ) -> None:
        """Before a reply to ``call`` leaves this worker."""

    def scope(self, call: pb.CallHeader, peer: int) -> contextlib.AbstractContextManager[Any]:
        """Entered around the user function of ``call`` on the callee's serving thread (e.g. to
        make the caller's distributed autograd context current there)."""
        return contextlib.nullcontext()

    def on_recv_reply(
        self, call: pb.CallHeader, header: pb.ReplyHeader, tensors: Sequence[Any], peer: int
    ) -> None:
        """After a reply to ``call`` is decoded, before the caller's future completes."""

    def on_call_started(
        self,
        call: pb.CallHeader,
        peer: int,
        done: Future[Any],
        deadline: float | None,
        verb: str,
    ) -> None:
        """After ``call`` left (for a call that carries an autograd context, as a hook
        stamped it in ``on_send_call``; for every ``rpc_sync``, ``rpc_async`` and ``remote``
        call when a hook that sees every call is registered, see :func:`needed`): ``done``
        completes after ``on_recv_reply`` of its answer, or with the call's error;
        ``deadline`` is the ``time.monotonic()`` at which the call times out (None: never);
        ``verb`` is ``"rpc_sync"``, ``"rpc_async"`` or ``"remote"``. Runs on the thread that
        called :meth:`on_send_call` for ``call``, right after it."""


_hooks: tuple[CallHook, ...] = ()
#: Whether a hook that is not ``context_only`` is registered.
_every_call = False
_lock = threading.Lock()


def _install(hooks: tuple[CallHook, ...]) -> None:
    global _hooks, _every_call
    _hooks = hooks
    _every_call = any(not h.context_only for h in hooks)


def register(hook: CallHook) -> None:
    """Add ``hook`` (idempotent)."""
    with _lock:
        if hook not in _hooks:
            _install((*_hooks, hook))


def unregister(hook: CallHook) -> None:
    """Remove ``hook`` if present."""
    with _lock:
        _install(tuple(h for h in _hooks if h is not hook))


def watching() -> bool:
    """Whether every call goes through the hooks, whatever it carries: a hook that sees every
    call is registered, or something in this process profiles (``needed`` of a call with no
    autograd context and no profile request)."""
    return _every_call or _profiling.active > 0


def needed(call: pb.CallHeader) -> bool:
    """Whether a message with no tensors that belongs to ``call`` must go through
    ``recv_call``, ``scope``, ``send_reply`` and ``recv_reply`` (and a call through
    ``call_started``): its call carries an autograd context or asks for the callee's profile,
    a hook that sees every call is registered (metrics, tracing: ``gradwire.observability``),
    or something in this process profiles (``gradwire.autograd.profiler``)."""
    return (
        _every_call
        or _profiling.active > 0
        or call.HasField("autograd")
        or call.HasField("profile")
    )


def registered() -> tuple[CallHook, ...]:
    """The hooks in registration order."""
    return _hooks


def send_call(header: pb.CallHeader, tensors: Sequence[Any], peer: int) -> None:
    if _profiling.active:  # the verb's profile stamps its call
        profiling.on_send_call(header, peer)
    for h in _hooks:
        h.on_send_call(header, tensors, peer)


def recv_call(header: pb.CallHeader, tensors: Sequence[Any], peer: int) -> None:
    for h in _hooks:
        h.on_recv_call(header, tensors, peer)


def send_reply(
    call: pb.CallHeader, header: pb.ReplyHeader, tensors: Sequence[Any], peer: int
) -> None:
    for h in _hooks:
        h.on_send_reply(call, header, tensors, peer)
    if profiling.serving:  # a profiled call's events travel back with its reply
        profiling.on_send_reply(call, header, peer)


def recv_reply(
    call: pb.CallHeader, header: pb.ReplyHeader, tensors: Sequence[Any], peer: int
) -> None:
    if profiling.awaiting:
        profiling.on_recv_reply(call, header, peer)
    for h in _hooks:
        h.on_recv_reply(call, header, tensors, peer)


def call_started(
    call: pb.CallHeader, peer: int, done: Future[Any], deadline: float | None, verb: str
) -> None:
    for h in _hooks:
        h.on_call_started(call, peer, done, deadline, verb)


def scope(call: pb.CallHeader, peer: int) -> contextlib.AbstractContextManager[Any]:
    """Enter every hook's ``scope`` around a user function on the callee (and the profiler's
    when the call asks for its events or this worker profiles)."""
    hooks = _hooks
    if _profiling.active or call.HasField("profile"):
        return _scopes((*hooks, _PROFILE_SCOPE), call, peer)
    if len(hooks) == 1:  # the usual case (distributed autograd): no stack to build per call
        return hooks[0].scope(call, peer)
    return _scopes(hooks, call, peer)


class _ProfileScope(CallHook):
    """The profiler's part of ``scope`` (never registered: ``scope`` adds it when needed)."""

    context_only = True

    def scope(self, call: pb.CallHeader, peer: int) -> contextlib.AbstractContextManager[Any]:
        return profiling.serve_scope(call, peer)


_PROFILE_SCOPE = _ProfileScope()


@contextlib.contextmanager
def _scopes(hooks: tuple[CallHook, ...], call: pb.CallHeader, peer: int) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for h in hooks:
            stack.enter_context(h.scope(call, peer))
        yield
