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
# The protocol cores never touch the network: the RRef state machine and the dist-autograd
# container and engine are transport-free; their services (rref/service, calls, fetch, send;
# dist_autograd/service) are the ones that do.
TRANSPORT_FREE = [
    "_runtime/rref/protocol.py",
    "_runtime/rref/owner.py",
    "_runtime/rref/user.py",
    "_runtime/rref/messages.py",
    "_runtime/rref/ids.py",
    "_runtime/rref/value.py",
    "_runtime/rref/views.py",
    "_runtime/rref/errors.py",
    "_runtime/dist_autograd/engine.py",
    "_runtime/util",
]
# The runtime's folders below the agent, which builds and wires them: none imports it.
RUNTIME_FOLDERS = ["calls", "cluster", "dist_autograd", "rref", "transport", "util"]


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
        (
            TRANSPORT_FREE,
            (
                "grpc",
                "gradwire._proto",
                "gradwire._wire",
                "gradwire.server",
                "gradwire._runtime.transport",
            ),
        ),
        ([f"_runtime/{f}" for f in RUNTIME_FOLDERS], ("gradwire._runtime.agent",)),
    ],
    ids=["compute", "wire", "transport-free", "below-the-agent"],
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


def _module_of(rel: Path) -> str:
    parts = ["gradwire", *rel.with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _cycles(sources: dict[Path, str]) -> list[list[str]]:
    """The import cycles among the modules of ``sources`` (every import counts: top-level,
    function-local and type-checking ones), as sorted lists of module names."""
    modules = {_module_of(rel): rel for rel in sources}
    graph: dict[str, set[str]] = {}
    for mod, rel in modules.items():
        graph[mod] = {n for n in _imports(sources[rel], rel) if n in modules and n != mod}
    # Tarjan's strongly connected components.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_runtime_has_no_import_cycle() -> None:
    # Its imports are one-way arrows: the agent on top builds the services; a service imports
    # only what lies below it (docs/architecture.md draws them).
    files = sorted((CLIENT / "_runtime").rglob("*.py"))
    sources = {f.relative_to(CLIENT): f.read_text() for f in files}
    assert _cycles(sources) == []


def test_the_cycle_checker_finds_a_cycle() -> None:
    probe = {
        Path("_runtime/a.py"): "from . import b\n",
        Path("_runtime/b.py"): "def f():\n    from .c import x\n",
        Path(
            "_runtime/c.py"
        ): "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n",
        Path("_runtime/d.py"): "from . import a\n",
    }
    assert _cycles(probe) == [["gradwire._runtime.a", "gradwire._runtime.b", "gradwire._runtime.c"]]
