"""A parameter server training a CNN for two trainers (after PyTorch's "Implementing a Parameter
Server Using Distributed RPC Framework" tutorial). The data are synthetic 12x12 images of ten
classes (a fixed pattern per class plus noise), so nothing is downloaded.

    python examples/rpc_tutorials/cnn_parameter_server.py

Each trainer prints its test accuracy; the program exits non-zero if one is not above 50%
(chance is 10%).
"""

import sys
from threading import Lock

from _framework import DistributedOptimizer, F, dist_autograd, launch, nn, optim, rpc, torch

CLASSES, SIDE, BATCH, BATCHES = 10, 12, 32, 30


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout2d(0.25)
        self.dropout2 = nn.Dropout2d(0.5)
        self.fc1 = nn.Linear(256, 64)
        self.fc2 = nn.Linear(64, CLASSES)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)


def remote_method(method, rref, *args, **kwargs):
    args = [method, rref] + list(args)
    return rpc.rpc_sync(rref.owner(), call_method, args=args, kwargs=kwargs)


class ParameterServer(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = Net()
        # Two trainers share the model: one must not step the weights between the other's
        # forward and backward (autograd's version counters would refuse the stale graph).
        self.iteration_lock = Lock()

    def forward(self, inp):
        return self.model(inp)

    def get_dist_gradients(self, cid):
        grads = dist_autograd.get_gradients(cid)
        return {k: v for k, v in grads.items()}

    def get_param_rrefs(self):
        return [rpc.RRef(param) for param in self.model.parameters()]

    def begin_iteration(self):
        self.iteration_lock.acquire()

    def end_iteration(self):
        self.iteration_lock.release()

    def set_training(self, mode):
        self.model.train(mode)


param_server = None
global_lock = Lock()


def get_parameter_server():
    global param_server
    with global_lock:
        if not param_server:
            param_server = ParameterServer()
        return param_server


class TrainerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.param_server_rref = rpc.remote("parameter_server", get_parameter_server)

    def get_global_param_rrefs(self):
        return remote_method(ParameterServer.get_param_rrefs, self.param_server_rref)

    def forward(self, x):
        return remote_method(ParameterServer.forward, self.param_server_rref, x)


def synthetic_digits(seed, batches):
    torch.manual_seed(1234)  # the class patterns are the same for every trainer
    patterns = torch.randn(CLASSES, 1, SIDE, SIDE)
    torch.manual_seed(seed)
    for _ in range(batches):
        target = torch.randint(0, CLASSES, (BATCH,))
        data = patterns[target] + 0.8 * torch.randn(BATCH, 1, SIDE, SIDE)
        yield data, target


def run_training_loop(rank):
    net = TrainerNet()
    opt = DistributedOptimizer(optim.SGD, net.get_global_param_rrefs(), lr=0.03)
    for data, target in synthetic_digits(rank, BATCHES):
        remote_method(ParameterServer.begin_iteration, net.param_server_rref)
        with dist_autograd.context() as cid:
            model_output = net(data)
            loss = F.nll_loss(model_output, target)
            dist_autograd.backward(cid, [loss])
            assert remote_method(ParameterServer.get_dist_gradients, net.param_server_rref, cid)
            opt.step(cid)
        remote_method(ParameterServer.end_iteration, net.param_server_rref)
    return get_accuracy(synthetic_digits(100 + rank, 8), net)


def get_accuracy(test_loader, model):
    remote_method(ParameterServer.set_training, model.param_server_rref, False)
    correct_sum = total = 0
    with torch.no_grad():
        for data, target in test_loader:
            pred = model(data).argmax(dim=1, keepdim=True)
            correct_sum += pred.eq(target.view_as(pred)).sum().item()
            total += target.shape[0]
    return correct_sum / total


def run_worker(rank, world_size):
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=120)
    name = "parameter_server" if rank == 0 else f"trainer_{rank}"
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)
    good = True
    if rank != 0:
        accuracy = run_training_loop(rank)
        good = accuracy > 0.5
        print(f"trainer {rank}: accuracy {accuracy:.2f} ({'above' if good else 'NOT above'} 0.5)")
    rpc.shutdown()
    if not good:
        sys.exit(1)


if __name__ == "__main__":
    launch(run_worker, 3)
