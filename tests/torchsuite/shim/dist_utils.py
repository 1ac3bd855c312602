"""``dist_init`` and the helpers PyTorch's RPC tests import from ``torch.testing._internal.dist_utils``.

The same logic as PyTorch's, over the implementation under test (``torch`` resolves through
``imports.module``): ``dist_init`` starts RPC as ``worker{rank}`` with the fixture's backend and
options, runs the test body, and shuts RPC down (gracefully unless ``clean_shutdown=False``).
"""

from __future__ import annotations

import re
import time
from functools import partial, wraps
from typing import Any

from . import IMPL
from .common_utils import FILE_SCHEMA
from .imports import module

__all__ = [
    "INIT_METHOD_TEMPLATE",
    "dist_init",
    "noop",
    "wait_until_node_failure",
    "wait_until_pending_futures_and_users_flushed",
    "get_num_owners_and_forks",
    "wait_until_owners_and_forks_on_rank",
    "initialize_pg",
    "worker_name",
    "get_function_event",
]

INIT_METHOD_TEMPLATE = FILE_SCHEMA + "{file_name}"


def _rpc() -> Any:
    return module("torch.distributed.rpc")


def dist_init(
    old_test_method: Any = None,
    setup_rpc: bool = True,
    clean_shutdown: bool = True,
    faulty_messages: Any = None,
    messages_to_delay: Any = None,
) -> Any:
    """Run the decorated test between ``init_rpc`` and ``shutdown`` (PyTorch's decorator)."""
    if old_test_method is None:
        return partial(
            dist_init,
            setup_rpc=setup_rpc,
            clean_shutdown=clean_shutdown,
            faulty_messages=faulty_messages,
            messages_to_delay=messages_to_delay,
        )

    @wraps(old_test_method)
    def new_test_method(self: Any, *arg: Any, **kwargs: Any) -> Any:
        rpc = _rpc()
        if IMPL == "torch":
            module("torch.distributed.rpc.api")._ignore_rref_leak = False
        self.worker_id = self.rank
        self.setup_fault_injection(faulty_messages, messages_to_delay)
        rpc_backend_options = self.rpc_backend_options
        if setup_rpc:
            rpc.init_rpc(
                name=f"worker{self.rank:d}",
                backend=self.rpc_backend,
                rank=self.rank,
                world_size=self.world_size,
                rpc_backend_options=rpc_backend_options,
            )
        return_value = old_test_method(self, *arg, **kwargs)
        if setup_rpc:
            rpc.shutdown(graceful=clean_shutdown)
        return return_value

    return new_test_method


def noop() -> None:
    pass


def wait_until_node_failure(rank: int, expected_error_regex: str = ".*") -> str:
    while True:
        try:
            _rpc().rpc_sync(f"worker{rank}", noop, args=())
            time.sleep(0.1)
        except Exception as e:
            if re.search(pattern=expected_error_regex, string=str(e)):
                return str(e)


def wait_until_pending_futures_and_users_flushed(timeout: int = 20) -> None:
    start = time.time()
    while True:
        debug_info = _rpc()._rref_context_get_debug_info()
        num_pending_futures = int(debug_info["num_pending_futures"])
        num_pending_users = int(debug_info["num_pending_users"])
        if num_pending_futures == 0 and num_pending_users == 0:
            break
        time.sleep(0.1)
        if time.time() - start > timeout:
            raise ValueError(
                f"Timed out waiting to flush pending futures and users, had "
                f"{num_pending_futures} pending futures and {num_pending_users} pending users"
            )


def get_num_owners_and_forks() -> tuple[str, str]:
    rref_dbg_info = _rpc()._rref_context_get_debug_info()
    return rref_dbg_info["num_owner_rrefs"], rref_dbg_info["num_forks"]


def wait_until_owners_and_forks_on_rank(
    num_owners: int, num_forks: int, rank: int, timeout: int = 20
) -> None:
    start = time.time()
    while True:
        num_owners_on_rank, num_forks_on_rank = _rpc().rpc_sync(
            worker_name(rank), get_num_owners_and_forks, args=(), timeout=5
        )
        if int(num_owners_on_rank) == num_owners and int(num_forks_on_rank) == num_forks:
            return
        time.sleep(1)
        if time.time() - start > timeout:
            raise ValueError(
                f"Timed out waiting {timeout} sec for {num_owners} owners and {num_forks} forks "
                f"on rank, had {num_owners_on_rank} owners and {num_forks_on_rank} forks"
            )


def initialize_pg(init_method: str, rank: int, world_size: int) -> None:
    dist = module("torch.distributed")
    if not dist.is_initialized():
        dist.init_process_group(
            backend="gloo", init_method=init_method, rank=rank, world_size=world_size
        )


def worker_name(rank: int) -> str:
    return f"worker{rank}"


def get_function_event(function_events: Any, partial_event_name: str) -> Any:
    return next(event for event in function_events if partial_event_name in event.name)
