"""``Optimizer``: parameter groups, per-parameter state, zero_grad, and the step contract."""

from __future__ import annotations

from typing import Any, ClassVar, Iterable

from .._backend import device_scope_of
from .._sparse_coo import is_sparse
from .._tensor import Tensor
from ..errors import ArgumentError

__all__ = ["Optimizer", "check_non_negative"]


def check_non_negative(**values: float) -> None:
    """PyTorch's argument check: ``ValueError("Invalid <name>: <value>")`` for a negative one
    (``learning_rate=`` reads "learning rate"; other names get " value", as PyTorch words it)."""
    for key, value in values.items():
        if value < 0.0:
            name = "learning rate" if key == "learning_rate" else f"{key} value"
            raise ValueError(f"Invalid {name}: {value}")


class Optimizer:
    """Base class: holds ``param_groups`` (dicts with "params" and hyper-parameters) and ``state``.

    Subclasses implement ``_update(param, grad, state, group)`` working on arrays in place. The
    gradient is a dense array, or a ``SparseCOO`` (from ``nn.Embedding(sparse=True)``) only
    when the class sets ``_accepts_sparse_grad``; ``_check_grad`` refuses the rest, as PyTorch
    does, for every gradient of a step before any parameter moves.
    """

    #: Whether ``_update`` takes sparse (SparseCOO) gradients: SGD, Adagrad and SparseAdam do.
    _accepts_sparse_grad: ClassVar[bool] = False

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        if isinstance(params, Tensor):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or dicts, "
                f"but got {type(params).__name__}"
            )
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = []
        self.state: dict[Tensor, dict[str, Any]] = {}
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group: dict[str, Any]) -> None:
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, got {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        full = {**self.defaults, **group, "params": params}
        self.param_groups.append(full)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset gradients: to None by default, else zeroed in place (a sparse gradient is
        emptied: no stored elements, as PyTorch's ``zero_()`` leaves it)."""
        for g in self.param_groups:
            for p in g["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    if is_sparse(p.grad._data):
                        p.grad.zero_()
                    else:
                        p.grad._data[...] = 0

    def step(self, closure: Any = None) -> Any:
        """Update every parameter that has a gradient; parameters without one are untouched."""
        loss = None
        if closure is not None:
            from ..autograd.grad_mode import enable_grad

            with enable_grad():
                loss = closure()
        self._apply(
            [
                (g, p, p.grad._data)
                for g in self.param_groups
                for p in g["params"]
                if p.grad is not None
            ]
        )
        return loss

    def step_with_grads(self, grads: dict[Tensor, Tensor]) -> None:
        """Apply one step using gradients from ``grads`` instead of ``.grad`` (used by the
        distributed optimizer with a dist-autograd context's gradients)."""
        self._apply(
            [
                (g, p, grads[p]._data)
                for g in self.param_groups
                for p in g["params"]
                if grads.get(p) is not None
            ]
        )

    def _apply(self, work: list[tuple[dict[str, Any], Tensor, Any]]) -> None:
        # Every gradient is checked first, so a refused step leaves all parameters as they were.
        for group, p, grad in work:
            self._check_grad(p, grad, group)
        for group, p, grad in work:
            self._update_on_device(p, grad, group)

    def _check_grad(self, p: Tensor, grad: Any, group: dict[str, Any]) -> None:
        """Raise ``ArgumentError`` (a RuntimeError, as PyTorch's) when ``_update`` cannot take
        ``grad`` with ``group``'s options; subclasses add their own refusals."""
        if is_sparse(grad) and not self._accepts_sparse_grad:
            raise ArgumentError(self._sparse_refusal())

    @classmethod
    def _sparse_refusal(cls) -> str:
        return f"{cls.__name__} does not support sparse gradients"

    def _update_on_device(self, p: Tensor, grad: Any, group: dict[str, Any]) -> None:
        scope = device_scope_of((p,))  # a GPU parameter is updated on its own device
        if scope is None:
            self._update(p, grad, self.state.setdefault(p, {}), group)
        else:
            with scope:
                self._update(p, grad, self.state.setdefault(p, {}), group)
        p._vc.value += 1

    def _update(self, p: Tensor, grad: Any, state: dict[str, Any], group: dict[str, Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement _update")

    def state_dict(self) -> dict[str, Any]:
        index = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        return {
            "state": {
                index[id(p)]: {k: _saved(v) for k, v in s.items()} for p, s in self.state.items()
            },
            "param_groups": [
                {
                    **{k: v for k, v in g.items() if k != "params"},
                    "params": [index[id(p)] for p in g["params"]],
                }
                for g in self.param_groups
            ],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        params = [p for g in self.param_groups for p in g["params"]]
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
            len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)
        ):
            raise ValueError(
                "loaded state dict has a different number of parameter groups or parameters"
            )
        for g, saved in zip(self.param_groups, groups):
            g.update({k: v for k, v in saved.items() if k != "params"})
        self.state = {
            params[int(i)]: {k: _loaded(v) for k, v in s.items()}
            for i, s in state_dict["state"].items()
        }

    def __repr__(self) -> str:
        lines = [type(self).__name__ + " ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(g.items()) if k != "params"]
        return "\n".join(lines) + "\n)"


def _saved(value: Any) -> Any:
    # A sparse state (SGD's momentum buffer) is saved as a sparse tensor, as PyTorch's, so
    # gradwire.save / gradwire.load(weights_only=True) carry it.
    if is_sparse(value):
        return Tensor._wrap(value.copy())
    return value.copy() if hasattr(value, "copy") else value


def _loaded(value: Any) -> Any:
    if isinstance(value, Tensor) and is_sparse(value._data):
        return value._data.copy()
    return value
