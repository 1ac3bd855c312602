"""Every CuPy name and call in gradwire's code, checked against the installed (real) CuPy.

The CuPy stand-in (tests/fake_cupy) answers whatever gradwire asks, so a call real CuPy rejects,
such as ``xp.indices(shape, sparse=True)`` (CuPy's ``indices`` has no ``sparse``), passes there
and fails only on a GPU. These tests need no device: they walk client/ for attribute chains rooted
at the array module, look each dotted name up on ``cupy`` and bind each call's literal arguments
to CuPy's signature (``inspect.signature``, or the signature line that CuPy's Cython functions put
first in their docstring). Method calls on arrays (``arr.sum()``) are not rooted at the module
and are out of scope.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from .cupy_reference import Use, bind_problem, package_sources, resolve, walk

# Calls rooted at the module that cannot be bound statically, (file, dotted path) -> why. Keep
# it empty unless there is a real reason (none today); an entry with no call left fails.
ALLOWED_UNBINDABLE: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def cupy() -> Any:
    """The installed CuPy, even while a test elsewhere has the stand-in in sys.modules."""
    shown = sys.modules.get("cupy")
    if shown is not None and shown.__name__ == "cupy":
        return shown
    sys.modules.pop("cupy", None)
    try:
        return pytest.importorskip("cupy", reason="real CuPy is not installed")
    finally:
        if shown is not None:
            sys.modules["cupy"] = shown


@pytest.fixture(scope="module")
def walked() -> tuple[list[Use], list[str], list[str]]:
    return walk(package_sources())


def test_the_walk_finds_gradwires_cupy_call_sites(walked: Any) -> None:
    uses, _, _ = walked
    calls = {(u.file, u.path) for u in uses if u.args is not None}
    assert len(calls) > 30, f"only {len(calls)} array-module calls found: is the walk broken?"
    known = {
        ("client/_tensor_scatter.py", "broadcast_to"),  # xp = array_module(idx); xp.f(...)
        ("client/_ops/unary.py", "exp"),  # array_module(x._data).exp(...)
        ("client/_ops/reduce.py", "argmax"),  # fn = xp.argmax if largest else ...; fn(...)
        ("client/_ops/binary.py", "less_equal"),  # getattr(array_module(a), self._FNS[op])
        ("client/multiprocessing/_cuda_ipc.py", "cuda.runtime.memcpyAsync"),  # cp = _cupy()
    }
    assert known <= calls, f"the walk misses {sorted(known - calls)}"


def test_every_array_module_binding_is_unambiguous(walked: Any) -> None:
    _, dynamic, ambiguous = walked
    assert not ambiguous, "\n".join(["array module names the walk cannot trust:", *ambiguous])
    assert not dynamic, "\n".join(["calls whose CuPy name is not static:", *dynamic])


def test_every_cupy_name_gradwire_uses_exists(cupy: Any, walked: Any) -> None:
    uses, _, _ = walked
    missing = []
    for u in uses:
        try:
            resolve(cupy, u.path)
        except AttributeError:
            missing.append(f"{u.where}: {u.source}: real CuPy has no cupy.{u.path}")
    assert not missing, "\n".join([f"{len(missing)} names real CuPy lacks:", *missing])


def test_every_cupy_call_binds_to_real_cupys_signature(cupy: Any, walked: Any) -> None:
    uses, _, _ = walked
    problems, used_allowances = [], set()
    for u in uses:
        if u.args is None:
            continue
        if (u.file, u.path) in ALLOWED_UNBINDABLE:
            used_allowances.add((u.file, u.path))
            continue
        try:
            problem = bind_problem(cupy, u)
        except AttributeError:
            continue  # reported by test_every_cupy_name_gradwire_uses_exists
        if problem is not None:
            problems.append(f"{u.where}: {u.source}\n    {problem}")
    stale = set(ALLOWED_UNBINDABLE) - used_allowances
    assert not stale, f"ALLOWED_UNBINDABLE entries with no call left: {sorted(stale)}"
    assert not problems, "\n".join([f"{len(problems)} calls real CuPy rejects:", *problems])


def test_the_check_catches_keywords_cupy_lacks(cupy: Any) -> None:
    src = (
        "from ._backend import array_module\n"
        "def grid(idx, dev, c):\n"
        "    xp = array_module(idx)\n"
        "    mod = module_for(dev)\n"
        "    mod.add.at(idx, idx, 1)\n"
        "    fn = xp.argmax if c else xp.argmin\n"
        "    fn(idx, axis=0, keepdims=True)\n"
        "    (xp.argmax if c else xp.argmin)(idx, keepdim=True)\n"
        "    return xp.indices(idx.shape, sparse=True)\n"
        "def module_for(dev):\n"
        "    return array_module(dev)\n"
    )
    uses, dynamic, ambiguous = walk({"client/example.py": src})
    assert not dynamic and not ambiguous
    problems = {(u.line, u.path): bind_problem(cupy, u) for u in uses if u.args is not None}
    assert sorted(problems) == [
        (5, "add.at"),
        (7, "argmax"),
        (7, "argmin"),
        (8, "argmax"),
        (8, "argmin"),
        (9, "indices"),
    ]
    wrong = {at: p for at, p in problems.items() if p is not None}
    assert sorted(wrong) == [(8, "argmax"), (8, "argmin"), (9, "indices")], wrong
    assert "'keepdim'" in str(wrong[8, "argmax"]) and "'sparse'" in str(wrong[9, "indices"])


def test_the_walk_reports_what_it_cannot_follow() -> None:
    src = (
        "def f(x, name):\n"
        "    xp = array_module(x)\n"
        "    xp = x.copy()\n"
        "    return getattr(xp, name)(x)\n"
    )
    uses, dynamic, ambiguous = walk({"client/example.py": src})
    assert uses == [] and len(dynamic) == 1 and "name" in dynamic[0], dynamic
    assert len(ambiguous) == 1 and "'xp'" in ambiguous[0], ambiguous
