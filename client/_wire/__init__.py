"""L2 wire: serialization only (framing, pickler with side tables, tensors, exceptions, policy).

Nothing here touches sockets or gRPC; the transport never looks inside payloads.
"""

from __future__ import annotations

__all__: list[str] = []
