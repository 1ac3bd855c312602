"""Calls and replies <-> messages: function names, bodies and the payload description.

A callable travels as ``"module:qualname"``; an instance-bound method travels as its function's
name with ``self`` pickled in the body, so every form (module functions, builtins, classes,
static, class and bound methods) resolves on the callee through its policy.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Sequence
from typing import Any

from .._proto import worker_pb2 as pb
from ..errors import SerializationError
from . import bulk, pickler, shm
from .framing import Message
from .policy import origin_of

__all__ = ["function_name", "encode_body", "decode_body", "give_back", "NO_SELF"]

#: Marker for "no bound self" in a call body.
NO_SELF = None


#: Names of plain functions and classes already sent (bounded: a program calls few of them).
_names: dict[Any, str] = {}


def function_name(fn: Any) -> tuple[str, Any]:
    """The qualified name under which ``fn`` travels, and the bound ``self`` to send along.

    Returns:
        ``("module:qualname", self_or_None)``.

    Raises:
        SerializationError: ``fn`` is a lambda, a local function or not addressable by name.
    """
    try:
        return _names[fn], NO_SELF
    except (KeyError, TypeError):  # not seen yet, or unhashable
        pass
    name, bound_self = _function_name(fn)
    if bound_self is NO_SELF and isinstance(fn, (types.FunctionType, type)) and len(_names) < 4096:
        _names[fn] = name
    return name, bound_self


def _function_name(fn: Any) -> tuple[str, Any]:
    bound_self = NO_SELF
    target = fn
    if isinstance(fn, types.MethodType) and not isinstance(fn.__self__, type):
        bound_self, target = fn.__self__, fn.__func__
    elif isinstance(fn, types.BuiltinMethodType):
        owner = getattr(fn, "__self__", None)
        if owner is not None and not isinstance(owner, (types.ModuleType, type)):
            bound_self = owner
            target = getattr(type(owner), fn.__name__, fn)
    origin = origin_of(target)
    if origin is None:
        raise SerializationError(f"{fn!r} cannot be sent by name: pass a function or a class")
    module, qualname = origin
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise SerializationError(
            f"{module}:{qualname} is a lambda or a local function, which has no name the callee "
            "can resolve; define it at module level"
        )
    if module == "__mp_main__":
        module = "__main__"
    if not callable(fn) and not inspect.isclass(fn):
        raise SerializationError(f"{fn!r} is not callable")
    return f"{module}:{qualname}", bound_self


def give_back(ctx: pickler.EncodeContext) -> None:
    """A message that will not be sent: its shared-memory segments go back to their pool and
    its bulk-lane transfers are cancelled (the receiver drops them at once)."""
    metas = [meta for meta, _ in ctx.tensors]
    shm.cancel(metas)
    bulk.cancel(ctx.peer, metas)


def encode_body(
    first: pb.FrameHeader, body: Any, ctx: pickler.EncodeContext
) -> tuple[pb.FrameHeader, list[Any]]:
    """Pickle ``body`` into ``first``'s payload.

    Returns:
        ``(first, buffers)`` ready for ``framing.split``.
    """
    try:
        data = pickler.dumps(body, ctx)
    except BaseException:
        give_back(ctx)  # segments already filled, transfers already sent: at once
        raise
    payload = first.payload
    payload.pickle_nbytes = len(data)
    if ctx.tensors:
        payload.tensors.extend(meta for meta, _ in ctx.tensors)
        buffers: list[Any] = [data]
        buffers.extend(buf for _, buf in ctx.tensors)
    else:
        buffers = [data]
    if ctx.rrefs:
        payload.rrefs.extend(ctx.rrefs)
    return first, buffers


def decode_body(msg: Message, ctx_args: dict[str, Any]) -> tuple[Any, pickler.DecodeContext]:
    """Unpickle the body of a received message.

    Args:
        msg: the assembled message.
        ctx_args: ``policy``, ``peer`` and ``worker`` for the DecodeContext.

    Returns:
        ``(body, ctx)``; ``ctx.objects`` lists the rebuilt side-table objects.
    """
    ctx = pickler.DecodeContext(payload=msg.header.payload, arrays=msg.arrays, **ctx_args)
    return pickler.loads(msg.pickle, ctx), ctx


def split_callable(name: str) -> tuple[str, str]:
    """``"module:qualname"`` -> ``(module, qualname)``.

    Raises:
        SerializationError: the name is malformed.
    """
    module, sep, qualname = name.partition(":")
    if not sep or not module or not qualname:
        raise SerializationError(f"malformed function name {name!r}; expected 'module:qualname'")
    return module, qualname


def total_bytes(buffers: Sequence[Any]) -> int:
    """Raw size of a message's buffers (what the frames carry)."""
    return sum(memoryview(b).nbytes for b in buffers)


def payload_bytes(first: pb.FrameHeader, frame_bytes: int) -> int:
    """Size of a message's payload for ``max_message_bytes``: the framed bytes plus the tensors
    that travel through shared memory (the receiver counts them the same way)."""
    return frame_bytes + sum(t.nbytes for t in first.payload.tensors if t.HasField("shm"))


def resolve_function(policy: Any, name: str, worker: str) -> Any:
    """The function a call names (``"module:qualname"``), resolved through ``policy`` on
    ``worker``; a callable only the default lists allow comes wrapped to run guarded.

    Raises:
        SerializationError: the name is malformed or does not resolve.
        PolicyError: the policy refuses it.
    """
    module, qualname = split_callable(name)
    return policy.resolve_call(module, qualname, worker)


__all__ += ["split_callable", "resolve_function", "total_bytes", "payload_bytes"]
