"""``Module`` and the standard layers: Linear, ReLU, Sigmoid, Tanh, Identity, Sequential, losses."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Callable, Iterator, Mapping

from .._creation import empty
from .._dtypes import float16, float32, float64
from .._tensor import Tensor
from ..autograd.grad_mode import no_grad
from . import functional as F
from . import init
from ._module_helpers import RemovableHandle, _add_hook, _IncompatibleKeys, _to_args
from .parameter import Parameter

__all__ = [
    "Module",
    "RemovableHandle",
    "Linear",
    "ReLU",
    "Sigmoid",
    "Tanh",
    "Identity",
    "Sequential",
    "MSELoss",
    "CrossEntropyLoss",
]


class Module:
    """Base class of layers and models: holds parameters, buffers and submodules as attributes.

    Example:
        >>> class Net(gradwire.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc = gradwire.nn.Linear(4, 2)
        ...     def forward(self, x):
        ...         return self.fc(x)
    """

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers_set", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                "cannot assign before Module.__init__() call: call super().__init__() first"
            )
        params, modules = self.__dict__["_parameters"], self.__dict__["_modules"]
        buffers = self.__dict__["_buffers"]
        if isinstance(value, Parameter):
            modules.pop(name, None)
            buffers.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            params.pop(name, None)
            buffers.pop(name, None)
            modules[name] = value
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                    "(gradwire.Tensor or None expected)"
                )
            buffers[name] = value
            return
        else:
            params.pop(name, None)
            modules.pop(name, None)
            object.__setattr__(self, name, value)
            return
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        if name in self._parameters:
            del self._parameters[name]
        elif name in self._buffers:
            del self._buffers[name]
            self._non_persistent_buffers_set.discard(name)
        elif name in self._modules:
            del self._modules[name]
        else:
            object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Add a parameter (or None, an optional parameter left out) under ``name``."""
        if param is None:
            self._parameters.pop(name, None)
            object.__setattr__(self, name, None)
        else:
            setattr(self, name, param)

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add a buffer: state that is not a parameter (e.g. BatchNorm's running_mean).

        Buffers move with ``to()``; persistent ones are part of ``state_dict``.

        Args:
            name: attribute name of the buffer.
            tensor: the buffer, or None (registered but left out of state_dict).
            persistent: whether ``state_dict`` includes it.

        Raises:
            KeyError: if ``name`` is empty, has a dot, or is already another attribute.
            TypeError: if ``tensor`` is neither a Tensor nor None.

        Example:
            >>> self.register_buffer("running_mean", gradwire.zeros(4))
        """
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f'buffer name must be a non-empty string without ".", got {name!r}')
        if name not in self._buffers and (
            name in self.__dict__ or name in self._parameters or name in self._modules
        ):
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                "(gradwire Tensor or None required)"
            )
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        """Register ``module`` as a child under ``name``."""
        if module is None:
            self._modules[name] = None
            return
        if not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        setattr(self, name, module)

    register_module = add_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f'Module [{type(self).__name__}] is missing the required "forward" function'
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not (self._forward_pre_hooks or self._forward_hooks):
            return self.forward(*args, **kwargs)
        for hook, with_kwargs in list(self._forward_pre_hooks.values()):
            if with_kwargs:
                res = hook(self, args, kwargs)
                if res is not None:
                    if not (isinstance(res, tuple) and len(res) == 2):
                        raise RuntimeError(
                            "forward pre-hook must return None or a tuple of (new_args, new_kwargs), "
                            f"but got {res}."
                        )
                    args, kwargs = res
            else:
                res = hook(self, args)
                if res is not None:
                    args = res if isinstance(res, tuple) else (res,)
        out = self.forward(*args, **kwargs)
        for hook, with_kwargs in list(self._forward_hooks.values()):
            res = hook(self, args, kwargs, out) if with_kwargs else hook(self, args, out)
            if res is not None:
                out = res
        return out

    def register_forward_pre_hook(
        self, hook: Callable[..., Any], *, prepend: bool = False, with_kwargs: bool = False
    ) -> RemovableHandle:
        """Call ``hook(module, args)`` before each forward; a non-None result replaces args.

        With ``with_kwargs=True`` the hook is ``hook(module, args, kwargs)`` and may return
        ``(args, kwargs)``.

        Returns:
            A handle whose ``remove()`` unregisters the hook.

        Example:
            >>> h = model.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
            >>> h.remove()
        """
        return _add_hook(self._forward_pre_hooks, (hook, with_kwargs), prepend)

    def register_forward_hook(
        self,
        hook: Callable[..., Any],
        *,
        prepend: bool = False,
        with_kwargs: bool = False,
        always_call: bool = False,
    ) -> RemovableHandle:
        """Call ``hook(module, args, output)`` after each forward; a non-None result replaces it.

        With ``with_kwargs=True`` the hook is ``hook(module, args, kwargs, output)``.

        Returns:
            A handle whose ``remove()`` unregisters the hook.

        Example:
            >>> h = model.register_forward_hook(lambda m, args, out: out.relu())
        """
        return _add_hook(self._forward_hooks, (hook, with_kwargs), prepend)

    # -- traversal --------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, m in self.named_children():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def _named_members(
        self, table: str, prefix: str, recurse: bool, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Any]]:
        seen: set[int] = set()
        mods = self.named_modules(prefix) if recurse else iter([(prefix, self)])
        for mp, m in mods:
            for name, t in getattr(m, table).items():
                if t is None or (remove_duplicate and id(t) in seen):
                    continue
                seen.add(id(t))
                yield (f"{mp}.{name}" if mp else name), t

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Parameter]]:
        yield from self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Tensor]]:
        """(name, buffer) pairs, e.g. ``("bn.running_mean", tensor)``."""
        yield from self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        """The buffers of this module (and its submodules when ``recurse``)."""
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """Call ``fn`` on every submodule (children first) and on ``self``; returns ``self``.

        Example:
            >>> model.apply(lambda m: isinstance(m, nn.Linear) and nn.init.zeros_(m.bias))
        """
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # -- state ------------------------------------------------------------------------------
    def _state_items(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        for name, p in self._parameters.items():
            if p is not None:
                yield prefix + name, p
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                yield prefix + name, b
        for name, m in self.named_children():
            yield from m._state_items(f"{prefix}{name}.")

    def state_dict(
        self, *, destination: Any = None, prefix: str = "", keep_vars: bool = False
    ) -> OrderedDict[str, Tensor]:
        """Parameter and persistent buffer names -> tensors (detached, sharing storage)."""
        out: OrderedDict[str, Tensor] = OrderedDict() if destination is None else destination
        for name, t in self._state_items(prefix):
            out[name] = t if keep_vars else t.detach()
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
        """Copy values into the parameters and persistent buffers of the same names.

        Returns:
            ``(missing_keys, unexpected_keys)`` as a named tuple.

        Raises:
            RuntimeError: on missing or unexpected keys (strict) or shape mismatches.
        """
        own = dict(self._state_items())
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise RuntimeError(
                f"Error(s) in loading state_dict for {type(self).__name__}: missing keys {missing}, unexpected keys {unexpected}"
            )
        with no_grad():
            for k, p in own.items():
                if k in state_dict:
                    v = state_dict[k]
                    v = v if isinstance(v, Tensor) else Tensor(v)
                    if tuple(v.shape) != p.shape:
                        raise RuntimeError(
                            f"size mismatch for {k}: copying a param with shape {tuple(v.shape)}, the shape in current model is {p.shape}"
                        )
                    p.copy_(v)
        return _IncompatibleKeys(missing, unexpected)

    def train(self, mode: bool = True) -> Module:
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def _apply_to_tensors(self, fn: Callable[[Tensor], Tensor]) -> Module:
        """Move every parameter (keeping the Parameter object) and buffer through ``fn``."""
        with no_grad():
            for m in self.modules():
                for p in m._parameters.values():
                    if p is None:
                        continue
                    moved = fn(p)
                    if moved is not p:
                        p._data = moved._data
                    if p.grad is not None:
                        g = fn(p.grad)
                        if g is not p.grad:
                            p.grad = g
                for name, b in list(m._buffers.items()):
                    if b is not None:
                        m._buffers[name] = fn(b)
        return self

    def to(self, *args: Any, **kwargs: Any) -> Module:
        """Move parameters and buffers to a device and/or cast floating ones to a dtype.

        In place: the same Parameter objects stay registered.

        Raises:
            TypeError: for a non-floating dtype or an unknown argument.

        Example:
            >>> model.to("cpu", gradwire.float64)
        """
        dev, dt = _to_args(args, dict(kwargs))

        def move(t: Tensor) -> Tensor:
            floating = t.is_floating_point() or t.is_complex()
            return t.to(device=dev, dtype=dt if floating else None)

        return self._apply_to_tensors(move)

    def cuda(self, device: int | str | None = None) -> Module:
        """Move parameters and buffers to a CUDA device (clear error when none is available)."""
        if isinstance(device, int):
            device = f"cuda:{device}"
        return self.to(device or "cuda:0")

    def cpu(self) -> Module:
        """Move parameters and buffers to the CPU."""
        return self.to("cpu")

    def float(self) -> Module:
        """Cast floating parameters and buffers to float32."""
        return self.to(float32)

    def double(self) -> Module:
        """Cast floating parameters and buffers to float64."""
        return self.to(float64)

    def half(self) -> Module:
        """Cast floating parameters and buffers to float16."""
        return self.to(float16)

    def share_memory(self) -> Module:
        """Move parameters, their gradients and buffers into shared memory, in place.

        Processes that receive the module through ``gradwire.multiprocessing`` then update the
        same tensors (Hogwild training).

        Example:
            >>> model.share_memory()
            >>> gradwire.multiprocessing.Process(target=train, args=(model,)).start()
        """
        for t in [*self.parameters(), *self.buffers()]:
            t.share_memory_()
            if t.grad is not None:
                t.grad.share_memory_()
        return self

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({n}): " + repr(m).replace("\n", "\n  ") for n, m in self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"


class Linear(Module):
    """y = x @ W^T + b, with PyTorch's default initialization."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        dtype: Any = None,
        device: Any = None,
    ) -> None:
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(
                f"Linear needs positive sizes, got in_features={in_features}, out_features={out_features}"
            )
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(empty(out_features, in_features, dtype=dtype, device=device))
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if bias:
            self.bias = Parameter(empty(out_features, dtype=dtype, device=device))
            bound = 1 / math.sqrt(in_features)
            init.uniform_(self.bias, -bound, bound)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1:] != (self.in_features,):
            raise RuntimeError(
                f"Linear expects inputs whose last dimension is {self.in_features}, got shape {x.shape}"
            )
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class ReLU(Module):
    """max(x, 0) elementwise; ``inplace=True`` overwrites the input."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.sigmoid(x)


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.tanh(x)


class Identity(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x


class Sequential(Module):
    """Modules applied in order."""

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(
                    f"Sequential expects Modules, got {type(m).__name__} at position {i}"
                )
            self.add_module(str(i), m)

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


class MSELoss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(input, target, self.reduction)


class L1Loss(Module):
    """Mean absolute error between input and target (``reduction``: 'mean', 'sum' or 'none')."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.l1_loss(input, target, self.reduction)


class CrossEntropyLoss(Module):
    """Softmax cross entropy of logits against class indices (or class probabilities).

    Args:
        weight: optional (C,) class weights (kept as a buffer).
        ignore_index: a target value that contributes neither loss nor weight.
        reduction: 'mean' (weighted mean), 'sum' or 'none'.
        label_smoothing: in [0, 1]: mixes the targets with the uniform distribution.

    Example:
        >>> loss = gradwire.nn.CrossEntropyLoss(label_smoothing=0.1)(logits, target)
    """

    def __init__(
        self,
        weight: Tensor | None = None,
        size_average: Any = None,
        ignore_index: int = -100,
        reduce: Any = None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        from ._losses import _reduction

        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = _reduction(size_average, reduce, reduction)
        self.label_smoothing = label_smoothing

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(
            input,
            target,
            self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )
