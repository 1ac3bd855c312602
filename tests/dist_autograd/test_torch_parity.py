"""What PyTorch's own distributed-autograd tests observe, on real workers over gRPC: node
names, the send/recv functions each side records, debug counters, when the context's store
copies a gradient, and hooks of leaves' accumulators."""

from __future__ import annotations

from gradwire.distributed.rpc._testing import run_cluster

from . import parity_bodies


def _rank0(results):
    assert all(r.error is None for r in results), [r.error for r in results]
    return results[0].value


def test_send_and_recv_functions_carry_pytorchs_names():
    out = _rank0(run_cluster(2, parity_bodies.graph_names))
    assert out["send"] == "torch::distributed::autograd::SendRpcBackward"
    assert out["recv"] == "torch::distributed::autograd::RecvRpcBackward"
    assert out["send_next"] == ["torch::autograd::AccumulateGrad"] * 2
    assert out["y_grad_fn_is_recv"]


def test_each_side_records_what_pytorch_records_and_every_pass_finishes():
    out = _rank0(run_cluster(2, parity_bodies.recorded_counts))
    # remote() + to_here(): the call's tensors and the fetched value, nothing for the ack.
    assert out["remote_caller"] == (1, 1)
    assert out["remote_owner"] == (1, 1)
    assert out["remote_grad"] == [8 * v for v in out["x"]]  # d/dx sum((2x)^2)
    # A reply with no tensor requiring grad records no functions on either side...
    assert out["none_caller"] == (1, 0)
    assert out["none_callee"] == (0, 1)
    # ...yet the callee still hears of the pass: the send functions fire, gradients are exact.
    assert out["none_grad"] == [2 * v for v in out["x"]]
    assert out["unfetched_grad"] == [2 * v for v in out["x"]]
    assert out["seconds"] < 20


def test_debug_info_counts_a_pass_once_however_many_messages_it_handles():
    out = _rank0(run_cluster(2, parity_bodies.passes_in_debug_info))
    assert out["during"] == [1]
    assert out["after"] == 0


def test_the_store_takes_an_unshared_gradient_and_copies_a_shared_one():
    out = _rank0(run_cluster(1, parity_bodies.gradient_ownership))
    assert out["single_stolen"]
    assert out["twice_ptrs_distinct"] and out["twice_values"]
    assert out["stash_unchanged"]


def test_accumulator_post_hooks_run_once_in_a_distributed_pass():
    out = _rank0(run_cluster(1, parity_bodies.post_hooks))
    assert out["calls"] == [(0, [2.0] * 4), "second"]
    assert out["in_store"] and out["grad"] is None
