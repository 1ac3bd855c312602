"""Server interceptors: authentication before anything is decoded.

Every Worker method needs metadata ``x-gradwire-token`` equal to the cluster token (health
checks and server reflection are open: they reveal only liveness and the public schema, and
probes and tools like ``grpcurl list`` must work without secrets); a wrong or missing token gets UNAUTHENTICATED from a handler that reads the request as
raw bytes, so nothing is unpickled and nothing runs. Join is open only while rank 0 uses a token
it generated itself (a loopback cluster without configured token), since joiners learn it there.
Calls that arrive before this worker finished its rendezvous wait for it (bounded by
``init_timeout``), because a peer may call as soon as *it* has the member list.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from gradwire._runtime.transport.transport import SERVICE

__all__ = [
    "has_token",
    "AuthInterceptor",
    "TOKEN_KEY",
    "CALLER_KEY",
    "token_refusal",
    "not_ready_message",
]

log = logging.getLogger(__name__)
TOKEN_KEY = "x-gradwire-token"
CALLER_KEY = "x-gradwire-caller"
_OPEN_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
_STREAM_IN = {"PythonCall", "CallStream", "CallPipe", "RemoteCall", "PropagateGradients"}
_STREAM_OUT = {"PythonCall", "CallStream", "CallPipe", "FetchReply", "FetchRRef", "WatchControl"}


def _rejecting_handler(method: str, status: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    async def reject(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(status, details)

    async def reject_stream(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(status, details)
        yield  # pragma: no cover - makes this an async generator

    name = method.rsplit("/", 1)[-1]
    stream_in, stream_out = name in _STREAM_IN, name in _STREAM_OUT
    # No deserializer: the request stays raw bytes and is never looked at.
    if stream_in and stream_out:
        return grpc.stream_stream_rpc_method_handler(reject_stream)
    if stream_in:
        return grpc.stream_unary_rpc_method_handler(reject)
    if stream_out:
        return grpc.unary_stream_rpc_method_handler(reject_stream)
    return grpc.unary_unary_rpc_method_handler(reject)


def has_token(agent: Any, metadata: Any) -> bool:
    """True when ``metadata`` carries the agent's cluster token (or it has none); constant time."""
    expected = agent.token
    if not expected:
        return True
    got = ""
    for key, value in metadata or ():
        if key == TOKEN_KEY:
            got = value if isinstance(value, str) else value.decode("latin-1")
    return hmac.compare_digest(got.encode(), expected.encode())


def token_refusal(agent: Any, method: str, metadata: Any) -> str | None:
    """Why a call of ``method`` with ``metadata`` must be refused UNAUTHENTICATED, or None.

    The one token check, shared by the asyncio server and the fast lane (constant-time
    comparison; the token itself never appears in a message or a log).
    """
    if has_token(agent, metadata):
        return None
    got = any(key == TOKEN_KEY for key, _ in metadata or ())
    log.warning("rejected %s on %s: %s token", method, agent.name, "wrong" if got else "missing")
    return (
        f"worker {agent.name!r}: {'wrong' if got else 'missing'} cluster token "
        f"({TOKEN_KEY}); set the same GRADWIRE_TOKEN on every worker"
    )


def not_ready_message(agent: Any) -> str:
    """The UNAVAILABLE details of a call that waited ``init_timeout`` for the rendezvous."""
    return f"worker {agent.name!r} has not finished its rendezvous"


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks the cluster token of every call against the agent's.

    Args:
        agent: the worker's agent (``token``, ``token_generated``, ``wait_ready``).
    """

    def __init__(self, agent: Any) -> None:
        self._agent = agent

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = details.method
        if method.startswith(_OPEN_PREFIXES):
            return await continuation(details)
        agent = self._agent
        is_join = method == f"/{SERVICE}/Join"
        if is_join and agent.token_generated:
            # Rank 0 made the token up: a rank the rendezvous still waits for joins without
            # it and learns it from the reply; the Join handler refuses everyone else.
            return await continuation(details)
        if not is_join and not agent.is_ready():
            if not await agent.wait_ready(agent.options.init_timeout):
                return _rejecting_handler(
                    method, grpc.StatusCode.UNAVAILABLE, not_ready_message(agent)
                )
        refusal = token_refusal(agent, method, details.invocation_metadata)
        if refusal is not None:
            return _rejecting_handler(method, grpc.StatusCode.UNAUTHENTICATED, refusal)
        return await continuation(details)
