"""Scale benchmark: a cluster of N workers on one host, gradwire and torch.distributed.rpc side by
side, each on its defaults and over TCP only.

    python benchmarks/scale_bench.py [--sizes 2,8,16,32,64] [--rounds 1]
        [--contestants gradwire,gradwire-tcp,torch,torch-tcp] [--json out.json]
        [--calls 200] [--inflight 256] [--a2a-rounds 20] [--deadline 600]

Contestants: ``gradwire`` (defaults: Unix sockets and shared memory between same-host workers),
``gradwire-tcp`` (``use_unix_socket=False``, ``shm_transfer=False``), ``torch`` (TensorPipe's
defaults), ``torch-tcp`` (TensorPipe's "uv" transport and "basic" channel). torch runs where it
imports, else in ``$GRADWIRE_TORCH_PYTHON``, else its columns are skipped. For each N the
contestants run in turn (their order alternating from round to round), each run a fresh
cluster of N processes with its own deadline; the load average is recorded at each run's start.

Measures, per run (the harness is the same for both frameworks; the parent process reads every
worker's ``/proc`` entries, so no framework measures itself):
  init_s        from launching the N processes until every worker returned from ``init_rpc``
  a2a_ms        all-to-all: every worker ``rpc_async`` a noop to every other worker and waits
                for all, ``--a2a-rounds`` rounds; the median round (at N=2: one call each way)
  rss_mib       resident memory per worker (median), measured idle after the all-to-all
  threads       threads per worker (max), idle after the all-to-all
  idle_cpu_s    CPU seconds the whole cluster used in 3 s with no calls (after 6 s to settle)
  fanin_cps     fan-in, the parameter-server pattern: worker 0 calls a noop on every other
                worker ``--calls`` times each (at least ``MIN_FANIN_CALLS`` calls in all: at
                N=2, 200 calls were over in 75 ms, mostly the ramp; 6,000 at N=32 were over
                in under a second, and the same code measured 1.00x-1.33x PyTorch's),
                ``--inflight`` calls in flight; calls per second
  fanin_p50/p99 those calls' latencies (ms), from start to the future's callback
  fanin CPU/call the CPU time worker 0 (caller) and all the others (callees) spent during the
                fan-in, per call (us): with 2 cores, calls/s can be no more than
                2 s / (caller + callees) and 1 s / caller
  fanout_ms     fan-out: worker 0 ``remote()`` a 1000-element tensor on every other worker,
                then ``to_here()`` each; the median of 5 such sweeps
  shutdown_s    graceful ``shutdown()``, from the barrier before it until every worker returned
An error (or the deadline) ends that run; it is reported in its cell and the next run starts.
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
import threading
import time
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch_env import have_torch, run_where_torch_is  # noqa: E402

ALL = ("gradwire", "gradwire-tcp", "torch", "torch-tcp")
SETTLE_S = 6.0  # past the lane's linger (2 s) and the call pipes' idle close (5 s)
IDLE_S = 3.0
_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


# -- what the workers run (named by module and qualname over the wire) ------------------------


def noop() -> None:
    return None


def ones(lib: str, n: int) -> Any:
    if lib == "torch":
        import torch

        return torch.ones(n)
    import gradwire as gw

    return gw.ones(n)


# -- one worker ---------------------------------------------------------------------------------


def _init(contestant: str, rank: int, n: int, port: int, token: str) -> Any:
    if contestant.startswith("torch"):
        import warnings

        import torch
        import torch.distributed.rpc as rpc

        warnings.filterwarnings("ignore")  # a deprecation warning per worker at init
        torch.set_num_threads(1)
        extra: dict[str, Any] = (
            {"_transports": ["uv"], "_channels": ["basic"]} if contestant == "torch-tcp" else {}
        )
        opts = rpc.TensorPipeRpcBackendOptions(
            init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=120, **extra
        )
        rpc.init_rpc(f"w{rank}", rank=rank, world_size=n, rpc_backend_options=opts)
        return rpc
    os.environ["GRADWIRE_TOKEN"] = token
    from gradwire.distributed import rpc as grpc_rpc

    extra = (
        {"use_unix_socket": False, "shm_transfer": False} if contestant == "gradwire-tcp" else {}
    )
    opts = grpc_rpc.GrpcRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=120, **extra
    )
    grpc_rpc.init_rpc(f"w{rank}", rank, n, opts)
    return grpc_rpc


def _all_to_all(rpc: Any, rank: int, n: int, rounds: int) -> float:
    peers = [f"w{r}" for r in range(n) if r != rank]
    times = []
    for i in range(rounds + 2):  # two warm-up rounds
        t = time.perf_counter()
        futs = [rpc.rpc_async(p, noop) for p in peers]
        for f in futs:
            f.wait()
        if i >= 2:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


MIN_FANIN_CALLS = 24000


def _calls_each(calls: int, n: int) -> int:
    """The fan-in's calls to each of the ``n - 1`` callees."""
    return max(calls, -(-MIN_FANIN_CALLS // (n - 1)))


def _fan_in(rpc: Any, n: int, calls: int, inflight: int) -> dict[str, float]:
    """Worker 0 calls every other worker ``calls`` times, ``inflight`` calls at once."""
    peers = [f"w{r}" for r in range(1, n)]
    order = [peers[i % len(peers)] for i in range(_calls_each(calls, n) * len(peers))]
    slots = threading.Semaphore(inflight)
    done = threading.Event()
    latencies: list[float] = []
    errors: list[BaseException] = []
    left = [len(order)]
    lock = threading.Lock()

    def finished(started: float, fut: Any) -> None:
        took = time.perf_counter() - started
        try:
            fut.wait()
        except BaseException as exc:  # noqa: BLE001 - reported as the run's error
            errors.append(exc)
        with lock:
            latencies.append(took)
            left[0] -= 1
            last = left[0] == 0
        slots.release()
        if last:
            done.set()

    for p in peers:  # warm-up: a call to each, then three rounds of rpc_async to all
        rpc.rpc_sync(p, noop)
    for _ in range(3):  # (gradwire opens a lane pipe in the background at the first)
        for f in [rpc.rpc_async(p, noop) for p in peers]:
            f.wait()
    t = time.perf_counter()
    for p in order:
        slots.acquire()
        started = time.perf_counter()
        rpc.rpc_async(p, noop).then(lambda f, s=started: finished(s, f))
    if not done.wait(600):
        raise TimeoutError(f"fan-in: {left[0]} calls never finished")
    elapsed = time.perf_counter() - t
    if errors:
        raise errors[0]
    latencies.sort()
    return {
        "fanin_cps": len(order) / elapsed,
        "fanin_p50_ms": 1e3 * latencies[len(latencies) // 2],
        "fanin_p99_ms": 1e3 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


def _fan_out(rpc: Any, lib: str, n: int) -> float:
    peers = [f"w{r}" for r in range(1, n)]
    times = []
    for i in range(6):
        t = time.perf_counter()
        rrefs = [rpc.remote(p, ones, (lib, 1000)) for p in peers]
        for r in rrefs:
            r.to_here()
        if i:
            times.append(time.perf_counter() - t)
        del rrefs
    return statistics.median(times)


def _worker(
    contestant: str,
    rank: int,
    n: int,
    port: int,
    token: str,
    barrier: Any,
    out: Any,
    args: dict[str, int],
    timeout: float,
) -> None:
    lib = "torch" if contestant.startswith("torch") else "gradwire"
    try:
        rpc = _init(contestant, rank, n, port, token)
        out.put((rank, "init", time.time()))
        barrier.wait(timeout)
        out.put((rank, "a2a", _all_to_all(rpc, rank, n, args["a2a_rounds"])))
        barrier.wait(timeout)  # the parent measures the idle cluster
        barrier.wait(timeout)
        if rank == 0:
            for key, value in _fan_in(rpc, n, args["calls"], args["inflight"]).items():
                out.put((rank, key, value))
        barrier.wait(timeout)  # the parent reads the fan-in's CPU time
        if rank == 0:
            out.put((rank, "fanout", _fan_out(rpc, lib, n)))
        barrier.wait(timeout)
        rpc.shutdown()
        out.put((rank, "shutdown", time.time()))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        out.put((rank, "error", f"{type(exc).__name__}: {exc}"[:1000]))
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass
        _exit(out, 1)
    _exit(out, 0)


def _exit(out: Any, code: int) -> None:
    """Flush what was put on ``out`` (a queue's feeder thread), then end at once."""
    out.close()
    out.join_thread()
    os._exit(code)


# -- the parent: /proc readings -----------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _status(pid: int) -> tuple[float, int]:
    """(RSS in MiB, threads)."""
    rss, threads = 0.0, 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, threads


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_one(contestant: str, n: int, args: dict[str, int], deadline: float) -> dict[str, Any]:
    """One fresh cluster of ``n`` workers of ``contestant``: its measures, or its error."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n + 1)
    out = ctx.Queue()
    port, token = _free_port(), secrets.token_hex(16)
    result: dict[str, Any] = {"load": round(os.getloadavg()[0], 2)}
    end = time.monotonic() + deadline
    launched = time.time()
    procs = [
        ctx.Process(
            target=_worker,
            args=(contestant, r, n, port, token, barrier, out, args, deadline),
            daemon=True,
        )
        for r in range(n)
    ]
    for p in procs:
        p.start()
    got: dict[str, list[Any]] = {}

    def collect(key: str, count: int) -> list[Any]:
        while len(got.get(key, [])) < count:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"deadline of {deadline:g} s passed waiting for {key}")
            try:
                rank, k, value = out.get(timeout=min(left, 1.0))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError("a worker died: " + str(got.get("error"))) from None
                continue
            got.setdefault(k, []).append(value)
            if k == "error":
                raise RuntimeError(f"worker {rank}: {value}")
        return got[key]

    def wait_barrier() -> None:
        barrier.wait(max(1.0, end - time.monotonic()))

    try:
        result["init_s"] = max(collect("init", n)) - launched
        wait_barrier()
        result["a2a_ms"] = 1e3 * statistics.median(collect("a2a", n))
        time.sleep(SETTLE_S)
        pids = [p.pid for p in procs if p.pid is not None]
        before = sum(_cpu_seconds(pid) for pid in pids)
        time.sleep(IDLE_S)
        result["idle_cpu_s"] = sum(_cpu_seconds(pid) for pid in pids) - before
        statuses = [_status(pid) for pid in pids]
        result["rss_mib"] = statistics.median(s[0] for s in statuses)
        result["threads"] = max(s[1] for s in statuses)
        wait_barrier()
        cpu = [_cpu_seconds(pid) for pid in pids]
        wait_barrier()
        for key in ("fanin_cps", "fanin_p50_ms", "fanin_p99_ms"):
            result[key] = collect(key, 1)[0]
        wait_barrier()  # the fan-in is over: what it cost the caller and the callees
        cpu = [_cpu_seconds(pid) - c for pid, c in zip(pids, cpu)]
        calls = _calls_each(args["calls"], n) * (n - 1)
        result["fanin_caller_us"] = 1e6 * cpu[0] / calls
        result["fanin_callees_us"] = 1e6 * sum(cpu[1:]) / calls
        result["fanout_ms"] = 1e3 * collect("fanout", 1)[0]
        wait_barrier()
        t = time.time()
        result["shutdown_s"] = max(collect("shutdown", n)) - t
    except Exception as exc:  # noqa: BLE001 - reported in the table
        result["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass
    for p in procs:
        p.join(max(0.1, min(10.0, end - time.monotonic())))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
            result.setdefault("error", "killed at the deadline")
    return result


# -- the table ----------------------------------------------------------------------------------

_COLUMNS = (
    ("init_s", "init (s)", "{:.2f}"),
    ("rss_mib", "RSS/worker (MiB)", "{:.0f}"),
    ("threads", "threads/worker", "{:d}"),
    ("idle_cpu_s", "idle CPU-s (3 s)", "{:.3f}"),
    ("a2a_ms", "all-to-all (ms)", "{:.2f}"),
    ("fanin_cps", "fan-in calls/s", "{:,.0f}"),
    ("fanin_caller_us", "fan-in CPU/call, caller (us)", "{:.0f}"),
    ("fanin_callees_us", "fan-in CPU/call, callees (us)", "{:.0f}"),
    ("fanin_p50_ms", "fan-in p50 (ms)", "{:.1f}"),
    ("fanin_p99_ms", "fan-in p99 (ms)", "{:.1f}"),
    ("fanout_ms", "fan-out (ms)", "{:.1f}"),
    ("shutdown_s", "shutdown (s)", "{:.2f}"),
)
#: For the ratio: True when more is better.
_HIGHER = {"fanin_cps"}


def _cell(runs: list[dict[str, Any]], key: str, fmt: str) -> tuple[str, float | None]:
    values = [r[key] for r in runs if key in r]
    if not values:
        errors = sorted({r["error"] for r in runs if "error" in r})
        return ("error: " + errors[0][:60] if errors else "-"), None
    med = statistics.median(values)
    if key == "threads":
        med = int(max(values))
    text = fmt.format(med)
    failed = sum(1 for r in runs if "error" in r)
    if failed:
        text += f" ({failed}/{len(runs)} failed)"
    return text, float(med)


def table(n: int, results: dict[str, list[dict[str, Any]]]) -> str:
    """A Markdown table for one N: a row per measure, a column per contestant, and the ratios
    gradwire/torch on the same footing (defaults with defaults, TCP with TCP)."""
    names = [c for c in ALL if c in results]
    head = ["measure", *names]
    pairs = [
        (g, t)
        for g, t in (("gradwire", "torch"), ("gradwire-tcp", "torch-tcp"))
        if g in results and t in results
    ]
    head += [f"{g} / {t}" for g, t in pairs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    loads = [r["load"] for runs in results.values() for r in runs]
    for key, label, fmt in _COLUMNS:
        cells, values = [], {}
        for name in names:
            text, value = _cell(results[name], key, fmt)
            cells.append(text)
            values[name] = value
        for g, t in pairs:
            a, b = values[g], values[t]
            if a is None or b is None or not b:
                cells.append("-")
            else:
                ratio = a / b
                cells.append(f"{ratio:.2f}x" + (" (higher is better)" if key in _HIGHER else ""))
        lines.append("| " + " | ".join([label, *cells]) + " |")
    lines.append(f"\nN={n}; load average at the runs' starts: {min(loads):.1f} to {max(loads):.1f}")
    return "\n".join(lines)


def main() -> int:
    run_where_torch_is()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,8,16,32,64")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--contestants", default=",".join(ALL))
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--inflight", type=int, default=256)
    parser.add_argument("--a2a-rounds", type=int, default=20)
    parser.add_argument("--deadline", type=float, default=600.0)
    parser.add_argument("--json")
    ns = parser.parse_args()
    contestants = [c for c in ns.contestants.split(",") if c]
    unknown = set(contestants) - set(ALL)
    if unknown:
        parser.error(f"unknown contestant(s) {sorted(unknown)}; choose from {', '.join(ALL)}")
    if not have_torch():
        skipped = [c for c in contestants if c.startswith("torch")]
        if skipped:
            print(f"torch does not import here: skipping {', '.join(skipped)}", file=sys.stderr)
        contestants = [c for c in contestants if not c.startswith("torch")]
    args = {"calls": ns.calls, "inflight": ns.inflight, "a2a_rounds": ns.a2a_rounds}
    report: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for n in (int(v) for v in ns.sizes.split(",")):
        per: dict[str, list[dict[str, Any]]] = {}
        for rnd in range(ns.rounds):
            order = contestants if rnd % 2 == 0 else contestants[::-1]
            for c in order:
                print(f"N={n} round {rnd + 1}: {c} ...", file=sys.stderr, flush=True)
                res = run_one(c, n, args, ns.deadline)
                print(f"  {json.dumps(res)}", file=sys.stderr, flush=True)
                per.setdefault(c, []).append(res)
        report[str(n)] = per
        print(table(n, per) + "\n", flush=True)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
