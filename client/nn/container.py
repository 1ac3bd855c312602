"""Containers that register their modules: ``ModuleList`` and ``ModuleDict``."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Iterator, Mapping

from .modules import Module

__all__ = ["ModuleList", "ModuleDict"]


def _check(m: Any, where: str) -> Module:
    if not isinstance(m, Module):
        raise TypeError(f"{where} expects Modules, got {type(m).__name__}")
    return m


class ModuleList(Module):
    """A list of modules, registered so that ``parameters()`` and ``state_dict()`` see them.

    Example:
        >>> layers = gradwire.nn.ModuleList([gradwire.nn.Linear(4, 4) for _ in range(3)])
        >>> layers.append(gradwire.nn.ReLU())
    """

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _index(self, idx: int) -> int:
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"index {idx} is out of range")
        return idx % n

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            return type(self)(list(self._modules.values())[idx])
        return self._modules[str(self._index(idx))]

    def __setitem__(self, idx: int, module: Module) -> None:
        self.add_module(str(self._index(idx)), _check(module, "ModuleList"))

    def __delitem__(self, idx: int | slice) -> None:
        kept = list(self._modules.values())
        del kept[idx]
        self._modules.clear()
        for i, m in enumerate(kept):
            self.add_module(str(i), m)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        return ModuleList([*self, *other])

    def append(self, module: Module) -> ModuleList:
        """Add ``module`` at the end; returns self."""
        self.add_module(str(len(self)), _check(module, "ModuleList.append"))
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        """Append each of ``modules``; returns self.

        Raises:
            TypeError: if ``modules`` is not iterable or holds a non-Module.
        """
        if isinstance(modules, Module) and not isinstance(modules, (ModuleList, ModuleDict)):
            raise TypeError("ModuleList.extend should be called with an iterable, got a Module")
        for m in list(modules):
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> None:
        """Insert ``module`` before position ``index`` (negative counts from the end)."""
        items = list(self._modules.values())
        items.insert(index, _check(module, "ModuleList.insert"))
        self._modules.clear()
        for i, m in enumerate(items):
            self.add_module(str(i), m)

    def pop(self, index: int = -1) -> Module:
        """Remove and return the module at ``index``."""
        m = self[index]
        del self[index]
        return m

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "ModuleList has no forward(): iterate over it and call its modules"
        )


class ModuleDict(Module):
    """An ordered dict of modules, registered so that ``parameters()`` sees them.

    Example:
        >>> heads = gradwire.nn.ModuleDict({"policy": nn.Linear(8, 2), "value": nn.Linear(8, 1)})
        >>> heads["value"](x)
    """

    def __init__(self, modules: Mapping[str, Module] | Iterable[Any] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        if not isinstance(key, str):
            raise TypeError(f"ModuleDict keys must be strings, got {type(key).__name__}")
        self.add_module(key, _check(module, "ModuleDict"))

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: object) -> bool:
        return key in self._modules

    def clear(self) -> None:
        """Remove every module."""
        self._modules.clear()

    def pop(self, key: str) -> Module:
        """Remove and return the module under ``key``."""
        m = self[key]
        del self[key]
        return m

    def keys(self) -> Any:
        return self._modules.keys()

    def items(self) -> Any:
        return self._modules.items()

    def values(self) -> Any:
        return self._modules.values()

    def update(self, modules: Mapping[str, Module] | Iterable[Any]) -> None:
        """Add modules from a mapping or from (key, module) pairs.

        Raises:
            TypeError: for an element that is not a (key, module) pair, or a non-Module.
        """
        pairs = (
            modules.items() if isinstance(modules, (Mapping, OrderedDict, ModuleDict)) else modules
        )
        for j, pair in enumerate(pairs):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(
                    f"ModuleDict update sequence element #{j} should be a (key, module) pair"
                )
            self[pair[0]] = pair[1]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("ModuleDict has no forward(): call its modules by key")
