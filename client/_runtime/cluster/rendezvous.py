"""Rendezvous and barriers, hosted by rank 0 on its own Worker service (no other server).

``plan()`` turns an init method into addresses (``file://``: rank 0 writes its address to the
file, :func:`publish_address`, the others read it); :class:`RendezvousHost` collects Join requests
until every rank arrived and answers all of them with the member list; :class:`BarrierHost`
releases a named barrier once every worker reached it. Both run on the I/O loop.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import time
from dataclasses import dataclass

from ..._proto import worker_pb2 as pb
from ...errors import RpcInitError
from . import device_maps
from .workers import validate_rank

__all__ = [
    "Plan",
    "plan",
    "is_loopback",
    "route_to",
    "publish_address",
    "read_address",
    "withdraw_address",
    "RendezvousHost",
    "BarrierHost",
    "FILE_SCHEME",
]

#: The init method whose rendezvous goes through a file (PyTorch's ``file://``).
FILE_SCHEME = "file://"
_FILE_POLL_SECONDS = 0.02


@dataclass(frozen=True)
class Plan:
    """Where rank 0 is and where this worker listens."""

    master: str
    listen: str
    #: A ``file://`` rendezvous: the file where rank 0 publishes its address ("" otherwise;
    #: ``master`` is then read from it at the rendezvous, by the other ranks).
    store_file: str = ""


def is_loopback(host: str) -> bool:
    """True for localhost, 127.0.0.0/8, ::1 and unix sockets."""
    host = host.strip("[]")
    if host in ("localhost", "") or host.startswith("unix:"):
        return host != ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _split(address: str, what: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise RpcInitError(f"{what} {address!r} is not host:port")
    return host.strip("[]"), int(port)


def publish_address(path: str, address: str) -> None:
    """Rank 0 of a ``file://`` rendezvous: write ``address`` to ``path`` (atomically, readable
    by this user only; the cluster token never goes there).

    Raises:
        RpcInitError: the file cannot be written.
    """
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{address}\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise RpcInitError(f"file:// rendezvous: cannot write {path!r}: {exc}") from exc


def read_address(path: str, timeout: float) -> str:
    """The other ranks of a ``file://`` rendezvous: rank 0's address, once it wrote it.

    Raises:
        RpcInitError: no valid address appeared in ``path`` within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                address = f.read(512).strip()
            _split(address, f"address in {path!r}")
            return address
        except (OSError, RpcInitError):
            if time.monotonic() >= deadline:
                raise RpcInitError(
                    f"rendezvous timed out after {timeout} s: rank 0 wrote no address to {path!r}"
                ) from None
            time.sleep(_FILE_POLL_SECONDS)


def withdraw_address(path: str, address: str) -> None:
    """Rank 0 stopping: remove ``path`` if it still holds its ``address`` (a later run may
    reuse the file name)."""
    try:
        with open(path) as f:
            if f.read(512).strip() != address:
                return
        os.remove(path)
    except OSError:
        pass


def route_to(host: str) -> str:
    """The local IP that routes to ``host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def plan(init_method: str | list[str], rank: int, world_size: int, listen: str | None) -> Plan:
    """Resolve an init method.

    Args:
        init_method: "env://", "tcp://host:port", "file:///path" (rank 0 listens on loopback
            unless ``listen`` says otherwise and writes its address there; the others read
            it) or a list of "host:port", one per rank.
        rank: this worker's rank.
        world_size: number of workers.
        listen: explicit listen address from the options, if any.

    Raises:
        RpcInitError: malformed init method or missing MASTER_ADDR / MASTER_PORT.
    """
    if isinstance(init_method, (list, tuple)):
        if len(init_method) != world_size:
            raise RpcInitError(
                f"init_method lists {len(init_method)} addresses for world_size {world_size}"
            )
        for a in init_method:
            _split(a, "worker address")
        return Plan(master=init_method[0], listen=listen or init_method[rank])
    if isinstance(init_method, str) and init_method.startswith(FILE_SCHEME):
        path = init_method[len(FILE_SCHEME) :]
        if not path:
            raise RpcInitError("init_method 'file://' needs the path of a file, e.g. file:///tmp/x")
        return Plan(master="", listen=listen or "127.0.0.1:0", store_file=path)
    if init_method == "env://":
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not addr or not port:
            raise RpcInitError(
                "init_method 'env://' needs the MASTER_ADDR and MASTER_PORT environment "
                "variables (the address rank 0 serves on)"
            )
        master = f"{addr}:{port}"
    elif isinstance(init_method, str) and init_method.startswith("tcp://"):
        master = init_method[len("tcp://") :].rstrip("/")
    else:
        raise RpcInitError(
            f"unsupported init_method {init_method!r}: use 'env://', 'tcp://host:port', "
            "'file:///path' or a list of worker addresses"
        )
    host, port_num = _split(master, "master address")
    if listen is None:
        if rank == 0:
            listen = master
        else:
            listen = f"{'127.0.0.1' if is_loopback(host) else route_to(host)}:0"
    return Plan(master=master, listen=listen)


class RendezvousHost:
    """Rank 0's view of the rendezvous: members by rank until ``world_size`` joined."""

    def __init__(self, world_size: int, session: str, token: str) -> None:
        self.world_size = world_size
        self.session = session
        self.token = token
        self.members: dict[int, pb.WorkerInfo] = {}
        self.error: str | None = None
        self._done = asyncio.Event()
        #: Ranks that asked to join, refused ones included (who has learnt the outcome).
        self.contacted: set[int] = set()
        self._contact = asyncio.Event()

    def _fail(self, message: str) -> RpcInitError:
        self.error = self.error or message
        self._done.set()
        return RpcInitError(message)

    def add(self, worker: pb.WorkerInfo, world_size: int) -> None:
        """Register a member. Raises RpcInitError (and fails the rendezvous) on conflicts."""
        self.contacted.add(worker.id)
        self._contact.set()
        if self.error:
            raise RpcInitError(f"rendezvous already failed: {self.error}")
        if world_size != self.world_size:
            raise self._fail(
                f"worker {worker.name!r} expects world_size {world_size}, rank 0 has {self.world_size}"
            )
        try:
            validate_rank(worker.id, f"worker {worker.name!r}")
        except RpcInitError as exc:
            raise self._fail(str(exc)) from None
        if not 0 <= worker.id < self.world_size:
            raise self._fail(f"worker {worker.name!r} has rank {worker.id}, out of range")
        old = self.members.get(worker.id)
        if old is not None and old.name != worker.name:
            raise self._fail(f"rank {worker.id} claimed by both {old.name!r} and {worker.name!r}")
        for other in self.members.values():
            if other.name == worker.name and other.id != worker.id:
                raise self._fail(
                    f"Worker name {worker.name!r} is not unique: duplicate worker name "
                    f"{worker.name!r} (ranks {other.id} and {worker.id})"
                )
        self.members[worker.id] = worker
        if len(self.members) == self.world_size:
            problems = device_maps.validate(list(self.members.values()))
            if problems:  # every rank fails init_rpc with the same list
                raise self._fail(
                    "invalid device maps: " + "; ".join(problems) + " (see docs/gpu.md)"
                )
            self._done.set()

    async def wait(self, timeout: float) -> pb.JoinReply:
        """Wait until everyone joined. Raises RpcInitError on failure or timeout."""
        try:
            await asyncio.wait_for(self._done.wait(), timeout)
        except asyncio.TimeoutError:
            missing = sorted(set(range(self.world_size)) - set(self.members))
            raise RpcInitError(
                f"rendezvous timed out after {timeout} s: ranks {missing} never joined"
            ) from None
        if self.error:
            raise RpcInitError(f"rendezvous failed: {self.error}")
        members = [self.members[r] for r in range(self.world_size)]
        return pb.JoinReply(workers=members, session=self.session, token=self.token)

    async def linger(self, seconds: float) -> None:
        """After a failure: keep answering Join (with the error) until every rank has asked or
        ``seconds`` pass, so that each rank fails with the reason, not with rank 0 gone."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while len(self.contacted) < self.world_size and loop.time() < end:
            self._contact.clear()
            try:
                await asyncio.wait_for(self._contact.wait(), end - loop.time())
            except asyncio.TimeoutError:
                return


class BarrierHost:
    """Named barriers over all workers (used by graceful shutdown)."""

    def __init__(self, names: dict[int, str]) -> None:
        self._names = names
        self._arrived: dict[tuple[str, int], set[int]] = {}
        self._events: dict[tuple[str, int], asyncio.Event] = {}
        #: Workers declared lost (liveness): counted as arrived at every barrier.
        self._gone: set[int] = set()

    def mark_gone(self, worker_id: int) -> None:
        """On the I/O loop: ``worker_id`` is dead; no barrier waits for it any more."""
        self._gone.add(worker_id)
        for key, arrived in self._arrived.items():
            if len(arrived | self._gone) >= len(self._names):
                self._events[key].set()

    async def arrive(
        self, name: str, generation: int, worker_id: int, timeout: float
    ) -> pb.BarrierReply:
        """Record ``worker_id`` and wait for the others at most ``timeout`` seconds."""
        key = (name, generation)
        arrived = self._arrived.setdefault(key, set())
        event = self._events.setdefault(key, asyncio.Event())
        arrived.add(worker_id)
        if len(arrived | self._gone) >= len(self._names):
            event.set()
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            missing = [self._names[i] for i in sorted(set(self._names) - arrived - self._gone)]
            return pb.BarrierReply(ok=False, missing=missing)
        return pb.BarrierReply(ok=True)
