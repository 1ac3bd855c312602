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

import builtins
import pickle
import pickletools
import struct
import sys
import types
from collections.abc import Callable
from typing import Any

from .policy import ROUTINE_TYPES

__all__ = ["scan", "nameable", "describe", "CheckedUnpickler", "Mutation"]


class Mutation(Exception):
    """Raised by :func:`scan` and :class:`CheckedUnpickler`: the payload would change, or call,
    something it did not create (``str(exc)`` says what, for the caller's PolicyError)."""


# Provenance of a value on the simulated stack: (kind, detail).
_NEW = "new"  # built by the payload's own opcodes (containers, bytearrays)
_CONST = "const"  # a number, string, bytes, None, a tuple (immutable)
_NAMED = "named"  # find_class, an extension code or a side-table reference; detail: its name
_MADE = "made"  # the result of a call; it may be an object someone else holds

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


#: Opcode byte -> (name, how its argument is laid out): "" none, "1"/"2"/"4"/"8" a little-endian
#: unsigned int of that many bytes, "i4" a signed one, "s1"/"s4"/"s8" bytes of that length
#: prefix, "u1"/"u4"/"u8" UTF-8 text of that length prefix, "nl" a line, "nl2" two lines, "f8"
#: a double.
_LAYOUT: dict[int, tuple[str, str]] = {
    op.code.encode("latin-1")[0]: (op.name, kind)
    for op, kind in (
        (
            o,
            {
                "decimalnl_short": "nl",
                "decimalnl_long": "nl",
                "stringnl": "nl",
                "stringnl_noescape": "nl",
                "unicodestringnl": "nl",
                "floatnl": "nl",
                "stringnl_noescape_pair": "nl2",
                "int4": "i4",
                "uint1": "1",
                "uint2": "2",
                "uint4": "4",
                "uint8": "8",
                "float8": "f8",
                "long1": "s1",
                "long4": "s4",
                "string1": "s1",
                "string4": "s4",
                "bytes1": "s1",
                "bytes4": "s4",
                "bytes8": "s8",
                "bytearray8": "s8",
                "unicodestring1": "u1",
                "unicodestring4": "u4",
                "unicodestring8": "u8",
            }[o.arg.name]
            if o.arg is not None
            else "",
        )
        for o in pickletools.opcodes
    )
}
#: Opcodes a payload needs to change or call anything: without one of these bytes anywhere in
#: it (the argument tuple of plain values and tensors), there is nothing to scan.
_ACTIVE = frozenset(b"bsuae\x90Roi\x81\x92")


_UINT = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}


def scan(
    data: bytes | bytearray | memoryview, resolve: Callable[[str, str], Any] | None = None
) -> bool:
    """Read ``data``'s opcodes without running them.

    Args:
        data: the pickle.
        resolve: ``resolve(module, name)``, the object a global names (the policy's
            ``find_class``, which checks it): a value made by instantiating a class whose
            ``__new__`` always allocates (``object.__new__``, an exception's, a builtin
            container's) is then known to be new, so setting its state needs no check on the
            live object. None: every value made by a call is checked.

    Returns:
        True when the payload must be decoded by :class:`CheckedUnpickler` (a mutation of a
        value made by a call not known to make new values, a method named by its class, or
        opcodes the scan does not model); False when the C unpickler may decode it.

    Raises:
        Mutation: the payload mutates a value it named (a class, a function, a side-table
            object) or calls something it did not name.
        PolicyError: ``resolve`` refused a global.
    """
    if _ACTIVE.isdisjoint(bytes(data)):
        return False
    try:
        return _Scan(resolve).run(bytes(data))
    except (_Unmodelled, ValueError, IndexError, KeyError, TypeError, struct.error):
        return True  # malformed or unusual: the checked unpickler checks it on live objects


def _always_new(cls: Any) -> bool:
    """True when calling ``cls`` (or instantiating it by NEWOBJ) always yields a new object: a
    class without a metaclass ``__call__`` whose ``__new__`` comes from ``object``, a builtin
    exception or a builtin container; or a reviewed function that always allocates."""
    if not isinstance(cls, type):
        return any(cls is maker for maker in _NEW_MAKERS)
    if type(cls).__call__ is not type.__call__:
        return False  # enums, for one: calling the class looks a member up
    for klass in cls.__mro__:
        if "__new__" in klass.__dict__:
            return klass in _ALLOCATING or (
                issubclass(klass, BaseException)
                and getattr(builtins, klass.__name__, None) is klass
            )
    return False


#: Types whose own ``__new__`` allocates on every call (a subclass that keeps it makes a new
#: instance each time; enums, dtypes and cached types define their own).
_ALLOCATING: frozenset[type] = frozenset({object, dict, list, set, bytearray})


def _numpy_reconstruct() -> tuple[Any, ...]:
    """NumPy's ``_reconstruct``, by which pickled ndarrays are rebuilt: it always allocates."""
    import importlib

    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):  # NumPy 2, then 1.x
        try:
            return (importlib.import_module(module)._reconstruct,)
        except (ImportError, AttributeError):
            continue
    return ()


_NEW_MAKERS: tuple[Any, ...] = _numpy_reconstruct()
_BOOLS = {"NEWTRUE": True, "NEWFALSE": False}


def _dtype_copies(args: tuple[Any, ...]) -> bool:
    return len(args) >= 3 and args[2] is True  # numpy.dtype(obj, align, copy=True)


#: id -> (callable, predicate on its REDUCE arguments' constants): calls that make a new object
#: only with some arguments (a pickled ``numpy.dtype`` asks for a copy; without it a singleton
#: comes back, whose ``__setstate__`` would change every array of that dtype).
_NEW_WHEN: dict[int, tuple[Any, Callable[[tuple[Any, ...]], bool]]] = {
    id(__import__("numpy").dtype): (__import__("numpy").dtype, _dtype_copies)
}


Value = tuple[str, Any, Any]  # (kind, label, resolved object or "known new")
_CONST_V: Value = (_CONST, None, None)
_NEW_V: Value = (_NEW, None, None)
_MARK_V: Value = ("mark", "", None)


class _Scan:
    """The stack simulation of :func:`scan` (one per payload)."""

    def __init__(self, resolve: Callable[[str, str], Any] | None) -> None:
        self.resolve = resolve
        self.stack: list[Value] = []
        self.marks: list[int] = []
        self.memo: dict[int, Value] = {}
        self.checked = False
        #: label -> its value, each global resolved once per payload
        self.names: dict[str, Value] = {}

    # -- helpers ------------------------------------------------------------------------------
    def floor(self) -> int:
        return self.marks[-1] if self.marks else 0

    def pop_mark(self) -> list[Value]:
        if not self.marks:
            raise _Unmodelled
        at = self.marks.pop()
        items = self.stack[at:]
        del self.stack[at:]
        return items

    def pop(self, n: int) -> list[Value]:
        stack = self.stack
        if len(stack) - n < self.floor():
            raise _Unmodelled
        items = stack[len(stack) - n :]
        del stack[len(stack) - n :]
        return items

    def top(self) -> Value:
        if len(self.stack) <= self.floor():
            raise _Unmodelled
        return self.stack[-1]

    def named(self, label: str) -> Value:
        known = self.names.get(label)
        if known is not None:
            return known
        obj = None
        if self.resolve is not None:
            module, _, qualname = label.partition(":")
            obj = self.resolve(module, qualname)
        value = self.names[label] = (_NAMED, label, obj)
        return value

    def made(self, maker: Value, what: str) -> Value:
        if maker[0] != _NAMED:
            raise Mutation(f"{what} a value it made itself ({maker[1] or 'not a global'})")
        return (_MADE, maker[1], self.resolve is not None and _always_new(maker[2]))

    def mutate(self, verb: str) -> None:
        target = self.top()
        if target[0] == _NAMED:
            raise Mutation(f"{verb} {target[1]}, which it did not create")
        if target[0] == _MADE and not target[2]:
            self.checked = True

    # -- the walk -----------------------------------------------------------------------------
    def run(self, buf: bytes) -> bool:
        end = len(buf)
        stack, marks, memo = self.stack, self.marks, self.memo
        push = stack.append
        at = 0
        if end >= 2 and buf[0] == 0x80:  # PROTO n (and FRAME n): every protocol 4/5 pickle
            at = 11 if end >= 11 and buf[2] == 0x95 else 2
        base = 0  # where the innermost mark is: the stack below it is out of reach
        while at < end:
            code = buf[at]
            at += 1
            # The frequent opcodes inline; the rest through the table.
            if code == 0x94:  # MEMOIZE
                if len(stack) <= base:
                    raise _Unmodelled
                memo[len(memo)] = stack[-1]
            elif code == 0x8C:  # SHORT_BINUNICODE
                size = buf[at]
                push((_CONST, buf[at + 1 : at + 1 + size].decode("utf-8", "replace"), None))
                at += 1 + size
            elif code == 0x4B:  # BININT1
                at += 1
                push(_CONST_V)
            elif code == 0x4E or code == 0x29:  # NONE, EMPTY_TUPLE
                push(_CONST_V)
            elif code == 0x7D or code == 0x5D:  # EMPTY_DICT, EMPTY_LIST
                push(_NEW_V)
            elif code == 0x28:  # MARK
                base = len(stack)
                marks.append(base)
            elif code == 0x75 or code == 0x65:  # SETITEMS, APPENDS
                if not marks:
                    raise _Unmodelled
                del stack[marks.pop() :]
                base = marks[-1] if marks else 0
                if len(stack) <= base:
                    raise _Unmodelled
                if stack[-1][0] is not _NEW:
                    self.mutate("set items of" if code == 0x75 else "append to")
            elif 0x85 <= code <= 0x87:  # TUPLE1..3: keeps its items' constants (see _NEW_WHEN)
                size = code - 0x84
                if len(stack) - size < base:
                    raise _Unmodelled
                items = tuple(v[1] for v in stack[len(stack) - size :])
                del stack[len(stack) - size :]
                push((_CONST, items, None))
            elif code == 0x68:  # BINGET
                push(memo[buf[at]])
                at += 1
            elif code == 0x62 or code == 0x61:  # BUILD, APPEND
                if len(stack) - 2 < base:
                    raise _Unmodelled
                del stack[-1]
                kind = stack[-1][0]
                if kind is not _NEW:
                    self.mutate("set the state of" if code == 0x62 else "append to")
            elif code == 0x93:  # STACK_GLOBAL
                if len(stack) - 2 < base:
                    raise _Unmodelled
                module, qualname = stack[-2][1], stack[-1][1]
                del stack[-2:]
                if not (isinstance(module, str) and isinstance(qualname, str)):
                    raise _Unmodelled
                push(self.named(f"{module}:{qualname}"))
                if "." in qualname:
                    self.checked = True
            elif code == 0x81:  # NEWOBJ
                if len(stack) - 2 < base:
                    raise _Unmodelled
                cls = stack[-2]
                del stack[-2:]
                push(self.made(cls, "instantiates"))
            elif code == 0x47:  # BINFLOAT
                at += 8
                push(_CONST_V)
            elif code == 0x2E:  # STOP
                return self.checked
            else:
                at = self.slow(code, buf, at)
                base = marks[-1] if marks else 0
            if at > end:
                raise _Unmodelled
        raise _Unmodelled  # no STOP

    def slow(self, code: int, buf: bytes, at: int) -> int:
        """One opcode off the fast path; returns where the next one is."""
        try:
            name, kind = _LAYOUT[code]
        except KeyError:
            raise _Unmodelled from None
        arg: Any = None
        if kind:
            arg, at = _read_arg(buf, at, kind)
        stack, push = self.stack, self.stack.append
        if name in _PUSH_CONST:
            value = arg if name in _STRINGS else _BOOLS.get(name)
            push((_CONST, value, None))
        elif name in _PUSH_NEW:
            push(_NEW_V)
        elif name in _TUPLES:
            self.pop(_TUPLES[name])
            push(_CONST_V)
        elif name in _FROM_MARK:
            self.pop_mark()
            push((_FROM_MARK[name], None, None))
        elif name in _MUTATORS:
            count, verb = _MUTATORS[name]
            if count is None:
                self.pop_mark()
            else:
                self.pop(count)
            self.mutate(verb)
        elif name == "MARK":
            self.marks.append(len(stack))
        elif name == "POP":
            if len(stack) > self.floor():
                stack.pop()
            else:
                self.pop_mark()
        elif name == "POP_MARK":
            self.pop_mark()
        elif name == "DUP":
            push(self.top())
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            push(self.memo[int(arg)])
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            key = len(self.memo) if name == "MEMOIZE" else int(arg)
            self.memo[key] = stack[-1] if len(stack) > self.floor() else _MARK_V
        elif name == "GLOBAL":
            module, _, qualname = str(arg).partition(" ")
            push(self.named(f"{module}:{qualname}"))
            self.checked = self.checked or "." in qualname
        elif name == "STACK_GLOBAL":
            pair = self.pop(2)
            if not (isinstance(pair[0][1], str) and isinstance(pair[1][1], str)):
                raise _Unmodelled
            push(self.named(f"{pair[0][1]}:{pair[1][1]}"))
            self.checked = self.checked or "." in pair[1][1]
        elif name in ("EXT1", "EXT2", "EXT4"):
            push((_NAMED, f"the global of extension code {arg}", None))
            self.checked = True  # its name is known only once resolved
        elif name == "PERSID":
            push((_NAMED, "a side-table object (tensor or RRef)", None))
        elif name == "BINPERSID":
            self.pop(1)
            push((_NAMED, "a side-table object (tensor or RRef)", None))
        elif name == "REDUCE":
            func, args = self.pop(2)
            value = self.made(func, "calls")
            when = _NEW_WHEN.get(id(func[2])) if func[2] is not None else None
            if when is not None and when[0] is func[2] and isinstance(args[1], tuple):
                value = (_MADE, value[1], when[1](args[1]))
            push(value)
            self.checked = self.checked or "." in str(func[1]).partition(":")[2]
        elif name == "NEWOBJ":
            cls, _args = self.pop(2)
            push(self.made(cls, "instantiates"))
        elif name == "NEWOBJ_EX":
            cls, _args, _kwargs = self.pop(3)
            push(self.made(cls, "instantiates"))
        elif name == "OBJ":
            items = self.pop_mark()
            if not items:
                raise _Unmodelled
            push(self.made(items[0], "instantiates"))
        elif name == "INST":
            self.pop_mark()
            module, _, qualname = str(arg).partition(" ")
            push(self.made(self.named(f"{module}:{qualname}"), "instantiates"))
            self.checked = self.checked or "." in qualname
        elif name not in _NOTHING:  # STOP is on the fast path
            raise _Unmodelled
        if stack and stack[-1] is _MARK_V:
            raise _Unmodelled
        return at


def _read_arg(buf: bytes, at: int, kind: str) -> tuple[Any, int]:
    """The argument of layout ``kind`` at ``at`` (see ``_LAYOUT``) and where the next opcode is."""
    if kind == "nl" or kind == "nl2":
        stop = buf.index(b"\n", at)
        arg = buf[at:stop].decode("utf-8", "replace")
        at = stop + 1
        if kind == "nl2":
            stop = buf.index(b"\n", at)
            arg = f"{arg} {buf[at:stop].decode('utf-8', 'replace')}"
            at = stop + 1
        return arg, at
    if kind[0] in "su":
        width = int(kind[1])
        size = int.from_bytes(buf[at : at + width], "little")
        at += width
        text = buf[at : at + size].decode("utf-8", "replace") if kind[0] == "u" else None
        return text, at + size
    if kind == "f8":
        return None, at + 8
    width = int(kind[-1])
    return struct.unpack_from("<i" if kind == "i4" else _UINT[width], buf, at)[0], at + width


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
