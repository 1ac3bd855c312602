"""Authentication, health and reflection, seen from raw gRPC clients."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from gradwire import errors
from gradwire._proto import worker_pb2 as pb
from gradwire._wire import calls
from gradwire._wire.framing import decode_frame, encode_frame, split
from gradwire._wire.pickler import EncodeContext
from gradwire.distributed import rpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

_ran: list[str] = []


def record(tag: str) -> str:
    _ran.append(tag)
    return tag


def _address() -> str:
    return str(rpc.get_debug_info()["peers"][0]["address"])


def _call_frame(fn: Any, *args: Any) -> Any:
    name, bound = calls.function_name(fn)
    first, buffers = calls.encode_body(
        pb.FrameHeader(call=pb.CallHeader(message_id=1, function=name, kind=pb.CALL_KIND_PYTHON)),
        (bound, args, {}),
        EncodeContext(),
    )
    return next(split(first, buffers, 1 << 20))


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_wrong_or_missing_token_is_rejected_before_anything_runs(
    solo: rpc.WorkerInfo, token: str | None
) -> None:
    _ran.clear()
    channel = grpc.insecure_channel(_address())
    call = channel.unary_unary("/gradwire.v1.Worker/Call", encode_frame, decode_frame)
    metadata = [("x-gradwire-token", token)] if token else []
    with pytest.raises(grpc.RpcError) as info:
        call(_call_frame(record, "intruder"), timeout=5, metadata=metadata)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ("wrong" if token else "missing") in info.value.details()
    assert "intruder" not in _ran
    # The same frame with the right token runs.
    reply = call(
        _call_frame(record, "friend"), timeout=5, metadata=[("x-gradwire-token", "test-token")]
    )
    assert not reply.header.reply.HasField("error") and _ran == ["friend"]
    channel.close()


def test_health_serving_without_token(solo: rpc.WorkerInfo) -> None:
    with grpc.insecure_channel(_address()) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "gradwire.v1.Worker"):
            status = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_worker_service_and_methods(solo: rpc.WorkerInfo) -> None:
    # No token: reflection, like health, is open (it reveals only the public schema).
    channel = grpc.insecure_channel(_address())
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    assert {"gradwire.v1.Worker", "grpc.health.v1.Health"} <= services
    from google.protobuf.descriptor_pool import DescriptorPool

    service = DescriptorPool(db).FindServiceByName("gradwire.v1.Worker")
    methods = {m.name for m in service.methods}
    assert {"PythonCall", "Call", "Join", "Barrier", "GetDebugInfo", "RRefDelete"} <= methods


def test_debug_rpc(solo: rpc.WorkerInfo) -> None:
    with grpc.insecure_channel(_address()) as channel:
        stub = channel.unary_unary(
            "/gradwire.v1.Worker/GetDebugInfo",
            pb.DebugInfoRequest.SerializeToString,
            pb.DebugInfo.FromString,
        )
        info = stub(pb.DebugInfoRequest(), timeout=5, metadata=[("x-gradwire-token", "test-token")])
    assert info.worker == "solo" and info.state == "RUNNING" and info.peers[0].name == "solo"


def test_unresolvable_function_names_function_and_worker(solo: rpc.WorkerInfo) -> None:
    from gradwire._wire.exceptions import decode_exception
    from gradwire._wire.policy import CallablePolicy

    frame = _call_frame(record, "x")
    frame.header.call.function = f"{__name__}:no_such_function"
    with grpc.insecure_channel(_address()) as channel:
        call = channel.unary_unary("/gradwire.v1.Worker/Call", encode_frame, decode_frame)
        reply = call(frame, timeout=5, metadata=[("x-gradwire-token", "test-token")])
    err = decode_exception(reply.header.reply.error, CallablePolicy())
    assert isinstance(err, errors.SerializationError)
    assert f"{__name__}:no_such_function does not resolve on worker 'solo'" in str(err)
