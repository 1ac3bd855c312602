"""``gradwire.Tensor``: an n-dimensional array (NumPy on CPU, CuPy on GPU) with autograd."""

from __future__ import annotations

import builtins
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from ._backend import CPU, Device, device_of, device_scope
from ._dtypes import dtype as _dtype_cls
from ._dtypes import from_numpy_dtype, to_numpy_dtype
from ._sparse_coo import SparseCOO
from .autograd.grad_mode import _state
from .autograd.graph import (
    AccumulateGrad,
    Node,
    _RemovableHandle,
    _VersionCounter,
    register_tensor_type,
)

__all__ = ["Tensor", "from_numpy", "is_tensor"]


def _check_inference_use(tensors: Sequence[Tensor]) -> None:
    if not _state.inference:
        for t in tensors:
            if t._inference:
                raise RuntimeError(
                    "Inference tensors cannot be saved for backward. To work around you can "
                    "make a clone to get a normal tensor and use it in autograd."
                )


class Tensor:
    """A multi-dimensional array with automatic differentiation.

    Build one with ``gradwire.tensor(data)``, ``gradwire.zeros(...)`` and friends. Arithmetic
    follows NumPy broadcasting; ops on tensors that require grad are recorded so that
    ``backward()`` can compute gradients.
    """

    __slots__ = ("_data", "_vc", "__weakref__", "__dict__")
    __array_priority__ = 1000  # make ndarray <op> Tensor defer to Tensor

    # Autograd metadata defaults live on the class: a new tensor (one per op) sets only its
    # data and version counter; the rest is written to the instance when it changes.
    _requires_grad = False
    _grad_fn: Node | None = None
    _output_nr = 0
    _grad: Tensor | None = None
    _base: Tensor | None = None
    _inference = False
    _hooks: list[Callable[..., Any]] | None = None
    _retains_grad = False
    _grad_acc: weakref.ref[AccumulateGrad] | None = None
    _shared: Any = None

    if TYPE_CHECKING:
        # The op surface is attached by _tensor_methods.py; tell the type checker about it.
        def __getattr__(self, name: str) -> Any: ...
        def __add__(self, other: Any) -> Tensor: ...
        def __radd__(self, other: Any) -> Tensor: ...
        def __sub__(self, other: Any) -> Tensor: ...
        def __rsub__(self, other: Any) -> Tensor: ...
        def __mul__(self, other: Any) -> Tensor: ...
        def __rmul__(self, other: Any) -> Tensor: ...
        def __truediv__(self, other: Any) -> Tensor: ...
        def __rtruediv__(self, other: Any) -> Tensor: ...
        def __matmul__(self, other: Any) -> Tensor: ...
        def __rmatmul__(self, other: Any) -> Tensor: ...
        def __pow__(self, other: Any) -> Tensor: ...
        def __rpow__(self, other: Any) -> Tensor: ...
        def __neg__(self) -> Tensor: ...
        def __abs__(self) -> Tensor: ...
        def __invert__(self) -> Tensor: ...
        def __and__(self, other: Any) -> Tensor: ...
        def __or__(self, other: Any) -> Tensor: ...
        def __lt__(self, other: Any) -> Tensor: ...
        def __le__(self, other: Any) -> Tensor: ...
        def __gt__(self, other: Any) -> Tensor: ...
        def __ge__(self, other: Any) -> Tensor: ...
        def __eq__(self, other: Any) -> Tensor: ...  # type: ignore[override]
        def __ne__(self, other: Any) -> Tensor: ...  # type: ignore[override]
        def __getitem__(self, index: Any) -> Tensor: ...
        def __setitem__(self, index: Any, value: Any) -> None: ...

    # For views made by a view op: (source, op class, kwargs, version); see _ops/views.py.
    _view_meta: Any = None

    def __init__(
        self,
        data: Any = None,
        *,
        requires_grad: bool = False,
        dtype: Any = None,
        device: Any = None,
    ) -> None:
        from ._creation import _array_from

        arr = _array_from(data if data is not None else [], dtype, device)
        self._init(arr)
        if requires_grad:
            self.requires_grad_(True)

    def _init(self, arr: Any) -> None:
        self._data = arr
        self._vc = _VersionCounter()

    @classmethod
    def _wrap(cls, arr: Any, requires_grad: bool = False) -> Tensor:
        """Build a tensor around an ndarray without copying it."""
        if isinstance(arr, np.generic):
            # NumPy ops on 0-d arrays return scalars; a tensor always holds an ndarray.
            arr = np.asarray(arr)
        t = object.__new__(cls)  # bypass subclass __new__ (Parameter's wraps a Tensor)
        t._data = arr
        t._vc = _VersionCounter()
        if requires_grad:
            t._requires_grad = True
        return t

    # ---------------------------------------------------------------- metadata
    @property
    def data(self) -> Tensor:
        """A tensor sharing storage that is not part of the graph (like ``detach()``)."""
        return self.detach()

    @data.setter
    def data(self, value: Tensor) -> None:
        self._data = value._data

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    def size(self, dim: int | None = None) -> Any:
        """The shape, or the size of one dimension."""
        return self.shape if dim is None else self._data.shape[dim]

    @property
    def ndim(self) -> int:
        return int(self._data.ndim)

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return int(self._data.size)

    def nelement(self) -> int:
        return self.numel()

    def element_size(self) -> int:
        return int(self._data.itemsize)

    @property
    def dtype(self) -> _dtype_cls:
        return from_numpy_dtype(self._data.dtype)

    @property
    def device(self) -> Device:
        return device_of(self._data)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def is_sparse(self) -> bool:
        """True for a sparse COO tensor (``gradwire.sparse_coo_tensor``, ``to_sparse()``)."""
        return type(self._data) is SparseCOO

    def data_ptr(self) -> int:
        """The address of this tensor's first element (NumPy's or CuPy's data pointer), as
        PyTorch's ``data_ptr``: two tensors sharing storage at the same offset have the same."""
        if type(self._data) is SparseCOO:
            raise RuntimeError(
                "Cannot access data pointer of Tensor that doesn't have storage (a sparse "
                "tensor: use ._values().data_ptr())"
            )
        interface = getattr(self._data, "__array_interface__", None)
        if interface is not None:
            return int(interface["data"][0])
        return int(self._data.data.ptr)  # CuPy

    def is_floating_point(self) -> bool:
        return bool(self._data.dtype.kind == "f")

    def is_complex(self) -> bool:
        return bool(self._data.dtype.kind == "c")

    def is_contiguous(self) -> bool:
        if type(self._data) is SparseCOO:
            return False
        return bool(self._data.flags.c_contiguous)

    def stride(self, dim: int | None = None) -> Any:
        if type(self._data) is SparseCOO:
            raise RuntimeError("Sparse tensors do not have strides")
        st = tuple(s // self._data.itemsize for s in self._data.strides)
        return st if dim is None else st[dim]

    def is_inference(self) -> bool:
        return self._inference

    @property
    def _version(self) -> int:
        """PyTorch's ``Tensor._version``: in-place ops increase it; views share it with their
        base (one counter, ``_vc``)."""
        return self._vc.value

    # ---------------------------------------------------------------- autograd metadata
    @property
    def requires_grad(self) -> bool:
        if self._view_meta is not None:
            from ._ops.views import refresh_view

            return refresh_view(self)
        return self._requires_grad or self._grad_fn is not None

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set whether autograd records ops on this leaf tensor (in place)."""
        if self._grad_fn is not None:
            if not requires_grad:
                raise RuntimeError(
                    "you can only change requires_grad flags of leaf variables. If you want to "
                    "use a computed variable in a subgraph that doesn't require differentiation "
                    "use var_no_grad = var.detach()."
                )
            return self
        if requires_grad and self._data.dtype.kind not in "fc":
            raise RuntimeError(
                f"only Tensors of floating point and complex dtype can require gradients, got {self.dtype}"
            )
        if requires_grad and self._inference and not _state.inference:
            raise RuntimeError(
                "Setting requires_grad=True on inference tensor outside InferenceMode is not allowed."
            )
        self._requires_grad = bool(requires_grad)
        return self

    @property
    def grad_fn(self) -> Node | None:
        if self._view_meta is not None:
            from ._ops.views import refresh_view

            refresh_view(self)  # a view of a storage modified in place takes its new history
        return self._grad_fn

    @property
    def is_leaf(self) -> bool:
        return self._grad_fn is None

    @property
    def grad(self) -> Tensor | None:
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(
                    f"assigned grad must be a Tensor or None, got {type(value).__name__}"
                )
            if value.shape != self.shape:
                raise RuntimeError(
                    f"assigned grad has shape {value.shape}, but the tensor has shape {self.shape}"
                )
        self._grad = value

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def retain_grad(self) -> None:
        """Keep ``.grad`` for this non-leaf tensor after backward."""
        if not self.requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self.is_leaf or self._retains_grad:
            return
        self._retains_grad = True
        assert self._grad_fn is not None
        ref = weakref.ref(self)
        if self._grad_fn._retain_grad_hooks is None:
            self._grad_fn._retain_grad_hooks = {}
        self._grad_fn._retain_grad_hooks[self._output_nr] = lambda g: _retain(ref, g)

    def register_hook(self, hook: Callable[[Tensor], Tensor | None]) -> _RemovableHandle:
        """Run ``hook(grad)`` when this tensor's gradient is computed; a returned tensor
        replaces the gradient.

        Raises:
            RuntimeError: if the tensor does not require grad.
        """
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self._grad_fn is not None:
            return self._grad_fn._add_pre_hook(self._output_nr, hook)
        if self._hooks is None:
            self._hooks = []
        self._hooks.append(hook)
        return _RemovableHandle(self._hooks, hook)

    def _grad_accumulator(self) -> AccumulateGrad:
        acc = self._grad_acc() if self._grad_acc is not None else None
        if acc is None:
            acc = AccumulateGrad(self)
            self._grad_acc = weakref.ref(acc)
        return acc

    def backward(
        self,
        gradient: Tensor | None = None,
        retain_graph: bool | None = None,
        create_graph: bool = False,
        inputs: Sequence[Tensor] | None = None,
    ) -> None:
        """Compute the gradient of this tensor w.r.t. graph leaves, accumulating into ``.grad``.

        Args:
            gradient: the gradient w.r.t. this tensor; required unless it has one element.
            retain_graph: keep saved tensors for another backward (default: create_graph).
            create_graph: record the backward pass so higher-order gradients can be taken.
            inputs: accumulate only into these tensors.

        Raises:
            RuntimeError: if the tensor does not require grad, or the graph was freed.
        """
        from .autograd import backward as _backward

        _backward(
            [self],
            None if gradient is None else [gradient],
            retain_graph,
            create_graph,
            inputs=inputs,
        )

    def detach(self) -> Tensor:
        """A new tensor sharing storage (and version counter) but outside the graph."""
        t = Tensor._wrap(self._data)
        t._vc = self._vc
        t._base = self._base
        t._inference = self._inference
        return t

    def detach_(self) -> Tensor:
        """Detach this tensor from the graph in place."""
        self._grad_fn = None
        self._requires_grad = False
        return self

    # ---------------------------------------------------------------- conversion
    def numpy(self, *, force: bool = False) -> np.ndarray:
        """The NumPy array sharing this tensor's memory (CPU tensors only).

        Raises:
            TypeError: for CUDA tensors (use ``.cpu().numpy()``).
            RuntimeError: for tensors that require grad (use ``.detach().numpy()``).
        """
        if self.device.type != "cpu":
            if force:
                return self.cpu().numpy()
            raise TypeError(
                f"can't convert {self.device} tensor to numpy. Use Tensor.cpu() to copy the "
                "tensor to host memory first."
            )
        if self.requires_grad and not force:
            raise RuntimeError(
                "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."
            )
        if type(self._data) is SparseCOO:
            raise TypeError(
                "can't convert Sparse layout tensor to numpy. Use Tensor.to_dense() first."
            )
        return self._data

    def item(self) -> Any:
        """The value of a one-element tensor as a Python number."""
        if self._data.size != 1:
            raise RuntimeError(
                f"a Tensor with {self._data.size} elements cannot be converted to Scalar"
            )
        return self._data.reshape(()).item()

    def tolist(self) -> Any:
        return self._to_host().tolist()

    def _to_host(self) -> np.ndarray:
        arr = self._data
        return arr if isinstance(arr, np.ndarray) else arr.get()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self._to_host()
        return arr.astype(dtype) if dtype is not None else arr

    def to(self, *args: Any, **kwargs: Any) -> Tensor:
        """Move and/or cast: ``to(device)``, ``to(dtype)``, ``to(device, dtype)``, ``to(other)``.

        Differentiable; returns ``self`` when nothing changes.
        """
        dev = kwargs.pop("device", None)
        dt = kwargs.pop("dtype", None)
        kwargs.pop("non_blocking", None)
        copy = kwargs.pop("copy", False)
        if kwargs:
            raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, _dtype_cls):
                dt = a
            elif isinstance(a, Tensor):
                dev, dt = a.device, a.dtype
            elif isinstance(a, (str, Device)):
                dev = a
            else:
                raise TypeError(f"to() expects a device, a dtype or a tensor, got {a!r}")
        target = Device(dev) if dev is not None else self.device
        np_dt = to_numpy_dtype(dt) if dt is not None else self._data.dtype
        if target == self.device and np_dt == self._data.dtype and not copy:
            return self
        from ._ops.unary import ToCopy

        return ToCopy.apply(self, device=target, dtype=np_dt)

    def cpu(self) -> Tensor:
        return self.to(CPU)

    def cuda(self, device: int | str | None = None) -> Tensor:
        """A copy on a CUDA device (clear error when none is available)."""
        if isinstance(device, int):
            device = f"cuda:{device}"
        return self.to(Device(device or "cuda:0"))

    def float(self) -> Tensor:
        return self.to(dtype=np.float32)

    def double(self) -> Tensor:
        return self.to(dtype=np.float64)

    def half(self) -> Tensor:
        return self.to(dtype=np.float16)

    def long(self) -> Tensor:
        return self.to(dtype=np.int64)

    def int(self) -> Tensor:
        return self.to(dtype=np.int32)

    def bool(self) -> Tensor:
        return self.to(dtype=np.bool_)

    def type(self, dtype: Any = None) -> Any:
        if dtype is None:
            return f"gradwire.{self.dtype.name}"
        return self.to(dtype=dtype)

    # ---------------------------------------------------------------- python protocol
    def __repr__(self) -> str:
        from ._repr import tensor_repr

        return tensor_repr(self)

    def __len__(self) -> builtins.int:
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return int(self._data.shape[0])

    def __iter__(self) -> Iterator[Tensor]:
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._data.shape[0]))

    def __bool__(self) -> builtins.bool:
        if self._data.size != 1:
            raise RuntimeError(
                f"Boolean value of Tensor with {self._data.size} values is ambiguous"
            )
        return bool(self._data.reshape(()).item())

    def __float__(self) -> builtins.float:
        return float(self.item())

    def __int__(self) -> builtins.int:
        return int(self.item())

    def __index__(self) -> builtins.int:
        if self._data.dtype.kind not in "iu" or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __complex__(self) -> complex:
        return complex(self.item())

    __hash__ = object.__hash__

    def __reduce_ex__(self, protocol: Any) -> Any:
        data = self._data
        if type(data) is SparseCOO:
            host = (_host(data.indices), _host(data.values))
            return (
                _rebuild_sparse,
                (
                    *host,
                    data.shape,
                    data.coalesced,
                    self.requires_grad and self.is_leaf,
                    type(self),
                ),
            )
        return (
            _rebuild_tensor,
            (self._to_host().copy(), self.requires_grad and self.is_leaf, type(self)),
        )

    def __deepcopy__(self, memo: dict[builtins.int, Any]) -> Tensor:
        if not self.is_leaf:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol"
            )
        with device_scope(self.device):  # CuPy copies onto the current device
            t = type(self)._wrap(self._data.copy(), self._requires_grad)
        if self._grad is not None:
            t._grad = self._grad.__deepcopy__(memo)
        memo[id(self)] = t
        return t

    def share_memory_(self) -> Tensor:
        """Move this CPU tensor's storage to shared memory (see gradwire.multiprocessing)."""
        from .multiprocessing._sharing import share_memory_

        share_memory_(self)
        return self

    def is_shared(self) -> builtins.bool:
        """True when the storage lives in shared memory (CUDA tensors: always)."""
        from .multiprocessing._sharing import is_shared

        return is_shared(self)


def _retain(ref: weakref.ref[Tensor], grad: Tensor) -> None:
    t = ref()
    if t is None:
        return
    g = grad.detach()
    if t._grad is None:
        t._grad = Tensor._wrap(g._data.copy())
    else:
        t._grad = t._grad.detach() + g


def _rebuild_tensor(
    arr: np.ndarray, requires_grad: builtins.bool, cls: type[Tensor] = Tensor
) -> Tensor:
    t = cls._wrap(arr)
    if requires_grad:
        t._requires_grad = True
    return t


def _host(arr: Any) -> np.ndarray:
    return arr.copy() if isinstance(arr, np.ndarray) else arr.get()


def _rebuild_sparse(
    indices: np.ndarray,
    values: np.ndarray,
    shape: tuple[builtins.int, ...],
    coalesced: builtins.bool,
    requires_grad: builtins.bool,
    cls: type[Tensor] = Tensor,
) -> Tensor:
    from ._sparse_kernels import build

    t = cls._wrap(build(indices, values, shape, coalesced))
    if requires_grad:
        t._requires_grad = True
    return t


def is_tensor(obj: Any) -> builtins.bool:
    """True when ``obj`` is a gradwire Tensor."""
    return isinstance(obj, Tensor)


def from_numpy(arr: np.ndarray) -> Tensor:
    """A tensor sharing memory with a NumPy array; writes to either are seen by both.

    Raises:
        TypeError: if ``arr`` is not an ndarray or its dtype is unsupported.
    """
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"from_numpy expects a numpy.ndarray, got {type(arr).__name__}")
    from_numpy_dtype(arr.dtype)
    return Tensor._wrap(arr)


register_tensor_type(Tensor)

from . import _tensor_methods  # noqa: E402,F401  (attaches ops as Tensor methods)
