"""``RemoteModule``: an ``nn.Module`` created on a remote worker and run there.

The module lives on its worker as the value of an OwnerRRef (``module_rref``); ``forward``
calls its ``forward`` through that RRef (an RRef proxy call, so the callee's callable policy
judges the module's class and method), and inside a distributed autograd context the call
is recorded like any RPC: gradients flow back to the remote parameters, which
``remote_parameters()`` hands out as RRefs for ``DistributedOptimizer``.
"""

from __future__ import annotations

import re
from typing import Any

from ..._backend import Device
from ...futures import Future
from ...nn.modules import Module
from .. import rpc

__all__ = ["RemoteModule"]

_RANK_RE = re.compile(r"rank:(\d+)\Z")
_FORMAT = "'<workername>/<device>', '<workername>', 'rank:<rank>/<device>' or 'rank:<rank>'"


def _parse_remote_device(remote_device: Any) -> tuple[str | int, Device]:
    """``"worker1/cuda:0"`` -> ("worker1", cuda:0); ``"rank:1"`` -> (1, cpu)."""
    if not isinstance(remote_device, str):
        raise ValueError(
            f"remote_device must be a string like 'worker1/cpu', got "
            f"{type(remote_device).__name__} {remote_device!r}"
        )
    parts = remote_device.split("/")
    if len(parts) > 2 or not parts[0].strip():
        raise ValueError(
            f"Could not parse remote_device: {remote_device!r}. The valid format is {_FORMAT}"
        )
    worker = parts[0].strip()
    try:
        device = Device(parts[1] if len(parts) == 2 else "cpu")
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"Could not parse remote_device: {remote_device!r}: unknown device "
            f"{parts[1]!r} (expected 'cpu', 'cuda' or 'cuda:N'). The valid format is {_FORMAT}"
        ) from exc
    if worker.startswith("rank:"):
        m = _RANK_RE.match(worker)
        if m is None:
            raise ValueError(
                f"Could not parse remote_device: {remote_device!r}: the rank in {worker!r} is "
                f"not a non-negative integer. The valid format is {_FORMAT}"
            )
        return int(m.group(1)), device
    return worker, device


def _ready_module(module_rref: Any, device: str) -> None:
    """On the owner: wait for the module's creation (raising its error), check it is a
    Module, and move it to ``device`` (in place: its parameters stay the same objects)."""
    module = _local_module(module_rref, "create a remote module")
    # A peer chooses ``device``: only a device string reaches Module.to (never a dtype or a
    # tensor, which would convert the module in other ways).
    if not isinstance(device, str):
        raise TypeError(
            f"RemoteModule's device must be a device string like 'cpu' or 'cuda:0', got "
            f"{type(device).__name__}"
        )
    if device != "cpu":
        module.to(Device(device))


def _param_rrefs(module_rref: Any, recurse: bool) -> list[Any]:
    """On the owner: an RRef (owned here) to each parameter of the module."""
    module = _local_module(module_rref, "list remote parameters")
    return [rpc.RRef(p) for p in module.parameters(recurse=bool(recurse))]


def _local_module(module_rref: Any, what: str) -> Module:
    # A peer names these helpers: they act only on a module held by an RRef owned here.
    value = module_rref.local_value() if isinstance(module_rref, rpc.RRef) else None
    if not isinstance(value, Module):
        raise TypeError(
            f"to {what}, RemoteModule needs the RRef of an nn.Module owned by this worker, got "
            f"{type(value if value is not None else module_rref).__name__} (module_cls must "
            "be an nn.Module subclass)"
        )
    return value


class RemoteModule(Module):
    """A module created on a remote worker whose ``forward`` runs there (PyTorch's
    ``torch.distributed.nn.RemoteModule`` contract).

    Args:
        remote_device: where to create the module: ``"<workername>/<device>"``,
            ``"<workername>"`` (on the CPU) or ``"rank:<rank>/<device>"``, e.g.
            ``"worker1/cpu"``, ``"rank:0/cuda:1"``. A CUDA device is passed to the remote
            module's ``.to()``.
        module_cls: the ``nn.Module`` class to instantiate on that worker; it must be
            runnable under the callee's callable policy (the program's own classes are,
            gradwire's ``nn`` classes are by the reviewed lists).
        args: positional arguments of ``module_cls``.
        kwargs: keyword arguments of ``module_cls``.

    Raises:
        ValueError: ``remote_device`` cannot be parsed (the message gives the valid formats).
        RpcNotInitializedError: RPC is not running.
        Exception: the error of ``module_cls(*args, **kwargs)`` on the remote worker (its
            type is kept; the message names the worker).

    Example:
        >>> remote_linear = RemoteModule("worker1/cpu", nn.Linear, args=(20, 30))
        >>> out = remote_linear(gradwire.randn(128, 20))
        >>> opt = DistributedOptimizer(optim.SGD, remote_linear.remote_parameters(), lr=0.05)
    """

    def __init__(
        self,
        remote_device: str,
        module_cls: type[Module],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        to, device = _parse_remote_device(remote_device)
        if not isinstance(module_cls, type):
            raise TypeError(
                f"RemoteModule needs a module class to instantiate remotely, got "
                f"{type(module_cls).__name__} {module_cls!r}"
            )
        rref = rpc.remote(to, module_cls, tuple(args or ()), dict(kwargs or {}))
        self.on = rref.owner_name()  # the worker's name, also when given by rank
        self.device = str(device)
        # Synchronous, as in PyTorch: a constructor error surfaces here, with its type.
        rpc.rpc_sync(self.on, _ready_module, (rref, self.device))
        self.module_rref = rref

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the remote module's ``forward`` on its worker and return its result.

        Raises:
            Exception: what the remote ``forward`` raised (its type kept), or an RPC error.
        """
        return self.module_rref.rpc_sync().forward(*args, **kwargs)

    def forward_async(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Start the remote module's ``forward``; return a Future of its result.

        Returns:
            A ``gradwire.futures.Future``; ``wait()`` raises what :meth:`forward` would.
        """
        fut: Future[Any] = self.module_rref.rpc_async().forward(*args, **kwargs)
        return fut

    def remote_parameters(self, recurse: bool = True) -> list[rpc.RRef[Any]]:
        """RRefs to the remote module's parameters (for ``DistributedOptimizer``).

        Args:
            recurse: include the parameters of submodules.

        Returns:
            One RRef (owned by the module's worker) per parameter.
        """
        result: list[rpc.RRef[Any]] = rpc.rpc_sync(
            self.on, _param_rrefs, (self.module_rref, recurse)
        )
        return result

    def get_module_rref(self) -> rpc.RRef[Any]:
        """The RRef of the remote module (owned by its worker)."""
        return self.module_rref

    def extra_repr(self) -> str:
        return f"on={self.on!r}, device={self.device!r}"

    # The parameters live on the remote worker: local views of them are refused, as in PyTorch.
    def _unsupported(self, method: str) -> Any:
        raise ValueError(
            f"Method ``{method}`` not supported for RemoteModule: the module lives on worker "
            f"{self.on!r}; use remote_parameters() for its parameters, or call the method "
            "through get_module_rref() (e.g. get_module_rref().rpc_sync().state_dict())"
        )

    def parameters(self, recurse: bool = True) -> Any:
        return self._unsupported("parameters")

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:
        return self._unsupported("named_parameters")

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._unsupported("state_dict")

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._unsupported("load_state_dict")

    def to(self, *args: Any, **kwargs: Any) -> Any:
        return self._unsupported("to")

    def cuda(self, device: int | str | None = None) -> Any:
        return self._unsupported("cuda")

    def cpu(self) -> Any:
        return self._unsupported("cpu")
