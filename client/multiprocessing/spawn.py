"""spawn / start_processes: run ``fn(i, *args)`` in N processes, fail fast, leave no orphans.

Exceptions::

    Exception
     └── ProcessException           a child process failed (error_index, error_pid)
          ├── ProcessRaisedException   fn raised; the message holds the child's traceback
          └── ProcessExitedException   the child exited non-zero or was killed (exit_code,
                                       signal_name)
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from ._lifeline import die_with_parent

__all__ = [
    "ProcessContext",
    "ProcessException",
    "ProcessExitedException",
    "ProcessRaisedException",
    "SpawnContext",
    "spawn",
    "start_processes",
]

log = logging.getLogger(__name__)
_MAX_TRACEBACK = 32 * 1024  # stays below the pipe buffer, so a failing child never blocks
_KILL_AFTER = 3.0  # seconds between SIGTERM and SIGKILL for the surviving processes


class ProcessException(Exception):
    """A process started by :func:`spawn` failed.

    Attributes:
        error_index: the failed process' index ``i`` (the first argument fn received).
        error_pid: its process id.
    """

    def __init__(self, msg: str, error_index: int, error_pid: int) -> None:
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.error_pid = error_pid

    def __reduce__(self) -> Any:
        return type(self), (self.msg, self.error_index, self.error_pid)


class ProcessRaisedException(ProcessException):
    """``fn`` raised in a child; the message ends with the child's formatted traceback."""


class ProcessExitedException(ProcessException):
    """A child exited with a non-zero code or was killed by a signal before ``fn`` returned.

    Attributes:
        exit_code: the exit status (negative: minus the signal number).
        signal_name: e.g. ``"SIGKILL"`` when a signal ended the process, else None.
    """

    def __init__(
        self,
        msg: str,
        error_index: int,
        error_pid: int,
        exit_code: int,
        signal_name: str | None = None,
    ) -> None:
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self) -> Any:
        return type(self), (
            self.msg,
            self.error_index,
            self.error_pid,
            self.exit_code,
            self.signal_name,
        )


def _child_main(fn: Callable[..., Any], i: int, args: tuple[Any, ...], error_conn: Any) -> None:
    die_with_parent()
    try:
        fn(i, *args)
    except KeyboardInterrupt:
        pass  # a Ctrl-C reached the whole group; the parent reports it
    except SystemExit:
        raise
    except BaseException:
        tb = traceback.format_exc()
        if len(tb) > _MAX_TRACEBACK:
            tb = "...(traceback truncated)...\n" + tb[-_MAX_TRACEBACK:]
        error_conn.send(tb)
        sys.exit(1)
    finally:
        error_conn.close()


class ProcessContext:
    """The processes started by :func:`start_processes`; returned when ``join=False``."""

    def __init__(self, processes: list[Any], error_conns: list[Any]) -> None:
        self.processes = processes
        self.error_conns = error_conns
        self._pending = {p.sentinel: i for i, p in enumerate(processes)}
        self._failure: ProcessException | None = None

    def pids(self) -> list[int]:
        """The process ids, in index order."""
        return [int(p.pid) for p in self.processes]

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the processes; on the first failure, end the others and raise.

        Args:
            timeout: seconds to wait at most; None waits until all exited or one failed.

        Returns:
            True when every process has exited successfully (again True on later calls), False
            if some are still running when ``timeout`` expires.

        Raises:
            ProcessRaisedException: a process' ``fn`` raised (the message has its traceback).
            ProcessExitedException: a process exited non-zero or was killed by a signal.

        Example:
            >>> ctx = spawn(work, nprocs=2, join=False)
            >>> while not ctx.join(timeout=1.0):
            ...     report_progress()
        """
        if self._failure is not None:
            raise self._failure
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                ready = multiprocessing.connection.wait(list(self._pending), timeout=remaining)
            except BaseException:  # e.g. KeyboardInterrupt in the parent: take the children along
                self._terminate_all()
                raise
            if not ready:
                return False
            failed = []
            for sentinel in ready:
                index = self._pending.pop(sentinel)
                proc = self.processes[index]
                proc.join()
                if proc.exitcode != 0:
                    failed.append(index)
            if failed:
                self._failure = self._describe(min(failed))
                self._terminate_all()
                raise self._failure
            if deadline is not None and time.monotonic() >= deadline:
                return not self._pending
        return True

    def _describe(self, index: int) -> ProcessException:
        proc = self.processes[index]
        conn = self.error_conns[index]
        tb = None
        if conn.poll():  # readable: a traceback, or end-of-file when the child sent none
            try:
                tb = conn.recv()
            except EOFError:
                pass
        if tb is not None:
            msg = f"\n\n-- Process {index} terminated with the following error:\n{tb}"
            return ProcessRaisedException(msg, index, proc.pid)
        code = proc.exitcode
        if code < 0:
            name = signal.Signals(-code).name
            return ProcessExitedException(
                f"process {index} (pid {proc.pid}) terminated with signal {name}",
                index,
                proc.pid,
                exit_code=code,
                signal_name=name,
            )
        return ProcessExitedException(
            f"process {index} (pid {proc.pid}) terminated with exit code {code}",
            index,
            proc.pid,
            exit_code=code,
        )

    def _terminate_all(self) -> None:
        alive = [p for p in self.processes if p.is_alive()]
        for p in alive:
            p.terminate()
        deadline = time.monotonic() + _KILL_AFTER
        for p in alive:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.warning("process %d ignored SIGTERM; sending SIGKILL", p.pid)
                p.kill()
                p.join()
        self._pending.clear()
        for conn in self.error_conns:
            conn.close()


SpawnContext = ProcessContext  # the name torch.multiprocessing documents for spawn's result


def start_processes(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
) -> ProcessContext | None:
    """Start ``nprocs`` processes running ``fn(i, *args)`` with the given start method.

    Each child dies with this process (no orphans even after ``kill -9``). The first child to
    fail makes the others terminate (SIGTERM, then SIGKILL after a few seconds) and surfaces as
    an exception from :meth:`ProcessContext.join`. On Linux the death signal follows the
    *thread* that started the children (``PR_SET_PDEATHSIG``): call this from a thread that
    outlives them, such as the main thread.

    Args:
        fn: a module-level function (it is pickled for ``spawn`` and ``forkserver``).
        args: extra positional arguments after the index.
        nprocs: how many processes.
        join: wait for all of them (True) or return a :class:`ProcessContext` (False).
        daemon: mark the processes daemonic (they may not start children).
        start_method: ``"spawn"``, ``"fork"`` or ``"forkserver"``.

    Returns:
        None when ``join`` is True, else the :class:`ProcessContext`.

    Raises:
        ValueError: for ``nprocs < 1`` or a start method this platform lacks.
        ProcessRaisedException: (when joining) a child's ``fn`` raised.
        ProcessExitedException: (when joining) a child exited non-zero or was killed.

    Example:
        >>> start_processes(train, args=(cfg,), nprocs=2, start_method="forkserver")
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be at least 1, got {nprocs}")
    methods = multiprocessing.get_all_start_methods()
    if start_method not in methods:
        raise ValueError(
            f"start method {start_method!r} is not available here; choose one of {methods}"
        )
    mp: Any = multiprocessing.get_context(start_method)
    processes, error_conns = [], []
    for i in range(nprocs):
        reader, writer = mp.Pipe(duplex=False)
        proc = mp.Process(target=_child_main, args=(fn, i, args, writer), daemon=daemon)
        proc.start()
        writer.close()
        processes.append(proc)
        error_conns.append(reader)
    context = ProcessContext(processes, error_conns)
    if not join:
        return context
    while not context.join():
        pass
    return None


def spawn(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
) -> ProcessContext | None:
    """Run ``fn(i, *args)`` for ``i`` in ``range(nprocs)``, each in a new process.

    Same as :func:`start_processes`, with the ``spawn`` start method by default.

    Args:
        fn: a module-level function taking the process index first.
        args: extra positional arguments.
        nprocs: how many processes.
        join: wait for all (True) or return a :class:`ProcessContext` (False).
        daemon: mark the processes daemonic.
        start_method: ``"spawn"`` (default), ``"fork"`` or ``"forkserver"``.

    Returns:
        None when ``join`` is True, else the :class:`ProcessContext`.

    Raises:
        ProcessRaisedException: a child's ``fn`` raised; ``error_index`` says which.
        ProcessExitedException: a child exited non-zero or was killed by a signal.

    Example:
        >>> def work(rank, size):
        ...     print(rank, size)
        >>> spawn(work, args=(4,), nprocs=4)
    """
    return start_processes(fn, args, nprocs, join, daemon, start_method)
