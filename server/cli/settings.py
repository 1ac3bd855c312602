"""Flags that also read an environment variable: one table, used by every gradwire command.

Every setting has a flag (``--rank``) and a variable (``GRADWIRE_RANK``); the flag wins. Values
from the environment are converted and checked like flags, and a bad one is reported with the
variable's name, so a compose file or a Kubernetes manifest needs no command line.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ConfigError", "Setting", "add_settings", "resolve_settings", "parse_bool"]


class ConfigError(ValueError):
    """A flag or GRADWIRE_* variable is missing, malformed or inconsistent (exit code 2)."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_bool(text: str) -> bool:
    """``1/true/yes/on`` -> True, ``0/false/no/off/""`` -> False.

    Raises:
        ValueError: anything else.
    """
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"{text!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def _parse_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


@dataclass(frozen=True)
class Setting:
    """One flag with its environment variable.

    Args:
        dest: attribute name in the resolved namespace.
        flag: the long flag, ``--rank``.
        env: the variable, ``GRADWIRE_RANK``.
        help: help text (the variable's name is appended).
        convert: text -> value (``int``, ``float``, ``str``, ``parse_bool``, ...).
        default: value when neither flag nor variable is given.
        kind: ``"value"``, ``"bool"`` (a switch; the variable takes 1/0) or ``"list"``
            (repeatable flag; the variable is comma-separated).
        choices: allowed values (checked after conversion).
        metavar: shown in the help.
    """

    dest: str
    flag: str
    env: str
    help: str
    convert: Callable[[str], Any] = str
    default: Any = None
    kind: str = "value"
    choices: tuple[Any, ...] | None = None
    metavar: str | None = None


def add_settings(parser: argparse.ArgumentParser, settings: Iterable[Setting]) -> None:
    """Add one flag per setting to ``parser`` (defaults stay None so the variable can apply)."""
    for s in settings:
        text = f"{s.help} [env {s.env}]"
        if s.default not in (None, False, []):
            text += f" (default {s.default})"
        if s.kind == "bool":
            parser.add_argument(
                s.flag, dest=s.dest, action="store_const", const="1", default=None, help=text
            )
        elif s.kind == "list":
            parser.add_argument(
                s.flag, dest=s.dest, action="append", default=None, metavar=s.metavar, help=text
            )
        else:
            parser.add_argument(s.flag, dest=s.dest, default=None, metavar=s.metavar, help=text)


def _convert(s: Setting, raw: str, source: str) -> Any:
    try:
        value = parse_bool(raw) if s.kind == "bool" else s.convert(raw)
    except ValueError as exc:
        raise ConfigError(f"{source}={raw!r}: {exc}") from None
    if s.choices is not None and value not in s.choices:
        allowed = ", ".join(str(c) for c in s.choices)
        raise ConfigError(f"{source}={raw!r}: must be one of {allowed}")
    return value


def resolve_settings(
    args: argparse.Namespace, settings: Iterable[Setting], environ: Mapping[str, str]
) -> dict[str, tuple[Any, str]]:
    """Flag, else variable, else default, for each setting.

    Args:
        args: the parsed command line (flags left at None were not given).
        settings: the table.
        environ: the environment (``os.environ``).

    Returns:
        ``dest -> (value, source)`` where source is ``"--flag"``, ``"$VAR"`` or ``"default"``.

    Raises:
        ConfigError: a value does not convert or is not among the choices.
    """
    out: dict[str, tuple[Any, str]] = {}
    for s in settings:
        given = getattr(args, s.dest, None)
        if given is not None:
            if s.kind == "list":
                items = [i for g in given for i in _parse_list(g)]
                out[s.dest] = ([_convert(s, i, s.flag) for i in items], s.flag)
            else:
                out[s.dest] = (_convert(s, given, s.flag), s.flag)
            continue
        raw = environ.get(s.env)
        if raw is not None and (raw.strip() or s.kind == "list"):
            if s.kind == "list":
                out[s.dest] = ([_convert(s, i, f"${s.env}") for i in _parse_list(raw)], f"${s.env}")
            else:
                out[s.dest] = (_convert(s, raw.strip(), f"${s.env}"), f"${s.env}")
            continue
        default = list(s.default or []) if s.kind == "list" else s.default
        out[s.dest] = (default, "default")
    return out
