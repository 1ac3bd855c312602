"""The one place where the tutorials differ from the PyTorch programs they follow: the imports.

Every program in this folder imports ``torch`` and its RPC modules from here. By default they are
gradwire's; with ``GRADWIRE_TUTORIAL_TORCH=1`` they are PyTorch's, so the same program runs on
both (``tests/examples/test_rpc_tutorials.py`` runs each one on gradwire, and on PyTorch too where
it imports).
"""

from __future__ import annotations

import os
import socket

if os.environ.get("GRADWIRE_TUTORIAL_TORCH"):
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp
    import torch.nn.functional as F
    from torch import futures, nn, optim
    from torch.distributed.nn import RemoteModule
    from torch.distributed.optim import DistributedOptimizer
    from torch.distributions import Categorical
else:
    import gradwire as torch
    import gradwire.distributed.autograd as dist_autograd
    import gradwire.distributed.rpc as rpc
    import gradwire.multiprocessing as mp
    import gradwire.nn.functional as F
    from gradwire import futures, nn, optim
    from gradwire.distributed.nn import RemoteModule
    from gradwire.distributed.optim import DistributedOptimizer
    from gradwire.distributions import Categorical

__all__ = [
    "torch",
    "dist_autograd",
    "rpc",
    "mp",
    "F",
    "futures",
    "nn",
    "optim",
    "RemoteModule",
    "DistributedOptimizer",
    "Categorical",
    "launch",
]


def launch(run_worker, world_size: int, *args) -> None:
    """Start ``world_size`` processes running ``run_worker(rank, world_size, *args)`` with
    ``MASTER_ADDR``/``MASTER_PORT`` set to a free local port, as the tutorials' ``mp.spawn`` does."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    mp.spawn(run_worker, args=(world_size, *args), nprocs=world_size, join=True)
