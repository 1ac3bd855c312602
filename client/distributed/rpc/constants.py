"""PyTorch's ``torch.distributed.rpc.constants``: the defaults of gradwire's RPC options.

Example:
    >>> rpc.constants.DEFAULT_RPC_TIMEOUT_SEC
    60.0
"""

from __future__ import annotations

from ..._runtime.cluster.options import DEFAULT_RPC_TIMEOUT, UNSET_RPC_TIMEOUT

__all__ = [
    "DEFAULT_RPC_TIMEOUT_SEC",
    "UNSET_RPC_TIMEOUT",
    "DEFAULT_INIT_METHOD",
    "DEFAULT_NUM_WORKER_THREADS",
]

#: The default timeout of a call, seconds (``GrpcRpcBackendOptions.rpc_timeout``).
DEFAULT_RPC_TIMEOUT_SEC = DEFAULT_RPC_TIMEOUT
#: The default rendezvous (``GrpcRpcBackendOptions.init_method``).
DEFAULT_INIT_METHOD = "env://"
#: The default serving threads (``GrpcRpcBackendOptions.num_worker_threads``).
DEFAULT_NUM_WORKER_THREADS = 16
