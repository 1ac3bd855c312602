"""Device maps across two real workers, on the TEST-ONLY CuPy stand-in (no GPU here).

The stand-in (tests/fake_cupy) gives each process two fake CUDA devices over NumPy memory;
what it exercises is gradwire's device plumbing: which map a request, a reply, a ``to_here``
and the backward gradients travel by, and the errors. A real GPU run is scripts/gpu_check.sh.
"""

from __future__ import annotations

from gradwire.distributed.rpc._testing import run_cluster

from . import fake_cupy_bodies as bodies

BOTH = {"device_maps": {"worker1": {0: 1, 1: 0}}}


def _rank0(results):
    assert all(r.error is None for r in results), [r.error for r in results]
    return results[0].value


def test_requests_use_the_callers_map_and_replies_its_inverse():
    out = _rank0(run_cluster(2, bodies.maps_both_ways, rank_options={0: BOTH}, timeout=60))
    assert out["fake"] is True
    assert out["cuda:0"] == ("cuda:1", "cuda:0", [0.0, 1.0, 2.0, 3.0])
    assert out["cuda:1"] == ("cuda:0", "cuda:1", [0.0, 1.0, 2.0, 3.0])
    assert out["cpu"] == ("cpu", "cpu", [0.0, 1.0, 2.0, 3.0])  # CPU tensors never mapped
    assert out["remote cuda:0"] == ("cuda:0", [1.0, 2.0, 3.0, 4.0])  # to_here: inverse map
    assert out["remote cuda:1"] == ("cuda:1", [1.0, 2.0, 3.0, 4.0])
    assert out["remote cpu"] == ("cpu", [1.0, 2.0, 3.0, 4.0])


def test_dist_autograd_gradients_land_on_the_device_of_their_leaf():
    out = _rank0(run_cluster(2, bodies.autograd_on_devices, rank_options={0: BOTH}, timeout=60))
    for dev in ("cuda:0", "cuda:1"):
        loss_dev, grad_dev, grad, module = out[dev]
        assert loss_dev == dev and grad_dev == dev
        assert grad == [2.0, 4.0, 6.0]
        assert module.startswith("fake_cupy")  # a device array in the store, not a host copy


def test_a_cuda_tensor_without_a_map_entry_is_refused_naming_the_fix():
    results = run_cluster(
        2,
        bodies.missing_entries,
        rank_options={0: {"device_maps": {"worker1": {0: 1}}}},
        timeout=60,
    )
    assert all(r.error is None for r in results), [r.error for r in results]
    r0, r1 = results[0].value, results[1].value
    assert "no device map entry for cuda:1" in r0["request_unmapped_device"]
    assert "set_device_map('worker1', {'cuda:1': 'cuda:N'})" in r0["request_unmapped_device"]
    reply = r0["reply_unmapped_device"]
    assert "no device map entry for cuda:0" in reply and "inverse of the caller's map" in reply
    assert "on worker 'worker0'" in reply
    assert r0["cpu_untouched"] == "cpu"
    assert "SerializationError" in r1["request_without_map"]
    assert "set_device_map('worker0'" in r1["request_without_map"]


def test_init_rpc_refuses_invalid_maps_on_every_rank_naming_each_problem():
    bad = {
        0: {"device_maps": {"worker1": {0: 5}, "nobody": {0: 1}}},
        1: {"device_maps": {"worker0": {7: 0, 1: 1}}, "devices": ["cuda:0"]},
    }
    results = run_cluster(2, bodies.nothing, rank_options=bad, expect_failure={0, 1}, timeout=30)
    for r in results:
        assert r.error is not None and "invalid device maps" in r.error, r.error
        assert "'nobody', which is not a worker of this cluster" in r.error
        assert (
            "worker 'worker1' sees 2 CUDA devices, but worker 'worker0' maps cuda:0 to" in r.error
        )
        assert (
            "worker 'worker1' sees 2 CUDA devices, but its device map for 'worker0' maps cuda:7"
            in r.error
        )
        assert "worker 'worker1' did not list cuda:1 in devices, but its device map" in r.error
        assert "worker 'worker0' did not list" not in r.error
