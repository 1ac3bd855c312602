"""A distributed backward started while calls of its context are still in flight: it waits for
their answers (so every worker they reached takes part in the pass) and its gradients are exact;
a call that fails or times out makes the backward fail naming it, never hang."""

from __future__ import annotations

import threading
import time

import pytest
from gradwire._runtime.dist_autograd.inflight import Call, CallsInFlight
from gradwire.distributed.rpc._testing import run_cluster
from gradwire.errors import RpcError, RpcTimeoutError
from gradwire.futures import Future

from . import inflight_bodies


def test_nothing_in_flight_returns_at_once_and_answered_calls_are_forgotten():
    calls = CallsInFlight(7)
    calls.wait()
    done: Future[None] = Future()
    calls.add(Call("rpc to f on worker 'w1'", done, 5.0, time.monotonic() + 5.0))
    threading.Timer(0.2, done.set_result, (None,)).start()
    started = time.monotonic()
    calls.wait()
    assert 0.1 < time.monotonic() - started < 2.0
    calls.wait()  # answered: nothing left


def test_a_failed_call_fails_every_wait_naming_it():
    calls = CallsInFlight(7)
    done: Future[None] = Future()
    calls.add(Call("rpc to f on worker 'w1'", done, None, None))
    done.set_exception(ValueError("bad input"))
    for _ in range(2):
        with pytest.raises(RpcError, match=r"context 7: rpc to f on worker 'w1' failed.*bad input"):
            calls.wait()


def test_a_call_past_its_deadline_is_a_timeout_not_a_hang():
    calls = CallsInFlight(7)
    calls.add(Call("remote(f) on worker 'w1'", Future(), 0.5, time.monotonic() - 2.0))
    with pytest.raises(RpcTimeoutError, match=r"remote\(f\) on worker 'w1' got no answer"):
        calls.wait()


def _rank0(results):
    assert all(r.error is None for r in results), [r.error for r in results]
    return results[0].value


def test_backward_waits_for_remote_and_rpc_async_answers():
    out = _rank0(run_cluster(2, inflight_bodies.in_flight))
    exact = [2 * v for v in out["x"]]
    assert out["remote_acked"]
    assert out["remote_waited"] > 0.5  # the owner answers after 1 s
    assert out["remote_grad"] == exact
    assert out["async_done"]
    assert out["async_grad"] == exact
    assert out["acked_grad"] == exact


def test_a_joined_worker_waits_for_its_own_calls_in_flight():
    out = _rank0(run_cluster(3, inflight_bodies.joined_worker_waits))
    assert out["grad"] == [2.0] * len(out["x"])


def test_a_failed_or_timed_out_call_fails_the_backward_naming_it():
    out = _rank0(run_cluster(2, inflight_bodies.failed_calls))
    kind, message, seconds = out["timeout"]
    assert kind == "RpcTimeoutError"
    assert "remote(" in message and "slow_add" in message and "'worker1'" in message
    assert seconds < 4  # the remote()'s own deadline (0.5 s), not the function's 5 s
    kind, message, _ = out["failed"]
    assert kind == "RpcError"
    assert "raises" in message and "refused on purpose" in message
    assert out["failed_seen"] == "ValueError"
    assert out["failed_again"][0] == "RpcError"
    assert out["no_grad_call_grad"] == [2 * v for v in out["x"]]
    assert not out["no_grad_call_waited"]
