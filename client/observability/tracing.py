"""OpenTelemetry spans for calls (issue 40): a client span on the caller, a server span on the
callee, one trace across workers.

The caller starts a CLIENT span in ``on_send_call`` (named as PyTorch's profiler names RPC
events once the verb is known: ``rpc_sync#mod.fn(worker0 -> worker1)``, ``rpc_async#...``,
``rpc_remote#...``) and injects its W3C trace context into ``CallHeader.trace_context`` with the
globally configured propagator; the span ends when the call's Future completes, with an error
status if it failed. The callee extracts that context and runs the function inside a SERVER
span made current (``scope``), so the calls the function makes are its children: a chain of
nested calls across workers is one trace. Off by default: no hook is registered until
:func:`enable`, so calls pay nothing.

Needs ``opentelemetry-api`` (spans go nowhere until a tracer provider, e.g. the SDK's, is set:
``pip install 'gradwire[observability]'``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .._proto import worker_pb2 as pb
from .._runtime import agent as _agent
from .._runtime.calls import hooks
from ..futures import Future
from ._deps import require

__all__ = ["TracingHook", "enable", "disable", "enabled"]

log = logging.getLogger(__name__)
#: The call kinds that get spans (to_here's fetch and control messages do not).
_TRACED = (pb.CALL_KIND_PYTHON, pb.CALL_KIND_REMOTE)
#: PyTorch's profiler names of the verbs.
_KEY = {"rpc_sync": "rpc_sync", "rpc_async": "rpc_async", "remote": "rpc_remote"}


def _names(peer: int) -> tuple[str, str]:
    agent = _agent.current_or_none()
    if agent is None:
        return "?", str(peer)
    return agent.name, agent.ctx.peer_name(peer)


class _Served:
    """The server span of one served call, current while its function runs."""

    __slots__ = ("_hook", "_call", "_peer", "_span", "_token")

    def __init__(self, hook: TracingHook, call: pb.CallHeader, peer: int) -> None:
        self._hook, self._call, self._peer = hook, call, peer
        self._span: Any = None
        self._token: Any = None

    def __enter__(self) -> None:
        otel, call = self._hook.otel, self._call
        parent = otel.propagate.extract(call.trace_context) if call.trace_context else None
        me, caller = _names(self._peer)
        span = self._hook.tracer.start_span(
            f"{call.function}({caller} -> {me})",
            context=parent,
            kind=otel.trace.SpanKind.SERVER,
            attributes={
                "rpc.system": "gradwire",
                "rpc.method": call.function,
                "gradwire.caller": caller,
                "gradwire.worker": me,
            },
        )
        self._span = span
        self._token = otel.context.attach(otel.trace.set_span_in_context(span))

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        otel = self._hook.otel
        otel.context.detach(self._token)
        if exc is not None:
            self._span.record_exception(exc)
            self._span.set_status(otel.trace.Status(otel.trace.StatusCode.ERROR, repr(exc)))
        self._span.end()


class _Otel:
    """The OpenTelemetry modules, imported once."""

    def __init__(self) -> None:
        self.trace = require("opentelemetry.trace", "tracing")
        self.context = require("opentelemetry.context", "tracing")
        self.propagate = require("opentelemetry.propagate", "tracing")


class TracingHook(hooks.CallHook):
    """Spans for every ``rpc_sync``, ``rpc_async`` and ``remote`` call, on both sides.

    Args:
        tracer: the OpenTelemetry Tracer the spans are made by.
    """

    context_only = False

    def __init__(self, tracer: Any) -> None:
        self.otel = _Otel()
        self.tracer = tracer
        #: This thread's span started by ``on_send_call``, taken by ``on_call_started``.
        self._local = threading.local()

    def on_send_call(self, header: pb.CallHeader, tensors: Any, peer: int) -> None:
        if header.kind not in _TRACED:
            return
        if header.kind == pb.CALL_KIND_REMOTE and peer == header.caller_id:
            return  # remote() to this worker itself: no message leaves
        otel = self.otel
        me, dst = _names(peer)
        span = self.tracer.start_span(
            f"{header.function}({me} -> {dst})",
            kind=otel.trace.SpanKind.CLIENT,
            attributes={
                "rpc.system": "gradwire",
                "rpc.method": header.function,
                "gradwire.worker": me,
                "gradwire.callee": dst,
            },
        )
        otel.propagate.inject(header.trace_context, context=otel.trace.set_span_in_context(span))
        self._local.started = (header, span)

    def on_call_started(
        self,
        call: pb.CallHeader,
        peer: int,
        done: Future[Any],
        deadline: float | None,
        verb: str,
    ) -> None:
        started = getattr(self._local, "started", None)
        if started is None or started[0] is not call:
            return
        self._local.started = None
        span = started[1]
        span.update_name(f"{_KEY.get(verb, verb)}#{span.name}")
        span.set_attribute("gradwire.verb", verb)
        otel = self.otel

        def ended(fut: Future[Any]) -> None:
            exc = fut.exception()
            if exc is not None:
                span.record_exception(exc)
                span.set_status(otel.trace.Status(otel.trace.StatusCode.ERROR, repr(exc)))
            span.end()

        done.add_done_callback(ended)

    def scope(self, call: pb.CallHeader, peer: int) -> Any:
        return _Served(self, call, peer)


_lock = threading.Lock()
_hook: TracingHook | None = None


def enable(tracer_provider: Any = None) -> None:
    """Make a span of every call on both sides (idempotent; a second call with another
    provider replaces the first).

    Args:
        tracer_provider: an OpenTelemetry TracerProvider; None: the global one
            (``opentelemetry.trace.set_tracer_provider``, which may also be set afterwards).

    Raises:
        ImportError: opentelemetry-api is not installed (the ``observability`` extra).
    """
    global _hook
    otel = _Otel()
    if tracer_provider is None:
        provider = otel.trace.get_tracer_provider()
        if isinstance(provider, otel.trace.ProxyTracerProvider):
            log.info(
                "gradwire tracing is on, but no OpenTelemetry tracer provider is set yet: "
                "spans are dropped until opentelemetry.trace.set_tracer_provider() is called"
            )
        tracer = otel.trace.get_tracer("gradwire")
    else:
        tracer = tracer_provider.get_tracer("gradwire")
    with _lock:
        if _hook is not None:
            hooks.unregister(_hook)
        _hook = TracingHook(tracer)
        hooks.register(_hook)


def disable() -> None:
    """Stop making spans."""
    global _hook
    with _lock:
        if _hook is not None:
            hooks.unregister(_hook)
        _hook = None


def enabled() -> bool:
    """Whether calls make spans."""
    return _hook is not None
