"""This process' side of the file_system manager: connect, join, and report held counts.

Every process that maps a named segment is a client of the manager whose token is in the
segment's name and tells it ``+name`` / ``-name`` as it takes and gives back its count. When a
client disappears without giving its counts back (``kill -9``, ``os._exit``, a Pool worker
terminated), the manager gives them back for it at once; whatever is still left when the last
client is gone is removed then.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import subprocess
import sys
import threading

from . import _shm_manager
from ._shm_manager import ENV_VAR, address, segment_prefix, token_of

__all__ = ["connect", "join", "notify", "segment_prefix", "token_of"]

log = logging.getLogger(__name__)
_lock = threading.Lock()
_token: str | None = None  # the manager new segments of this process are registered with
_clients: dict[str, socket.socket] = {}  # every manager this process is a client of


def _after_fork_in_child() -> None:
    # The child's counts must be its own: drop the parent's connections (closing this copy
    # leaves the parent's open) and reconnect on first use.
    global _lock
    _lock = threading.Lock()
    for sock in _clients.values():
        sock.close()
    _clients.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


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
        for token in (_token, os.environ.get(ENV_VAR)):
            if token and _join_locked(token):
                _token = token
                os.environ[ENV_VAR] = token
                return token
        if _token or os.environ.get(ENV_VAR):
            log.debug("shared-memory manager is gone; starting a new one")
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


def notify(name: str, took: bool) -> None:
    """Tell ``name``'s manager this process took (``took``) or gave back one count on it.

    Example:
        >>> notify(seg.name, took=True)   # right after mapping it
    """
    token = token_of(name)
    if token is None:
        return
    line = ("+" if took else "-") + name + "\n"
    with _lock:
        if not _join_locked(token):
            return  # the manager is gone; nothing left to keep track of
        try:
            _clients[token].sendall(line.encode())
        except OSError:
            log.debug("lost the connection to shared-memory manager %s", token)


def _join_locked(token: str) -> bool:
    if token in _clients:
        return True
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address(token))
    except OSError:
        sock.close()
        return False
    _clients[token] = sock
    return True


def _start_manager() -> tuple[socket.socket, str]:
    token = secrets.token_hex(6)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address(token))
        listener.listen(128)
        # Connect before the daemon exists: the connection waits in the backlog, so the manager
        # can never see "no clients" before its creator is counted.
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(address(token))
        proc = subprocess.Popen(
            [sys.executable, "-I", _shm_manager.__file__, str(listener.fileno()), token],
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
