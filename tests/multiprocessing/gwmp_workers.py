"""Functions run in child processes by the gradwire.multiprocessing tests (importable by name)."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import gradwire.multiprocessing as gmp
import numpy as np
from gradwire._tensor import Tensor


def tensor(values: Any, requires_grad: bool = False) -> Tensor:
    return Tensor._wrap(np.asarray(values, dtype=np.float64), requires_grad=requires_grad)


# ----------------------------------------------------------------------------- spawn targets
def write_marker(i: int, folder: str) -> None:
    with open(os.path.join(folder, f"{i}.done"), "w") as f:
        f.write(str(os.getpid()))


def raise_in(i: int, bad: int) -> None:
    if i == bad:
        raise ValueError(f"boom from process {i}")
    time.sleep(120)


def exit_in(i: int, bad: int, code: int) -> None:
    if i == bad:
        sys.exit(code)
    time.sleep(120)


def kill_self_in(i: int, bad: int) -> None:
    if i == bad:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)


def sleep_for(i: int, seconds: float) -> None:
    time.sleep(seconds)


def orphan_parent(start_method: str) -> None:
    """Start two sleeping children, print their pids, then wait to be killed."""
    ctx = gmp.start_processes(
        sleep_for, args=(300,), nprocs=2, join=False, start_method=start_method
    )
    assert ctx is not None
    print("PIDS", *ctx.pids(), flush=True)
    ctx.join()


# ----------------------------------------------------------------------------- tensor targets
def fill_from_queue(q: Any, done: Any, value: float) -> None:
    t = q.get()
    t._data[...] = value
    done.put(True)


def fill_arg(t: Tensor, done: Any, value: float) -> None:
    t._data[...] = value
    done.put((t.requires_grad, type(t).__name__, t._hooks is None))


def fill_and_return(t: Tensor, value: float) -> float:
    t._data[...] = value
    return float(t._data.sum())


def send_and_watch(q: Any, report: Any, go: Any) -> None:
    """Send a tensor, wait for the parent to write into it, report what this side sees."""
    t = tensor(np.zeros(4))
    q.put(t)
    go.wait(30)
    report.put(t._data.tolist())


def describe_received(q: Any, report: Any, count: int) -> None:
    got = [q.get() for _ in range(count)]
    out = []
    for t in got:
        base = t._base
        out.append(
            {
                "seg": t._shared.seg_id,
                "seg_obj": id(t._shared),
                "values": t._data.tolist(),
                "requires_grad": t.requires_grad,
                "is_leaf": t.is_leaf,
                "type": type(t).__name__,
                "hooks_none": t._hooks is None,
                "base_id": None if base is None else id(base),
                "base_shape": None if base is None else list(base._data.shape),
                "id": id(t),
                "shares_base": base is not None and np.shares_memory(t._data, base._data),
            }
        )
    # write through the first received tensor so the parent can check it
    got[0]._data.flat[0] = 100.0
    report.put(out)


def send_many(q: Any, n: int, done: Any) -> None:
    for i in range(n):
        q.put(Tensor._wrap(np.full(16, i, np.float32)))
    done.wait(120)


def bounce(q_in: Any, q_out: Any) -> None:
    """Receive a tensor and send the very same object on (forwarding a received segment)."""
    t = q_in.get()
    q_out.put(t)
    q_out.put(t._shared.seg_id)
    q_in.get()  # wait until the parent has received


def attach_named_and_fill(handle: Any, value: float, done: Any) -> None:
    from gradwire.multiprocessing import _shm_client

    seg = handle.attach()
    seg.ndarray(np.float64, (4,))[:] = value
    done.put((seg.seg_id, sorted(_shm_client._clients)))


def receive_fd_and_fill(sock: Any, seg_id: str, size: int, value: float, done: Any) -> None:
    import socket

    from gradwire.multiprocessing import _segment

    _, fds, _, _ = socket.recv_fds(sock, 16, 1)
    seg = _segment.attach_fd(fds[0], seg_id, size)
    seg.ndarray(np.float64, (4,))[:] = value
    done.put(len(os.listdir("/proc/self/fd")))


def hold_named_segment(name_out: Any, strategy_size: int) -> None:
    from gradwire.multiprocessing import _segment

    seg = _segment.create(strategy_size, "file_system")
    name_out.put((os.environ["GRADWIRE_SHM_MANAGER"], seg.name))
    time.sleep(300)


def release_slots(refs: Any, how_many: int, done: Any) -> None:
    from gradwire.multiprocessing import _cuda_refcount

    for ref in refs[:how_many]:
        _cuda_refcount.release_slot(ref)
    done.put(True)


def cuda_consumer(q: Any, report: Any) -> None:
    t = q.get()
    report.put(float(t._data.sum()))
    t._data[...] = 2.0
    del t
    report.put("released")


def hold_arg_and_own_segment(t: Tensor, names: Any) -> None:
    """Map the argument, create a segment of its own, report its name, wait to be killed."""
    from gradwire.multiprocessing import _segment

    assert t._shared is not None
    own = _segment.create(64, "file_system")
    names.put(own.name)
    time.sleep(300)
