"""The autograd graph: ``Node`` (a ``grad_fn``), saved tensors and their hooks.

A Node is created by every differentiable op that records. It keeps:
- ``next_functions``: one ``(node, output_nr)`` edge per differentiable input (``(None, 0)``
  for inputs that need no gradient);
- ``needs_input_grad``: which inputs want a gradient;
- its saved values, by name, so ``grad_fn._saved_self`` / ``grad_fn._raw_saved_self`` work as
  in PyTorch. A saved tensor records the version of the tensor when saved; reading it after an
  in-place change raises.
After a backward pass without ``retain_graph`` the saved values are released; reading them
again raises the "backward through the graph a second time" error.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

from .grad_mode import _state

if TYPE_CHECKING:
    from .._tensor import Tensor

__all__ = [
    "Node",
    "AccumulateGrad",
    "SavedTensor",
    "saved_tensors_hooks",
    "disable_saved_tensors_hooks",
]

_FREED_MSG = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward."
)


class _HookState(threading.local):
    def __init__(self) -> None:
        self.stack: list[tuple[Callable[[Any], Any], Callable[[Any], Any]]] = []
        self.disabled: str | None = None


_hooks = _HookState()


class saved_tensors_hooks:
    """Pack/unpack hooks applied to every tensor saved for backward in this thread.

    Args:
        pack_hook: called once with the tensor when it is saved; returns any object.
        unpack_hook: called with that object each time the saved tensor is used; returns a
            tensor with the same content.

    Example:
        >>> with gradwire.autograd.graph.saved_tensors_hooks(lambda t: t.numpy().copy(),
        ...                                                  lambda a: gradwire.from_numpy(a)):
        ...     y = x.pow(2)
    """

    def __init__(self, pack_hook: Callable[[Any], Any], unpack_hook: Callable[[Any], Any]) -> None:
        self.pair = (pack_hook, unpack_hook)

    def __enter__(self) -> saved_tensors_hooks:
        if _hooks.disabled is not None:
            raise RuntimeError(_hooks.disabled)
        _hooks.stack.append(self.pair)
        return self

    def __exit__(self, *exc: object) -> None:
        _hooks.stack.pop()


class disable_saved_tensors_hooks:
    """Make any use of saved-tensor hooks in this block an error with ``message``."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __enter__(self) -> None:
        self._prev = _hooks.disabled
        _hooks.disabled = self.message

    def __exit__(self, *exc: object) -> None:
        _hooks.disabled = self._prev


class _VersionCounter:
    """Shared by a tensor and all its views; bumped by every in-place change."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class SavedTensor:
    """A tensor saved for backward, as exposed by ``grad_fn._raw_saved_<name>``."""

    __slots__ = (
        "_tensor",
        "_data",
        "_version",
        "_saved_version",
        "_is_output",
        "_node_ref",
        "_output_nr",
        "_requires_grad",
        "_packed",
        "_unpack",
        "_released",
        "_has_hooks",
        "_was_none",
    )

    def __init__(self, tensor: Tensor | None, node: Node | None, is_output: bool) -> None:
        self._released = False
        self._has_hooks = False
        self._packed: Any = None
        self._unpack: Callable[[Any], Any] | None = None
        self._was_none = tensor is None
        self._tensor: Tensor | None = None
        self._data: Any = None
        self._node_ref: Node | None = None
        if tensor is None:
            return
        if tensor._inference:
            raise RuntimeError(
                "Inference tensors cannot be saved for backward. To work around you can make "
                "a clone to get a normal tensor and use it in autograd."
            )
        self._version = tensor._vc
        self._saved_version = tensor._vc.value
        self._is_output = is_output
        self._output_nr = tensor._output_nr
        self._requires_grad = tensor.requires_grad
        if is_output:
            # Keep the data, not the tensor: the tensor points at this node (a cycle).
            self._data = tensor._data
        else:
            self._tensor = tensor
        if _hooks.stack:
            if _hooks.disabled is not None:
                raise RuntimeError(_hooks.disabled)
            self._apply_pack(*_hooks.stack[-1], tensor)

    def _apply_pack(
        self, pack: Callable[[Any], Any], unpack: Callable[[Any], Any], tensor: Tensor
    ) -> None:
        before = tensor._vc.value
        self._packed = pack(tensor)
        if tensor._vc.value != before:
            raise RuntimeError(
                "A saved tensor pack hook is modifying its input in place. "
                "Tensors provided as input to pack hook can not be modified by "
                "in-place operations as this can lead to unexpected side-effects. "
                "Please open an issue if you need this behaviour."
            )
        self._unpack = unpack
        self._has_hooks = True
        self._tensor = None
        self._data = None

    def register_hooks(
        self, pack_hook: Callable[[Any], Any], unpack_hook: Callable[[Any], Any]
    ) -> None:
        """Pack this saved tensor now with ``pack_hook``; unpack it with ``unpack_hook`` on use.

        Raises:
            RuntimeError: if hooks were already registered, the tensor was None, or the saved
                tensors were freed by a backward pass.
        """
        if not callable(pack_hook) or not callable(unpack_hook):
            raise TypeError("register_hooks expects two callables: pack_hook and unpack_hook")
        if self._released:
            raise RuntimeError(_FREED_MSG)
        if self._was_none:
            raise RuntimeError("None is forbidden in saved tensors: cannot register hooks on it")
        if self._has_hooks:
            raise RuntimeError(
                "register_hooks can only be called once on a saved tensor: "
                "hooks are already registered on it"
            )
        self._apply_pack(pack_hook, unpack_hook, self._materialize(None))

    def _materialize(self, node: Node | None) -> Tensor:
        from .._tensor import Tensor

        if self._tensor is not None:
            return self._tensor
        t = Tensor._wrap(self._data)
        t._vc = self._version
        if self._requires_grad:
            t._grad_fn = node
            t._output_nr = self._output_nr
            t._requires_grad = node is None
        return t

    def unpack(self, node: Node | None = None) -> Tensor | None:
        """The saved tensor, checked against in-place changes since it was saved."""
        if self._released:
            raise RuntimeError(_FREED_MSG)
        if self._was_none:
            return None
        if self._has_hooks:
            assert self._unpack is not None
            out = self._unpack(self._packed)
            from .._tensor import Tensor

            if not isinstance(out, Tensor):
                raise TypeError(f"unpack_hook must return a Tensor, got {type(out).__name__}")
            # Only the content of the unpacked tensor counts; rebuild its autograd metadata.
            t = Tensor._wrap(out._data)
            if self._requires_grad:
                if self._is_output:
                    t._grad_fn, t._output_nr = node, self._output_nr
                else:
                    t._requires_grad = True
            return t
        if self._version.value != self._saved_version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: [{self._describe()}] is at version {self._version.value}; "
                f"expected version {self._saved_version} instead. Hint: do not modify a tensor "
                "in place while a graph that saved it still needs it, or clone() it first."
            )
        return self._materialize(node)

    def _describe(self) -> str:
        data = self._tensor._data if self._tensor is not None else self._data
        shape = "x".join(str(s) for s in data.shape) if data is not None else "?"
        return f"Tensor of shape [{shape}], dtype {data.dtype if data is not None else '?'}"

    def release(self) -> None:
        self._released = True
        self._tensor = None
        self._data = None
        self._packed = None


class Node:
    """A node of the backward graph (``tensor.grad_fn``).

    Subclasses implement ``forward(*inputs)`` (returning raw arrays) and ``backward(*grads)``
    (returning one gradient Tensor or None per input, written with Tensor ops so that
    ``create_graph=True`` records a graph of the backward pass).
    """

    # Defaults live on the class so that creating a node (once per op) allocates nothing else;
    # instances override them only when they record.
    _saved: dict[str, Any] | None = None
    _recording = False
    _released = False
    next_functions: tuple[tuple[Node | None, int], ...] = ()
    needs_input_grad: tuple[bool, ...] = ()
    _pre_hooks: dict[int, list[Callable[..., Any]]] | None = None
    _post_hooks: list[Callable[..., Any]] | None = None
    _retain_grad_hooks: dict[int, Callable[..., Any]] | None = None
    _num_outputs = 1
    # Most nodes are skipped when no gradient reaches them; a recv function still must tell
    # its peer (distributed autograd), so it sets this.
    run_without_grads = False
    _output_meta: list[tuple[Any, Any, Any]] | tuple[()] = ()  # (shape, dtype, device) per output

    @property
    def _lock(self) -> Any:
        """The lock serializing this node's backward, made on first use (dict.setdefault is
        atomic, so racing threads agree on one lock)."""
        lock = self.__dict__.get("_lock_obj")
        if lock is None:
            lock = self.__dict__.setdefault("_lock_obj", threading.Lock())
        return lock

    # -- naming and introspection -------------------------------------------------------------
    def name(self) -> str:
        """The node's name, e.g. ``MulBackward0``."""
        return f"{type(self).__name__}Backward0"

    def __repr__(self) -> str:
        return f"<{self.name()} object at {hex(id(self))}>"

    def __getattr__(self, attr: str) -> Any:
        saved = object.__getattribute__(self, "_saved")
        if saved is not None:
            if attr.startswith("_raw_saved_") and attr[11:] in saved:
                value = saved[attr[11:]]
                if isinstance(value, SavedTensor):
                    return value
            elif attr.startswith("_saved_") and attr[7:] in saved:
                value = saved[attr[7:]]
                if isinstance(value, SavedTensor):
                    return value.unpack(self)
                if isinstance(value, _Released):
                    raise RuntimeError(_FREED_MSG)
                return value
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{attr}'")

    # -- saving -------------------------------------------------------------------------------
    def save(self, name: str, value: Any, is_output: bool = False) -> None:
        """Keep ``value`` for backward (a Tensor becomes a checked SavedTensor)."""
        if not self._recording:
            return
        if self._saved is None:
            self._saved = {}
        if isinstance(value, _tensor_type) or (value is None and name in ("self", "other")):
            self._saved[name] = SavedTensor(value, self, is_output)
        else:
            self._saved[name] = value

    def saved(self, name: str) -> Any:
        """Read a saved value inside ``backward``."""
        assert self._saved is not None
        value = self._saved[name]
        if isinstance(value, SavedTensor):
            return value.unpack(self)
        if isinstance(value, _Released):
            raise RuntimeError(_FREED_MSG)
        return value

    def release_saved(self) -> None:
        """Free saved tensors (after a backward pass without retain_graph).

        Only tensors are freed, as in PyTorch: a node that saved none (AddBackward0 keeps
        shapes and alpha) can be walked again, and ``_saved_dim`` stays readable.
        """
        if self._saved is None:
            return
        for v in self._saved.values():
            if isinstance(v, SavedTensor):
                v.release()
                self._released = True
            elif isinstance(v, list):  # a custom Function's save_for_backward, or plain values
                for s in v:
                    if isinstance(s, SavedTensor):
                        s.release()
                        self._released = True

    def _check_not_released(self) -> None:
        if self._released:
            raise RuntimeError(_FREED_MSG)

    # -- hooks --------------------------------------------------------------------------------
    def register_hook(self, fn: Callable[..., Any]) -> _RemovableHandle:
        """``fn(grad_inputs, grad_outputs)`` runs after this node; may return new grad_inputs."""
        if self._post_hooks is None:
            self._post_hooks = []
        self._post_hooks.append(fn)
        return _RemovableHandle(self._post_hooks, fn)

    def register_prehook(self, fn: Callable[..., Any]) -> _RemovableHandle:
        """``fn(grad_outputs)`` runs before this node; may return new grad_outputs."""
        return self._add_pre_hook(-1, fn)

    def _add_pre_hook(self, output_nr: int, fn: Callable[..., Any]) -> _RemovableHandle:
        if self._pre_hooks is None:
            self._pre_hooks = {}
        hooks = self._pre_hooks.setdefault(output_nr, [])
        hooks.append(fn)
        return _RemovableHandle(hooks, fn)

    # -- the op protocol ------------------------------------------------------------------------
    def forward(self, *args: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no forward")

    def backward(self, *grads: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no backward")


class AccumulateGrad(Node):
    """The graph node of a leaf that requires grad: adds incoming gradients to ``.grad``."""

    __slots__ = ("variable",)

    def __init__(self, variable: Tensor) -> None:
        super().__init__()
        self.variable = variable
        self.needs_input_grad = (True,)

    def name(self) -> str:
        return "torch::autograd::AccumulateGrad"


_tensor_type: Any = ()  # gradwire.Tensor, registered by _tensor.py (which imports this module)


def register_tensor_type(cls: type) -> None:
    global _tensor_type
    _tensor_type = cls


class _Released:
    __slots__ = ()


_RELEASED = _Released()


class _RemovableHandle:
    """Returned by hook registration; ``remove()`` unregisters the hook."""

    __slots__ = ("_hooks", "_fn")

    def __init__(self, hooks: list[Any], fn: Any) -> None:
        self._hooks, self._fn = hooks, fn

    def remove(self) -> None:
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)

    def __enter__(self) -> _RemovableHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def grad_recording() -> bool:
    """True when new ops should be recorded (grad mode on)."""
    return _state.grad_enabled
