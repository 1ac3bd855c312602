"""gradwire.distributed.autograd: backward passes across workers (FAST mode, never hangs).

Example:
    >>> import gradwire.distributed.autograd as dist_autograd
    >>> with dist_autograd.context() as context_id:
    ...     loss = rpc.rpc_sync("worker1", forward, args=(x,)).sum()
    ...     dist_autograd.backward(context_id, [loss])
    ...     grads = dist_autograd.get_gradients(context_id)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..._runtime import agent as _agent
from ..._runtime.dist_autograd.engine import ContextError
from ..._tensor import Tensor
from ...autograd import _profiling
from ...errors import ArgumentError

__all__ = ["context", "backward", "get_gradients", "is_available", "ContextError"]


def _service(verb: str) -> Any:
    return _agent.current(verb).autograd


@contextlib.contextmanager
def context() -> Iterator[int]:
    """A distributed autograd context for the forward and backward pass of one step.

    Yields the context id, ``(worker_id << 48) + counter``. Every RPC made inside it carries the
    id, so the workers it reaches record send/recv functions in the same context. Leaving the
    block releases the context on every worker that took part.

    Raises:
        RpcNotInitializedError: call ``rpc.init_rpc`` first.
        ContextError: this thread is already inside a context (they do not nest).
    """
    agent = _agent.current("dist_autograd.context()")
    svc = agent.autograd
    ctx = svc.container.new_context()
    try:
        yield ctx.context_id
    finally:
        if agent.state is _agent.AgentState.SHUTDOWN:
            # RPC stopped inside the block: the other workers released it as they stopped.
            svc.container.release(ctx.context_id)
        else:
            svc.release_everywhere(ctx.context_id)


def backward(context_id: int, roots: list[Tensor], retain_graph: bool = False) -> None:
    """Run the backward pass of ``roots`` (scalar tensors on this worker) across workers.

    Gradients of leaves go to the context's store on each worker (``get_gradients``), never to
    ``.grad``. Several passes in one context accumulate.

    Args:
        context_id: the id yielded by ``context()``.
        roots: non-empty list of scalar tensors that require grad.
        retain_graph: keep the graphs on every worker for another pass.

    Raises:
        ArgumentError: ``roots`` is empty (a RuntimeError and a ValueError).
        RuntimeError: a root does not require grad or is not a scalar; the graph was freed.
        ContextError: the context is unknown here (or released).
        Exception: a failure in a backward function on any worker (its message names it), or
            a dead peer (within the RPC timeout).

    Example:
        >>> dist_autograd.backward(context_id, [loss])
    """
    if isinstance(roots, Tensor):
        roots = [roots]
    svc = _service("dist_autograd.backward()")
    checked = _checked_roots(context_id, roots)
    with _profiling.span("torch::distributed::autograd::backward", kind="backward"):
        svc.engine.backward(context_id, checked, retain_graph)


def _checked_roots(context_id: Any, roots: Any) -> list[Tensor]:
    """The roots as a list, or PyTorch's error for each kind of wrong argument."""
    if isinstance(context_id, bool) or not isinstance(context_id, int):
        raise TypeError(
            "backward(): incompatible function arguments: context_id must be an int, "
            f"got {type(context_id).__name__}"
        )
    if not isinstance(roots, (list, tuple)):
        raise TypeError(
            "backward(): incompatible function arguments: roots must be a list of tensors, "
            f"got {type(roots).__name__}"
        )
    for i, root in enumerate(roots):
        if not isinstance(root, Tensor):
            raise TypeError(f"backward(): root {i} is a {type(root).__name__}, not a Tensor")
        if not root.requires_grad:
            raise ArgumentError(f"requires_grad not set on root {i}")
        if root.numel() != 1:
            raise ArgumentError(
                f"root {i} of shape {root.shape} is not a scalar, all roots need to be scalar"
            )
        if root.grad_fn is None:
            raise ArgumentError(
                f"root {i} does not have a valid gradient function (it is a leaf tensor)"
            )
    if not roots:
        raise ArgumentError(
            "No tensors provided for gradient computation: backward() needs at least one root"
        )
    return list(roots)


def get_gradients(context_id: int) -> dict[Tensor, Tensor]:
    """{tensor: gradient} accumulated on this worker in context ``context_id``.

    Raises:
        ContextError: the context is unknown here (or released).
    """
    svc = _service("dist_autograd.get_gradients()")
    return svc.container.get(context_id).gradients()


def is_available() -> bool:
    """True: distributed autograd is always built into gradwire (PyTorch's check)."""
    return True


# -- PyTorch's private helpers that programs and tools use ---------------------------------------


class _ContextView:
    """What ``_retrieve_context`` / ``_current_context`` return (PyTorch's DistAutogradContext
    surface)."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx

    def _context_id(self) -> int:
        return int(self._ctx.context_id)

    def _known_worker_ids(self) -> set[int]:
        """The workers this context sent to or received from (where its release goes)."""
        with self._ctx.lock:
            return set(self._ctx.known_workers)

    def _send_functions(self) -> dict[int, Any]:
        with self._ctx.lock:
            return dict(self._ctx.send_functions)

    def _recv_functions(self) -> dict[int, Any]:
        with self._ctx.lock:
            return dict(self._ctx.recv_functions)


def _retrieve_context(context_id: int) -> _ContextView:
    """The context ``context_id`` on this worker.

    Raises:
        ContextError: unknown here (or released).
    """
    return _ContextView(_service("dist_autograd._retrieve_context()").container.get(context_id))


def _current_context() -> _ContextView:
    """The context this thread is in.

    Raises:
        ContextError: this thread is in no context.
    """
    svc = _service("dist_autograd._current_context()")
    ctx_id = svc.container.current_id()
    if ctx_id is None:
        raise ContextError(
            "Current thread doesn't have a valid autograd context. Please wrap your code using: "
            "`with torch.distributed.autograd.context() as context_id` to generate a valid "
            "context (in gradwire: gradwire.distributed.autograd.context())"
        )
    return _ContextView(svc.container.get(ctx_id))


def _new_context() -> _ContextView:
    """Enter a new context on this thread without a ``with`` block (PyTorch's private helper);
    :func:`_release_context` ends it.

    Raises:
        ContextError: this thread is already inside a context.
    """
    return _ContextView(_service("dist_autograd._new_context()").container.new_context())


def _release_context(context_id: int) -> None:
    """Release context ``context_id`` here and on every worker it reached (as leaving
    ``context()`` does; the other workers are told asynchronously).

    Raises:
        ContextError: the context is unknown here (or already released).
    """
    svc = _service("dist_autograd._release_context()")
    svc.container.get(context_id)  # unknown or released: PyTorch's error
    svc.release_everywhere(context_id)


def _get_max_id() -> int:
    """The largest context id this worker can create (ids are ``(worker_id << 48) + n``)."""
    svc = _service("dist_autograd._get_max_id()")
    return (int(svc.container.worker_id) << 48) + (1 << 48) - 1


def _get_debug_info() -> dict[str, int]:
    """PyTorch's keys: ``num_current_backward_passes``, ``num_autograd_contexts``."""
    svc = _service("dist_autograd._get_debug_info()")
    return {
        "num_current_backward_passes": svc.engine.active_passes,
        "num_autograd_contexts": len(svc.container),
    }
