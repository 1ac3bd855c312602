"""Every error gradwire raises on purpose.

The tree::

    GradwireError                         base of everything below
    ├── InvalidFutureStateError           a Future completed twice (also RuntimeError)
    ├── FuturePicklingError               a Future was pickled or sent over RPC (also TypeError)
    ├── ArgumentError                     an invalid argument where PyTorch raises RuntimeError
    │                                     (also RuntimeError and ValueError)
    ├── CallbackError                     a Future.then callback raised; the error is also of the
    │                                     callback's exception type (and a RuntimeError)
    └── RpcError                          something went wrong around an RPC; every RpcError is
        │                                 also a RuntimeError, as PyTorch raises there
        ├── RpcNotInitializedError        an rpc verb used before init_rpc or after shutdown
        ├── RpcInitError                  rendezvous failed: bad name, duplicate name or rank,
        │                                 world size mismatch, a rank never joined, insecure setup
        ├── UnknownWorkerError            `to` names no worker, or a rank out of range or not an
        │                                 integer (also ValueError)
        ├── SerializationError            the call or its result cannot be encoded or decoded
        │   │                             (unpicklable object, GPU tensor without a device map)
        │   └── PolicyError               the callee's callable policy refused a function or a
        │                                 global inside the payload; nothing was run
        ├── MessageTooLargeError          a payload exceeds the configured message size limit
        ├── TooManyRequestsError          the peer's in-flight limit for this caller is reached
        ├── AuthenticationError           the peer rejected the cluster token or TLS identity
        ├── RpcTimeoutError               a call did not complete within its timeout
        │                                 (also TimeoutError)
        ├── WorkerUnavailableError        the peer is unreachable, died mid-call or shut down
        │   │                             (also ConnectionError)
        │   └── WorkerDepartedError       the peer left a dynamic group with shutdown() (it is
        │                                 gone on purpose, not lost)
        ├── RpcShutdownError              the local agent shut down while the call was pending
        ├── RRefError                     an RRef used the wrong way: local_value() on a user,
        │   │                             pickled outside an RPC, used after shutdown,
        │   │                             backward() on a user without a context id
        │   └── RRefLeakError             shutdown found forks of OwnerRRefs still alive and the
        │                                 leak check was asked to fail (rref_leak_check="error")
        └── RemoteError                   user code raised on the callee. When the remote type can
                                          be rebuilt on the caller, the error raised is a subclass
                                          of both that type and RemoteError, so
                                          ``except ValueError`` and ``except RemoteError`` both
                                          catch it; its message names the worker and carries the
                                          remote traceback.

Lower-level errors (``grpc.RpcError``) are mapped to these in exactly one place per side:
``gradwire._runtime.transport.transport`` on the caller, ``gradwire.server.servicer`` on the callee.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = [
    "GradwireError",
    "InvalidFutureStateError",
    "FuturePicklingError",
    "ArgumentError",
    "CallbackError",
    "callback_error",
    "RpcError",
    "RpcNotInitializedError",
    "RpcInitError",
    "UnknownWorkerError",
    "SerializationError",
    "PolicyError",
    "MessageTooLargeError",
    "TooManyRequestsError",
    "AuthenticationError",
    "RpcTimeoutError",
    "WorkerUnavailableError",
    "WorkerDepartedError",
    "RpcShutdownError",
    "RRefError",
    "RRefLeakError",
    "RemoteError",
    "remote_error_type",
]


class GradwireError(Exception):
    """Base class of every error gradwire raises on purpose."""


class InvalidFutureStateError(GradwireError, RuntimeError):
    """Raised by ``Future.set_result`` / ``set_exception`` on a Future that is already done."""


class FuturePicklingError(GradwireError, TypeError):
    """Raised when a Future is pickled (for example passed as an RPC argument)."""


class CallbackError(GradwireError, RuntimeError):
    """A ``Future.then`` callback raised (see :func:`callback_error`)."""


class RpcError(GradwireError, RuntimeError):
    """Base class of errors around remote calls (a RuntimeError, as PyTorch raises there)."""


class ArgumentError(GradwireError, ValueError, RuntimeError):
    """Raised for an invalid argument where PyTorch raises RuntimeError (also a ValueError)."""


class RpcNotInitializedError(RpcError):
    """Raised by an rpc verb called before ``init_rpc`` or after ``shutdown``."""

    def __init__(self, message: str) -> None:
        # PyTorch's wording first (its programs and tests match "^RPC has not been initialized").
        if not message.startswith(_TORCH_NOT_INITIALIZED):
            message = f"{_TORCH_NOT_INITIALIZED}: {message}"
        super().__init__(message)


_TORCH_NOT_INITIALIZED = "RPC has not been initialized"


class RpcInitError(RpcError):
    """Raised by ``init_rpc`` when the rendezvous or the local setup fails."""


class UnknownWorkerError(RpcError, ValueError):
    """Raised when a destination names no worker of the current cluster."""

    def __init__(self, message: str) -> None:
        # PyTorch's wording first (its programs and tests match "could not find destination").
        if not message.startswith(_TORCH_UNKNOWN):
            message = f"{_TORCH_UNKNOWN}: {message}"
        super().__init__(message)


_TORCH_UNKNOWN = "could not find destination"


class SerializationError(RpcError):
    """Raised when a call, a result or an exception cannot be encoded or decoded."""


class PolicyError(SerializationError):
    """Raised when the callee's callable policy refuses a function or a pickled global."""


class MessageTooLargeError(RpcError):
    """Raised when a payload exceeds ``max_message_bytes`` on either side."""


class TooManyRequestsError(RpcError):
    """Raised when the callee already runs ``max_in_flight_per_peer`` calls from this worker."""


class AuthenticationError(RpcError):
    """Raised when the peer rejects this worker's cluster token or TLS identity."""


class RpcTimeoutError(RpcError, TimeoutError):
    """Raised when a call does not complete within its timeout.

    Attributes:
        destination: name of the worker the call went to.
        elapsed: seconds between the start of the call and the error.
    """

    def __init__(self, message: str, destination: str = "", elapsed: float = 0.0) -> None:
        # PyTorch's wording first (programs and its tests match "RPC ran for more than").
        if not message.startswith(_TORCH_TIMEOUT):
            message = f"{_TORCH_TIMEOUT} its timeout: {message}"
        super().__init__(message)
        self.destination = destination
        self.elapsed = elapsed

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.destination, self.elapsed))


_TORCH_TIMEOUT = "RPC ran for more than"


class WorkerUnavailableError(RpcError, ConnectionError):
    """Raised when the peer cannot be reached, dies during a call or is shutting down."""


class WorkerDepartedError(WorkerUnavailableError):
    """The destination left its dynamic group (``shutdown()`` after ``init_rpc`` without a
    world size): a call to it fails at once, naming it as departed."""


class RpcShutdownError(RpcError):
    """Raised on calls still pending when the local agent shuts down without waiting."""


class RRefError(RpcError):
    """Raised when an RRef is used in a way the RRef protocol does not allow."""


class RRefLeakError(RRefError):
    """Raised by ``shutdown`` when an owner still knows forks of its OwnerRRefs after every
    worker deleted its UserRRefs (PyTorch's RRef leak) and the leak check is strict.

    Attributes:
        leaks: one line per fork still known (PyTorch's "Leaking RRef <id> with fork Id <id>").
    """

    def __init__(self, message: str, leaks: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.leaks = leaks

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.leaks))


class RemoteError(RpcError):
    """User code raised on a remote worker.

    Attributes:
        worker: name of the worker where the exception was raised.
        remote_type: qualified name of the remote exception type, ``"module:qualname"``.
        remote_message: ``str()`` of the remote exception.
        remote_traceback: the formatted remote traceback.
    """

    worker: str = ""
    remote_type: str = ""
    remote_message: str = ""
    remote_traceback: str = ""

    def __init__(
        self,
        remote_type: str,
        remote_message: str,
        remote_traceback: str = "",
        worker: str = "",
    ) -> None:
        super().__init__(remote_type, remote_message, remote_traceback, worker)
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.worker = worker

    def __str__(self) -> str:
        return _describe(f"{self.remote_type}: {self.remote_message}", self)


def _describe(head: str, err: RemoteError) -> str:
    where = f"raised on worker {err.worker!r}" if err.worker else "raised on a remote worker"
    text = f"{head}\n\n({where}; remote traceback follows)\n{err.remote_traceback.rstrip()}"
    return text.rstrip()


_dual_types: dict[type, type] = {}
_dual_lock = threading.Lock()


def _dual_str(self: Any) -> str:
    base_str: Any = type(self).__mro__[1].__str__
    return _describe(base_str(self), self)


def remote_error_type(cls: type[BaseException]) -> type:
    """The subclass of both ``cls`` and RemoteError used to re-raise a remote ``cls`` locally.

    Args:
        cls: the exception type rebuilt from the remote worker.

    Returns:
        A cached class ``Remote<Name>(cls, RemoteError)`` whose ``str()`` names the worker and
        carries the remote traceback.

    Raises:
        TypeError: when ``cls`` cannot be combined with RemoteError (incompatible layout).
    """
    with _dual_lock:
        found = _dual_types.get(cls)
        if found is None:
            found = type(
                cls.__name__,
                (cls, RemoteError),
                {
                    "__str__": _dual_str,
                    # Pickles as the original type, so it can travel on through another call.
                    "__reduce__": lambda self, _cls=cls: (_cls, self.args, dict(self.__dict__)),
                    "__module__": cls.__module__,
                    "__qualname__": cls.__qualname__,
                },
            )
            _dual_types[cls] = found
        return found


def _layout_base(cls: type) -> type:
    """The builtin exception type whose ``__new__`` builds ``cls``'s instances (its layout:
    ``OSError`` for a mix-in of ``RuntimeError`` and ``ConnectionError``)."""
    base = cls
    while base.__module__ != "builtins" and base.__base__ is not None:
        base = base.__base__
    return base


_callback_types: dict[type, type | None] = {}


def callback_error(exc: BaseException) -> BaseException:
    """What a ``then()`` future fails with when its callback raised ``exc``.

    PyTorch raises a RuntimeError there; gradwire keeps the callback's own type too: an
    Exception that is not already a RuntimeError comes back as an instance of a cached
    ``(type(exc), CallbackError)`` subclass with the same arguments, attributes and
    traceback, so ``except ValueError`` and ``except RuntimeError`` both catch it. A type
    that cannot be combined becomes a plain CallbackError caused by ``exc``.
    """
    if isinstance(exc, RuntimeError) or not isinstance(exc, Exception):
        return exc
    cls = type(exc)
    with _dual_lock:
        if cls not in _callback_types:
            try:
                _callback_types[cls] = type(
                    cls.__name__,
                    (cls, CallbackError),
                    {
                        "__module__": cls.__module__,
                        "__qualname__": cls.__qualname__,
                        "__reduce__": lambda self, _cls=cls: (_cls, self.args, dict(self.__dict__)),
                    },
                )
            except TypeError:  # an incompatible layout
                _callback_types[cls] = None
        dual = _callback_types[cls]
    if dual is None:
        wrapped = CallbackError(f"the then() callback raised {cls.__name__}: {exc}")
        wrapped.__cause__ = exc
        return wrapped
    try:
        new = _layout_base(dual).__new__(dual, *exc.args)
        new.args = exc.args
        new.__dict__.update(getattr(exc, "__dict__", {}))
    except Exception:  # noqa: BLE001 - arguments its __new__ refuses: wrap instead
        wrapped = CallbackError(f"the then() callback raised {cls.__name__}: {exc}")
        wrapped.__cause__ = exc
        return wrapped
    new.__cause__, new.__context__ = exc.__cause__, exc.__context__
    return new.with_traceback(exc.__traceback__)
