"""gradwire.distributed.optim: optimizers whose parameters live on several workers."""

from __future__ import annotations

from .optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer"]
