"""Workers of a dynamic group (``init_rpc`` without a world size), started one by one by the
tests in test_dynamic_membership.py; module-level so spawned processes resolve them by name.

Each worker runs a *role*: ``role(name, rank, init_method, post, signals, *args)``, where
``post(tag, value)`` reports to the test and ``signals`` are the test's multiprocessing Events.
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import gradwire as gw
import gradwire.distributed.autograd as dist_autograd
from gradwire import errors
from gradwire.distributed import rpc

TOKEN = "dynamic-group-token"
Post = Callable[[str, Any], None]

# -- functions the workers call on each other -------------------------------------------------------

_log: list[str] = []
_log_lock = threading.Lock()


def record(call_id: str) -> str:
    """Log that call ``call_id`` ran here (once per run: the exactly-once check)."""
    with _log_lock:
        _log.append(call_id)
    return call_id


def make_box(value: int) -> dict[str, int]:
    return {"v": value}


def read_box(rref: Any) -> int:
    return int(rref.to_here()["v"])


def my_add(a: gw.Tensor, b: gw.Tensor) -> gw.Tensor:
    return a + b


def num_contexts() -> int:
    return int(rpc.get_debug_info()["num_autograd_contexts"])


def whoami() -> str:
    return rpc.get_worker_info().name


# -- the harness -------------------------------------------------------------------------------------


def options(init_method: str, **overrides: Any) -> rpc.GrpcRpcBackendOptions:
    fields: dict[str, Any] = {
        "init_method": init_method,
        "rpc_timeout": 20.0,
        "init_timeout": 30.0,
        "peer_lost_seconds": 2.0,
    }
    fields.update(overrides)
    return rpc.GrpcRpcBackendOptions(**fields)


def _member(
    role: Callable[..., Any],
    name: str,
    rank: int | None,
    init_method: str,
    out: Any,
    signals: dict[str, Any],
    args: tuple[Any, ...],
    label: str,
) -> None:
    os.environ["GRADWIRE_TOKEN"] = TOKEN
    for var in ("WORLD_SIZE", "RANK"):
        os.environ.pop(var, None)
    logging.basicConfig(level=os.environ.get("GRADWIRE_TEST_LOG", "WARNING"))

    def post(tag: str, value: Any = None) -> None:
        out.put((label, tag, value))

    # A member that hangs shows where (the test fails after 60 s of silence).
    faulthandler.dump_traceback_later(50, exit=False)
    try:
        post("done", role(name, rank, init_method, post, signals, *args))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        post("error", "".join(traceback.format_exception(exc)))


class Group:
    """The test's side: starts members, reads what they post, fails on a member's error.

    Each member posts on a queue of its own: a member the test kills cannot leave a message
    half written (or the queue's write lock held) for the others.
    """

    def __init__(self, init_method: str) -> None:
        self.ctx = mp.get_context("spawn")
        self.init_method = init_method
        self.signals = {k: self.ctx.Event() for k in ("load", "leave", "stop", "end")}
        self.procs: dict[str, Any] = {}
        self.queues: dict[str, Any] = {}
        self._seen: dict[str, list[tuple[str, Any]]] = {}

    def start(
        self, role: Callable[..., Any], name: str, rank: int | None, *args: Any, label: str = ""
    ) -> None:
        """Start worker ``name`` with ``role``; it posts under ``label`` (default: its name)."""
        label = label or name
        out = self.queues[label] = self.ctx.Queue()
        self._seen[label] = []
        p = self.ctx.Process(
            target=_member,
            args=(role, name, rank, self.init_method, out, self.signals, args, label),
            name=label,
            daemon=True,
        )
        p.start()
        self.procs[label] = p

    def expect(self, label: str, tag: str, timeout: float = 60.0) -> Any:
        """The value member ``label`` posts under ``tag``; AssertionError on its error."""
        deadline = time.monotonic() + timeout
        seen = self._seen[label]
        while True:
            for i, (what, value) in enumerate(seen):
                if what == "error":
                    raise AssertionError(f"{label} failed:\n{value}")
                if what == tag:
                    del seen[i]
                    return value
            left = deadline - time.monotonic()
            if left <= 0:
                p = self.procs[label]
                state = "running" if p.is_alive() else f"exit code {p.exitcode}"
                raise AssertionError(f"{label} did not post {tag!r} within {timeout} s ({state})")
            try:
                _who, what, value = self.queues[label].get(timeout=min(left, 0.5))
                seen.append((what, value))
            except queue.Empty:
                pass

    def close(self) -> None:
        for p in self.procs.values():
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)


# -- roles ---------------------------------------------------------------------------------------------


def _load(me: str, stop: Any, fork_owner: str | None, avoid: set[str], out: dict[str, Any]) -> None:
    """Calls (and RRef forks) to the current members until ``stop``: every call either returns
    its id or fails as departed / unavailable; nothing else."""
    i = 0
    while not stop.is_set():
        members = sorted(w.name for w in rpc.get_worker_infos() if w.name != me)
        targets = [m for m in members if m not in avoid] or [me]
        target = targets[i % len(targets)]
        call_id = f"{me}-{i}"
        try:
            got = rpc.rpc_async(target, record, (call_id,)).wait()
            assert got == call_id, (got, call_id)
            out["ok"].append((target, call_id))
        except errors.WorkerUnavailableError as exc:  # departed, or lost
            out["failed"].append((target, call_id, type(exc).__name__, str(exc)))
        if fork_owner is not None and i % 2 == 0 and target != fork_owner:
            rref = rpc.remote(fork_owner, make_box, (i,))
            try:
                # The target gets a fork of an RRef the owner may not have confirmed yet.
                assert rpc.rpc_sync(target, read_box, (rref,)) == i
                out["forks"] += 1
            except errors.WorkerUnavailableError as exc:
                out["failed"].append((target, f"fork-{i}", type(exc).__name__, str(exc)))
            del rref
        i += 1
        time.sleep(0.005)


def _start_load(
    me: str, stop: Any, fork_owner: str | None, avoid: set[str]
) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {"ok": [], "failed": [], "forks": 0}
    t = threading.Thread(target=_load, args=(me, stop, fork_owner, avoid, out), daemon=True)
    t.start()
    return t, out


def _leaf(seed: int) -> gw.Tensor:
    return gw.tensor([float(seed), 2.0, 3.0], dtype=gw.float64, requires_grad=True)


def threads_named(name: str) -> int:
    """How many of this process' threads are named ``name``."""
    return sum(1 for t in threading.enumerate() if t.name == name)


def until(check: Callable[[], bool], seconds: float) -> bool:
    """Poll ``check`` every 50 ms; whether it held within ``seconds``."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def survivor(
    name: str, rank: int, init_method: str, post: Post, signals: dict[str, Any]
) -> dict[str, Any]:
    """w0 (the host) and w1: there from the start to the end, under load all along."""
    rpc.init_rpc(name, rank, rpc_backend_options=options(init_method))
    post("joined", [w.name for w in rpc.get_worker_infos()])
    signals["load"].wait(30)
    stop = threading.Event()
    thread, load = _start_load(name, stop, "w0" if name == "w1" else None, {"w4"})
    held = None
    if name == "w0":
        # An RRef owned by w2, which leaves later: it must stay readable until w0 lets go.
        assert until(lambda: {"w2", "w3"} <= {w.name for w in rpc.get_worker_infos()}, 30)
        held = rpc.remote("w2", make_box, (42,))
        assert held.to_here() == {"v": 42}
        with dist_autograd.context() as cid:  # a context w3 takes part in
            t = rpc.rpc_sync("w3", my_add, (_leaf(1), _leaf(2)))
            dist_autograd.backward(cid, [t.sum()])
        post("held", None)
    signals["leave"].wait(60)
    faulthandler.dump_traceback_later(25, exit=False)  # where it hangs, if it does
    if held is not None:
        time.sleep(1.0)  # w2 is leaving meanwhile: it waits for this RRef to be deleted
        value = held.to_here()
        del held
        gc.collect()
        post("released", value)
    signals["stop"].wait(60)
    stop.set()
    thread.join(30)
    started = time.monotonic()
    try:
        rpc.rpc_sync("w2", whoami)
        departed = "no error"
    except errors.WorkerDepartedError as exc:
        departed = f"{type(exc).__name__}: {exc}"
    departed_seconds = time.monotonic() - started
    try:
        rpc.get_worker_info("w3")
        departed_info = "no error"
    except errors.WorkerDepartedError as exc:
        departed_info = str(exc)

    def lost_error() -> str:
        try:
            rpc.rpc_sync("w4", whoami, timeout=5)
            return "no error"
        except errors.WorkerUnavailableError as exc:
            return f"{type(exc).__name__}: {exc}"

    assert until(lambda: "is lost" in lost_error(), 20), lost_error()
    lost = lost_error()
    gc.collect()

    def settled() -> bool:
        info = rpc.api._rref_context_get_debug_info()
        return (
            info["num_owner_rrefs"] == 0
            and info["num_forks"] == 0
            and info["num_pending_users"] == 0
            and num_contexts() == 0
        )

    clean = until(settled, 15)
    post(
        "checked",
        {
            "members": sorted(w.name for w in rpc.get_worker_infos()),
            "departed": departed,
            "departed_seconds": departed_seconds,
            "departed_info": departed_info,
            "lost": lost,
            "clean": clean,
            "rrefs": rpc.api._rref_context_get_debug_info(),
            "contexts": num_contexts(),
        },
    )
    signals["end"].wait(60)  # both survivors checked: now they leave
    if name == "w1":
        time.sleep(1.0)  # w0 (the host) leaves last, after w1 told it
    rpc.shutdown()
    with _log_lock:
        log = list(_log)
    return {"load": load, "log": log}


def joiner(
    name: str, rank: int, init_method: str, post: Post, signals: dict[str, Any], fate: str
) -> dict[str, Any]:
    """w2, w3 (``fate`` "leave": shutdown() when told) and w4 ("killed": the test kills it)."""
    rpc.init_rpc(name, rank, rpc_backend_options=options(init_method))
    post("joined", [w.name for w in rpc.get_worker_infos()])
    # Every member knows this worker by now: the host told them before init_rpc returned.
    members = sorted(w.name for w in rpc.get_worker_infos())
    assert sorted(rpc.rpc_sync(m, whoami) for m in members) == members
    stop = threading.Event()
    avoid = {"w4"} if fate == "leave" else set()
    thread, load = _start_load(name, stop, "w0" if fate == "leave" else None, avoid)
    if name == "w2":
        with dist_autograd.context() as cid:  # a context on w0 too, ended normally
            t1, t2 = _leaf(3), _leaf(4)
            loss = rpc.rpc_sync("w0", my_add, (t1, t2)).sum()
            dist_autograd.backward(cid, [loss])
            grads = dist_autograd.get_gradients(cid)
            assert grads[t1].tolist() == [1.0, 1.0, 1.0], grads
    open_context = None
    if name in ("w3", "w4"):
        # A context this worker leaves (or dies) inside: w1 holds a piece of it.
        open_context = dist_autograd.context()
        open_context.__enter__()
        rpc.rpc_sync("w1", my_add, (_leaf(5), _leaf(6)))
    post("loaded", None)
    if fate == "killed":
        # Killed while it sleeps: never while it holds the lock of an Event the others share.
        time.sleep(300)
    signals["leave"].wait(60)
    faulthandler.dump_traceback_later(25, exit=False)  # where it hangs, if it does
    stop.set()
    thread.join(30)
    gc.collect()
    started = time.monotonic()
    rpc.shutdown()
    leave_seconds = time.monotonic() - started
    if open_context is not None:  # left inside it: the survivors released their pieces
        open_context.__exit__(None, None, None)  # after shutdown: released here only
    with _log_lock:  # calls served while leaving count too
        log = list(_log)
    return {"load": load, "log": log, "leave_seconds": leave_seconds}


def clash(
    name: str, rank: int | None, init_method: str, post: Post, signals: dict[str, Any]
) -> str:
    """Join with a name or rank a member has: the error init_rpc raises."""
    try:
        rpc.init_rpc(name, rank, rpc_backend_options=options(init_method, init_timeout=10.0))
    except errors.RpcInitError as exc:
        return f"{type(exc).__name__}: {exc}"
    rpc.shutdown()
    return "joined"


def fixed_joiner(
    name: str, rank: int, init_method: str, post: Post, signals: dict[str, Any]
) -> str:
    """Join with a world size: the error init_rpc raises against a dynamic host."""
    try:
        rpc.init_rpc(name, rank, 2, options(init_method, init_timeout=10.0))
    except errors.RpcInitError as exc:
        return f"{type(exc).__name__}: {exc}"
    rpc.shutdown()
    return "joined"


def deaf_member(
    name: str, rank: int, init_method: str, post: Post, signals: dict[str, Any]
) -> dict[str, Any]:
    """A member that misses the host's announcements: it still finds later joiners (it asks
    the host before failing)."""
    from gradwire._proto import worker_pb2 as pb
    from gradwire._runtime import agent as _agent

    rpc.init_rpc(name, rank, rpc_backend_options=options(init_method))
    agent = _agent.current()
    serve = agent.control_handlers["Members"]

    def deaf(request: Any, caller: int) -> Any:
        if request.kind == "joined":
            return pb.MemberList()  # the announcement is dropped
        return serve(request, caller)

    agent.control_handlers["Members"] = deaf
    post("joined", None)
    signals["load"].wait(60)  # set once "late" joined
    before = sorted(p.name for p in agent.peers)
    info = rpc.get_worker_info("late")
    answer = rpc.rpc_sync("late", whoami)
    post("found", None)  # "late" may leave now
    signals["stop"].wait(60)
    rpc.shutdown()
    return {"before": before, "info": (info.name, info.id), "answer": answer}


def late(name: str, rank: int, init_method: str, post: Post, signals: dict[str, Any]) -> str:
    rpc.init_rpc(name, rank, rpc_backend_options=options(init_method))
    post("joined", None)
    signals["stop"].wait(60)
    rpc.shutdown()
    return "ok"


def assigned(
    name: str, rank: int | None, init_method: str, post: Post, signals: dict[str, Any], leave: str
) -> dict[str, Any]:
    """Join with ``rank`` (None: the host assigns one), post the rank it has, serve until
    ``signals[leave]``, leave; what it saw of the group."""
    rpc.init_rpc(name, rank, rpc_backend_options=options(init_method))
    me = rpc.get_worker_info()
    post("joined", me.id)
    with dist_autograd.context() as context_id:  # its id's top bits are the worker's id
        context_worker = context_id >> 48
    signals[leave].wait(60)
    seen = {w.name: w.id for w in rpc.get_worker_infos()}
    answer = rpc.rpc_sync("host", whoami)
    rpc.shutdown()
    return {"id": me.id, "context_worker": context_worker, "seen": seen, "answer": answer}


def nap(seconds: float) -> str:
    time.sleep(seconds)
    return "rested"


def busy_leaver(name: str, rank: int, init_method: str, post: Post, signals: dict[str, Any]) -> str:
    """Leaves (with a short shutdown timeout) while a call to it still runs."""
    rpc.init_rpc(name, rank, rpc_backend_options=options(init_method))
    post("joined", None)
    signals["leave"].wait(60)
    try:
        rpc.shutdown(timeout=2)
    except errors.RpcError as exc:  # its own leave may report the unfinished call
        return f"{type(exc).__name__}"
    return "left"


def waiting_caller(
    name: str, rank: int, init_method: str, post: Post, signals: dict[str, Any]
) -> Any:
    """Calls the busy leaver; its call fails as departed once the leaver is gone."""
    rpc.init_rpc(name, rank, rpc_backend_options=options(init_method))
    assert until(lambda: "busy" in {w.name for w in rpc.get_worker_infos()}, 30)
    fut = rpc.rpc_async("busy", nap, (40.0,), timeout=30)
    post("calling", None)
    started = time.monotonic()
    try:
        outcome = f"returned {fut.wait()}"
    except errors.WorkerUnavailableError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    elapsed = time.monotonic() - started
    signals["stop"].wait(60)
    rpc.shutdown()
    return {"outcome": outcome, "elapsed": elapsed}
