"""``DistributedOptimizer``: one local optimizer per owner of the parameters, stepped together.

Follows the design note: the constructor creates, on every distinct owner of the parameter
RRefs, a local optimizer over that owner's parameters (held through an RRef); ``step`` runs all
of them concurrently over RPC, each applying the gradients that the distributed autograd
context holds on its worker. Steps of several distributed optimizers touching the same worker
are serialized by one lock per worker process. Parameters without a gradient in the context
are left untouched. A sparse gradient in the context (``nn.Embedding(sparse=True)`` on the
owner) reaches the local optimizer as it is: SGD, Adagrad and SparseAdam step it, the others
refuse it with PyTorch's message.
"""

from __future__ import annotations

import threading
from typing import Any

from ...optim.optimizer import Optimizer
from .. import autograd as dist_autograd
from .. import rpc

__all__ = ["DistributedOptimizer"]

_step_lock = threading.Lock()  # one per worker process: concurrent steps take turns


class _LocalOptimizer:
    """Lives on a parameter owner; wraps the user's optimizer class over local parameters."""

    def __init__(
        self,
        optimizer_class: type,
        param_rrefs: list[Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)):
            raise TypeError(
                f"DistributedOptimizer needs a gradwire.optim.Optimizer subclass, got {optimizer_class!r}"
            )
        if not all(isinstance(r, rpc.RRef) for r in param_rrefs):
            raise TypeError("DistributedOptimizer needs RRefs of parameters")
        self.params = [r.local_value() for r in param_rrefs]
        self.optim = optimizer_class(self.params, *args, **kwargs)

    def step(self, context_id: int) -> int:
        grads = dist_autograd.get_gradients(context_id)
        with _step_lock:
            if _updates_from_grads(type(self.optim)):
                self.optim.step_with_grads(grads)  # gradwire's optimizers: no .grad detour
            else:
                self._step_through_grad(grads)
        return sum(1 for p in self.params if p in grads)

    def _step_through_grad(self, grads: dict[Any, Any]) -> None:
        """PyTorch's contract: ``step()`` reads ``p.grad``. Put the context's gradients there
        for the step (None where the context has none) and restore ``.grad`` after."""
        params = [p for g in self.optim.param_groups for p in g["params"]]
        saved = [(p, p.grad) for p in params]
        try:
            for p in params:
                p.grad = grads.get(p)
            self.optim.step()
        finally:
            for p, grad in saved:
                p.grad = grad


def _updates_from_grads(cls: type[Optimizer]) -> bool:
    """True when ``cls`` steps through ``Optimizer._update`` (so ``step_with_grads`` is its
    step): it overrides neither ``step`` nor ``step_with_grads``."""
    return cls.step is Optimizer.step and cls.step_with_grads is Optimizer.step_with_grads


def _new_local_optimizer(
    optimizer_class: type, param_rrefs: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    return rpc.RRef(_LocalOptimizer(optimizer_class, param_rrefs, args, kwargs))


def _local_step(optim_rref: Any, context_id: int) -> int:
    local = optim_rref.local_value() if isinstance(optim_rref, rpc.RRef) else None
    if not isinstance(local, _LocalOptimizer):
        # A peer names this step: it runs only on the optimizers DistributedOptimizer made.
        raise TypeError(
            "a distributed optimizer step needs the RRef of a local optimizer made by "
            f"DistributedOptimizer, got {type(local if local is not None else optim_rref).__name__}"
        )
    return local.step(context_id)


class DistributedOptimizer:
    """Optimize parameters held by RRefs on any workers with one ``step(context_id)``.

    Args:
        optimizer_class: a ``gradwire.optim.Optimizer`` subclass (SGD, Adam, ..., or your own
            that implements only ``step()`` reading ``p.grad``, as PyTorch's contract allows),
            instantiated on every owner of the parameters.
        params_rref: RRefs of the parameters (local ones: ``rpc.RRef(p)``).
        *args, **kwargs: passed to ``optimizer_class`` after the parameter list.

    Raises:
        TypeError: ``params_rref`` holds something other than RRefs.
        Exception: an error raised by the optimizer's constructor on any owner (its type is
            kept; the message names the worker).

    Example:
        >>> opt = DistributedOptimizer(gradwire.optim.SGD, param_rrefs, lr=0.05)
        >>> with dist_autograd.context() as cid:
        ...     loss = forward(...)
        ...     dist_autograd.backward(cid, [loss])
        ...     opt.step(cid)
    """

    def __init__(
        self, optimizer_class: type, params_rref: list[Any], *args: Any, **kwargs: Any
    ) -> None:
        by_owner: dict[str, list[Any]] = {}
        for i, r in enumerate(params_rref):
            if not isinstance(r, rpc.RRef):
                raise TypeError(
                    f"DistributedOptimizer expects RRefs of parameters; element {i} is "
                    f"{type(r).__name__} (wrap local parameters with rpc.RRef(p))"
                )
            by_owner.setdefault(r.owner_name(), []).append(r)
        if not by_owner:
            raise ValueError("DistributedOptimizer got an empty parameter list")
        futures = [
            rpc.rpc_async(owner, _new_local_optimizer, (optimizer_class, rrefs, args, kwargs))
            for owner, rrefs in by_owner.items()
        ]
        self.remote_optimizers = [f.wait() for f in wait_all_or_raise(futures)]

    def step(self, context_id: int) -> None:
        """Apply the gradients of ``context_id`` on every owner, concurrently.

        Raises:
            Exception: the first error of any owner's step (others are still awaited).
        """
        futures = [
            rpc.rpc_async(r.owner_name(), _local_step, (r, context_id))
            for r in self.remote_optimizers
        ]
        wait_all_or_raise(futures)


def wait_all_or_raise(futures: list[Any]) -> list[Any]:
    """Wait for every future, then raise the first error (if any); returns the futures."""
    first: BaseException | None = None
    for f in futures:
        try:
            f.wait()
        except BaseException as exc:  # noqa: BLE001 - re-raised after all finished
            if first is None:
                first = exc
    if first is not None:
        raise first
    return futures
