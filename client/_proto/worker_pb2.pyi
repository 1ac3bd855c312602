from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CallKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CALL_KIND_UNSPECIFIED: _ClassVar[CallKind]
    CALL_KIND_PYTHON: _ClassVar[CallKind]
    CALL_KIND_REMOTE: _ClassVar[CallKind]
    CALL_KIND_RREF_METHOD: _ClassVar[CallKind]
CALL_KIND_UNSPECIFIED: CallKind
CALL_KIND_PYTHON: CallKind
CALL_KIND_REMOTE: CallKind
CALL_KIND_RREF_METHOD: CallKind

class GloballyUniqueId(_message.Message):
    __slots__ = ("created_on", "local_id")
    CREATED_ON_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ID_FIELD_NUMBER: _ClassVar[int]
    created_on: int
    local_id: int
    def __init__(self, created_on: _Optional[int] = ..., local_id: _Optional[int] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("name", "id", "address", "host_id", "local_address", "local_call_address", "cuda_device_count", "devices", "device_maps", "bulk_address", "call_address", "lane_pipe", "lane_plain")
    class DeviceMapsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DeviceMap
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[DeviceMap, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_CALL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CUDA_DEVICE_COUNT_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MAPS_FIELD_NUMBER: _ClassVar[int]
    BULK_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CALL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LANE_PIPE_FIELD_NUMBER: _ClassVar[int]
    LANE_PLAIN_FIELD_NUMBER: _ClassVar[int]
    name: str
    id: int
    address: str
    host_id: str
    local_address: str
    local_call_address: str
    cuda_device_count: int
    devices: _containers.RepeatedScalarFieldContainer[str]
    device_maps: _containers.MessageMap[str, DeviceMap]
    bulk_address: str
    call_address: str
    lane_pipe: bool
    lane_plain: bool
    def __init__(self, name: _Optional[str] = ..., id: _Optional[int] = ..., address: _Optional[str] = ..., host_id: _Optional[str] = ..., local_address: _Optional[str] = ..., local_call_address: _Optional[str] = ..., cuda_device_count: _Optional[int] = ..., devices: _Optional[_Iterable[str]] = ..., device_maps: _Optional[_Mapping[str, DeviceMap]] = ..., bulk_address: _Optional[str] = ..., call_address: _Optional[str] = ..., lane_pipe: bool = ..., lane_plain: bool = ...) -> None: ...

class DeviceMap(_message.Message):
    __slots__ = ("devices",)
    class DevicesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.ScalarMap[str, str]
    def __init__(self, devices: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TensorMeta(_message.Message):
    __slots__ = ("dtype", "shape", "nbytes", "device", "target_device", "requires_grad", "shm", "kind", "strides", "bulk")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    TARGET_DEVICE_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_GRAD_FIELD_NUMBER: _ClassVar[int]
    SHM_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STRIDES_FIELD_NUMBER: _ClassVar[int]
    BULK_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    device: str
    target_device: str
    requires_grad: bool
    shm: SharedMemoryRef
    kind: str
    strides: _containers.RepeatedScalarFieldContainer[int]
    bulk: BulkRef
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ..., device: _Optional[str] = ..., target_device: _Optional[str] = ..., requires_grad: bool = ..., shm: _Optional[_Union[SharedMemoryRef, _Mapping]] = ..., kind: _Optional[str] = ..., strides: _Optional[_Iterable[int]] = ..., bulk: _Optional[_Union[BulkRef, _Mapping]] = ...) -> None: ...

class BulkRef(_message.Message):
    __slots__ = ("transfer_id",)
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    transfer_id: int
    def __init__(self, transfer_id: _Optional[int] = ...) -> None: ...

class SharedMemoryRef(_message.Message):
    __slots__ = ("name", "offset", "size", "seg_id", "ticket")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SEG_ID_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    name: str
    offset: int
    size: int
    seg_id: str
    ticket: int
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., seg_id: _Optional[str] = ..., ticket: _Optional[int] = ...) -> None: ...

class RRefForkData(_message.Message):
    __slots__ = ("owner_id", "rref_id", "fork_id", "parent_id", "type_name")
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    RREF_ID_FIELD_NUMBER: _ClassVar[int]
    FORK_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_NAME_FIELD_NUMBER: _ClassVar[int]
    owner_id: int
    rref_id: GloballyUniqueId
    fork_id: GloballyUniqueId
    parent_id: int
    type_name: str
    def __init__(self, owner_id: _Optional[int] = ..., rref_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., fork_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., parent_id: _Optional[int] = ..., type_name: _Optional[str] = ...) -> None: ...

class AutogradMeta(_message.Message):
    __slots__ = ("context_id", "message_id")
    CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    context_id: int
    message_id: GloballyUniqueId
    def __init__(self, context_id: _Optional[int] = ..., message_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ...) -> None: ...

class Payload(_message.Message):
    __slots__ = ("pickle_nbytes", "tensors", "rrefs")
    PICKLE_NBYTES_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    RREFS_FIELD_NUMBER: _ClassVar[int]
    pickle_nbytes: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorMeta]
    rrefs: _containers.RepeatedCompositeFieldContainer[RRefForkData]
    def __init__(self, pickle_nbytes: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorMeta, _Mapping]]] = ..., rrefs: _Optional[_Iterable[_Union[RRefForkData, _Mapping]]] = ...) -> None: ...

class CallHeader(_message.Message):
    __slots__ = ("message_id", "caller_id", "kind", "function", "rref_id", "fork_id", "target_rref_id", "autograd", "timeout_seconds", "profile", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    CALLER_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    RREF_ID_FIELD_NUMBER: _ClassVar[int]
    FORK_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_RREF_ID_FIELD_NUMBER: _ClassVar[int]
    AUTOGRAD_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    message_id: int
    caller_id: int
    kind: CallKind
    function: str
    rref_id: GloballyUniqueId
    fork_id: GloballyUniqueId
    target_rref_id: GloballyUniqueId
    autograd: AutogradMeta
    timeout_seconds: float
    profile: ProfileRequest
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, message_id: _Optional[int] = ..., caller_id: _Optional[int] = ..., kind: _Optional[_Union[CallKind, str]] = ..., function: _Optional[str] = ..., rref_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., fork_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., target_rref_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., autograd: _Optional[_Union[AutogradMeta, _Mapping]] = ..., timeout_seconds: _Optional[float] = ..., profile: _Optional[_Union[ProfileRequest, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ReplyHeader(_message.Message):
    __slots__ = ("message_id", "error", "autograd", "continuation", "remote_ack", "control_response", "profile")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    AUTOGRAD_FIELD_NUMBER: _ClassVar[int]
    CONTINUATION_FIELD_NUMBER: _ClassVar[int]
    REMOTE_ACK_FIELD_NUMBER: _ClassVar[int]
    CONTROL_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    message_id: int
    error: RemoteException
    autograd: AutogradMeta
    continuation: int
    remote_ack: RemoteAck
    control_response: bytes
    profile: ProfileEvents
    def __init__(self, message_id: _Optional[int] = ..., error: _Optional[_Union[RemoteException, _Mapping]] = ..., autograd: _Optional[_Union[AutogradMeta, _Mapping]] = ..., continuation: _Optional[int] = ..., remote_ack: _Optional[_Union[RemoteAck, _Mapping]] = ..., control_response: _Optional[bytes] = ..., profile: _Optional[_Union[ProfileEvents, _Mapping]] = ...) -> None: ...

class ProfileWindow(_message.Message):
    __slots__ = ("seconds", "record_shapes")
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    RECORD_SHAPES_FIELD_NUMBER: _ClassVar[int]
    seconds: float
    record_shapes: bool
    def __init__(self, seconds: _Optional[float] = ..., record_shapes: bool = ...) -> None: ...

class ProfileDump(_message.Message):
    __slots__ = ("rank", "name", "started_ns", "ended_ns", "clock_ns", "events", "dropped")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STARTED_NS_FIELD_NUMBER: _ClassVar[int]
    ENDED_NS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_NS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    rank: int
    name: str
    started_ns: int
    ended_ns: int
    clock_ns: int
    events: _containers.RepeatedCompositeFieldContainer[ProfileEvent]
    dropped: int
    def __init__(self, rank: _Optional[int] = ..., name: _Optional[str] = ..., started_ns: _Optional[int] = ..., ended_ns: _Optional[int] = ..., clock_ns: _Optional[int] = ..., events: _Optional[_Iterable[_Union[ProfileEvent, _Mapping]]] = ..., dropped: _Optional[int] = ...) -> None: ...

class ProfileRequest(_message.Message):
    __slots__ = ("record_shapes", "profile_memory")
    RECORD_SHAPES_FIELD_NUMBER: _ClassVar[int]
    PROFILE_MEMORY_FIELD_NUMBER: _ClassVar[int]
    record_shapes: bool
    profile_memory: bool
    def __init__(self, record_shapes: bool = ..., profile_memory: bool = ...) -> None: ...

class Shape(_message.Message):
    __slots__ = ("dims",)
    DIMS_FIELD_NUMBER: _ClassVar[int]
    dims: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dims: _Optional[_Iterable[int]] = ...) -> None: ...

class ProfileEvent(_message.Message):
    __slots__ = ("name", "start_ns", "end_ns", "thread_id", "input_shapes", "cpu_memory_usage", "node_id", "sequence_nr", "kind", "flow")
    NAME_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHAPES_FIELD_NUMBER: _ClassVar[int]
    CPU_MEMORY_USAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_NR_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FLOW_FIELD_NUMBER: _ClassVar[int]
    name: str
    start_ns: int
    end_ns: int
    thread_id: int
    input_shapes: _containers.RepeatedCompositeFieldContainer[Shape]
    cpu_memory_usage: int
    node_id: int
    sequence_nr: int
    kind: str
    flow: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., thread_id: _Optional[int] = ..., input_shapes: _Optional[_Iterable[_Union[Shape, _Mapping]]] = ..., cpu_memory_usage: _Optional[int] = ..., node_id: _Optional[int] = ..., sequence_nr: _Optional[int] = ..., kind: _Optional[str] = ..., flow: _Optional[_Iterable[int]] = ...) -> None: ...

class ProfileEvents(_message.Message):
    __slots__ = ("events", "handled_start_ns", "handled_end_ns")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    HANDLED_START_NS_FIELD_NUMBER: _ClassVar[int]
    HANDLED_END_NS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[ProfileEvent]
    handled_start_ns: int
    handled_end_ns: int
    def __init__(self, events: _Optional[_Iterable[_Union[ProfileEvent, _Mapping]]] = ..., handled_start_ns: _Optional[int] = ..., handled_end_ns: _Optional[int] = ...) -> None: ...

class ControlRequest(_message.Message):
    __slots__ = ("message_id", "method", "request")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    message_id: int
    method: str
    request: bytes
    def __init__(self, message_id: _Optional[int] = ..., method: _Optional[str] = ..., request: _Optional[bytes] = ...) -> None: ...

class RemoteException(_message.Message):
    __slots__ = ("type_name", "message", "traceback", "worker", "pickled_args")
    TYPE_NAME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    PICKLED_ARGS_FIELD_NUMBER: _ClassVar[int]
    type_name: str
    message: str
    traceback: str
    worker: str
    pickled_args: bytes
    def __init__(self, type_name: _Optional[str] = ..., message: _Optional[str] = ..., traceback: _Optional[str] = ..., worker: _Optional[str] = ..., pickled_args: _Optional[bytes] = ...) -> None: ...

class FrameHeader(_message.Message):
    __slots__ = ("call", "reply", "fetch", "gradients", "fetch_request", "control", "payload", "offset", "last")
    CALL_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    FETCH_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    FETCH_REQUEST_FIELD_NUMBER: _ClassVar[int]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    call: CallHeader
    reply: ReplyHeader
    fetch: FetchHeader
    gradients: GradientsHeader
    fetch_request: FetchRequest
    control: ControlRequest
    payload: Payload
    offset: int
    last: bool
    def __init__(self, call: _Optional[_Union[CallHeader, _Mapping]] = ..., reply: _Optional[_Union[ReplyHeader, _Mapping]] = ..., fetch: _Optional[_Union[FetchHeader, _Mapping]] = ..., gradients: _Optional[_Union[GradientsHeader, _Mapping]] = ..., fetch_request: _Optional[_Union[FetchRequest, _Mapping]] = ..., control: _Optional[_Union[ControlRequest, _Mapping]] = ..., payload: _Optional[_Union[Payload, _Mapping]] = ..., offset: _Optional[int] = ..., last: bool = ...) -> None: ...

class RemoteAck(_message.Message):
    __slots__ = ("rref_id", "fork_id", "autograd", "error", "profile")
    RREF_ID_FIELD_NUMBER: _ClassVar[int]
    FORK_ID_FIELD_NUMBER: _ClassVar[int]
    AUTOGRAD_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    rref_id: GloballyUniqueId
    fork_id: GloballyUniqueId
    autograd: AutogradMeta
    error: RemoteException
    profile: ProfileEvents
    def __init__(self, rref_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., fork_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., autograd: _Optional[_Union[AutogradMeta, _Mapping]] = ..., error: _Optional[_Union[RemoteException, _Mapping]] = ..., profile: _Optional[_Union[ProfileEvents, _Mapping]] = ...) -> None: ...

class FetchHeader(_message.Message):
    __slots__ = ("rref_id", "error", "autograd", "continuation")
    RREF_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    AUTOGRAD_FIELD_NUMBER: _ClassVar[int]
    CONTINUATION_FIELD_NUMBER: _ClassVar[int]
    rref_id: GloballyUniqueId
    error: RemoteException
    autograd: AutogradMeta
    continuation: int
    def __init__(self, rref_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., error: _Optional[_Union[RemoteException, _Mapping]] = ..., autograd: _Optional[_Union[AutogradMeta, _Mapping]] = ..., continuation: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("rref_id", "fork_id", "caller_id", "autograd")
    RREF_ID_FIELD_NUMBER: _ClassVar[int]
    FORK_ID_FIELD_NUMBER: _ClassVar[int]
    CALLER_ID_FIELD_NUMBER: _ClassVar[int]
    AUTOGRAD_FIELD_NUMBER: _ClassVar[int]
    rref_id: GloballyUniqueId
    fork_id: GloballyUniqueId
    caller_id: int
    autograd: AutogradMeta
    def __init__(self, rref_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., fork_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., caller_id: _Optional[int] = ..., autograd: _Optional[_Union[AutogradMeta, _Mapping]] = ...) -> None: ...

class ForkRequest(_message.Message):
    __slots__ = ("rref_id", "fork_id", "child_id", "parent_id")
    RREF_ID_FIELD_NUMBER: _ClassVar[int]
    FORK_ID_FIELD_NUMBER: _ClassVar[int]
    CHILD_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    rref_id: GloballyUniqueId
    fork_id: GloballyUniqueId
    child_id: int
    parent_id: int
    def __init__(self, rref_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., fork_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., child_id: _Optional[int] = ..., parent_id: _Optional[int] = ...) -> None: ...

class ForkAccepted(_message.Message):
    __slots__ = ("rref_id", "fork_id", "known")
    RREF_ID_FIELD_NUMBER: _ClassVar[int]
    FORK_ID_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    rref_id: GloballyUniqueId
    fork_id: GloballyUniqueId
    known: bool
    def __init__(self, rref_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., fork_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., known: bool = ...) -> None: ...

class ChildAck(_message.Message):
    __slots__ = ("rref_id", "fork_id", "child_id")
    RREF_ID_FIELD_NUMBER: _ClassVar[int]
    FORK_ID_FIELD_NUMBER: _ClassVar[int]
    CHILD_ID_FIELD_NUMBER: _ClassVar[int]
    rref_id: GloballyUniqueId
    fork_id: GloballyUniqueId
    child_id: int
    def __init__(self, rref_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., fork_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., child_id: _Optional[int] = ...) -> None: ...

class RRefDelete(_message.Message):
    __slots__ = ("rref_id", "fork_id", "user_id")
    RREF_ID_FIELD_NUMBER: _ClassVar[int]
    FORK_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    rref_id: GloballyUniqueId
    fork_id: GloballyUniqueId
    user_id: int
    def __init__(self, rref_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., fork_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., user_id: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GradientsHeader(_message.Message):
    __slots__ = ("context_id", "message_id", "sender_id", "retain_graph", "pass_id")
    CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_ID_FIELD_NUMBER: _ClassVar[int]
    RETAIN_GRAPH_FIELD_NUMBER: _ClassVar[int]
    PASS_ID_FIELD_NUMBER: _ClassVar[int]
    context_id: int
    message_id: GloballyUniqueId
    sender_id: int
    retain_graph: bool
    pass_id: int
    def __init__(self, context_id: _Optional[int] = ..., message_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., sender_id: _Optional[int] = ..., retain_graph: bool = ..., pass_id: _Optional[int] = ...) -> None: ...

class GradientsAck(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: RemoteException
    def __init__(self, error: _Optional[_Union[RemoteException, _Mapping]] = ...) -> None: ...

class ReleaseContextRequest(_message.Message):
    __slots__ = ("context_id", "sender_id")
    CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_ID_FIELD_NUMBER: _ClassVar[int]
    context_id: int
    sender_id: int
    def __init__(self, context_id: _Optional[int] = ..., sender_id: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("worker", "world_size", "assign_rank")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_RANK_FIELD_NUMBER: _ClassVar[int]
    worker: WorkerInfo
    world_size: int
    assign_rank: bool
    def __init__(self, worker: _Optional[_Union[WorkerInfo, _Mapping]] = ..., world_size: _Optional[int] = ..., assign_rank: bool = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("workers", "session", "token", "rank")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    session: str
    token: str
    rank: int
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ..., session: _Optional[str] = ..., token: _Optional[str] = ..., rank: _Optional[int] = ...) -> None: ...

class FetchReplyRequest(_message.Message):
    __slots__ = ("continuation", "caller_id")
    CONTINUATION_FIELD_NUMBER: _ClassVar[int]
    CALLER_ID_FIELD_NUMBER: _ClassVar[int]
    continuation: int
    caller_id: int
    def __init__(self, continuation: _Optional[int] = ..., caller_id: _Optional[int] = ...) -> None: ...

class BarrierRequest(_message.Message):
    __slots__ = ("name", "worker_id", "generation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    worker_id: int
    generation: int
    def __init__(self, name: _Optional[str] = ..., worker_id: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class BarrierReply(_message.Message):
    __slots__ = ("ok", "missing")
    OK_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    missing: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ok: bool = ..., missing: _Optional[_Iterable[str]] = ...) -> None: ...

class MemberUpdate(_message.Message):
    __slots__ = ("kind", "worker")
    KIND_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    kind: str
    worker: WorkerInfo
    def __init__(self, kind: _Optional[str] = ..., worker: _Optional[_Union[WorkerInfo, _Mapping]] = ...) -> None: ...

class MemberList(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class DebugInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PeerState(_message.Message):
    __slots__ = ("name", "id", "address", "channel_state", "fast_lane_address", "bulk_address")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_STATE_FIELD_NUMBER: _ClassVar[int]
    FAST_LANE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BULK_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    id: int
    address: str
    channel_state: str
    fast_lane_address: str
    bulk_address: str
    def __init__(self, name: _Optional[str] = ..., id: _Optional[int] = ..., address: _Optional[str] = ..., channel_state: _Optional[str] = ..., fast_lane_address: _Optional[str] = ..., bulk_address: _Optional[str] = ...) -> None: ...

class DebugInfo(_message.Message):
    __slots__ = ("worker", "worker_id", "state", "calls_served", "calls_in_flight", "calls_failed", "peers", "num_owner_rrefs", "num_pending_users", "num_pending_children", "num_forks", "num_autograd_contexts", "extra")
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CALLS_SERVED_FIELD_NUMBER: _ClassVar[int]
    CALLS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    CALLS_FAILED_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    NUM_OWNER_RREFS_FIELD_NUMBER: _ClassVar[int]
    NUM_PENDING_USERS_FIELD_NUMBER: _ClassVar[int]
    NUM_PENDING_CHILDREN_FIELD_NUMBER: _ClassVar[int]
    NUM_FORKS_FIELD_NUMBER: _ClassVar[int]
    NUM_AUTOGRAD_CONTEXTS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    worker: str
    worker_id: int
    state: str
    calls_served: int
    calls_in_flight: int
    calls_failed: int
    peers: _containers.RepeatedCompositeFieldContainer[PeerState]
    num_owner_rrefs: int
    num_pending_users: int
    num_pending_children: int
    num_forks: int
    num_autograd_contexts: int
    extra: _containers.ScalarMap[str, str]
    def __init__(self, worker: _Optional[str] = ..., worker_id: _Optional[int] = ..., state: _Optional[str] = ..., calls_served: _Optional[int] = ..., calls_in_flight: _Optional[int] = ..., calls_failed: _Optional[int] = ..., peers: _Optional[_Iterable[_Union[PeerState, _Mapping]]] = ..., num_owner_rrefs: _Optional[int] = ..., num_pending_users: _Optional[int] = ..., num_pending_children: _Optional[int] = ..., num_forks: _Optional[int] = ..., num_autograd_contexts: _Optional[int] = ..., extra: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("kinds",)
    KINDS_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kinds: _Optional[_Iterable[str]] = ...) -> None: ...

class ControlEvent(_message.Message):
    __slots__ = ("kind", "direction", "rref_id", "fork_id", "peer", "time", "context_id")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    RREF_ID_FIELD_NUMBER: _ClassVar[int]
    FORK_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    kind: str
    direction: str
    rref_id: GloballyUniqueId
    fork_id: GloballyUniqueId
    peer: str
    time: float
    context_id: int
    def __init__(self, kind: _Optional[str] = ..., direction: _Optional[str] = ..., rref_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., fork_id: _Optional[_Union[GloballyUniqueId, _Mapping]] = ..., peer: _Optional[str] = ..., time: _Optional[float] = ..., context_id: _Optional[int] = ...) -> None: ...
