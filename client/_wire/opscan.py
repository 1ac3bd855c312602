"""The opcode scan of ``integrity.py``: a payload's pickle read, not run, before it is unpickled.

It simulates the pickle's stack with a provenance per value (built by the payload's own
opcodes; named by ``find_class``, an extension code or a side-table reference; made by a call)
and finds every mutation (BUILD, SETITEM(S), APPEND(S), ADDITEMS) and every call (REDUCE,
NEWOBJ, NEWOBJ_EX, OBJ, INST). A mutation of a named value, or a call of anything unnamed, is
a :class:`Mutation` at once; a mutation of a value a call made, unless that call is known to
make new values, sends the payload to ``integrity.CheckedUnpickler``. The frequent opcodes are
handled inline (this is Python on a call path: ~0.6 us an opcode here).
"""

from __future__ import annotations

import builtins
import importlib
import pickletools
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["scan", "Mutation"]


class Mutation(Exception):
    """Raised by :func:`scan` and ``integrity.CheckedUnpickler``: the payload would change, or
    call, something it did not create (``str(exc)`` says what, for the caller's PolicyError)."""


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
