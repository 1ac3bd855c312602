"""Anomaly detection: remember where each backward node was made, and blame it on failure.

While anomaly mode is on (a process-wide switch, as in PyTorch), every node recorded by an op
or a custom ``Function`` keeps the forward op that made it and a short traceback of the
forward call. When the node's backward raises, the error gets a note naming that op and
showing that traceback (and a warning says the same); with ``check_nan`` a backward output
holding NaN raises :class:`AnomalyError` ("Function 'MulBackward0' returned nan values in
its 0th output.") with the same origin. Off, it costs the op dispatch one flag check.
"""

from __future__ import annotations

import functools
import os
import traceback
import warnings
from typing import Any, Callable, TypeVar

from .._backend import array_module
from .._compat import add_note

__all__ = [
    "detect_anomaly",
    "set_detect_anomaly",
    "is_anomaly_enabled",
    "is_anomaly_check_nan_enabled",
    "AnomalyError",
]

F = TypeVar("F", bound=Callable[..., Any])

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TRACE_FRAMES = 8  # the innermost frames of user code kept per node


class AnomalyError(RuntimeError):
    """A backward node produced NaN while anomaly detection was on (a RuntimeError, as in
    PyTorch); the message names the node, the forward op that made it and where."""


class _AnomalyState:
    """The process-wide switch (PyTorch's anomaly mode is global, not per thread)."""

    __slots__ = ("enabled", "check_nan")

    def __init__(self) -> None:
        self.enabled = False
        self.check_nan = True


_anomaly = _AnomalyState()


def is_anomaly_enabled() -> bool:
    """True while anomaly detection is on.

    Returns:
        Whether nodes record their origin and backward failures are traced to it.
    """
    return _anomaly.enabled


def is_anomaly_check_nan_enabled() -> bool:
    """True while anomaly detection also checks backward outputs for NaN.

    Returns:
        The ``check_nan`` setting in force.
    """
    return _anomaly.check_nan


class set_detect_anomaly:
    """Turn anomaly detection on or off; acts at once when called, and as a context manager
    restores the previous setting on exit.

    Args:
        mode: True to turn anomaly detection on, False to turn it off.
        check_nan: also raise when a backward node returns NaN.

    Raises:
        TypeError: ``mode`` or ``check_nan`` is not a bool.

    Example:
        >>> with gradwire.autograd.set_detect_anomaly(True):
        ...     loss.backward()
    """

    def __init__(self, mode: bool, check_nan: bool = True) -> None:
        if not isinstance(mode, bool) or not isinstance(check_nan, bool):
            raise TypeError(
                "set_detect_anomaly expects bools: set_detect_anomaly(mode, check_nan=True), "
                f"got mode={mode!r}, check_nan={check_nan!r}"
            )
        self.prev = (_anomaly.enabled, _anomaly.check_nan)
        _anomaly.enabled, _anomaly.check_nan = mode, check_nan

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        _anomaly.enabled, _anomaly.check_nan = self.prev


class detect_anomaly:
    """Anomaly detection inside a ``with`` block or a decorated function.

    Args:
        check_nan: also raise when a backward node returns NaN.

    Example:
        >>> with gradwire.autograd.detect_anomaly():
        ...     out = model(x)
        ...     out.backward()    # an error names the forward op that made the failing node
    """

    def __init__(self, check_nan: bool = True) -> None:
        if not isinstance(check_nan, bool):
            raise TypeError(f"detect_anomaly expects check_nan to be a bool, got {check_nan!r}")
        self.check_nan = check_nan
        self.prev = (_anomaly.enabled, _anomaly.check_nan)
        warnings.warn(
            "Anomaly Detection has been enabled. This mode will increase the runtime and "
            "should only be enabled for debugging.",
            UserWarning,
            stacklevel=2,
        )

    def __enter__(self) -> None:
        self.prev = (_anomaly.enabled, _anomaly.check_nan)
        _anomaly.enabled, _anomaly.check_nan = True, self.check_nan

    def __exit__(self, *exc: object) -> None:
        _anomaly.enabled, _anomaly.check_nan = self.prev

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def record_origin(node: Any) -> None:
    """Remember on ``node`` the forward call that made it (the op dispatch calls this only
    when anomaly mode is on)."""
    stack = traceback.extract_stack()
    user = [f for f in stack if not os.path.abspath(f.filename).startswith(_PACKAGE_DIR)]
    node._anomaly_origin = traceback.StackSummary.from_list(user[-_TRACE_FRAMES:] or stack[-4:])


def _origin(node: Any) -> str:
    name = node.name()
    op = name[: name.rfind("Backward")] if "Backward" in name else name
    trace = getattr(node, "_anomaly_origin", None)
    if trace is None:
        return (
            f"{name} was made by the forward op {op!r}, before anomaly detection was on, so "
            "where is not known: turn it on before the forward pass."
        )
    return (
        f"{name} was made by the forward op {op!r}. Traceback of forward call that caused the "
        "error:\n" + "".join(trace.format()).rstrip()
    )


def run_backward(node: Any, grads: list[Any]) -> Any:
    """``node.backward(*grads)`` under anomaly detection: a failure is traced to the forward
    op that made the node, and (``check_nan``) a NaN in any output raises AnomalyError.

    Raises:
        AnomalyError: an output holds NaN.
        Exception: whatever the backward raised, with a note naming the node's origin.
    """
    try:
        node._check_not_released()
        out = node.backward(*grads)
    except Exception as exc:
        note = f"Error detected in {node.name()}. {_origin(node)}"
        warnings.warn(note, UserWarning, stacklevel=2)
        add_note(exc, note)
        raise
    if _anomaly.check_nan:
        outs = out if isinstance(out, tuple) else (out,)
        for i, g in enumerate(outs):
            data = getattr(g, "_data", None)
            if data is None or data.dtype.kind not in "fc":
                continue
            if bool(array_module(data).isnan(data).any()):
                raise AnomalyError(
                    f"Function '{node.name()}' returned nan values in its {i}th output. "
                    + _origin(node)
                )
    return out
