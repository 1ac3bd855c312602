"""gradwire's side of behaviours the differential scenarios cannot compare (PyTorch lacks them
or differs on purpose), on real worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from gradwire import errors
from gradwire.distributed import rpc
from gradwire.distributed.rpc._testing import run_cluster
from gradwire.futures import Future
from torch_oracle import require_torch_python

from . import surface_bodies as bodies


@pytest.mark.slow  # a load run: 10,000 of them (pytest -m slow)
def test_ten_thousand_contexts_with_plain_calls_leave_no_context_anywhere() -> None:
    results = run_cluster(3, bodies.contexts_released_everywhere, 10_000, timeout=240)
    assert results[0].value == [0, 0, 0]


def test_distributed_optimizer_steps_pytorch_contract_optimizers_through_grad() -> None:
    out = run_cluster(2, bodies.optimizer_contract)[0].value
    value, grad_after, seen = out["state"]
    assert seen == [[3.0, 3.0]]  # step() saw the context's gradient in .grad ...
    assert value == [-0.5, -0.5]  # ... applied it (1 - 0.5 * 3) ...
    assert grad_after == [7.0, 7.0]  # ... and .grad is what it was before
    assert out["broken"] == ["KeyError", True, True]  # its own type, naming the worker


def test_pytorch_names_and_runtime_errors() -> None:
    out = run_cluster(3, bodies.names_and_errors)[0].value
    assert out["available"] == [True, True]
    assert out["timeout"] == [3.5, 60.0]
    assert out["negative_timeout"] is True
    assert out["known"] == [1] and out["current"] is True and out["max_id_ok"] is True
    assert out["rref_info"] == [
        "num_forks",
        "num_owner_rrefs",
        "num_pending_futures",
        "num_pending_users",
    ]
    assert out["dist_info"] == ["num_autograd_contexts", "num_current_backward_passes"]
    assert out["negative_rank"] == "UnknownWorkerError"
    assert out["rank_too_big"] == "UnknownWorkerError"
    assert out["future_argument"] == "SerializationError"
    assert out["empty_roots"] == "ArgumentError"
    assert out["tensorpipe"] == [4, 9, ["cuda:0"], True]


def test_every_rpc_error_is_a_runtime_error_and_keeps_its_mixins() -> None:
    for cls in (
        errors.RpcError,
        errors.UnknownWorkerError,
        errors.RpcTimeoutError,
        errors.WorkerUnavailableError,
        errors.SerializationError,
        errors.PolicyError,
        errors.RemoteError,
        errors.RRefError,
        errors.ArgumentError,
        errors.CallbackError,
    ):
        assert issubclass(cls, RuntimeError), cls
    assert issubclass(errors.RpcTimeoutError, TimeoutError)
    assert issubclass(errors.WorkerUnavailableError, ConnectionError)
    assert issubclass(errors.UnknownWorkerError, ValueError)
    assert issubclass(errors.ArgumentError, ValueError)


def test_a_then_callback_error_keeps_its_type_and_is_a_runtime_error() -> None:
    source: Future[int] = Future()

    def bad(_: Future[int]) -> int:
        raise ValueError("in then")

    chained = source.then(bad)
    source.set_result(1)
    with pytest.raises(ValueError, match="in then") as info:
        chained.wait()
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, errors.CallbackError)
    # an error that already is a RuntimeError passes unchanged
    again = source.then(lambda f: (_ for _ in ()).throw(errors.RpcShutdownError("down")))
    assert type(again.exception()) is errors.RpcShutdownError


def test_backend_options_accept_pytorchs_spellings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning without TensorPipe's private arguments
        opts = rpc.TensorPipeRpcBackendOptions(init_method="tcp://127.0.0.1:1", device_maps={})
    opts.set_device_map("worker1", {0: 1})
    opts.set_devices([0, "cuda:1"])
    assert opts.device_maps == {"worker1": {"cuda:0": "cuda:1"}}
    assert opts.devices == ["cuda:0", "cuda:1"]
    assert isinstance(opts, rpc.GrpcRpcBackendOptions)
    assert rpc.BackendType.TENSORPIPE.name == "TENSORPIPE"


def _run_example(python: str, env: dict[str, str]) -> str:
    example = Path(__file__).resolve().parents[2] / "examples" / "from_pytorch.py"
    done = subprocess.run(
        [python, str(example)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_pytorch_example_runs_on_gradwire() -> None:
    out = _run_example(sys.executable, {})
    assert "fitted" in out and "did not fit" not in out, out
    assert "served 300 forward calls" in out


def test_the_pytorch_example_runs_on_pytorch_too() -> None:
    python = require_torch_python()
    out = _run_example(python, {"FROM_PYTORCH_USE_TORCH": "1"})
    assert "fitted" in out and "served 300 forward calls" in out, out
