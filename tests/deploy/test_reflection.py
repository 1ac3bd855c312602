"""A reflection client, with no .proto file and no gradwire stubs: what grpcurl sees.

Lists the services, describes gradwire.v1.Worker, builds the request and reply classes from the
descriptors the worker serves, calls health and GetDebugInfo, and reads control messages from
WatchControl, all through a fresh DescriptorPool fed only by the server.
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from .procs import TOKEN

WORKER = "gradwire.v1.Worker"


@pytest.fixture(scope="module")
def reflected(cluster: str):  # type: ignore[no-untyped-def]
    channel = grpc.insecure_channel(cluster)
    db = ProtoReflectionDescriptorDatabase(channel)
    pool = descriptor_pool.DescriptorPool(db)
    yield channel, db, pool
    channel.close()


def message_class(pool: descriptor_pool.DescriptorPool, name: str):  # type: ignore[no-untyped-def]
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def unary(channel: grpc.Channel, pool, service: str, method: str, stream: bool = False):  # type: ignore[no-untyped-def]
    m = pool.FindServiceByName(service).FindMethodByName(method)
    req, rep = (
        message_class(pool, m.input_type.full_name),
        message_class(pool, m.output_type.full_name),
    )
    make = channel.unary_stream if stream else channel.unary_unary
    return req, make(
        f"/{service}/{method}",
        request_serializer=req.SerializeToString,
        response_deserializer=rep.FromString,
    )


def test_list_services_without_a_token(reflected) -> None:  # type: ignore[no-untyped-def]
    _channel, db, _pool = reflected
    assert set(db.get_services()) >= {
        WORKER,
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }


def test_describe_worker(reflected) -> None:  # type: ignore[no-untyped-def]
    _channel, _db, pool = reflected
    svc = pool.FindServiceByName(WORKER)
    methods = {m.name: m for m in svc.methods}
    assert {"Call", "PythonCall", "RemoteCall", "ForkRequest", "ChildAck", "RRefDelete"} <= set(
        methods
    )
    assert {"PropagateGradients", "ReleaseContext", "Join", "Barrier"} <= set(methods)
    debug, watch = methods["GetDebugInfo"], methods["WatchControl"]
    assert debug.output_type.full_name == "gradwire.v1.DebugInfo"
    assert watch.output_type.full_name == "gradwire.v1.ControlEvent" and watch.server_streaming
    assert methods["PythonCall"].client_streaming and methods["PythonCall"].server_streaming
    fields = {f.name for f in debug.output_type.fields}
    assert {
        "num_owner_rrefs",
        "num_pending_users",
        "num_autograd_contexts",
        "extra",
        "peers",
    } <= fields


def test_health_and_debug_info(reflected) -> None:  # type: ignore[no-untyped-def]
    channel, _db, pool = reflected
    req, check = unary(channel, pool, "grpc.health.v1.Health", "Check")
    reply = check(req(service=WORKER), timeout=5)
    assert (
        reply.DESCRIPTOR.fields_by_name["status"].enum_type.values_by_number[reply.status].name
        == "SERVING"
    )
    req, debug = unary(channel, pool, WORKER, "GetDebugInfo")
    with pytest.raises(grpc.RpcError) as exc:
        debug(req(), timeout=5)  # the schema is public, the state is not
    assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    info = debug(req(), timeout=5, metadata=(("x-gradwire-token", TOKEN),))
    assert info.worker == "driver" and info.state == "RUNNING"
    assert [p.name for p in info.peers] == ["driver", "w1"]
    assert info.num_owner_rrefs == 1 and "autograd_graph" in info.extra


def test_watch_control_messages(reflected) -> None:  # type: ignore[no-untyped-def]
    channel, _db, pool = reflected
    req, watch = unary(channel, pool, WORKER, "WatchControl", stream=True)
    stream = watch(req(kinds=["ForkRequest"]), timeout=10, metadata=(("x-gradwire-token", TOKEN),))
    events = []
    for event in stream:
        events.append(event)
        if len(events) == 3:
            break
    stream.cancel()
    assert [e.kind for e in events] == ["ForkRequest"] * 3
    assert all(e.direction == "received" and e.peer == "w1" for e in events)
    assert events[0].rref_id.created_on == 0 and events[0].rref_id.local_id == 1
    assert len({e.fork_id.local_id for e in events}) == 3
