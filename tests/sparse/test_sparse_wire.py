"""Sparse COO tensors through the wire codec: indices and values travel as two side-table
arrays (never in the pickle), the tensor comes back equal with its layout, coalesced flag and
requires_grad, and a crafted reference or malformed parts are refused with a clear error."""

from __future__ import annotations

import pickle
from typing import Any

import gradwire as gw
import numpy as np
import pytest
from gradwire._proto import worker_pb2 as pb
from gradwire._wire import calls
from gradwire._wire.framing import Assembler, decode_frame, encode_frame, split
from gradwire._wire.pickler import PROTOCOL, EncodeContext
from gradwire._wire.policy import CallablePolicy
from gradwire.errors import SerializationError

POLICY = CallablePolicy()


def _through_wire(obj: Any) -> tuple[Any, EncodeContext, bytes]:
    ctx = EncodeContext(peer="w1")
    first, buffers = calls.encode_body(pb.FrameHeader(call=pb.CallHeader()), obj, ctx)
    asm = Assembler(1 << 30)
    for f in split(first, buffers, 4096):
        asm.feed(decode_frame(encode_frame(f)))
    assert asm.message is not None
    body, _ = calls.decode_body(asm.message, {"policy": POLICY, "peer": "w0", "worker": "w1"})
    return body, ctx, bytes(buffers[0])


def _table_grad(rows: int = 1000, dim: int = 16) -> gw.Tensor:
    emb = gw.nn.Embedding(rows, dim, sparse=True)
    emb(gw.tensor([[3, 7, 3], [999, 0, 7]])).sum().backward()
    return emb.weight.grad


def test_a_sparse_gradient_travels_as_its_rows_only() -> None:
    grad = _table_grad()
    body, ctx, pickled = _through_wire({"g": grad})
    got = body["g"]
    assert got.is_sparse and got.layout is gw.sparse_coo
    assert got.shape == (1000, 16) and got._nnz() == 6 and not got.is_coalesced()
    np.testing.assert_array_equal(got.to_dense().numpy(), grad.to_dense().numpy())
    # two arrays in the side table: the 6 indices and the 6 x 16 values, not the 1000 x 16 table
    assert [(m.kind, tuple(m.shape)) for m, _ in ctx.tensors] == [
        ("ndarray", (1, 6)),
        ("ndarray", (6, 16)),
    ]
    assert sum(m.nbytes for m, _ in ctx.tensors) == 6 * 8 + 6 * 16 * 4
    assert grad._values().numpy().tobytes() not in pickled


def test_coalesced_flag_requires_grad_and_hybrid_shape_survive() -> None:
    s = gw.sparse_coo_tensor([[0, 2], [1, 1]], gw.ones(2, 3), (3, 2, 3)).coalesce()
    s.requires_grad_(True)
    body, _, _ = _through_wire([s, s])
    a, b = body
    assert a is b  # one object sent twice arrives as one
    assert a.is_coalesced() and a.requires_grad and a.sparse_dim() == 2 and a.dense_dim() == 1
    np.testing.assert_array_equal(a.detach().to_dense().numpy(), s.detach().to_dense().numpy())


def test_an_empty_sparse_tensor_arrives_empty() -> None:
    s = gw.sparse_coo_tensor(np.zeros((2, 0), np.int64), np.zeros(0, np.float32), (4, 5))
    body, _, _ = _through_wire(s)
    assert body.is_sparse and body._nnz() == 0 and body.shape == (4, 5)
    assert not body.to_dense().numpy().any()


def _crafted(ref: tuple[Any, ...], arrays: list[np.ndarray]) -> Any:
    """Decode a payload whose pickle is ``ref`` as a persistent id over ``arrays``."""

    class _P(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return ref if obj is marker else None

    import io

    marker = object()
    buf = io.BytesIO()
    _P(buf, protocol=PROTOCOL).dump(marker)
    ctx = EncodeContext(peer="w1")
    from gradwire._wire import tensors

    for arr in arrays:
        packed = tensors.pack(arr, tensors.KIND_NDARRAY)
        assert packed is not None
        ctx.tensors.append(packed)
    payload = pb.Payload(pickle_nbytes=len(buf.getvalue()))
    payload.tensors.extend(m for m, _ in ctx.tensors)
    first = pb.FrameHeader(call=pb.CallHeader(), payload=payload, last=True)
    buffers = [buf.getvalue(), *(b for _, b in ctx.tensors)]
    asm = Assembler(1 << 30)
    for f in split(first, buffers, 4096):
        asm.feed(decode_frame(encode_frame(f)))
    assert asm.message is not None
    return calls.decode_body(asm.message, {"policy": POLICY, "peer": "w0", "worker": "w1"})[0]


GOOD = [np.array([[0, 2]], np.int64), np.ones((2, 3), np.float32)]


def test_the_crafting_helper_decodes_a_well_formed_reference() -> None:
    got = _crafted(("S", 0, 1, (4, 3), False, False), GOOD)
    assert got.is_sparse and got.to_dense().numpy()[2].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("ref", "arrays", "message"),
    [
        (("S", 0, 5, (4, 3), False, False), GOOD, "malformed sparse tensor reference"),
        (("S", 0, 0, (4, 3), False, False), GOOD, "malformed sparse tensor reference"),
        (("S", 0, 1, (4, -3), False, False), GOOD, "malformed sparse tensor reference"),
        (("S", 0, 1, [4, 3], False, False), GOOD, "malformed sparse tensor reference"),
        (("S", 0, 1, (4, 3), 1, False), GOOD, "malformed sparse tensor reference"),
        (("S", 0, 1, (2, 3), False, False), GOOD, "out of range: for dim 0, size is 2"),
        (("S", 0, 1, (4, 4), False, False), GOOD, "dense shape"),
        (("S", 0, 1, (4, 3), True, False), [GOOD[0][:, ::-1].copy(), GOOD[1]], "not sorted"),
        (
            ("S", 0, 1, (4, 3), False, False),
            [np.array([[0, -1]], np.int64), GOOD[1]],
            "found index -1",
        ),
        (
            ("S", 0, 1, (4, 3), False, False),
            [np.array([[0.5, 1]]), GOOD[1]],
            "indices must be integers",
        ),
    ],
)
def test_a_crafted_sparse_reference_is_refused_with_what_is_wrong(
    ref: tuple[Any, ...], arrays: list[np.ndarray], message: str
) -> None:
    with pytest.raises(SerializationError, match=message):
        _crafted(ref, arrays)
