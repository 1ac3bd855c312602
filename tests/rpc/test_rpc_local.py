"""One worker calling itself over real gRPC: API forms, errors, policy, async_execution, limits."""

from __future__ import annotations

import operator
import os
import pickle
import time
from typing import Any

import numpy as np
import pytest
from gradwire import errors
from gradwire.distributed import rpc
from gradwire.futures import Future

_ran: list[str] = []


def echo(x: Any) -> Any:
    return x


def record(tag: str) -> str:
    _ran.append(tag)
    return tag


def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


class CustomError(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(code, text)
        self.code = code


def raise_custom() -> None:
    raise CustomError(7, "custom failure")


def raise_key() -> None:
    {}["missing"]


class _Unpicklable(Exception):
    def __reduce__(self) -> Any:
        raise TypeError("no pickling")


def raise_unpicklable() -> None:
    raise _Unpicklable("cannot travel")


class Counter:
    def __init__(self, start: int) -> None:
        self.start = start

    def plus(self, n: int) -> int:
        return self.start + n

    @staticmethod
    def twice(n: int) -> int:
        return 2 * n

    @classmethod
    def name(cls) -> str:
        return cls.__name__

    @staticmethod
    @rpc.functions.async_execution
    def async_static(n: int) -> Future[int]:
        fut: Future[int] = Future()
        fut.set_result(n + 1)
        return fut

    @rpc.functions.async_execution
    @classmethod
    def async_class(cls, n: int) -> Future[int]:
        return rpc.rpc_async("solo", operator.mul, (n, 10))


@rpc.functions.async_execution
def async_chain(n: int) -> Future[int]:
    return rpc.rpc_async(rpc.get_worker_info(), operator.add, (n, 1)).then(lambda f: f.value() * 2)


@rpc.functions.async_execution
def async_not_future() -> int:
    return 3


def return_future() -> Future[int]:
    return Future()


# -- calls -------------------------------------------------------------------------------------


def test_destination_as_name_info_and_rank(solo: rpc.WorkerInfo) -> None:
    assert rpc.rpc_sync("solo", operator.add, (1, 2)) == 3
    assert rpc.rpc_sync(solo, operator.add, (1, 2)) == 3
    assert rpc.rpc_sync(0, operator.add, (1, 2)) == 3
    assert rpc.rpc_async(0, max, ([3, 9, 1],)).wait() == 9
    assert rpc.rpc_sync("solo", echo, kwargs={"x": {"a": [1, 2.5]}}) == {"a": [1, 2.5]}


def test_callable_forms_resolve_on_the_callee(solo: rpc.WorkerInfo) -> None:
    assert rpc.rpc_sync("solo", Counter(5).plus, (3,)) == 8
    assert rpc.rpc_sync("solo", Counter.twice, (4,)) == 8
    assert rpc.rpc_sync("solo", Counter.name) == "Counter"
    made = rpc.rpc_sync("solo", Counter, (9,))
    assert isinstance(made, Counter) and made.start == 9
    assert rpc.rpc_sync("solo", "abc".upper) == "ABC"
    assert rpc.rpc_sync("solo", np.add, (1, 2)) == 3


def test_lambda_is_refused_on_the_caller(solo: rpc.WorkerInfo) -> None:
    with pytest.raises(errors.SerializationError, match="lambda or a local function"):
        rpc.rpc_async("solo", lambda: 1)


def test_numpy_arrays_round_trip_with_shape_and_dtype(solo: rpc.WorkerInfo) -> None:
    base = np.arange(60, dtype=np.float64).reshape(6, 10)
    view = base[::2, 1::3]
    got = rpc.rpc_sync("solo", echo, (view,))
    assert got.shape == view.shape and got.dtype == view.dtype
    np.testing.assert_array_equal(got, view)
    got[0, 0] = -1.0  # arrives writable and independent of the sender's buffer
    assert base[0, 1] == 1.0


# -- errors ------------------------------------------------------------------------------------


def test_remote_exception_is_rebuilt_as_its_type_with_worker_and_traceback(
    solo: rpc.WorkerInfo,
) -> None:
    with pytest.raises(CustomError) as info:
        rpc.rpc_sync("solo", raise_custom)
    err = info.value
    assert isinstance(err, errors.RemoteError)
    assert err.code == 7 and err.args == (7, "custom failure")
    assert err.worker == "solo"
    text = str(err)
    assert "worker 'solo'" in text and "raise_custom" in text and "custom failure" in text
    with pytest.raises(KeyError, match="missing"):
        rpc.rpc_async("solo", raise_key).wait()


def test_unrebuildable_exception_becomes_remote_error(solo: rpc.WorkerInfo) -> None:
    with pytest.raises(errors.RemoteError) as info:
        rpc.rpc_sync("solo", raise_unpicklable)
    assert type(info.value) is errors.RemoteError
    assert info.value.remote_type.endswith(":_Unpicklable")
    assert "cannot travel" in str(info.value) and "raise_unpicklable" in str(info.value)


def test_timeout_is_a_timeout_error_naming_destination_and_elapsed(solo: rpc.WorkerInfo) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        rpc.rpc_sync("solo", slow, (2.0,), timeout=0.3)
    assert time.monotonic() - started < 1.5
    assert isinstance(info.value, errors.RpcTimeoutError)
    assert "'solo'" in str(info.value) and "timed out after 0." in str(info.value)
    with pytest.raises(errors.RpcTimeoutError):
        rpc.rpc_async("solo", slow, (2.0,), timeout=0.3).wait()
    assert rpc.rpc_sync("solo", slow, (0.01,), timeout=0) == "done"  # 0: no timeout
    assert rpc.get_rpc_timeout() == 20.0


@pytest.mark.parametrize(
    ("to", "match"),
    [
        ("nobody", "unknown worker 'nobody'"),
        (1, "rank 1 is out of range for world size 1"),
        (-1, "out of range"),
        (0.5, "must be a worker name, a WorkerInfo or an int rank"),
        (0.0, "rank must be an int, got the float 0.0"),
        (rpc.WorkerInfo("solo", 3), "not a member"),
    ],
)
def test_unknown_destinations(solo: rpc.WorkerInfo, to: Any, match: str) -> None:
    with pytest.raises(errors.UnknownWorkerError, match=match):
        rpc.rpc_sync(to, operator.add, (1, 2))
    with pytest.raises(errors.UnknownWorkerError):
        rpc.get_worker_info("nobody")


def test_policy_refuses_eval_and_os_system_before_running(
    solo: rpc.WorkerInfo, tmp_path: Any
) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises(errors.PolicyError, match="builtins:eval is refused"):
        rpc.rpc_sync("solo", eval, ("1 + 1",))
    with pytest.raises(errors.PolicyError, match="system is refused") as info:
        rpc.rpc_sync("solo", os.system, (f"touch {marker}",))
    assert "worker 'solo'" in str(info.value)
    # A global hidden inside the arguments is refused by the restricted unpickler too.
    with pytest.raises(errors.PolicyError, match="refused"):
        rpc.rpc_sync("solo", echo, (os.system,))
    assert not marker.exists()


def test_future_cannot_be_sent(solo: rpc.WorkerInfo) -> None:
    with pytest.raises(errors.SerializationError, match="cannot be pickled"):
        rpc.rpc_async("solo", echo, (Future(),))
    with pytest.raises(errors.SerializationError, match="cannot be pickled"):
        rpc.rpc_sync("solo", return_future)
    with pytest.raises(errors.FuturePicklingError):
        pickle.dumps(Future())


# -- async_execution -------------------------------------------------------------------------


def test_async_execution_functions_and_methods(solo: rpc.WorkerInfo) -> None:
    assert rpc.rpc_sync("solo", async_chain, (4,)) == 10
    assert rpc.rpc_sync("solo", Counter.async_static, (4,)) == 5
    assert rpc.rpc_sync("solo", Counter.async_class, (4,)) == 40
    with pytest.raises(TypeError, match="not a gradwire.futures.Future"):
        rpc.rpc_sync("solo", async_not_future)


# -- lifecycle -------------------------------------------------------------------------------


def test_debug_info_counts_calls(solo: rpc.WorkerInfo) -> None:
    before = rpc.get_debug_info()
    rpc.rpc_sync("solo", operator.add, (1, 2))
    with pytest.raises(ZeroDivisionError):
        rpc.rpc_sync("solo", operator.truediv, (1, 0))
    info = rpc.get_debug_info()
    assert info["calls_served"] == before["calls_served"] + 2
    assert info["calls_failed"] == before["calls_failed"] + 1
    assert info["state"] == "RUNNING"
    assert info["peers"][0]["name"] == "solo"
    assert info["peers"][0]["channel_state"] in ("READY", "IDLE")


def test_worker_info_is_hashable_picklable_and_travels(solo: rpc.WorkerInfo) -> None:
    assert rpc.get_worker_info() == solo == rpc.get_worker_info("solo")
    assert solo.name == "solo" and solo.id == 0
    assert {solo: 1}[rpc.WorkerInfo("solo", 0)] == 1
    assert pickle.loads(pickle.dumps(solo)) == solo
    assert rpc.rpc_sync("solo", echo, (solo,)) == solo
