"""The floor under the fan-in on this machine: the same pattern as ``scale_bench.py``'s fan-in
(one caller, a noop call to each of N-1 other processes in turn, ``--inflight`` at once), done by
the least Python that can do it, with no RPC framework at all.

Each callee is a process with one thread blocked on its socket: it reads whatever calls came
(length-prefixed pickles), runs each (``--handoff``: on a second thread, as a server with a
serving pool does) and writes the pickled replies back. The caller writes each call from the
issuing thread and reads every reply on one selector thread, as gradwire's lane pipes do.

What it prints: calls/s and the CPU per call of the caller and of the callees (from
``/proc``), so a framework's figures from ``scale_bench.py`` can be read against what waking
N-1 processes per call costs here. ``--rate`` paces the caller (a framework's calls/s: each
callee then gets its calls one at a time, as in a framework's fan-in, instead of batched).
Not a test: no assertion, nothing timed in CI.

    python benchmarks/fanin_floor.py --sizes 2,32 [--handoff] [--rate 7000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pickle
import queue
import selectors
import socket
import struct
import threading
import time
from typing import Any

HEAD = struct.Struct("<I")


def noop() -> None:
    return None


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _callee(conn: socket.socket, handoff: bool) -> None:
    work: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    lock = threading.Lock()

    def run(raw: bytes) -> None:
        call_id, name, args = pickle.loads(raw)
        body = pickle.dumps((call_id, globals()[name](*args)))
        with lock:
            conn.sendall(HEAD.pack(len(body)) + body)

    def pool() -> None:
        while True:
            run(work.get())

    if handoff:
        threading.Thread(target=pool, daemon=True).start()
    buf = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return
        buf += chunk
        while len(buf) >= HEAD.size:
            (n,) = HEAD.unpack_from(buf)
            if len(buf) < HEAD.size + n:
                break
            raw, buf = buf[HEAD.size : HEAD.size + n], buf[HEAD.size + n :]
            if handoff:
                work.put(raw)
            else:
                run(raw)


def _serve(port_out: Any, handoff: bool) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port_out.put(listener.getsockname()[1])
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _callee(conn, handoff)


def _fan_in(conns: list[socket.socket], calls: int, inflight: int, rate: float = 0.0) -> float:
    slots = threading.Semaphore(inflight)
    done = threading.Event()
    total = calls * len(conns)
    left = [total]
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c, selectors.EVENT_READ, [b""])

    def reader() -> None:
        while left[0]:
            for key, _ in sel.select(1.0):
                chunk = key.fileobj.recv(65536)  # type: ignore[union-attr]
                buf = key.data[0] + chunk
                while len(buf) >= HEAD.size:
                    (n,) = HEAD.unpack_from(buf)
                    if len(buf) < HEAD.size + n:
                        break
                    pickle.loads(buf[HEAD.size : HEAD.size + n])
                    buf = buf[HEAD.size + n :]
                    left[0] -= 1
                    slots.release()
                key.data[0] = buf
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    locks = [threading.Lock() for _ in conns]
    start = time.perf_counter()
    for i in range(total):
        slots.acquire()
        if rate and i % 64 == 0:  # paced: 64 calls at a time, on schedule
            ahead = start + i / rate - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
        k = i % len(conns)
        body = pickle.dumps((i, "noop", ()))
        with locks[k]:
            conns[k].sendall(HEAD.pack(len(body)) + body)
    done.wait(600)
    return total / (time.perf_counter() - start)


def run(n: int, calls: int, inflight: int, handoff: bool, rate: float) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    ports: Any = ctx.Queue()
    procs = [ctx.Process(target=_serve, args=(ports, handoff), daemon=True) for _ in range(n - 1)]
    for p in procs:
        p.start()
    conns = []
    for _ in procs:
        c = socket.create_connection(("127.0.0.1", ports.get(timeout=60)))
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.append(c)
    _fan_in(conns, 20, inflight)  # warm-up
    me = os.getpid()
    before = [_cpu(me)] + [_cpu(p.pid) for p in procs]  # type: ignore[arg-type]
    cps = _fan_in(conns, calls, inflight, rate)
    after = [_cpu(me)] + [_cpu(p.pid) for p in procs]  # type: ignore[arg-type]
    total = calls * (n - 1)
    for c in conns:
        c.close()
    for p in procs:
        p.join(10)
    return {
        "calls/s": cps,
        "caller us/call": 1e6 * (after[0] - before[0]) / total,
        "callees us/call": 1e6 * (sum(after[1:]) - sum(before[1:])) / total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,32")
    parser.add_argument("--calls", type=int, default=300, help="calls to each callee")
    parser.add_argument("--inflight", type=int, default=256)
    parser.add_argument("--rate", type=float, default=0.0, help="calls/s at most (0: no pacing)")
    parser.add_argument("--handoff", action="store_true", help="callees run calls on a thread")
    args = parser.parse_args()
    for n in (int(s) for s in args.sizes.split(",")):
        calls = max(args.calls, 20000 // (n - 1))
        out = run(n, calls, args.inflight, args.handoff, args.rate)
        print(
            f"N={n} handoff={args.handoff} rate={args.rate:,.0f}: "
            + ", ".join(f"{k} {v:,.0f}" for k, v in out.items())
        )


if __name__ == "__main__":
    main()
