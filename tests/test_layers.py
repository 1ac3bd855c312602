"""The layers of docs/architecture.md import one way: a test of the source, not of behaviour."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parent.parent / "client"

# L1 (tensors, autograd, nn, optim) and L0 must never reach networking or the runtime.
COMPUTE = [
    "_tensor.py",
    "_tensor_methods.py",
    "_creation.py",
    "_repr.py",
    "_functional.py",
    "_backend.py",
    "_dtypes.py",
    "return_types.py",
    "_ops",
    "autograd",
    "nn",
    "optim",
]
FORBIDDEN_FOR_COMPUTE = (
    "grpc",
    "gradwire._runtime",
    "gradwire._wire",
    "gradwire.distributed",
    "gradwire.server",
    "gradwire._proto",
)
# L2 (wire) serializes only: no sockets, no agent, no server.
FORBIDDEN_FOR_WIRE = (
    "grpc",
    "gradwire._runtime",
    "gradwire.distributed",
    "gradwire.server",
    "socket",
)
# The RRef protocol and the distributed-autograd core are transport-free state machines.
TRANSPORT_FREE = [
    "_runtime/rref_protocol.py",
    "_runtime/rref_owner.py",
    "_runtime/rref_user.py",
    "_runtime/rref_messages.py",
    "_runtime/dist_autograd.py",
]


def _files(entries: list[str]) -> list[Path]:
    out: list[Path] = []
    for e in entries:
        p = CLIENT / e
        out.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    return [p for p in out if p.exists()]


def _imports(source: str, rel: Path) -> set[str]:
    """Absolute names imported by the module at ``rel`` (relative to client/); relative imports
    are resolved to gradwire.*."""
    package = ["gradwire", *rel.with_suffix("").parts[:-1]]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            names.add(mod)
            names.update(f"{mod}.{a.name}" for a in node.names)
    return names


def _violations(sources: dict[Path, str], forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for rel, source in sources.items():
        for name in sorted(_imports(source, rel)):
            if any(name == p or name.startswith(p + ".") for p in forbidden):
                bad.append(f"{rel} imports {name}")
    return bad


@pytest.mark.parametrize(
    ("entries", "forbidden"),
    [
        (COMPUTE, FORBIDDEN_FOR_COMPUTE),
        (["_wire"], FORBIDDEN_FOR_WIRE),
        (TRANSPORT_FREE, ("grpc", "gradwire._proto", "gradwire._wire", "gradwire.server")),
    ],
    ids=["compute", "wire", "transport-free"],
)
def test_layers_import_one_way(entries: list[str], forbidden: tuple[str, ...]) -> None:
    files = _files(entries)
    assert files, f"no files found for {entries}"
    sources = {f.relative_to(CLIENT): f.read_text() for f in files}
    assert _violations(sources, forbidden) == []


def test_the_checker_resolves_relative_imports() -> None:
    probe = {Path("_ops/probe.py"): "from .._runtime import agent\nimport numpy\n"}
    assert _violations(probe, FORBIDDEN_FOR_COMPUTE) == [
        "_ops/probe.py imports gradwire._runtime",
        "_ops/probe.py imports gradwire._runtime.agent",
    ]
