"""The rendezvous cannot be used to learn the token or to redirect a worker (issue 36).

Real processes: a two-worker cluster whose token rank 0 made up, attacked by this process with a
raw Join after everyone joined; followers of a ``file://`` rendezvous given a file that rank 0
did not write; rank 0 writing its file where a symlink was planted.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from gradwire._proto import worker_pb2 as pb
from gradwire._runtime.cluster import rendezvous
from gradwire.distributed.rpc._testing import free_port
from gradwire.errors import RpcInitError

_WORKER = """
import os, sys, time
from gradwire.distributed import rpc
name, rank, init, done = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rpc.init_rpc(name, rank, 2, rpc_backend_options=rpc.GrpcRpcBackendOptions(
    init_method=init, init_timeout=30, rpc_timeout=10))
print("joined", flush=True)
end = time.monotonic() + 60
while not os.path.exists(done) and time.monotonic() < end:
    time.sleep(0.05)
rpc.shutdown()
print("done", flush=True)
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADWIRE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _join(address: str, name: str, rank: int, token: str | None = None) -> pb.JoinReply:
    metadata = [("x-gradwire-token", token)] if token else []
    with grpc.insecure_channel(address) as channel:
        join = channel.unary_unary(
            "/gradwire.v1.Worker/Join",
            request_serializer=pb.JoinRequest.SerializeToString,
            response_deserializer=pb.JoinReply.FromString,
        )
        request = pb.JoinRequest(
            worker=pb.WorkerInfo(name=name, id=rank, address="127.0.0.1:1"), world_size=2
        )
        return join(request, timeout=10, metadata=metadata)  # type: ignore[no-any-return]


def test_a_join_without_the_token_after_the_rendezvous_is_refused(tmp_path: Path) -> None:
    port = free_port()
    init = f"tcp://127.0.0.1:{port}"
    done = tmp_path / "done"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, f"worker{r}", str(r), init, str(done)],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "joined", p.stderr.read() if p.stderr else ""
        # An existing worker's name and rank, and a new rank: neither is answered with the token.
        for name, rank in (("worker1", 1), ("worker0", 0), ("intruder", 1)):
            with pytest.raises(grpc.RpcError) as info:
                _join(f"127.0.0.1:{port}", name, rank)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, info.value
            assert "no longer waits" in (info.value.details() or "")
        done.touch()
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0 and "done" in out, err[-2000:]
    finally:
        done.touch()
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_rank_zero_replaces_a_symlink_planted_at_the_rendezvous_path(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    path = tmp_path / "rdv"
    path.symlink_to(victim)
    rendezvous.publish_address(str(path), "127.0.0.1:1234")
    assert victim.read_text() == "precious\n"
    assert not path.is_symlink() and path.read_text() == "127.0.0.1:1234\n"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_rank_zero_writes_through_an_unpredictable_exclusive_temporary_name(
    tmp_path: Path,
) -> None:
    # The old name, "<path>.<pid>.tmp", planted as a symlink to a victim: never written through.
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    path = tmp_path / "rdv"
    (tmp_path / f"rdv.{os.getpid()}.tmp").symlink_to(victim)
    seen: list[str] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        seen.append(os.path.basename(src))
        real_replace(src, dst)

    os.replace = spy  # type: ignore[assignment]
    try:
        rendezvous.publish_address(str(path), "127.0.0.1:1")
        rendezvous.publish_address(str(path), "127.0.0.1:2")
    finally:
        os.replace = real_replace  # type: ignore[assignment]
    assert victim.read_text() == "precious\n" and path.read_text() == "127.0.0.1:2\n"
    assert len(set(seen)) == 2 and all(str(os.getpid()) not in s for s in seen), seen


def _listener() -> tuple[socket.socket, list[bytes]]:
    """A TCP listener that records what any connection sends it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    got: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                got.append(conn.recv(65536))
            except OSError:
                got.append(b"")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return sock, got


def _follower(
    path: Path, token: str | None, timeout: float = 3
) -> subprocess.CompletedProcess[str]:
    env = _env()
    if token:
        env["GRADWIRE_TOKEN"] = token
    code = (
        "from gradwire.distributed import rpc\n"
        "rpc.init_rpc('worker1', 1, 2, rpc_backend_options=rpc.GrpcRpcBackendOptions("
        f"init_method='file://{path}', init_timeout={timeout}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_follower_sends_its_token_only_to_an_address_with_the_tokens_proof(
    tmp_path: Path,
) -> None:
    sock, got = _listener()
    try:
        path = tmp_path / "rdv"
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, f"{address}\n".encode())  # written by someone without the token
        os.close(fd)
        done = _follower(path, "the-cluster-token")
        assert done.returncode != 0
        assert "does not carry the proof" in done.stderr, done.stderr[-2000:]
        assert got == [], "the follower dialled an address without the token's proof"
        # with the proof (what rank 0 holding the token writes), it dials
        rendezvous.publish_address(str(path), address, "the-cluster-token")
        _follower(path, "the-cluster-token")
        assert got, "the follower did not dial the address that carries the proof"
    finally:
        sock.close()


def test_a_follower_refuses_a_file_others_may_write(tmp_path: Path) -> None:
    path = tmp_path / "rdv"
    path.write_text("127.0.0.1:1\n")
    path.chmod(0o666)
    with pytest.raises(RpcInitError, match="may be written by others"):
        rendezvous.read_address(str(path), 1)
    path.chmod(0o600)
    assert rendezvous.read_address(str(path), 1) == "127.0.0.1:1"


@pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to give a file away"
)
def test_a_follower_refuses_a_file_of_another_user(tmp_path: Path) -> None:
    path = tmp_path / "rdv"
    path.write_text("127.0.0.1:1\n")
    path.chmod(0o644)
    os.chown(path, 65534, 65534)
    started = time.monotonic()
    with pytest.raises(RpcInitError, match="belongs to user id 65534"):
        rendezvous.read_address(str(path), 10)
    assert time.monotonic() - started < 5  # at once: rank 0 could not replace it either
    done = _follower(path, None)
    assert done.returncode != 0 and "belongs to user id 65534" in done.stderr
