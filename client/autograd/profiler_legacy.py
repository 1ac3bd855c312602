"""PyTorch's ``torch.autograd.profiler_legacy``: its ``profile`` is gradwire's one profiler
(:mod:`gradwire.autograd.profiler`)."""

from __future__ import annotations

from .profiler import profile

__all__ = ["profile"]
