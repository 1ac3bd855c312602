"""Pipeline parallelism over ResNet shards held in RRefs (after PyTorch's "Distributed Pipeline
Parallelism Using RPC" tutorial, scaled down to run on a CPU in seconds). The first shard lives on
worker1, the second on worker2; the master splits every batch into micro-batches, sends each
through shard 1 with ``remote()`` and on to shard 2 with ``rpc_async()`` (passing RRefs, so the
activations go from worker1 to worker2 directly), and trains both shards with distributed
autograd and a DistributedOptimizer.

    python examples/rpc_tutorials/pipeline_resnet.py

Prints the loss of the first and last batch and how many micro-batches each shard ran; exits
non-zero if the loss did not fall or the batches were not pipelined.
"""

import sys
import threading

from _framework import DistributedOptimizer, dist_autograd, futures, launch, nn, optim, rpc, torch

NUM_CLASSES, IMAGE, BATCH, SPLIT, NUM_BATCHES = 5, 16, 16, 4, 6


def conv1x1(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNetBase(nn.Module):
    def __init__(self, inplanes):
        super().__init__()
        self._lock = threading.Lock()
        self.inplanes = inplanes
        self.micro_batches = 0

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * Bottleneck.expansion, stride),
                nn.BatchNorm2d(planes * Bottleneck.expansion),
            )
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers.extend(Bottleneck(self.inplanes, planes) for _ in range(1, blocks))
        return nn.Sequential(*layers)

    def _init_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]

    def count(self):
        return self.micro_batches


class ResNetShard1(ResNetBase):
    def __init__(self, device):
        super().__init__(8)
        torch.manual_seed(1)
        self.device = device
        self.seq = nn.Sequential(
            nn.Conv2d(3, self.inplanes, kernel_size=3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(self.inplanes),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
            self._make_layer(8, 1),
            self._make_layer(16, 1, stride=2),
        ).to(self.device)
        self._init_weights()

    def forward(self, x_rref):
        x = x_rref.to_here().to(self.device)
        with self._lock:
            self.micro_batches += 1
            out = self.seq(x)
        return out.cpu()


class ResNetShard2(ResNetBase):
    def __init__(self, device):
        super().__init__(64)
        torch.manual_seed(2)
        self.device = device
        self.seq = nn.Sequential(
            self._make_layer(32, 1, stride=2),
            nn.AdaptiveAvgPool2d((1, 1)),
        ).to(self.device)
        self.fc = nn.Linear(32 * Bottleneck.expansion, NUM_CLASSES).to(self.device)
        self._init_weights()

    def forward(self, x_rref):
        x = x_rref.to_here().to(self.device)
        with self._lock:
            self.micro_batches += 1
            out = self.fc(torch.flatten(self.seq(x), 1))
        return out.cpu()


class DistResNet(nn.Module):
    def __init__(self, split_size, workers):
        super().__init__()
        self.split_size = split_size
        self.p1_rref = rpc.remote(workers[0], ResNetShard1, args=("cpu",))
        self.p2_rref = rpc.remote(workers[1], ResNetShard2, args=("cpu",))

    def forward(self, xs):
        out_futures = []
        for x in iter(xs.split(self.split_size, dim=0)):
            x_rref = rpc.RRef(x)
            y_rref = self.p1_rref.remote().forward(x_rref)
            z_fut = self.p2_rref.rpc_async().forward(y_rref)
            out_futures.append(z_fut)
        return torch.cat(futures.wait_all(out_futures))

    def parameter_rrefs(self):
        remote_params = []
        remote_params.extend(self.p1_rref.remote().parameter_rrefs().to_here())
        remote_params.extend(self.p2_rref.remote().parameter_rrefs().to_here())
        return remote_params


def run_master(split_size):
    torch.manual_seed(0)
    model = DistResNet(split_size, ["worker1", "worker2"])
    loss_fn = nn.MSELoss()
    opt = DistributedOptimizer(optim.SGD, model.parameter_rrefs(), lr=0.05)
    one_hot_indices = torch.LongTensor(BATCH).random_(0, NUM_CLASSES).view(BATCH, 1)
    losses = []
    for _ in range(NUM_BATCHES):
        inputs = torch.randn(BATCH, 3, IMAGE, IMAGE)
        labels = torch.zeros(BATCH, NUM_CLASSES).scatter_(1, one_hot_indices, 1)
        with dist_autograd.context() as context_id:
            outputs = model(inputs)
            loss = loss_fn(outputs, labels)
            dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
        losses.append(loss.item())
    counts = [model.p1_rref.rpc_sync().count(), model.p2_rref.rpc_sync().count()]
    return losses, counts


def run_worker(rank, world_size):
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=120)
    rpc.init_rpc(
        f"worker{rank}" if rank else "master",
        rank=rank,
        world_size=world_size,
        rpc_backend_options=options,
    )
    good = True
    if rank == 0:
        losses, counts = run_master(SPLIT)
        expected = NUM_BATCHES * BATCH // SPLIT
        good = losses[-1] < losses[0] and counts == [expected, expected]
        print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; micro-batches per shard {counts}")
        print("pipelined and trained" if good else f"FAILED (expected {expected} micro-batches)")
    rpc.shutdown()
    if not good:
        sys.exit(1)


if __name__ == "__main__":
    launch(run_worker, 3)
