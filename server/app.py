"""create_server: the gRPC server of a worker (the Worker service, health and reflection) and,
for peers on the same host, its fast lane (``fast_lane.py``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from gradwire._proto import worker_pb2 as pb
from gradwire._runtime.agent import AgentState
from gradwire._runtime.cluster.options import read_pem
from gradwire._runtime.transport.loop import run_sync
from gradwire._runtime.transport.transport import SERVICE, channel_options
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from .fast_lane import start_fast_lane
from .interceptors import AuthInterceptor
from .servicer import WorkerServicer, method_handlers

__all__ = ["RENDEZVOUS_HEALTH", "create_server"]

log = logging.getLogger(__name__)
_HEALTH = {
    AgentState.RUNNING: health_pb2.HealthCheckResponse.SERVING,
    AgentState.SHUTTING_DOWN: health_pb2.HealthCheckResponse.NOT_SERVING,
    AgentState.SHUTDOWN: health_pb2.HealthCheckResponse.NOT_SERVING,
}
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
#: Health name SERVING while this worker (rank 0) hosts its rendezvous and waits for the other
#: ranks: it must be reachable by name before its cluster forms, and Docker Swarm publishes a
#: task's name only once its health check passes (docs/deploy.md).
RENDEZVOUS_HEALTH = "gradwire.v1.Rendezvous"


def _credentials(options: Any) -> grpc.ServerCredentials | None:
    if options.tls_cert is None:
        return None
    return grpc.ssl_server_credentials(
        [(read_pem(options.tls_key), read_pem(options.tls_cert))],
        root_certificates=read_pem(options.tls_ca),
        require_client_auth=bool(options.tls_require_client_auth),
    )


async def _start(address: str, agent: Any) -> tuple[grpc.aio.Server, int]:
    options = agent.options
    server = grpc.aio.server(
        interceptors=[AuthInterceptor(agent)],
        options=[
            *channel_options(options),
            # Accept the clients' keepalive pings while calls are active.
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
            # A peer parked at the shutdown barrier keeps pinging; never answer it with
            # GOAWAY "too_many_pings" (seen after ~40 s of waiting).
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_generic_rpc_handlers((method_handlers(WorkerServicer(agent)),))
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (
            pb.DESCRIPTOR.services_by_name["Worker"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    creds = _credentials(options)
    try:
        port = (
            server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
        )
    except RuntimeError as exc:
        port = 0
        log.debug("bind %s failed: %s", address, exc)
    if not port and not address.startswith("unix:"):
        raise OSError(f"cannot listen on {address}: address in use or not local")
    if agent.local_address:
        server.add_insecure_port(agent.local_address)
    await health.set(SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
    await health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    await health.set(RENDEZVOUS_HEALTH, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.start()
    loop = asyncio.get_running_loop()

    def on_state(state: AgentState) -> None:
        status = _HEALTH.get(state)
        if state is AgentState.SHUTTING_DOWN and agent.serving_until_job:
            status = health_pb2.HealthCheckResponse.SERVING  # serving the job in the barrier
        if status is not None:
            for name in (SERVICE, ""):
                asyncio.run_coroutine_threadsafe(health.set(name, status), loop)
        # Rank 0 waiting at its rendezvous accepts joins: say so under a name of its own.
        hosting = state is AgentState.JOINING and agent.rank == 0
        rendezvous = health_pb2.HealthCheckResponse.SERVING if hosting else _NOT_SERVING
        asyncio.run_coroutine_threadsafe(health.set(RENDEZVOUS_HEALTH, rendezvous), loop)

    agent.add_state_listener(on_state)
    return server, port


def create_server(address: str, agent: Any) -> tuple[grpc.aio.Server, int]:
    """Start the gRPC server of ``agent`` on ``address`` (port 0: any free port).

    Args:
        address: ``"host:port"`` or ``"unix:/path"``.
        agent: the worker's ``gradwire._runtime.agent.Agent``.

    Returns:
        ``(server, port)``; the server runs on gradwire's I/O loop.

    Raises:
        OSError: the address cannot be bound.

    Example:
        >>> server, port = create_server("127.0.0.1:0", agent)
    """
    server, port = run_sync(_start(address, agent), timeout=30)
    try:
        lane = start_fast_lane(agent)
    except Exception:
        run_sync(server.stop(0), timeout=10)
        raise

    def stop(grace: float) -> None:
        stopped = lane.stop(grace) if lane is not None else None
        run_sync(server.stop(grace), timeout=grace + 10)
        if stopped is not None:
            stopped.wait(grace + 10)

    agent.attach_server(port, stop)
    return server, port
