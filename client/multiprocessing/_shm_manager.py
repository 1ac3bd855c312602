"""The file_system strategy's janitor: a small daemon that removes named segments left behind.

Every process that creates or maps a named segment keeps one Unix-socket connection to the
manager of its process group. The manager runs in its own session, so signals aimed at the
group do not reach it. When its last client is gone (a normal exit or a ``kill -9``: the kernel
closes the socket either way) it waits ``grace`` seconds for new connections, then unlinks every
``/dev/shm/gradwire_fs_<token>_*`` still there and exits.

This file runs as a script (``python -I _shm_manager.py FD TOKEN GRACE``) and imports only the
standard library, so the daemon starts fast and does not load gradwire.
"""

from __future__ import annotations

import logging
import os
import secrets
import selectors
import socket
import subprocess
import sys
import threading

__all__ = ["ENV_VAR", "SHM_DIR", "connect", "join", "segment_prefix", "token_of"]

ENV_VAR = "GRADWIRE_SHM_MANAGER"
SHM_DIR = "/dev/shm"
DEFAULT_GRACE = 0.5

log = logging.getLogger(__name__)
_lock = threading.Lock()
_token: str | None = None  # the manager new segments of this process are registered with
_clients: dict[str, socket.socket] = {}  # every manager this process is a client of


def _reset_lock_after_fork() -> None:  # a thread of the parent may have held it while forking
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock_after_fork)


def _address(token: str) -> str:
    return "\0gradwire_shm_manager_" + token  # abstract namespace: no socket file to clean up


def segment_prefix(token: str) -> str:
    """The name prefix of every named segment the manager ``token`` looks after."""
    return f"gradwire_fs_{token}_"


def connect() -> str:
    """Connect this process to its group's manager, starting one if needed; return its token.

    A process started from one that already uses a manager (the token travels in the environment
    variable ``GRADWIRE_SHM_MANAGER``) joins that manager, so one manager serves a whole job.

    Returns:
        The manager's token, the middle part of the names of segments it looks after.

    Raises:
        OSError: if no manager can be started (for example no Unix sockets).

    Example:
        >>> token = connect()
        >>> segment_prefix(token).startswith("gradwire_fs_")
        True
    """
    global _token
    with _lock:
        if _token is not None:
            return _token
        token = os.environ.get(ENV_VAR)
        if token and _join_locked(token):
            _token = token
            return token
        if token:
            log.debug("shared-memory manager %s is gone; starting a new one", token)
        sock, token = _start_manager()
        _clients[token] = sock
        _token = token
        os.environ[ENV_VAR] = token
        return token


def join(token: str) -> bool:
    """Become a client of manager ``token`` (the one that owns a segment being attached).

    Returns:
        False if that manager is gone (its segments are then gone too).
    """
    with _lock:
        return _join_locked(token)


def token_of(name: str) -> str | None:
    """The manager token inside a segment name made by :func:`segment_prefix`, or None."""
    parts = name.split("_")
    return parts[2] if len(parts) == 4 and name.startswith("gradwire_fs_") else None


def _join_locked(token: str) -> bool:
    if token in _clients:
        return True
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(_address(token))
    except OSError:
        sock.close()
        return False
    _clients[token] = sock
    return True


def _start_manager() -> tuple[socket.socket, str]:
    token = secrets.token_hex(6)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(_address(token))
        listener.listen(128)
        # Connect before the daemon exists: the connection waits in the backlog, so the manager
        # can never see "no clients" before its creator is counted.
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(_address(token))
        proc = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), str(listener.fileno()), token],
            pass_fds=(listener.fileno(),),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    finally:
        listener.close()
    log.debug("started shared-memory manager pid %d token %s", proc.pid, token)
    return client, token


def _cleanup(token: str) -> int:
    prefix = segment_prefix(token)
    removed = 0
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return 0
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def serve(listener: socket.socket, token: str, grace: float = DEFAULT_GRACE) -> None:
    """Count clients until none is left for ``grace`` seconds, then remove leftovers."""
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    clients = 0
    while True:
        events = sel.select(timeout=None if clients else grace)
        if not events and clients == 0:
            break
        for key, _ in events:
            if key.fileobj is listener:
                conn, _ = listener.accept()
                sel.register(conn, selectors.EVENT_READ)
                clients += 1
                continue
            client = key.fileobj
            assert isinstance(client, socket.socket)
            try:
                data = client.recv(4096)
            except OSError:
                data = b""
            if not data:  # the client exited or was killed
                sel.unregister(client)
                client.close()
                clients -= 1
    listener.close()
    removed = _cleanup(token)
    log.info("shared-memory manager %s: all clients gone, removed %d segment(s)", token, removed)


if __name__ == "__main__":
    _fd, _tok = int(sys.argv[1]), sys.argv[2]
    _grace = float(os.environ.get("GRADWIRE_SHM_MANAGER_GRACE", DEFAULT_GRACE))
    serve(socket.socket(fileno=_fd), _tok, _grace)
