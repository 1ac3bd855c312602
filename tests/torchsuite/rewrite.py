"""Rewrite the import statements of a PyTorch test file, and nothing else.

Every ``import torch...`` and ``from torch... import ...`` statement, at any depth, becomes a
call into ``torchsuite.shim.imports`` that binds the same names (see that module for what they
resolve to). A rewritten statement keeps its line and indentation, so line numbers in
tracebacks are those of PyTorch's file; the rest of the file is left byte for byte.

Example:
    >>> rewrite_imports("import torch.distributed.rpc as rpc\\n")
    'import torchsuite.shim.imports as _ts; rpc = _ts.module("torch.distributed.rpc")\\n'
"""

from __future__ import annotations

import ast

__all__ = ["rewrite_imports", "statement"]

_PRELUDE = "import torchsuite.shim.imports as _ts; "


def _is_torch(name: str | None) -> bool:
    return name is not None and (name == "torch" or name.startswith("torch."))


def statement(node: ast.Import | ast.ImportFrom) -> str | None:
    """The replacement of one import statement, or None if it imports nothing of torch."""
    if isinstance(node, ast.ImportFrom):
        if node.level or not _is_torch(node.module):
            return None
        if any(alias.name == "*" for alias in node.names):
            raise ValueError(f"line {node.lineno}: 'from {node.module} import *' is not supported")
        targets = ", ".join(alias.asname or alias.name for alias in node.names)
        attrs = ", ".join(f'"{alias.name}"' for alias in node.names)
        return f'{targets}, = _ts.names("{node.module}", {attrs})'
    parts = []
    for alias in node.names:
        if not _is_torch(alias.name):
            if any(_is_torch(a.name) for a in node.names):
                raise ValueError(f"line {node.lineno}: mixed torch and other imports")
            return None
        if alias.asname:
            parts.append(f'{alias.asname} = _ts.module("{alias.name}")')
        else:
            parts.append(f'torch = _ts.root("{alias.name}")')
    return "; ".join(parts)


def rewrite_imports(source: str) -> str:
    """``source`` with every torch import statement rewritten (module docstring)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            new = statement(node)
            if new is not None:
                assert node.end_lineno is not None
                edits.append((node.lineno, node.end_lineno, new))
    for start, end, new in sorted(edits, reverse=True):
        first = lines[start - 1]
        indent = first[: len(first) - len(first.lstrip())]
        padding = ["\n"] * (end - start)  # keep the line numbers of what follows
        lines[start - 1 : end] = [f"{indent}{_PRELUDE}{new}\n", *padding]
    return "".join(lines)
