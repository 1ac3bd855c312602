"""gradwire.distributed.nn: modules that live on another worker (``RemoteModule``)."""

from __future__ import annotations

from .remote_module import RemoteModule

__all__ = ["RemoteModule"]
