"""Where PyTorch's RPC tests come from and which of them apply: locate, copy, list, classify.

The test files are read from the installed torch wheel at run time (never checked in), copied
with their imports rewritten (``torchsuite.rewrite``) into ``tests/torchsuite/_work/<impl>/``
(git-ignored). ``not_applicable.toml`` lists the tests that do not apply, in groups with their
reason; ``passing.txt`` is the ratchet of tests that pass on gradwire.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .rewrite import rewrite_imports

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the TOML reader pip vendors
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

__all__ = [
    "SUITES",
    "HERE",
    "Suite",
    "torch_root",
    "prepare",
    "test_names",
    "load_not_applicable",
    "load_ratchet",
]

HERE = Path(__file__).resolve().parent
NOT_APPLICABLE = HERE / "not_applicable.toml"
RATCHET = HERE / "passing.txt"


@dataclass(frozen=True)
class Suite:
    """One test class of PyTorch's RPC tests: the file under ``torch/testing/_internal``."""

    class_name: str
    path: str

    @property
    def module(self) -> str:
        return Path(self.path).stem


SUITES = (
    Suite("RpcTest", "distributed/rpc/rpc_test.py"),
    Suite("DistAutogradTest", "distributed/rpc/dist_autograd_test.py"),
    Suite("DistOptimizerTest", "distributed/rpc/dist_optimizer_test.py"),
    Suite("ParameterServerTest", "distributed/rpc/examples/parameter_server_test.py"),
    Suite(
        "ReinforcementLearningRpcTest",
        "distributed/rpc/examples/reinforcement_learning_rpc_test.py",
    ),
)

_FIND_TORCH = (
    "import importlib.util, os; spec = importlib.util.find_spec('torch'); "
    "print(os.path.join(spec.submodule_search_locations[0], 'testing', '_internal'))"
)


def torch_root(python: str | None = None) -> Path:
    """``torch/testing/_internal`` of the torch that ``python`` (or the oracle's) imports.

    Raises:
        RuntimeError: no interpreter with torch (set ``GRADWIRE_TORCH_PYTHON``).
    """
    if python is None:
        sys.path.insert(0, str(HERE.parent))
        from torch_oracle import torch_python

        python = torch_python()
    if python is None:
        raise RuntimeError(
            "PyTorch's RPC tests are read from an installed torch: pip install torch==2.13.0, "
            "or set GRADWIRE_TORCH_PYTHON to an interpreter that has it"
        )
    out = subprocess.run([python, "-c", _FIND_TORCH], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def prepare(impl: str, root: Path) -> Path:
    """Copy the suites' files from ``root`` with their imports rewritten; returns the folder."""
    work = HERE / "_work" / impl
    work.mkdir(parents=True, exist_ok=True)
    for suite in SUITES:
        source = (root / suite.path).read_text()
        (work / f"{suite.module}.py").write_text(rewrite_imports(source))
    return work


def test_names(source: str, class_name: str) -> list[str]:
    """The ``test_*`` methods defined in ``class_name`` of a test file, in file order."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return [
                item.name
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                and item.name.startswith("test_")
            ]
    raise LookupError(f"no class {class_name} in the test file")


def all_tests(root: Path) -> list[str]:
    """Every test of the suites, as ``Class.test_name``."""
    return [
        f"{suite.class_name}.{name}"
        for suite in SUITES
        for name in test_names((root / suite.path).read_text(), suite.class_name)
    ]


def load_not_applicable(path: Path = NOT_APPLICABLE) -> dict[str, str]:
    """``Class.test_name`` -> the reason of its group, from the reviewed not-applicable file.

    Raises:
        ValueError: a group without a name, reason or tests, or a test listed twice.
    """
    data = tomllib.loads(path.read_text())
    out: dict[str, str] = {}
    for group in data.get("group", []):
        name, reason, tests = group.get("name"), group.get("reason"), group.get("tests")
        if not name or not reason or not tests:
            raise ValueError(f"group {name!r}: needs a name, a reason and a list of tests")
        for test in tests:
            if test.count(".") != 1 or test in out:
                raise ValueError(f"group {name!r}: {test!r} is malformed or listed twice")
            out[test] = f"{name}: {reason}"
    return out


def load_ratchet(path: Path = RATCHET) -> list[str]:
    """The tests listed as passing on gradwire (one ``Class.test_name`` a line, ``#`` comments)."""
    if not path.exists():
        return []
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            if line.count(".") != 1:
                raise ValueError(f"{path.name}: {line!r} is not Class.test_name")
            names.append(line)
    return names


def worker_env(impl: str, work: Path) -> dict[str, str]:
    """The environment of a test process: the generated files and the shim importable."""
    paths = [str(work), str(HERE.parent), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "TORCHSUITE_IMPL": impl,
        "PYTHONPATH": os.pathsep.join(filter(None, paths)),
    }
