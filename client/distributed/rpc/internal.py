"""PyTorch's ``torch.distributed.rpc.internal`` names that programs and tests use.

``_internal_rpc_pickler`` pickles an object with its tensors moved into a side table, as the
pickler of RPC payloads does, and unpickles under this worker's callable policy (the globals a
pickle may name are judged exactly as those of a received payload are: no arbitrary global is
ever loaded). ``PythonUDF`` is PyTorch's record of a call.

Example:
    >>> data, tensors = _internal_rpc_pickler.serialize(PythonUDF(gradwire.add, (x, 1), None))
    >>> _internal_rpc_pickler.deserialize(data, tensors).func is gradwire.add
    True
"""

from __future__ import annotations

import enum
import io
import pickle
from collections import namedtuple
from typing import Any

from ..._runtime import agent as _agent
from ..._runtime.calls.profiling import rpc_key
from ..._tensor import Tensor
from ..._wire import guard, integrity
from ..._wire.pickler import PROTOCOL, integrity_refusal, resolve_global
from ..._wire.policy import CallablePolicy
from ...errors import PolicyError, RRefError, SerializationError
from .rref import RRef

__all__ = [
    "RPCExecMode",
    "PythonUDF",
    "_build_rpc_profiling_key",
    "_internal_rpc_pickler",
    "_InternalRPCPickler",
    "serialize",
    "deserialize",
]


class RPCExecMode(enum.Enum):
    """How a call is made: ``rpc_sync``, ``rpc_async``, ``rpc_async`` of TorchScript, ``remote``."""

    SYNC = "sync"
    ASYNC = "async"
    ASYNC_JIT = "async_jit"
    REMOTE = "remote"


def _build_rpc_profiling_key(
    exec_type: RPCExecMode, func_name: str, current_worker_name: str, dst_worker_name: str
) -> str:
    """PyTorch's profiling key of an RPC: ``rpc_{mode}#{function}({src} -> {dst})``, the name
    of its event in ``gradwire.autograd.profiler``."""
    return rpc_key(exec_type.value, func_name, current_worker_name, dst_worker_name)


#: A Python call: the function, its positional and its keyword arguments (PyTorch's record).
PythonUDF = namedtuple("PythonUDF", ["func", "args", "kwargs"])
PythonUDF.__module__ = __name__

_TENSOR = "tensor"


class _TablePickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, table: list[Tensor]) -> None:
        super().__init__(file, protocol=PROTOCOL)
        self._table = table

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Tensor):
            self._table.append(obj)
            return (_TENSOR, len(self._table) - 1)
        if isinstance(obj, RRef):
            obj._live("sending an RRef")  # PyTorch's error for a UserRRef deleted by shutdown
            raise RRefError(
                f"cannot serialize {obj!r} outside an RPC: gradwire forks an RRef for the "
                "worker a payload goes to, so an RRef travels only as an argument or return "
                "value of rpc_sync / rpc_async / remote"
            )
        return None


class _Table:
    """``find_class`` by the policy and tensors from the table, for both unpicklers."""

    def __init__(
        self, file: io.BytesIO, table: list[Any], policy: CallablePolicy, worker: str
    ) -> None:
        super().__init__(file)  # type: ignore[call-arg]
        self._table = table
        self._policy = policy
        self._worker = worker

    def resolve_global(self, module: str, name: str) -> Any:
        return resolve_global(self._policy, module, name, self._worker)

    def find_class(self, module: str, name: str) -> Any:
        return self.resolve_global(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if (
            isinstance(pid, tuple)
            and len(pid) == 2
            and pid[0] == _TENSOR
            and isinstance(pid[1], int)
            and 0 <= pid[1] < len(self._table)
        ):
            return self._table[pid[1]]
        raise SerializationError(f"unknown tensor table reference {pid!r} in the pickle")


class _TableUnpickler(_Table, pickle.Unpickler):
    pass


class _CheckedTableUnpickler(_Table, integrity.CheckedUnpickler):
    def find_class(self, module: str, name: str) -> Any:
        return integrity.CheckedUnpickler.find_class(self, module, name)


class _InternalRPCPickler:
    """PyTorch's ``_internal_rpc_pickler``: ``serialize`` / ``deserialize`` with a tensor table."""

    def serialize(self, obj: Any) -> tuple[bytes, list[Tensor]]:
        """Pickle ``obj``; its tensors go to the returned table instead of the pickle.

        Returns:
            ``(pickled bytes, tensors)``.

        Raises:
            SerializationError: ``obj`` cannot be pickled.
            RRefError: ``obj`` holds an RRef (it travels only inside an RPC).
        """
        table: list[Tensor] = []
        buf = io.BytesIO()
        try:
            _TablePickler(buf, table).dump(obj)
        except RRefError:
            raise
        except Exception as exc:
            raise SerializationError(f"cannot serialize: {type(exc).__name__}: {exc}") from exc
        return buf.getvalue(), table

    def deserialize(self, binary_data: bytes, tensor_table: list[Any]) -> Any:
        """Unpickle what :meth:`serialize` made, under this worker's callable policy (the
        default policy when RPC is not running).

        Raises:
            PolicyError: the pickle names a global the policy refuses.
            SerializationError: the pickle is malformed or names what does not resolve.
        """
        agent = _agent.current_or_none()
        if agent is not None:
            policy, worker = agent.policy, agent.name
        else:
            from ..._runtime.cluster.options import GrpcRpcBackendOptions

            policy, worker = GrpcRpcBackendOptions().policy(), ""
        try:
            checked = not policy.trust_everything and integrity.scan(
                binary_data, lambda module, name: resolve_global(policy, module, name, worker)
            )
            unpickler = (_CheckedTableUnpickler if checked else _TableUnpickler)(
                io.BytesIO(binary_data), list(tensor_table), policy, worker
            )
            if not policy.guarded:
                return unpickler.load()
            with guard.guarded("unpickling with _internal_rpc_pickler", worker):
                return unpickler.load()
        except integrity.Mutation as exc:
            raise integrity_refusal(exc, "", worker) from None
        except (PolicyError, SerializationError):
            raise
        except Exception as exc:
            raise SerializationError(f"cannot deserialize: {type(exc).__name__}: {exc}") from exc


#: The pickler ``rpc.api`` names as its default (PyTorch's).
_internal_rpc_pickler = _InternalRPCPickler()


def serialize(obj: Any) -> tuple[bytes, list[Tensor]]:
    """``_internal_rpc_pickler.serialize(obj)`` (PyTorch's module-level name)."""
    return _internal_rpc_pickler.serialize(obj)


def deserialize(binary_data: bytes, tensor_table: list[Any]) -> Any:
    """``_internal_rpc_pickler.deserialize(binary_data, tensor_table)`` (PyTorch's name)."""
    return _internal_rpc_pickler.deserialize(binary_data, tensor_table)
