"""An in-process cluster for distributed-autograd protocol tests: several workers, each with its
own container and engine, exchanging gradient messages through a thread pool (so delivery is
asynchronous and concurrent, as over gRPC). The forward "RPC" records send/recv pairs exactly as
the agent does."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from gradwire._runtime.dist_autograd.engine import (
    DistAutogradContainer,
    DistAutogradEngine,
    record_recv,
    record_send,
)
from gradwire._tensor import Tensor
from gradwire.futures import Future


class SimTransport:
    def __init__(self, cluster: SimCluster, me: int) -> None:
        self.cluster, self.me = cluster, me

    def send_gradients(
        self,
        dst: int,
        context_id: int,
        message_id: int,
        pass_id: int,
        retain_graph: bool,
        grads: list[Any],
        here: bool = False,
    ) -> Future[Any]:
        out: Future[Any] = Future()
        self.cluster.sent.append((self.me, dst, message_id, sum(g is not None for g in grads)))

        def deliver() -> None:
            if self.cluster.jitter:
                time.sleep(self.cluster.rng.random() * self.cluster.jitter)
            if dst in self.cluster.dead:
                out.set_exception(ConnectionError(f"worker{dst} is unreachable"))
                return
            copies = [None if g is None else Tensor._wrap(g._data.copy()) for g in grads]
            fut = self.cluster.workers[dst].engine.on_gradients(
                context_id, message_id, pass_id, retain_graph, copies
            )
            fut.add_done_callback(
                lambda f: (
                    out.set_exception(f.exception()) if f.exception() else out.set_result(None)
                )
            )

        self.cluster.pool.submit(deliver)
        return out

    def release_context(self, dst: int, context_id: int) -> Future[Any]:
        out: Future[Any] = Future()
        self.cluster.workers[dst].container.release(context_id)
        out.set_result(None)
        return out


class SimWorker:
    def __init__(self, cluster: SimCluster, wid: int) -> None:
        self.id = wid
        self.container = DistAutogradContainer(wid)
        self.engine = DistAutogradEngine(self.container, SimTransport(cluster, wid), f"worker{wid}")


class SimCluster:
    def __init__(self, n: int, jitter: float = 0.0, seed: int = 0) -> None:
        self.pool = ThreadPoolExecutor(max_workers=8)
        self.rng = random.Random(seed)
        self.jitter = jitter
        self.dead: set[int] = set()
        self.sent: list[tuple[int, int, int, int]] = []
        self.workers = [SimWorker(self, i) for i in range(n)]

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def rpc(self, src: int, dst: int, fn: Callable[..., Any], *args: Any) -> Any:
        """rpc_sync(src -> dst) inside src's current context, recording send/recv pairs."""
        a, b = self.workers[src], self.workers[dst]
        ctx_id = a.container.current_id()
        assert ctx_id is not None, "rpc outside a context"
        ctx_a = a.container.get(ctx_id)
        sent = [t for t in args if isinstance(t, Tensor) and t.requires_grad]
        ctx_b = b.container.get_or_create(ctx_id)
        copies = [Tensor._wrap(t._data.copy()) if isinstance(t, Tensor) else t for t in args]
        if sent:
            mid = a.container.next_message_id()
            record_send(ctx_a, sent, dst, mid)
            record_recv(
                ctx_b,
                [c for c, t in zip(copies, args) if isinstance(t, Tensor) and t.requires_grad],
                src,
                mid,
            )
        prev = b.container.set_current(ctx_id)
        try:
            result = fn(*copies)
        finally:
            b.container.set_current(prev)
        outs = result if isinstance(result, tuple) else (result,)
        back = [o for o in outs if isinstance(o, Tensor) and o.requires_grad]
        copies_back = [Tensor._wrap(o._data.copy()) if isinstance(o, Tensor) else o for o in outs]
        if back or sent:
            # A call that received tensors requiring grad always answers with a pair.
            mid2 = b.container.next_message_id()
            record_send(ctx_b, back, src, mid2)
            record_recv(
                ctx_a,
                [c for c, o in zip(copies_back, outs) if isinstance(o, Tensor) and o.requires_grad],
                dst,
                mid2,
            )
        return copies_back if isinstance(result, tuple) else copies_back[0]
