"""What PyTorch's RPC tests import from ``torch.testing._internal``, for the torchsuite harness.

The rewritten test files (``torchsuite.rewrite``) import these modules instead of torch's own:
``common_distributed`` and ``common_utils`` (the few helpers the tests use), ``dist_utils``
(``dist_init`` and the wait helpers), ``rpc_agent_test_fixture`` (the fixture: world size, rank,
init method, backend options for the implementation under test) and ``imports`` (how the
rewritten ``import torch...`` lines bind names). ``IMPL`` says which implementation runs:
``"gradwire"`` (torch's names mapped onto gradwire's modules) or ``"torch"`` (torch itself,
which proves the harness).
"""

from __future__ import annotations

import os

__all__ = ["IMPL"]

#: The implementation under test in this process, from ``$TORCHSUITE_IMPL``.
IMPL = os.environ.get("TORCHSUITE_IMPL", "gradwire")
