"""gradwire.autograd.profiler on one process: op, autograd-node and record_function events,
their nesting, the views (key_averages, table) and the Chrome trace."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import gradwire as gw
import pytest
from gradwire.autograd import _profiling, profiler
from gradwire.futures import Future


def _step(x: gw.Tensor) -> None:
    with profiler.record_function("step"):
        y = (x * x).relu().sum()
        y.backward()


def test_ops_backward_nodes_and_blocks_are_events_nested_by_time() -> None:
    x = gw.ones(3, requires_grad=True)
    with profiler.profile() as prof:
        _step(x)
    events = prof.function_events
    names = [e.name for e in events]
    assert names[0] == "step"
    for name in ("aten::mul", "aten::relu", "aten::clamp_min", "aten::sum"):
        assert name in names, names
    assert "autograd::engine::evaluate_function: MulBackward0" in names
    step = events[0]
    assert {c.name for c in step.cpu_children} >= {"aten::mul", "aten::relu", "aten::sum"}
    relu = next(e for e in events if e.name == "aten::relu")
    assert [c.name for c in relu.cpu_children] == ["aten::clamp_min"]
    assert relu.cpu_children[0].cpu_parent is relu
    for e in events:
        assert e.node_id == -1 and not e.is_remote and e.count == 1
        assert e.time_range.start <= e.time_range.end
        if e.cpu_parent is not None:
            assert e.cpu_parent.time_range.start <= e.time_range.start
            assert e.time_range.end <= e.cpu_parent.time_range.end
    assert step.self_cpu_time_total == pytest.approx(
        step.cpu_time_total - sum(c.cpu_time_total for c in step.cpu_children)
    )


def test_nothing_is_recorded_outside_a_profile_or_on_other_threads() -> None:
    assert _profiling.active == 0
    with profiler.profile() as prof:
        done = threading.Event()

        def elsewhere() -> None:
            gw.ones(2) + 1
            done.set()

        threading.Thread(target=elsewhere).start()
        done.wait(10)
    gw.ones(2) * 3
    assert [e.name for e in prof.function_events] == []
    assert _profiling.active == 0


def test_record_shapes_and_memory() -> None:
    a, b = gw.ones(4, 3), gw.ones(3, 2)
    with profiler.profile(record_shapes=True, profile_memory=True) as prof:
        gw.matmul(a, b)
    mm = next(e for e in prof.function_events if e.name == "aten::matmul")
    assert mm.input_shapes == [[4, 3], [3, 2]]
    assert mm.cpu_memory_usage == 4 * 2 * 4  # float32 output
    with profiler.profile() as plain:
        gw.matmul(a, b)
    assert {e.cpu_memory_usage for e in plain.function_events} == {0}
    assert all(e.input_shapes == [] for e in plain.function_events)


def test_key_averages_and_table() -> None:
    x = gw.ones(2)
    with profiler.profile(record_shapes=True) as prof:
        for _ in range(3):
            x + x
        gw.ones(5) + gw.ones(5)
    avgs = prof.key_averages()
    add = next(a for a in avgs if a.key == "aten::add")
    assert add.count == 4
    assert add.cpu_time == pytest.approx(add.cpu_time_total / 4)
    by_shape = prof.key_averages(group_by_input_shape=True)
    assert sorted(a.count for a in by_shape if a.key == "aten::add") == [1, 3]
    table = avgs.table(sort_by="cpu_time_total", row_limit=5)
    assert "aten::add" in table and "# of Calls" in table and "Self CPU time total" in table
    assert "Input Shapes" in by_shape.table()
    with pytest.raises(ValueError, match="sort by one of"):
        avgs.table(sort_by="nope")


def test_chrome_trace_is_valid_json(tmp_path: Path) -> None:
    with profiler.profile() as prof:
        gw.ones(2) * 2
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    assert {e["name"] for e in trace} >= {"aten::ones", "aten::mul"}
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in trace)


def test_profiles_do_not_nest_on_one_thread_and_events_wait_for_the_end() -> None:
    with profiler.profile() as prof:
        with pytest.raises(RuntimeError, match="already enabled on this thread"):
            with profiler.profile():
                pass
        with pytest.raises(RuntimeError, match="didn't finish"):
            _ = prof.function_events
    with profiler.profile(enabled=False) as off:
        gw.ones(1)
    with pytest.raises(RuntimeError, match="not enabled"):
        _ = off.function_events


def test_record_function_ends_with_a_future_once() -> None:
    fut: Future[int] = Future()
    with profiler.profile() as prof:
        with profiler.record_function("wait-for-it") as rf:
            done = rf._call_end_callbacks_on_future(fut)
            with pytest.raises(RuntimeError, match="can only be called once"):
                rf._call_end_callbacks_on_future(fut)
        gw.ones(1)
        fut.set_result(7)
    assert done.wait() == 7
    block = next(e for e in prof.function_events if e.name == "wait-for-it")
    ones = next(e for e in prof.function_events if e.name == "aten::ones")
    assert block.time_range.end >= ones.time_range.end  # ended with the future, not the with


def test_record_function_as_a_decorator() -> None:
    @profiler.record_function("decorated")
    def f(x: gw.Tensor) -> gw.Tensor:
        return x + 1

    x = gw.ones(1)
    with profiler.profile() as prof:
        f(x)
    top = prof.function_events[0]
    assert top.name == "decorated" and [c.name for c in top.cpu_children] == ["aten::add"]
