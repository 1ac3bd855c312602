"""The torchsuite harness itself: import rewriting, the name mapping, the reviewed lists, the
per-test process runner (deadline, kills). The suite proper runs with ``python -m torchsuite``."""

from __future__ import annotations

import ast
import os
import textwrap
from pathlib import Path

import pytest

from torchsuite import suite
from torchsuite.rewrite import rewrite_imports
from torchsuite.runner import run_test
from torchsuite.shim import imports

SOURCE = textwrap.dedent(
    """\
    import os
    import torch
    import torch.distributed.rpc as rpc
    from torch.distributed.rpc import (
        RRef,
        _no_such_name as renamed,
    )
    import torch.testing._internal.dist_utils
    from torch.testing._internal.dist_utils import dist_init, worker_name


    def body():
        import torch.distributed.autograd as dist_autograd
        return torch.ones(2), os.sep, dist_autograd
    """
)


def test_rewrite_touches_only_torch_imports_and_keeps_line_numbers() -> None:
    out = rewrite_imports(SOURCE)
    assert len(out.splitlines()) == len(SOURCE.splitlines())
    for old, new in zip(SOURCE.splitlines(), out.splitlines(), strict=True):
        if "torch" not in old and old.strip() not in ("RRef,", "_no_such_name as renamed,", ")"):
            assert new == old
    assert 'rpc = _ts.module("torch.distributed.rpc")' in out
    assert 'RRef, renamed, = _ts.names("torch.distributed.rpc", "RRef", "_no_such_name")' in out
    assert "\n    import torchsuite.shim.imports as _ts; dist_autograd = _ts.module(" in out
    ast.parse(out)
    with pytest.raises(ValueError, match="import \\*"):
        rewrite_imports("from torch import *\n")


def test_rewritten_imports_bind_gradwire_and_the_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    import gradwire
    import gradwire.distributed.rpc as gw_rpc

    monkeypatch.setattr(imports, "IMPL", "gradwire")
    namespace: dict[str, object] = {}
    exec(compile(rewrite_imports(SOURCE), "rewritten", "exec"), namespace)
    torch = namespace["torch"]
    assert namespace["rpc"] is gw_rpc and namespace["RRef"] is gw_rpc.RRef
    assert torch.ones is gradwire.ones  # type: ignore[attr-defined]
    assert namespace["worker_name"](3) == "worker3"  # type: ignore[operator]
    assert torch.testing._internal.dist_utils.worker_name is namespace["worker_name"]  # type: ignore[attr-defined]
    missing = namespace["renamed"]
    assert isinstance(missing, imports.Missing)
    with pytest.raises(imports.MissingInGradwire, match="_no_such_name"):
        missing()  # type: ignore[operator]
    with pytest.raises(imports.NotApplicable, match="TorchScript"):
        torch.jit.script(lambda: None)()  # type: ignore[attr-defined]


def test_not_applicable_file_is_grouped_with_reasons() -> None:
    data = suite.tomllib.loads(suite.NOT_APPLICABLE.read_text())
    groups = data["group"]
    assert {g["name"] for g in groups} >= {
        "torchscript",
        "profiler-kineto",
        "profiler-private",
        "c10d",
    }
    listed = suite.load_not_applicable()
    assert sum(len(g["tests"]) for g in groups) == len(listed)
    assert all(reason.split(": ", 1)[1] for reason in listed.values())


def test_not_applicable_rejects_malformed_groups(tmp_path: Path) -> None:
    path = tmp_path / "na.toml"
    path.write_text('[[group]]\nname = "x"\ntests = ["A.test_a"]\n')
    with pytest.raises(ValueError, match="reason"):
        suite.load_not_applicable(path)
    path.write_text('[[group]]\nname = "x"\nreason = "r"\ntests = ["A.test_a", "A.test_a"]\n')
    with pytest.raises(ValueError, match="twice"):
        suite.load_not_applicable(path)


def test_ratchet_parsing(tmp_path: Path) -> None:
    path = tmp_path / "passing.txt"
    path.write_text("# comment\nRpcTest.test_add  # trailing\n\nDistAutogradTest.test_x\n")
    assert suite.load_ratchet(path) == ["RpcTest.test_add", "DistAutogradTest.test_x"]
    path.write_text("test_add\n")
    with pytest.raises(ValueError, match="Class.test_name"):
        suite.load_ratchet(path)
    listed = suite.load_ratchet()
    assert len(listed) == len(set(listed))
    assert not set(listed) & set(suite.load_not_applicable())


def test_test_names_come_from_the_class_only() -> None:
    source = "class A:\n    def test_a(self): ...\n    def helper(self): ...\nclass B:\n    def test_b(self): ...\n"
    assert suite.test_names(source, "A") == ["test_a"]
    with pytest.raises(LookupError):
        suite.test_names(source, "C")


FAKE_SUITE = textwrap.dedent(
    """\
    import os, time, unittest

    class FakeTest:
        def test_ok(self):
            assert 0 <= self.rank < 4 and os.environ["TORCHSUITE_SCRATCH"]

        def test_rank2_raises(self):
            if self.rank == 2:
                raise ValueError("rank 2 fails")
            time.sleep(60)  # the others are killed soon after rank 2 failed

        def test_hang(self):
            time.sleep(60)

        def test_skip(self):
            raise unittest.SkipTest("not here")
    """
)


def test_runner_passes_fails_skips_and_kills_at_the_deadline(tmp_path: Path) -> None:
    (tmp_path / "fake_suite.py").write_text(FAKE_SUITE)
    env = suite.worker_env("gradwire", tmp_path)
    assert run_test("FakeTest.test_ok", "fake_suite", env, 60).status == "passed"
    failed = run_test("FakeTest.test_rank2_raises", "fake_suite", env, 60)
    assert failed.status == "failed" and "rank 2 fails" in failed.detail and failed.seconds < 30
    hung = run_test("FakeTest.test_hang", "fake_suite", env, 2)
    assert hung.status == "timeout" and hung.seconds < 20
    assert run_test("FakeTest.test_skip", "fake_suite", env, 60).status == "skipped"
    assert os.environ.get("TORCHSUITE_SCRATCH") is None
