"""Custom differentiable functions: subclass ``Function`` with static forward/backward.

Example:
    >>> class Exp(gradwire.autograd.Function):
    ...     @staticmethod
    ...     def forward(ctx, x):
    ...         y = x.exp()
    ...         ctx.save_for_backward(y)
    ...         return y
    ...     @staticmethod
    ...     def backward(ctx, g):
    ...         (y,) = ctx.saved_tensors
    ...         return g * y
    >>> y = Exp.apply(x)
"""

from __future__ import annotations

import functools
from typing import Any

from .anomaly_mode import _anomaly, record_origin
from .grad_mode import _state, no_grad
from .graph import Node, SavedTensor

__all__ = ["Function", "FunctionCtx", "BackwardCFunction", "once_differentiable"]


class FunctionCtx:
    """The ``ctx`` of a custom Function during forward (and its graph node afterwards)."""

    def save_for_backward(self, *tensors: Any) -> None:
        """Keep tensors (or None) for backward; read them back with ``ctx.saved_tensors``."""
        from .._tensor import Tensor

        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(
                    f"save_for_backward can only save tensors or None, got {type(t).__name__}; "
                    "store other values as ctx attributes"
                )
        self._to_save = tensors

    def mark_dirty(self, *tensors: Any) -> None:
        """Declare inputs that forward modified in place."""
        self._dirty = tensors

    def mark_non_differentiable(self, *tensors: Any) -> None:
        """Declare outputs that never get a gradient."""
        self._non_diff = tensors

    def set_materialize_grads(self, value: bool) -> None:
        """If False, backward receives None (not zeros) for outputs without a gradient."""
        self._materialize = value


class BackwardCFunction(FunctionCtx, Node):
    """The graph node of one application of a custom Function; also its ``ctx``."""

    _fn_cls: type[Function]

    def name(self) -> str:
        return f"{self._fn_cls.__name__}Backward"

    @property
    def saved_tensors(self) -> tuple[Any, ...]:
        saved = self._saved
        if saved is None:
            return ()
        items = saved.get("__tensors__", ())
        if not isinstance(items, list) or any(s._released for s in items):
            from .graph import _FREED_MSG

            raise RuntimeError(_FREED_MSG)
        return tuple(s.unpack(self) for s in items)

    def backward(self, *grads: Any) -> Any:
        from .._tensor import Tensor

        if getattr(self, "_materialize", True):
            grads = tuple(
                g if g is not None else Tensor._wrap(_zeros(meta))
                for g, meta in zip(grads, self._output_meta)
            )
        out = self._fn_cls.backward(self, *grads)
        if not isinstance(out, tuple):
            out = (out,)
        n_in = len(self._input_is_tensor)
        if len(out) < n_in:
            raise RuntimeError(
                f"function {self.name()} returned an incorrect number of gradients (expected {n_in}, got {len(out)})"
            )
        # Keep only gradients of tensor inputs, in next_functions order.
        result = []
        for is_t, g, needs in zip(self._input_is_tensor, out, self._all_needs):
            if not is_t:
                continue
            if g is not None and not isinstance(g, Tensor):
                raise TypeError(
                    f"{self.name()}: backward must return Tensors or None, got {type(g).__name__}"
                )
            result.append(g if needs else None)
        return tuple(result)


def _zeros(meta: Any) -> Any:
    shape, dtype, dev = meta
    from .._backend import CPU, module_for

    return module_for(dev or CPU).zeros(shape, dtype=dtype)


class _FunctionMeta(type):
    def __init__(cls, name: str, bases: tuple[type, ...], attrs: dict[str, Any]) -> None:
        cls._backward_cls = type(name + "Backward", (BackwardCFunction,), {"_fn_cls": cls})
        super().__init__(name, bases, attrs)


class Function(metaclass=_FunctionMeta):
    """Base class of custom autograd functions; call them with ``MyFunction.apply(*args)``."""

    @staticmethod
    def forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "You must implement the forward function for custom autograd.Function."
        )

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        raise NotImplementedError(
            "You must implement either the backward or vjp method for your custom autograd.Function to use it with backward mode AD."
        )

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        from .._ops._base import edge_of
        from .._tensor import Tensor

        node: Any = cls._backward_cls()
        tensors = [a for a in args if isinstance(a, Tensor)]
        needs = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        requires = _state.grad_enabled and any(needs)
        node.needs_input_grad = needs
        node._all_needs = needs
        node._input_is_tensor = tuple(isinstance(a, Tensor) for a in args)
        if requires:
            # Inference tensors may be inputs; only saving one is an error (SavedTensor).
            node._recording = True
            node.next_functions = tuple(edge_of(t) for t in tensors)
            if _anomaly.enabled:
                record_origin(node)
        with no_grad():
            out = cls.forward(node, *args, **kwargs)
        single = not isinstance(out, tuple)
        outs = (out,) if single else out
        dirty = getattr(node, "_dirty", ())
        non_diff = getattr(node, "_non_diff", ())
        wrapped = []
        for i, o in enumerate(outs):
            if not isinstance(o, Tensor):
                wrapped.append(o)
                continue
            if any(o is d for d in dirty):
                t = o  # modified in place: it takes this node as its history
                if requires and t._grad_fn is None and t._requires_grad:
                    raise RuntimeError(
                        "a leaf Variable that requires grad has been used in an in-place operation."
                    )
            elif any(o is a for a in tensors) or o._grad_fn is not None or o._requires_grad:
                t = Tensor._wrap(o._data)
                t._vc = o._vc
            else:
                t = o
            if requires and not any(o is n for n in non_diff) and t._data.dtype.kind in "fc":
                t._grad_fn, t._output_nr = node, i
            wrapped.append(t)
        if requires:
            node._num_outputs = len(outs)
            node._output_meta = [
                (w._data.shape, w._data.dtype, w.device)
                if isinstance(w, Tensor)
                else ((), None, None)
                for w in wrapped
            ]
            to_save = getattr(node, "_to_save", ())
            node._saved = {
                "__tensors__": [
                    SavedTensor(t, node, any(t is w for w in wrapped) or any(t is o for o in outs))
                    if t is not None
                    else SavedTensor(None, node, False)
                    for t in to_save
                ]
            }
        else:
            to_save = getattr(node, "_to_save", ())
            node._saved = {"__tensors__": [SavedTensor(t, None, False) for t in to_save]}
        return wrapped[0] if single else tuple(wrapped)


def once_differentiable(fn: Any) -> Any:
    """Mark a backward as not differentiable again: it runs without recording, and when its
    gradient inputs require grad (create_graph), differentiating its results raises.

    Example:
        >>> @staticmethod
        ... @gradwire.autograd.once_differentiable
        ... def backward(ctx, g): ...
    """

    @functools.wraps(fn)
    def wrapper(ctx: Any, *args: Any) -> Any:
        from .._tensor import Tensor

        with no_grad():
            out = fn(ctx, *args)
        if not _state.grad_enabled or not any(
            isinstance(a, Tensor) and a.requires_grad for a in args
        ):
            return out
        if isinstance(out, tuple):
            return tuple(_delayed_error(o) if isinstance(o, Tensor) else o for o in out)
        return _delayed_error(out) if isinstance(out, Tensor) else out

    return wrapper


class DelayedError(Node):
    """The grad_fn of a ``once_differentiable`` result: differentiating through it raises."""

    def backward(self, *grads: Any) -> Any:
        raise RuntimeError(
            "trying to differentiate twice a function that was marked with @once_differentiable"
        )


def _delayed_error(t: Any) -> Any:
    from .._tensor import Tensor

    # Recorded even though its input (computed under no_grad) does not require grad: that is
    # the point, a later backward must reach this node and fail loudly rather than yield zeros.
    out = Tensor._wrap(t._data)
    out._grad_fn = DelayedError()
    return out
