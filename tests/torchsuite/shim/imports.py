"""How the rewritten import lines of PyTorch's RPC tests bind their names.

``import torch.distributed.rpc as rpc`` becomes ``rpc = _ts.module("torch.distributed.rpc")``
and ``from torch.futures import Future`` becomes ``Future, = _ts.names("torch.futures",
"Future")``. Under ``IMPL == "torch"`` these are plain imports, except that
``torch.testing._internal.*`` resolves to this shim. Under ``"gradwire"``, ``torch.X`` resolves
to ``gradwire.X``; a module or name that gradwire does not have binds a :class:`Missing`
placeholder, which raises :class:`MissingInGradwire` when a test uses it, so the test fails
and says what is missing (the module still imports, and the other tests run).

Only names of areas the not-applicable list covers get a stand-in: ``torch.jit`` (TorchScript;
``@torch.jit.script`` runs at import, so it returns a function that raises
:class:`NotApplicable`) and ``torch._C.Future`` (the C++ class behind ``torch.futures.Future``,
which is gradwire's ``Future`` itself).
"""

from __future__ import annotations

import importlib
import types
from typing import Any

from . import IMPL

__all__ = ["module", "names", "Missing", "MissingInGradwire", "NotApplicable", "SHIM_PREFIX"]

#: Modules of torch.testing._internal that this shim provides.
SHIM_PREFIX = "torch.testing._internal"


class MissingInGradwire(AttributeError):
    """A test used a torch name that gradwire does not provide."""


class NotApplicable(RuntimeError):
    """A test reached a feature listed in not_applicable.toml (TorchScript, profiler, ...)."""


class Missing:
    """Placeholder bound to a torch name that gradwire lacks; any use raises."""

    def __init__(self, qualname: str) -> None:
        object.__setattr__(self, "_qualname", qualname)

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise MissingInGradwire(f"gradwire has no equivalent of {self._qualname}")

    __call__ = _fail
    __getattr__ = _fail
    __iter__ = _fail
    __enter__ = _fail
    __getitem__ = _fail

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[Any, ...]:
        self._fail()
        return ()

    def __repr__(self) -> str:
        return f"<missing in gradwire: {self._qualname}>"


def _shim_module(dotted: str) -> types.ModuleType:
    rest = dotted[len(SHIM_PREFIX) :].lstrip(".")
    leaf = rest.rsplit(".", 1)[-1] if rest else ""
    return importlib.import_module(f"torchsuite.shim.{leaf}" if leaf else "torchsuite.shim")


def _jit_script(fn: Any = None, *args: Any, **kwargs: Any) -> Any:
    def not_applicable(*a: Any, **k: Any) -> Any:
        raise NotApplicable(f"TorchScript: {getattr(fn, '__name__', fn)} was @torch.jit.script")

    return not_applicable


class _ScriptFunction:
    """Nothing is a TorchScript function under gradwire (isinstance checks are False)."""


def _gradwire_jit() -> types.ModuleType:
    jit = types.ModuleType("torch.jit (not applicable under gradwire)")
    jit.script = _jit_script  # type: ignore[attr-defined]
    jit.ScriptFunction = _ScriptFunction  # type: ignore[attr-defined]
    jit.ScriptModule = _ScriptFunction  # type: ignore[attr-defined]
    jit._builtins = Missing("torch.jit._builtins")  # type: ignore[attr-defined]
    return jit


class _GradwireAsTorch(types.ModuleType):
    """``torch`` for a rewritten test under gradwire: ``torch.X`` is ``gradwire.X``."""

    def __init__(self) -> None:
        super().__init__("torch")
        import gradwire
        from gradwire import futures

        self._gradwire = gradwire
        self.jit = _gradwire_jit()
        # torch._C.Future is the class torch.futures.Future derives from.
        self._C = types.SimpleNamespace(Future=futures.Future)
        testing = types.ModuleType("torch.testing")
        testing._internal = _shim_module(SHIM_PREFIX)  # type: ignore[attr-defined]
        self.testing = testing

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._gradwire, name)
        except AttributeError:
            pass
        try:
            return importlib.import_module(f"gradwire.{name}")
        except ImportError:
            raise MissingInGradwire(f"gradwire has no equivalent of torch.{name}") from None


_TORCH: _GradwireAsTorch | None = None


def _gradwire_module(dotted: str) -> Any:
    global _TORCH
    if dotted == "torch":
        if _TORCH is None:
            _TORCH = _GradwireAsTorch()
        return _TORCH
    if dotted == "torch.distributed":
        from . import c10d

        return c10d.gradwire_distributed()
    target = "gradwire" + dotted[len("torch") :]
    try:
        return importlib.import_module(target)
    except ImportError:
        return Missing(dotted)


def module(dotted: str) -> Any:
    """The module a rewritten ``import <dotted>`` binds (see the module docstring)."""
    if dotted == SHIM_PREFIX or dotted.startswith(SHIM_PREFIX + "."):
        return _shim_module(dotted)
    if IMPL == "torch":
        return importlib.import_module(dotted)
    return _gradwire_module(dotted)


def root(dotted: str) -> Any:
    """What a rewritten ``import a.b.c`` (no ``as``) binds to ``a``: ``torch`` itself."""
    module(dotted)
    return module(dotted.split(".", 1)[0]) if IMPL != "torch" else importlib.import_module("torch")


def names(dotted: str, *attrs: str) -> tuple[Any, ...]:
    """The values a rewritten ``from <dotted> import attrs...`` binds, in order."""
    mod = module(dotted)
    out = []
    for attr in attrs:
        if isinstance(mod, Missing):
            out.append(Missing(f"{dotted}.{attr}"))
            continue
        try:
            out.append(getattr(mod, attr))
        except AttributeError:
            try:
                out.append(importlib.import_module(f"{mod.__name__}.{attr}"))
            except (ImportError, AttributeError):
                if IMPL == "torch":
                    raise
                out.append(Missing(f"{dotted}.{attr}"))
    return tuple(out)
