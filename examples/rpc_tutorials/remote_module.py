"""A model split between a trainer and a parameter server with ``RemoteModule`` (after PyTorch's
"Combining Distributed DataParallel with Distributed RPC Framework" tutorial, without the DDP
part). The embedding table is a RemoteModule on the parameter server; the classifier is local to
the trainer; one DistributedOptimizer updates both.

The data are synthetic: token ``t`` belongs to class ``t % 8``, and each sample is three tokens
of one class; the model learns to name the class.

    python examples/rpc_tutorials/remote_module.py

Prints the loss of the first and last steps and whether the remote table changed; exits
non-zero if the loss did not fall.
"""

import sys

from _framework import (
    DistributedOptimizer,
    RemoteModule,
    dist_autograd,
    launch,
    nn,
    optim,
    rpc,
    torch,
)

NUM_EMBEDDINGS, EMBEDDING_DIM, CLASSES, TOKENS, BATCH, STEPS = 64, 16, 8, 3, 32, 40


class HybridModel(nn.Module):
    def __init__(self, remote_emb_module):
        super().__init__()
        self.remote_emb_module = remote_emb_module
        self.fc = nn.Linear(EMBEDDING_DIM, CLASSES)

    def forward(self, indices):
        emb_lookup = self.remote_emb_module.forward(indices)
        return self.fc(emb_lookup.mean(1))


def get_batch():
    target = torch.randint(0, CLASSES, (BATCH,))
    offsets = torch.randint(0, NUM_EMBEDDINGS // CLASSES, (BATCH, TOKENS)) * CLASSES
    return offsets + target.reshape(BATCH, 1), target


def table_sum(module_rref):
    return module_rref.local_value().weight.sum().item()


def run_trainer():
    torch.manual_seed(0)
    remote_emb_module = RemoteModule("ps/cpu", nn.Embedding, args=(NUM_EMBEDDINGS, EMBEDDING_DIM))
    model = HybridModel(remote_emb_module)
    model_parameter_rrefs = remote_emb_module.remote_parameters()
    model_parameter_rrefs.extend(rpc.RRef(p) for p in model.fc.parameters())
    opt = DistributedOptimizer(optim.SGD, model_parameter_rrefs, lr=0.5)
    criterion = nn.CrossEntropyLoss()
    table_rref = remote_emb_module.get_module_rref()
    before = rpc.rpc_sync("ps", table_sum, args=(table_rref,))
    losses = []
    for _ in range(STEPS):
        indices, target = get_batch()
        with dist_autograd.context() as context_id:
            loss = criterion(model(indices), target)
            dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
        losses.append(loss.item())
    async_out = remote_emb_module.forward_async(indices).wait()
    after = rpc.rpc_sync("ps", table_sum, args=(table_rref,))
    return losses, before != after, tuple(async_out.shape)


def run_worker(rank, world_size):
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=120)
    rpc.init_rpc(
        "trainer" if rank else "ps", rank=rank, world_size=world_size, rpc_backend_options=options
    )
    good = True
    if rank == 1:
        losses, changed, shape = run_trainer()
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        good = last < 0.5 * first and changed and shape == (BATCH, TOKENS, EMBEDDING_DIM)
        print(
            f"loss {first:.3f} -> {last:.3f}; remote table changed: {changed}; "
            f"forward_async gave {shape}"
        )
        print("trained" if good else "FAILED")
    rpc.shutdown()
    if not good:
        sys.exit(1)


if __name__ == "__main__":
    launch(run_worker, 2)
