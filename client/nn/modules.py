"""``Module`` and the standard layers: Linear, ReLU, Sigmoid, Tanh, Identity, Sequential, losses."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Iterator

from .._creation import empty
from .._tensor import Tensor
from ..autograd.grad_mode import no_grad
from . import functional as F
from . import init
from .parameter import Parameter

__all__ = [
    "Module",
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
    """Base class of layers and models: holds parameters and submodules as attributes.

    Example:
        >>> class Net(gradwire.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc = gradwire.nn.Linear(4, 2)
        ...     def forward(self, x):
        ...         return self.fc(x)
    """

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                "cannot assign before Module.__init__() call: call super().__init__() first"
            )
        params, modules = self.__dict__["_parameters"], self.__dict__["_modules"]
        params.pop(name, None)
        modules.pop(name, None)
        if isinstance(value, Parameter):
            params[name] = value
        elif isinstance(value, Module):
            modules[name] = value
        else:
            object.__setattr__(self, name, value)
            return
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if "_parameters" in d and name in d["_parameters"]:
            return d["_parameters"][name]
        if "_modules" in d and name in d["_modules"]:
            return d["_modules"][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        if name in self._parameters:
            del self._parameters[name]
        elif name in self._modules:
            del self._modules[name]
        else:
            object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        if param is None:
            self._parameters.pop(name, None)
            object.__setattr__(self, name, None)
        else:
            setattr(self, name, param)

    def add_module(self, name: str, module: Module) -> None:
        setattr(self, name, module)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f'Module [{type(self).__name__}] is missing the required "forward" function'
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # -- traversal --------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield from self._modules.items()

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_parameters(
        self, prefix: str = "", recurse: bool = True
    ) -> Iterator[tuple[str, Parameter]]:
        seen: set[int] = set()
        mods = self.named_modules(prefix) if recurse else iter([(prefix, self)])
        for mp, m in mods:
            for name, p in m._parameters.items():
                if id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{mp}.{name}" if mp else name), p

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> OrderedDict[str, Tensor]:
        """Parameter name -> detached tensor (sharing storage)."""
        return OrderedDict((n, p.detach()) for n, p in self.named_parameters())

    def load_state_dict(
        self, state_dict: dict[str, Tensor], strict: bool = True
    ) -> tuple[list[str], list[str]]:
        """Copy values into the parameters of the same names.

        Returns:
            (missing_keys, unexpected_keys) when ``strict`` is False.

        Raises:
            RuntimeError: on missing or unexpected keys (strict) or shape mismatches.
        """
        own = dict(self.named_parameters())
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
                    if tuple(v.shape) != p.shape:
                        raise RuntimeError(
                            f"size mismatch for {k}: copying a param with shape {tuple(v.shape)}, the shape in current model is {p.shape}"
                        )
                    p.copy_(v if isinstance(v, Tensor) else Tensor(v))
        return missing, unexpected

    def train(self, mode: bool = True) -> Module:
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

    def to(self, *args: Any, **kwargs: Any) -> Module:
        """Move/cast parameters in place (keeps the same Parameter objects)."""
        with no_grad():
            for m in self.modules():
                for p in list(m._parameters.values()):
                    moved = p.to(*args, **kwargs)
                    if moved is not p:
                        p._data = moved._data
        return self

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({n}): " + repr(m).replace("\n", "\n  ") for n, m in self._modules.items()]
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
    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)


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


class CrossEntropyLoss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(input, target, self.reduction)
