"""Tensor transfer benchmark between two local workers, with and without the shared-memory path.

    python benchmarks/transfer_bench.py [--sizes 1,16,128,512] [--repeat 5]

For each size (MiB of float32), in one run:
  * ``echo``: ``rpc_sync(peer, echo, (t,))``; GB/s of round-trip payload (2 * size / time, the
    convention of rpc_bench.py);
  * ``echo+touch``: the same, then one byte of every 4 KiB page of the result is read (a received
    shared-memory tensor is a mapping whose pages fault in on first use; this includes that);
  * ``remote+to_here``: ``rpc.remote(peer, blob, (n,)).to_here()`` of a tensor the peer holds;
    GB/s of one-way payload (size / time); ``+touch`` reads every page of the value as above;
    skipped with a note while ``rpc.remote`` is missing;
each with ``shm_transfer=True`` (the same-host fast path) and ``False`` (the gRPC stream); beside
a plain memcpy (``numpy.copyto`` into a warm buffer) and a plain
``multiprocessing.shared_memory`` write + read (create, copy in, attach by name, copy out,
unlink) of the same size, both size / time. Figures are medians over ``--repeat`` runs after
three warm-up runs. Nothing global is set: the token travels in the backend options.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import secrets
import sys
from multiprocessing import shared_memory
from typing import Any

import numpy as np
from timing import median_seconds

log = logging.getLogger("transfer_bench")
MiB = 1 << 20
_blobs: dict[int, Any] = {}


def echo(x: Any) -> Any:
    return x


def blob(nbytes: int) -> Any:
    """A tensor of ``nbytes`` this worker keeps (made once per size)."""
    if nbytes not in _blobs:
        import gradwire

        _blobs[nbytes] = gradwire.ones(nbytes // 4, dtype=gradwire.float32)
    return _blobs[nbytes]


def _options(init_method: str, token: str, shm: bool) -> Any:
    from gradwire.distributed import rpc

    return rpc.GrpcRpcBackendOptions(
        init_method=init_method, token=token, shm_transfer=shm, rpc_timeout=600
    )


def _peer(init_method: str, token: str, shm: bool, stop: Any) -> None:
    from gradwire.distributed import rpc

    rpc.init_rpc("peer", 1, 2, _options(init_method, token, shm))
    stop.wait(3600)
    rpc.shutdown()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _touch(arr: Any) -> int:
    data = np.asarray(arr.detach()._data if hasattr(arr, "_data") else arr)
    return int(data.reshape(-1).view(np.uint8)[::4096].sum())


def _rpc_rows(shm: bool, sizes: list[int], repeat: int) -> list[tuple[str, int, str, float, float]]:
    """(operation, MiB, path, median seconds, GB/s) for one configuration of both workers."""
    import gradwire
    from gradwire.distributed import rpc

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    token = secrets.token_hex(16)
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    peer = ctx.Process(target=_peer, args=(init_method, token, shm, stop), daemon=True)
    peer.start()
    rpc.init_rpc("driver", 0, 2, _options(init_method, token, shm))
    path = "shm" if shm else "stream"
    rows = []
    result: list[Any] = [None]  # the last reply stays alive until the next, as in a real loop
    try:
        for mib in sizes:
            n = mib * MiB
            t = gradwire.ones(n // 4, dtype=gradwire.float32)

            def call(t: Any = t, result: list[Any] = result) -> None:
                result[0] = rpc.rpc_sync("peer", echo, (t,))

            def call_touch(t: Any = t, result: list[Any] = result) -> None:
                result[0] = rpc.rpc_sync("peer", echo, (t,))
                _touch(result[0])

            sec = median_seconds(call, repeat)
            rows.append(("rpc_sync echo", mib, path, sec, 2 * n / sec / 1e9))
            sec = median_seconds(call_touch, repeat)
            rows.append(("rpc_sync echo+touch", mib, path, sec, 2 * n / sec / 1e9))
            assert np.array_equal(result[0].numpy(), t.numpy()), "echo returned other data"
            result[0] = None
            if hasattr(rpc, "remote"):

                def fetch(n: int = n, result: list[Any] = result) -> None:
                    result[0] = rpc.remote("peer", blob, (n,)).to_here()

                def fetch_touch(n: int = n, result: list[Any] = result) -> None:
                    result[0] = rpc.remote("peer", blob, (n,)).to_here()
                    _touch(result[0])

                sec = median_seconds(fetch, repeat)
                rows.append(("remote+to_here", mib, path, sec, n / sec / 1e9))
                sec = median_seconds(fetch_touch, repeat)
                rows.append(("remote+to_here+touch", mib, path, sec, n / sec / 1e9))
                result[0] = None
    finally:
        stop.set()
        rpc.shutdown()
        peer.join(30)
    return rows


def _baseline_rows(sizes: list[int], repeat: int) -> list[tuple[str, int, str, float, float]]:
    rows = []
    for mib in sizes:
        n = mib * MiB
        src = np.ones(n // 4, dtype=np.float32)
        dst = np.empty_like(src)
        sec = median_seconds(lambda s=src, d=dst: np.copyto(d, s), repeat)
        rows.append(("memcpy (numpy.copyto)", mib, "-", sec, n / sec / 1e9))
        del dst

        def shm_write_read(s: np.ndarray = src, n: int = n) -> None:
            seg = shared_memory.SharedMemory(create=True, size=n)
            try:
                np.copyto(np.ndarray(s.shape, s.dtype, buffer=seg.buf), s)
                other = shared_memory.SharedMemory(name=seg.name)
                view = np.ndarray(s.shape, s.dtype, buffer=other.buf)
                out = view.copy()
                del view
                other.close()
            finally:
                seg.close()
                seg.unlink()
            assert out[0] == 1.0

        sec = median_seconds(shm_write_read, repeat)
        rows.append(("multiprocessing.shared_memory write+read", mib, "-", sec, n / sec / 1e9))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1,16,128,512", help="tensor sizes in MiB")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per figure")
    ns = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sizes = [int(s) for s in ns.sizes.split(",")]

    from gradwire.distributed import rpc

    rows = _baseline_rows(sizes, ns.repeat)
    for shm in (True, False):
        rows += _rpc_rows(shm, sizes, ns.repeat)
    rows.sort(key=lambda r: (r[1], r[0], r[2]))
    header = ("operation", "MiB", "path", "median ms", "GB/s")
    table = [header] + [(op, str(m), p, f"{s * 1e3:.1f}", f"{g:.2f}") for op, m, p, s, g in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        log.info(
            "  ".join(
                c.ljust(w) if i in (0, 2) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
            )
        )
    log.info(
        "GB/s: echo rows count the round trip (2 x size / time); to_here, memcpy and "
        "shared_memory rows count size / time."
    )
    if not hasattr(rpc, "remote"):
        log.info("remote()+to_here(): gradwire.distributed.rpc.remote is not available yet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
