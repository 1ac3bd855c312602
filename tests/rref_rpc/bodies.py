"""Bodies run by ``run_cluster`` on every rank; rank 0 drives, the others serve.

Every body ends by waiting until no worker holds an RRef any more (``wait_quiet``), so each
scenario also checks that the owner deleted its value once every fork was gone.
"""

from __future__ import annotations

import gc
import os
import pickle
import time
from typing import Any

import gradwire as gw
import numpy as np
from gradwire.distributed import rpc
from gradwire.errors import RpcTimeoutError, RRefError

from . import helpers as h


def seed_scenarios(rank: int, world_size: int) -> dict[str, Any]:
    """The four scenarios of the seed (workers A=0, B=1 owner, C=2)."""
    if rank != 0:
        return {}
    out: dict[str, Any] = {}
    # 1. User shares with owner as return value: remote() then to_here().
    rref = rpc.remote(1, h.add, (np.ones(2), 1))
    out["to_here"] = rref.to_here().tolist()
    out["confirmed"] = h.confirmed_soon(rref)
    # 2. User shares with owner as argument.
    out["arg_to_owner"] = rpc.rpc_sync(1, h.inspect_rref, (rref,))
    # 4. User shares with user (a third worker): C runs only once the owner confirmed it.
    out["user_to_user"] = rpc.rpc_sync(2, h.inspect_rref, (rref,))
    del rref
    # 3. Owner shares with user: a local RRef sent to C.
    local = rpc.RRef("data")
    out["owner_to_user"] = rpc.rpc_async(2, h.inspect_rref, (local,)).wait()
    del local
    out["quiet"] = h.wait_quiet([0, 1, 2])
    return out


def return_values(rank: int, world_size: int) -> dict[str, Any]:
    """RRefs as return values, in every direction, and nested in containers."""
    if rank != 0:
        return {}
    out: dict[str, Any] = {}
    owned_by_1 = rpc.rpc_sync(1, h.make_rref, ("from-1",))  # owner -> user
    out["owner_to_user"] = [owned_by_1.is_owner(), owned_by_1.owner_name(), owned_by_1.to_here()]
    via_1 = rpc.rpc_sync(1, h.make_remote, (2, "on-2"))  # user (1) -> user (0), owner 2
    out["user_to_user"] = [via_1.owner_name(), via_1.to_here()]
    mine = rpc.RRef(np.arange(3))
    h.keep("mine", mine)
    back = rpc.rpc_sync(1, h.identity, (mine,))  # returned to its owner
    out["back_to_owner"] = [back.is_owner(), back == mine, hash(back) == hash(mine)]
    rpc.rpc_sync(0, h.keep, ("orig", mine))
    out["owner_check"] = rpc.rpc_sync(0, h.returned_to_owner, (back, "orig"))[:3]
    nested = rpc.remote(2, h.identity, ({"k": [owned_by_1, (via_1,)]},))
    got = nested.to_here()
    out["nested_from_remote"] = [got["k"][0].to_here(), got["k"][1][0].to_here()]
    box = {"a": [owned_by_1, (via_1,)], "b": owned_by_1}
    out["nested_args"] = rpc.rpc_sync(3, h.inspect_nested, (box,))
    out["remote_returning_rref"] = rpc.remote(1, h.make_rref, (7,)).to_here().to_here()
    del owned_by_1, via_1, mine, back, nested, got, box
    h.drop("mine")
    h.drop("orig")
    out["quiet"] = h.wait_quiet([0, 1, 2, 3])
    return out


def chain_of_8(rank: int, world_size: int) -> dict[str, Any]:
    """An RRef forwarded along 8 hops (user to user, through the owner too), both verbs."""
    if rank != 0:
        return {}
    rref = rpc.remote(1, h.add, (np.arange(4), 10))
    path = [2, 3, 1, 0, 2, 3, 0, 2]  # 8 hops; 1 is the owner
    seen, value = rpc.rpc_sync(path[0], h.hop, (rref, path[1:], ["worker0"]))
    owned = rpc.RRef("owned by 0")
    via_remote = rpc.remote(path[0], h.hop_remote, (owned, path[1:])).to_here()
    del rref, owned
    return {
        "seen": seen,
        "value": value.tolist(),
        "via_remote": via_remote,
        "quiet": h.wait_quiet([0, 1, 2, 3]),
    }


def api_surface(rank: int, world_size: int) -> dict[str, Any]:
    """to_here, local_value, owner, repr, pickling, proxies, equality, confirmation."""
    if rank != 0:
        return {}
    out: dict[str, Any] = {}
    user = rpc.remote(1, h.Counter2)
    assert user.to_here().n == 0
    try:
        user.local_value()
    except RRefError as exc:
        out["local_value_error"] = str(exc)
    out["owner"] = [user.owner().name, user.owner().id, user.owner_name(), user.is_owner()]
    out["repr"] = repr(user)
    try:
        pickle.dumps(user)
    except RRefError as exc:
        out["pickle_error"] = str(exc)
    sync = user.rpc_sync()
    out["proxy_sync"] = [sync.bump(), sync.bump(by=5)]  # reusable
    out["proxy_async"] = user.rpc_async().bump(2).wait()
    out["proxy_remote"] = user.remote().bump(3).to_here()
    out["proxy_async_execution"] = user.rpc_sync().bump_later(10)
    try:
        user.rpc_sync().no_such_method()
    except AttributeError as exc:
        out["attribute_error"] = "no_such_method" in str(exc)
    local = rpc.RRef(h.Counter2(), type_hint=h.Counter2)
    out["local"] = [local.is_owner(), local.confirmed_by_owner(), repr(local)]
    out["local_proxy"] = local.rpc_sync().bump(4)
    try:
        out["local_attribute"] = local.rpc_sync().no_such_method()
    except AttributeError:
        out["local_attribute_error"] = True
    out["equal"] = [local == local, user != local, len({user, user})]
    out["confirmed"] = h.confirmed_soon(user)
    del user, sync, local
    out["quiet"] = h.wait_quiet([0, 1])
    return out


def torch_semantics(rank: int, world_size: int) -> dict[str, Any]:
    """What PyTorch's own RPC tests observe: ids and str(), the local_value() error, the
    shared-owner counter, type-only _get_type, proxies to a missing method, _get_future, and a
    UserRRef used after shutdown."""
    if rank != 0:
        rpc.shutdown()
        return {}
    from gradwire.distributed.rpc import api

    out: dict[str, Any] = {}
    local = rpc.RRef(1)  # the first id minted here: local_id 0
    user = rpc.remote(1, h.identity, (5,))  # RRefId local_id 1, ForkId local_id 2
    out["str"] = [str(local), str(user)]
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/rref.pt"
        try:
            gw.save(local, path)
        except RRefError as exc:
            out["save_error"] = [str(exc), os.path.exists(path)]
    try:
        user.local_value()
    except RRefError as exc:
        out["local_value_error"] = str(exc)
    out["shared"] = [int(api._rref_context_get_debug_info()["num_owner_rrefs"])]
    rpc.rpc_sync(1, h.keep, ("shared", local))
    out["shared"].append(h.wait_shared_owners(0, 1))
    rpc.rpc_sync(1, h.drop, ("shared",))
    out["shared"].append(h.wait_shared_owners(0, 0))
    # Only the type travels: the value itself could not.
    odd = rpc.remote(1, h.Unpicklable)
    type_future = odd._get_type(blocking=False)
    out["type"] = [odd._get_type() is h.Unpicklable, odd._get_type(blocking=False) is type_future]
    try:
        odd.to_here()
        out["value_travelled"] = True
    except Exception:  # noqa: BLE001 - the value cannot be pickled
        out["value_travelled"] = False
    missing = []
    for verb in ("rpc_sync", "remote"):
        try:
            getattr(user, verb)().non_exist()
        except AttributeError as exc:
            missing.append(str(exc))
    pending = user.rpc_async().non_exist()
    try:
        pending.wait()
    except AttributeError as exc:
        missing.append(str(exc))
    out["missing"] = missing
    out["future"] = [user._get_future().wait(), local._get_future().wait()]
    slow = rpc.remote(1, h.sleep_then, (1.0, "late"), timeout=0.2)
    started = time.monotonic()
    try:
        slow._get_future().wait()
    except RpcTimeoutError as exc:
        out["future_timeout"] = [str(exc), time.monotonic() - started]
    assert h.confirmed_soon(slow)  # the owner created it after all, too late
    try:
        slow.to_here()
        out["late_to_here"] = "no error"
    except RpcTimeoutError as exc:
        out["late_to_here"] = str(exc)
    from gradwire.distributed.rpc import internal

    try:
        internal.serialize([local])
    except RRefError as exc:
        out["serialize_error"] = str(exc)
    del odd, slow, type_future
    rpc.shutdown()  # deletes ``user`` and ``local`` (the strict leak check would raise)
    try:
        user.to_here()
    except RRefError as exc:
        out["after_shutdown"] = str(exc)
    try:
        internal.serialize(user)
    except RRefError as exc:
        out["fork_after_shutdown"] = str(exc)
    return out


def creation_errors(rank: int, world_size: int) -> dict[str, Any]:
    """Creation errors at the next use, creation timeouts, to_here timeouts."""
    if rank != 0:
        return {}
    out: dict[str, Any] = {}
    uses = {
        "to_here": lambda r: r.to_here(),
        "fork": lambda r: rpc.rpc_sync(2, h.identity, (r,)),
        "proxy": lambda r: r.rpc_sync().anything(),
    }
    for what, use in uses.items():
        bad = rpc.remote(1, h.fail_with_value_error, ("boom",))
        if what != "to_here":  # to_here asks the owner; the others need the RemoteAck here
            assert h.confirmed_soon(bad)
        try:
            use(bad)
            out[what] = "no error"
        except ValueError as exc:
            out[what] = ("ValueError", "boom" in str(exc))
    # As in PyTorch, remote()'s timeout fails the uses that come after it expired; a
    # to_here() started before that waits for the value under its own timeout.
    slow = rpc.remote(1, h.sleep_then, (1.0, "late"), timeout=0.3)
    out["slow_function"] = slow.to_here()
    expired = rpc.remote(1, h.sleep_then, (3.0, "late"), timeout=0.3)
    time.sleep(0.6)
    try:
        expired.to_here()
        out["creation_timeout"] = "no error"
    except RpcTimeoutError as exc:
        out["creation_timeout"] = str(exc)
    patient = rpc.remote(1, h.sleep_then, (2.0, "ok"), timeout=0)
    try:
        patient.to_here(timeout=0.3)
        out["to_here_timeout"] = "no error"
    except RpcTimeoutError as exc:
        out["to_here_timeout"] = str(exc)
    out["to_here_later"] = patient.to_here(timeout=30)
    to_self = rpc.remote(0, h.fail_with_value_error, ("self-boom",))
    try:
        to_self.to_here()
    except ValueError as exc:
        out["to_self_error"] = str(exc)
    out["to_self"] = rpc.remote(0, h.add, (2, 3)).to_here()
    del bad, slow, expired, patient, to_self
    out["quiet"] = h.wait_quiet([0, 1, 2])
    return out


def backward_paths(rank: int, world_size: int) -> dict[str, Any]:
    """RRef.backward: a local backward on the owner, and inside a dist-autograd context."""
    if rank != 0:
        return {}
    from gradwire.distributed import autograd as dist_autograd

    loss = rpc.remote(1, h.scalar_loss)
    out: dict[str, Any] = {}
    try:  # as in PyTorch: a user RRef needs a context id, and nothing is sent without one
        loss.backward()
        out["user_without_context"] = "no error"
    except RuntimeError as exc:
        out["user_without_context"] = str(exc)
    loss.rpc_sync().backward()  # a local backward on the owner, through the proxy
    out["local"] = rpc.rpc_sync(1, h.w_grad)
    loss2 = rpc.remote(1, h.scalar_loss)
    with dist_autograd.context() as ctx_id:
        loss2.backward(ctx_id)
        out["dist"] = rpc.rpc_sync(1, h.w_dist_grad, (ctx_id,))
    # remote() and to_here() inside a context record send/recv pairs: gradients flow back
    # through the fetched value to the owner and through the RemoteCall's argument to here.
    x = gw.ones(2, requires_grad=True)
    with dist_autograd.context() as ctx_id:
        y = rpc.remote(1, h.double, (x,)).to_here()
        dist_autograd.backward(ctx_id, [(y * 5).sum()])
        out["through_remote"] = dist_autograd.get_gradients(ctx_id)[x].numpy().tolist()
    mine = rpc.RRef(gw.ones(3, requires_grad=True).sum())
    mine.backward()
    out["owner"] = True
    del loss, loss2, mine
    out["quiet"] = h.wait_quiet([0, 1])
    return out


def inspection(rank: int, world_size: int) -> dict[str, Any]:
    """get_debug_info counters while forks are alive, and the WatchControl stream."""
    if rank != 0:
        return {}
    rpc.rpc_sync(1, h.start_watch)
    rref = rpc.remote(1, h.identity, ("watched",))
    rref.to_here()
    rpc.rpc_sync(2, h.keep, ("held", rref))  # worker2 keeps a fork
    counters = {w: rpc.rpc_sync(w, h.counters) for w in (0, 1, 2)}
    rpc.rpc_sync(2, h.drop, ("held",))
    del rref
    quiet = h.wait_quiet([0, 1, 2])
    events = rpc.rpc_sync(1, h.stop_watch)
    return {"counters": counters, "events": events, "quiet": quiet}


def faults(rank: int, world_size: int, n: int, phase: str) -> dict[str, Any]:
    """The scenarios with the first ``n`` control messages of each kind failed on every
    worker (``phase`` "before": lost; "after": processed, answer lost, so duplicated)."""
    if rank != 0:
        return {}
    for w in range(world_size):
        rpc.rpc_sync(w, h.install_faults, (n, phase))
    rref = rpc.remote(1, h.add, (np.ones(2), 1))
    value = rref.to_here().tolist()
    seen, hopped = rpc.rpc_sync(2, h.hop, (rref, [3, 1, 0, 2], ["worker0"]))
    local = rpc.RRef("mine")
    got = rpc.rpc_sync(2, h.inspect_rref, (local,))
    del rref, local
    quiet = h.wait_quiet(list(range(world_size)))
    counts = {w: rpc.rpc_sync(w, h.fault_counts) for w in range(world_size)}
    return {
        "value": value,
        "seen": seen,
        "hopped": hopped.tolist(),
        "got": got,
        "quiet": quiet,
        "counts": counts,
    }


# -- shutdown ------------------------------------------------------------------------------


def shutdown_drain(rank: int, world_size: int) -> dict[str, Any]:
    """Shutdown right after sharing RRefs, with live UserRRefs and RRefs in cycles: every
    owner ends with nothing referenced (the strict leak check would raise otherwise)."""
    kept: list[Any] = []
    if rank == 0:
        rref = rpc.remote(1, h.identity, ("x",))
        kept.append(rref)  # a live UserRRef at shutdown: deleted by the drain
        cycle: list[Any] = [rpc.remote(2, h.identity, ("cyc",))]
        cycle.append(cycle)  # an RRef in a reference cycle
        rpc.rpc_async(2, h.keep, ("from0", rref))  # a fork in flight
        del cycle
    rpc.shutdown()
    out: dict[str, Any] = {"rank": rank}
    if rank == 0:
        try:
            kept[0].to_here()
        except RRefError as exc:
            out["after_shutdown"] = str(exc)
    return out


def shutdown_leak(rank: int, world_size: int, mode: str) -> dict[str, Any]:
    """PyTorch's RRef leak: rank 0's UserRRef outlives the drain (rank 0 skips deleting its
    UserRRefs, as PyTorch's leak test does), so its owner, rank 1, still knows the fork after
    the last barrier and reports it. Rank 1's own ``RRef(value)`` kept in a global is not a
    leak (no other worker holds it). ``mode`` "ignored": the option says "error" but
    ``rpc.api._ignore_rref_leak = True`` only logs."""
    import logging

    from gradwire.distributed.rpc import api

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("gradwire").addHandler(Keep(logging.WARNING))
    skip_drain = api._delete_all_user_and_unforked_owner_rrefs
    kept = None
    if rank == 0:
        kept = rpc.remote(1, h.identity, ("x",))
        kept.to_here()
        api._delete_all_user_and_unforked_owner_rrefs = lambda timeout=0.0: None  # type: ignore[assignment]
    if rank == 1:
        h.keep("local", rpc.RRef("only referenced here"))
    if mode == "ignored":
        api._ignore_rref_leak = True
    gc.collect()
    try:
        rpc.shutdown()
    except RRefError as exc:
        return {"rank": rank, "error": type(exc).__name__, "message": str(exc)}
    finally:
        api._delete_all_user_and_unforked_owner_rrefs = skip_drain  # type: ignore[assignment]
        api._ignore_rref_leak = None
        del kept
    return {"rank": rank, "error": None, "warnings": [r for r in records if "Leaking" in r]}


def random_program(rank: int, world_size: int, seed: int, steps: int, p: float) -> dict[str, Any]:
    """A random program of creations, forks (user to user, to and from owners), uses and
    deletes, with control messages failing at random (lost or duplicated) on every worker."""
    import random

    if rank != 0:
        return {}
    for w in range(world_size):
        rpc.rpc_sync(w, h.install_random_faults, (seed * 100 + w, p))
    rng = random.Random(seed)
    live: list[tuple[Any, int]] = []  # (RRef, its value)
    held: list[tuple[int, str]] = []  # (worker, key) of forks kept on other workers
    checks = 0
    for step in range(steps):
        op = rng.choice(["remote", "local", "return", "share", "hop", "use", "drop", "drop"])
        dest = rng.randrange(world_size)
        if op == "remote" or not live:
            live.append((rpc.remote(rng.randrange(world_size), h.identity, (step,)), step))
        elif op == "local":
            live.append((rpc.RRef(step), step))
        elif op == "return":
            live.append(
                (rpc.rpc_sync(dest, h.make_remote, (rng.randrange(world_size), step)), step)
            )
        elif op == "share":
            rref, _ = rng.choice(live)
            rpc.rpc_sync(dest, h.keep, (f"k{step}", rref))
            held.append((dest, f"k{step}"))
        elif op == "hop":
            rref, value = rng.choice(live)
            path = [rng.randrange(world_size) for _ in range(rng.randrange(3))]
            _, got = rpc.rpc_sync(dest, h.hop, (rref, path, ["worker0"]))
            checks += int(got == value)
        elif op == "use":
            rref, value = rng.choice(live)
            assert rpc.rpc_sync(dest, h.check_value, (rref, value)), (step, rref)
            checks += 1
        elif op == "drop":
            if held and rng.random() < 0.5:
                worker, key = held.pop(rng.randrange(len(held)))
                rpc.rpc_sync(worker, h.drop, (key,))
            else:
                live.pop(rng.randrange(len(live)))
    for worker, key in held:
        rpc.rpc_sync(worker, h.drop, (key,))
    live.clear()
    rref = None  # the loop's last RRef
    quiet = h.wait_quiet(list(range(world_size)), timeout=15)
    counts = {w: rpc.rpc_sync(w, h.fault_counts) for w in range(world_size)}
    return {
        "checks": checks,
        "quiet": quiet,
        "failures": sum(sum(c.values()) for c in counts.values()),
    }


def owner_crash(rank: int, world_size: int) -> dict[str, Any]:
    """The owner dies: using its RRefs becomes an error within the timeout, never a hang."""
    out: dict[str, Any] = {"rank": rank}
    if rank == 0:
        rref = rpc.remote(1, h.identity, ("doomed",))
        out["before"] = rref.to_here()
        rpc.rpc_sync(1, h.die_soon)
        import time

        time.sleep(1.0)
        for what, use in (
            ("to_here", lambda r: r.to_here(timeout=5)),
            ("share", lambda r: rpc.rpc_sync(2, h.inspect_rref, (r,), timeout=8)),
            ("remote", lambda r: rpc.remote(1, h.identity, (1,), timeout=3).to_here()),
        ):
            try:
                use(rref)
                out[what] = "no error"
            except Exception as exc:  # noqa: BLE001 - the test reports the type
                out[what] = type(exc).__name__
                out[what + "_msg"] = str(exc)[:300]
        del rref
        rpc.rpc_sync(2, h.keep, ("done", True))
    if rank == 2:
        h.wait_for("done")
    if rank != 1:
        rpc.shutdown(graceful=False)
    return out


def large_values(rank: int, world_size: int) -> dict[str, Any]:
    """Calls and values larger than one frame take the streamed RemoteCall and a parked Fetch."""
    if rank != 0:
        return {}
    big = rpc.remote(1, h.add, (np.ones(50_000), 1))
    value = big.to_here()
    shared = rpc.rpc_sync(2, h.inspect_rref, (big,))
    del big
    return {
        "sum": float(value.sum()),
        "shared": float(shared["value"].sum()),
        "quiet": h.wait_quiet([0, 1, 2]),
    }


def burst_of_deletes(rank: int, world_size: int, n: int) -> dict[str, Any]:
    """``n`` UserRRefs dropped at once: every owner record goes, with a bounded number of
    threads sending the deletes."""
    if rank != 0:
        return {}
    from gradwire._runtime import agent as _agent

    many = rpc.rpc_sync(1, h.make_many, (n,))
    total = sum(r.to_here() for r in many[:10])
    before = rpc.get_debug_info()["serving_threads"]
    many = None
    gc.collect()
    _agent.current().rref.flush_releases(30)
    during = rpc.get_debug_info()["serving_threads"]
    return {
        "total": total,
        "threads": [before, during],
        "quiet": h.wait_quiet([0, 1], timeout=60),
    }
