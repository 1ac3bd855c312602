"""gradwire.save / gradwire.load: tensors, parameters, state dicts and plain containers to a file
and back; weights_only loading refuses every other global; nothing is written on failure."""

from __future__ import annotations

import io
import os
import pickle
from collections import OrderedDict

import gradwire as gw
import numpy as np
import pytest
from gradwire.errors import ArgumentError, FuturePicklingError


def _checkpoint() -> dict:
    model = gw.nn.Linear(3, 2)
    return {
        "state": model.state_dict(),
        "view": gw.arange(6.0).reshape(2, 3).t(),  # non-contiguous
        "ints": gw.tensor([1, -2], dtype=gw.int64),
        "param": gw.nn.Parameter(gw.ones(2)),
        "dtype": gw.float64,
        "plain": [1, 2.5, 3 + 1j, "s", b"b", None, True, (1, 2), {3, 4}, frozenset([5])],
    }


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_round_trip_through_a_path(tmp_path, protocol):
    saved = _checkpoint()
    path = tmp_path / "ckpt.pt"
    gw.save(saved, path, pickle_protocol=protocol)
    back = gw.load(path)
    assert isinstance(back["state"], OrderedDict) and list(back["state"]) == ["weight", "bias"]
    for k, v in saved["state"].items():
        np.testing.assert_array_equal(back["state"][k].numpy(), v.detach().numpy())
    np.testing.assert_array_equal(back["view"].numpy(), [[0, 3], [1, 4], [2, 5]])
    assert back["ints"].dtype == gw.int64 and back["ints"].tolist() == [1, -2]
    assert type(back["param"]) is gw.nn.Parameter and back["param"].requires_grad
    assert back["dtype"] is gw.float64
    assert back["plain"] == saved["plain"]


def test_round_trip_through_a_file_object_and_map_location():
    buf = io.BytesIO()
    gw.save([gw.ones(2, requires_grad=True)], buf)
    buf.seek(0)
    (t,) = gw.load(buf, map_location="cpu")
    assert t.is_leaf and t.requires_grad and t.tolist() == [1.0, 1.0]
    with pytest.raises(ArgumentError, match="map_location"):
        gw.load(io.BytesIO(buf.getvalue()), map_location={"cuda:0": "cpu"})


class _Payload:
    def __reduce__(self):
        return (os.system, ("true",))


def test_weights_only_refuses_other_globals_and_trusted_loading_opts_in(tmp_path):
    path = tmp_path / "evil.pt"
    gw.save(_Payload(), path)
    with pytest.raises(pickle.UnpicklingError, match="refused the global .*system"):
        gw.load(path)
    assert gw.load(path, weights_only=False) == 0  # unpickles anything: the caller trusts it


def test_nothing_is_written_when_pickling_fails(tmp_path):
    path = tmp_path / "future.pt"
    with pytest.raises(FuturePicklingError):
        gw.save({"f": gw.futures.Future()}, path)
    assert not path.exists()
