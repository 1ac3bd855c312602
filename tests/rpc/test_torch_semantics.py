"""PyTorch RPC semantics its own test suite checks (issue 25): async_execution fan-out, the
wrong-return-type error, the two-phase _all_gather, torch's messages for names, missing
functions and broadcasting, and user-function errors logged on the callee."""

from __future__ import annotations

import logging
import sys
from typing import Any

import gradwire as gw
import pytest
from gradwire.distributed import rpc
from gradwire.distributed.rpc._testing import run_cluster

from . import torch_semantics_bodies as bodies


def test_async_execution_fanout_with_scalar_adds_completes() -> None:
    # torch.add(0, step) on the callee: a number as input (PyTorch's rule); the hang of
    # PyTorch's test_async_function_multi_fanout was this raising inside a then() callback.
    results = run_cluster(3, bodies.fanout, timeout=60)
    assert results[0].value == [[61.0, 61.0], [61.0, 61.0]]


def test_add_sub_mul_div_take_a_number_as_input() -> None:
    assert gw.add(0, 3).tolist() == 3 and gw.add(0, 3).dtype == gw.int64
    assert gw.add(0, 3.5).dtype == gw.float32
    assert gw.div(2, 3).item() == pytest.approx(2 / 3)
    assert gw.mul(2, gw.ones(2)).tolist() == [2.0, 2.0]
    assert gw.add(2, 3, alpha=2).item() == 8
    with pytest.raises(TypeError, match="must be Tensor"):
        gw.neg(2)  # as PyTorch: only the arithmetic ops take a number


def test_wrong_async_execution_return_reaches_the_caller_in_every_mode() -> None:
    seen = run_cluster(2, bodies.wrong_async_return, timeout=60)[0].value
    assert len(seen) == 3, seen
    for message in seen:
        assert message.startswith(
            "Functions decorated with @rpc.async_function must return a torch.futures.Future "
            "object, but got Tensor"
        ), message


def test_all_gather_returns_every_worker_s_object() -> None:
    results = run_cluster(3, bodies.gather, timeout=60)
    for r in results:
        assert r.value == {"worker0": 0, "worker1": 10, "worker2": 20}


def test_all_gather_leader_fails_when_a_follower_refuses_the_map() -> None:
    results = run_cluster(2, bodies.follower_broadcast_fails, timeout=60)
    assert results[0].value.startswith("Followers ['worker1'] timed out in _all_gather"), results
    assert "follower refuses the map" in results[0].value
    assert results[1].value == "{'worker0': 0, 'worker1': 1}"  # it took the map first


@pytest.mark.parametrize(
    ("name", "rule"),
    [("abc*", "other characters"), (" ", "other characters"), ("", "empty"), ("a" * 500, "500")],
)
def test_worker_info_checks_names_with_torch_s_message(name: str, rule: str) -> None:
    with pytest.raises(RuntimeError, match=r"^Worker name must match \^\[A-Za-z0-9-_:\]\*\$") as e:
        rpc.WorkerInfo(name, 0)
    assert "non-empty and shorter than 128 chars" in str(e.value) and rule in str(e.value)
    assert rpc.WorkerInfo("w-1:a_b", 3).name == "w-1:a_b"


def test_broadcast_mismatch_is_torch_s_runtime_error() -> None:
    with pytest.raises(
        RuntimeError,
        match=r"^The size of tensor a \(10\) must match the size of "
        r"tensor b \(5\) at non-singleton dimension 0",
    ):
        gw.ones(10) + gw.ones(5)
    with pytest.raises(ValueError, match="non-singleton dimension 2"):
        gw.ones(2, 3) * gw.ones(4, 1, 2)
    assert (gw.ones(4, 1, 3) * gw.ones(2, 1)).shape == (4, 2, 3)


def _vanishing() -> int:
    return 1


def _raises_value_error() -> None:
    raise ValueError("the user function failed here")


def test_function_missing_on_callee_and_user_errors_logged(
    solo: rpc.WorkerInfo, caplog: pytest.LogCaptureFixture
) -> None:
    module = sys.modules[__name__]
    fn = module._vanishing
    del module._vanishing
    try:
        with pytest.raises(RuntimeError, match="^RPC pickler does not serialize function code"):
            rpc.rpc_sync("solo", fn)
    finally:
        module._vanishing = fn
    with caplog.at_level(logging.WARNING, logger="gradwire._runtime.calls.callee"):
        with pytest.raises(ValueError, match="the user function failed here"):
            rpc.rpc_sync("solo", _raises_value_error)
    logged = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("the user function failed here" in r.getMessage() for r in logged), logged
    assert any(r.exc_info is not None for r in logged)


class TwoArgError(Exception):
    def __init__(self, flag: bool, msg: str) -> None:
        self.flag = flag
        super().__init__(msg)


def _raises_two_arg_error() -> None:
    raise TwoArgError(True, "foo")


def _raises_key_error() -> None:
    raise KeyError("k")


def test_exception_that_cannot_be_rebuilt_is_reported_as_torch_does(solo: rpc.WorkerInfo) -> None:
    # cls(*args) would fail (args is ("foo",)): PyTorch's message, the remote type and text.
    with pytest.raises(RuntimeError) as err:
        rpc.rpc_sync("solo", _raises_two_arg_error)
    text = str(err.value)
    assert not isinstance(err.value, TwoArgError)
    assert "Failed to create original exception type. Error msg was" in text, text
    assert "Original exception on remote side was" in text and "TwoArgError: foo" in text
    # A type whose constructor takes its args is still rebuilt as itself.
    with pytest.raises(KeyError):
        rpc.rpc_sync("solo", _raises_key_error)


def test_file_init_method_rendezvous_and_reinit(tmp_path: Any) -> None:
    results = run_cluster(
        3,
        bodies.init_twice_over_files,
        str(tmp_path),
        options={"init_method": f"file://{tmp_path}/init0"},
        timeout=90,
    )
    assert [r.value for r in results] == [["worker1"] * 2, ["worker2"] * 2, ["worker0"] * 2]
    # Rank 0 took its address back when it stopped; the file was private to this user.
    assert not list(tmp_path.glob("init*")), list(tmp_path.iterdir())


def test_file_rendezvous_without_rank0_times_out_clearly(tmp_path: Any) -> None:
    from gradwire._runtime.cluster import rendezvous

    plan = rendezvous.plan(f"file://{tmp_path}/f", 1, 2, None)
    assert plan.master == "" and plan.store_file == f"{tmp_path}/f"
    assert rendezvous.plan(f"file://{tmp_path}/f", 0, 2, None).listen == "127.0.0.1:0"
    with pytest.raises(RuntimeError, match="rank 0 wrote no address"):
        rendezvous.read_address(str(tmp_path / "f"), 0.2)
    rendezvous.publish_address(str(tmp_path / "f"), "127.0.0.1:5")
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o600
    assert rendezvous.read_address(str(tmp_path / "f"), 0.2) == "127.0.0.1:5"
    rendezvous.withdraw_address(str(tmp_path / "f"), "127.0.0.1:6")  # not ours: stays
    assert (tmp_path / "f").exists()
    rendezvous.withdraw_address(str(tmp_path / "f"), "127.0.0.1:5")
    assert not (tmp_path / "f").exists()


class NestedPickle:
    """PyTorch's MyPickleClass: pickles a PythonUDF with _internal_rpc_pickler inside its state."""

    def __init__(self) -> None:
        self.t: Any = None

    def __getstate__(self) -> Any:
        from gradwire.distributed.rpc.internal import PythonUDF, _internal_rpc_pickler

        return _internal_rpc_pickler.serialize(PythonUDF(gw.add, (gw.ones(2), gw.ones(2)), None))

    def __setstate__(self, state: Any) -> None:
        from gradwire.distributed.rpc.internal import _internal_rpc_pickler

        udf = _internal_rpc_pickler.deserialize(state[0], state[1])
        self.t = udf.func(*udf.args)


def _nested_value(obj: NestedPickle) -> Any:
    return obj.t


def test_internal_rpc_pickler_nests_in_a_call_and_keeps_the_policy(solo: rpc.WorkerInfo) -> None:
    from gradwire.distributed.rpc.internal import PythonUDF, _internal_rpc_pickler

    assert rpc.rpc_sync("solo", _nested_value, (NestedPickle(),)).tolist() == [2.0, 2.0]
    data, tensors = _internal_rpc_pickler.serialize(PythonUDF(gw.mul, (gw.ones(1), 3), None))
    assert len(tensors) == 1 and b"gradwire" in data  # the tensor is not in the pickle
    import os
    import pickle

    refused = pickle.dumps(PythonUDF(os.system, ("true",), None))
    with pytest.raises(gw.errors.PolicyError, match="posix:system is refused"):
        _internal_rpc_pickler.deserialize(refused, [])
    with pytest.raises(gw.errors.SerializationError, match="tensor table reference"):
        _internal_rpc_pickler.deserialize(data, [])


def test_a_peer_cannot_push_a_gather_map_no_round_waits_for(solo: rpc.WorkerInfo) -> None:
    from gradwire.distributed.rpc import _gather

    with pytest.raises(gw.errors.ArgumentError, match="no round 0 of"):
        rpc.rpc_sync("solo", _gather._deliver_round, (("solo",), 0, {"solo": 1}))
    with pytest.raises(gw.errors.ArgumentError, match="must hold"):
        rpc.rpc_sync("solo", _gather._deliver_round, (("solo",), 0, {"mallory": 1}))
    with pytest.raises(gw.errors.ArgumentError, match="not a worker of this cluster"):
        rpc.rpc_sync("solo", _gather._deliver_round, (("solo", "mallory"), 0, {}))
    with _gather._cond:
        assert not _gather._results and not _gather._waiting
    assert rpc.api._all_gather("x") == {"solo": "x"}  # a real round still works


def _echo(x: Any) -> Any:
    return x


def _strides_of(x: Any) -> Any:
    return (x.is_contiguous(), x.stride())


def test_a_small_view_keeps_its_layout_across_the_wire(solo: rpc.WorkerInfo) -> None:
    base = gw.rand(5, 5)
    view = base.narrow(1, 2, 2)  # PyTorch's test_non_cont_tensors
    assert rpc.rpc_sync("solo", _strides_of, (view,)) == (False, (5, 1))
    back = rpc.rpc_sync("solo", _echo, (view,))
    assert not back.is_contiguous() and back.stride() == (5, 1)
    assert gw.equal(back, view)
    back[0, 0] = 7.0  # its own memory: the sender's tensor is untouched
    assert view[0, 0].item() < 1.0 and back[0, 0].item() == 7.0
    t = gw.arange(6.0).reshape(2, 3).t()
    assert rpc.rpc_sync("solo", _strides_of, (t,)) == (False, (1, 3))
    # A view of a large storage (>= 8 KiB and twice the view) travels as a contiguous copy.
    column = gw.rand(100, 100).narrow(1, 3, 1)
    assert rpc.rpc_sync("solo", _strides_of, (column,)) == (True, (1, 1))
    assert gw.equal(rpc.rpc_sync("solo", _echo, (column,)), column)


@pytest.mark.parametrize(
    ("shape", "strides", "nbytes", "match"),
    [
        ((5, 2), (5, 1), 22 * 4 - 4, "reaches element 21"),  # one element short
        ((5, 2), (-5, 1), 88, "malformed"),
        ((5, 2), (5,), 88, "malformed"),
        ((5, 2), (5, 1), 87, "malformed"),
        ((0, 2), (5, 1), 88, "malformed"),
    ],
)
def test_a_view_s_strides_may_not_reach_past_its_data(
    shape: tuple[int, ...], strides: tuple[int, ...], nbytes: int, match: str
) -> None:
    from gradwire._proto import worker_pb2 as pb
    from gradwire._wire import framing

    meta = pb.TensorMeta(dtype="float32", shape=shape, nbytes=nbytes, strides=strides)
    header = pb.FrameHeader(last=True)
    header.payload.pickle_nbytes = 0
    header.payload.tensors.append(meta)
    with pytest.raises(gw.errors.SerializationError, match=match):
        framing.assemble_one(framing.Frame(header, (b"",)), 1 << 20)
