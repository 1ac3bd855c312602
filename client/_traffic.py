"""Bytes this process moved, per route, counted only while metrics are on (issue 40).

The transports call :func:`sent` / :func:`received` where bytes are handed to gRPC or to a
bulk-lane socket. While metrics are off (the default) :data:`counts` is None and each of those
calls is one global lookup and a comparison, so nothing is counted and nothing is paid for.
``gradwire.observability.metrics`` sets it on (:func:`start`); shared-memory bytes are not
counted here (``gradwire._wire.shm.stats`` already has them, read at scrape time).

A leaf (no gradwire imports): the wire layer, the runtime and the server all use it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "GRPC",
    "FAST_LANE",
    "BULK_LANE",
    "SHM",
    "ROUTES",
    "Traffic",
    "counts",
    "start",
    "stop",
    "sent",
    "received",
    "counting_encoder",
    "counting_decoder",
]

#: Messages through gRPC to or from a worker's main (asyncio) server.
GRPC = "grpc"
#: Messages through gRPC to or from a worker's fast lane (``gradwire.server.fast_lane``).
FAST_LANE = "fast_lane"
#: Every byte on a bulk-lane socket after its handshake: tensor transfers and calls on the lane.
BULK_LANE = "bulk_lane"
#: Tensor bytes through same-host shared memory.
SHM = "shm"
ROUTES = (GRPC, FAST_LANE, BULK_LANE, SHM)


class Traffic:
    """Two counters per route: bytes sent and bytes received."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: dict[str, int] = dict.fromkeys(ROUTES, 0)
        self.received: dict[str, int] = dict.fromkeys(ROUTES, 0)

    def add(self, table: dict[str, int], route: str, nbytes: int) -> None:
        with self._lock:
            table[route] += nbytes

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        """(sent, received) by route, copied under the lock."""
        with self._lock:
            return dict(self.sent), dict(self.received)


#: None while metrics are off: the one check each counting site makes.
counts: Traffic | None = None


def start() -> Traffic:
    """Start counting (idempotent); the process' Traffic."""
    global counts
    if counts is None:
        counts = Traffic()
    return counts


def stop() -> None:
    """Stop counting and forget the counts."""
    global counts
    counts = None


def sent(route: str, nbytes: int) -> None:
    """Count ``nbytes`` sent by ``route`` (nothing while metrics are off)."""
    t = counts
    if t is not None:
        t.add(t.sent, route, nbytes)


def received(route: str, nbytes: int) -> None:
    """Count ``nbytes`` received by ``route`` (nothing while metrics are off)."""
    t = counts
    if t is not None:
        t.add(t.received, route, nbytes)


def counting_encoder(route: str, encode: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """``encode`` (a gRPC serializer) with its output counted as sent by ``route``."""

    def encoded(message: Any) -> bytes:
        data = encode(message)
        t = counts
        if t is not None:
            t.add(t.sent, route, len(data))
        return data

    return encoded


def counting_decoder(route: str, decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``decode`` (a gRPC deserializer) with its input counted as received by ``route``."""

    def decoded(data: bytes) -> Any:
        t = counts
        if t is not None:
            t.add(t.received, route, len(data))
        return decode(data)

    return decoded
