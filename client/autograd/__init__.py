"""gradwire.autograd: reverse-mode automatic differentiation.

``backward`` and ``grad`` run the engine; ``Function`` defines custom ops; ``graph`` holds
saved-tensor hooks; grad modes switch recording on and off; ``detect_anomaly`` traces a
failing backward node to the forward op that made it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from . import graph, profiler, profiler_legacy
from .anomaly_mode import (
    detect_anomaly,
    is_anomaly_check_nan_enabled,
    is_anomaly_enabled,
    set_detect_anomaly,
)
from .engine import execute, is_multithreading_enabled, set_multithreading_enabled
from .function import Function, FunctionCtx, once_differentiable
from .grad_mode import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)

if TYPE_CHECKING:
    from .._tensor import Tensor

__all__ = [
    "backward",
    "grad",
    "Function",
    "FunctionCtx",
    "once_differentiable",
    "graph",
    "gradcheck",
    "gradgradcheck",
    "no_grad",
    "enable_grad",
    "set_grad_enabled",
    "inference_mode",
    "is_grad_enabled",
    "is_inference_mode_enabled",
    "detect_anomaly",
    "set_detect_anomaly",
    "is_anomaly_enabled",
    "is_anomaly_check_nan_enabled",
    "set_multithreading_enabled",
    "is_multithreading_enabled",
    "profiler",
    "profiler_legacy",
]


def _profiler_enabled() -> bool:
    """Whether this thread records into a profile (PyTorch's private helper)."""
    from . import _profiling

    return _profiling.current() is not None


def _as_list(x: Any) -> list[Any]:
    from .._tensor import Tensor

    if x is None:
        return []
    if isinstance(x, Tensor):
        return [x]
    return list(x)


def _root_edges(tensors: list[Tensor], grads: list[Any], what: str) -> list[Any]:
    from .._ops._base import edge_of
    from .._tensor import Tensor

    if len(grads) != len(tensors):
        raise RuntimeError(
            f"got {len(grads)} gradients for {len(tensors)} {what}; pass one per tensor (or None for scalars)"
        )
    roots = []
    for i, (t, g) in enumerate(zip(tensors, grads)):
        if not isinstance(t, Tensor):
            raise TypeError(f"element {i} of {what} is a {type(t).__name__}, not a Tensor")
        if not t.requires_grad:
            raise RuntimeError(
                f"element {i} of tensors does not require grad and does not have a grad_fn"
            )
        if g is None:
            if t.numel() != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            if t._data.dtype.kind == "c":
                raise RuntimeError("grad can be implicitly created only for real scalar outputs")
            g = Tensor._wrap(_ones_like(t._data))
        elif not isinstance(g, Tensor):
            raise TypeError(
                f"gradient for element {i} must be a Tensor or None, got {type(g).__name__}"
            )
        elif g.shape != t.shape:
            raise RuntimeError(
                f"Mismatch in shape: grad_output[{i}] has a shape of {g.shape} and output[{i}] has a shape of {t.shape}."
            )
        node, nr = edge_of(t)
        roots.append((node, nr, g))
    return roots


def _ones_like(arr: Any) -> Any:
    from .._backend import array_module, device_of, device_scope

    with device_scope(device_of(arr)):  # CuPy allocates on the current device
        return array_module(arr).ones_like(arr)


def backward(
    tensors: Any,
    grad_tensors: Any = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    inputs: Sequence[Tensor] | None = None,
) -> None:
    """Accumulate into ``.grad`` of graph leaves the gradients of ``tensors``.

    Args:
        tensors: the outputs to differentiate (a Tensor or a sequence).
        grad_tensors: gradients w.r.t. each output (None allowed for one-element outputs).
        retain_graph: keep saved tensors for another pass (default: ``create_graph``).
        create_graph: record the backward pass so it can be differentiated again.
        inputs: accumulate only into these tensors (leaves or not).

    Raises:
        RuntimeError: an output that does not require grad, a non-scalar output without a
            gradient, or a graph freed by an earlier pass.

    Example:
        >>> gradwire.autograd.backward([loss])
    """
    ts = _as_list(tensors)
    gs = _as_list(grad_tensors) if grad_tensors is not None else [None] * len(ts)
    if not ts:
        raise RuntimeError("backward() needs at least one tensor to differentiate")
    roots = _root_edges(ts, gs, "tensors")
    keep = create_graph if retain_graph is None else retain_graph
    if inputs is None:
        execute(roots, keep, create_graph)
        return
    from .._ops._base import edge_of

    inputs = _as_list(inputs)
    if not inputs:
        raise RuntimeError("'inputs' argument to backward() cannot be empty.")
    edges = [edge_of(t) for t in inputs]
    grads = execute(roots, keep, create_graph, capture=edges)
    from .engine import _accumulate

    for t, g in zip(inputs, grads):
        if g is None:
            continue
        if t.is_leaf:
            _accumulate(t, g, create_graph, None)
        else:
            import weakref

            from .._tensor import _retain

            _retain(weakref.ref(t), g)


def grad(
    outputs: Any,
    inputs: Any,
    grad_outputs: Any = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    allow_unused: bool | None = None,
    materialize_grads: bool = False,
) -> tuple[Any, ...]:
    """The gradients of ``outputs`` w.r.t. ``inputs``, without touching ``.grad``.

    Args:
        outputs: tensors to differentiate.
        inputs: tensors to differentiate with respect to.
        grad_outputs: gradients w.r.t. each output (None for one-element outputs).
        retain_graph: keep saved tensors (default: ``create_graph``).
        create_graph: make the result differentiable (higher-order gradients).
        allow_unused: return None for inputs not reached instead of raising.
        materialize_grads: return zeros instead of None for unused inputs.

    Returns:
        A tuple with one gradient (or None) per input.

    Raises:
        RuntimeError: an input that does not require grad, or one not used in the graph
            without ``allow_unused``.

    Example:
        >>> (dx,) = gradwire.autograd.grad(y, x, create_graph=True)
    """
    from .._ops._base import edge_of
    from .._tensor import Tensor

    outs = _as_list(outputs)
    ins = _as_list(inputs)
    gs = _as_list(grad_outputs) if grad_outputs is not None else [None] * len(outs)
    if materialize_grads and allow_unused is False:
        raise ValueError(
            "Expected allow_unused to be True or not passed when materialize_grads=True"
        )
    if allow_unused is None:
        allow_unused = materialize_grads
    for i, t in enumerate(ins):
        if not isinstance(t, Tensor):
            raise TypeError(f"element {i} of inputs is a {type(t).__name__}, not a Tensor")
        if not t.requires_grad:
            raise RuntimeError("One of the differentiated Tensors does not require grad")
    roots = _root_edges(outs, gs, "outputs")
    keep = create_graph if retain_graph is None else retain_graph
    edges = [edge_of(t) for t in ins]
    result = execute(roots, keep, create_graph, capture=edges)
    final = []
    for t, g in zip(ins, result):
        if g is None:
            if materialize_grads:
                g = Tensor._wrap(_ones_like(t._data) * 0)
            elif not allow_unused:
                raise RuntimeError(
                    "One of the differentiated Tensors appears to not have been used in the graph. "
                    "Set allow_unused=True if this is the desired behavior."
                )
        elif not create_graph:
            g = g.detach()
        final.append(g)
    return tuple(final)


from .gradcheck import gradcheck, gradgradcheck  # noqa: E402
