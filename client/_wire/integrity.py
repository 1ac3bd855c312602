"""Integrity of unpickling: a peer's payload builds new values; it never changes the worker's.

A pickle changes objects with six opcodes: BUILD (``__setstate__``, or the instance's
``__dict__`` and slots), SETITEM(S), APPEND(S) and ADDITEMS. Applied to what ``find_class``
returned (a class, a function, a module-level object) or to an object an allowed call handed out
(a cached ``numpy.finfo``, an enum member, a ``numpy.dtype`` singleton), they would rewrite the
worker's own code and data for the whole process. Three checks keep a payload to new values:

1. :func:`scan` (``opscan.py``) reads the opcodes before anything runs and tracks where each value on the
   stack came from: built by the payload's own opcodes (a list, a dict: *new*), *named*
   (``find_class``, an extension code, a side-table reference), or *made* by a call (REDUCE,
   NEWOBJ, NEWOBJ_EX, OBJ, INST). A mutation of a named value, and a call of anything but a
   named value, is refused at once with a :class:`~gradwire.errors.PolicyError` naming it. A
   payload whose mutations all fall on values its own opcodes built (nearly every call: the
   argument tuple, the keyword dict) goes on to the C unpickler as before.
2. The others (a mutation of a value made by a call: any object pickled through its
   ``__reduce__``, a dataclass, an exception with attributes; a method named by its class) go to
   :class:`CheckedUnpickler`, the pure-Python unpickler with those opcodes checked on the live
   objects: the target must have been created while this payload was read, by its opcodes or
   by a call that returned an object nobody else holds (its reference count, measured against a
   fresh object's on the same path, says so), and a method named by its class runs only on such
   an object.
3. ``find_class`` hands out only what a pickler writes by name (:func:`nameable`): classes,
   functions and other routines, and objects that pickle as their own name (``Ellipsis``,
   gradwire's dtypes). A program's data (a module-level dict, array or model) never enters a
   payload.

Under ``trust_everything`` none of this runs: a trusted peer may send anything.
"""

from __future__ import annotations

import pickle
import sys
import types
from collections.abc import Callable
from typing import Any

from .opscan import Mutation, scan
from .policy import ROUTINE_TYPES

__all__ = ["scan", "nameable", "describe", "CheckedUnpickler", "Mutation"]


def nameable(obj: Any, protocol: int) -> bool:
    """True when a pickler would write ``obj`` by name, so a payload may name it: a class, a
    routine (function, builtin, method, ufunc), or an object whose own ``__reduce_ex__`` gives
    its global name (``Ellipsis``, gradwire's dtypes). A program's data objects (dicts, lists,
    arrays, module-level instances) are pickled by value and never by name."""
    if isinstance(obj, type) or isinstance(obj, _ROUTINES):
        return True
    if isinstance(obj, (dict, list, set, frozenset, tuple, bytearray, str, bytes, int, float)):
        return False
    if type(obj).__name__ in ("ufunc", "_ArrayFunctionDispatcher"):
        return True
    if type(obj).__module__ == "numpy" and type(obj).__name__ == "ndarray":
        return False  # its reduce would copy every element only to be refused
    try:
        return isinstance(obj.__reduce_ex__(protocol), str)
    except Exception:  # noqa: BLE001 - an object that cannot be pickled is not nameable
        return False


_ROUTINES = ROUTINE_TYPES


def _invoke(fn: Callable[..., Any], args: Any, kwargs: Any) -> tuple[Any, int]:
    """``fn(*args, **kwargs)`` and the result's reference count right after the call."""
    value = fn(*args, **kwargs)
    return value, sys.getrefcount(value)


class _Probe:
    pass


#: The reference count :func:`_invoke` sees for an object nobody else holds (measured, so it
#: holds on every interpreter: a shared object has at least one more, an immortal one many more).
_FRESH_REFS = _invoke(_Probe, (), {})[1]


def describe(obj: Any) -> str:
    """What a refusal calls ``obj``: ``module:qualname`` for code, its type for data."""
    if isinstance(obj, (type, *_ROUTINES)):
        module = getattr(obj, "__module__", None) or type(obj).__module__
        return f"{module}:{getattr(obj, '__qualname__', repr(obj))}"
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    return f"a {type(obj).__module__}.{type(obj).__qualname__} object"


#: The pure-Python unpickler (typed as Any: typeshed does not describe its internals).
_PyUnpickler: Any = getattr(pickle, "_Unpickler")  # noqa: B009 - private, on purpose
_dispatch: dict[int, Callable[[Any], None]] = _PyUnpickler.dispatch


def _op(opcode: bytes) -> int:
    return opcode[0]


class CheckedUnpickler(_PyUnpickler):
    """The pure-Python unpickler with every mutation and call checked on the live objects.

    A subclass provides :meth:`resolve_global` (the policy's ``find_class``) and
    ``persistent_load``. Raises :class:`Mutation` for a mutation of an object the payload did
    not create, a call of something it did not name, or a method named by its class called on
    an object it did not create.
    """

    dispatch = dict(_dispatch)

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        #: id -> object created while reading this payload (kept alive, so ids stay unique).
        self._made: dict[int, Any] = {}
        #: id -> (object, named by a dotted path: a member of a class) for find_class results.
        self._named: dict[int, tuple[Any, bool]] = {}

    # -- what a subclass provides --------------------------------------------------------
    def resolve_global(self, module: str, name: str) -> Any:
        raise NotImplementedError

    def find_class(self, module: str, name: str) -> Any:
        obj = self.resolve_global(module, name)
        self._named[id(obj)] = (obj, "." in name and not isinstance(obj, type))
        return obj

    # -- bookkeeping ---------------------------------------------------------------------
    def _adopt(self, value: Any) -> None:
        self._made[id(value)] = value

    def _check_target(self, target: Any, verb: str) -> None:
        if self._made.get(id(target)) is not target:
            raise Mutation(f"{verb} {describe(target)}, which it did not create")

    def _require_named(self, fn: Any, verb: str) -> bool:
        """Raise unless ``fn`` came from ``find_class``; True when named as a class member."""
        named = self._named.get(id(fn))
        if named is None or named[0] is not fn:
            raise Mutation(f"{verb} {describe(fn)}, which it did not name")
        return named[1]

    def _fresh(self, fn: Any, args: Any, kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, adopted as created here when nobody else holds it."""
        value, refs = _invoke(fn, args, kwargs)
        if refs <= _FRESH_REFS:
            self._adopt(value)
        return value

    def _call(self, fn: Any, args: Any, kwargs: Any, verb: str) -> Any:
        if self._require_named(fn, verb) and not isinstance(fn, types.MethodType):
            # A method named by its class (Class.method): its first argument is the object
            # it works on, and that must be one the payload created.
            if not args or self._made.get(id(args[0])) is not args[0]:
                first = describe(args[0]) if args else "nothing"
                raise Mutation(f"calls {describe(fn)} on {first}, which it did not create")
        return self._fresh(fn, args, kwargs)

    # -- opcodes -------------------------------------------------------------------------
    def load_reduce(self) -> None:
        stack = self.stack
        args = stack.pop()
        stack[-1] = self._call(stack[-1], args, {}, "calls")

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._new(cls, args, {}))

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._new(cls, args, kwargs))

    def _new(self, cls: Any, args: Any, kwargs: Any) -> Any:
        if not isinstance(cls, type):
            raise pickle.UnpicklingError("NEWOBJ class argument isn't a type object")
        self._require_named(cls, "instantiates")
        return self._fresh(cls.__new__, (cls, *args), kwargs)

    def _instantiate(self, klass: Any, args: Any) -> None:
        if args or not isinstance(klass, type) or hasattr(klass, "__getinitargs__"):
            self.append(self._call(klass, tuple(args), {}, "instantiates"))
        else:
            self._require_named(klass, "instantiates")
            self.append(self._fresh(klass.__new__, (klass,), {}))

    def load_build(self) -> None:
        self._check_target(self.stack[-2], "set the state of")
        state = self.stack[-1]
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            for key in state[1]:
                if key in ("__class__", "__dict__"):
                    raise Mutation(f"set {key} of {describe(self.stack[-2])}")
        _dispatch[_op(pickle.BUILD)](self)

    def load_setitem(self) -> None:
        self._check_target(self.stack[-3], "set an item of")
        _dispatch[_op(pickle.SETITEM)](self)

    def load_append(self) -> None:
        self._check_target(self.stack[-2], "append to")
        _dispatch[_op(pickle.APPEND)](self)

    def _marked_target(self, verb: str) -> None:
        self._check_target(self.metastack[-1][-1], verb)

    def load_setitems(self) -> None:
        self._marked_target("set items of")
        _dispatch[_op(pickle.SETITEMS)](self)

    def load_appends(self) -> None:
        self._marked_target("append to")
        _dispatch[_op(pickle.APPENDS)](self)

    def load_additems(self) -> None:
        self._marked_target("add items to")
        _dispatch[_op(pickle.ADDITEMS)](self)

    def _creates(opcode: bytes) -> Callable[[Any], None]:
        load = _dispatch[opcode[0]]

        def created(self: Any) -> None:
            load(self)
            self._adopt(self.stack[-1])

        return created

    for _code in (
        pickle.EMPTY_LIST,
        pickle.EMPTY_DICT,
        pickle.EMPTY_SET,
        pickle.LIST,
        pickle.DICT,
        pickle.BYTEARRAY8,
    ):
        dispatch[_code[0]] = _creates(_code)
    for _code, _load in (
        (pickle.REDUCE, load_reduce),
        (pickle.NEWOBJ, load_newobj),
        (pickle.NEWOBJ_EX, load_newobj_ex),
        (pickle.BUILD, load_build),
        (pickle.SETITEM, load_setitem),
        (pickle.SETITEMS, load_setitems),
        (pickle.APPEND, load_append),
        (pickle.APPENDS, load_appends),
        (pickle.ADDITEMS, load_additems),
    ):
        dispatch[_code[0]] = _load
    del _code, _load, _creates
