"""Dynamic groups (``init_rpc`` without a world size): workers join a running group and leave
it, with real processes on loopback (roles in dynamic_group.py)."""

from __future__ import annotations

import operator
import os
import signal
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
from gradwire import errors
from gradwire._runtime import agent as _agent
from gradwire.distributed import rpc
from gradwire.distributed.rpc._testing import free_port

from . import dynamic_group as dg


@pytest.fixture
def group() -> Any:
    g = dg.Group(f"tcp://127.0.0.1:{free_port()}")
    try:
        yield g
    finally:
        for s in g.signals.values():
            s.set()
        g.close()


def test_join_under_load_then_leave_and_die(group: dg.Group) -> None:
    # 2 workers, then 3 join while calls and RRef forks are in flight, then 2 leave
    # gracefully and 1 is killed.
    group.start(dg.survivor, "w0", 0)
    assert group.expect("w0", "joined") == ["w0"]
    group.start(dg.survivor, "w1", 1)
    assert group.expect("w1", "joined") == ["w0", "w1"]
    group.signals["load"].set()
    for name, rank, fate in (("w2", 2, "leave"), ("w3", 7, "leave"), ("w4", 4, "killed")):
        group.start(dg.joiner, name, rank, fate)
    for name in ("w2", "w3", "w4"):
        assert {"w0", "w1", name} <= set(group.expect(name, "joined"))
        group.expect(name, "loaded")
    group.expect("w0", "held")
    group.procs["w4"].kill()
    group.signals["leave"].set()
    assert group.expect("w0", "released") == {"v": 42}  # not deleted while w2 was leaving
    left = {name: group.expect(name, "done") for name in ("w2", "w3")}
    # w2 waited for w0 to delete the RRef it owns before it left.
    assert left["w2"]["leave_seconds"] > 0.5, left["w2"]["leave_seconds"]
    group.signals["stop"].set()
    checked = {name: group.expect(name, "checked") for name in ("w0", "w1")}
    group.signals["end"].set()
    done = {name: group.expect(name, "done") for name in ("w0", "w1")}
    for c in checked.values():
        assert c["members"] == ["w0", "w1", "w4"], c  # w4 is lost, not departed
        assert c["departed"].startswith("WorkerDepartedError") and "'w2'" in c["departed"], c
        assert "departed" in c["departed"] and c["departed_seconds"] < 0.5, c
        assert "'w3'" in c["departed_info"] and "departed" in c["departed_info"], c
        assert "'w4' is lost" in c["lost"], c
        assert c["clean"], c  # RRef counts back to zero, no dist-autograd context left
    # No call lost or run twice: each call that answered ran exactly once on its target, a
    # call that failed did so as departed (w2, w3) or unavailable (w4), and none ran twice.
    logs = {name: Counter(r["log"]) for name, r in {**left, **done}.items()}
    assert all(n == 1 for log in logs.values() for n in log.values()), logs
    forks = 0
    for name, r in {**left, **done}.items():
        load = r["load"]
        forks += load["forks"]
        assert load["ok"], name
        for target, call_id in load["ok"]:
            if target != "w4":
                assert logs[target][call_id] == 1, (name, target, call_id)
        for target, _call_id, kind, message in load["failed"]:
            if target in ("w2", "w3"):
                assert kind == "WorkerDepartedError" and "departed" in message, message
            else:
                assert target == "w4" and kind == "WorkerUnavailableError", message
    assert forks > 0


def test_a_name_or_rank_in_use_is_refused_naming_its_member(group: dg.Group) -> None:
    group.start(dg.late, "host", 0)
    group.expect("host", "joined")
    group.start(dg.late, "m1", 1)
    group.expect("m1", "joined")
    group.start(dg.clash, "host", 3, label="host-again")
    group.start(dg.clash, "m2", 1)
    group.start(dg.fixed_joiner, "f", 1)
    group.start(dg.clash, "m1", None, label="m1-no-rank")
    name_clash = group.expect("host-again", "done")
    assert name_clash.startswith("RpcInitError"), name_clash
    assert "'host' is not unique" in name_clash and "(rank 0)" in name_clash, name_clash
    rank_clash = group.expect("m2", "done")
    assert rank_clash.startswith("RpcInitError"), rank_clash
    assert "rank 1 is taken: worker 'm1'" in rank_clash, rank_clash
    no_rank = group.expect("m1-no-rank", "done")
    assert "'m1' is not unique" in no_rank and "(rank 1)" in no_rank, no_rank
    fixed = group.expect("f", "done")
    assert "expects world_size 2" in fixed and "dynamic group" in fixed, fixed
    group.signals["stop"].set()
    assert group.expect("m1", "done") == "ok"
    assert group.expect("host", "done") == "ok"


def test_a_member_that_missed_the_announcement_asks_the_host(group: dg.Group) -> None:
    group.start(dg.late, "host", 0)
    group.expect("host", "joined")
    group.start(dg.deaf_member, "deaf", 1)
    group.expect("deaf", "joined")
    group.start(dg.late, "late", 9)
    group.expect("late", "joined")
    group.signals["load"].set()
    group.expect("deaf", "found")  # before "late" leaves
    group.signals["stop"].set()
    got = group.expect("deaf", "done")
    assert got["before"] == ["deaf", "host"], got  # it did not hear of "late"...
    assert got["info"] == ("late", 9) and got["answer"] == "late", got  # ...and found it


def _gradwire(*args: str) -> subprocess.Popen[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GRADWIRE_") and k not in ("RANK", "WORLD_SIZE")
    }
    env.update({"GRADWIRE_TOKEN": dg.TOKEN, "PYTHONUNBUFFERED": "1"})
    module = "gradwire.server" if args[0] == "worker" else "gradwire.cli"
    argv = [sys.executable, "-m", module, *(args[1:] if args[0] == "worker" else args)]
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_cli_workers_join_without_a_world_size_and_inspect_watch_shows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    port = free_port()
    rpc.init_rpc(
        "host", 0, rpc_backend_options=dg.options(f"tcp://127.0.0.1:{port}", token=dg.TOKEN)
    )
    workers: list[subprocess.Popen[str]] = []
    try:
        watch = _gradwire(
            "inspect", f"127.0.0.1:{port}", "--watch", "--count", "4", "--duration", "60",
            "--kind", "PeerJoined", "--kind", "PeerLeft", "--kind", "PeerLost",
        )  # fmt: skip
        workers.append(watch)
        agent = _agent.current()
        assert dg.until(lambda: agent.control_events.listening, 30), "inspect did not subscribe"
        seeds = ("--master-addr", "127.0.0.1", "--master-port", str(port))
        polite = _gradwire("worker", "--name", "cli-a", *seeds)  # the host assigns its rank
        rude = _gradwire("worker", "--name", "cli-b", "--rank", "6", *seeds)
        workers += [polite, rude]
        names = lambda: {w.name for w in rpc.get_worker_infos()}  # noqa: E731
        assert dg.until(lambda: {"cli-a", "cli-b"} <= names(), 30), names()
        assert rpc.get_worker_info("cli-a").id == 1  # the lowest free one
        view = rpc.api._get_current_rpc_agent().get_worker_infos()
        assert sorted(w.name for w in view) == ["cli-a", "cli-b", "host"]
        assert rpc.rpc_sync("cli-b", operator.add, (1, 2)) == 3
        polite.send_signal(signal.SIGTERM)  # leaves the group: departed
        assert polite.wait(30) == 0, polite.communicate()
        assert "cli-a" not in names()
        with pytest.raises(errors.WorkerDepartedError, match="'cli-a'.*departed"):
            rpc.rpc_sync("cli-a", operator.add, (1, 2))
        rude.kill()  # lost, as before
        rude.wait(10)
        out, err = watch.communicate(timeout=30)
        assert watch.returncode == 0, err
        kinds = [(line.split()[2], line.split()[3]) for line in out.splitlines()]
        assert kinds[:2] == [("PeerJoined", "peer=cli-a"), ("PeerJoined", "peer=cli-b")] or kinds[
            :2
        ] == [("PeerJoined", "peer=cli-b"), ("PeerJoined", "peer=cli-a")], out
        assert kinds[2:] == [("PeerLeft", "peer=cli-a"), ("PeerLost", "peer=cli-b")], out
        assert "cli-b" in names()  # a lost member stays a member (as lost)
        with pytest.raises(errors.WorkerUnavailableError, match="'cli-b' is lost"):
            rpc.rpc_sync("cli-b", operator.add, (1, 2))
    finally:
        for p in workers:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=10)
        rpc.shutdown()


def test_worker_settings_without_a_world_size_mean_a_dynamic_group() -> None:
    from gradwire.server.cli.settings import ConfigError
    from gradwire.server.cli.worker import build_parser
    from gradwire.server.cli.worker_config import worker_config

    def cfg(argv: list[str]) -> Any:
        return worker_config(build_parser().parse_args(argv), {})

    c = cfg(["--name", "t1", "--rank", "7", "--master-addr", "10.0.0.5", "--token", "t"])
    assert c.world_size is None and c.init_method == "tcp://10.0.0.5:29500"
    seeded = cfg(
        ["--name", "t", "--rank", "3", "--peers", "10.0.0.5:4000,10.0.0.6:4000", "--token", "t"]
    )
    assert seeded.init_method == "tcp://10.0.0.5:4000"  # the first seed hosts the group
    with pytest.raises(ConfigError, match="--names needs a world size|GRADWIRE_NAMES needs"):
        cfg(["--rank", "1", "--names", "a,b", "--master-addr", "h"])
    fixed = cfg(["--name", "a", "--rank", "1", "--world-size", "2", "--master-addr", "h"])
    assert fixed.world_size == 2
    assert cfg(["--name", "t", "--master-addr", "h", "--token", "t"]).rank is None  # assigned
    with pytest.raises(ConfigError, match="missing --rank .*needs its rank"):
        cfg(["--name", "a", "--world-size", "2", "--master-addr", "h"])
    with pytest.raises(ConfigError, match="rank 32768 .* is too large"):
        cfg(["--name", "a", "--rank", "32768", "--master-addr", "h", "--token", "t"])


def test_the_same_join_and_leave_on_pytorch_and_gradwire() -> None:
    """What PyTorch's dynamic groups allow, gradwire allows (and refuses what it refuses)."""
    from pathlib import Path

    from torch_oracle import require_torch_python

    script = str(Path(__file__).with_name("dynamic_scenario.py"))

    def run(python: str, framework: str) -> dict[str, Any]:
        import json

        env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
        p = subprocess.run(
            [python, script, framework, str(free_port())],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        return dict(json.loads(p.stdout.strip().splitlines()[-1]))

    ours = run(sys.executable, "gradwire")
    expected = {
        "h.init": ["ok", None],
        "a.init": ["ok", None],
        "b.init": ["ok", None],
        "h.members_after_joins": ["a", "b", "h"],
        "a.info_of_later_joiner": ["ok", 2],
        "a.call_later_joiner": ["ok", 3],
        "b.call_host": ["ok", 4],
        "b.shutdown": ["ok", None],
        "h.members_after_leave": ["a", "h"],
        "h.call_departed": ["RuntimeError", None],
        "dup.init": ["RuntimeError", None],
    }
    assert ours == expected
    theirs = run(require_torch_python(), "torch")
    assert theirs == expected


def test_a_call_still_running_when_its_worker_leaves_fails_as_departed(group: dg.Group) -> None:
    group.start(dg.waiting_caller, "host", 0)
    group.start(dg.busy_leaver, "busy", 1)
    group.expect("busy", "joined")
    group.expect("host", "calling")
    group.signals["leave"].set()
    group.expect("busy", "done")
    group.signals["stop"].set()
    got = group.expect("host", "done")
    # Not at its 30 s timeout: once the departed worker's connection closed.
    assert got["outcome"].startswith("WorkerDepartedError"), got
    assert "'busy' has departed" in got["outcome"] and got["elapsed"] < 20, got


def test_the_host_assigns_the_lowest_free_rank_to_a_worker_without_one(group: dg.Group) -> None:
    group.start(dg.late, "host", 0)
    group.expect("host", "joined")
    group.start(dg.assigned, "m1", 1, "leave")
    assert group.expect("m1", "joined") == 1
    group.start(dg.assigned, "a", None, "stop")
    assert group.expect("a", "joined") == 2  # 0 and 1 are taken
    group.start(dg.assigned, "m5", 5, "stop")
    assert group.expect("m5", "joined") == 5
    group.start(dg.assigned, "b", None, "stop")
    assert group.expect("b", "joined") == 3
    group.signals["leave"].set()  # m1 leaves: rank 1 is free again
    assert group.expect("m1", "done")["id"] == 1
    group.start(dg.assigned, "c", None, "stop")
    assert group.expect("c", "joined") == 1
    group.signals["stop"].set()
    for name, rank in (("a", 2), ("b", 3), ("c", 1)):
        got = group.expect(name, "done")
        # Its dist-autograd ids carry the assigned rank; the others know it by it.
        assert got["id"] == rank and got["context_worker"] == rank, got
        assert got["seen"][name] == rank and got["answer"] == "host", got
    seen = group.expect("m5", "done")["seen"]
    assert seen["a"] == 2 and seen["b"] == 3 and seen["c"] == 1, seen
    assert group.expect("host", "done") == "ok"


def test_a_rank_is_required_with_a_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(
        errors.RpcInitError, match="^rank parameter missing: .*needs a rank .* with a world size"
    ) as info:
        rpc.init_rpc("w", None, 2)
    assert "leave out world_size" in str(info.value)  # what to do instead
    assert _agent.current_or_none() is None or _agent.current_or_none().state.name == "SHUTDOWN"


def test_a_rank_must_fit_a_worker_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(errors.RpcInitError, match="rank 32768, which is too large.*below 32768"):
        rpc.init_rpc("w", 2**15)  # a dynamic group
    with pytest.raises(errors.RpcInitError, match="world_size 32769 is too large"):
        rpc.init_rpc("w", 5, 2**15 + 1)


def _forged_join(port: int, rank: int, world_size: int) -> str:
    """Join rank 0 at ``port`` with ``rank`` (which init_rpc would refuse); the refusal."""
    import grpc
    from gradwire._proto import worker_pb2 as pb
    from gradwire._runtime.transport.transport import Transport

    transport = Transport(dg.options(f"tcp://127.0.0.1:{port}", token=dg.TOKEN), rank)
    me = pb.WorkerInfo(name="forger", id=rank, address="127.0.0.1:1", host_id="elsewhere")
    try:
        transport.control(
            f"127.0.0.1:{port}",
            "Join",
            pb.JoinRequest(worker=me, world_size=world_size),
            pb.JoinReply,
            20.0,
            wait_for_ready=True,
        )
    except grpc.RpcError as exc:
        return str(exc.details())
    finally:
        transport.close()
    return "joined"


def test_the_host_refuses_a_rank_that_does_not_fit_a_worker_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    port = free_port()
    rpc.init_rpc(
        "host", 0, rpc_backend_options=dg.options(f"tcp://127.0.0.1:{port}", token=dg.TOKEN)
    )
    try:
        refused = _forged_join(port, 2**15, 0)
        assert "'forger' has rank 32768, which is too large" in refused, refused
        assert [w.name for w in rpc.get_worker_infos()] == ["host"]
    finally:
        rpc.shutdown()
    # A fixed group's rendezvous refuses it too (and fails, as for any bad rank).
    port = free_port()
    failed: list[BaseException] = []

    def host() -> None:
        opts = dg.options(f"tcp://127.0.0.1:{port}", token=dg.TOKEN, init_timeout=20.0)
        try:
            rpc.init_rpc("host", 0, 2, opts)
        except errors.RpcInitError as exc:
            failed.append(exc)

    t = threading.Thread(target=host)
    t.start()
    refused = _forged_join(port, 2**15, 2)
    t.join(30)
    assert "has rank 32768, which is too large" in refused, refused
    assert failed and "too large" in str(failed[0]), failed
