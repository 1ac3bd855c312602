"""Fused recurrent layers: one autograd op runs a whole sequence through an LSTM, GRU or
Elman RNN cell, and its backward runs back-propagation through time in array code.

Composing a cell out of small tensor ops records ~15 graph nodes per timestep; for the sizes
RNN users train (hidden 256, sequence 35) that bookkeeping, not the arithmetic, dominates. Here
the caller computes the input projection of all timesteps with one matmul (``xg``, shape
(L, N, G*H)), and the op only does the recurrent part: per step one (N, H) @ (H, G*H) matmul
and the gate arithmetic. The same ops with L = 1 serve the ``*Cell`` modules.

Inputs (tensors, in this order): ``xg`` (L, N, G*H), ``h0`` (N, H), for LSTM ``c0`` (N, H),
``w_hh`` (G*H, H), and ``b_hh`` (G*H,) when the layer has biases. Outputs: ``out`` (L, N, H),
``h_n`` (N, H), and for LSTM ``c_n``. ``reverse=True`` walks the sequence from its end (the
backward direction of a bidirectional layer); ``out`` stays in time order.

Gate order is PyTorch's: i, f, g, o for LSTM and r, z, n for GRU.
"""

from __future__ import annotations

from typing import Any

from .._backend import array_module
from .._tensor import Tensor
from ..autograd.graph import grad_recording
from ._base import Op

__all__ = ["LSTMSeq", "GRUSeq", "RNNSeq"]


def _sigmoid(xp: Any, x: Any) -> Any:
    # The tanh form never overflows (1 / (1 + exp(-x)) warns for large negative x).
    return 0.5 + 0.5 * xp.tanh(0.5 * x)


def _steps(n: int, reverse: bool) -> range:
    return range(n - 1, -1, -1) if reverse else range(n)


def _no_double_backward(op: str) -> None:
    if grad_recording():
        raise NotImplementedError(
            f"{op}: backward with create_graph=True (double backward) through a fused recurrent "
            "layer is not supported; compute higher-order gradients with a cell written from "
            "tensor ops"
        )


def _recurrent_grads(node: Op, d_hh: Any, h_prev: Any, first: int) -> list[Any]:
    """Gradients of ``w_hh`` (and ``b_hh``) from the per-step gradients of h @ w_hh^T + b_hh."""
    out: list[Any] = []
    g = d_hh.shape[-1]
    needs = node.needs_input_grad
    if needs[first]:
        out.append(Tensor._wrap(d_hh.reshape(-1, g).T @ h_prev.reshape(-1, h_prev.shape[-1])))
    else:
        out.append(None)
    if len(needs) > first + 1:
        out.append(Tensor._wrap(d_hh.sum(axis=(0, 1))) if needs[first + 1] else None)
    return out


def _keep(node: Op, *arrays: Any, **values: Any) -> None:
    """Save the forward's arrays (as tensors, so a backward pass without retain_graph frees
    them) and plain values for backward."""
    if not node._recording:
        return
    for i, arr in enumerate(arrays):
        # Input tensors (w_hh) are saved as themselves: an in-place change is then caught.
        node.save(f"a{i}", arr if isinstance(arr, Tensor) else Tensor._wrap(arr))
    for name, value in values.items():
        node.save(name, value)


def _kept(node: Op, count: int) -> list[Any]:
    return [node.saved(f"a{i}")._data for i in range(count)]


def _zeros_or(xp: Any, g: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    return xp.zeros(shape, dtype=dtype) if g is None else g._data.astype(dtype, copy=True)


class LSTMSeq(Op):
    """LSTM over a sequence: c' = f*c + i*g, h' = o*tanh(c')."""

    def forward(self, *ts: Any, reverse: bool = False) -> Any:
        xg, h, c, w_hh = (t._data for t in ts[:4])
        xp = array_module(xg)
        if len(ts) > 4:
            xg = xg + ts[4]._data
        steps, n, g4 = xg.shape
        hid = g4 // 4
        w_t = xp.ascontiguousarray(w_hh.T)  # a transposed view makes each step ~1.7x slower
        act = xp.empty_like(xg)
        out = xp.empty((steps, n, hid), dtype=xg.dtype)
        h_prev = xp.empty_like(out)
        c_prev = xp.empty_like(out)
        tanh_c = xp.empty_like(out)
        # One tanh per step for all four gates: sigmoid(x) = 0.5 + 0.5 * tanh(x / 2).
        half = xp.full(g4, 0.5, dtype=xg.dtype)
        half[2 * hid : 3 * hid] = 1
        sig = [slice(0, 2 * hid), slice(3 * hid, g4)]
        for t in _steps(steps, reverse):
            h_prev[t], c_prev[t] = h, c
            gates = h @ w_t
            gates += xg[t]
            gates *= half
            a = act[t]
            xp.tanh(gates, out=a)
            for s in sig:
                a[:, s] *= 0.5
                a[:, s] += 0.5
            c = a[:, hid : 2 * hid] * c + a[:, :hid] * a[:, 2 * hid : 3 * hid]
            xp.tanh(c, out=tanh_c[t])
            h = xp.multiply(a[:, 3 * hid :], tanh_c[t], out=out[t])
        h = h.copy()  # h_n must not share memory with out
        _keep(self, act, h_prev, c_prev, tanh_c, ts[3], reverse=reverse)
        return out, h, c

    def backward(self, g_out: Any, g_h: Any, g_c: Any) -> Any:
        _no_double_backward("LSTM")
        act, h_prev, c_prev, tanh_c, w_hh = _kept(self, 5)
        reverse = self.saved("reverse")
        xp = array_module(act)
        steps, n, g4 = act.shape
        hid = g4 // 4
        dt = act.dtype
        # d(activation)/d(pre-activation), for all steps at once.
        dact = act * (1 - act)
        dact[..., 2 * hid : 3 * hid] = 1 - act[..., 2 * hid : 3 * hid] ** 2
        dh = _zeros_or(xp, g_h, (n, hid), dt)
        dc = _zeros_or(xp, g_c, (n, hid), dt)
        go = None if g_out is None else g_out._data
        d_gates = xp.empty_like(act)
        for t in _steps(steps, not reverse):
            if go is not None:
                dh += go[t]
            a, tc = act[t], tanh_c[t]
            dc += dh * a[:, 3 * hid :] * (1 - tc * tc)
            d = d_gates[t]
            d[:, :hid] = dc * a[:, 2 * hid : 3 * hid]
            d[:, hid : 2 * hid] = dc * c_prev[t]
            d[:, 2 * hid : 3 * hid] = dc * a[:, :hid]
            d[:, 3 * hid :] = dh * tc
            d *= dact[t]
            dc *= a[:, hid : 2 * hid]
            dh = d @ w_hh
        needs = self.needs_input_grad
        grads = [
            Tensor._wrap(d_gates) if needs[0] else None,
            Tensor._wrap(dh) if needs[1] else None,
            Tensor._wrap(dc) if needs[2] else None,
        ]
        return tuple(grads + _recurrent_grads(self, d_gates, h_prev, 3))

    def name(self) -> str:
        return "LSTMBackward0"


class GRUSeq(Op):
    """GRU over a sequence: n = tanh(x_n + r*(W_hn h + b_hn)), h' = (1-z)*n + z*h."""

    def forward(self, *ts: Any, reverse: bool = False) -> Any:
        xg, h, w_hh = (t._data for t in ts[:3])
        xp = array_module(xg)
        b_hh = ts[3]._data if len(ts) > 3 else None
        steps, n, g3 = xg.shape
        hid = g3 // 3
        w_t = xp.ascontiguousarray(w_hh.T)  # a transposed view makes each step ~1.7x slower
        act = xp.empty_like(xg)
        hh_n = xp.empty((steps, n, hid), dtype=xg.dtype)
        out = xp.empty_like(hh_n)
        h_prev = xp.empty_like(hh_n)
        for t in _steps(steps, reverse):
            h_prev[t] = h
            hh = h @ w_t
            if b_hh is not None:
                hh += b_hh
            a = act[t]
            a[:, : 2 * hid] = _sigmoid(xp, xg[t, :, : 2 * hid] + hh[:, : 2 * hid])
            hh_n[t] = hh[:, 2 * hid :]
            a[:, 2 * hid :] = xp.tanh(xg[t, :, 2 * hid :] + a[:, :hid] * hh_n[t])
            nn = a[:, 2 * hid :]
            h = nn + a[:, hid : 2 * hid] * (h - nn)
            out[t] = h
        _keep(self, act, hh_n, h_prev, ts[2], reverse=reverse)
        return out, h

    def backward(self, g_out: Any, g_h: Any) -> Any:
        _no_double_backward("GRU")
        act, hh_n, h_prev, w_hh = _kept(self, 4)
        reverse = self.saved("reverse")
        xp = array_module(act)
        steps, n, g3 = act.shape
        hid = g3 // 3
        dh = _zeros_or(xp, g_h, (n, hid), act.dtype)
        go = None if g_out is None else g_out._data
        d_x = xp.empty_like(act)
        d_hh = xp.empty_like(act)
        for t in _steps(steps, not reverse):
            if go is not None:
                dh += go[t]
            a = act[t]
            r, z, nn = a[:, :hid], a[:, hid : 2 * hid], a[:, 2 * hid :]
            dn = dh * (1 - z) * (1 - nn * nn)
            dx, dr = d_x[t], d_hh[t]
            dx[:, 2 * hid :] = dn
            dx[:, :hid] = dn * hh_n[t] * r * (1 - r)
            dx[:, hid : 2 * hid] = dh * (h_prev[t] - nn) * z * (1 - z)
            dr[:, : 2 * hid] = dx[:, : 2 * hid]
            dr[:, 2 * hid :] = dn * r
            dh = dh * z + dr @ w_hh
        needs = self.needs_input_grad
        grads = [Tensor._wrap(d_x) if needs[0] else None, Tensor._wrap(dh) if needs[1] else None]
        return tuple(grads + _recurrent_grads(self, d_hh, h_prev, 2))

    def name(self) -> str:
        return "GRUBackward0"


class RNNSeq(Op):
    """Elman RNN over a sequence: h' = tanh(x + W_hh h + b_hh) (or relu)."""

    def forward(self, *ts: Any, reverse: bool = False, nonlinearity: str = "tanh") -> Any:
        xg, h, w_hh = (t._data for t in ts[:3])
        xp = array_module(xg)
        if len(ts) > 3:
            xg = xg + ts[3]._data
        steps, n, hid = xg.shape
        w_t = xp.ascontiguousarray(w_hh.T)  # a transposed view makes each step ~1.7x slower
        out = xp.empty_like(xg)
        h_prev = xp.empty_like(xg)
        relu = nonlinearity == "relu"
        for t in _steps(steps, reverse):
            h_prev[t] = h
            pre = h @ w_t
            pre += xg[t]
            h = xp.maximum(pre, 0) if relu else xp.tanh(pre)
            out[t] = h
        _keep(self, out, h_prev, ts[2], reverse=reverse, relu=relu)
        return out, h

    def backward(self, g_out: Any, g_h: Any) -> Any:
        _no_double_backward("RNN")
        out, h_prev, w_hh = _kept(self, 3)
        reverse, relu = self.saved("reverse"), self.saved("relu")
        xp = array_module(out)
        steps, n, hid = out.shape
        dh = _zeros_or(xp, g_h, (n, hid), out.dtype)
        go = None if g_out is None else g_out._data
        dpre = (out > 0).astype(out.dtype) if relu else 1 - out * out
        for t in _steps(steps, not reverse):
            if go is not None:
                dh += go[t]
            dpre[t] *= dh
            dh = dpre[t] @ w_hh
        needs = self.needs_input_grad
        grads = [Tensor._wrap(dpre) if needs[0] else None, Tensor._wrap(dh) if needs[1] else None]
        return tuple(grads + _recurrent_grads(self, dpre, h_prev, 2))

    def name(self) -> str:
        return "RNNBackward0"
