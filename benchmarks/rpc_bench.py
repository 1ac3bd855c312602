"""RPC benchmark: gradwire vs a raw grpcio unary echo server and torch.distributed.rpc.

    python benchmarks/rpc_bench.py [--calls 3000] [--sizes 1,16,128]

Measures, between two processes on this machine:
  * noop rpc_sync latency (p50 / p99), against a raw grpcio unary echo of a small message (the
    target's baseline) and, for reference, a raw grpcio echo on an open bidirectional stream
    (gradwire's rpc_sync rides such a stream, see gradwire._runtime.calls.streams);
  * rpc_async throughput with 64 calls in flight;
  * echo of 1 / 16 / 128 MiB float32 tensors (GB/s of round-trip payload = 2 * size / time),
    against raw grpcio unary echo of the same bytes;
  * the same three for torch.distributed.rpc over TCP (TensorPipe, ``_transports=["uv"]``) when
    torch is importable (install torch==2.13.0 only in a separate benchmark environment).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import queue
import secrets
import shutil
import socket
import sys
import tempfile
import time
from concurrent import futures
from typing import Any

import numpy as np

log = logging.getLogger("rpc_bench")
_METHOD = "/bench.Echo/Echo"
_STREAM = "/bench.Echo/Stream"


def noop() -> None:
    return None


def echo(x: Any) -> Any:
    return x


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gradwire_peer(init_method: str, token: str, stop: Any, chunk: int) -> None:
    os.environ["GRADWIRE_TOKEN"] = token
    from gradwire.distributed import rpc

    options = rpc.GrpcRpcBackendOptions(init_method=init_method, chunk_bytes=chunk)
    rpc.init_rpc("peer", 1, 2, options)
    stop.wait()
    rpc.shutdown()


def _raw_server(port: int, unix_path: str, stop: Any) -> None:
    import grpc

    limit = 512 << 20
    server = grpc.server(
        futures.ThreadPoolExecutor(16),
        options=[
            ("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit),
        ],
    )

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
    server.add_insecure_port(f"unix:{unix_path}")
    server.start()
    stop.wait()
    server.stop(0)


def _torch_pair(rank: int, port: int, calls: int, sizes: list[int], out: Any) -> None:
    """torch.distributed.rpc over TCP (TensorPipe, "uv" transport): rank 0 measures."""
    import torch
    import torch.distributed.rpc as trpc

    opts = trpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}", _transports=["uv"], num_worker_threads=16
    )
    trpc.init_rpc(f"t{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        p50, p99 = _percentiles(_samples(lambda: trpc.rpc_sync("t1", noop), calls))
        rate = _throughput(lambda: trpc.rpc_async("t1", noop), lambda f: f.wait(), max(2000, calls))
        echoes = {}
        for mib in sizes:
            t = torch.ones((mib << 20) // 4, dtype=torch.float32)
            echoes[mib] = _echo_rate(
                lambda t=t: trpc.rpc_sync("t1", echo, (t,), timeout=300), mib << 20, 3
            )
        out.put({"p50": p50, "p99": p99, "rate": rate, "echo": echoes})
    trpc.shutdown()


def _run_torch(calls: int, sizes: list[int]) -> dict[str, Any] | None:
    try:
        import torch.distributed.rpc  # noqa: F401
    except ImportError:
        return None
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_torch_pair, args=(r, port, calls, sizes, out), daemon=True)
        for r in range(2)
    ]
    for p in procs:
        p.start()
    try:
        result: dict[str, Any] = out.get(timeout=900)
    finally:
        for p in procs:
            p.join(60)
    return result


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _samples(fn: Any, calls: int) -> list[float]:
    for _ in range(min(50, calls)):
        fn()
    samples = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return samples


def _throughput(start: Any, finish: Any, total: int, window: int = 64) -> float:
    inflight: list[Any] = []
    t = time.perf_counter()
    for _ in range(total):
        if len(inflight) >= window:
            finish(inflight.pop(0))
        inflight.append(start())
    for f in inflight:
        finish(f)
    return total / (time.perf_counter() - t)


def _echo_rate(fn: Any, nbytes: int, repeat: int) -> float:
    fn()  # warm up (allocations, channel windows)
    best = min(_timed(fn) for _ in range(repeat))
    return 2 * nbytes / best / 1e9


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--sizes", default="1,16,128", help="echo sizes in MiB")
    parser.add_argument(
        "--chunk-mib", type=float, default=1.0, help="gradwire chunk_bytes in MiB (default 1)"
    )
    ns = parser.parse_args()
    sizes = [int(s) for s in ns.sizes.split(",")]
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import grpc
    from gradwire.distributed import rpc

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    token = secrets.token_hex(16)
    os.environ["GRADWIRE_TOKEN"] = token
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    chunk = int(ns.chunk_mib * (1 << 20))
    raw_port = _free_port()
    unix_dir = tempfile.mkdtemp(prefix="gw-bench-")
    unix_path = os.path.join(unix_dir, "raw.sock")
    procs = [
        ctx.Process(target=_gradwire_peer, args=(init_method, token, stop, chunk), daemon=True),
        ctx.Process(target=_raw_server, args=(raw_port, unix_path, stop), daemon=True),
    ]
    for p in procs:
        p.start()
    rpc.init_rpc(
        "driver", 0, 2, rpc.GrpcRpcBackendOptions(init_method=init_method, chunk_bytes=chunk)
    )
    rows: list[tuple[str, str]] = []
    try:
        limit = 512 << 20
        opts = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]
        channel = grpc.insecure_channel(f"127.0.0.1:{raw_port}", options=opts)
        unix_channel = grpc.insecure_channel(f"unix:{unix_path}", options=opts)
        for ch in (channel, unix_channel):
            grpc.channel_ready_future(ch).result(timeout=30)
        raw = channel.unary_unary(_METHOD)
        raw_unix = unix_channel.unary_unary(_METHOD)
        small = b"x" * 64
        requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        replies = unix_channel.stream_stream(_STREAM)(iter(requests.get, None), timeout=600)

        def stream_echo() -> None:
            requests.put(small)
            next(replies)

        # Interleaved rounds, so that the load of a shared machine hits every contestant alike.
        samples: dict[str, list[float]] = {"tcp": [], "unix": [], "stream": [], "gradwire": []}
        contestants = {
            "tcp": lambda: raw(small, timeout=10),
            "unix": lambda: raw_unix(small, timeout=10),
            "stream": stream_echo,
            "gradwire": lambda: rpc.rpc_sync("peer", noop),
        }
        rounds = 10
        for _ in range(rounds):
            for key, fn in contestants.items():
                samples[key] += _samples(fn, max(1, ns.calls // rounds))
        requests.put(None)
        (t50, t99), (u50, u99), (s50, s99), (g50, g99) = (
            _percentiles(samples[k]) for k in ("tcp", "unix", "stream", "gradwire")
        )
        for label, p50, p99 in (
            ("raw grpcio unary echo, TCP loopback", t50, t99),
            ("raw grpcio unary echo, Unix socket", u50, u99),
            ("raw grpcio echo on an open stream, Unix socket", s50, s99),
            ("gradwire noop rpc_sync (Unix socket)", g50, g99),
        ):
            rows.append((f"{label} p50 / p99", f"{p50 * 1e6:.0f} us / {p99 * 1e6:.0f} us"))
        rows.append(
            ("gradwire p50 / raw TCP p50, / raw Unix p50", f"{g50 / t50:.2f}x, {g50 / u50:.2f}x")
        )
        rows.append(("gradwire p50 / raw stream p50 (reference)", f"{g50 / s50:.2f}x"))

        total = max(2000, ns.calls)
        gw_rate = _throughput(lambda: rpc.rpc_async("peer", noop), lambda f: f.wait(), total)
        raw_rate = _throughput(lambda: raw.future(small, timeout=10), lambda f: f.result(), total)
        rows.append(
            (
                "rpc_async 64 in flight: gradwire / raw unary TCP",
                f"{gw_rate:.0f} / {raw_rate:.0f} calls/s",
            )
        )

        from gradwire._tensor import Tensor

        gw_echo: dict[int, float] = {}
        for mib in sizes:
            nbytes = mib << 20
            t_arr = Tensor._wrap(np.ones(nbytes // 4, dtype=np.float32))
            data = t_arr._data.tobytes()
            repeat = 5 if mib <= 16 else 3
            gw = _echo_rate(
                lambda t=t_arr: rpc.rpc_sync("peer", echo, (t,), timeout=300), nbytes, repeat
            )
            rw = _echo_rate(lambda d=data: raw(d, timeout=300), nbytes, repeat)
            ru = _echo_rate(lambda d=data: raw_unix(d, timeout=300), nbytes, repeat)
            gw_echo[mib] = gw
            rows.append(
                (
                    f"echo {mib} MiB: gradwire / raw unary TCP / raw unary Unix",
                    f"{gw:.2f} / {rw:.2f} / {ru:.2f} GB/s (round-trip payload)",
                )
            )
        channel.close()
        unix_channel.close()
        # torch runs after gradwire's rounds, in its own pair of processes (same machine).
        torch_res = _run_torch(ns.calls, sizes)
        if torch_res is None:
            rows.append(("torch.distributed.rpc", "not installed: skipped"))
        else:
            tp50, tp99 = torch_res["p50"], torch_res["p99"]
            rows.append(
                (
                    "torch.distributed.rpc (TensorPipe uv) noop p50 / p99",
                    f"{tp50 * 1e6:.0f} us / {tp99 * 1e6:.0f} us",
                )
            )
            rows.append(("gradwire p50 / torch p50", f"{g50 / tp50:.2f}x"))
            rows.append(
                (
                    "rpc_async 64 in flight: gradwire / torch",
                    f"{gw_rate:.0f} / {torch_res['rate']:.0f} calls/s",
                )
            )
            for mib, rate in torch_res["echo"].items():
                rows.append(
                    (
                        f"echo {mib} MiB: gradwire / torch",
                        f"{gw_echo[mib]:.2f} / {rate:.2f} GB/s (round-trip payload)",
                    )
                )
    finally:
        stop.set()
        rpc.shutdown()
        for p in procs:
            p.join(10)
        shutil.rmtree(unix_dir, ignore_errors=True)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        log.info("%s  %s", k.ljust(width), v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
