"""Distributed RNN: the embedding table and the decoder live on a parameter server, the LSTM on
the trainer (after PyTorch's "Implementing a Parameter Server Using Distributed RPC Framework" RNN
example). The trainer learns a synthetic language in which token t is followed by (t + 1) mod N.

    python examples/rpc_tutorials/rnn_parameter_server.py

Prints the loss at the start and the end; exits non-zero when it did not fall.
"""

import sys

from _framework import DistributedOptimizer, dist_autograd, launch, nn, optim, rpc, torch

NTOKEN, NINP, NHID, NLAYERS, DROPOUT = 40, 16, 32, 2, 0.1
SEQ, BATCH, STEPS = 12, 8, 40


def _call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)


def _remote_method(method, rref, *args, **kwargs):
    return rpc.rpc_sync(rref.owner(), _call_method, args=[method, rref, *args], kwargs=kwargs)


def _parameter_rrefs(module):
    return [rpc.RRef(p) for p in module.parameters()]


class EmbeddingTable(nn.Module):
    def __init__(self, ntoken, ninp, dropout):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.encoder.weight.data.uniform_(-0.1, 0.1)

    def forward(self, input):
        return self.drop(self.encoder(input))


class Decoder(nn.Module):
    def __init__(self, ntoken, nhid, dropout):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.decoder.weight.data.uniform_(-0.1, 0.1)
        self.decoder.bias.data.zero_()

    def forward(self, output):
        return self.decoder(self.drop(output))


class RNNModel(nn.Module):
    def __init__(self, ps, ntoken, ninp, nhid, nlayers, dropout):
        super().__init__()
        self.emb_table_rref = rpc.remote(ps, EmbeddingTable, args=(ntoken, ninp, dropout))
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder_rref = rpc.remote(ps, Decoder, args=(ntoken, nhid, dropout))

    def forward(self, input, hidden):
        emb = _remote_method(EmbeddingTable.forward, self.emb_table_rref, input)
        output, hidden = self.rnn(emb, hidden)
        decoded = _remote_method(Decoder.forward, self.decoder_rref, output)
        return decoded, hidden

    def parameter_rrefs(self):
        remote_params = []
        remote_params.extend(_remote_method(_parameter_rrefs, self.emb_table_rref))
        remote_params.extend(_parameter_rrefs(self.rnn))
        remote_params.extend(_remote_method(_parameter_rrefs, self.decoder_rref))
        return remote_params


def get_batch():
    start = torch.randint(0, NTOKEN, (1, BATCH))
    steps = torch.arange(SEQ + 1).reshape(SEQ + 1, 1)
    tokens = (start + steps) % NTOKEN
    return tokens[:-1], tokens[1:]


def run_trainer():
    torch.manual_seed(0)
    model = RNNModel("ps", NTOKEN, NINP, NHID, NLAYERS, DROPOUT)
    opt = DistributedOptimizer(optim.Adam, model.parameter_rrefs(), lr=0.02)
    criterion = nn.CrossEntropyLoss()

    def init_hidden():
        return (torch.zeros(NLAYERS, BATCH, NHID), torch.zeros(NLAYERS, BATCH, NHID))

    losses = []
    hidden = init_hidden()
    for _ in range(STEPS):
        data, target = get_batch()
        hidden = tuple(h.detach() for h in hidden)
        with dist_autograd.context() as context_id:
            output, hidden = model(data, hidden)
            loss = criterion(output.reshape(-1, NTOKEN), target.reshape(-1))
            dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
        losses.append(loss.item())
    return losses


def run_worker(rank, world_size):
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=120)
    name = "trainer" if rank == 1 else "ps"
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)
    fell = True
    if rank == 1:
        losses = run_trainer()
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        fell = last < 0.7 * first
        print(f"loss {'fell' if fell else 'did not fall'} from {first:.3f} to {last:.3f}")
    rpc.shutdown()
    if not fell:
        sys.exit(1)


if __name__ == "__main__":
    launch(run_worker, 2)
