"""Tensors sent through Queue, SimpleQueue, Process arguments and Pool share memory."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import gradwire.multiprocessing as gmp
import gwmp_workers as w
import numpy as np
import pytest
from gradwire._tensor import Tensor

TIMEOUT = 60


@pytest.fixture
def ctx():
    return gmp.get_context("spawn")


def test_share_memory_moves_in_place_and_is_idempotent(strategy):
    t = w.tensor([1.0, 2.0, 3.0])
    assert not gmp.is_shared(t)
    assert gmp.share_memory_(t) is t
    assert gmp.is_shared(t) and t._shared.kind == strategy
    seg = t._shared
    assert t._data.tolist() == [1.0, 2.0, 3.0]
    gmp.share_memory_(t)
    assert t._shared is seg  # no second copy


def test_share_memory_of_a_view_moves_its_base_and_keeps_aliasing(strategy):
    base = w.tensor(np.arange(10.0))
    view = Tensor._wrap(base._data[::-2])  # negative stride, like a flip
    view._base = base
    gmp.share_memory_(view)
    assert gmp.is_shared(base) and view._shared is base._shared
    assert np.shares_memory(view._data, base._data)
    view._data[0] = -1.0
    assert base._data[9] == -1.0


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_queue_write_in_child_is_seen_by_parent(strategy, method):
    ctx = gmp.get_context(method)
    q, done = ctx.Queue(), ctx.Queue()
    t = w.tensor(np.zeros(5))
    p = ctx.Process(target=w.fill_from_queue, args=(q, done, 7.0))
    p.start()
    q.put(t)
    assert done.get(timeout=TIMEOUT) is True
    p.join(TIMEOUT)
    assert t._data.tolist() == [7.0] * 5
    assert gmp.is_shared(t)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_process_arguments_share_memory_and_keep_requires_grad_but_not_hooks(strategy, method):
    ctx = gmp.get_context(method)
    t = w.tensor(np.zeros(3), requires_grad=True)
    t.register_hook(lambda g: g)
    done = ctx.Queue()
    p = ctx.Process(target=w.fill_arg, args=(t, done, 2.5))
    p.start()
    assert done.get(timeout=TIMEOUT) == (True, "Tensor", True)
    p.join(TIMEOUT)
    assert t._data.tolist() == [2.5] * 3
    assert t._hooks  # the sender's hook is still registered here


def test_pool_task_writes_into_parent_tensor(strategy, ctx):
    t = w.tensor(np.zeros(4))
    with ctx.Pool(1) as pool:
        assert pool.apply(w.fill_and_return, (t, 3.0)) == 12.0
    assert t._data.tolist() == [3.0] * 4


def test_simple_queue_child_to_parent_write_seen_by_child(strategy, ctx):
    q, report, go = ctx.SimpleQueue(), ctx.Queue(), ctx.Event()
    p = ctx.Process(target=w.send_and_watch, args=(q, report, go))
    p.start()
    t = q.get()
    assert gmp.is_shared(t) and t._shared.kind == strategy
    t._data[:] = 9.0
    go.set()
    assert report.get(timeout=TIMEOUT) == [9.0] * 4
    p.join(TIMEOUT)


def test_views_keep_base_and_same_tensor_twice_shares_one_segment(strategy, ctx):
    base = w.tensor(np.arange(6.0))
    view = Tensor._wrap(base._data[2:5])
    view._base = base
    q, report = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=w.describe_received, args=(q, report, 4))
    p.start()
    q.put(base)
    q.put(view)
    q.put(base)  # the same tensor again
    q.put(view)
    got = report.get(timeout=TIMEOUT)
    p.join(TIMEOUT)
    b1, v1, b2, v2 = got
    assert len({d["seg"] for d in got}) == 1 and len({d["seg_obj"] for d in got}) == 1
    assert b1["seg"] == base._shared.seg_id
    assert v1["values"] == [2.0, 3.0, 4.0] and v1["base_shape"] == [6] and v1["shares_base"]
    assert v1["base_id"] == b1["id"]  # the received view's base is the received base
    assert b1["base_id"] is None
    assert base._data[0] == 100.0  # the child wrote through what it received


def test_subclass_and_requires_grad_survive(strategy, ctx):
    class_name = "Parameter"
    try:
        from gradwire.nn import Parameter
    except ImportError:
        pytest.skip("gradwire.nn.Parameter has not landed yet")
    gmp.init_reductions()
    t = Parameter._wrap(np.ones(2), requires_grad=True)
    q, report = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=w.describe_received, args=(q, report, 1))
    p.start()
    q.put(t)
    (got,) = report.get(timeout=TIMEOUT)
    p.join(TIMEOUT)
    assert got["type"] == class_name and got["requires_grad"] and got["is_leaf"]


def test_non_leaf_requiring_grad_is_refused_with_a_clear_error(ctx):
    x = w.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    assert not y.is_leaf
    with pytest.raises(RuntimeError, match="non-leaf tensor that requires grad.*detach"):
        ForkingPickler.dumps(y)
    q = ctx.SimpleQueue()
    with pytest.raises(RuntimeError, match="non-leaf"):
        q.put(y)
    ForkingPickler.dumps(y.detach())  # the suggested fix works


def test_round_trip_in_one_process_reuses_the_mapping(strategy):
    t = w.tensor(np.arange(4.0))
    again = pickle.loads(ForkingPickler.dumps(t))
    assert again._shared is t._shared
    again._data[1] = 42.0
    assert t._data[1] == 42.0


def test_zero_size_and_non_contiguous_tensors(strategy):
    empty = w.tensor(np.zeros((0, 3)))
    assert pickle.loads(ForkingPickler.dumps(empty))._data.shape == (0, 3)
    grid = w.tensor(np.arange(12.0).reshape(3, 4))
    col = Tensor._wrap(grid._data[:, 1])
    col._base = grid
    back = pickle.loads(ForkingPickler.dumps(col))
    assert back._data.tolist() == [1.0, 5.0, 9.0]
    assert back._base is not None and back._base._data.shape == (3, 4)


def test_unknown_strategy_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown sharing strategy 'bogus'.*file_system"):
        gmp.set_sharing_strategy("bogus")
    assert gmp.get_sharing_strategy() in gmp.get_all_sharing_strategies()
    assert gmp.get_all_sharing_strategies() == {"file_descriptor", "file_system"}


def test_package_process_shares_tensor_arguments_under_fork(strategy):
    if gmp.get_start_method() != "fork":
        pytest.skip("the default start method here is not fork")
    done = gmp.Queue()
    t = w.tensor(np.zeros(3))
    p = gmp.Process(target=w.fill_arg, args=(t, done, 4.0))
    p.start()
    assert done.get(timeout=TIMEOUT)[0] is False
    p.join(TIMEOUT)
    assert t._data.tolist() == [4.0] * 3  # a plain fork Process would leave zeros here
    nested = {"x": [w.tensor(np.zeros(2))]}
    gmp.process._share_tensors(nested)
    assert gmp.is_shared(nested["x"][0])


def test_tensor_methods_and_indexing_views_work_together(strategy, ctx):
    base = Tensor(np.arange(6.0))
    view = base[2:5]  # the Tensor's own view op: view._base is base
    assert view._base is base
    assert base.share_memory_() is base and base.is_shared()
    q, report = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=w.describe_received, args=(q, report, 1))
    p.start()
    q.put(view)
    (got,) = report.get(timeout=TIMEOUT)
    p.join(TIMEOUT)
    assert got["values"] == [2.0, 3.0, 4.0] and got["base_shape"] == [6]
    assert base._data[2] == 100.0  # the child's write through the view reached the base
    assert view._data[0] == 100.0  # and the sender's view now aliases the shared base
