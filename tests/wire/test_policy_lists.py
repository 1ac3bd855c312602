"""The reviewed lists of the default policy: complete, resolvable, and what the policy enforces.

When NumPy or gradwire gains a public callable, ``test_every_public_callable_is_reviewed`` fails
and names it: add it to ``ALLOWED`` or ``REFUSED`` in ``client/_wire/policy_lists.py``.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import pickle
import sys
import types
from typing import Any

import numpy as np
import pytest
from gradwire._wire import policy_lists
from gradwire._wire.policy import CallablePolicy, Verdict, default_objects

POLICY = CallablePolicy()
SERIES = policy_lists.numpy_series(np.__version__)
REVIEWED = SERIES in policy_lists.REVIEWED_NUMPY
#: the releases installed here, as policy_lists.ABSENT names them
INSTALLED = (f"numpy {SERIES}", "python {}.{}".format(*sys.version_info[:2]))
ABSENT_HERE: frozenset[str] = frozenset().union(
    *(names for release, names in policy_lists.ABSENT.items() if release in INSTALLED)
)


_MISSING = object()


def _lookup(full: str) -> Any:
    """The object ``module:qualname`` names, or ``_MISSING``."""
    module, _, qualname = full.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return _MISSING
    return obj


def _resolves(full: str) -> bool:
    return _lookup(full) is not _MISSING


def _classified(full: str) -> bool:
    if full in policy_lists.ALLOWED or full in policy_lists.REFUSED:
        return True
    return any(fnmatch.fnmatchcase(full, p) for p in policy_lists.REFUSED if p.endswith("*"))


def _public_callables(namespaces: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ns in namespaces:
        module = importlib.import_module(ns)
        names = getattr(module, "__all__", None) or dir(module)
        for name in names:
            if name.startswith("_"):
                continue
            try:
                value = getattr(module, name)
            except AttributeError:
                continue
            if callable(value) and not isinstance(value, types.ModuleType):
                out[f"{ns}:{name}"] = value
    return out


def _refused_objects() -> set[int]:
    ids = set()
    for full in policy_lists.REFUSED:
        obj = _lookup(full)
        if obj is not _MISSING:
            ids.add(id(getattr(obj, "__func__", obj)))
    return ids


def _public_members(prefix: str, cls: type) -> list[str]:
    """``prefix.name`` for each public method that a NumPy or gradwire class has and that is
    not already classified as the same object under another name (inherited methods)."""
    known = set(default_objects()[0]) | _refused_objects()
    out = []
    for name in dir(cls):
        if name.startswith("_"):
            continue
        owner = next((k for k in cls.__mro__ if name in k.__dict__), None)
        if owner is None or not owner.__module__.startswith(("numpy", "gradwire")):
            continue
        raw = owner.__dict__[name]
        if isinstance(raw, property) or type(raw).__name__ in (
            "getset_descriptor",
            "member_descriptor",
        ):
            continue
        member = getattr(cls, name, None)
        if callable(member) and id(getattr(member, "__func__", member)) not in known:
            out.append(f"{prefix}.{name}")
    return out


@pytest.mark.skipif(not REVIEWED, reason="the lists were reviewed against another NumPy series")
def test_every_public_callable_is_reviewed() -> None:
    surface = _public_callables(policy_lists.NUMPY_NAMESPACES + policy_lists.GRADWIRE_NAMESPACES)
    assert len(surface) > 900  # the walk really saw NumPy and gradwire
    missing = sorted(name for name in surface if not _classified(name))
    for full in sorted(surface):
        value = surface[full]
        if isinstance(value, type) and full in policy_lists.ALLOWED:
            missing += [m for m in _public_members(full, value) if not _classified(m)]
    assert not missing, (
        "public callables in neither ALLOWED nor REFUSED of client/_wire/policy_lists.py "
        f"(review each): {missing}"
    )


@pytest.mark.skipif(not REVIEWED, reason="the lists were reviewed against another NumPy series")
def test_every_listed_name_resolves_and_the_lists_do_not_overlap() -> None:
    listed = policy_lists.ALLOWED | policy_lists.ENTRY_POINTS
    unresolved = sorted(full for full in listed if not _resolves(full))
    # a name may be missing only where ABSENT says this NumPy or Python lacks it ...
    assert [full for full in unresolved if full not in ABSENT_HERE] == []
    # ... and ABSENT says so only where it is true
    assert sorted(ABSENT_HERE) == [full for full in unresolved if full in ABSENT_HERE]
    assert not policy_lists.ALLOWED & policy_lists.REFUSED
    assert not [a for a in policy_lists.ALLOWED if _classified(a) and a in policy_lists.REFUSED]


def test_the_absent_table_names_listed_names_of_supported_releases() -> None:
    supported_pythons = {f"python 3.{minor}" for minor in range(10, 14)}
    for release, names in policy_lists.ABSENT.items():
        kind, _, series = release.partition(" ")
        assert (kind == "numpy" and series in policy_lists.REVIEWED_NUMPY) or (
            release in supported_pythons
        ), release
        assert names and names <= policy_lists.ALLOWED, release


def test_numpy_series_of_a_version() -> None:
    assert policy_lists.numpy_series("2.4.6") == "2.4"
    assert policy_lists.numpy_series("2.2.0rc1") == "2.2"
    assert policy_lists.numpy_series("3.0") == "3.0"


DTYPE_NAMES = sorted(
    "bool cdouble cfloat complex128 complex64 double float float16 float32 float64 half int "
    "int16 int32 int64 int8 long uint8".split()
)


def test_private_names_are_allowed_only_where_listed_one_by_one() -> None:
    private = sorted(
        full
        for full in policy_lists.ALLOWED
        if any(p.startswith("_") for p in full.replace(":", ".").split("."))
    )
    assert private == [
        "copyreg:_reconstructor",
        # gradwire's dtype objects: values that pickle by name, nothing to call
        *(f"gradwire._dtypes:{n}" for n in DTYPE_NAMES),
        "gradwire._runtime.rref.errors:RRefProtocolError",
        "gradwire._runtime.rref.errors:UnknownRRefError",
        # profile_cluster's start and stop on each worker (issue 40)
        "gradwire.distributed.profile:_start_on_worker",
        "gradwire.distributed.profile:_stop_on_worker",
        # the leader's side of PyTorch's rpc.api._all_gather / _barrier (issue 25)
        "gradwire.distributed.rpc._gather:_deliver_round",
        "gradwire.distributed.rpc._gather:_gather_put",
        "gradwire.nn:Module.__call__",
        "numpy._core.multiarray:_reconstruct",
        "numpy._core.multiarray:scalar",
        "numpy._core.numeric:_frombuffer",
    ]
    # gradwire's private modules are never the program's own code, even from a source checkout.
    for module, name in [
        ("gradwire.multiprocessing._segment", "NamedHandle"),
        ("gradwire.multiprocessing._shm_manager", "ShmManager"),
        ("gradwire._runtime.agent", "Agent"),
        ("gradwire._tensor", "_rebuild_tensor"),
        ("gradwire.distributed.rpc.api", "_invoke"),
    ]:
        assert POLICY.name_verdict(module, name) is Verdict.REFUSED, (module, name)


def test_every_allowed_name_is_allowed_and_every_refused_one_refused() -> None:
    objects, _ = default_objects()
    for full in policy_lists.ALLOWED:
        module, _, qualname = full.partition(":")
        try:
            obj, verdict = POLICY.resolve_with_verdict(module, qualname)
        except Exception as exc:  # noqa: BLE001 - a name of another NumPy release
            if REVIEWED and full not in ABSENT_HERE:
                raise AssertionError(f"{full}: {exc}") from exc
            continue
        assert verdict is Verdict.DEFAULT, full
    for full in policy_lists.REFUSED:
        if full.endswith("*"):
            continue
        module, _, qualname = full.partition(":")
        assert not POLICY.allows(module, qualname) or _refused_object(module, qualname), full
    assert len(objects) > 800


def _refused_object(module: str, qualname: str) -> bool:
    try:
        POLICY.resolve(module, qualname)
    except Exception:  # noqa: BLE001 - refused (PolicyError) or absent here
        return True
    return False


@pytest.mark.parametrize(
    "full",
    [
        # processes, sockets, shared memory, other workers, the CLI: refused by name and object
        "gradwire.multiprocessing:spawn",
        "gradwire.multiprocessing:start_processes",
        "gradwire.multiprocessing:Process",
        "gradwire.multiprocessing:Pipe",
        "gradwire.multiprocessing:Manager",
        "gradwire.distributed.rpc:init_rpc",
        "gradwire.distributed.rpc:shutdown",
        "gradwire.distributed.rpc:rpc_sync",
        "gradwire.distributed.rpc:remote",
        "gradwire.distributed.optim:DistributedOptimizer",
        "gradwire.cli:main",
        "gradwire.server.cli.worker:main",
        "gradwire:Tensor.share_memory_",
        "gradwire:Tensor.register_hook",
        "gradwire.futures:Future.then",
        "numpy:load",
        "numpy:save",
        "numpy:fromfile",
        "numpy:memmap",
        "numpy:genfromtxt",
        "numpy:ndarray.tofile",
        "numpy:ndarray.dump",
        "numpy:float64.tofile",
        "numpy.lib.stride_tricks:as_strided",
        "numpy.lib.array_utils:byte_bounds",
        "numpy:seterrcall",
        "numpy:bmat",
        "numpy.testing:assert_equal",
        "builtins:str.format",
        "builtins:eval",
        "builtins:getattr",
        "builtins:open",
        "builtins:print",
        "builtins:id",
        "builtins:object.__subclasses__",
    ],
)
def test_host_touching_and_escape_names_are_refused(full: str) -> None:
    module, _, qualname = full.partition(":")
    assert _refused_object(module, qualname), full


def test_a_listed_name_must_be_the_listed_object() -> None:
    # A program module that rebinds a listed name to something else does not inherit the
    # listing: the object is judged by its own origin.
    fake = types.ModuleType("fake_numpy_alias")
    fake.sum = np.load  # type: ignore[attr-defined]
    assert POLICY.verdict_of(np.sum) is Verdict.DEFAULT
    assert POLICY.verdict_of(fake.sum) is Verdict.REFUSED  # type: ignore[attr-defined]
    assert POLICY.verdict_of(np.zeros(2).sum) is Verdict.DEFAULT  # a bound builtin method
    assert POLICY.verdict_of(inspect.getattr_static) is Verdict.REFUSED


def test_user_allow_patterns_and_trust_open_the_policy() -> None:
    assert CallablePolicy(allow=("json",)).name_verdict("json", "dumps") is Verdict.USER
    assert CallablePolicy(trust_everything=True).verdict_of(np.load) is Verdict.TRUSTED
    # the deny list wins over a pattern that opens all of NumPy
    assert not CallablePolicy(allow=("numpy.*", "numpy")).allows("numpy", "load")
    assert not CallablePolicy(allow=("numpy.*", "numpy")).allows(
        "numpy.lib.stride_tricks", "as_strided"
    )


def test_a_user_pattern_runs_a_listed_name_unguarded() -> None:
    # "not a user-allowed module": what the user opened runs as the program's own code does
    opened = CallablePolicy(allow=("numpy", "numpy.*"))
    assert opened.resolve_with_verdict("numpy", "sum")[1] is Verdict.USER
    assert opened.verdict_of(np.zeros(2).sum) is Verdict.USER
    assert POLICY.resolve_with_verdict("numpy", "sum")[1] is Verdict.DEFAULT
    assert opened.resolve_member(np.zeros(2), "sum")[1] is Verdict.USER
    assert not opened.allows("numpy", "load")  # the deny list still wins


def test_gradwires_dtypes_travel_as_arguments() -> None:
    """A dtype pickles as a global of gradwire._dtypes; the callee's policy lets it through."""
    import pickletools

    import gradwire as gw

    for name in ("float64", "float32", "int64", "bool", "complex64"):
        dt = getattr(gw, name)
        globals_in_pickle = [
            arg for op, arg, _ in pickletools.genops(pickle.dumps(dt)) if isinstance(arg, str)
        ]
        assert globals_in_pickle == ["gradwire._dtypes", name]
        obj, verdict = POLICY.resolve_with_verdict("gradwire._dtypes", name)
        assert obj is dt and verdict is Verdict.DEFAULT
