"""The segment layer (reused by the RPC same-host path) and the file_system manager."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import gradwire.multiprocessing as gmp
import gwmp_workers as w
import numpy as np
import pytest
from gradwire.multiprocessing import _segment, _shm_client
from gwmp_helpers import manager_pids, wait_gone, wait_manager_exit

TIMEOUT = 60


def _shm(name: str) -> bool:
    return os.path.exists(os.path.join("/dev/shm", name))


def test_named_segment_reference_count_removes_the_name_with_the_last_user():
    seg = _segment.create(32, "file_system")
    name = seg.name
    assert name.startswith("gradwire_fs_") and _shm(name)
    handle = seg.export()  # in flight: keeps the name alive without a mapping here
    del seg
    assert _shm(name)
    again = handle.attach()
    assert _shm(name)
    del again
    assert not _shm(name)


def test_discarded_handle_releases_its_reference():
    seg = _segment.create(8, "file_system")
    name = seg.name
    seg.export().discard()
    del seg
    assert not _shm(name)


def test_named_handle_attaches_in_another_process_and_joins_the_owning_manager(monkeypatch):
    seg = _segment.create(32, "file_system")
    token = _shm_client.token_of(seg.name)
    monkeypatch.delenv("GRADWIRE_SHM_MANAGER")  # the child does not inherit the manager
    ctx = gmp.get_context("spawn")
    done = ctx.Queue()
    p = ctx.Process(target=w.attach_named_and_fill, args=(seg.export(), 5.0, done))
    p.start()
    assert done.get(timeout=TIMEOUT) == (seg.seg_id, [token])
    p.join(TIMEOUT)
    assert seg.ndarray(np.float64, (4,)).tolist() == [5.0] * 4


def test_fd_handle_travels_with_send_fds_and_the_receiver_keeps_no_descriptor():
    seg = _segment.create(32, "file_descriptor")
    ctx = gmp.get_context("spawn")
    done = ctx.Queue()
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    p = ctx.Process(target=w.receive_fd_and_fill, args=(theirs, seg.seg_id, seg.size, 6.0, done))
    p.start()
    handle = seg.export()
    socket.send_fds(mine, [b"s"], [handle.fd])
    os.close(handle.fd)
    child_fds = done.get(timeout=TIMEOUT)
    p.join(TIMEOUT)
    assert seg.ndarray(np.float64, (4,)).tolist() == [6.0] * 4
    assert child_fds < 20
    mine.close()
    theirs.close()


def test_attaching_a_known_segment_returns_the_same_mapping_and_closes_the_descriptor():
    seg = _segment.create(16, "file_descriptor")
    before = len(os.listdir("/proc/self/fd"))
    handle = seg.export()
    assert _segment.attach_fd(handle.fd, handle.seg_id, handle.size) is seg
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_received_tensor_can_be_forwarded(strategy):
    ctx = gmp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    t = w.tensor(np.arange(3.0))
    p = ctx.Process(target=w.bounce, args=(q_in, q_out))
    p.start()
    q_in.put(t)
    back = q_out.get(timeout=TIMEOUT)
    assert q_out.get(timeout=TIMEOUT) == t._shared.seg_id
    q_in.put(None)
    p.join(TIMEOUT)
    assert back._shared is t._shared


def test_segment_api_errors():
    with pytest.raises(ValueError, match="size must be >= 0"):
        _segment.create(-1)
    with pytest.raises(ValueError, match="unknown sharing strategy"):
        _segment.create(1, "bogus")
    gone = _segment.NamedHandle("feed", "gradwire_fs_nosuch_feed", 8)
    with pytest.raises(FileNotFoundError, match="is gone"):
        gone.attach()


KILL_SELF = """
import os, signal
from gradwire.multiprocessing import _segment
seg = _segment.create(4096, "file_system")
print(os.environ["GRADWIRE_SHM_MANAGER"], seg.name, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_manager_removes_segments_of_a_client_killed_with_sigkill(script_env):
    out = subprocess.run(
        [sys.executable, "-c", KILL_SELF], env=script_env, capture_output=True, text=True
    )
    assert out.returncode == -9
    token, name = out.stdout.split()
    wait_manager_exit(token)
    assert not _shm(name)


def test_manager_gives_back_a_killed_clients_counts_and_waits_for_the_rest(monkeypatch):
    monkeypatch.delenv("GRADWIRE_SHM_MANAGER", raising=False)  # not this test process' manager
    ctx = gmp.get_context("spawn")
    names = ctx.Queue()
    first = ctx.Process(target=w.hold_named_segment, args=(names, 64))
    first.start()
    token, name1 = names.get(timeout=TIMEOUT)
    monkeypatch.setenv("GRADWIRE_SHM_MANAGER", token)  # the second client joins that manager
    second = ctx.Process(target=w.hold_named_segment, args=(names, 64))
    second.start()
    token2, name2 = names.get(timeout=TIMEOUT)
    assert token2 == token
    first.kill()
    first.join(TIMEOUT)
    # the manager gives back what the killed client held at once, not at the end of the job
    assert wait_gone(os.path.join("/dev/shm", name1))
    assert _shm(name2) and manager_pids(token)  # the other client still holds its segment
    second.kill()
    second.join(TIMEOUT)
    wait_manager_exit(token)
    assert not _shm(name1) and not _shm(name2)


def test_users_counts_mappings_and_handles_in_flight():
    seg = _segment.create(8, "file_system")
    assert seg.users() == 1
    handle = seg.export()
    assert seg.users() == 2
    handle.discard()
    assert seg.users() == 1
    assert _segment.create(8, "file_descriptor").users() is None


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_child_that_exits_gives_back_its_count(method):
    # multiprocessing children leave through os._exit (forkserver, fork) which skips atexit;
    # without the exit hook every finished child would pin the segment until the job ends.
    old = gmp.get_sharing_strategy()
    gmp.set_sharing_strategy("file_system")
    try:
        t = w.tensor(np.zeros(3))
        gmp.share_memory_(t)
        ctx = gmp.get_context(method)
        done = ctx.Queue()
        for _ in range(2):
            p = ctx.Process(target=w.fill_arg, args=(t, done, 1.0))
            p.start()
            done.get(timeout=TIMEOUT)
            p.join(TIMEOUT)
        assert t._shared.users() == 1
    finally:
        gmp.set_sharing_strategy(old)


def test_a_killed_child_gives_back_its_count_while_the_parent_runs():
    old = gmp.get_sharing_strategy()
    gmp.set_sharing_strategy("file_system")
    try:
        t = w.tensor(np.zeros(3))
        gmp.share_memory_(t)
        ctx = gmp.get_context("spawn")
        names = ctx.Queue()
        p = ctx.Process(target=w.hold_arg_and_own_segment, args=(t, names))
        p.start()
        own = names.get(timeout=TIMEOUT)
        assert t._shared.users() == 2 and _shm(own)
        p.kill()
        p.join(TIMEOUT)
        assert wait_gone(os.path.join("/dev/shm", own))  # its own segment: count 0, removed
        assert t._shared.users() == 1  # and the parent's segment is back to the parent alone
    finally:
        gmp.set_sharing_strategy(old)
