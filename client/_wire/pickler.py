"""The wire pickler: pickle with side tables, and a restricted unpickler.

Objects whose type is in the dispatch table (tensors, ndarrays, RRefs) never go into the
pickle: ``persistent_id`` moves them to a side table of the :class:`EncodeContext` and leaves a
``(tag, index)`` reference behind; the receiver's :class:`DecodeContext` turns the reference back
into the object. ``gradwire.distributed.rpc.rref`` registers RRefs with
:func:`register_side_table` (tag "R").

The unpickler resolves every global through the callee's :class:`CallablePolicy`, so a payload
naming ``os.system`` fails before anything runs; and ``integrity.py`` keeps a payload to new
values: one that would change what it did not create (a class, a function, a cached object) is
refused before it runs, and only classes, routines and objects pickled by name may be named.
"""

from __future__ import annotations

import io
import pickle
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._proto import worker_pb2 as pb
from .._sparse_coo import SparseCOO
from ..errors import PolicyError, SerializationError
from . import guard, integrity, tensors
from .policy import CallablePolicy

__all__ = [
    "PropagateError",
    "EncodeContext",
    "DecodeContext",
    "register_side_table",
    "dumps",
    "loads",
    "dumps_plain",
    "loads_plain",
    "resolve_global",
    "integrity_refusal",
    "PROTOCOL",
]

PROTOCOL = 5


class PropagateError(Exception):
    """Raised by a side-table encoder or decoder to make ``dumps`` / ``loads`` raise ``error``
    itself instead of a SerializationError (e.g. the creation error of an RRef being sent)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


@dataclass
class EncodeContext:
    """What one outgoing message collects besides its pickle.

    Attributes:
        peer: destination worker name.
        device_map: local device -> peer device, for GPU tensors.
        tensors: side table of (TensorMeta, buffer) in order.
        rrefs: side table of RRefForkData, filled by the RRef side table.
        objects: the original objects of each side table, by tag (e.g. tensors that require grad,
            for the dist-autograd hook).
    """

    peer: str = ""
    device_map: dict[str, str] | None = None
    tensors: list[tuple[pb.TensorMeta, memoryview]] = field(default_factory=list)
    rrefs: list[pb.RRefForkData] = field(default_factory=list)
    objects: dict[str, list[Any]] = field(default_factory=dict)
    #: id(obj) -> persistent id, so an object referenced twice travels once (and keeps aliasing).
    memo: dict[int, Any] = field(default_factory=dict)


@dataclass
class DecodeContext:
    """What one incoming message needs to rebuild side-table objects.

    Attributes:
        policy: the receiving worker's callable policy.
        payload: the message's Payload (TensorMeta and RRefForkData lists).
        arrays: the received host arrays, in TensorMeta order.
        peer: sender worker name.
        worker: this worker's name, for error messages.
        objects: rebuilt side-table objects by tag (for hooks).
    """

    policy: CallablePolicy
    payload: pb.Payload
    arrays: list[np.ndarray]
    peer: str = ""
    worker: str = ""
    objects: dict[str, list[Any]] = field(default_factory=dict)
    #: persistent id -> rebuilt object (the same reference twice yields the same object).
    memo: dict[Any, Any] = field(default_factory=dict)


Encoder = Callable[[Any, EncodeContext], Any]
Decoder = Callable[[Any, DecodeContext], Any]

_encoders: dict[type, Encoder] = {}
_decoders: dict[str, Decoder] = {}
_lookup_cache: dict[type, Encoder | None] = {}
_lock = threading.Lock()


def register_side_table(cls: type, tag: str, encode: Encoder, decode: Decoder) -> None:
    """Route instances of ``cls`` (and subclasses) through a side table instead of pickle.

    Args:
        cls: the type to intercept.
        tag: short name of the side table ("T" for tensors, "R" for RRefs...).
        encode: ``encode(obj, ctx) -> pid``; appends to ``ctx`` and returns a picklable reference
            (usually ``(tag, index)``), or None to pickle ``obj`` normally.
        decode: ``decode(pid, ctx) -> obj`` on the receiver.
    """
    with _lock:
        _encoders[cls] = encode
        _decoders[tag] = decode
        _lookup_cache.clear()


def _encoder_for(cls: type) -> Encoder | None:
    try:
        return _lookup_cache[cls]
    except KeyError:
        pass
    _register_tensor_types()
    found = next((_encoders[k] for k in cls.__mro__ if k in _encoders), None)
    _lookup_cache[cls] = found
    return found


def _tensor_encoder(kind: str) -> Encoder:
    def encode(obj: Any, ctx: EncodeContext) -> Any:
        if kind == tensors.KIND_TENSOR:
            if type(obj._data) is SparseCOO:
                return _encode_sparse(obj, ctx)
            _, param_cls = tensors.tensor_classes()
            real_kind = tensors.KIND_PARAMETER if param_cls and isinstance(obj, param_cls) else kind
        else:
            real_kind = kind
        packed = tensors.pack(obj, real_kind, ctx.peer, ctx.device_map)
        if packed is None:
            return None
        ctx.tensors.append(packed)
        ctx.objects.setdefault("T", []).append(obj)
        return ("T", len(ctx.tensors) - 1)

    return encode


def _tensor_decoder(pid: Any, ctx: DecodeContext) -> Any:
    index = pid[1]
    if not isinstance(index, int) or not 0 <= index < len(ctx.arrays):
        raise SerializationError(f"payload refers to tensor {index!r}, which it does not carry")
    obj = tensors.unpack(ctx.payload.tensors[index], ctx.arrays[index])
    ctx.objects.setdefault("T", []).append(obj)
    return obj


def _sparse_part(arr: Any, ctx: EncodeContext) -> int:
    packed = tensors.pack(arr, tensors.KIND_NDARRAY, ctx.peer, ctx.device_map)
    if packed is None:
        raise SerializationError(f"sparse tensor part of dtype {arr.dtype} cannot be sent")
    ctx.tensors.append(packed)
    return len(ctx.tensors) - 1


def _encode_sparse(obj: Any, ctx: EncodeContext) -> Any:
    """A sparse COO tensor travels as its indices and values, two side-table arrays that take
    every route a dense tensor takes (stream, shared memory, bulk lane); the reference
    ``("S", indices, values, shape, coalesced, requires_grad)`` rebuilds it."""
    coo = obj._data
    i = _sparse_part(coo.indices, ctx)
    v = _sparse_part(coo.values, ctx)
    ctx.objects.setdefault("T", []).append(obj)
    return ("S", i, v, coo.shape, coo.coalesced, bool(obj.requires_grad))


def _sparse_decoder(pid: Any, ctx: DecodeContext) -> Any:
    ok = (
        len(pid) == 6
        and all(type(x) is int and 0 <= x < len(ctx.arrays) for x in pid[1:3])
        and pid[1] != pid[2]
        and type(pid[3]) is tuple
        and all(type(n) is int and n >= 0 for n in pid[3])
        and all(type(x) is bool for x in pid[4:6])
    )
    if not ok:
        raise SerializationError(f"malformed sparse tensor reference {pid!r} in payload")
    _, i, v, shape, coalesced, requires_grad = pid
    parts = []
    for index in (i, v):
        meta = ctx.payload.tensors[index]
        if meta.kind != tensors.KIND_NDARRAY:
            raise SerializationError(f"sparse tensor part {index} is a {meta.kind!r}, not an array")
        parts.append(tensors.unpack(meta, ctx.arrays[index]))
    tensor_cls, _ = tensors.tensor_classes()
    if tensor_cls is None:
        raise SerializationError("received a tensor but gradwire.Tensor is not importable here")
    from .._sparse_kernels import build

    try:
        coo = build(parts[0], parts[1], shape, coalesced)
    except (ValueError, TypeError) as exc:
        raise SerializationError(f"received a malformed sparse tensor: {exc}") from None
    obj = tensor_cls._wrap(coo, requires_grad=requires_grad)
    ctx.objects.setdefault("T", []).append(obj)
    return obj


_tensor_types_done = False


def _register_tensor_types() -> None:
    global _tensor_types_done
    if _tensor_types_done:
        return
    tensor_cls, _ = tensors.tensor_classes()
    _encoders[np.ndarray] = _tensor_encoder(tensors.KIND_NDARRAY)
    _decoders["T"] = _tensor_decoder
    _decoders["S"] = _sparse_decoder
    if tensor_cls is not None:
        _encoders[tensor_cls] = _tensor_encoder(tensors.KIND_TENSOR)
        _tensor_types_done = True
    _lookup_cache.clear()


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, ctx: EncodeContext) -> None:
        super().__init__(file, protocol=PROTOCOL)
        self._ctx = ctx

    def persistent_id(self, obj: Any) -> Any:
        encode = _encoder_for(type(obj))
        if encode is None:
            return None
        pid = self._ctx.memo.get(id(obj))
        if pid is None:
            pid = encode(obj, self._ctx)
            if pid is not None:
                self._ctx.memo[id(obj)] = pid
        return pid


def resolve_global(policy: CallablePolicy, module: str, name: str, worker: str) -> Any:
    """A pickle's global ``module:name``, as ``find_class`` must hand it out: resolved by the
    policy, and only a class, a routine or an object pickled by name (``integrity.nameable``).

    Raises:
        PolicyError: the policy refuses the name, or it is a program's data.
        SerializationError: the name does not resolve.
    """
    with guard.suspended():  # resolving may import the program's own modules
        obj = policy.resolve(module, name, worker, what="global")
        if policy.trust_everything or integrity.nameable(obj, PROTOCOL):
            return obj
    raise policy.refusal(
        f"global {module}:{name}",
        worker,
        f"it is {integrity.describe(obj)}, and a payload may name only classes, functions "
        "and objects pickled by name, never a program's data",
    )


def integrity_refusal(exc: integrity.Mutation, peer: str, worker: str) -> PolicyError:
    """The PolicyError for a payload that tried to change what it did not create."""
    src = f" from worker {peer!r}" if peer else ""
    where = f" on worker {worker!r}" if worker else ""
    return PolicyError(
        f"a payload{src} tried to {exc}{where}: a payload may build new values, never change "
        "or reach into the worker's classes, functions and shared objects; nothing was changed "
        "(only rpc_backend_options trust_everything=True lifts this; docs/security.md)"
    )


class _Resolving:
    """``find_class`` through the callee's policy and side-table references through the
    decoders, for both unpicklers (the C one and :class:`integrity.CheckedUnpickler`)."""

    _ctx: DecodeContext

    def __init__(self, file: io.BytesIO, ctx: DecodeContext) -> None:
        super().__init__(file)  # type: ignore[call-arg]
        self._ctx = ctx

    def resolve_global(self, module: str, name: str) -> Any:
        return resolve_global(self._ctx.policy, module, name, self._ctx.worker)

    def find_class(self, module: str, name: str) -> Any:
        return self.resolve_global(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid or pid[0] not in _decoders:
            raise SerializationError(f"unknown side-table reference {pid!r} in payload")
        try:
            return self._ctx.memo[pid]
        except (KeyError, TypeError):
            with guard.suspended():  # gradwire's own decoders (shared memory, RRef forks)
                obj = _decoders[pid[0]](pid, self._ctx)
        try:
            self._ctx.memo[pid] = obj
        except TypeError:  # unhashable reference: no aliasing
            pass
        return obj


class _Unpickler(_Resolving, pickle.Unpickler):
    """The C unpickler, for payloads :func:`integrity.scan` found to mutate only values they
    built themselves."""


class _CheckedUnpickler(_Resolving, integrity.CheckedUnpickler):
    """The checked unpickler, for the other payloads (``integrity.py``)."""

    def find_class(self, module: str, name: str) -> Any:
        return integrity.CheckedUnpickler.find_class(self, module, name)


#: Types pickled by opcodes alone (no global, no reduce): a body made only of them needs no
#: side table. Exact types: a subclass may reduce to anything.
_PLAIN_SCALARS = frozenset({type(None), bool, int, float, str, bytes})
_PLAIN_CONTAINERS = frozenset({tuple, list, dict})


def _plain(obj: Any, depth: int) -> bool:
    """True when ``obj`` is a plain scalar, or a small tuple/list/dict of plain values nested at
    most ``depth`` deep (a call body ``(None, args, kwargs)`` of plain arguments is)."""
    cls = type(obj)
    if cls in _PLAIN_SCALARS:
        return True
    if cls not in _PLAIN_CONTAINERS or depth <= 0 or len(obj) > 8:
        return False
    # A loop, not all() over a generator: this runs for every call and every reply.
    for value in obj.values() if cls is dict else obj:
        if type(value) not in _PLAIN_SCALARS and not _plain(value, depth - 1):
            return False
    return cls is not dict or all(type(k) is str for k in obj)


class _NotPlain(Exception):
    """Raised by :class:`_PlainUnpickler` at the first global or side-table reference."""


class _PlainUnpickler(pickle.Unpickler):
    """The C unpickler with nothing to resolve: the first global (GLOBAL, STACK_GLOBAL, INST,
    EXT*) or side-table reference (PERSID, BINPERSID) stops it. Without a global nothing
    callable can reach the stack, so it can only build None, bools, numbers, strings, bytes
    and containers of them; it needs no policy and no :class:`DecodeContext`."""

    def find_class(self, module: str, name: str) -> Any:
        raise _NotPlain

    def persistent_load(self, pid: Any) -> Any:
        raise _NotPlain


def dumps_plain(obj: Any) -> bytes | None:
    """``obj`` pickled when it is plain (see ``_plain``), else None.

    Nothing for a side table and no global in the pickle: the C pickler alone gives the same
    bytes as ``_Pickler`` (whose ``persistent_id`` is a Python call per object), and no
    :class:`EncodeContext` is needed.
    """
    return pickle.dumps(obj, PROTOCOL) if _plain(obj, 2) else None


def loads_plain(data: Any) -> tuple[bool, Any]:
    """``(True, obj)`` when ``data`` is a well-formed pickle of plain data only (see
    :class:`_PlainUnpickler`), else ``(False, None)``: then :func:`loads` must decode it (and
    report what is wrong with it). Needs no :class:`DecodeContext`."""
    try:
        return True, _PlainUnpickler(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 - loads() decodes it again and says why it fails
        return False, None


def dumps(obj: Any, ctx: EncodeContext) -> bytes:
    """Pickle ``obj``, moving side-table objects into ``ctx``.

    Raises:
        SerializationError: ``obj`` cannot be pickled (the message says what and why).
    """
    plain = dumps_plain(obj)
    if plain is not None:
        return plain
    _register_tensor_types()
    buf = io.BytesIO()
    try:
        _Pickler(buf, ctx).dump(obj)
    except PropagateError as exc:
        raise exc.error from None
    except SerializationError:
        raise
    except Exception as exc:
        dest = f" for worker {ctx.peer!r}" if ctx.peer else ""
        raise SerializationError(f"cannot serialize{dest}: {type(exc).__name__}: {exc}") from exc
    return buf.getvalue()


def loads(data: Any, ctx: DecodeContext) -> Any:
    """Unpickle ``data`` under ``ctx.policy``, rebuilding side-table objects.

    A pickle of plain data is decoded by :class:`_PlainUnpickler` (no policy to consult);
    at its first global or side-table reference the policy-checking unpickler starts over.

    Raises:
        PolicyError: the payload names a global the policy refuses.
        SerializationError: the payload is malformed or names something that does not resolve.
    """
    try:
        payload = ctx.payload
        if not (payload.tensors or payload.rrefs):  # (else it stops at the first reference)
            try:
                return _PlainUnpickler(io.BytesIO(data)).load()
            except _NotPlain:
                pass
        _register_tensor_types()
        src = f" from worker {ctx.peer!r}" if ctx.peer else ""
        policy = ctx.policy
        if policy.trust_everything:
            return _Unpickler(io.BytesIO(data), ctx).load()
        checked = integrity.scan(
            data, lambda module, name: resolve_global(policy, module, name, ctx.worker)
        )
        unpickler = (_CheckedUnpickler if checked else _Unpickler)(io.BytesIO(data), ctx)
        if not policy.guarded:
            return unpickler.load()
        # What the pickle's opcodes call (constructors, __setstate__) runs guarded.
        with guard.guarded(f"unpickling a payload{src}", ctx.worker):
            return unpickler.load()
    except integrity.Mutation as exc:
        raise integrity_refusal(exc, ctx.peer, ctx.worker) from None
    except PropagateError as exc:
        raise exc.error from None
    except (PolicyError, SerializationError):
        raise
    except Exception as exc:
        src = f" from worker {ctx.peer!r}" if ctx.peer else ""
        raise SerializationError(
            f"cannot deserialize payload{src}: {type(exc).__name__}: {exc}"
        ) from exc
