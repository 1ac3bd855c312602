"""Random and mutated requests for every Worker RPC (the fuzzer's generator).

Each generator takes a ``random.Random`` and returns a :class:`Case`: the raw gRPC messages to
send (bytes, exactly as they go on the wire, so garbage is possible) and a label saying what
was done to them. Three families:

- garbage: random bytes, empty messages, a length prefix pointing past the end;
- protobuf requests with hostile values: unknown RRef ids, negative and huge ids, wrong context
  ids, random strings;
- frames (``[u32 N][FrameHeader][raw]``) built from a *valid* call or gradients message and then
  mutated: huge or negative shapes and sizes, byte lengths that do not match the header, bad
  dtypes, truncated and reordered chunk streams, malformed pickles, pickles naming disallowed
  globals, side-table references to tensors that are not there, bogus shared-memory refs.
"""

from __future__ import annotations

import dataclasses
import random
import struct
from collections.abc import Callable

import numpy as np
from gradwire._proto import worker_pb2 as pb
from gradwire._wire import calls
from gradwire._wire.framing import Frame, encode_frame, pack_batch, split
from gradwire._wire.pickler import EncodeContext

__all__ = [
    "Case",
    "GENERATORS",
    "METHODS",
    "valid_echo_frame",
    "HOSTILE_INTS",
    "disallowed_pickle",
]

#: Integers that break naive code: negative, zero, boundaries, beyond int64 when wrapped.
HOSTILE_INTS = (
    0,
    1,
    -1,
    -(2**63),
    2**63 - 1,
    2**31,
    2**32 + 7,
    2**48,
    (1 << 48) + 1,
    2**62,
    -12345,
)
BAD_DTYPES = ("object", "O", "", "float128", "V8", "<U4", "int", "float32\x00", "S3", "datetime64")

#: Worker methods by shape: "frames-unary", "frames-stream" (client-streaming frames), or the
#: protobuf request type of a unary / server-streaming method.
METHODS: dict[str, str | type] = {
    "Call": "frames-unary",
    "CallStream": "frames-stream",
    "CallPipe": "frames-stream",
    "PythonCall": "frames-stream",
    "RemoteCall": "frames-stream",
    "PropagateGradients": "frames-stream",
    "Remote": "frames-unary",
    "Gradients": "frames-unary",
    "Fetch": pb.FetchRequest,
    "FetchReply": pb.FetchReplyRequest,
    "FetchRRef": pb.FetchRequest,
    "ForkRequest": pb.ForkRequest,
    "ChildAck": pb.ChildAck,
    "RRefDelete": pb.RRefDelete,
    "ReleaseContext": pb.ReleaseContextRequest,
    "Members": pb.MemberUpdate,
    "Join": pb.JoinRequest,
    "Barrier": pb.BarrierRequest,
    "GetDebugInfo": pb.DebugInfoRequest,
    "WatchControl": pb.WatchRequest,
    "Profile": pb.ProfileWindow,
}


@dataclasses.dataclass
class Case:
    """One request: the wire messages (one for unary requests) and what was done to them."""

    messages: list[bytes]
    label: str


def _hint(rng: random.Random) -> int:
    return rng.choice(HOSTILE_INTS) if rng.random() < 0.7 else rng.randint(-(2**40), 2**40)


def _gid(rng: random.Random) -> pb.GloballyUniqueId:
    return pb.GloballyUniqueId(created_on=_hint(rng), local_id=_hint(rng))


def _text(rng: random.Random) -> str:
    choices = ["", "worker0", "target", "\x00", "a" * 300, "é∂", "../../etc/passwd", "shutdown"]
    return rng.choice(choices)


def random_bytes(rng: random.Random, limit: int = 2048) -> bytes:
    """Random bytes of random length (0 included)."""
    return rng.randbytes(rng.randint(0, limit))


def _mutate_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    if not data:
        return random_bytes(rng, 64), "random"
    b = bytearray(data)
    what = rng.choice(["flip", "truncate", "insert", "dup"])
    if what == "flip":
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif what == "truncate":
        del b[rng.randrange(len(b)) :]
    elif what == "insert":
        pos = rng.randrange(len(b) + 1)
        b[pos:pos] = random_bytes(rng, 32)
    else:
        pos = rng.randrange(len(b))
        b += b[pos:]
    return bytes(b), what


def random_proto(rng: random.Random, cls: type) -> pb.Message:  # type: ignore[name-defined]
    """A message of ``cls`` with every scalar, id and list field set to hostile values."""
    msg = cls()
    for field in msg.DESCRIPTOR.fields:
        if rng.random() < 0.2:
            continue
        name = field.name
        if field.message_type is not None:
            if field.message_type.name == "GloballyUniqueId":
                getattr(msg, name).CopyFrom(_gid(rng))
            elif field.message_type.name == "WorkerInfo":
                getattr(msg, name).CopyFrom(
                    pb.WorkerInfo(
                        name=_text(rng), id=_hint(rng), address=_text(rng), host_id=_text(rng)
                    )
                )
            continue
        if field.type == field.TYPE_STRING:
            if not isinstance(getattr(msg, name), str):
                getattr(msg, name).extend(_text(rng) for _ in range(rng.randint(0, 3)))
            else:
                setattr(msg, name, _text(rng))
        elif field.type == field.TYPE_BOOL and field.default_value is not None:
            setattr(msg, name, rng.random() < 0.5)
        elif field.type in (field.TYPE_INT64, field.TYPE_SINT64, field.TYPE_SFIXED64):
            setattr(msg, name, _hint(rng))
        elif field.type == field.TYPE_DOUBLE:
            setattr(msg, name, rng.choice([0.0, -1.0, 1e308, float("nan"), float("inf")]))
    return msg


def disallowed_pickle(rng: random.Random) -> bytes:
    """A protocol-0/2 pickle that reaches for a global the default policy refuses."""
    target = rng.choice(
        [
            b"os\nsystem",
            b"builtins\neval",
            b"builtins\nexec",
            b"subprocess\nPopen",
            b"numpy\nload",
            b"gradwire._runtime.agent\nset_current",
            b"operator\nattrgetter",
            b"posix\nsystem",
            b"__main__\nos.system",
        ]
    )
    return b"c" + target + b"\n(S'echo pwned'\ntR."


def _echo_body(rng: random.Random) -> tuple[pb.FrameHeader, list[memoryview | bytes]]:
    arr = np.arange(rng.randint(0, 64)).astype(rng.choice(["float32", "int64", "bool"]))
    name = "__main__:echo"
    header = pb.CallHeader(message_id=rng.randint(1, 1 << 30), function=name, kind=1)
    first, buffers = calls.encode_body(
        pb.FrameHeader(call=header), (None, (arr, {"k": [1, 2]}), {}), EncodeContext()
    )
    return first, buffers


def valid_echo_frame(value: object, message_id: int = 1) -> bytes:
    """A well-formed single-frame Call of the target's ``echo(value)``."""
    header = pb.CallHeader(message_id=message_id, function="__main__:echo", kind=1)
    first, buffers = calls.encode_body(
        pb.FrameHeader(call=header), (None, (value,), {}), EncodeContext()
    )
    size = calls.total_bytes(buffers)
    return encode_frame(next(split(first, buffers, max(1, size))))


def _mutate_header(rng: random.Random, first: pb.FrameHeader, buffers: list) -> str:
    """Change one thing in a valid message's first header (or its buffers)."""
    p = first.payload
    choices = ["dtype", "shape", "nbytes", "pickle_nbytes", "pickle", "global", "pid", "kind"]
    choices += ["function", "shm", "rref", "autograd", "oneof", "tensors+"]
    what = rng.choice(choices)
    if what == "dtype" and p.tensors:
        p.tensors[0].dtype = rng.choice(BAD_DTYPES)
    elif what == "shape" and p.tensors:
        shape = rng.choice(
            [[-1], [2**40, 2**40], [2**32, 2**32], [2**63 - 1], [0, -5], [2**21] * 3, [7] * 40]
        )
        del p.tensors[0].shape[:]
        p.tensors[0].shape.extend(shape)
        if rng.random() < 0.5:  # make nbytes "consistent" under int64 wraparound
            count = 1
            for d in shape:  # int64 arithmetic, wrapping like naive C or NumPy code would
                count = (count * d + 2**63) % 2**64 - 2**63
            p.tensors[0].nbytes = (count * 4 + 2**63) % 2**64 - 2**63
    elif what == "nbytes" and p.tensors:
        p.tensors[0].nbytes = _hint(rng)
    elif what == "pickle_nbytes":
        p.pickle_nbytes = rng.choice([-1, 0, 1, 2**31, 2**62, -(2**63), p.pickle_nbytes + 1])
    elif what == "pickle":
        data, how = _mutate_bytes(rng, bytes(buffers[0]))
        buffers[0] = data
        p.pickle_nbytes = len(data)
        return f"pickle:{how}"
    elif what == "global":
        buffers[0] = disallowed_pickle(rng)
        p.pickle_nbytes = len(buffers[0])
    elif what == "pid":  # a persistent id pointing at a tensor the payload does not carry
        buffers[0] = b"\x80\x05" + b"\x8c\x01T\x94J\xff\xff\x00\x00\x86\x94Q."
        p.pickle_nbytes = len(buffers[0])
    elif what == "kind" and first.HasField("call"):
        first.call.kind = rng.choice([0, 2, 3, 99, -1])  # type: ignore[assignment]
    elif what == "function" and first.HasField("call"):
        first.call.function = rng.choice(
            ["os:system", "builtins:eval", "", ":", "__main__:", "nope:nope", "__main__:bump.x"]
        )
    elif what == "shm" and p.tensors:
        p.tensors[0].shm.name = rng.choice(["../../../etc/passwd", "gw-nope", "", "/x"])
        p.tensors[0].shm.offset = _hint(rng)
        p.tensors[0].shm.size = _hint(rng)
        p.tensors[0].shm.ticket = _hint(rng)
    elif what == "rref":
        p.rrefs.add(owner_id=_hint(rng), rref_id=_gid(rng), fork_id=_gid(rng), parent_id=_hint(rng))
    elif what == "autograd" and first.HasField("call"):
        first.call.autograd.context_id = _hint(rng)
        first.call.autograd.message_id.CopyFrom(_gid(rng))
    elif what == "oneof":
        first.ClearField("call")
        roll = rng.random()
        if roll < 0.35:
            first.fetch.rref_id.CopyFrom(_gid(rng))
        elif roll < 0.7:  # to_here() on Call/CallStream: an RRef this worker may not own
            first.fetch_request.rref_id.CopyFrom(_gid(rng))
            first.fetch_request.caller_id = _hint(rng)
            if rng.random() < 0.3:
                first.fetch_request.autograd.context_id = _hint(rng)
            return "fetch_request"
        elif roll < 0.85:  # PropagateGradients on Call/CallStream, for a context not known here
            first.gradients.context_id = _hint(rng)
            first.gradients.message_id.CopyFrom(_gid(rng))
            first.gradients.sender_id = _hint(rng)
    elif what == "tensors+":
        for _ in range(rng.randint(1, 2000)):
            p.tensors.add(dtype="float64", shape=[1 << 20], nbytes=8 << 20)
    return what


def _frames(
    rng: random.Random, first: pb.FrameHeader, buffers: list, stream: bool
) -> tuple[list[bytes], str]:
    """Encode a (maybe mutated) message as frames, maybe mangling the stream itself."""
    total = calls.total_bytes(buffers)
    chunk = max(1, total) if not stream else rng.choice([1, 7, 64, max(1, total)])
    frames: list[Frame] = list(split(first, buffers, chunk))
    raw = [encode_frame(f) for f in frames]
    how = ""
    roll = rng.random()
    if stream and len(raw) > 1 and roll < 0.2:
        del raw[-1]
        how = "truncated-stream"
    elif stream and len(raw) > 1 and roll < 0.3:
        rng.shuffle(raw)
        how = "reordered"
    elif stream and roll < 0.4:
        raw.append(raw[-1])
        how = "after-last"
    elif roll < 0.55:
        i = rng.randrange(len(raw))
        raw[i], how = _mutate_bytes(rng, raw[i])
        how = f"frame:{how}"
    elif roll < 0.6:
        i = rng.randrange(len(raw))
        raw[i] = struct.pack("<I", rng.choice([2**32 - 1, len(raw[i]), 2**31])) + raw[i][4:]
        how = "length-prefix"
    return raw, how


def gen_frames(kind: str, stream: bool) -> Callable[[random.Random], Case]:
    """A generator for a framed method: garbage or a mutated valid message of ``kind``."""

    def make(rng: random.Random) -> Case:
        if rng.random() < 0.15:
            n = rng.randint(1, 3) if stream else 1
            return Case([random_bytes(rng) for _ in range(n)], "garbage")
        first, buffers = _echo_body(rng)
        buffers = list(buffers)
        if kind == "remote":
            first.call.kind = pb.CALL_KIND_REMOTE
            first.call.rref_id.CopyFrom(_gid(rng))
            first.call.fork_id.CopyFrom(_gid(rng))
        elif kind == "gradients":
            body = [np.ones(3, dtype="float32"), None]
            first, buffers = calls.encode_body(
                pb.FrameHeader(
                    gradients=pb.GradientsHeader(
                        context_id=_hint(rng),
                        message_id=_gid(rng),
                        sender_id=_hint(rng),
                        pass_id=_hint(rng),
                        retain_graph=rng.random() < 0.5,
                    )
                ),
                body,
                EncodeContext(),
            )
            buffers = list(buffers)
        labels = [_mutate_header(rng, first, buffers) for _ in range(rng.randint(0, 2))]
        raw, how = _frames(rng, first, buffers, stream)
        return Case(raw, "+".join([*labels, how]) or "valid")

    return make


def gen_proto(cls: type) -> Callable[[random.Random], Case]:
    """A generator for a protobuf method: hostile field values, sometimes byte-mutated."""

    def make(rng: random.Random) -> Case:
        roll = rng.random()
        if roll < 0.15:
            return Case([random_bytes(rng)], "garbage")
        data = random_proto(rng, cls).SerializeToString()
        if roll < 0.4:
            data, how = _mutate_bytes(rng, data)
            return Case([data], f"proto:{how}")
        return Case([data], "hostile-values")

    return make


def gen_pipe() -> Callable[[random.Random], Case]:
    """CallPipe: batches of the frames ``gen_frames`` makes (each frame a call of its own),
    grouped at random, sometimes with a length prefix that lies, or raw garbage."""
    frames = gen_frames("python", stream=True)

    def make(rng: random.Random) -> Case:
        case = frames(rng)
        if rng.random() < 0.15:
            return Case([random_bytes(rng) for _ in range(rng.randint(1, 3))], "garbage")
        parts, messages = list(case.messages), []
        while parts:
            take = rng.randint(1, len(parts))
            messages.append(pack_batch(parts[:take]))
            parts = parts[take:]
        label = case.label
        if rng.random() < 0.2:
            i = rng.randrange(len(messages))
            lie = struct.pack("<I", rng.choice((0, 1, len(messages[i]), 2**32 - 1)))
            messages[i] = lie + messages[i][4:]
            label += "+lying-prefix"
        return Case(messages, f"batched:{label}")

    return make


GENERATORS: dict[str, Callable[[random.Random], Case]] = {
    "CallPipe": gen_pipe(),
    "Call": gen_frames("python", stream=False),
    # Each frame on CallStream is a call of its own: a chunked call's frames are bad calls.
    "CallStream": gen_frames("python", stream=True),
    "PythonCall": gen_frames("python", stream=True),
    "RemoteCall": gen_frames("remote", stream=True),
    "PropagateGradients": gen_frames("gradients", stream=True),
    "Remote": gen_frames("remote", stream=False),
    "Gradients": gen_frames("gradients", stream=False),
    **{m: gen_proto(t) for m, t in METHODS.items() if isinstance(t, type)},
}
