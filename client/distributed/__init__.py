"""gradwire.distributed: rpc, autograd and optim across workers."""
