"""The callable policy: which functions a worker runs and which globals it unpickles.

A qualified name is ``"module:qualname"``. A name is allowed when it is not denied and one of:
the trust-everything switch is on; its module is the program's own code (``__main__`` or a module
whose file is outside the standard library and site-packages); it matches an ``allow`` pattern
(``fnmatch`` on the module, or on ``module:qualname``); it is a safe builtin. The deny patterns
win over everything except ``trust_everything``. Resolution re-checks the *origin* of what it
found (``__module__`` / ``__qualname__``), so ``mymodule:os.system`` is refused like ``os:system``.
"""

from __future__ import annotations

import builtins
import fnmatch
import importlib
import importlib.util
import os
import sys
import sysconfig
import types
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..errors import PolicyError

__all__ = ["CallablePolicy", "DEFAULT_ALLOW", "DEFAULT_DENY", "SAFE_BUILTINS", "origin_of"]

#: Module patterns allowed by default besides the program's own modules.
DEFAULT_ALLOW: tuple[str, ...] = (
    "gradwire",
    "gradwire.*",
    "numpy",
    "numpy.*",
    "operator",
    "_operator",
    "math",
    "collections",
    "copyreg:_reconstructor",
    "datetime",
    "fractions",
    "decimal",
    "uuid:UUID",
    "functools:reduce",
)

#: Names refused even when their module is allowed (file and process access, code loading).
DEFAULT_DENY: tuple[str, ...] = (
    "numpy.f2py*",
    "numpy.distutils*",
    "numpy.ctypeslib*",
    "numpy.testing*",
    "numpy*:*load*",
    "numpy*:*save*",
    "numpy*:fromfile",
    "numpy*:*memmap*",
    "numpy*:DataSource*",
    "numpy*:genfromtxt",
    "numpy*:*.tofile",
    "numpy*:*.dump",
    "numpy.lib.*format*",
    "numpy.lib.*npyio*",
    "*operator:attrgetter",
    "*operator:methodcaller",
    "gradwire.server*",
    "gradwire._runtime*",
)

#: Builtins that neither evaluate code, touch files nor reach into interpreter internals.
SAFE_BUILTINS: frozenset[str] = frozenset(
    """abs all any ascii bin bool bytearray bytes callable chr complex dict divmod enumerate filter
    float format frozenset hash hex id int isinstance issubclass iter len list map max min next
    object oct ord pow print range repr reversed round set slice sorted str sum tuple zip
    NotImplemented Ellipsis""".split()
) | frozenset(
    n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)
)

_SYSTEM_DIRS = tuple(
    os.path.realpath(p)
    for key in ("stdlib", "platstdlib", "purelib", "platlib")
    if (p := sysconfig.get_paths().get(key))
) + tuple(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix))


@lru_cache(maxsize=4096)
def _is_user_module(module: str) -> bool:
    """True for ``__main__`` and modules whose source lies outside the interpreter's own trees."""
    if module in ("__main__", "__mp_main__"):
        return True
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None) if mod is not None else None
    if mod is None:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return False
        path = spec.origin if spec is not None else None
    if not path or path in ("built-in", "frozen"):
        return False
    real = os.path.realpath(path)
    return not any(real.startswith(d + os.sep) for d in _SYSTEM_DIRS)


def _module_key(module: str) -> str:
    return "__main__" if module == "__mp_main__" else module


def origin_of(obj: Any) -> tuple[str, str] | None:
    """The ``(module, qualname)`` where ``obj`` is really defined, or None if it has none."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, types.MethodType):
        obj = obj.__func__
    if isinstance(obj, types.ModuleType):
        return None
    qualname = getattr(obj, "__qualname__", None)
    module = getattr(obj, "__module__", None)
    if module is None and hasattr(obj, "__objclass__"):  # method descriptors of builtin types
        module = obj.__objclass__.__module__
    if module is None and isinstance(obj, types.BuiltinMethodType):
        self = getattr(obj, "__self__", None)
        if self is not None and not isinstance(self, types.ModuleType):
            module = type(self).__module__
    if not isinstance(qualname, str) or not isinstance(module, str):
        return None
    return module, qualname


@dataclass(frozen=True)
class CallablePolicy:
    """What a worker agrees to run and to unpickle.

    Args:
        allow: extra patterns, ``"mypkg.*"`` (modules) or ``"mypkg.ops:scale"`` (one name).
        deny: patterns refused even when otherwise allowed.
        allow_user_modules: allow the program's own modules (``__main__`` and modules outside
            the standard library and site-packages).
        trust_everything: allow any importable name. Only for closed, trusted networks.
    """

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = DEFAULT_DENY
    allow_user_modules: bool = True
    trust_everything: bool = False
    _allow_all: tuple[str, ...] = field(init=False, repr=False, default=())
    _decided: dict[tuple[str, str], bool] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    #: (module, qualname) -> (module key, first attribute name, module object, that attribute,
    #: the resolved object): a name resolved once resolves again without the walk while that
    #: attribute is unchanged.
    _resolved: dict[tuple[str, str], tuple[str, str, Any, Any, Any]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_allow_all", DEFAULT_ALLOW + tuple(self.allow))

    def allows(self, module: str, qualname: str) -> bool:
        """Return True when ``module:qualname`` may be called or unpickled (decisions cached)."""
        key = (module, qualname)
        decided = self._decided.get(key)
        if decided is None:
            decided = self._decide(module, qualname)
            if len(self._decided) < 65536:  # bounded: names come from the network
                self._decided[key] = decided
        return decided

    def _decide(self, module: str, qualname: str) -> bool:
        if self.trust_everything:
            return True
        parts = qualname.split(".")
        if any(p.startswith("__") and p.endswith("__") for p in parts) or "<" in qualname:
            return False
        full = f"{module}:{qualname}"
        if any(fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(full, p) for p in self.deny):
            return False
        if module == "builtins":
            return parts[0] in SAFE_BUILTINS
        if any(
            fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(full, p) for p in self._allow_all
        ):
            return True
        return self.allow_user_modules and _is_user_module(module)

    def check(self, module: str, qualname: str, worker: str = "", what: str = "function") -> None:
        """Raise PolicyError unless ``module:qualname`` is allowed.

        Raises:
            PolicyError: naming the refused name, the worker and how to allow it.
        """
        if not self.allows(module, qualname):
            where = f" on worker {worker!r}" if worker else ""
            raise PolicyError(
                f"{what} {module}:{qualname} is refused by the callable policy{where}; allow it "
                "with rpc_backend_options callable_allow=('pattern',) if it is safe to run"
            )

    def resolve(self, module: str, qualname: str, worker: str = "", what: str = "function") -> Any:
        """Import ``module`` and walk ``qualname`` after checking both the name and its origin.

        Raises:
            PolicyError: the name or what it resolves to is not allowed.
            SerializationError: the name does not resolve on this worker.
        """
        key = (module, qualname)
        hit = self._resolved.get(key)
        if hit is not None:  # still the same module and the same top-level object
            mod_key, first, mod, root, known = hit
            if sys.modules.get(mod_key) is mod and getattr(mod, first, None) is root:
                return known
        from ..errors import SerializationError

        self.check(module, qualname, worker, what)
        try:
            if module in ("__main__", "__mp_main__"):
                obj: Any = sys.modules.get("__main__") or importlib.import_module(module)
            else:
                obj = sys.modules.get(module) or importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            where = f" on worker {worker!r}" if worker else ""
            raise SerializationError(
                f"{what} {module}:{qualname} does not resolve{where}: {exc}"
            ) from exc
        origin = origin_of(obj) if not self.trust_everything else (module, qualname)
        if origin is None:
            if isinstance(obj, types.ModuleType):
                self.check(module, qualname + ".<module>", worker, what)
            origin = origin_of(type(obj)) or (module, qualname)
        if origin != (module, qualname):
            self.check(*origin, worker=worker, what=what)
        mod_key, first = _module_key(module), qualname.partition(".")[0]
        mod = sys.modules.get(mod_key)
        if mod is not None and len(self._resolved) < 4096:  # bounded: names come from the network
            self._resolved[key] = (mod_key, first, mod, getattr(mod, first, None), obj)
        return obj
