"""The side-table pickler, the restricted unpickler, the policy and the exception codec."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
from typing import Any

import numpy as np
import pytest
from gradwire._proto import worker_pb2 as pb
from gradwire._tensor import Tensor
from gradwire._wire import calls, pickler
from gradwire._wire.exceptions import decode_exception, encode_exception
from gradwire._wire.framing import Assembler, decode_frame, encode_frame, split
from gradwire._wire.pickler import DecodeContext, EncodeContext, dumps, loads
from gradwire._wire.policy import CallablePolicy
from gradwire.errors import PolicyError, RemoteError, SerializationError

POLICY = CallablePolicy()


def _through_wire(
    obj: Any, policy: CallablePolicy = POLICY, chunk: int = 64
) -> tuple[Any, EncodeContext, bytes]:
    ctx = EncodeContext(peer="w1")
    first, buffers = calls.encode_body(pb.FrameHeader(call=pb.CallHeader()), obj, ctx)
    asm = Assembler(1 << 30)
    for f in split(first, buffers, chunk):
        asm.feed(decode_frame(encode_frame(f)))
    assert asm.message is not None
    body, _ = calls.decode_body(asm.message, {"policy": policy, "peer": "w0", "worker": "w1"})
    return body, ctx, bytes(buffers[0])


def test_tensor_data_never_enters_the_pickle() -> None:
    data = np.full(1000, 7.0)
    t = Tensor._wrap(np.arange(12.0).reshape(3, 4), requires_grad=True)
    body, ctx, pickled = _through_wire({"arr": data, "t": t, "n": 3})
    assert len(pickled) < 200  # 8 KB of array data went to the side table
    assert data.tobytes() not in pickled
    assert [m.kind for m, _ in ctx.tensors] == ["ndarray", "tensor"]
    np.testing.assert_array_equal(body["arr"], data)
    assert isinstance(body["t"], Tensor) and body["t"].requires_grad
    np.testing.assert_array_equal(body["t"].detach().numpy(), t.detach().numpy())
    assert body["n"] == 3


def test_a_view_sends_only_its_elements_and_keeps_its_shape() -> None:
    base = np.arange(10_000, dtype=np.int64).reshape(100, 100)
    view = base[10:12, ::25]
    body, ctx, _ = _through_wire(view)
    meta, buf = ctx.tensors[0]
    assert meta.nbytes == view.size * 8 == buf.nbytes
    assert tuple(meta.shape) == (2, 4)
    np.testing.assert_array_equal(body, view)


def test_values_in_the_other_byte_order_arrive_as_the_same_numbers() -> None:
    other = ">" if np.little_endian else "<"
    arr = np.arange(6, dtype=f"{other}f4").reshape(2, 3)
    t = Tensor._wrap(np.arange(4, dtype=f"{other}i8"), requires_grad=False)
    body, ctx, _ = _through_wire({"arr": arr, "t": t, "ok": np.arange(3.0)})
    # The ndarray is pickled (its dtype kept as it is); the tensor travels raw, made native.
    assert [m.kind for m, _ in ctx.tensors] == ["tensor", "ndarray"]
    assert ctx.tensors[0][0].dtype == "int64"
    np.testing.assert_array_equal(body["arr"], np.arange(6.0).reshape(2, 3))
    assert body["arr"].dtype == arr.dtype
    np.testing.assert_array_equal(body["t"].numpy(), np.arange(4))
    np.testing.assert_array_equal(body["ok"], np.arange(3.0))


def test_tensor_view_keeps_shape() -> None:
    t = Tensor._wrap(np.arange(24.0).reshape(4, 6)[:, 1::2])
    body, ctx, _ = _through_wire(t)
    assert tuple(ctx.tensors[0][0].shape) == (4, 3)
    np.testing.assert_array_equal(body.numpy(), t.numpy())


def test_shared_tensor_is_sent_once_and_arrives_shared() -> None:
    a = np.ones(100)
    body, ctx, _ = _through_wire([a, a])
    assert len(ctx.tensors) == 1  # pickle memoizes the persistent id
    assert body[0] is body[1]


def test_object_arrays_fall_back_to_restricted_pickle() -> None:
    arr = np.array([1, "x", None], dtype=object)
    body, ctx, _ = _through_wire(arr)
    assert ctx.tensors == [] and list(body) == [1, "x", None]


@pytest.mark.parametrize("obj", [os.system, eval, subprocess.Popen, getattr, np.load, pickle.loads])
def test_restricted_unpickler_refuses_dangerous_globals(obj: Any) -> None:
    data = pickle.dumps(obj)
    with pytest.raises(PolicyError, match="refused by the callable policy"):
        loads(data, DecodeContext(POLICY, pb.Payload(), []))


def test_origin_is_checked_not_just_the_name() -> None:
    # tests.wire.test_pickler:os.system would pass a module-name check; its origin is posix.
    with pytest.raises(PolicyError, match="system is refused"):
        POLICY.resolve(__name__, "os.system")
    with pytest.raises(PolicyError):
        POLICY.resolve("builtins", "object.__subclasses__")


def test_policy_patterns_and_trust_switch() -> None:
    assert not POLICY.allows("json", "dumps")
    assert CallablePolicy(allow=("json",)).allows("json", "dumps")
    assert CallablePolicy(allow=("json:dumps",)).allows("json", "dumps")
    assert not CallablePolicy(allow=("json:dumps",)).allows("json", "loads")
    assert not CallablePolicy(allow_user_modules=False).allows(
        __name__, "test_policy_patterns_and_trust_switch"
    )
    assert POLICY.allows(__name__, "test_policy_patterns_and_trust_switch")
    assert CallablePolicy(trust_everything=True).allows("os", "system")


def test_unresolvable_name_names_the_worker() -> None:
    with pytest.raises(SerializationError, match="does not resolve on worker 'w9'"):
        POLICY.resolve(__name__, "no_such_function", worker="w9")


class Box:
    def get(self) -> int:
        return 1


def test_function_names_of_every_callable_form() -> None:
    assert calls.function_name(len) == ("builtins:len", None)
    assert calls.function_name(Box) == (f"{__name__}:Box", None)
    box = Box()
    assert calls.function_name(box.get) == (f"{__name__}:Box.get", box)
    assert calls.function_name("ab".upper) == ("builtins:str.upper", "ab")
    with pytest.raises(SerializationError, match="lambda"):
        calls.function_name(lambda: 0)


def test_unpicklable_argument_is_a_serialization_error() -> None:
    import threading

    with pytest.raises(SerializationError, match="for worker 'w1'"):
        dumps(threading.Lock(), EncodeContext(peer="w1"))


class AppError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"code {code}")
        self.code = code


def test_exception_rebuilt_as_original_type_and_remote_error() -> None:
    try:
        raise AppError(5)
    except AppError as exc:
        encoded = encode_exception(exc, "w3")
    err = decode_exception(encoded, POLICY)
    assert isinstance(err, AppError) and isinstance(err, RemoteError)
    assert err.code == 5 and err.worker == "w3"
    assert "code 5" in str(err) and "worker 'w3'" in str(err) and "raise AppError(5)" in str(err)
    # It can travel on through another call and still be rebuilt there.
    again = decode_exception(encode_exception(err, "w4"), POLICY)
    assert isinstance(again, AppError) and again.worker == "w4"
    assert "caused on worker 'w3'" in again.remote_traceback


def test_exception_of_a_refused_type_is_a_plain_remote_error() -> None:
    try:
        raise AppError(1)
    except AppError as exc:
        encoded = encode_exception(exc, "w3")
    err = decode_exception(encoded, CallablePolicy(allow_user_modules=False))
    assert type(err) is RemoteError and err.remote_type.endswith(":AppError")
    assert "code 1" in str(err)


@pytest.mark.parametrize(
    "body",
    [
        None,
        (None, (), {}),
        (None, (1, 2.5, "x", b"y", True), {"k": None}),
        (None, ([1, 2], {"a": (3, 4)}), {}),
        [None] * 8,
    ],
)
def test_plain_bodies_pickle_to_the_same_bytes_without_the_side_table_pickler(body: Any) -> None:
    plain = pickler.dumps(body, pickler.EncodeContext())
    assert plain == pickle.dumps(body, pickler.PROTOCOL)
    buf = io.BytesIO()
    pickler._Pickler(buf, pickler.EncodeContext()).dump(body)
    assert plain == buf.getvalue()


def test_a_tensor_inside_a_body_still_goes_to_the_side_table() -> None:
    ctx = pickler.EncodeContext()
    arr = np.arange(4.0)
    data = pickler.dumps((None, (1, arr), {}), ctx)
    assert len(ctx.tensors) == 1 and pickle.dumps(arr, pickler.PROTOCOL) not in data
    # Past the plain check's depth or width the side-table pickler still runs.
    deep = pickler.EncodeContext()
    pickler.dumps((None, ([[arr]],), {}), deep)
    wide = pickler.EncodeContext()
    pickler.dumps((None, tuple(range(9)) + (arr,), {}), wide)
    assert len(deep.tensors) == 1 and len(wide.tensors) == 1


@pytest.mark.parametrize(
    "value",
    [None, (None, (), {}), (None, (1, 2.5, "x", b"y", True), {"k": None}), [1, 2], {"a": (3,)}],
)
def test_plain_data_is_decoded_by_the_c_unpickler_alone(value: Any) -> None:
    data = pickle.dumps(value, pickler.PROTOCOL)
    assert pickler.loads_plain(data) == (True, value)
    assert pickler.loads_plain(memoryview(data)) == (True, value)


@pytest.mark.parametrize("obj", [os.system, eval, subprocess.Popen, np.load, pickle.loads])
def test_a_pickle_naming_a_global_never_takes_the_plain_decoder(obj: Any) -> None:
    for protocol in (0, 2, pickler.PROTOCOL):
        data = pickle.dumps((None, (obj,), {}), protocol)
        assert pickler.loads_plain(data) == (False, None)
        with pytest.raises(PolicyError, match="refused by the callable policy"):
            loads(data, DecodeContext(POLICY, pb.Payload(), []))


def test_crafted_call_opcodes_on_plain_data_run_nothing() -> None:
    # REDUCE / BUILD / OBJ / NEWOBJ over plain objects, persistent ids, extension codes: the
    # plain decoder builds nothing from them, and the restricted unpickler refuses or fails.
    crafted = [
        b"\x80\x05X\x02\x00\x00\x00ls\x94)R.",  # "ls"(*()) via REDUCE
        b"\x80\x05]\x94}\x94b.",  # BUILD a list from a dict
        b"\x80\x05(X\x01\x00\x00\x00xo.",  # OBJ with a string as the class
        b"\x80\x05X\x01\x00\x00\x00x)\x81.",  # NEWOBJ with a string as the class
        b"\x80\x05X\x01\x00\x00\x00xQ.",  # a side-table reference that was never sent
        b"\x80\x05\x82\x01.",  # EXT1 code 1
    ]
    for data in crafted:
        assert pickler.loads_plain(data) == (False, None), data
        with pytest.raises((PolicyError, SerializationError)):
            loads(data, DecodeContext(POLICY, pb.Payload(), []))


def test_strings_that_look_like_opcodes_stay_plain_and_bad_bytes_are_reported() -> None:
    value = (None, ("cQRibo", 99), {"b": 3})  # opcode letters inside strings and numbers
    data = pickle.dumps(value, pickler.PROTOCOL)
    assert pickler.loads_plain(data) == (True, value)
    assert loads(data, DecodeContext(POLICY, pb.Payload(), [])) == value
    assert pickler.loads_plain(b"\x80\x05") == (False, None)  # truncated: left to loads()
    with pytest.raises(SerializationError, match="cannot deserialize"):
        loads(b"\x80\x05", DecodeContext(POLICY, pb.Payload(), []))
