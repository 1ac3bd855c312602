"""The callable policy: which functions a worker runs and which globals it unpickles.

A qualified name is ``"module:qualname"``. The policy decides on what a name *resolves to*,
never on the name alone, and gives a :class:`Verdict`:

- TRUSTED: ``trust_everything`` is on (closed, trusted networks only).
- USER: the program's own code (``__main__`` or a module whose file is outside the standard
  library and site-packages, never gradwire itself) or a user ``allow`` pattern (``fnmatch`` on
  the module, or on ``module:qualname``). Runs as it is.
- DEFAULT: named in the reviewed lists of ``policy_lists`` (NumPy's array functions, gradwire's
  public compute API, safe builtins and their members). Runs under the guard (``guard.py``),
  which refuses files, processes and sockets.
- ENTRY: one of gradwire's own dispatchers (``policy_lists.ENTRY_POINTS``), which resolves what
  it runs through the policy itself.
- REFUSED: everything else, anything matching a ``deny`` pattern (they win over everything but
  ``trust_everything``), dunder names, and private names (``_x``) outside the program's own code
  unless a list names them.

Resolution checks the name, imports and walks it, then checks the object found: a listed
default must be *the very object* the lists name (by identity), anything else is judged by its
origin (``__module__`` / ``__qualname__``), so ``mymodule:os.system`` is refused like
``os:system``. Methods reached through an RRef proxy are judged the same way
(:meth:`CallablePolicy.resolve_member`).
"""

from __future__ import annotations

import builtins
import enum
import fnmatch
import importlib
import importlib.util
import inspect
import os
import sys
import sysconfig
import threading
import types
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..errors import PolicyError
from . import policy_lists
from .guard import Guarded

__all__ = [
    "CallablePolicy",
    "Verdict",
    "DEFAULT_DENY",
    "SAFE_BUILTINS",
    "origin_of",
    "verified_origin",
    "ROUTINE_TYPES",
    "default_objects",
    "unreviewed_numpy",
]

#: Names refused even when a user ``allow`` pattern opens their module (file and process
#: access, code loading, raw memory); the reviewed lists never allow them in the first place.
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
    "numpy*:as_strided",
    "numpy.lib.*format*",
    "numpy.lib.*npyio*",
    "*operator:attrgetter",
    "*operator:methodcaller",
)

SAFE_BUILTINS = policy_lists.SAFE_BUILTINS


class Verdict(enum.IntEnum):
    """What the policy says of one callable or global."""

    REFUSED = 0  # never run or unpickled
    DEFAULT = 1  # allowed by the reviewed lists: runs under the guard
    ENTRY = 2  # a gradwire dispatcher that resolves what it runs itself: runs unguarded
    USER = 3  # the program's own code, or a user allow pattern: runs unguarded
    TRUSTED = 4  # trust_everything: anything importable


def _builtin_member_allowed(qualname: str) -> bool:
    """``len``, ``KeyError``, ``list.append``: a safe builtin or a public member of one."""
    if qualname in policy_lists.REFUSED_BUILTIN_MEMBERS:
        return False
    parts = qualname.split(".")
    head = parts[0]
    value = getattr(builtins, head, None)
    if head not in SAFE_BUILTINS and not (
        isinstance(value, type) and issubclass(value, BaseException)
    ):
        return False
    return len(parts) == 1 or (len(parts) == 2 and not parts[1].startswith("_"))


def _unwrap(obj: Any) -> Any:
    """The function behind a bound, static or class method (what the lists name)."""
    if isinstance(obj, (staticmethod, classmethod)):
        return obj.__func__
    if isinstance(obj, types.MethodType):
        return obj.__func__
    return obj


def unreviewed_numpy(version: str | None = None) -> str:
    """What to tell the user when the NumPy installed here (or ``version``) is of a series the
    reviewed lists were not reviewed against; ``""`` when it is reviewed."""
    if version is None:
        import numpy

        version = numpy.__version__
    series = policy_lists.numpy_series(version)
    if series in policy_lists.REVIEWED_NUMPY:
        return ""
    reviewed = ", ".join(policy_lists.REVIEWED_NUMPY)
    return (
        f"NumPy {version} is installed, but the callable policy's lists were reviewed only "
        f"against NumPy {reviewed}: a NumPy callable this series added is refused to peers, "
        "and no name was checked for a change of meaning. Install a reviewed series "
        f"(pip install 'numpy>={policy_lists.REVIEWED_NUMPY[0]},"
        f"<{_next_series(policy_lists.REVIEWED_NUMPY[-1])}') or a gradwire release reviewed "
        f"against NumPy {series}."
    )


def _next_series(series: str) -> str:
    major, minor = series.split(".")
    return f"{major}.{int(minor) + 1}"


_default_lock = threading.Lock()
_default: tuple[dict[int, tuple[Any, Verdict]], frozenset[tuple[str, str]]] | None = None


def _walk(module: str, qualname: str) -> Any:
    obj: Any = sys.modules.get(module) or importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def default_objects() -> tuple[dict[int, tuple[Any, Verdict]], frozenset[tuple[str, str]]]:
    """The objects the reviewed lists allow (``id -> (object, verdict)``, the object kept alive
    so its id stays its own) and every name they are known by (the listed name and the
    object's origin). Built once per process; names that do not exist in the installed NumPy
    are skipped."""
    global _default
    if _default is not None:
        return _default
    with _default_lock:
        if _default is not None:
            return _default
        objects: dict[int, tuple[Any, Verdict]] = {}
        names: set[tuple[str, str]] = set()
        for verdict, listed in (
            (Verdict.DEFAULT, policy_lists.ALLOWED),
            (Verdict.ENTRY, policy_lists.ENTRY_POINTS),
        ):
            for full in listed:
                module, _, qualname = full.partition(":")
                try:
                    obj = _unwrap(_walk(module, qualname))
                except (ImportError, AttributeError):
                    continue
                objects[id(obj)] = (obj, verdict)
                names.add((module, qualname))
                origin = verified_origin(obj)
                if origin is not None:
                    names.add(origin)
        _default = (objects, frozenset(names))
    return _default


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


def verified_origin(obj: Any) -> tuple[str, str] | None:
    """:func:`origin_of`, only when walking that name from ``sys.modules`` finds ``obj`` itself.

    What an object says of itself (``__module__``, ``__qualname__``) is writable data; the
    policy decides nothing on it. A class renamed to ``__main__:Mine`` does not walk back to
    itself there, so it has no origin (and is refused) instead of passing for the program's own.
    """
    origin = origin_of(obj)
    if origin is None or "<" in origin[1]:
        return None
    found: Any = sys.modules.get(_module_key(origin[0]))
    if found is None:
        return None
    try:
        for part in origin[1].split("."):
            found = inspect.getattr_static(found, part)
    except AttributeError:
        return None
    return origin if _unwrap(found) is _unwrap(obj) else None


def _is_gradwire(module: str) -> bool:
    return module == "gradwire" or module.startswith("gradwire.")


def _has_private(parts: list[str]) -> bool:
    return any(p.startswith("_") for p in parts)


def _is_dunder(part: str) -> bool:
    return part.startswith("__") and part.endswith("__")


@dataclass(frozen=True)
class CallablePolicy:
    """What a worker agrees to run and to unpickle.

    Args:
        allow: extra patterns, ``"mypkg.*"`` (modules) or ``"mypkg.ops:scale"`` (one name).
        deny: patterns refused even when otherwise allowed.
        allow_user_modules: allow the program's own modules (``__main__`` and modules outside
            the standard library and site-packages).
        trust_everything: allow any importable name, unguarded. Only for closed, trusted
            networks.
        guard: run default-allowed callables (and unpickle payloads) under the guard that
            refuses files, processes and sockets (``guard.py``).
    """

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = DEFAULT_DENY
    allow_user_modules: bool = True
    trust_everything: bool = False
    guard: bool = True
    _decided: dict[tuple[str, str], Verdict] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    #: (module, qualname) -> (module key, first attribute name, module object, that attribute,
    #: the resolved object, its verdict): a name resolved once resolves again without the walk
    #: while that attribute is unchanged.
    _resolved: dict[tuple[str, str], tuple[str, str, Any, Any, Any, Verdict]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    _guarded: dict[tuple[str, str], Guarded] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    @property
    def guarded(self) -> bool:
        """True when default-allowed callables and unpickling run under the guard."""
        return self.guard and not self.trust_everything

    # -- names ---------------------------------------------------------------------------

    def allows(self, module: str, qualname: str) -> bool:
        """Return True when the name ``module:qualname`` may be called or unpickled (its
        resolved object is checked again by :meth:`resolve`)."""
        return self.name_verdict(module, qualname) is not Verdict.REFUSED

    def name_verdict(self, module: str, qualname: str) -> Verdict:
        """The verdict on a name before it is resolved (decisions cached)."""
        key = (module, qualname)
        decided = self._decided.get(key)
        if decided is None:
            decided = self._decide(module, qualname)
            if len(self._decided) < 65536:  # bounded: names come from the network
                self._decided[key] = decided
        return decided

    def _user_allowed(self, module: str, full: str) -> bool:
        return any(
            fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(full, p) for p in self.allow
        )

    def _decide(self, module: str, qualname: str) -> Verdict:
        if self.trust_everything:
            return Verdict.TRUSTED
        full = f"{module}:{qualname}"
        if any(fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(full, p) for p in self.deny):
            return Verdict.REFUSED
        if full in policy_lists.ENTRY_POINTS:
            return Verdict.ENTRY
        parts = qualname.split(".")
        dunder = any(_is_dunder(p) for p in parts) or "<" in qualname
        if not dunder and self._user_allowed(module, full):
            return Verdict.USER  # the user's own choice: unguarded, even for a listed name
        if (module, qualname) in default_objects()[1]:
            return Verdict.DEFAULT
        if dunder:
            return Verdict.REFUSED
        if module == "builtins":
            return Verdict.DEFAULT if _builtin_member_allowed(qualname) else Verdict.REFUSED
        if (
            self.allow_user_modules
            and not _is_gradwire(module)
            and _is_user_module(_module_key(module))
        ):
            return Verdict.USER
        return Verdict.REFUSED

    def check(self, module: str, qualname: str, worker: str = "", what: str = "function") -> None:
        """Raise PolicyError unless the name ``module:qualname`` is allowed.

        Raises:
            PolicyError: naming the refused name, the worker and how to allow it.
        """
        if self.name_verdict(module, qualname) is Verdict.REFUSED:
            raise self.refusal(f"{what} {module}:{qualname}", worker)

    @staticmethod
    def refusal(subject: str, worker: str, detail: str = "") -> PolicyError:
        """The PolicyError for a refused ``subject`` on ``worker`` (``detail``: why)."""
        where = f" on worker {worker!r}" if worker else ""
        why = f" ({detail})" if detail else ""
        return PolicyError(
            f"{subject} is refused by the callable policy{where}{why}; allow it with "
            "rpc_backend_options callable_allow=('pattern',) if it is safe to run "
            "(docs/security.md)"
        )

    # -- objects -------------------------------------------------------------------------

    def verdict_of(self, obj: Any) -> Verdict:
        """The verdict on an object about to be called or rebuilt (judged by identity for the
        reviewed lists, by origin for everything else)."""
        if self.trust_everything:
            return Verdict.TRUSTED
        key = _unwrap(obj)
        if isinstance(key, types.BuiltinMethodType):
            owner = getattr(key, "__self__", None)
            if owner is not None and not isinstance(owner, (types.ModuleType, type)):
                key = getattr(type(owner), key.__name__, key)  # a bound builtin method
        listed = self._listed(key)
        if listed is not None:
            return listed
        if isinstance(key, types.ModuleType):
            return Verdict.REFUSED
        if origin_of(key) is not None:  # code: judged by the name it is found under
            origin = verified_origin(key)
            if origin is None:
                return Verdict.REFUSED  # it claims a name that does not lead back to it
        else:  # an instance: calling it runs its type's __call__
            if callable(key) and not isinstance(key, type):
                call = _find_member(type(key), "__call__")
                if call is None:
                    return Verdict.REFUSED
                owner_cls, raw = call
                return self._member_verdict(owner_cls, "__call__", raw)
            origin = verified_origin(type(key))
            if origin is None:
                return Verdict.REFUSED
        verdict = self.name_verdict(*origin)
        if verdict is Verdict.DEFAULT and origin[0] != "builtins":
            return Verdict.REFUSED  # a listed name must be the listed object itself
        return verdict

    def resolve(self, module: str, qualname: str, worker: str = "", what: str = "function") -> Any:
        """Import ``module`` and walk ``qualname`` after checking the name; check the object.

        Raises:
            PolicyError: the name or what it resolves to is not allowed.
            SerializationError: the name does not resolve on this worker.
        """
        return self.resolve_with_verdict(module, qualname, worker, what)[0]

    def resolve_with_verdict(
        self, module: str, qualname: str, worker: str = "", what: str = "function"
    ) -> tuple[Any, Verdict]:
        """:meth:`resolve`, and the verdict on what it found.

        Raises:
            PolicyError, SerializationError: as :meth:`resolve`.
        """
        key = (module, qualname)
        hit = self._cached(key)
        if hit is not None:
            return hit
        from ..errors import SerializationError

        self.check(module, qualname, worker, what)
        try:
            obj = _walk(_module_key(module), qualname)
        except (ImportError, AttributeError) as exc:
            where = f" on worker {worker!r}" if worker else ""
            raise SerializationError(
                "RPC pickler does not serialize function code. Ensure that UDFs are defined "
                f"on both caller and callee modules: {what} {module}:{qualname} does not "
                f"resolve{where}: {exc}"
            ) from exc
        verdict = self.verdict_of(obj)
        if verdict is Verdict.REFUSED:
            origin = origin_of(_unwrap(obj)) or origin_of(type(obj)) or (module, qualname)
            detail = f"it is {origin[0]}:{origin[1]}" if origin != (module, qualname) else ""
            raise self.refusal(f"{what} {module}:{qualname}", worker, detail)
        mod_key, first = _module_key(module), qualname.partition(".")[0]
        mod = sys.modules.get(mod_key)
        if mod is not None and len(self._resolved) < 4096:  # bounded: names come from the network
            self._resolved[key] = (mod_key, first, mod, getattr(mod, first, None), obj, verdict)
        return obj, verdict

    def _cached(self, key: tuple[str, str]) -> tuple[Any, Verdict] | None:
        """``(object, verdict)`` of a name resolved before, while its module and top-level
        object are unchanged; None otherwise."""
        hit = self._resolved.get(key)
        if hit is None:
            return None
        mod_key, first, mod, root, known, verdict = hit
        if sys.modules.get(mod_key) is mod and getattr(mod, first, None) is root:
            return known, verdict
        return None

    def resolve_call(self, module: str, qualname: str, worker: str = "") -> Any:
        """The function a call names, ready to call: wrapped to run under the guard when only
        the default lists allow it (see :meth:`resolve` for the checks).

        Raises:
            PolicyError, SerializationError: as :meth:`resolve`.
        """
        hit = self._cached((module, qualname))
        if hit is not None and hit[1] is not Verdict.DEFAULT:  # the call path: nothing to wrap
            return hit[0]
        obj, verdict = self.resolve_with_verdict(module, qualname, worker)
        return self.runnable(obj, verdict, f"{module}:{qualname}", worker)

    def runnable(
        self, obj: Any, verdict: Verdict, what: str, worker: str = "", cache: bool = True
    ) -> Any:
        """``obj`` itself, or a :class:`Guarded` around it for a DEFAULT verdict
        (``cache``: keep the wrapper for the next call of the same name)."""
        if verdict is not Verdict.DEFAULT or not self.guarded:
            return obj
        if not cache:
            return Guarded(obj, what, worker)
        key = (what, worker)
        hit = self._guarded.get(key)
        if hit is not None and hit.fn is obj:
            return hit
        wrapped = Guarded(obj, what, worker)
        if len(self._guarded) < 4096:  # bounded: names come from the network
            self._guarded[key] = wrapped
        return wrapped

    def resolve_member(self, value: Any, name: str, worker: str = "") -> tuple[Any, Verdict]:
        """``getattr(value, name)`` for an RRef proxy call, checked before anything runs.

        The member is looked up on the value's type without running descriptors; the policy
        judges the class that defines it (``module:Class.name``) and the object found there.
        Instance attributes and dynamic ``__getattr__`` results are judged as objects. Dunder
        and private names are never resolved (outside ``trust_everything``).

        Returns:
            ``(bound member, verdict)``.

        Raises:
            PolicyError: the name or the member is refused.
            AttributeError: the value has no such member.
        """
        if self.trust_everything:
            return getattr(value, name), Verdict.TRUSTED
        subject = f"method {name!r} of {type(value).__module__}:{type(value).__qualname__}"
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise self.refusal(subject, worker, "a private or dunder name")
        found = _find_member(type(value), name)
        inst = getattr(value, "__dict__", None)
        if (
            isinstance(inst, dict)
            and name in inst
            and not (found is not None and hasattr(type(found[1]), "__set__"))
        ):
            found = None  # an instance attribute shadows a plain class attribute
        if found is not None:
            owner, raw = found
            verdict = self._member_verdict(owner, name, raw)
            if verdict is Verdict.REFUSED:
                raise self.refusal(
                    subject, worker, f"defined on {owner.__module__}:{owner.__qualname__}"
                )
            if verdict is Verdict.DEFAULT and not _is_routine(raw):
                raise self.refusal(subject, worker, "not a method")
            member = getattr(value, name)
        else:
            member = getattr(value, name)
            verdict = self.verdict_of(member)
            if verdict is Verdict.REFUSED:
                raise self.refusal(subject, worker, f"an attribute holding {_describe(member)}")
        if verdict is Verdict.USER:
            inner = self.verdict_of(member) if _is_routine(_unwrap(member)) else Verdict.USER
            if inner is Verdict.REFUSED:  # a class attribute holding os.system, say
                raise self.refusal(subject, worker, f"it is {_describe(member)}")
            verdict = min(verdict, inner)
        return member, verdict

    def _listed(self, obj: Any) -> Verdict | None:
        """The verdict of the lists on ``obj`` itself (None: not listed); USER instead of
        DEFAULT when a user allow pattern names its origin (the user chose to run it as is)."""
        listed = default_objects()[0].get(id(obj))
        if listed is None or listed[0] is not obj:
            return None
        if listed[1] is Verdict.DEFAULT and self.allow:
            origin = origin_of(obj)
            if origin is not None and self._user_allowed(origin[0], f"{origin[0]}:{origin[1]}"):
                return Verdict.USER
        return listed[1]

    def _member_verdict(self, owner: type, name: str, raw: Any) -> Verdict:
        """The verdict on member ``name`` found in ``owner.__dict__`` as ``raw``."""
        listed = self._listed(_unwrap(raw))
        if listed is not None:
            return listed
        origin = verified_origin(owner)
        if origin is None:
            return Verdict.REFUSED  # a class whose name does not lead back to it
        module, qualname = origin[0], f"{origin[1]}.{name}"
        verdict = self.name_verdict(module, qualname)
        if verdict is Verdict.DEFAULT and module != "builtins":
            return Verdict.REFUSED  # a listed name must be the listed object itself
        return verdict


def _find_member(cls: type, name: str) -> tuple[type, Any] | None:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass, klass.__dict__[name]
    return None


#: The types of code objects a callable may be: functions, builtins, methods and descriptors.
ROUTINE_TYPES: tuple[type, ...] = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.MethodDescriptorType,
    types.ClassMethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
)


def _is_routine(obj: Any) -> bool:
    return (
        isinstance(obj, (*ROUTINE_TYPES, staticmethod, classmethod, type))
        or type(obj).__name__ == "ufunc"
    )


def _describe(obj: Any) -> str:
    origin = origin_of(_unwrap(obj))
    if origin is not None:
        return f"{origin[0]}:{origin[1]}"
    return f"a {type(obj).__module__}.{type(obj).__qualname__}"
