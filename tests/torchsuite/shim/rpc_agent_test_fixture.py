"""The fixture of PyTorch's RPC tests, for the implementation under test.

PyTorch's tests are written against ``RpcAgentTestFixture`` and run through a concrete agent
fixture (TensorPipe's). This one is that concrete fixture: world size 4, the backend and its
options, the init method (``file://`` in the test's scratch folder, as PyTorch's own, on both
implementations) and the error regexes the tests match. The runner sets ``rank``,
``file_name`` and the environment (``TORCHSUITE_PORT``, ``TORCHSUITE_SCRATCH``) of every
process.
"""

from __future__ import annotations

from typing import Any

from . import IMPL
from .common_utils import FILE_SCHEMA

__all__ = ["RpcAgentTestFixture", "TensorPipeRpcAgentTestFixture"]


class RpcAgentTestFixture:
    file_name: str

    @property
    def world_size(self) -> int:
        return 4

    @property
    def init_method(self) -> str:
        return self.file_init_method

    @property
    def file_init_method(self) -> str:
        return FILE_SCHEMA + self.file_name

    @property
    def rpc_backend(self) -> Any:
        import torch.distributed.rpc as rpc  # noqa: F401 - see below

        return rpc.backend_registry.BackendType["TENSORPIPE"]

    @property
    def rpc_backend_options(self) -> Any:
        import torch.distributed.rpc as rpc

        return rpc.backend_registry.construct_rpc_backend_options(
            self.rpc_backend, init_method=self.init_method, _transports=None
        )

    def setup_fault_injection(self, faulty_messages: Any, messages_to_delay: Any) -> None:
        """Only the faulty agent (not applicable) injects faults."""

    def get_shutdown_error_regex(self) -> str:
        return "(.*)"

    def get_timeout_error_regex(self) -> str:
        return "RPC ran for more than"


class _GradwireFixture(RpcAgentTestFixture):
    @property
    def rpc_backend(self) -> Any:
        import gradwire.distributed.rpc as rpc

        return rpc.BackendType.TENSORPIPE

    @property
    def rpc_backend_options(self) -> Any:
        import gradwire.distributed.rpc as rpc

        # rref_leak_check="error" is what PyTorch's dist_init asks with _ignore_rref_leak=False.
        return rpc.TensorPipeRpcBackendOptions(
            init_method=self.init_method, rref_leak_check="error"
        )


if IMPL != "torch":
    RpcAgentTestFixture = _GradwireFixture  # type: ignore[misc]

TensorPipeRpcAgentTestFixture = RpcAgentTestFixture
