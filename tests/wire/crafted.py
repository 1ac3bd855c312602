"""Hand-made pickles: what a peer's payload may hold that no pickler of gradwire writes.

Each attack is a few opcodes that leave one value on the stack; :func:`call_body` wraps them
as the single argument of a call body ``(None, (value,), {})`` in any pickle protocol.
"""

from __future__ import annotations

import pickle
import pickletools
from typing import Any

__all__ = ["PROTOCOLS", "op_global", "value_ops", "call_body", "build_on", "reduce_of", "item_of"]

PROTOCOLS = tuple(range(pickle.HIGHEST_PROTOCOL + 1))


def _str_op(text: str, proto: int) -> bytes:
    if proto >= 1:
        data = text.encode()
        return pickle.BINUNICODE + len(data).to_bytes(4, "little") + data
    return pickle.UNICODE + text.encode("raw-unicode-escape") + b"\n"


def op_global(module: str, name: str, proto: int) -> bytes:
    """The opcodes that push ``module:name`` through ``find_class``."""
    if proto >= 4:
        return _str_op(module, proto) + _str_op(name, proto) + pickle.STACK_GLOBAL
    return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def value_ops(value: Any, proto: int) -> bytes:
    """``value`` pickled in ``proto`` without its PROTO, FRAME and STOP (and memo: the pieces of
    an attack are joined, so none may refer to another's memo)."""
    data = pickletools.optimize(pickle.dumps(value, proto))
    out = bytearray()
    for op, _arg, pos in pickletools.genops(data):
        if op.name in ("PROTO", "FRAME", "STOP"):
            continue
        if op.name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "GET", "BINGET", "LONG_BINGET"):
            raise ValueError(f"{value!r} needs its memo; pick a simpler value")
        end = _next_pos(data, pos)
        out += data[pos:end]
    return bytes(out)


def _next_pos(data: bytes, pos: int) -> int:
    ops = list(pickletools.genops(data))
    for i, (_op, _arg, p) in enumerate(ops):
        if p == pos:
            return ops[i + 1][2] if i + 1 < len(ops) else len(data)
    raise ValueError(pos)


def call_body(arg: bytes, proto: int) -> bytes:
    """``(None, (<arg>,), {})`` around the opcodes ``arg``."""
    head = pickle.PROTO + bytes([proto]) if proto >= 2 else b""
    return (
        head
        + pickle.MARK
        + pickle.NONE
        + pickle.MARK
        + arg
        + pickle.TUPLE
        + pickle.MARK
        + pickle.DICT
        + pickle.TUPLE
        + pickle.STOP
    )


def build_on(target: bytes, state: Any, proto: int) -> bytes:
    """``target`` with ``state`` applied by BUILD (a dict: its ``__dict__``; ``(None, slots)``:
    setattr for each)."""
    return target + value_ops(state, proto) + pickle.BUILD


def reduce_of(module: str, name: str, args: tuple[Any, ...], proto: int) -> bytes:
    """A call ``module:name(*args)`` by REDUCE."""
    return op_global(module, name, proto) + value_ops(args, proto) + pickle.REDUCE


def item_of(target: bytes, key: Any, value: Any, proto: int) -> bytes:
    """``target[key] = value`` by SETITEM."""
    return target + value_ops(key, proto) + value_ops(value, proto) + pickle.SETITEM
