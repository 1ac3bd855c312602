"""L3 runtime: the agent, transport, RRef context and dist-autograd glue (no public API)."""

from .transport import shm_route  # noqa: F401 - installs the same-host shared-memory route into the wire
