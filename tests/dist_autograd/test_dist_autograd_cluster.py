"""Distributed autograd across real worker processes over gRPC."""

from __future__ import annotations

import numpy as np
import pytest
from gradwire.distributed.rpc._testing import run_cluster

from . import bodies


def _rank0(results):
    assert all(r.error is None for r in results), [r.error for r in results]
    return results[0].value


def test_design_note_example_equals_local_computation_exactly():
    out = _rank0(run_cluster(2, bodies.design_note))
    assert out["loss"][0] == out["loss"][1]
    for got, ref in out["grads"]:
        np.testing.assert_array_equal(got, ref)
    assert out["cid"] >> 48 == 0


def test_nested_chain_over_four_workers():
    out = _rank0(run_cluster(4, bodies.chain_four))
    for got, ref in zip(out["got"], out["ref"]):
        np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_unused_rpc_outputs_finish_with_exact_gradients():
    out = _rank0(run_cluster(3, bodies.unused_output))
    np.testing.assert_allclose(out["got"], out["ref"], rtol=1e-12)
    assert out["seconds"] < 20


def test_error_in_a_remote_backward_reaches_the_caller_naming_the_worker():
    out = _rank0(run_cluster(2, bodies.remote_error))
    assert out["type"] == "ValueError"
    assert "exploded in backward" in out["message"] and "worker1" in out["message"]
    # PyTorch's form, which its tests match: the failing worker's id before the message.
    assert "Error on Node 1: exploded in backward" in out["message"]


def test_leaving_the_context_releases_it_on_every_worker():
    out = _rank0(run_cluster(3, bodies.cleanup_everywhere))
    assert out["during"] == [1, 1, 1]
    assert out["after"] == [0, 0, 0]


def test_contexts_from_many_threads_with_retain_graph():
    out = _rank0(run_cluster(3, bodies.threads_and_retain))
    assert not out["errors"]
    for k, g in out["results"].items():
        x = float(k + 1)
        np.testing.assert_allclose(g, np.full(3, 2 * (1 + 2 * x)))


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_distributed_optimizer_matches_a_local_replica(opt_name):
    out = _rank0(run_cluster(3, bodies.dist_optimizer, opt_name))
    for key in ("remote", "local"):
        got, ref = out[key]
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
    got, start = out["untouched"]
    np.testing.assert_array_equal(got, start)  # no gradient: not touched
    assert "cannot build this optimizer here" in out["errors"]["ctor"]
    assert "RRef" in out["errors"]["not_rref"]


def test_rref_backward_of_a_remote_scalar():
    out = _rank0(run_cluster(2, bodies.rref_backward))
    np.testing.assert_allclose(out["got"], out["ref"], rtol=1e-12)


def test_rpc_sync_remote_and_to_here_over_four_workers():
    out = _rank0(run_cluster(4, bodies.remote_chain))
    for got, ref in zip(out["got"], out["ref"]):
        np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_a_peer_dying_mid_backward_is_an_error_not_a_hang():
    out = _rank0(
        run_cluster(
            2,
            bodies.peer_dies_in_backward,
            options={"rpc_timeout": 10},
            expect_failure={1},
            shutdown_graceful=False,
        )
    )
    assert out["error"] is not None
    assert "worker1" in out["message"]
    assert out["seconds"] < 10 + 5


def test_the_last_gradient_message_is_sent_by_the_thread_that_waits_for_it():
    out = _rank0(run_cluster(2, bodies.sends_from_the_waiting_thread))
    for (gx, gw_), (rx, rw) in zip(out["got"], out["ref"]):
        np.testing.assert_allclose(gx, rx, rtol=1e-12)
        np.testing.assert_allclose(gw_, rw, rtol=1e-12)
    mine, peer = out["one"]
    # The originator's only message goes from the thread that called backward() (no pool
    # hand-off), and the peer sends its answer from the thread handling the caller's message.
    assert [s for s in mine if s[0] == "send"] == [("send", out["main"], True)]
    (k1, handler, _), (k2, sender, here) = peer
    assert (k1, k2, here) == ("handle", "send", True) and sender == handler
    # Two recv functions ready together: the first message is handed off (the run goes on),
    # the last is sent by the waiting thread.
    assert [here for kind, _, here in out["two"] if kind == "send"] == [False, True]


def test_a_received_gradient_is_stored_without_a_copy_unless_shared():
    # Over TCP the gradients arrive in fresh arrays that nothing else holds: PyTorch stores
    # such a gradient as it is, and so does gradwire. One gradient for two leaves is copied.
    tcp = {"use_unix_socket": False, "shm_transfer": False}
    out = _rank0(run_cluster(2, bodies.received_gradients_kept_without_copy, options=tcp))
    assert out["mm_clones"] == 0
    np.testing.assert_allclose(out["mm"]["x"], out["ref_mm"]["x"], rtol=1e-12)
    np.testing.assert_allclose(out["mm"]["w"], out["ref_w"], rtol=1e-12)
    np.testing.assert_allclose(out["add"]["x"], out["ref_add"], rtol=1e-12)
    np.testing.assert_allclose(out["add"]["z"], out["ref_add"], rtol=1e-12)
    assert not out["shared"]
