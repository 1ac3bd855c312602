"""gradwire.distributed: rpc, autograd and optim across workers, and ``profile_cluster`` (one
profile of every worker, merged into one timeline: :mod:`gradwire.distributed.profile`)."""

from __future__ import annotations

from typing import Any

__all__ = ["profile_cluster"]


def __getattr__(name: str) -> Any:
    if name == "profile_cluster":  # imported on first use: it needs the RPC layer
        from .profile import profile_cluster

        return profile_cluster
    raise AttributeError(f"module 'gradwire.distributed' has no attribute {name!r}")
