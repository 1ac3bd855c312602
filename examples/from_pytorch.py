"""A program written for PyTorch's RPC, running on gradwire with only its imports changed.

A parameter server owns a linear model; two trainers fit it to y = 3x + 2 with distributed
autograd and a DistributedOptimizer, using remote(), rpc_sync(), rpc_async() futures and RRef
proxies as PyTorch's RPC tutorials do.

    python examples/from_pytorch.py                         # on gradwire
    FROM_PYTORCH_USE_TORCH=1 python examples/from_pytorch.py    # the same code on PyTorch

The block below is the only difference between the two: PyTorch's imports, or gradwire's.
"""

import os
import socket
import sys

if os.environ.get("FROM_PYTORCH_USE_TORCH"):
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp
    from torch import nn, optim
    from torch.distributed.optim import DistributedOptimizer
    from torch.futures import wait_all
else:
    import gradwire as torch
    import gradwire.distributed.autograd as dist_autograd
    import gradwire.distributed.rpc as rpc
    import gradwire.multiprocessing as mp
    from gradwire import nn, optim
    from gradwire.distributed.optim import DistributedOptimizer
    from gradwire.futures import wait_all

# ---------------------------------------------------------------- unchanged PyTorch code below


class ParameterServer:
    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Linear(1, 1)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.model(x)

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.model.parameters()]

    def weights(self):
        return [p.detach().tolist() for p in self.model.parameters()]

    def num_calls(self):
        return self.calls


def forward_on(ps_rref, x):
    return ps_rref.local_value().forward(x)


def run_trainer(ps_rref, seed, steps):
    torch.manual_seed(seed)
    param_rrefs = ps_rref.rpc_sync().parameter_rrefs()
    opt = DistributedOptimizer(optim.SGD, param_rrefs, lr=0.05)
    loss_value = None
    for _ in range(steps):
        x = torch.randn(32, 1)
        y = 3 * x + 2
        with dist_autograd.context() as context_id:
            out = rpc.rpc_sync(ps_rref.owner(), forward_on, args=(ps_rref, x))
            loss = ((out - y) ** 2).mean()
            dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
        loss_value = loss.item()
    return loss_value


def run_worker(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=60)
    name = "ps" if rank == 0 else f"trainer{rank}"
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)
    if rank == 0:
        ps_rref = rpc.remote("ps", ParameterServer)
        futures = [
            rpc.rpc_async(f"trainer{r}", run_trainer, args=(ps_rref, r, 150))
            for r in range(1, world_size)
        ]
        losses = wait_all(futures)
        weight, bias = ps_rref.rpc_sync().weights()
        print(f"final losses {[round(v, 4) for v in losses]}")
        print(f"weight {weight[0][0]:.3f} bias {bias[0]:.3f} (target 3 and 2)")
        print(f"parameter server served {ps_rref.rpc_sync().num_calls()} forward calls")
        ok = abs(weight[0][0] - 3) < 0.1 and abs(bias[0] - 2) < 0.1
        print("fitted" if ok else "did not fit")
    rpc.shutdown()


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world_size = 3
    mp.spawn(run_worker, args=(world_size, port), nprocs=world_size, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
