"""The DOT renderer of gradwire inspect, fed hand-made JSON in the documented contract."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from gradwire.server.cli.dot import DotInputError, render_autograd, render_rrefs

NODE = re.compile(r'^\s+"([^"]+)" \[')
EDGE = re.compile(r'^\s+"([^"]+)" -> "([^"]+)"(?: \[(.*)\])?;$')


def parse(dot: str) -> tuple[dict[str, str], dict[str, str], list[tuple[str, str, str]]]:
    """(node -> cluster label, cluster label -> style, edges); checks every edge's ends exist."""
    assert dot.count("{") == dot.count("}")
    nodes: dict[str, str] = {}
    styles: dict[str, str] = {}
    edges = []
    cluster = None
    for line in dot.splitlines():
        if line.startswith("  subgraph cluster_"):
            cluster = None
        elif cluster is None and line.startswith("    label="):
            cluster = line.split('"')[1]
        elif line.startswith("    style=") and cluster is not None:
            styles[cluster] = line.split('"')[1]
        elif (m := NODE.match(line)) and line.startswith("    "):
            nodes[m.group(1)] = cluster or ""
        elif m := EDGE.match(line):
            edges.append((m.group(1), m.group(2), m.group(3) or ""))
    for a, b, _ in edges:
        assert a in nodes and b in nodes, (a, b)
    return nodes, styles, edges


def extra(autograd: object = None, rrefs: object = None) -> dict[str, str]:
    out = {}
    if autograd is not None:
        out["autograd_graph"] = json.dumps(autograd)
    if rrefs is not None:
        out["rref_forks"] = json.dumps(rrefs)
    return out


# trainer sends x to ps (send on trainer, recv on ps); ps replies (send on ps, recv on trainer).
TRAINER = {
    "contexts": [
        {
            "context_id": 5,
            "nodes": [
                {"id": "1", "name": "SumBackward", "kind": "op"},
                {
                    "id": "2",
                    "name": "RecvRpcBackward",
                    "kind": "recv",
                    "message_id": 2,
                    "peer": "ps",
                },
                {
                    "id": "3",
                    "name": "SendRpcBackward",
                    "kind": "send",
                    "message_id": 1,
                    "peer": "ps",
                },
                {"id": "4", "name": "AccumulateGrad", "kind": "leaf"},
            ],
            "edges": [["1", "2"], ["3", "4"]],
        }
    ]
}
PS = {
    "contexts": [
        {
            "context_id": 5,
            "nodes": [
                {
                    "id": "a",
                    "name": "RecvRpcBackward",
                    "kind": "recv",
                    "message_id": 1,
                    "peer": "trainer",
                },
                {"id": "b", "name": "MulBackward", "kind": "op"},
                {
                    "id": "c",
                    "name": "SendRpcBackward",
                    "kind": "send",
                    "message_id": 2,
                    "peer": "trainer",
                },
                {"id": "d", "name": "AccumulateGrad", "kind": "leaf"},
            ],
            "edges": [["c", "b"], ["b", "a"], ["b", "d"]],
        },
        {"context_id": 6, "nodes": [{"id": "z", "name": "AddBackward", "kind": "op"}], "edges": []},
    ]
}


def test_autograd_clusters_and_send_recv_edges_between_workers() -> None:
    dot = render_autograd({"trainer": extra(TRAINER), "ps": extra(PS)}, context_id=5)
    nodes, styles, edges = parse(dot)
    assert {c for c in nodes.values()} == {"trainer", "ps"}
    assert nodes["trainer/5/4"] == "trainer" and nodes["ps/5/b"] == "ps"
    assert "ps/6/z" not in nodes  # another context, filtered out
    cross = {(a, b) for a, b, attrs in edges if "msg" in attrs}
    # the gradient crosses back along each forward message: recv -> matching send
    assert cross == {("trainer/5/2", "ps/5/c"), ("ps/5/a", "trainer/5/3")}
    local = {(a, b) for a, b, attrs in edges if "msg" not in attrs}
    assert ("trainer/5/1", "trainer/5/2") in local and ("ps/5/b", "ps/5/d") in local
    assert 'shape="cds"' in dot and 'shape="invhouse"' in dot
    assert set(styles.values()) == {"rounded"}


def test_autograd_all_contexts_and_a_missing_sender() -> None:
    dot = render_autograd({"ps": extra(PS)})
    nodes, styles, edges = parse(dot)
    assert "ps/6/z" in nodes and "(2 contexts)" in dot
    # trainer was not inspected: its send of msg 1 is a dashed stand-in in a dashed cluster
    assert nodes["trainer/5/send-1"] == "trainer (not inspected)"
    assert styles["trainer (not inspected)"] == "dashed"
    assert ("ps/5/a", "trainer/5/send-1") in {(a, b) for a, b, _ in edges}


def test_autograd_contract_violations_name_worker_and_problem() -> None:
    with pytest.raises(
        DotInputError, match=r"worker 'ps': extra\['autograd_graph'\] is not valid JSON"
    ):
        render_autograd({"ps": {"autograd_graph": "{nope"}})
    bad_kind = {"contexts": [{"context_id": 1, "nodes": [{"id": "x", "kind": "magic"}]}]}
    with pytest.raises(DotInputError, match="node 'x' has kind 'magic'"):
        render_autograd({"ps": extra(bad_kind)})
    bad_edge = {"contexts": [{"context_id": 1, "nodes": [{"id": "x"}], "edges": [["x", "y"]]}]}
    with pytest.raises(DotInputError, match="unknown node 'y'"):
        render_autograd({"ps": extra(bad_edge)})
    no_msg = {"contexts": [{"context_id": 1, "nodes": [{"id": "s", "kind": "send"}]}]}
    with pytest.raises(DotInputError, match="missing 'message_id'"):
        render_autograd({"ps": extra(no_msg)})
    with pytest.raises(DotInputError, match="no inspected worker has autograd context 3"):
        render_autograd({"ps": extra(PS)}, context_id=3)


def test_an_empty_or_absent_graph_is_an_empty_picture() -> None:
    nodes, _, edges = parse(render_autograd({"w": {}, "v": extra({"contexts": []})}))
    assert nodes == {} and edges == []


# RRef 0:1 owned by ps; trainer0 got fork 1:2 from ps; trainer0 shared it with trainer1 (fork
# 1:3, confirmed by the owner but trainer0 still waits for trainer1's ChildAck).
PS_RREFS = {"owners": [{"rref_id": "0:1", "type": "Linear", "forks": ["1:2", "1:3", "1:9"]}]}
T0_RREFS = {
    "users": [
        {"rref_id": "0:1", "fork_id": "1:2", "owner": "ps", "parent": "ps", "state": "confirmed"}
    ],
    "pending_children": [{"rref_id": "0:1", "fork_id": "1:3", "child": "trainer1"}],
}
T1_RREFS = {
    "users": [
        {
            "rref_id": "0:1",
            "fork_id": "1:3",
            "owner": "ps",
            "parent": "trainer0",
            "state": "pending",
        },
        {"rref_id": "2:8", "fork_id": "2:9", "owner": "w3", "parent": "w3", "state": "confirmed"},
    ]
}


def test_fork_tree_across_workers() -> None:
    views = {
        "ps": extra(rrefs=PS_RREFS),
        "trainer0": extra(rrefs=T0_RREFS),
        "trainer1": extra(rrefs=T1_RREFS),
    }
    dot = render_rrefs(views, rref_id="0:1")
    nodes, _, edges = parse(dot)
    owner, f2, f3 = "ps/owner/0:1", "trainer0/user/0:1/1:2", "trainer1/user/0:1/1:3"
    assert (nodes[owner], nodes[f2], nodes[f3]) == ("ps", "trainer0", "trainer1")
    pairs = {(a, b): attrs for a, b, attrs in edges}
    assert "fork 1:2" in pairs[(owner, f2)]
    # child of trainer0's fork (not of the owner), which trainer0 keeps until the ChildAck
    assert "fork 1:3" in pairs[(f2, f3)] and "awaiting ChildAck" in pairs[(f2, f3)]
    assert (owner, f3) not in pairs
    assert "awaiting ChildAck" in dot and "2:8" not in dot
    # 1:9 is counted by the owner but held by no inspected worker
    assert "counted by owner" in pairs[(owner, "?/user/0:1/1:9")]
    assert "Linear" in dot and 'style="dashed"' in dot


def test_fork_tree_with_an_uninspected_owner() -> None:
    nodes, styles, edges = parse(render_rrefs({"trainer1": extra(rrefs=T1_RREFS)}))
    assert (
        nodes["w3/owner/2:8"] == "w3 (not inspected)" and styles["w3 (not inspected)"] == "dashed"
    )
    assert ("w3/owner/2:8", "trainer1/user/2:8/2:9") in {(a, b) for a, b, _ in edges}
    # trainer0 (the parent of 1:3) is not inspected either: a stand-in fork there
    assert ("trainer0/user/0:1/?", "trainer1/user/0:1/1:3") in {(a, b) for a, b, _ in edges}
    with pytest.raises(DotInputError, match="no inspected worker knows RRef 9:9"):
        render_rrefs({"trainer1": extra(rrefs=T1_RREFS)}, rref_id="9:9")
    with pytest.raises(DotInputError, match="'users' must be a list"):
        render_rrefs({"x": extra(rrefs={"users": {}})})


def test_labels_are_escaped() -> None:
    g = {"contexts": [{"context_id": 1, "nodes": [{"id": 'q"1', "name": 'A"B\\C'}], "edges": []}]}
    dot = render_autograd({'we"ird': extra(g)})
    assert '"we\\"ird/1/q\\"1"' in dot and 'label="A\\"B\\\\C"' in dot


def test_graphviz_accepts_the_pictures(tmp_path: Path) -> None:
    dot = shutil.which("dot")
    if dot is None:
        pytest.skip("Graphviz (dot) is not installed")
    views = {
        "trainer": extra(TRAINER),
        "ps": extra(PS, PS_RREFS),
        "trainer0": extra(rrefs=T0_RREFS),
        "trainer1": extra(rrefs=T1_RREFS),
    }
    for name, text in (("ag", render_autograd(views)), ("rr", render_rrefs(views))):
        src = tmp_path / f"{name}.dot"
        src.write_text(text)
        p = subprocess.run([dot, "-Tsvg", str(src)], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0 and "<svg" in p.stdout, p.stderr
