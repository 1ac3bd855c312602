"""One side of an rpc_bench pair over TCP, for peers on different hosts or network namespaces.

    python benchmarks/pair_bench.py FRAMEWORK RANK MASTER PORT DONE_FILE [--sizes 1,16]
        [--calls 300] [--async-calls 2000] [--iters 20]

FRAMEWORK is ``gradwire`` (``use_unix_socket=False``, ``shm_transfer=False``) or ``torch``
(TensorPipe's "uv" transport and "basic" channel: rpc_bench's TCP-only contestants). Rank 0
dials MASTER:PORT (rank 0's own address), runs rpc_bench's TCP measures once each and prints
one JSON object (``{label: seconds or calls/s}``); rank 1 serves until DONE_FILE exists (rank 0
creates it when it is done), so neither side needs a pipe to the other.
``benchmarks/netns_bench.sh`` runs the pairs across two network namespaces, in rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rpc_bench import _applies, _gradwire_proc, _rows, _torch_proc  # noqa: E402


class _Script:
    """The orchestrator's side of rpc_bench's driver pipe: the measures in order, then stop."""

    def __init__(self, commands: list[tuple[str, Any]], done: pathlib.Path) -> None:
        self._commands = list(commands)
        self._done = done
        self.results: list[Any] = []

    def send(self, msg: Any) -> None:
        if msg != "ready":
            self.results.append(msg)

    def recv(self) -> Any:
        if self._commands:
            return self._commands.pop(0)
        self._done.touch()  # the peer may stop serving
        return None


class _Wait:
    """Rank 1's pipe: ``recv`` returns once rank 0 is done."""

    def __init__(self, done: pathlib.Path) -> None:
        self._done = done

    def recv(self) -> None:
        while not self._done.exists():
            time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("framework", choices=("gradwire", "torch"))
    parser.add_argument("rank", type=int, choices=(0, 1))
    parser.add_argument("master")
    parser.add_argument("port", type=int)
    parser.add_argument("done", type=pathlib.Path)
    parser.add_argument("--sizes", default="1,16")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--async-calls", type=int, default=2000)
    parser.add_argument("--iters", type=int, default=20)
    ns = parser.parse_args()
    sizes = [int(s) for s in ns.sizes.split(",")]
    rows = [r for r in _rows(ns, sizes) if _applies(ns.framework, r[1])]
    conn: Any = (
        _Script([(m, a) for _, m, a, _ in rows], ns.done) if ns.rank == 0 else _Wait(ns.done)
    )
    if ns.framework == "gradwire":
        token = os.environ.get("GRADWIRE_TOKEN", "")
        _gradwire_proc(ns.rank, True, f"tcp://{ns.master}:{ns.port}", token, conn)
    else:
        _torch_proc(ns.rank, True, ns.port, conn, master=ns.master)
    if ns.rank == 0:
        figures = {}
        for (label, _m, _a, _u), (status, value) in zip(rows, conn.results):
            figures[label] = value if status == "ok" else f"error: {value}"
        print(json.dumps({"framework": ns.framework, "figures": figures}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
