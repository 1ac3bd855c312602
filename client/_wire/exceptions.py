"""Exceptions <-> RemoteException: the remote type, message, traceback and worker travel.

The caller rebuilds the original type when its policy allows it and the pickled arguments
unpickle; the result is an instance of ``errors.remote_error_type(cls)`` (both the original type
and RemoteError). Otherwise it gets a plain RemoteError carrying the same information.
"""

from __future__ import annotations

import inspect
import io
import logging
import pickle
import traceback
from typing import Any

from .._proto import worker_pb2 as pb
from ..errors import RemoteError, _layout_base, remote_error_type
from .pickler import PROTOCOL, DecodeContext, loads
from .policy import CallablePolicy, origin_of

__all__ = ["encode_exception", "decode_exception", "MAX_PICKLED_ARGS"]

log = logging.getLogger(__name__)
#: Larger pickled exceptions are sent without their arguments (type, message, traceback only).
MAX_PICKLED_ARGS = 64 << 10


class _NoSideTables(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        from .pickler import _encoder_for

        if _encoder_for(type(obj)) is not None:
            raise pickle.PicklingError("exceptions do not carry tensors over RPC")
        return None


def _base_type(exc: BaseException) -> type:
    cls = type(exc)
    if isinstance(exc, RemoteError) and cls is not RemoteError and RemoteError in cls.__bases__:
        return cls.__bases__[0]  # a rebuilt remote error travelling on: keep the original type
    return cls


def encode_exception(exc: BaseException, worker: str) -> pb.RemoteException:
    """Describe ``exc`` (raised on ``worker``) for the caller.

    Returns:
        A RemoteException with type, message, traceback, worker and (when small and picklable)
        the pickled exception.
    """
    cls = _base_type(exc)
    origin = origin_of(cls) or (cls.__module__, cls.__qualname__)
    remote_tb = getattr(exc, "remote_traceback", "") if isinstance(exc, RemoteError) else ""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if remote_tb:
        tb = f"{tb}\ncaused on worker {getattr(exc, 'worker', '?')!r} by:\n{remote_tb}"
    pickled = b""
    try:
        buf = io.BytesIO()
        state = exc.__reduce_ex__(PROTOCOL)
        if cls is not type(exc):  # rebuilt remote error: send as its original type
            state = (
                cls,
                exc.args,
                {k: v for k, v in vars(exc).items() if not k.startswith("remote_")},
            )
        _NoSideTables(buf, protocol=PROTOCOL).dump(state[:3] if isinstance(state, tuple) else state)
        if buf.tell() <= MAX_PICKLED_ARGS:
            pickled = buf.getvalue()
    except Exception:  # unpicklable exception state: the caller gets a RemoteError
        log.debug("exception %r is not picklable; sending type, message and traceback", exc)
    base_str: Any = cls.__str__
    message = str(exc) if not isinstance(exc, RemoteError) else base_str(exc).split("\n\n(")[0]
    return pb.RemoteException(
        type_name=f"{origin[0]}:{origin[1]}",
        message=message,
        traceback=tb,
        worker=worker,
        pickled_args=pickled,
    )


def _unconstructible(cls: type, args: tuple[Any, ...]) -> str:
    """Why ``cls(*args)`` would fail for want of the right arguments ("" when it would not, or
    when the signature cannot be read); judged on the signature alone, no code runs."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return ""
    try:
        signature.bind(*args)
    except TypeError as exc:
        return f"{cls.__qualname__}.__init__(): {exc}."
    return ""


def decode_exception(
    err: pb.RemoteException, policy: CallablePolicy, worker: str = ""
) -> BaseException:
    """Rebuild the exception described by ``err`` on the caller.

    Args:
        err: the received RemoteException.
        policy: the caller's callable policy (decides which types may be rebuilt).
        worker: this worker's name, for error messages.

    Returns:
        An instance of ``remote_error_type(original type)`` when it can be rebuilt, else a
        RemoteError.
    """
    fallback = RemoteError(err.type_name, err.message, err.traceback, err.worker)
    if not err.pickled_args:
        return fallback
    try:
        state = loads(err.pickled_args, DecodeContext(policy, pb.Payload(), [], err.worker, worker))
        cls, args = state[0], tuple(state[1])
        attrs = state[2] if len(state) > 2 and isinstance(state[2], dict) else {}
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            return fallback
        if cls is RemoteError or issubclass(cls, RemoteError):
            return fallback
        why = _unconstructible(cls, args)
        if why:  # PyTorch rebuilds with cls(*args) and reports this failure, so does gradwire
            return RemoteError(
                err.type_name,
                "Failed to create original exception type. Error msg was "
                f"{why} Original exception on remote side was {err.type_name}: {err.message}",
                err.traceback,
                err.worker,
            )
        dual = remote_error_type(cls)
        exc = _layout_base(dual).__new__(dual, *args)  # no __init__: its signature may differ
        exc.args = args
        for k, v in attrs.items():
            setattr(exc, k, v)
        exc.worker = err.worker
        exc.remote_type = err.type_name
        exc.remote_message = err.message
        exc.remote_traceback = err.traceback
        str(exc)  # a type whose __str__ fails on these args is not worth rebuilding
        return exc
    except Exception:
        log.debug("could not rebuild remote %s; raising RemoteError", err.type_name, exc_info=True)
        return fallback
