"""Start N real workers in subprocesses for tests (reusable by the RRef and autograd tests).

Example:
    >>> from gradwire.distributed.rpc._testing import run_cluster
    >>> results = run_cluster(3, my_module.body)   # body(rank, world_size) on every rank
    >>> results[0].value

Each worker is a ``multiprocessing`` *spawn* process named ``worker{rank}`` that runs
``init_rpc`` (tcp:// rendezvous on a free loopback port, a cluster token generated here and
passed in ``GRADWIRE_TOKEN``), then ``body(rank, world_size, *args)``, then ``shutdown``. The
parent collects every rank's value or formatted exception and kills whatever is still running
at the deadline, so a hung worker fails the test instead of hanging it.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue
import random
import secrets
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["WorkerResult", "run_cluster", "free_port", "ClusterError"]


class ClusterError(AssertionError):
    """A worker of run_cluster failed unexpectedly (message: every rank's outcome)."""


@dataclasses.dataclass
class WorkerResult:
    """Outcome of one rank: ``value`` returned by the body, or ``error`` (formatted), and the
    process exit code (None if it had to be killed)."""

    rank: int
    value: Any = None
    error: str | None = None
    exitcode: int | None = None


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, outside the kernel's ephemeral range.

    A port the kernel handed out for ``bind(0)`` can be handed out again to the next process
    that binds port 0 (here: a worker's own server or second ports) before the test's
    rendezvous binds it; a port below the ephemeral range is never given to ``bind(0)``.
    """
    low, high = _ephemeral_range()
    candidates = list(range(20000, low)) if low > 21000 else list(range(high + 1, 65536))
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for port in rng.sample(candidates, min(200, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # everything tried was taken: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(
    rank: int,
    world_size: int,
    body: Callable[..., Any],
    args: tuple[Any, ...],
    options: dict[str, Any],
    env: dict[str, str],
    results: Any,
    shutdown_graceful: bool,
    name: str,
) -> None:
    os.environ.update(env)
    import logging

    logging.basicConfig(level=os.environ.get("GRADWIRE_TEST_LOG", "WARNING"))
    from gradwire.distributed import rpc

    try:
        rpc.init_rpc(name, rank, world_size, rpc.GrpcRpcBackendOptions(**options))
        value = body(rank, world_size, *args)
        if rpc.is_initialized():
            rpc.shutdown(graceful=shutdown_graceful)
        results.put((rank, value, None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put((rank, None, "".join(traceback.format_exception(exc))))


def run_cluster(
    world_size: int,
    body: Callable[..., Any],
    *args: Any,
    timeout: float = 60.0,
    options: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    expect_failure: set[int] | frozenset[int] = frozenset(),
    shutdown_graceful: bool = True,
    names: list[str] | None = None,
    rank_env: dict[int, dict[str, str]] | None = None,
    rank_options: dict[int, dict[str, Any]] | None = None,
    world_size_override: dict[int, int] | None = None,
) -> list[WorkerResult]:
    """Run ``body(rank, world_size, *args)`` on ``world_size`` fresh worker processes.

    Args:
        world_size: number of workers (ranks 0..world_size-1, names ``worker{rank}``).
        body: a module-level function (spawned processes import it).
        args: extra arguments for ``body`` (picklable).
        timeout: seconds for the whole run; workers still alive then are killed.
        options: GrpcRpcBackendOptions fields (``init_method`` defaults to a free port).
        env: extra environment of the workers (``GRADWIRE_TOKEN`` defaults to a fresh token).
        expect_failure: ranks allowed to fail or die (e.g. a worker the test kills).
        shutdown_graceful: how workers shut down after ``body``.
        names: worker names (default ``worker{rank}``).
        rank_env: extra environment for single ranks.
        rank_options: option overrides for single ranks.
        world_size_override: a wrong world size for single ranks (rendezvous tests).

    Returns:
        One WorkerResult per rank.

    Raises:
        ClusterError: a rank outside ``expect_failure`` raised, died or hung.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    opts = {
        "init_method": f"tcp://127.0.0.1:{free_port()}",
        "init_timeout": timeout,
        **(options or {}),
    }
    worker_env = {"GRADWIRE_TOKEN": secrets.token_hex(16), **(env or {})}
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                r,
                (world_size_override or {}).get(r, world_size),
                body,
                args,
                {**opts, **(rank_options or {}).get(r, {})},
                {**worker_env, **(rank_env or {}).get(r, {})},
                results,
                shutdown_graceful,
                (names or [f"worker{i}" for i in range(world_size)])[r],
            ),
            name=f"worker{r}",
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    out = {r: WorkerResult(r) for r in range(world_size)}
    deadline = time.monotonic() + timeout
    got: set[int] = set()
    while len(got) < world_size and time.monotonic() < deadline:
        try:
            rank, value, error = results.get(timeout=0.2)
        except queue.Empty:
            if all(not p.is_alive() for p in procs):
                # Drain what the last processes put before exiting.
                try:
                    while True:
                        rank, value, error = results.get(timeout=0.5)
                        out[rank].value, out[rank].error = value, error
                        got.add(rank)
                except queue.Empty:
                    break
            continue
        out[rank].value, out[rank].error = value, error
        got.add(rank)
        if error is not None and rank not in expect_failure:
            deadline = min(deadline, time.monotonic() + 2.0)  # the others may wait for it forever
    for p in procs:
        p.join(max(0.1, min(10.0, deadline - time.monotonic())))
        if p.is_alive():
            p.kill()
            p.join(5)
        else:
            out[procs.index(p)].exitcode = p.exitcode
    problems = [
        r
        for r in out.values()
        if r.rank not in expect_failure and (r.error is not None or r.rank not in got)
    ]
    if problems:
        lines = []
        for r in out.values():
            state = (
                "ok"
                if r.rank in got and r.error is None
                else (f"raised:\n{r.error}" if r.error else f"no result (exit code {r.exitcode})")
            )
            lines.append(f"--- rank {r.rank}: {state}")
        raise ClusterError("cluster run failed:\n" + "\n".join(lines))
    return [out[r] for r in range(world_size)]
