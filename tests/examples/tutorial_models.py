"""The models of ``examples/rpc_tutorials``, run locally on one framework, for differential tests.

This file is imported twice: by the test (gradwire) and by the snippet that runs under PyTorch
(``tests/torch_oracle.py``). Each side builds the same tutorial classes, PyTorch's side exports
its initial weights, gradwire's side loads them, both run the same inputs forward and backward,
and :func:`results` collects outputs, gradients and the state after the step (running statistics)
under the same names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EXAMPLES", "NAMES", "PROGRAMS", "load", "inputs", "build", "run", "state", "results"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "rpc_tutorials"
NAMES = ["rnn", "cnn", "rl", "resnet", "remote_module"]
PROGRAMS = [
    "rnn_parameter_server",
    "cnn_parameter_server",
    "batched_rl",
    "pipeline_resnet",
    "remote_module",
]


def load(torch_side: bool) -> dict[str, Any]:
    """Import ``_framework`` and the tutorial programs (on PyTorch when ``torch_side``)."""
    import importlib
    import os
    import sys

    if torch_side:
        os.environ["GRADWIRE_TUTORIAL_TORCH"] = "1"
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return {n: importlib.import_module(n) for n in ["_framework", *PROGRAMS]}


def inputs() -> dict[str, np.ndarray]:
    """Fixed inputs for every model (NumPy, so both frameworks see the same numbers)."""
    rng = np.random.RandomState(0)
    return {
        "rnn.tokens": rng.randint(0, 40, size=(12, 4)).astype(np.int64),
        "rnn.h": rng.randn(2, 4, 32).astype(np.float32),
        "rnn.c": rng.randn(2, 4, 32).astype(np.float32),
        "cnn.x": rng.randn(4, 1, 12, 12).astype(np.float32),
        "cnn.target": rng.randint(0, 10, size=4).astype(np.int64),
        "rl.states": rng.randn(3, 4).astype(np.float32),
        "rl.actions": np.array([0, 1, 1], dtype=np.int64),
        "resnet.x": rng.randn(4, 3, 16, 16).astype(np.float32),
        "resnet.labels": rng.rand(4, 5).astype(np.float32),
        "remote_module.indices": rng.randint(0, 64, size=(6, 3)).astype(np.int64),
        "remote_module.target": rng.randint(0, 8, size=6).astype(np.int64),
    }


def build(name: str, tutorials: dict[str, Any]) -> dict[str, Any]:
    """The modules of tutorial ``name`` (dropout off: eval mode, or p=0)."""
    if name == "rnn":
        t = tutorials["rnn_parameter_server"]
        return {
            "emb": t.EmbeddingTable(40, 16, 0.0),
            "lstm": tutorials["_framework"].nn.LSTM(16, 32, 2),
            "dec": t.Decoder(40, 32, 0.0),
        }
    if name == "cnn":
        net = tutorials["cnn_parameter_server"].Net()
        net.eval()
        return {"net": net}
    if name == "rl":
        policy = tutorials["batched_rl"].Policy()
        policy.eval()
        return {"policy": policy}
    if name == "resnet":
        t = tutorials["pipeline_resnet"]
        return {"shard1": t.ResNetShard1("cpu"), "shard2": t.ResNetShard2("cpu")}
    t = tutorials["remote_module"]
    table = tutorials["_framework"].nn.Embedding(t.NUM_EMBEDDINGS, t.EMBEDDING_DIM)
    return {"table": table, "model": t.HybridModel(table)}


def run(
    name: str, modules: dict[str, Any], data: dict[str, np.ndarray], tutorials: dict[str, Any]
) -> dict[str, Any]:
    """One forward and backward of tutorial ``name``'s model; returns its outputs by name."""
    fw = tutorials["_framework"]
    torch, F = fw.torch, fw.F

    def arg(key: str) -> Any:
        return torch.tensor(data[f"{name}.{key}"])

    if name == "rnn":
        emb = modules["emb"](arg("tokens"))
        out, (h, c) = modules["lstm"](emb, (arg("h"), arg("c")))
        logits = modules["dec"](out)
        loss = F.cross_entropy(logits.reshape(-1, 40), arg("tokens").reshape(-1))
        loss.backward()
        return {"logits": logits, "h": h, "c": c, "loss": loss}
    if name == "cnn":
        out = modules["net"](arg("x"))
        loss = F.nll_loss(out, arg("target"))
        loss.backward()
        return {"log_probs": out, "loss": loss}
    if name == "rl":
        probs = modules["policy"](arg("states"))
        dist = fw.Categorical(probs)
        log_prob = dist.log_prob(arg("actions"))
        loss = -(log_prob.sum() + 0.1 * dist.entropy().sum())
        loss.backward()
        return {"probs": probs, "log_prob": log_prob, "loss": loss}
    if name == "resnet":
        s1, s2 = modules["shard1"], modules["shard2"]
        out = s2.fc(torch.flatten(s2.seq(s1.seq(arg("x"))), 1))
        loss = fw.nn.MSELoss()(out, arg("labels"))
        loss.backward()
        return {"out": out, "loss": loss}
    out = modules["model"](arg("indices"))
    loss = F.cross_entropy(out, arg("target"))
    loss.backward()
    return {"out": out, "loss": loss}


def state(modules: dict[str, Any]) -> dict[str, Any]:
    """Every module's state_dict (parameters and buffers), under ``module.key`` names."""
    return {f"{m}.{k}": v for m, module in modules.items() for k, v in module.state_dict().items()}


def results(
    name: str, tutorials: dict[str, Any], weights: dict[str, np.ndarray] | None
) -> dict[str, np.ndarray]:
    """Build, load ``weights`` (when given), run; outputs, gradients and state as arrays.

    Without ``weights`` the initial state is returned too, under ``init:`` names.
    """
    torch = tutorials["_framework"].torch
    torch.manual_seed(0)
    modules = build(name, tutorials)
    out: dict[str, np.ndarray] = {}
    if weights is None:
        out.update({f"init:{k}": _array(v) for k, v in state(modules).items()})
    else:
        for m, module in modules.items():
            prefix = f"{m}."
            mine = {
                k[len(prefix) :]: torch.tensor(v)
                for k, v in weights.items()
                if k.startswith(prefix)
            }
            module.load_state_dict(mine)
    for key, value in run(name, modules, inputs(), tutorials).items():
        out[f"out:{key}"] = _array(value)
    for m, module in modules.items():
        for pname, p in module.named_parameters():
            if p.grad is not None:
                out[f"grad:{m}.{pname}"] = _array(p.grad)
    out.update({f"after:{k}": _array(v) for k, v in state(modules).items()})
    return out


def _array(value: Any) -> np.ndarray:
    value = value.detach() if hasattr(value, "detach") else value
    # A copy: a state_dict's arrays share memory with the buffers the step then updates.
    return np.array(value.numpy() if hasattr(value, "numpy") else value, copy=True)
