"""A simulated network of workers running the RRef protocol state machine.

Every message in flight sits in one bag; a scheduler picks which one is delivered next, so any
delivery order is possible. Per delivery the scheduler also picks a fault:

- ``LOSE``: a request is not processed and stays in the bag (the sender retries it later); a
  lost response (ForkAccepted, RemoteAck) puts its request back in the bag, as a failed RPC
  does.
- ``DUP``: the message is processed and a copy stays in the bag: an attempt that timed out at
  the sender and is processed again later, after any number of other messages.

Control messages and RemoteCalls (idempotent on its RRefId) get all faults. User calls carrying
RRefs (``Payload``), to_here requests and their replies are delivered at most once, in any
order: user functions are never retried. In random runs a user call may fail before delivery
(``fail_payload``); its sender then abandons the forks it carried.

The net checks safety as it runs (``SafetyViolation``) and liveness at the end
(``check_no_leak``). Programs drive it through ``remote``, ``local_rref``, ``share``, ``use`` and
``drop``; ``run_random_program`` runs a seeded random one.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from gradwire._runtime.rref.errors import UnknownRRefError
from gradwire._runtime.rref.ids import ForkId, RRefId
from gradwire._runtime.rref.messages import (
    ControlMessage,
    ForkAccepted,
    RemoteAck,
    RRefForkData,
)
from gradwire._runtime.rref.protocol import RRefHandle, RRefProtocol

__all__ = [
    "Mode",
    "Faults",
    "SafetyViolation",
    "Ref",
    "SimNet",
    "run_random_program",
]


T = TypeVar("T")


class SafetyViolation(AssertionError):
    """The protocol broke a guarantee during a simulated run."""


class Mode(enum.Enum):
    """How one delivery goes."""

    # Processed once.
    NORMAL = "normal"
    # Not processed; a request stays in flight, a lost response re-sends its request.
    LOSE = "lose"
    # Processed, and a stale copy stays in flight.
    DUP = "dup"


@dataclass(frozen=True)
class Faults:
    """Probabilities of each fault per delivery of a control message or RemoteCall."""

    p_lose: float = 0.15
    p_dup: float = 0.15
    # Stale copies one original message may spawn.
    max_dups: int = 2
    # Probability that a user call fails certainly before delivery (random runs only); the
    # sender then abandons the forks it carried.
    p_fail: float = 0.0
    # Kinds of message the faults apply to (None: every control message and RemoteCall).
    kinds: tuple[type, ...] | None = None

    def applies(self, body: object) -> bool:
        if not isinstance(body, (ControlMessage, RemoteCall)):
            return False  # user calls are never retried
        return self.kinds is None or isinstance(body, self.kinds)


NO_FAULTS = Faults(0.0, 0.0, 0, 0.0, kinds=())


@dataclass(frozen=True)
class Payload:
    """A user call (or, with ``reply``, a return value) carrying forks of RRefs to ``dest``.

    The receiving function runs once all its RRefs are confirmed; a return value is handed to
    the program at once, still unconfirmed. The receiver forwards the RRefs along ``route``
    (one hop per call, dropping its own) or, with ``name``, keeps them under that name for the
    program; otherwise it drops them at once.
    """

    sender: int
    forks: tuple[RRefForkData, ...]
    route: tuple[int, ...] = ()
    name: str | None = None
    reply: bool = False


@dataclass(frozen=True)
class RemoteCall:
    caller: int
    rref_id: RRefId
    fork_id: ForkId


@dataclass(frozen=True)
class Fetch:
    requester: int
    rref_id: RRefId
    ticket: int


@dataclass(frozen=True)
class FetchReply:
    ticket: int
    value: object


Body = ControlMessage | Payload | RemoteCall | Fetch | FetchReply


@dataclass(frozen=True)
class Envelope:
    """One message in flight to ``dest``."""

    dest: int
    body: Body
    # For a response: the request to send again if the response is lost.
    retry: Envelope | None = None
    # Stale duplicates this message may still spawn.
    dups: int = 0


@dataclass(eq=False)
class Ref:
    """A reference held by a program or a running function on one worker."""

    worker: int
    handle: RRefHandle
    # to_here calls in flight (the agent keeps the RRef alive while they run).
    pins: int = 0
    dropped: bool = False
    released: bool = False

    def key(self) -> tuple[object, ...]:
        return (self.worker, self.handle.rref_id, self.handle.fork_id, self.pins, self.dropped)


def expected_value(rref_id: RRefId) -> str:
    return f"value of {rref_id}"


@dataclass
class SimWorker:
    wid: int
    proto: RRefProtocol
    refs: list[Ref] = field(default_factory=list)
    named: dict[str, list[Ref]] = field(default_factory=dict)
    # Functions received whose RRefs are not all confirmed yet.
    waiting_functions: int = 0


class SimNet:
    """Workers 0..n-1, each with an ``RRefProtocol``, and the bag of messages between them."""

    def __init__(self, n_workers: int, faults: Faults = NO_FAULTS) -> None:
        self.faults = faults
        self.bag: list[Envelope] = []
        self.workers = [
            SimWorker(w, RRefProtocol(w, tombstone_ttl=None, on_owner_deleted=self._on_delete(w)))
            for w in range(n_workers)
        ]
        self.tickets: dict[int, Ref] = {}
        self._next_ticket = 0
        self.deleted: set[RRefId] = set()
        self.created: set[RRefId] = set()
        self.functions_run = 0
        self.payloads_sent = 0
        self.deliveries = 0
        self.failures: list[BaseException] = []

    # -- program verbs -----------------------------------------------------------------------

    def remote(self, w: int, owner: int) -> Ref:
        """``remote(owner, f)`` from worker ``w``."""
        proto = self.workers[w].proto
        handle = proto.create_remote(owner)
        self.created.add(handle.rref_id)
        if handle.is_owner:
            assert handle.value is not None
            handle.value.set_value(expected_value(handle.rref_id))
        else:
            assert handle.fork_id is not None
            self._post(owner, RemoteCall(w, handle.rref_id, handle.fork_id))
        return self._hold(w, handle)

    def local_rref(self, w: int) -> Ref:
        """``RRef(value)`` on worker ``w``."""
        handle = self.workers[w].proto.create_owner()
        self.created.add(handle.rref_id)
        assert handle.value is not None
        handle.value.set_value(expected_value(handle.rref_id))
        return self._hold(w, handle)

    def share(
        self,
        w: int,
        refs: list[Ref],
        dest: int,
        route: tuple[int, ...] = (),
        name: str | None = None,
        reply: bool = False,
    ) -> None:
        """Send ``refs`` from ``w`` to a function on ``dest`` (or, with ``reply``, as the
        return value of a call ``dest`` made)."""
        proto = self.workers[w].proto
        forks = tuple(proto.fork(r.handle, dest) for r in refs)
        self.payloads_sent += 1
        self._post(dest, Payload(w, forks, route, name, reply))

    def use(self, ref: Ref) -> None:
        """``to_here()``: on a user, a fetch that keeps the reference alive until it returns."""
        if ref.handle.is_owner:
            return
        ref.pins += 1
        self._next_ticket += 1
        self.tickets[self._next_ticket] = ref
        self._post(ref.handle.owner_id, Fetch(ref.worker, ref.handle.rref_id, self._next_ticket))

    def drop(self, ref: Ref) -> None:
        """Program code lets go of ``ref`` (the release waits for its to_here calls)."""
        if ref.dropped:
            return
        ref.dropped = True
        worker = self.workers[ref.worker]
        worker.refs.remove(ref)
        for refs in worker.named.values():
            if ref in refs:
                refs.remove(ref)
        self._maybe_release(ref)

    def drop_all(self) -> None:
        """Every program reference everywhere goes out of scope."""
        for worker in self.workers:
            for ref in list(worker.refs):
                self.drop(ref)

    # -- network -----------------------------------------------------------------------------

    def choices(self) -> list[tuple[int, Mode]]:
        """Every possible next delivery: (index in the bag, mode)."""
        out: list[tuple[int, Mode]] = []
        for i, env in enumerate(self.bag):
            out.append((i, Mode.NORMAL))
            if self.faults.applies(env.body):
                if env.dups > 0:
                    out.append((i, Mode.DUP))
                if env.retry is not None:
                    out.append((i, Mode.LOSE))
        return out

    def deliver(self, index: int, mode: Mode = Mode.NORMAL) -> None:
        """Deliver ``bag[index]`` in ``mode``."""
        env = self.bag[index]
        self.bag[index] = self.bag[-1]
        self.bag.pop()
        self.deliveries += 1
        if mode is Mode.LOSE:
            # A lost request is simply retried later; a lost response fails its RPC, which
            # the sender retries.
            # The retry of a request whose response was lost spawns no further stale copies,
            # so that the set of reachable states stays finite.
            retry = env if env.retry is None else Envelope(env.retry.dest, env.retry.body)
            self.bag.append(retry)
            return
        if mode is Mode.DUP:
            self.bag.append(Envelope(env.dest, env.body, env.retry, env.dups - 1))
        self._process(env)

    def fail_payload(self, index: int) -> None:
        """The user call ``bag[index]`` failed before delivery: its sender abandons the forks."""
        env = self.bag[index]
        assert isinstance(env.body, Payload)
        self.bag[index] = self.bag[-1]
        self.bag.pop()
        sender = self.workers[env.body.sender].proto
        for data in env.body.forks:
            self._send(sender.abandon_fork(data))

    def step_random(self, rng: random.Random) -> None:
        """Deliver a random message with a random fault."""
        index = rng.randrange(len(self.bag))
        env = self.bag[index]
        if isinstance(env.body, Payload) and rng.random() < self.faults.p_fail:
            self.fail_payload(index)
            return
        mode = Mode.NORMAL
        if self.faults.applies(env.body):
            roll = rng.random()
            if roll < self.faults.p_lose:
                mode = Mode.LOSE
            elif roll < self.faults.p_lose + self.faults.p_dup and env.dups > 0:
                mode = Mode.DUP
        self.deliver(index, mode)

    def drain(self, rng: random.Random, max_steps: int = 100_000) -> None:
        """Deliver until nothing is in flight, dropping what functions received meanwhile."""
        for _ in range(max_steps):
            self.drop_all()
            if not self.bag:
                return
            self.step_random(rng)
        raise SafetyViolation(f"network did not drain in {max_steps} steps: {self.bag[:5]}")

    # -- checks ------------------------------------------------------------------------------

    def raise_failures(self) -> None:
        """Re-raise the first violation found inside a protocol callback.

        ``RRefProtocol`` logs and swallows callback errors (an agent must not lose the messages
        of the event that ran them), so checks made in callbacks are recorded here.
        """
        if self.failures:
            raise self.failures[0]

    def check_no_leak(self) -> None:
        """Liveness: with every reference dropped and nothing in flight, nothing is left."""
        assert not self.bag
        for worker in self.workers:
            info = worker.proto.debug_info()
            leaks = worker.proto.leaked_owner_rrefs()
            pending = worker.proto.pending()
            if info.num_owner_rrefs or info.num_users or not pending.empty or leaks:
                raise SafetyViolation(f"worker {worker.wid} leaks: {info} {leaks} {pending}")
            if worker.waiting_functions:
                raise SafetyViolation(f"worker {worker.wid}: a function never ran")
        if self.tickets:
            raise SafetyViolation(f"to_here never returned: {self.tickets}")
        if self.deleted != self.created:
            raise SafetyViolation(f"not deleted: {self.created - self.deleted}")

    def state_key(self) -> tuple[object, ...]:
        """Everything that determines the future, for model checking."""
        protos = tuple(w.proto.snapshot() for w in self.workers)
        refs = tuple(
            (w.wid, tuple(sorted(map(repr, (r.key() for r in w.refs)))), w.waiting_functions)
            for w in self.workers
        )
        bag = tuple(sorted(repr(env) for env in self.bag))
        return (protos, refs, bag, tuple(sorted(self.deleted)))

    # -- internals ---------------------------------------------------------------------------

    def _guard(self, fn: Callable[[T], None]) -> Callable[[T], None]:
        def guarded(arg: T) -> None:
            try:
                fn(arg)
            except Exception as exc:
                self.failures.append(exc)
                raise

        return guarded

    def _post(self, dest: int, body: Body, retry: Envelope | None = None) -> None:
        dups = self.faults.max_dups if self.faults.applies(body) else 0
        self.bag.append(Envelope(dest, body, retry, dups))

    def _send(self, msgs: list[ControlMessage], request: Envelope | None = None) -> None:
        for msg in msgs:
            response = isinstance(msg, (ForkAccepted, RemoteAck))
            self._post(msg.dest, msg, request if response else None)

    def _hold(self, w: int, handle: RRefHandle, name: str | None = None) -> Ref:
        ref = Ref(w, handle)
        self.workers[w].refs.append(ref)
        if name is not None:
            self.workers[w].named.setdefault(name, []).append(ref)
        return ref

    def _maybe_release(self, ref: Ref) -> None:
        if ref.dropped and not ref.pins and not ref.released:
            ref.released = True
            self._send(self.workers[ref.worker].proto.release(ref.handle))

    def _process(self, env: Envelope) -> None:
        worker = self.workers[env.dest]
        body = env.body
        if isinstance(body, ControlMessage):
            self._send(worker.proto.handle(body), env)
        elif isinstance(body, RemoteCall):
            accepted = worker.proto.accept_remote_call(body.rref_id, body.fork_id, body.caller)
            if accepted.run:
                assert accepted.handle is not None and accepted.handle.value is not None
                accepted.handle.value.set_value(expected_value(body.rref_id))
            self._send(accepted.messages, env)
        elif isinstance(body, Payload):
            self._receive_payload(worker, body)
        elif isinstance(body, Fetch):
            self._serve_fetch(worker, body)
        elif isinstance(body, FetchReply):
            ref = self.tickets.pop(body.ticket)
            if body.value != expected_value(ref.handle.rref_id):
                raise SafetyViolation(f"to_here returned {body.value!r} for {ref.handle}")
            ref.pins -= 1
            self._maybe_release(ref)

    def _receive_payload(self, worker: SimWorker, payload: Payload) -> None:
        handles = []
        for data in payload.forks:
            handle, msgs = worker.proto.receive_fork(data)
            self._send(msgs)
            handles.append(handle)
        worker.waiting_functions += 1

        def run(error: BaseException | None) -> None:
            # The function body: it may only start once every RRef argument is confirmed.
            if error is not None:
                raise SafetyViolation(f"worker {worker.wid}: argument disowned: {error}")
            confirmed = all(worker.proto.is_confirmed(h) for h in handles)
            if not confirmed and not payload.reply:
                raise SafetyViolation(f"worker {worker.wid}: function ran before confirmation")
            worker.waiting_functions -= 1
            self.functions_run += 1
            refs = [self._hold(worker.wid, h, payload.name) for h in handles]
            if payload.route:
                self.share(worker.wid, refs, payload.route[0], payload.route[1:], payload.name)
            if payload.route or payload.name is None:
                for ref in refs:
                    self.drop(ref)

        if payload.reply:
            run(None)
        else:
            worker.proto.when_confirmed(handles, self._guard(run))

    def _serve_fetch(self, worker: SimWorker, fetch: Fetch) -> None:
        try:
            slot = worker.proto.owner_value(fetch.rref_id)
        except UnknownRRefError as exc:
            msg = f"to_here reached worker {worker.wid} after delete: {exc}"
            raise SafetyViolation(msg) from exc
        slot.add_done_callback(
            lambda s: self._post(fetch.requester, FetchReply(fetch.ticket, s.wait(0)))
        )

    def _on_delete(self, owner: int) -> Callable[[RRefId], None]:
        def check(rref_id: RRefId) -> None:
            # Safety: no user of this RRef may exist anywhere, and no fork may be in flight.
            if rref_id in self.deleted:
                raise SafetyViolation(f"{rref_id} deleted twice")
            self.deleted.add(rref_id)
            for worker in self.workers:
                for user in worker.proto.snapshot()[1]:
                    if user[1] == rref_id:
                        raise SafetyViolation(
                            f"owner {owner} deleted {rref_id} while worker {worker.wid} "
                            f"holds fork {user}"
                        )
                for ref in worker.refs:
                    if ref.handle.rref_id == rref_id and not ref.released:
                        raise SafetyViolation(f"{rref_id} deleted while referenced: {ref}")
            for env in self.bag:
                if isinstance(env.body, Payload) and any(
                    f.rref_id == rref_id for f in env.body.forks
                ):
                    raise SafetyViolation(f"{rref_id} deleted while a fork is in flight: {env}")

        return self._guard(check)


def run_random_program(
    seed: int,
    n_workers: int | None = None,
    n_actions: int | None = None,
    faults: Faults | None = None,
) -> SimNet:
    """Run one seeded random program to completion and check it; returns the net."""
    rng = random.Random(seed)
    n = n_workers or rng.randint(2, 5)
    actions = n_actions or rng.randint(5, 40)
    if faults is None:
        faults = Faults(
            rng.choice([0.0, 0.1, 0.3]), rng.choice([0.0, 0.1, 0.3]), 2, rng.choice([0.0, 0.1])
        )
    net = SimNet(n, faults)
    done = 0
    while done < actions or net.bag:
        if done < actions and (not net.bag or rng.random() < 0.35):
            _random_action(net, rng)
            done += 1
        else:
            net.step_random(rng)
        net.raise_failures()
    net.drain(rng)
    net.raise_failures()
    net.check_no_leak()
    return net


def _random_action(net: SimNet, rng: random.Random) -> None:
    n = len(net.workers)
    w = rng.randrange(n)
    held = net.workers[w].refs
    roll = rng.random()
    if not held or roll < 0.25:
        if rng.random() < 0.2:
            net.local_rref(w)
        else:
            net.remote(w, rng.randrange(n))
    elif roll < 0.6:
        refs = rng.sample(held, rng.randint(1, min(3, len(held))))
        dest = rng.randrange(n)
        route: tuple[int, ...] = ()
        if rng.random() < 0.2:
            route = tuple(rng.randrange(n) for _ in range(rng.randint(1, 8)))
        name = "kept" if rng.random() < 0.5 else None
        net.share(w, refs, dest, route, name, reply=rng.random() < 0.3)
    elif roll < 0.75:
        net.use(rng.choice(held))
    else:
        net.drop(rng.choice(held))
