"""spawn / start_processes / ProcessContext with real processes."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time

import gradwire.multiprocessing as gmp
import gwmp_workers as w
import pytest
from gwmp_helpers import wait_dead


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_every_process_runs_with_its_index(tmp_path, method):
    gmp.start_processes(w.write_marker, args=(str(tmp_path),), nprocs=3, start_method=method)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.done", "1.done", "2.done"]
    pids = {int(p.read_text()) for p in tmp_path.iterdir()}
    assert len(pids) == 3 and os.getpid() not in pids


def test_join_false_returns_context_with_pids_and_timeouts():
    ctx = gmp.spawn(w.sleep_for, args=(1.5,), nprocs=2, join=False)
    assert isinstance(ctx, gmp.ProcessContext)
    assert len(set(ctx.pids())) == 2
    started = time.monotonic()
    assert ctx.join(timeout=0.1) is False
    assert time.monotonic() - started < 1.0
    assert ctx.join(timeout=30) is True
    assert ctx.join() is True and ctx.join(timeout=0) is True  # idempotent


def test_raised_exception_names_index_and_pid_and_stops_the_others():
    ctx = gmp.spawn(w.raise_in, args=(1,), nprocs=3, join=False)
    pids = ctx.pids()
    started = time.monotonic()
    with pytest.raises(gmp.ProcessRaisedException) as info:
        ctx.join()
    assert time.monotonic() - started < 20  # the sleepers (120 s) were terminated
    exc = info.value
    assert exc.error_index == 1 and exc.error_pid == pids[1]
    assert "ValueError: boom from process 1" in str(exc)
    assert "Traceback" in str(exc)
    assert all(not p.is_alive() for p in ctx.processes)
    with pytest.raises(gmp.ProcessRaisedException):  # the failure is remembered
        ctx.join()
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is gmp.ProcessRaisedException
    assert (again.error_index, again.error_pid, str(again)) == (1, pids[1], str(exc))


def test_exit_code_is_reported_with_fork():
    with pytest.raises(gmp.ProcessExitedException) as info:
        gmp.start_processes(w.exit_in, args=(0, 3), nprocs=2, start_method="fork")
    exc = info.value
    assert exc.error_index == 0 and exc.exit_code == 3 and exc.signal_name is None
    assert "exit code 3" in str(exc)


def test_signal_name_is_reported_and_exception_pickles():
    with pytest.raises(gmp.ProcessExitedException) as info:
        gmp.spawn(w.kill_self_in, args=(1,), nprocs=2)
    exc = info.value
    assert exc.error_index == 1 and exc.signal_name == "SIGKILL" and exc.exit_code == -9
    again = pickle.loads(pickle.dumps(exc))
    assert isinstance(again, gmp.ProcessException)
    assert (again.error_index, again.error_pid, again.exit_code, again.signal_name) == (
        1,
        exc.error_pid,
        -9,
        "SIGKILL",
    )


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="nprocs"):
        gmp.spawn(w.sleep_for, args=(0,), nprocs=0)
    with pytest.raises(ValueError, match="start method 'bogus'"):
        gmp.start_processes(w.sleep_for, args=(0,), start_method="bogus")


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_children_die_when_the_parent_is_killed(method, script_env):
    code = f"import gwmp_workers; gwmp_workers.orphan_parent({method!r})"
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, env=script_env, text=True
    )
    try:
        line = parent.stdout.readline()
        assert line.startswith("PIDS"), line
        pids = [int(x) for x in line.split()[1:]]
        assert all(not wait_dead(pid, 0.2) for pid in pids)  # running before the kill
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert all(wait_dead(pid, 15) for pid in pids), "children outlived their parent"
    finally:
        parent.kill()
        parent.wait()
