"""Module features: buffers in state_dict and to(), apply, hooks, containers, share_memory across
real processes, nn.init, and Linear's default initialisation."""

from __future__ import annotations

import math

import gradwire as gw
import gradwire.multiprocessing as gmp
import numpy as np
import pytest
from gradwire import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 1)})
        self.register_buffer("steps", gw.zeros(1))
        self.register_buffer("scratch", gw.ones(2), persistent=False)

    def forward(self, x):
        h = self.bn(self.fc(x)).relu()
        return self.heads["a"](h), self.heads["b"](h)


# ------------------------------------------------------------------ buffers and state
def test_buffers_are_registered_listed_and_assignable():
    net = Net()
    names = [n for n, _ in net.named_buffers()]
    assert names == [
        "steps",
        "scratch",
        "bn.running_mean",
        "bn.running_var",
        "bn.num_batches_tracked",
    ]
    assert len(list(net.buffers(recurse=False))) == 2
    net.steps = gw.full((1,), 5.0)  # assigning a tensor to a buffer name replaces the buffer
    assert net._buffers["steps"].item() == 5.0
    with pytest.raises(TypeError, match="buffer 'steps'"):
        net.steps = 3
    with pytest.raises(KeyError, match="already exists"):
        net.register_buffer("fc", gw.zeros(1))
    with pytest.raises(KeyError, match="non-empty"):
        net.register_buffer("a.b", gw.zeros(1))
    del net.steps
    assert "steps" not in dict(net.named_buffers())


def test_state_dict_round_trip_with_buffers():
    a, b = Net(), Net()
    a(gw.randn(5, 3))  # moves a's running statistics
    sd = a.state_dict()
    assert "bn.running_mean" in sd and "steps" in sd and "scratch" not in sd
    assert list(sd)[:4] == ["steps", "fc.weight", "fc.bias", "bn.weight"]  # PyTorch's order
    result = b.load_state_dict(sd)
    assert result.missing_keys == [] and result.unexpected_keys == []
    for k, v in b.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), sd[k].numpy())
    assert b.bn.num_batches_tracked.item() == 1
    del sd["bn.running_var"]
    with pytest.raises(RuntimeError, match="bn.running_var"):
        b.load_state_dict(sd)
    missing, unexpected = b.load_state_dict(sd, strict=False)
    assert missing == ["bn.running_var"] and unexpected == []


def test_to_moves_buffers_and_casts_only_floating_tensors():
    net = Net()
    weight = net.fc.weight
    net.to(gw.float64)
    assert net.fc.weight is weight and weight.dtype == gw.float64
    assert net.bn.running_mean.dtype == gw.float64 and net.scratch.dtype == gw.float64
    assert net.bn.num_batches_tracked.dtype == gw.int64
    net.float()
    assert net.bn.running_var.dtype == gw.float32
    assert net.cpu() is net
    with pytest.raises(TypeError, match="floating point"):
        net.to(gw.int64)
    if not gw.is_cuda_available():
        with pytest.raises(Exception, match="(?i)cuda|cupy"):
            net.cuda()


def test_apply_visits_children_first_then_self():
    seen = []
    net = Net()
    assert net.apply(lambda m: seen.append(type(m).__name__)) is net
    assert seen == ["Linear", "BatchNorm1d", "Linear", "Linear", "ModuleDict", "Net"]
    net.apply(lambda m: isinstance(m, nn.Linear) and nn.init.zeros_(m.bias))
    assert net.heads["b"].bias.item() == 0.0


# ------------------------------------------------------------------ hooks
def test_forward_pre_and_post_hooks_replace_args_and_output_and_remove():
    lin = nn.Linear(2, 2)
    calls = []
    pre = lin.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
    post = lin.register_forward_hook(lambda m, args, out: calls.append(args[0].sum().item()))
    x = gw.ones(1, 2)
    out = lin(x)
    np.testing.assert_allclose(out.detach().numpy(), lin.bias.detach().numpy()[None])
    assert calls == [0.0]
    pre.remove()
    lin(x)
    assert calls == [0.0, 2.0]
    post.remove()
    post.remove()  # idempotent
    lin(x)
    assert calls == [0.0, 2.0]
    with lin.register_forward_hook(lambda m, args, out: out * 0):
        assert lin(x).abs().sum().item() == 0.0
    assert lin(x).abs().sum().item() != 0.0
    order = []
    lin.register_forward_pre_hook(lambda m, a: order.append("second"))
    lin.register_forward_pre_hook(lambda m, a: order.append("first"), prepend=True)
    lin.register_forward_pre_hook(lambda m, a, kw: ((a[0] + 1,), kw), with_kwargs=True)
    lin(x)
    assert order == ["first", "second"]


# ------------------------------------------------------------------ containers
def test_module_list_supports_list_operations_and_registers():
    layers = nn.ModuleList([nn.Linear(2, 2), nn.ReLU()])
    layers.append(nn.Linear(2, 3))
    layers.extend([nn.Tanh()])
    layers.insert(1, nn.Identity())
    assert [type(m).__name__ for m in layers] == ["Linear", "Identity", "ReLU", "Linear", "Tanh"]
    assert len(layers) == 5 and isinstance(layers[-1], nn.Tanh)
    assert isinstance(layers[1:3], nn.ModuleList) and len(layers[1:3]) == 2
    assert len(list(layers.parameters())) == 4
    assert sorted(layers.state_dict()) == ["0.bias", "0.weight", "3.bias", "3.weight"]
    layers[1] = nn.Sigmoid()
    del layers[0]
    assert [type(m).__name__ for m in layers] == ["Sigmoid", "ReLU", "Linear", "Tanh"]
    assert list(layers.state_dict()) == ["2.weight", "2.bias"]
    layers += [nn.Identity()]
    assert len(layers) == 5 and isinstance(layers.pop(), nn.Identity)
    with pytest.raises(IndexError):
        layers[7]
    with pytest.raises(TypeError, match="Modules"):
        layers.append(3)
    x = gw.randn(4, 2)
    for m in layers:
        x = m(x)
    assert x.shape == (4, 3)


def test_module_dict_is_dict_like_and_registers():
    d = nn.ModuleDict({"a": nn.Linear(2, 2)})
    d["b"] = nn.Linear(2, 1)
    d.update([("c", nn.ReLU())])
    assert list(d) == ["a", "b", "c"] and "b" in d and len(d) == 3
    assert list(d.keys()) == ["a", "b", "c"] and isinstance(d["c"], nn.ReLU)
    assert [k for k, _ in d.items()] == ["a", "b", "c"] and len(list(d.values())) == 3
    assert len(list(d.parameters())) == 4 and "b.weight" in d.state_dict()
    assert isinstance(d.pop("a"), nn.Linear) and list(d) == ["b", "c"]
    del d["c"]
    d.clear()
    assert len(d) == 0 and list(d.parameters()) == []
    with pytest.raises(TypeError, match="pair"):
        d.update([nn.ReLU()])


# ------------------------------------------------------------------ share_memory
def _hogwild_step(model, queue):
    x = gw.tensor([[1.0, 2.0]])
    model(x).sum().backward()
    with gw.no_grad():
        for p in model.parameters():
            p.sub_(p.grad * 0.5)
    model.marker.fill_(7.0)
    queue.put([p.detach().numpy().copy() for p in model.parameters()])


def test_share_memory_lets_another_process_update_the_same_parameters():
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    model.register_buffer("marker", gw.zeros(1))
    assert model.share_memory() is model
    assert all(p.is_shared() for p in model.parameters()) and model.marker.is_shared()
    before = [p.detach().numpy().copy() for p in model.parameters()]
    ctx = gmp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_hogwild_step, args=(model, queue))
    proc.start()
    child = queue.get(timeout=60)
    proc.join(60)
    assert proc.exitcode == 0
    after = [p.detach().numpy() for p in model.parameters()]
    assert any(not np.array_equal(a, b) for a, b in zip(after, before))
    for got, seen in zip(after, child):
        np.testing.assert_array_equal(got, seen)
    assert model.marker.item() == 7.0


# ------------------------------------------------------------------ init
def test_init_functions_and_gains():
    gw.manual_seed(0)
    w = gw.empty(200, 300)
    assert nn.init.constant_(w, 0.5) is w and float(w.mean()) == 0.5
    nn.init.kaiming_uniform_(w, a=0, mode="fan_in", nonlinearity="relu")
    bound = math.sqrt(2.0) * math.sqrt(3.0 / 300)
    assert float(w.abs().max()) <= bound and float(w.abs().max()) > 0.95 * bound
    nn.init.kaiming_normal_(w, mode="fan_out")
    assert abs(float(w.std()) - math.sqrt(2.0 / 200)) < 0.005
    nn.init.xavier_uniform_(w, gain=2.0)
    assert float(w.abs().max()) <= 2.0 * math.sqrt(6.0 / 500)
    nn.init.xavier_normal_(w)
    assert abs(float(w.std()) - math.sqrt(2.0 / 500)) < 0.003
    nn.init.normal_(w, 1.0, 0.1)
    assert abs(float(w.mean()) - 1.0) < 0.01
    assert nn.init.calculate_gain("tanh") == 5.0 / 3
    assert nn.init.calculate_gain("leaky_relu", 0.2) == math.sqrt(2.0 / 1.04)
    assert nn.init.calculate_gain("conv2d") == 1.0 and nn.init.calculate_gain("selu") == 0.75
    with pytest.raises(ValueError, match="Unsupported nonlinearity"):
        nn.init.calculate_gain("gelu")
    with pytest.raises(ValueError, match="Mode"):
        nn.init.kaiming_uniform_(w, mode="fan_avg")
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        nn.init.xavier_uniform_(gw.empty(3))
    g = np.random.default_rng(3)
    a = nn.init.uniform_(gw.empty(5), generator=g).numpy()
    np.testing.assert_array_equal(a, np.random.default_rng(3).uniform(0, 1, 5).astype(np.float32))


def test_linear_default_init_is_pytorchs():
    gw.manual_seed(1)
    lin = nn.Linear(400, 300)
    w, b = lin.weight.detach().numpy(), lin.bias.detach().numpy()
    bound = 1 / math.sqrt(400)  # kaiming_uniform_(a=sqrt(5)) and the bias rule agree
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.002
    assert np.abs(b).max() <= bound
