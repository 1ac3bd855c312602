"""A TCP fault proxy for tests: forwards a port to a worker and misbehaves on command.

One :class:`FaultProxy` listens on a loopback port and forwards every connection to ``target``.
Its mode decides what happens to the bytes:

- ``pass``: forwarded as they come;
- ``delay S``: every chunk waits S seconds before it is forwarded (order kept);
- ``blackhole``: nothing is forwarded in either direction and new connections are accepted
  but not connected upstream; the bytes wait, like packets during a partition that TCP keeps
  retransmitting, and flow again when the mode goes back to ``pass`` (a healed partition);
- ``reset``: every open connection is reset (RST, SO_LINGER 0) and new ones are reset at once
  (like a peer whose port is closed).

The proxy runs its own asyncio loop in a thread. Tests command it directly
(``proxy.set_mode("blackhole")``); workers in other processes use its control port:
``command(("127.0.0.1", proxy.control_port), "blackhole")`` sends one line and waits for "ok".
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["FaultProxy", "command", "MODES"]

MODES = ("pass", "delay", "blackhole", "reset")
_CHUNK = 1 << 16


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``target`` ("host:port"), with faults on command.

    Args:
        target: the worker's real address.
        port: the port to listen on (0: any free port).
    """

    def __init__(self, target: str, port: int = 0) -> None:
        host, _, tport = target.rpartition(":")
        self._target = (host, int(tport))
        self._want_port = port
        self.mode = "pass"
        self.delay = 0.0
        self.connections = 0  # accepted so far (a reconnect after a reset counts again)
        self._loop = asyncio.new_event_loop()
        self._open: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._servers: list[asyncio.AbstractServer] = []
        self.port = 0
        self.control_port = 0
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="faultproxy"
        )

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        """Bind both ports and start forwarding; returns self."""
        self._thread.start()
        self._call(self._start())
        return self

    def close(self) -> None:
        """Reset every connection and stop (bounded)."""
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _call(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        server = await asyncio.start_server(self._accept, "127.0.0.1", self._want_port)
        control = await asyncio.start_server(self._control, "127.0.0.1", 0)
        self._servers = [server, control]
        self.port = server.sockets[0].getsockname()[1]
        self.control_port = control.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        for s in self._servers:
            s.close()
        for w in list(self._writers):
            _rst(w)

    # -- modes -----------------------------------------------------------------------------------
    def set_mode(self, mode: str, delay: float = 0.0) -> None:
        """Switch to ``mode`` (one of MODES); ``delay`` seconds per chunk for "delay"."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
        self._call(self._set_mode(mode, delay))

    async def _set_mode(self, mode: str, delay: float) -> None:
        assert self._open is not None
        self.mode, self.delay = mode, delay
        if mode == "blackhole":
            self._open.clear()
        else:
            self._open.set()
        if mode == "reset":
            for w in list(self._writers):
                _rst(w)

    # -- forwarding ------------------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._open is not None
        self.connections += 1
        if self.mode == "reset":
            _rst(writer)
            return
        self._writers.add(writer)
        try:
            await self._open.wait()
            if self.mode == "reset":
                return
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            _rst(writer)  # the worker is gone: the client sees its connection reset
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        done = asyncio.Event()
        a = asyncio.ensure_future(self._pump(reader, up_writer, done))
        b = asyncio.ensure_future(self._pump(up_reader, writer, done))
        await done.wait()
        for w in (writer, up_writer):
            # One side ended: end the other too (a killed worker's clients see a reset).
            _rst(w)
            self._writers.discard(w)
        for t in (a, b):
            t.cancel()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, done: asyncio.Event
    ) -> None:
        assert self._open is not None
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                await self._open.wait()  # a partition: hold the bytes until healed
                if self.delay and self.mode == "delay":
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            done.set()

    # -- control port ----------------------------------------------------------------------------
    async def _control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await reader.readline()).decode().split()
            if line:
                await self._set_mode(line[0], float(line[1]) if len(line) > 1 else 0.0)
            writer.write(b"ok\n")
            await writer.drain()
        except (ValueError, AssertionError) as exc:
            writer.write(f"error {exc}\n".encode())
        finally:
            writer.close()


def command(control: tuple[str, int], line: str, timeout: float = 10.0) -> None:
    """Send one mode line ("blackhole", "pass", "delay 0.2", "reset") to a proxy's control port."""
    with socket.create_connection(control, timeout=timeout) as s:
        s.sendall(line.encode() + b"\n")
        answer = s.makefile().readline().strip()
    if answer != "ok":
        raise RuntimeError(f"fault proxy refused {line!r}: {answer}")


def on_mode(proxy: FaultProxy, mode: str) -> Callable[[], None]:
    """A callable that switches ``proxy`` to ``mode`` (for timers in tests)."""
    return lambda: proxy.set_mode(mode)


__all__ += ["on_mode"]
