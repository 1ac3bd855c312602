"""The attacker's suite: what a peer holding the cluster token tries, against the default policy.

Every case runs twice: under the default policy, where it must be refused with a PolicyError
naming what was refused (and the worker keeps serving), and with ``trust_everything=True``,
where the same call must go through, so each case shows that the refusal is the policy's.
The worker calls itself over real gRPC on loopback TCP; the attacker sends
``_call_method`` (what ``rref.rpc_sync().name(...)`` sends) by hand, past the proxy's
client-side checks.
"""

from __future__ import annotations

import builtins
import operator
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gradwire as gw
import gradwire.multiprocessing  # noqa: F401 - gw.multiprocessing below
import numpy as np
import pytest
from gradwire import errors
from gradwire._runtime import agent as agent_mod
from gradwire.distributed import rpc
from gradwire.distributed.rpc.rref import _call_method
from numpy.lib.stride_tricks import as_strided

from .conftest import solo_options


@pytest.fixture(scope="module", params=["default", "trusted"])
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """This process as worker "solo" under the default policy, or with trust_everything."""
    trusted = request.param == "trusted"
    rpc.init_rpc("solo", 0, 1, solo_options(use_unix_socket=False, trust_everything=trusted))
    try:
        yield request.param
    finally:
        rpc.shutdown(graceful=False)


def _sync_over_grpc(fn: Any, args: tuple[Any, ...]) -> Any:
    """rpc_sync by gRPC (its call streams) rather than on the bulk lane, where rpc_sync goes
    over TCP by default: both must refuse what the policy refuses."""
    transport = agent_mod.current().transport
    lane, transport.lane = transport.lane, None
    try:
        return rpc.rpc_sync("solo", fn, args)
    finally:
        transport.lane = lane


def _verbs() -> list[Callable[..., Any]]:
    return [
        lambda fn, args: rpc.rpc_sync("solo", fn, args),  # on the bulk lane (TCP)
        _sync_over_grpc,
        lambda fn, args: rpc.rpc_async("solo", fn, args).wait(),
        lambda fn, args: rpc.remote("solo", fn, args).to_here(),
    ]


def _still_serving() -> None:
    assert rpc.rpc_sync("solo", operator.add, (1, 2)) == 3


def _refused(call: Callable[[], Any], *names: str) -> None:
    with pytest.raises(errors.PolicyError) as info:
        call()
    message = str(info.value)
    assert "refused" in message and all(n in message for n in names), message
    _still_serving()


class Checkpointer:
    """A program's own class: its methods may touch files (a parameter server saving)."""

    run = staticmethod(os.system)  # but a class attribute holding os.system is not its code

    def __init__(self) -> None:
        self.helper = subprocess.Popen

    def save(self, path: str) -> str:
        Path(path).write_text("checkpoint")
        return path


# -- walking dunders toward os, subprocess, builtins and sys -----------------------------------

ESCAPE_STEPS: list[tuple[str, Callable[[], Any], str, tuple[Any, ...]]] = [
    # (label, value on the worker, member, args)
    ("array.__getattribute__", lambda: np.zeros(3), "__getattribute__", ("__class__",)),
    ("array.__reduce_ex__", lambda: np.zeros(3), "__reduce_ex__", (2,)),
    ("array.__init_subclass__", lambda: np.zeros(3), "__init_subclass__", ()),
    ("array.__format__", lambda: np.zeros(3), "__format__", ("",)),
    ("array.__dir__", lambda: np.zeros(3), "__dir__", ()),
    ("tensor.__getattribute__", lambda: gw.zeros(2), "__getattribute__", ("__dict__",)),
    ("tensor._data", lambda: gw.zeros(2), "__getattribute__", ("_data",)),
    ("class.__subclasses__", lambda: object, "__subclasses__", ()),
    ("class.mro", lambda: np.ndarray, "mro", ()),
    ("function.__getattribute__", lambda: gw.Tensor.backward, "__getattribute__", ("__globals__",)),
    ("method.__reduce__", lambda: gw.zeros(2).backward, "__reduce__", ()),
    ("dict.__getitem__", lambda: vars(gw), "__getitem__", ("__builtins__",)),
    ("builtins.__import__", lambda: builtins, "__import__", ("os",)),
    ("builtins.eval", lambda: builtins, "eval", ("1 + 1",)),
    ("builtins.open", lambda: builtins, "open", (__file__,)),
    ("builtins.getattr", lambda: builtins, "getattr", ("abc", "upper")),
    ("os.system", lambda: os, "system", ("true",)),
    ("os.getcwd", lambda: os, "getcwd", ()),
    ("os.listdir", lambda: os, "listdir", ("/",)),
    ("subprocess.run", lambda: subprocess, "run", (["true"],)),
    ("subprocess.getoutput", lambda: subprocess, "getoutput", ("true",)),
    ("sys.getrefcount", lambda: sys, "getrefcount", (1,)),
    ("sys.intern", lambda: sys, "intern", ("x",)),
    ("rref._handle", lambda: rpc.RRef(1), "_live", ("x",)),
    ("str.format", lambda: "{0.__class__.__mro__}", "format", (np.zeros(1),)),
    ("user class attribute", lambda: Checkpointer(), "run", ("true",)),
    ("user instance attribute", lambda: Checkpointer(), "helper", (["true"],)),
]


@pytest.mark.parametrize(
    "verb", [0, 1, 2, 3], ids=["rpc_sync", "rpc_sync_grpc", "rpc_async", "remote"]
)
@pytest.mark.parametrize("label,make,member,args", ESCAPE_STEPS, ids=[s[0] for s in ESCAPE_STEPS])
def test_every_escape_step_is_refused(
    mode: str, verb: int, label: str, make: Callable[[], Any], member: str, args: tuple[Any, ...]
) -> None:
    rref = rpc.RRef(make())
    call = _verbs()[verb]
    if mode == "default":
        _refused(lambda: call(_call_method, (member, rref, *args)), repr(member))
        return
    # trust_everything: the same step runs; only its result may fail to travel back.
    try:
        call(_call_method, (member, rref, *args))
    except errors.PolicyError:
        raise
    except errors.SerializationError:
        pass  # a module, a frame, a dict of modules: ran, but cannot be pickled back
    _still_serving()


def test_a_chain_of_proxied_calls_reaches_os_system_only_when_trusted(
    mode: str, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    # tensor -> bound method -> function -> its module's globals -> builtins -> os -> system
    steps = [
        ("__getattribute__", ("backward",)),
        ("__getattribute__", ("__func__",)),
        ("__getattribute__", ("__globals__",)),
        ("get", ("builtins",)),
        ("__import__", ("os",)),
        ("system", (f"touch {marker}",)),
    ]
    rref = rpc.remote("solo", gw.zeros, (2,))
    if mode == "default":
        first, args = steps[0]
        _refused(lambda: rpc.remote("solo", _call_method, (first, rref, *args)).to_here(), first)
        # every later step, tried from the value it would have reached, is refused too
        values = [gw.zeros(2).backward, gw.Tensor.backward, vars(sys.modules["gradwire._tensor"])]
        values += [builtins, os]
        for value, (name, args) in zip(values, steps[1:]):
            if name == "get":
                continue  # dict.get is a plain builtin method; the dict was out of reach
            _refused(
                lambda n=name, v=value, a=args: rpc.rpc_sync(
                    "solo", _call_method, (n, rpc.RRef(v), *a)
                ),
                repr(name),
            )
        assert not marker.exists()
        return
    for name, args in steps:
        rref = rpc.remote("solo", _call_method, (name, rref, *args))
    assert rref.to_here() == 0
    assert marker.exists()


# -- file methods of remote arrays and tensors --------------------------------------------------


@pytest.mark.parametrize(
    "make,member,use_path",
    [
        (lambda: np.arange(3.0), "tofile", True),
        (lambda: np.arange(3.0), "dump", True),
        (lambda: np.float64(1.5), "tofile", True),
        (lambda: gw.zeros(3), "share_memory_", False),
    ],
    ids=["ndarray.tofile", "ndarray.dump", "float64.tofile", "Tensor.share_memory_"],
)
def test_file_methods_of_remote_arrays_and_tensors(
    mode: str, tmp_path: Path, make: Callable[[], Any], member: str, use_path: bool
) -> None:
    target = tmp_path / "written"
    args = (str(target),) if use_path else ()
    rref = rpc.RRef(make())
    if mode == "default":
        _refused(lambda: rref.rpc_sync().__getattr__(member)(*args), repr(member))
        assert not target.exists()
        return
    rref.rpc_sync().__getattr__(member)(*args)
    assert target.exists() or not use_path


def test_the_programs_own_methods_may_still_save_checkpoints(mode: str, tmp_path: Path) -> None:
    rref = rpc.RRef(Checkpointer())
    path = str(tmp_path / "ckpt")
    assert rref.rpc_sync().save(path) == path
    assert Path(path).read_text() == "checkpoint"
    assert rref.remote().save(path + "2").to_here() == path + "2"
    # and the allowed methods of default types work through the proxy as they do in PyTorch
    assert rpc.RRef(np.arange(4.0)).rpc_sync().sum() == 6.0
    assert rpc.RRef([1]).rpc_async().count(1).wait() == 1
    assert rpc.RRef(gw.ones(2)).rpc_sync().sum().item() == 2.0


# -- memory: views over caller-chosen strides ---------------------------------------------------


def test_views_past_the_end_of_an_array_never_leave_the_worker(mode: str) -> None:
    big = (10_000,)
    call = lambda: rpc.rpc_sync("solo", as_strided, (np.zeros(4), big, (8,)))  # noqa: E731
    if mode == "default":
        _refused(call, "as_strided")
    else:
        # it runs, but the reply is refused before a byte past the array is serialized
        with pytest.raises(errors.SerializationError, match="outside its base buffer"):
            call()
        _still_serving()
    # the same check guards the caller's side: such a view cannot be sent either
    with pytest.raises(errors.SerializationError, match="outside its base buffer"):
        rpc.rpc_sync("solo", operator.pos, (as_strided(np.zeros(4), big, (8,)),))
    # an in-bounds view of any stride travels
    x = np.arange(10.0)
    out = rpc.rpc_sync("solo", operator.pos, (as_strided(x, (5,), (16,)),))
    assert out.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]


# -- gradwire's own host-touching API -----------------------------------------------------------


@pytest.mark.parametrize(
    "fn,args",
    [
        (gw.multiprocessing.spawn, (operator.add, (), 1)),
        (gw.multiprocessing.start_processes, (operator.add, (), 1)),
        (gw.multiprocessing.Pipe, ()),
        (rpc.init_rpc, ("again", 0, 1)),
        (rpc.shutdown, ()),
        (rpc.rpc_sync, ("solo", operator.add, (1, 2))),
        (gw.futures.set_blocking_hook, (None,)),
    ],
    ids=["spawn", "start_processes", "Pipe", "init_rpc", "shutdown", "rpc_sync", "hook"],
)
def test_host_touching_gradwire_api_is_refused(mode: str, fn: Any, args: tuple[Any, ...]) -> None:
    if mode == "trusted":
        pytest.skip("with trust_everything these would really start processes or stop the worker")
    _refused(lambda: rpc.rpc_sync("solo", fn, args), fn.__name__)
