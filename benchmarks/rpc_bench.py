"""RPC benchmark: gradwire and torch.distributed.rpc, each on its defaults and over TCP only,
interleaved in rounds in one run, with raw grpcio as the floor.

    python benchmarks/rpc_bench.py [--rounds 5] [--calls 300] [--sizes 1,16,128]
        [--contestants gradwire,gradwire-tcp,torch,torch-tcp,raw] [--json out.json]

Contestants (each a driver process that measures and a peer process, kept alive all run):
  gradwire       defaults: Unix socket and shared memory to a same-host peer
  gradwire-tcp   use_unix_socket=False, shm_transfer=False (what containers and hosts get)
  torch          TensorPipe's defaults (shm transport, cma channel on one host)
  torch-tcp      TensorPipe with the "uv" (TCP) transport and the "basic" channel only
  gradwire-metrics, gradwire-tcp-metrics
                 the same with metrics on (both workers serve them; only when named, e.g.
                 --contestants gradwire,gradwire-metrics: the ratio column is on/off)
  raw            a raw grpcio server over TCP: unary calls, and a bidirectional stream echoing
                 1 MiB messages; and a plain TCP socket echo (no framework at all: the wire's
                 floor for any contestant over TCP; no remote() or autograd rows)
torch runs where it imports; else in $GRADWIRE_TORCH_PYTHON (an interpreter with torch==2.13.0
and gradwire), else its columns are skipped.

Measures (per round, every contestant in turn, so a shared machine's load hits all alike):
  noop           p50 of rpc_sync calls to a function that returns None
  async64        calls/s of rpc_async noop with 64 calls in flight
  remote N       remote() of an N MiB float32 tensor made on the peer, then to_here()
  echo N         rpc_sync echo of an N MiB float32 tensor
  autograd       one dist-autograd iteration: rpc_sync of a 512x512 matmul on the peer, a loss,
                 the distributed backward and get_gradients
  matmul3        the three 512x512 float32 matmuls of that iteration (one forward, two in the
                 backward), in the contestant's own tensor library on one BLAS thread and no
                 RPC: the iteration's compute floor (NumPy's OpenBLAS for gradwire, PyTorch's
                 for torch)
  socket N       raw only: echo of N MiB over a plain TCP socket (length-prefixed, read into a
                 fresh array and summed on both sides, as the contestants' echoes are)
Received tensors are touched (summed) on both sides, so a mapped but unread page does not
count as transferred. Each cell is the median over rounds, with the per-round range; the ratio
columns compare gradwire with torch on the same footing (defaults with defaults, TCP with TCP).
Every process computes on one BLAS thread (two workers share the machine's cores).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import secrets
import socket
import statistics
import sys
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402 - after the BLAS thread settings
from timing import median_seconds  # noqa: E402
from torch_env import have_torch, run_where_torch_is  # noqa: E402

_ECHO = "/bench.Echo/Echo"
_STREAM = "/bench.Echo/Stream"
_RAW_LIMIT = 512 << 20
_CHUNK = 1 << 20
_WINDOW = 64
_LEN = 8  # the socket echo's length prefix
ALL = ("gradwire", "gradwire-tcp", "torch", "torch-tcp", "raw")
#: Contestants run only when named: gradwire with its metrics on (issue 40; both workers serve
#: them on a port of their own, gradwire.observability), to measure what they cost.
EXTRA = ("gradwire-metrics", "gradwire-tcp-metrics")


# -- what the peers run (named by module and qualname over the wire) -------------------------


def noop() -> None:
    return None


def echo(x: Any) -> Any:
    x.sum()  # touch every received byte
    return x


def matmul(x: Any, w: Any) -> Any:
    return x @ w


def gw_ones(n: int) -> Any:
    import gradwire as gw

    return gw.ones(n)


def torch_ones(n: int) -> Any:
    import torch

    return torch.ones(n)


# -- helpers ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _p50(fn: Callable[[], Any], calls: int) -> float:
    for _ in range(min(30, calls)):
        fn()
    samples = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _rate(start: Callable[[], Any], finish: Callable[[Any], Any], total: int) -> float:
    for f in [start() for _ in range(_WINDOW)]:
        finish(f)  # warm up
    inflight: list[Any] = []
    t = time.perf_counter()
    for _ in range(total):
        if len(inflight) >= _WINDOW:
            finish(inflight.pop(0))
        inflight.append(start())
    for f in inflight:
        finish(f)
    return total / (time.perf_counter() - t)


def _median_time(fn: Callable[[], Any], repeat: int) -> float:
    # warm-ups: allocations, flow-control windows, shared-memory mappings
    return median_seconds(fn, repeat, warmup=max(1, repeat // 5))


def _repeat_for(mib: int) -> int:
    # about 0.1-0.5 s of samples per cell and round: five samples of a 2 ms call let one
    # collection or scheduler hiccup move the median
    return 40 if mib <= 2 else 10 if mib <= 16 else 3


# -- the contestants' drivers and peers ------------------------------------------------------


def _serve(conn: Any, measures: dict[str, Callable[[Any], float]]) -> None:
    """The driver's loop: run the measure the orchestrator names, send back its figure."""
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            return
        name, arg = msg
        try:
            conn.send(("ok", measures[name](arg)))
        except Exception as exc:  # noqa: BLE001 - reported in the table, the run goes on
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _gradwire_options(tcp: bool, init_method: str) -> Any:
    from gradwire.distributed import rpc

    extra = {"use_unix_socket": False, "shm_transfer": False} if tcp else {}
    return rpc.GrpcRpcBackendOptions(init_method=init_method, rpc_timeout=300, **extra)


def gradwire_leaves(gw: Any) -> tuple[Any, Any]:
    """The autograd iteration's two 512x512 float32 leaves (requires_grad), as gradwire tensors."""
    rng = np.random.default_rng(0)
    x, w = (
        gw.tensor(rng.standard_normal((512, 512)).astype(np.float32), requires_grad=True)
        for _ in range(2)
    )
    return x, w


def autograd_iteration(rpc: Any, dist_autograd: Any, x: Any, w: Any) -> None:
    """One dist-autograd iteration: rpc_sync of ``x @ w`` on "w1", a loss, the distributed
    backward and get_gradients (the same for gradwire and torch: the same API)."""
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("w1", matmul, (x, w))
        dist_autograd.backward(cid, [(y * y).mean()])
        assert dist_autograd.get_gradients(cid)[x].shape == x.shape


def _driver(lib: Any, rpc: Any, dist_autograd: Any, ones: Any, x: Any, w: Any, conn: Any) -> None:
    """Rank 0 of a framework's pair (gradwire or torch: the same API): serve the measures.

    Args:
        lib: the tensor module (``gradwire`` or ``torch``); ``rpc``/``dist_autograd`` its own.
        ones: the peer-side function making an N-element tensor (``gw_ones``/``torch_ones``).
        x, w: the 512x512 leaves of the autograd iteration.
    """

    def autograd_step() -> None:
        autograd_iteration(rpc, dist_autograd, x, w)

    def matmul3() -> None:
        with lib.no_grad():
            for _ in range(3):
                x @ w

    def remote(mib: int) -> float:
        n = (mib << 20) // 4
        return _median_time(lambda: rpc.remote("w1", ones, (n,)).to_here().sum(), _repeat_for(mib))

    def echo_of(mib: int) -> float:
        t = lib.ones((mib << 20) // 4)
        return _median_time(lambda: rpc.rpc_sync("w1", echo, (t,)).sum(), _repeat_for(mib))

    _serve(
        conn,
        {
            "noop": lambda calls: _p50(lambda: rpc.rpc_sync("w1", noop), calls),
            "async64": lambda total: _rate(
                lambda: rpc.rpc_async("w1", noop), lambda f: f.wait(), total
            ),
            "remote": remote,
            "echo": echo_of,
            "autograd": lambda iters: _median_time(autograd_step, iters),
            "matmul3": lambda iters: _median_time(matmul3, iters),
        },
    )


def _gradwire_proc(
    rank: int, tcp: bool, init_method: str, token: str, conn: Any, metrics: bool = False
) -> None:
    os.environ["GRADWIRE_TOKEN"] = token
    import gradwire as gw
    import gradwire.distributed.autograd as dist_autograd
    from gradwire.distributed import rpc

    if metrics:
        from gradwire import observability

        observability.start_metrics_server(0)

    rpc.init_rpc(f"w{rank}", rank, 2, _gradwire_options(tcp, init_method))
    if rank == 0:
        x, w = gradwire_leaves(gw)
        _driver(gw, rpc, dist_autograd, gw_ones, x, w, conn)
    else:
        conn.recv()  # the driver is done
    rpc.shutdown()


def _torch_proc(rank: int, tcp: bool, port: int, conn: Any, master: str = "127.0.0.1") -> None:
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc

    torch.set_num_threads(1)
    extra: dict[str, Any] = {"_transports": ["uv"], "_channels": ["basic"]} if tcp else {}
    opts = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://{master}:{port}", num_worker_threads=16, rpc_timeout=300, **extra
    )
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        g = torch.Generator().manual_seed(0)
        x, w = (torch.randn(512, 512, generator=g, requires_grad=True) for _ in range(2))
        _driver(torch, rpc, dist_autograd, torch_ones, x, w, conn)
    else:
        conn.recv()
    rpc.shutdown()


def _recv_array(sock: socket.socket, nbytes: int) -> np.ndarray:
    buf = np.empty(nbytes, dtype=np.uint8)
    view, got = memoryview(buf), 0
    while got < nbytes:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError(f"socket echo: connection closed after {got} of {nbytes} bytes")
        got += k
    return buf


def _socket_echo_server(listener: socket.socket) -> None:
    """The socket floor's peer: each length-prefixed message read into a fresh array, summed
    and sent back."""
    while True:
        try:
            sock, _ = listener.accept()
        except OSError:  # the listener closed: the run is over
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with sock:
            try:
                while True:
                    head = _recv_array(sock, _LEN)
                    data = _recv_array(sock, int.from_bytes(head.tobytes(), "little"))
                    data.view(np.float32).sum()
                    sock.sendall(head)
                    sock.sendall(data)
            except ConnectionError:
                pass


def _raw_server_proc(port: int, socket_port: int, conn: Any) -> None:
    import threading

    import grpc

    listener = socket.create_server(("127.0.0.1", socket_port))
    threading.Thread(target=_socket_echo_server, args=(listener,), daemon=True).start()

    opts = [
        ("grpc.max_send_message_length", _RAW_LIMIT),
        ("grpc.max_receive_message_length", _RAW_LIMIT),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(16), options=opts)

    def echo_stream(requests: Any, context: Any) -> Any:
        yield from requests

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(lambda r, c: r),
            "Stream": grpc.stream_stream_rpc_method_handler(echo_stream),
        },
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    conn.recv()
    server.stop(0)
    listener.close()


def _raw_driver_proc(port: int, socket_port: int, conn: Any) -> None:
    import grpc

    opts = [
        ("grpc.max_send_message_length", _RAW_LIMIT),
        ("grpc.max_receive_message_length", _RAW_LIMIT),
    ]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=opts)
    grpc.channel_ready_future(channel).result(timeout=30)
    unary = channel.unary_unary(_ECHO)
    small = b"x" * 64
    requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    replies = channel.stream_stream(_STREAM)(iter(requests.get, None), timeout=3600)

    def unary_echo(mib: int) -> float:
        data = np.ones((mib << 20) // 4, dtype=np.float32).tobytes()
        return _median_time(
            lambda: np.frombuffer(unary(data, timeout=300), dtype=np.float32).sum(),
            _repeat_for(mib),
        )

    def stream_echo(mib: int) -> float:
        # The payload as 1 MiB messages on an open stream, all sent before the first is read
        # back (the window of a pipelined transfer); the echoed chunks are touched.
        chunk = np.ones(_CHUNK // 4, dtype=np.float32).tobytes()

        def once() -> None:
            for _ in range(mib):
                requests.put(chunk)
            for _ in range(mib):
                np.frombuffer(next(replies), dtype=np.float32).sum()

        return _median_time(once, _repeat_for(mib))

    sock = socket.create_connection(("127.0.0.1", socket_port), timeout=300)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def socket_echo(mib: int) -> float:
        data = np.ones((mib << 20) // 4, dtype=np.float32)
        head = data.nbytes.to_bytes(_LEN, "little")

        def once() -> None:
            sock.sendall(head)
            sock.sendall(data)
            _recv_array(sock, _LEN)
            _recv_array(sock, data.nbytes).view(np.float32).sum()

        return _median_time(once, _repeat_for(mib))

    try:
        _serve(
            conn,
            {
                "noop": lambda calls: _p50(lambda: unary(small, timeout=10), calls),
                "async64": lambda total: _rate(
                    lambda: unary.future(small, timeout=10), lambda f: f.result(), total
                ),
                "echo": unary_echo,
                "stream": stream_echo,
                "socket": socket_echo,
            },
        )
    finally:
        requests.put(None)
        channel.close()
        sock.close()


# -- the orchestrator -------------------------------------------------------------------------


class Contestant:
    """A driver (measuring, over a Pipe) and its peer process or processes."""

    def __init__(self, name: str, ctx: Any) -> None:
        self.name = name
        self.conn, driver_end = ctx.Pipe()
        peer_conn, self._peer_stop = ctx.Pipe()
        if name.startswith("gradwire"):
            init = f"tcp://127.0.0.1:{_free_port()}"
            token = secrets.token_hex(16)
            tcp = "-tcp" in name
            metrics = name.endswith("-metrics")
            targets = [
                (_gradwire_proc, (0, tcp, init, token, driver_end, metrics)),
                (_gradwire_proc, (1, tcp, init, token, peer_conn, metrics)),
            ]
        elif name.startswith("torch"):
            port = _free_port()
            tcp = name.endswith("-tcp")
            targets = [
                (_torch_proc, (0, tcp, port, driver_end)),
                (_torch_proc, (1, tcp, port, peer_conn)),
            ]
        else:
            port, socket_port = _free_port(), _free_port()
            targets = [
                (_raw_server_proc, (port, socket_port, peer_conn)),
                (_raw_driver_proc, (port, socket_port, driver_end)),
            ]
        self.procs = [ctx.Process(target=t, args=a, daemon=True) for t, a in targets]
        for p in self.procs:
            p.start()
        self._wait("start", 180)
        assert self.conn.recv() == "ready"

    def _wait(self, what: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.conn.poll(0.5):
            dead = [p for p in self.procs if not p.is_alive()]
            if dead:
                raise RuntimeError(
                    f"{self.name}: a process exited (code {dead[0].exitcode}) during {what}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no answer to {what} within {seconds:.0f} s")

    def measure(self, name: str, arg: Any) -> float | str:
        self.conn.send((name, arg))
        self._wait(f"{name}({arg})", 900)
        status, value = self.conn.recv()
        return float(value) if status == "ok" else str(value)

    def close(self) -> None:
        for conn in (self.conn, self._peer_stop):
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(60)
            if p.is_alive():
                p.kill()


#: (row label, measure, argument, unit); "s" rows are times (lower is better), "/s" rates.
def _rows(ns: argparse.Namespace, sizes: list[int]) -> list[tuple[str, str, Any, str]]:
    rows: list[tuple[str, str, Any, str]] = [
        ("noop rpc_sync p50", "noop", ns.calls, "s"),
        ("rpc_async noop, 64 in flight", "async64", ns.async_calls, "/s"),
    ]
    rows += [(f"remote()+to_here() {m} MiB", "remote", m, "s") for m in sizes]
    rows += [(f"rpc_sync echo {m} MiB", "echo", m, "s") for m in sizes]
    rows += [(f"raw stream echo {m} MiB (1 MiB messages)", "stream", m, "s") for m in sizes]
    rows += [(f"raw TCP socket echo {m} MiB (no framework)", "socket", m, "s") for m in sizes]
    rows.append(("dist-autograd iteration (512x512 matmul on the peer)", "autograd", ns.iters, "s"))
    rows.append(("its 3 matmuls alone, one BLAS thread (compute floor)", "matmul3", ns.iters, "s"))
    return rows


def _applies(contestant: str, measure: str) -> bool:
    if contestant == "raw":
        return measure in ("noop", "async64", "echo", "stream", "socket")
    return measure not in ("stream", "socket")


def _fmt(value: float, unit: str) -> str:
    if unit == "/s":
        return f"{value:,.0f}/s"
    if value < 1e-3:
        return f"{value * 1e6:.0f} us"
    return f"{value * 1e3:.2f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300, help="noop calls per round")
    parser.add_argument("--async-calls", type=int, default=2000, help="rpc_async calls per round")
    parser.add_argument("--iters", type=int, default=20, help="autograd iterations per round")
    parser.add_argument("--sizes", default="1,16,128", help="tensor sizes in MiB")
    parser.add_argument("--contestants", default=",".join(ALL))
    parser.add_argument("--json", help="also write the figures to this file")
    ns = parser.parse_args()
    sizes = [int(s) for s in ns.sizes.split(",")]
    wanted = [c.strip() for c in ns.contestants.split(",") if c.strip()]
    unknown = set(wanted) - set(ALL) - set(EXTRA)
    if unknown:
        known = ", ".join(ALL + EXTRA)
        parser.error(f"unknown contestants {sorted(unknown)}; choose from {known}")
    if any(c.startswith("torch") for c in wanted):
        run_where_torch_is()
    if not have_torch():
        print("torch: not importable here nor in $GRADWIRE_TORCH_PYTHON; its columns are skipped")
        wanted = [c for c in wanted if not c.startswith("torch")]
    ctx = mp.get_context("spawn")
    contestants = []
    try:
        for name in wanted:
            contestants.append(Contestant(name, ctx))
        rows = _rows(ns, sizes)
        figures: dict[tuple[str, str], list[float]] = {}
        errors: dict[tuple[str, str], str] = {}
        for r in range(ns.rounds):
            for label, measure, arg, _unit in rows:
                for c in contestants:
                    if not _applies(c.name, measure) or (label, c.name) in errors:
                        continue
                    value = c.measure(measure, arg)
                    if isinstance(value, str):
                        errors[(label, c.name)] = value
                    else:
                        figures.setdefault((label, c.name), []).append(value)
            print(f"round {r + 1}/{ns.rounds} done", file=sys.stderr, flush=True)
    finally:
        for c in contestants:
            c.close()
    names = [c.name for c in contestants]
    _report(rows, names, figures, errors, ns)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(
                {
                    "argv": sys.argv[1:],
                    "figures": {f"{label} | {c}": v for (label, c), v in figures.items()},
                    "errors": {f"{label} | {c}": e for (label, c), e in errors.items()},
                },
                f,
                indent=1,
            )
    return 0


def _report(
    rows: list[tuple[str, str, Any, str]],
    names: list[str],
    figures: dict[tuple[str, str], list[float]],
    errors: dict[tuple[str, str], str],
    ns: argparse.Namespace,
) -> None:
    med = {k: statistics.median(v) for k, v in figures.items()}
    pairs = [
        (g, t)
        for g, t in (
            ("gradwire", "torch"),
            ("gradwire-tcp", "torch-tcp"),
            ("gradwire-metrics", "gradwire"),
            ("gradwire-tcp-metrics", "gradwire-tcp"),
        )
        if g in names and t in names
    ]
    header = ["measure"] + names + [f"{g}/{t}" for g, t in pairs]
    table = []
    for label, _measure, _arg, unit in rows:
        cells = [label]
        for c in names:
            key = (label, c)
            if key in errors:
                cells.append("error")
            elif key in med:
                lo, hi = min(figures[key]), max(figures[key])
                cells.append(f"{_fmt(med[key], unit)} ({_fmt(lo, unit)}-{_fmt(hi, unit)})")
            else:
                cells.append("")
        for g, t in pairs:
            if (label, g) in med and (label, t) in med:
                ratio = med[(label, g)] / med[(label, t)]
                cells.append(f"{ratio:.2f}")
            else:
                cells.append("")
        if any(cells[1:]):
            table.append(cells)
    print(
        f"rpc_bench: {ns.rounds} rounds interleaved; median (per-round range); ratios gradwire/torch "
        "(times: below 1 is gradwire faster; calls/s: above 1 is)"
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for cells in table:
        print("| " + " | ".join(cells) + " |")
    for (label, c), e in errors.items():
        print(f"error: {c}, {label}: {e}")


if __name__ == "__main__":
    sys.exit(main())
