"""PyTorch's ``torch.distributed.rpc.internal`` names that programs and tests use.

Example:
    >>> from gradwire.distributed.rpc.internal import RPCExecMode
    >>> RPCExecMode.SYNC.value
    'sync'
"""

from __future__ import annotations

import enum

__all__ = ["RPCExecMode"]


class RPCExecMode(enum.Enum):
    """How a call is made: ``rpc_sync``, ``rpc_async``, ``rpc_async`` of TorchScript, ``remote``."""

    SYNC = "sync"
    ASYNC = "async"
    ASYNC_JIT = "async_jit"
    REMOTE = "remote"
