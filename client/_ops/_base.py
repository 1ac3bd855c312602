"""Op dispatch: run a Node's forward, wrap its outputs, and record the graph when needed."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .._backend import array_module, device_of, device_scope, device_scope_of
from .._sparse_coo import SparseCOO, unsupported
from .._tensor import Tensor
from ..autograd import _profiling
from ..autograd.anomaly_mode import _anomaly, record_origin
from ..autograd.grad_mode import _state
from ..autograd.graph import Node

__all__ = [
    "Op",
    "record",
    "edge_of",
    "reduce_grad",
    "as_tensor_like",
    "result_dtype",
    "promoted",
    "SPARSE_VARIANTS",
]


def edge_of(t: Any) -> tuple[Node | None, int]:
    """The backward edge for input ``t``: its grad_fn, its AccumulateGrad, or nothing."""
    if t._view_meta is not None:
        from .views import refresh_view

        refresh_view(t)
    fn = t._grad_fn
    if fn is not None:
        return fn, t._output_nr
    if t._requires_grad:
        return t._grad_accumulator(), 0
    return None, 0


def _stale_view(t: Any) -> bool:
    """A view whose storage was modified in place since it took its grad_fn may now need
    grad (e.g. ``buf[0].copy_(w)`` made ``buf`` part of the graph)."""
    if t._view_meta is None:
        return False
    from .views import refresh_view

    return refresh_view(t)


class Op(Node):
    """A built-in op. Class attributes tune dispatch:

    - ``is_view``: the output shares memory with input 0 (and its version counter);
    - ``save_output``: name under which output 0 is saved for backward (e.g. "result");
    - ``differentiable``: False for ops whose outputs never require grad (comparisons).
    """

    __slots__ = ()
    is_view = False
    save_output: str | None = None
    differentiable = True
    scalar_operand = False  # the op's second operand is a Python number (see scalar.py)
    sparse_inputs = False  # the op takes sparse COO tensors (see sparse.py)

    @classmethod
    def apply(cls, *inputs: Any, **kwargs: Any) -> Any:
        return record(cls, inputs, kwargs)


#: op class -> the function that computes it when an operand is sparse (``_sparse_methods.py``).
SPARSE_VARIANTS: dict[type[Op], Callable[..., Any]] = {}


def record(cls: type[Op], inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if _profiling.active:  # one global test while no one profiles
        rec = _profiling.current()
        if rec is not None:
            ev = rec.begin(_profiling.op_name(cls, kwargs), inputs)
            out = None
            try:
                out = _record(cls, inputs, kwargs)
                return out
            finally:
                rec.end(ev, out)
    return _record(cls, inputs, kwargs)


def _record(cls: type[Op], inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    node = cls()
    tensors = [t for t in inputs if isinstance(t, Tensor)]
    requires = (
        cls.differentiable
        and _state.grad_enabled
        and any(t._requires_grad or t._grad_fn is not None or _stale_view(t) for t in tensors)
    )
    if requires:
        node._recording = True
        node.next_functions = tuple(edge_of(t) for t in tensors)
        node.needs_input_grad = tuple(t._requires_grad or t._grad_fn is not None for t in tensors)
        if _anomaly.enabled:
            record_origin(node)
        if cls.scalar_operand:
            # PyTorch wraps the number in a tensor: show its (empty) edge the same way.
            node.next_functions += ((None, 0),)
            node.needs_input_grad += (False,)
    scope = device_scope_of(tensors)
    try:
        if scope is None:
            out = node.forward(*inputs, **kwargs)
        else:
            with scope:
                out = node.forward(*inputs, **kwargs)
    except (AttributeError, TypeError) as exc:
        # A sparse operand fails the dense forward (SparseCOO refuses array use), so the
        # dense path never checks for one: the op's sparse variant, if any, runs instead.
        if cls.sparse_inputs or not any(type(t._data) is SparseCOO for t in tensors):
            raise
        variant = SPARSE_VARIANTS.get(cls)
        if variant is None:
            raise NotImplementedError(unsupported(f"{cls.__name__}")) from exc
        return variant(*inputs, **kwargs)
    inference = _state.inference
    if isinstance(out, tuple):
        results = tuple(
            _wrap_output(o, i, node, requires, inference, inputs) for i, o in enumerate(out)
        )
        node._num_outputs = len(results)
        if requires:
            node._output_meta = [(r._data.shape, r._data.dtype, r.device) for r in results]
        return results
    result = _wrap_output(out, 0, node, requires, inference, inputs)
    if cls.is_view and result._base is not None:
        # How to make this view again from its source (see views.py).
        result._view_meta = (inputs[0], cls, kwargs, result._vc.value)
    if requires:
        node._output_meta = [(result._data.shape, result._data.dtype, None)]
        if cls.save_output is not None:
            node.save(cls.save_output, result, is_output=True)
    return result


def _wrap_output(
    arr: Any, nr: int, node: Node, requires: bool, inference: bool, inputs: tuple[Any, ...]
) -> Any:
    t = Tensor._wrap(arr)
    t._inference = inference
    if requires:
        t._grad_fn = node
        t._output_nr = nr
    if getattr(type(node), "is_view", False):
        src = inputs[0]
        shares = (
            arr is src._data or array_module(arr) is not np or np.may_share_memory(arr, src._data)
        )
        if shares:
            t._base = src._base if src._base is not None else src
            t._vc = src._vc
    return t


def reduce_grad(grad: Any, like_shape: tuple[int, ...], like_dtype: Any) -> Any:
    """Sum ``grad`` back over broadcast axes to ``like_shape``; drop the imaginary part for a
    real input (the R->C rule); cast to the input's dtype."""
    if grad is None:
        return None
    gshape = grad.shape
    if gshape != like_shape:
        lead = len(gshape) - len(like_shape)
        axes = tuple(range(lead)) + tuple(
            i + lead for i, s in enumerate(like_shape) if s == 1 and gshape[i + lead] != 1
        )
        if axes:
            grad = grad.sum(dim=axes, keepdim=True)
        if lead:
            grad = grad.reshape(like_shape)
        elif grad.shape != like_shape:
            grad = grad.reshape(like_shape)
    gk = grad._data.dtype.kind
    lk = np.dtype(like_dtype).kind
    if gk == "c" and lk != "c":
        grad = grad.real
    if grad._data.dtype != like_dtype and lk in "fc":
        grad = grad.to(dtype=like_dtype)
    return grad


def as_tensor_like(value: Any, like: Any) -> Any:
    """Turn a Python scalar or array-like into a Tensor that does not upcast ``like``."""
    from .._dtypes import get_default_dtype

    if isinstance(value, Tensor):
        return value
    xp = array_module(like._data)
    ldt = like._data.dtype
    if isinstance(value, (bool, np.bool_)):
        dt = ldt
    elif isinstance(value, (int, np.integer)):
        dt = ldt if ldt.kind != "b" else np.int64
    elif isinstance(value, (float, np.floating)):
        dt = ldt if ldt.kind in "fc" else get_default_dtype().np
    elif isinstance(value, (complex, np.complexfloating)):
        dt = ldt if ldt.kind == "c" else (np.complex128 if ldt == np.float64 else np.complex64)
    else:
        arr = _asarray_beside(xp, like._data, value, None)
        if arr.dtype == np.float64 and ldt.kind in "fc":
            arr = _asarray_beside(xp, like._data, arr, ldt)
        return Tensor._wrap(arr)
    return Tensor._wrap(_asarray_beside(xp, like._data, value, dt))


def _asarray_beside(xp: Any, like: Any, value: Any, dtype: Any) -> Any:
    """``xp.asarray(value, dtype)`` on the device of the array ``like`` (CuPy makes new arrays
    on the current device, which need not be ``like``'s)."""
    if xp is np:
        return np.asarray(value, dtype=dtype)
    with device_scope(device_of(like)):
        return xp.asarray(value, dtype=dtype)


_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def _promote_group(dtypes: list[Any]) -> Any:
    # PyTorch keeps the float width when mixing ints and floats (int64 + float32 -> float32),
    # where NumPy would widen to float64: only dtypes of the top category (floats, for complex)
    # take part in the width decision.
    top = max(_CATEGORY[d.kind] for d in dtypes)
    floor = 2 if top >= 2 else top
    return np.result_type(*[d for d in dtypes if _CATEGORY[d.kind] >= floor])


def result_dtype(*tensors: Any) -> Any:
    """The dtype PyTorch's type promotion gives an op of ``tensors``: dimensioned tensors
    decide, unless a 0-d tensor (a wrapped Python scalar, say) is of a higher category."""
    dims = [t._data.dtype for t in tensors if t._data.ndim]
    zeros = [t._data.dtype for t in tensors if not t._data.ndim]
    if not dims:
        return _promote_group(zeros)
    if not zeros:
        return dims[0] if len(dims) == 1 else _promote_group(dims)
    top_zero = max(_CATEGORY[d.kind] for d in zeros)
    if top_zero > max(_CATEGORY[d.kind] for d in dims):
        return _promote_group(dims + [d for d in zeros if _CATEGORY[d.kind] == top_zero])
    return _promote_group(dims)


def promoted(*tensors: Any) -> list[Any]:
    """The arrays of ``tensors`` cast to their common ``result_dtype`` (no copy when equal)."""
    arrs = [t._data for t in tensors]
    first = arrs[0].dtype
    if all(a.dtype == first for a in arrs):
        return arrs
    dt = result_dtype(*tensors)
    # Bool arrays need no cast: NumPy's ufuncs promote them to any other dtype exactly.
    return [a if a.dtype == dt or a.dtype.kind == "b" else a.astype(dt) for a in arrs]
