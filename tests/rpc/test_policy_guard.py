"""The guard behind the default policy, over real gRPC: nothing a peer makes a worker run through
the default lists reaches a file, a process or a socket.

- Every callable the default lists allow is called through rpc with arguments made from its
  signature to read or write files, start processes and connect sockets.
- Random members of remote values of every default-allowed type, with random arguments.
- A file-touching function slipped into the default lists (as a future release might add one) is
  stopped by the guard itself, and runs when the guard is off.

Escapes are detected from outside the guard: files created or read in a watched directory, a
listening socket that got a connection, child processes, and an audit hook installed after the
guard's that records any outside-reaching event the guard let pass on a guarded thread.
"""

from __future__ import annotations

import builtins
import inspect
import operator
import os
import random
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradwire as gw
import numpy as np
import pytest
from gradwire import errors
from gradwire._wire import guard, policy
from gradwire._wire.policy import Verdict
from gradwire.distributed import rpc
from gradwire.distributed.rpc.rref import _call_method

from .conftest import solo_options

# The crafted arguments make NumPy warn (a path where a flag belongs); the warnings are expected.
pytestmark = pytest.mark.filterwarnings("ignore")

_WATCHED = ("open", "os.system", "subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec")
_WATCHED += ("socket.connect", "socket.bind", "os.remove", "os.rename", "os.mkdir", "shutil.")
_escapes: list[str] = []


def _recorder(event: str, args: tuple[Any, ...]) -> None:
    if guard.is_active() and event.startswith(_WATCHED) and not guard._library_event(event, args):
        _escapes.append(f"{event} {args[:2]!r}")


class Probe:
    """A watched directory with a readable secret, a listening socket and a child count."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.secret = root / "secret.txt"
        self.secret.write_text("cluster-token-stand-in")
        self.marker = root / "marker"
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.listener.setblocking(False)
        self.address = self.listener.getsockname()
        self.files = sorted(p.name for p in root.iterdir())
        self.children = _children()

    def values(self) -> list[Any]:
        """Argument values made to reach outside: paths, commands, an address."""
        return [
            str(self.secret),
            str(self.marker),
            f"touch {self.marker}",
            ["touch", str(self.marker)],
            self.address,
            f"http://{self.address[0]}:{self.address[1]}/",
        ]

    def assert_nothing_escaped(self, after: str = "") -> None:
        files = sorted(p.name for p in self.root.iterdir())
        assert files == self.files, f"a file was created {after}"
        with pytest.raises(BlockingIOError):
            self.listener.accept()  # nobody connected
        assert _children() <= self.children, f"a process was started {after}"
        assert not _escapes, (after, _escapes)


def _children() -> set[int]:
    me = str(os.getpid())
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[1] == me:
                out.add(int(entry))
    return out


@pytest.fixture(scope="module")
def solo_guarded() -> Iterator[None]:
    rpc.init_rpc("solo", 0, 1, solo_options(use_unix_socket=False, rpc_timeout=10.0))
    guard.install()
    sys.addaudithook(_recorder)  # after the guard's hook: sees only what the guard let pass
    try:
        yield
    finally:
        rpc.shutdown(graceful=False)


@pytest.fixture()
def probe(tmp_path: Path, solo_guarded: None) -> Iterator[Probe]:
    _escapes.clear()
    p = Probe(tmp_path)
    try:
        yield p
    finally:
        p.listener.close()


def _allowed_functions() -> list[tuple[str, Any]]:
    """Every callable the default lists allow by name (module-level: functions and classes)."""
    out = []
    for obj, verdict in policy.default_objects()[0].values():
        if verdict is not Verdict.DEFAULT or inspect.ismethoddescriptor(obj):
            continue
        origin = policy.origin_of(obj)
        if origin is None or "." in origin[1]:
            continue  # members are reached through values (the fuzz case below)
        out.append((f"{origin[0]}:{origin[1]}", obj))
    for name in sorted(policy.SAFE_BUILTINS):  # allowed by rule, not by list
        value = getattr(builtins, name, None)
        if callable(value):
            out.append((f"builtins:{name}", value))
    return sorted(out, key=lambda item: item[0])


def _crafted_args(fn: Any, values: list[Any]) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Calls that put each reaching value in every parameter the signature has."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)] or [
        None,
        None,
    ]
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    for value in values:
        calls.append(((value,), {}))
        calls.append((tuple(value for _ in positional[:3]), {}))
        for p in params:
            if p.kind is p.KEYWORD_ONLY:
                calls.append(((), {p.name: value}))
    return calls


def test_every_default_allowed_callable_stays_inside_the_process(probe: Probe) -> None:
    functions = _allowed_functions()
    assert len(functions) > 550  # NumPy, gradwire, the safe builtins' classes, math, operator
    values = probe.values()
    calls = 0
    for name, fn in functions:
        # A function's calls go out together (rpc_async, many in flight) and are all answered
        # before the probe looks: what one of them might have started is seen right there.
        futures = []
        for args, kwargs in _crafted_args(fn, values):
            try:
                futures.append(rpc.rpc_async("solo", fn, args, kwargs, timeout=10))
            except Exception:  # noqa: BLE001 - refused before sending (cannot be sent)
                pass
            calls += 1
        for fut in futures:
            try:
                fut.wait()
            except errors.RpcTimeoutError:
                raise
            except Exception:  # noqa: BLE001 - refusals and TypeErrors are both fine here
                pass
        probe.assert_nothing_escaped(f"after calls of {name}")
    assert calls > 5000
    assert rpc.rpc_sync("solo", operator.add, (1, 2)) == 3


def _values_of_every_default_type() -> list[Any]:
    return [
        np.arange(6.0).reshape(2, 3),
        np.float64(2.5),
        np.int32(7),
        gw.arange(4.0),
        gw.nn.Linear(2, 2),
        gw.optim.SGD(gw.nn.Linear(2, 1).parameters(), lr=0.1),
        [3, 1, 2],
        {"a": 1},
        "text",
        b"bytes",
        (1, 2),
        {1, 2},
        3.5,
        7,
    ]


def test_fuzz_random_members_of_remote_values(probe: Probe) -> None:
    seed = int(os.environ.get("GRADWIRE_FUZZ_SEED", "1729"))
    rng = random.Random(seed)
    values = _values_of_every_default_type()
    reaching = probe.values()
    arg_pool: list[Any] = [*reaching, 0, 1, -1, 2, None, 1.5, "x", (0,), np.zeros(2), [0, 1]]
    calls = refused = 0
    for _ in range(int(os.environ.get("GRADWIRE_POLICY_FUZZ_CALLS", "1500"))):
        value = rng.choice(values)
        names = dir(value)
        name = rng.choice(names)
        args = tuple(rng.choice(arg_pool) for _ in range(rng.randint(0, 3)))
        try:
            rpc.rpc_sync("solo", _call_method, (name, rpc.RRef(value), *args), timeout=10)
        except errors.PolicyError:
            refused += 1
        except errors.RpcTimeoutError:
            raise
        except Exception:  # noqa: BLE001 - wrong arguments are fine; escapes are checked below
            pass
        calls += 1
    probe.assert_nothing_escaped()
    assert refused > calls // 4, f"seed {seed}: only {refused} of {calls} calls refused"
    assert rpc.rpc_sync("solo", operator.add, (1, 2)) == 3


class _Listed:
    """Puts ``objs`` in the default lists for a test (what a careless review could do)."""

    def __init__(self, *objs: Any) -> None:
        self.objs = objs

    def __enter__(self) -> None:
        objects, names = policy.default_objects()
        self.saved = policy._default
        added = dict(objects)
        extra = set(names)
        for obj in self.objs:
            added[id(obj)] = (obj, Verdict.DEFAULT)
            extra.add(policy.origin_of(obj))  # type: ignore[arg-type]
        policy._default = (added, frozenset(extra))
        self.deny = self._reset(())  # the deny patterns would refuse these names first

    def __exit__(self, *exc: object) -> None:
        policy._default = self.saved
        self._reset(self.deny)

    @staticmethod
    def _reset(deny: tuple[str, ...]) -> tuple[str, ...]:
        from gradwire._runtime import agent as _agent

        p = _agent.current().policy
        before = p.deny
        object.__setattr__(p, "deny", deny)
        p._decided.clear()
        p._resolved.clear()
        p._guarded.clear()
        return before


@pytest.mark.parametrize(
    "fn,args,event",
    [
        (np.load, "secret", "open"),
        (np.save, "marker", "open"),
        (np.loadtxt, "secret", "open"),
        (os.system, "command", "start a process"),
        (socket.create_connection, "address", "socket"),
        (os.remove, "secret", "os.remove"),
    ],
    ids=["np.load", "np.save", "np.loadtxt", "os.system", "create_connection", "os.remove"],
)
def test_the_guard_stops_a_file_function_that_slipped_into_the_lists(
    probe: Probe, fn: Any, args: str, event: str
) -> None:
    arg = {
        "secret": str(probe.secret),
        "marker": str(probe.marker),
        "command": f"touch {probe.marker}",
        "address": probe.address,
    }[args]
    call_args: tuple[Any, ...] = (arg, np.zeros(2)) if fn is np.save else (arg,)
    with _Listed(fn):
        with pytest.raises(errors.PolicyError, match="callable guard") as info:
            rpc.rpc_sync("solo", fn, call_args)
        assert event in str(info.value) and "worker 'solo'" in str(info.value)
        assert rpc.rpc_sync("solo", operator.add, (1, 2)) == 3
    _escapes.clear()
    probe.assert_nothing_escaped()
    assert probe.secret.exists()


def test_the_guard_is_per_thread_and_leaves_unguarded_code_alone(probe: Probe) -> None:
    seen: list[str] = []
    gate = threading.Event()

    def elsewhere() -> None:
        gate.wait(5)
        seen.append(probe.secret.read_text())  # another thread: not guarded

    t = threading.Thread(target=elsewhere)
    t.start()
    with guard.guarded("test", "solo"):
        gate.set()
        t.join(5)
        with pytest.raises(errors.PolicyError, match="tried to open"):
            probe.secret.read_text()
        with guard.suspended():
            assert probe.secret.read_text()
    assert seen == ["cluster-token-stand-in"]
    assert probe.secret.read_text()  # after the block: unguarded again
    _escapes.clear()


def test_a_payload_is_unpickled_under_the_guard(probe: Probe) -> None:
    # A reduce to a callable that the lists allow but that would open a file is stopped
    # while the pickle is being loaded, not only when a call runs.
    class Evil:
        def __reduce__(self) -> Any:
            return (np.load, (str(probe.secret),))

    with _Listed(np.load):
        with pytest.raises(errors.PolicyError, match="unpickling a payload"):
            rpc.rpc_sync("solo", operator.pos, (Evil(),))
    _escapes.clear()
    probe.assert_nothing_escaped()
