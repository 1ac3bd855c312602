"""Integrity of unpickling: a peer's payload builds new values; it never changes the worker's.

A pickle changes objects with six opcodes: BUILD (``__setstate__``, or the instance's
``__dict__`` and slots), SETITEM(S), APPEND(S) and ADDITEMS. Applied to what ``find_class``
returned (a class, a function, a module-level object) or to an object an allowed call handed out
(a cached ``numpy.finfo``, an enum member, a ``numpy.dtype`` singleton), they would rewrite the
worker's own code and data for the whole process. Three checks keep a payload to new values:

1. :func:`scan` reads the opcodes before anything runs and tracks where each value on the
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

import io
import pickle
import pickletools
import sys
import types
from collections.abc import Callable
from typing import Any

__all__ = ["scan", "nameable", "describe", "CheckedUnpickler", "Mutation"]


class Mutation(Exception):
    """Raised by :func:`scan` and :class:`CheckedUnpickler`: the payload would change, or call,
    something it did not create (``str(exc)`` says what, for the caller's PolicyError)."""


# Provenance of a value on the simulated stack: (kind, detail).
_NEW = "new"  # built by the payload's own opcodes (containers, bytearrays)
_CONST = "const"  # a number, string, bytes, None, a tuple (immutable)
_NAMED = "named"  # find_class, an extension code or a side-table reference; detail: its name
_MADE = "made"  # the result of a call; it may be an object someone else holds
_MARK = ("mark", "")

_PUSH_CONST = frozenset(
    """INT BININT BININT1 BININT2 LONG LONG1 LONG4 STRING BINSTRING SHORT_BINSTRING BINBYTES
    SHORT_BINBYTES BINBYTES8 UNICODE SHORT_BINUNICODE BINUNICODE BINUNICODE8 FLOAT BINFLOAT
    NONE NEWTRUE NEWFALSE EMPTY_TUPLE NEXT_BUFFER""".split()
)
_STRINGS = frozenset(
    "STRING BINSTRING SHORT_BINSTRING UNICODE SHORT_BINUNICODE BINUNICODE BINUNICODE8".split()
)
_PUSH_NEW = frozenset("EMPTY_LIST EMPTY_DICT EMPTY_SET BYTEARRAY8".split())
_FROM_MARK = {"TUPLE": _CONST, "LIST": _NEW, "DICT": _NEW, "FROZENSET": _CONST}
_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
#: Mutating opcodes: how many values they pop above their target (None: down to a mark).
_MUTATORS: dict[str, tuple[int | None, str]] = {
    "BUILD": (1, "set the state of"),
    "SETITEM": (2, "set an item of"),
    "SETITEMS": (None, "set items of"),
    "APPEND": (1, "append to"),
    "APPENDS": (None, "append to"),
    "ADDITEMS": (None, "add items to"),
}
_NOTHING = frozenset({"PROTO", "FRAME", "READONLY_BUFFER"})


class _Unmodelled(Exception):
    """The simulation cannot follow the payload: let the checked unpickler decide at run time."""


def scan(data: bytes | bytearray | memoryview) -> bool:
    """Read ``data``'s opcodes without running them.

    Returns:
        True when the payload must be decoded by :class:`CheckedUnpickler` (a mutation of a
        value made by a call, a method named by its class, or opcodes the scan does not model);
        False when every mutation falls on a value the payload's own opcodes built (the C
        unpickler may decode it).

    Raises:
        Mutation: the payload mutates a value it named (a class, a function, a side-table
            object) or calls something it did not name.
    """
    try:
        return _scan(data)
    except (_Unmodelled, ValueError, IndexError, KeyError, TypeError):
        return True  # malformed or unusual: the checked unpickler checks it on live objects


def _scan(data: Any) -> bool:
    stack: list[tuple[str, Any]] = []
    marks: list[int] = []
    memo: dict[Any, tuple[str, Any]] = {}
    checked = False

    def pop_mark() -> list[tuple[str, Any]]:
        if not marks:
            raise _Unmodelled
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
        return items

    def pop(n: int) -> list[tuple[str, Any]]:
        floor = marks[-1] if marks else 0
        if len(stack) - n < floor:
            raise _Unmodelled
        items = stack[len(stack) - n :]
        del stack[len(stack) - n :]
        return items

    def callable_named(value: tuple[str, Any], what: str) -> None:
        if value[0] != _NAMED:
            raise Mutation(f"{what} a value it made itself ({value[1] or 'not a global'})")

    for op, arg, _pos in pickletools.genops(io.BytesIO(data)):
        name = op.name
        if name in _PUSH_CONST:
            stack.append((_CONST, arg if name in _STRINGS else None))
        elif name in _PUSH_NEW:
            stack.append((_NEW, None))
        elif name in _TUPLES:
            pop(_TUPLES[name])
            stack.append((_CONST, None))
        elif name in _FROM_MARK:
            pop_mark()
            stack.append((_FROM_MARK[name], None))
        elif name in _MUTATORS:
            count, verb = _MUTATORS[name]
            if count is None:
                pop_mark()
            else:
                pop(count)
            target = pop(1)[0]
            stack.append(target)
            if target[0] == _NAMED:
                raise Mutation(f"{verb} {target[1]}, which it did not create")
            checked = checked or target[0] == _MADE
        elif name == "MARK":
            marks.append(len(stack))
        elif name == "POP":
            if len(stack) > (marks[-1] if marks else 0):
                stack.pop()
            else:
                pop_mark()
        elif name == "POP_MARK":
            pop_mark()
        elif name == "DUP":
            stack.append(pop(1)[0])
            stack.append(stack[-1])
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo[arg])
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[arg] = stack[-1] if len(stack) > (marks[-1] if marks else 0) else _MARK
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1] if len(stack) > (marks[-1] if marks else 0) else _MARK
        elif name == "GLOBAL":
            module, _, qualname = str(arg).partition(" ")
            stack.append((_NAMED, f"{module}:{qualname}"))
        elif name == "STACK_GLOBAL":
            module, qualname = pop(2)
            if module[0] != _CONST or qualname[0] != _CONST:
                raise _Unmodelled
            stack.append((_NAMED, f"{module[1]}:{qualname[1]}"))
            checked = checked or "." in str(qualname[1])
        elif name in ("EXT1", "EXT2", "EXT4"):
            stack.append((_NAMED, f"the global of extension code {arg}"))
            checked = True  # its name is known only once resolved
        elif name == "PERSID":
            stack.append((_NAMED, "a side-table object (tensor or RRef)"))
        elif name == "BINPERSID":
            pop(1)
            stack.append((_NAMED, "a side-table object (tensor or RRef)"))
        elif name == "REDUCE":
            func, _args = pop(2)
            callable_named(func, "calls")
            checked = checked or "." in func[1].partition(":")[2]
            stack.append((_MADE, func[1]))
        elif name == "NEWOBJ":
            cls, _args = pop(2)
            callable_named(cls, "instantiates")
            stack.append((_MADE, cls[1]))
        elif name == "NEWOBJ_EX":
            cls, _args, _kwargs = pop(3)
            callable_named(cls, "instantiates")
            stack.append((_MADE, cls[1]))
        elif name == "OBJ":
            items = pop_mark()
            if not items:
                raise _Unmodelled
            callable_named(items[0], "instantiates")
            stack.append((_MADE, items[0][1]))
        elif name == "INST":
            pop_mark()
            module, _, qualname = str(arg).partition(" ")
            stack.append((_MADE, f"{module}:{qualname}"))
            checked = checked or "." in qualname
        elif name == "STOP":
            break
        elif name not in _NOTHING:
            raise _Unmodelled
        if stack and stack[-1] is _MARK:
            raise _Unmodelled
    return checked


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


_ROUTINES = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.MethodDescriptorType,
    types.ClassMethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
)


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


_dispatch = pickle._Unpickler.dispatch  # type: ignore[attr-defined]


def _op(opcode: bytes) -> int:
    return opcode[0]


class CheckedUnpickler(pickle._Unpickler):  # type: ignore[name-defined,misc]
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

    def _creates(opcode: bytes) -> Callable[[CheckedUnpickler], None]:  # type: ignore[misc]
        load = _dispatch[opcode[0]]

        def created(self: CheckedUnpickler) -> None:
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
