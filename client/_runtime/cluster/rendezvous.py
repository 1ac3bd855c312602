"""Rendezvous and barriers, hosted by rank 0 on its own Worker service (no other server).

``plan()`` turns an init method into addresses (``file://``: rank 0 writes its address to the
file, :func:`publish_address`, the others read it); :class:`RendezvousHost` collects Join requests
until every rank arrived and answers all of them with the member list; :class:`BarrierHost`
releases a named barrier once every worker reached it. Both run on the I/O loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import os
import socket
import stat
import tempfile
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
    "local_token_path",
    "publish_local_token",
    "read_local_token",
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


def _proof(token: str, address: str) -> str:
    """What a ``file://`` rendezvous file carries besides the address: an HMAC of the address
    under the cluster token, so a follower dials only an address that someone holding the
    token wrote."""
    return hmac.new(
        token.encode(), b"gradwire file rendezvous\n" + address.encode(), "sha256"
    ).hexdigest()


def publish_address(path: str, address: str, token: str | None = None) -> None:
    """Rank 0 of a ``file://`` rendezvous: write ``address`` to ``path`` atomically.

    The file is written under a fresh, unpredictable name beside ``path`` (created exclusively,
    never through a symlink, readable by this user only) and renamed over ``path`` (a symlink
    planted there is replaced, never followed). With a configured ``token`` the file also
    carries :func:`_proof` of the address; the token itself never goes there.

    Raises:
        RpcInitError: the file cannot be written.
    """
    folder, name = os.path.split(os.path.abspath(path))
    body = f"{address}\n" + (f"{_proof(token, address)}\n" if token else "")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise RpcInitError(f"file:// rendezvous: cannot write {path!r}: {exc}") from exc
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise RpcInitError(f"file:// rendezvous: cannot write {path!r}: {exc}") from exc


def _read_own_file(path: str) -> str:
    """The first 512 bytes of ``path``, refusing a symlink, a file of another user or one that
    others may write (RpcInitError); OSError when it cannot be opened (not there yet)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        problem = ""
        if not stat.S_ISREG(st.st_mode):
            problem = "is not a regular file"
        elif hasattr(os, "getuid") and st.st_uid != os.getuid():
            problem = f"belongs to user id {st.st_uid}, not to this worker's user ({os.getuid()})"
        elif st.st_mode & 0o022:
            problem = f"may be written by others (mode {stat.S_IMODE(st.st_mode):o})"
        if problem:
            raise RpcInitError(
                f"file:// rendezvous: {path!r} {problem}; it was not written by rank 0 of this "
                "cluster (which writes it as this user, mode 600), so this worker will not dial "
                "the address in it; remove it or choose a path in a folder only you can write"
            )
        with os.fdopen(os.dup(fd), "r") as f:
            return f.read(512)
    finally:
        os.close(fd)


def read_address(path: str, timeout: float, token: str | None = None) -> str:
    """The other ranks of a ``file://`` rendezvous: rank 0's address, once it wrote it.

    The file must be this user's own and writable by no one else; with a configured ``token``
    it must carry the address's proof under that token (:func:`publish_address`).

    Raises:
        RpcInitError: no valid address appeared in ``path`` within ``timeout`` seconds, or the
            file is not one rank 0 of this cluster wrote (another user's, others may write it,
            or its proof does not match the token).
    """
    deadline = time.monotonic() + timeout
    why = "rank 0 wrote no address to it"
    while True:
        try:
            lines = _read_own_file(path).split("\n")
        except OSError:
            lines = []
        address = lines[0].strip() if lines else ""
        proof = lines[1].strip() if len(lines) > 1 else ""
        if address:
            try:
                _split(address, "address")
            except RpcInitError:
                why = f"it holds {address[:64]!r}, which is not host:port"
            else:
                if not token:
                    return address
                if hmac.compare_digest(proof, _proof(token, address)):
                    return address
                # A file of an earlier run, or of someone without the token: rank 0 replaces it.
                why = (
                    f"the address there ({address}) does not carry the proof of this cluster's "
                    "token, so it was not written by a rank 0 with the same GRADWIRE_TOKEN and "
                    "this worker did not send its token there"
                )
        if time.monotonic() >= deadline:
            raise RpcInitError(f"file:// rendezvous timed out after {timeout} s on {path!r}: {why}")
        time.sleep(_FILE_POLL_SECONDS)


def withdraw_address(path: str, address: str) -> None:
    """Rank 0 stopping: remove ``path`` if it still holds its ``address`` (a later run may
    reuse the file name)."""
    try:
        if _read_own_file(path).split("\n")[0].strip() != address:
            return
        os.remove(path)
    except (OSError, RpcInitError):
        pass


def _private_folder() -> str:
    """This user's own folder for rendezvous secrets (mode 700, created if missing; refused if
    another user owns it, others may write it or it is a symlink)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    folder = os.path.join(tempfile.gettempdir(), f"gradwire-{uid}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise RpcInitError(
            f"{folder!r} is not a private folder of this user (mode 700): remove it; gradwire "
            "keeps the token of a local group there"
        )
    return folder


def local_token_path(port: int) -> str:
    """Where the host of a dynamic group on this machine, started without a token, keeps the
    token it made up, for members of the same user (``publish_local_token``)."""
    return os.path.join(_private_folder(), f"group-{int(port)}.token")


def publish_local_token(port: int, token: str) -> str:
    """The host of a dynamic group without a configured token: write the token it made up to
    :func:`local_token_path` (this user only), so that members started by the same user on this
    machine can join; nobody else learns it (no reply to a Join without it carries it).

    Returns:
        The file's path (removed again by :func:`withdraw_address` at shutdown).
    """
    path = local_token_path(port)
    publish_address(path, token)
    return path


def read_local_token(port: int, timeout: float) -> str | None:
    """A member of a dynamic group on this machine with no token: the token its host made up,
    once written (None when none appears within ``timeout``, or it is not this user's file)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            token = _read_own_file(local_token_path(port)).split("\n")[0].strip()
        except OSError:
            token = ""
        except RpcInitError:
            return None
        if token or time.monotonic() >= deadline:
            return token or None
        time.sleep(_FILE_POLL_SECONDS)


def route_to(host: str) -> str:
    """The local IP that routes to ``host`` (no packet is sent); when ``host`` does not resolve
    (yet: Docker Swarm publishes a service's name only once its task is healthy), the address
    of this machine's own host name, else loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return str(s.getsockname()[0])
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
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

    def waits_for(self, rank: int) -> bool:
        """True while ``rank`` has not joined and the rendezvous is not complete; also once it
        failed (the Join is then answered with the reason, never with the token)."""
        if self.error:
            return True
        return (
            not self._done.is_set()
            and rank not in self.members
            and len(self.members) < self.world_size
        )

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

    def mark_back(self, worker_id: int) -> None:
        """On the I/O loop: ``worker_id``, declared lost, answers again: barriers wait for it."""
        self._gone.discard(worker_id)

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
