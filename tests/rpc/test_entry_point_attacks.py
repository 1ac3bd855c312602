"""Attacks on gradwire's own peer-nameable entry points (policy ENTRY_POINTS and allow-list
helpers that act on the callee's state): RemoteModule's ``_ready_module`` and ``_param_rrefs``,
``_rref_typeof_on_owner`` (``RRef._get_type`` of a user) and ``_gather_put``, the leader's side
of ``rpc.api._all_gather``.

A peer holding the cluster token names these directly with arguments of its choosing; each
must act only on what it was made for, refuse everything else with an error naming what was
wrong, and leave the worker serving. The worker calls itself over real gRPC on loopback TCP.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

import gradwire as gw
import pytest
from gradwire import errors, nn
from gradwire.distributed import rpc
from gradwire.distributed.nn.remote_module import _param_rrefs, _ready_module
from gradwire.distributed.rpc import _gather
from gradwire.distributed.rpc._gather import _gather_put
from gradwire.distributed.rpc.rref import _rref_typeof_on_owner

from .conftest import solo_options


@pytest.fixture(scope="module")
def solo() -> Iterator[None]:
    rpc.init_rpc("solo", 0, 1, solo_options(use_unix_socket=False, rpc_timeout=10.0))
    try:
        yield
    finally:
        rpc.shutdown(graceful=False)


def _still_serving() -> None:
    assert rpc.rpc_sync("solo", operator.add, (1, 2)) == 3


def _refused(exc_type: type[BaseException], match: str, fn: Any, args: tuple[Any, ...]) -> None:
    with pytest.raises(exc_type, match=match):
        rpc.rpc_sync("solo", fn, args)
    _still_serving()


# -- RemoteModule's helpers -------------------------------------------------------------------


@pytest.mark.parametrize("entry", [_ready_module, _param_rrefs], ids=["ready", "params"])
def test_remote_module_helpers_refuse_anything_but_a_module_rref(solo: None, entry: Any) -> None:
    second = "cpu" if entry is _ready_module else True
    # Not an RRef, an RRef to a tensor, an RRef to a plain object: nothing is touched.
    _refused(TypeError, "RRef of an nn.Module owned by this worker", entry, (7, second))
    tensor_rref = rpc.remote("solo", gw.ones, (2,))
    _refused(TypeError, "got Tensor", entry, (tensor_rref, second))
    list_rref = rpc.remote("solo", list, ((1, 2),))
    _refused(TypeError, "got list", entry, (list_rref, second))
    assert list_rref.to_here() == [1, 2]  # the value the peer pointed at is untouched


def test_ready_module_takes_only_a_device_string(solo: None) -> None:
    module_rref = rpc.remote("solo", nn.Linear, (3, 2))
    weight_before = module_rref.to_here().weight.detach().clone()
    # A dtype where the device goes would convert the module's parameters in place.
    _refused(TypeError, "device string", _ready_module, (module_rref, gw.float64))
    _refused(ValueError, "unknown device", _ready_module, (module_rref, "tpu:0"))
    after = module_rref.to_here()
    assert after.weight.dtype == gw.float32
    assert gw.equal(after.weight.detach(), weight_before)
    rpc.rpc_sync("solo", _ready_module, (module_rref, "cpu"))  # the real use still works


def test_param_rrefs_hands_out_only_the_modules_parameters(solo: None) -> None:
    module_rref = rpc.remote("solo", nn.Linear, (3, 2))
    params = rpc.rpc_sync("solo", _param_rrefs, (module_rref, "yes"))
    shapes = sorted(tuple(p.to_here().shape) for p in params)
    assert shapes == [(2,), (2, 3)]


# -- _rref_typeof_on_owner -------------------------------------------------------------------


class Touchy:
    """A value whose own attributes a type query must not read (isinstance may read
    ``__class__``; nothing else)."""

    def __getattribute__(self, name: str) -> Any:
        if name != "__class__":
            raise AssertionError(f"read {name}")
        return object.__getattribute__(self, name)


def test_type_queries_take_only_an_owned_rref_and_read_nothing_of_the_value(solo: None) -> None:
    _refused(TypeError, "needs an RRef owned by this worker", _rref_typeof_on_owner, (7,))
    _refused(TypeError, "needs an RRef owned by this worker", _rref_typeof_on_owner, ("x", True))
    rref = rpc.remote("solo", nn.Linear, (2, 2))
    assert rpc.rpc_sync("solo", _rref_typeof_on_owner, (rref,)) is nn.Linear
    touchy = rpc.RRef(Touchy())
    assert rpc.rpc_sync("solo", _rref_typeof_on_owner, (touchy,)) is Touchy
    _still_serving()


# -- _gather_put ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((("solo", "mallory"), 0, "solo", None, 1.0), "not a worker of this cluster"),
        ((("mallory", "solo"), 0, "mallory", None, 1.0), "not a worker of this cluster"),
        (("solo", 0, "solo", None, 1.0), "tuple of worker names"),
        (((), 0, "solo", None, 1.0), "tuple of worker names"),
        ((("solo", "solo"), 0, "solo", None, 1.0), "tuple of worker names"),
        ((("solo",), "0", "solo", None, 1.0), "round"),
        ((("solo",), -1, "solo", None, 1.0), "round"),
        ((("solo",), 0, "eve", None, 1.0), "not among"),
        ((("solo",), 0, "solo", None, float("nan")), "timeout"),
        ((("solo",), 0, "solo", None, -5.0), "timeout"),
        ((("solo",), 0, "solo", None, "soon"), "timeout"),
    ],
    ids=[
        "unknown-member",
        "unknown-leader",
        "names-not-tuple",
        "names-empty",
        "names-repeated",
        "round-str",
        "round-negative",
        "name-not-member",
        "timeout-nan",
        "timeout-negative",
        "timeout-str",
    ],
)
def test_gather_put_refuses_malformed_rounds(solo: None, args: tuple[Any, ...], match: str) -> None:
    _refused(errors.ArgumentError, match, _gather_put, args)
    with _gather._cond:
        assert not _gather._values, "a refused round must leave nothing behind on the leader"


def test_gather_put_rounds_no_peer_can_complete_are_refused_at_once(solo: None) -> None:
    # A round naming only workers of this cluster, led by this one: legitimate, and a solo
    # cluster completes it at once. Without this the peer could park serving threads forever.
    assert rpc.rpc_sync("solo", _gather_put, (("solo",), 10**6, "solo", "x", 1.0)) == {"solo": "x"}
    with _gather._cond:
        assert not _gather._values


def test_gather_put_waits_are_bounded_by_the_leaders_rpc_timeout(solo: None) -> None:
    # A peer's round with no timeout (None or 0) still ends: the leader waits at most its own
    # rpc_timeout (10 s here) for the others; an explicit timeout is kept as given.
    assert _gather.wait_bound(None) == pytest.approx(10.0)
    assert _gather.wait_bound(0) == pytest.approx(10.0)
    assert _gather.wait_bound(3.0) == pytest.approx(3.0)
    assert _gather.wait_bound(60.0) == pytest.approx(60.0)
