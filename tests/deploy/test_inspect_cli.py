"""gradwire inspect against real workers: table, --json, --all, --watch, --dot, token errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .procs import TOKEN, Proc, free_port, run, worker_env


def inspect(*args: str, token: str | None = TOKEN) -> Proc:
    env = worker_env(**({"GRADWIRE_TOKEN": token} if token else {}))
    return run("inspect", *args, env=env, timeout=30)


def test_table_shows_state_counters_peers_and_graph_summaries(cluster: str) -> None:
    p = inspect(cluster)
    assert p.popen.returncode == 0, p.output
    out = p.out
    assert re.search(r"^worker driver \(id 0\)\s+state RUNNING", out, re.M), out
    assert re.search(r"owner rrefs\s+1\s+forks\s+1", out), out
    assert re.search(r"^\s+1\s+w1\s+127\.0\.0\.1:\d+|^\s+1\s+w1\s+unix:", out, re.M), out
    assert "1 context(s), 3 node(s); see --dot autograd" in out
    assert "1 owners, 0 users, 0 pending_children; see --dot rrefs" in out


def test_json_and_cluster_rows(cluster: str) -> None:
    data = json.loads(inspect(cluster, "--json").out)
    assert data["worker"] == "driver" and data["num_owner_rrefs"] == "1"  # int64 -> JSON string
    assert data["extra"]["autograd_graph"]["contexts"][0]["context_id"] == 7
    p = inspect(cluster, "--all")
    rows = p.out.split("\ncluster\n")[1].splitlines()
    assert rows[0].split()[:3] == ["ID", "NAME", "STATE"]
    assert [r.split()[1] for r in rows[1:]] == ["driver", "w1"], p.out
    # w1 runs --until job: it waits at the shutdown barrier, serving, until the driver leaves.
    assert [r.split()[2] for r in rows[1:]] == ["RUNNING", "SHUTTING_DOWN"], p.out


def test_watch_follows_control_messages(cluster: str) -> None:
    p = inspect(cluster, "--watch", "--count", "4")
    assert p.popen.returncode == 0, p.output
    lines = p.out.splitlines()
    assert len(lines) == 4, p.out
    assert all(
        re.search(r"(ForkRequest|ChildAck)\s+peer=w1\s+rref=0:1\s+fork=1:\d+", ln) for ln in lines
    )
    only = inspect(cluster, "--watch", "--kind", "ChildAck", "--count", "2", "--json")
    events = [json.loads(ln) for ln in only.out.splitlines()]
    assert [e["kind"] for e in events] == ["ChildAck", "ChildAck"] and events[0][
        "direction"
    ] == "sent"
    timed = inspect(cluster, "--watch", "--duration", "0.5", "--kind", "Nothing")
    assert timed.popen.returncode == 0 and timed.out == ""


def test_dot_pictures_from_the_debug_rpc(cluster: str, tmp_path: Path) -> None:
    out = tmp_path / "ag.dot"
    p = inspect(cluster, "--dot", "autograd", "-o", str(out))
    assert p.popen.returncode == 0, p.output
    dot = out.read_text()
    assert dot.startswith("digraph autograd {") and 'label="driver"' in dot
    # w1 was inspected too (it has no graph), so the send of msg 11 is a stand-in in its cluster.
    assert '"driver/7/r1" -> "w1/7/send-11"' in dot
    rrefs = inspect(cluster, "--dot", "rrefs").out
    assert '"driver/owner/0:1"' in rrefs and "counted by owner" in rrefs
    missing = inspect(cluster, "--dot", "autograd", "--context", "99")
    assert (
        missing.popen.returncode == 1
        and "no inspected worker has autograd context 99" in missing.err
    )


def test_token_is_required_and_errors_are_clear(cluster: str) -> None:
    p = inspect(cluster, token=None)
    assert p.popen.returncode == 1
    assert "UNAUTHENTICATED" in p.err and "--token-file" in p.err
    p = inspect(f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert p.popen.returncode == 1 and "UNAVAILABLE" in p.err
    p = inspect("nonsense")
    assert p.popen.returncode == 2 and "is not HOST:PORT" in p.err
