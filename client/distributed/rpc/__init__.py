"""gradwire.distributed.rpc: call functions on other workers, every worker a gRPC service.

Example:
    >>> import gradwire.distributed.rpc as rpc
    >>> rpc.init_rpc("worker0", rank=0, world_size=2)
    >>> rpc.rpc_sync("worker1", operator.add, (1, 2))
    3
    >>> rpc.shutdown()
"""

from __future__ import annotations

from ..._runtime.cluster.options import (
    BackendType,
    GrpcRpcBackendOptions,
    RpcBackendOptions,
    TensorPipeRpcBackendOptions,
)
from ..._runtime.cluster.workers import WorkerInfo
from . import constants, functions
from .api import (
    _get_current_rpc_agent,
    _get_debug_info,
    _rref_context_get_debug_info,
    _set_rpc_timeout,
    get_debug_info,
    get_rpc_timeout,
    get_worker_info,
    get_worker_infos,
    init_rpc,
    is_available,
    is_initialized,
    remote,
    rpc_async,
    rpc_sync,
    set_rpc_timeout,
    shutdown,
)
from .rref import RRef
from .server_process_global_profiler import _server_process_global_profile

__all__ = [
    "init_rpc",
    "shutdown",
    "rpc_sync",
    "rpc_async",
    "remote",
    "RRef",
    "get_worker_info",
    "get_worker_infos",
    "get_rpc_timeout",
    "set_rpc_timeout",
    "get_debug_info",
    "is_available",
    "is_initialized",
    "WorkerInfo",
    "GrpcRpcBackendOptions",
    "RpcBackendOptions",
    "TensorPipeRpcBackendOptions",
    "BackendType",
    "functions",
    "constants",
    "_set_rpc_timeout",
    "_rref_context_get_debug_info",
    "_get_current_rpc_agent",
    "_get_debug_info",
    "_server_process_global_profile",
]
