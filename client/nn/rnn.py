"""Recurrent layers: ``RNN``, ``LSTM``, ``GRU`` and their one-step ``*Cell`` forms.

Parameter names, shapes, gate order and initialisation follow PyTorch, so a ``state_dict``
taken from torch gives the same outputs here. Each layer and direction computes the input
projection of all timesteps with one matmul, then runs a fused recurrent op
(``gradwire._ops.rnn_cell``) that does back-propagation through time in array code.
"""

from __future__ import annotations

import math
from typing import Any

from .._creation import cat, empty, stack, zeros
from .._ops.dropout import dropout
from .._ops.rnn_cell import GRUSeq, LSTMSeq, RNNSeq
from .._tensor import Tensor
from ..errors import ArgumentError
from . import functional as F
from . import init
from .modules import Module
from .parameter import Parameter

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _check_sizes(input_size: int, hidden_size: int) -> None:
    for name, value in (("input_size", input_size), ("hidden_size", hidden_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_dtype(x: Tensor, weight: Tensor, what: str) -> None:
    if x.dtype != weight.dtype:
        raise ArgumentError(
            f"{what} must have the type {weight.dtype} of the module's parameters, got "
            f"{x.dtype}; cast it with .to({weight.dtype}) or the module with .to({x.dtype})"
        )


def _run(
    mode: str, xg: Tensor, h: Tensor, c: Tensor | None, w_hh: Tensor, b_hh: Any, **kw: Any
) -> Any:
    """One layer and direction of ``mode`` over the (L, N, G*H) input projection ``xg``."""
    bias = () if b_hh is None else (b_hh,)
    if mode == "LSTM":
        return LSTMSeq.apply(xg, h, c, w_hh, *bias, **kw)
    if mode == "GRU":
        return GRUSeq.apply(xg, h, w_hh, *bias, **kw)
    return RNNSeq.apply(xg, h, w_hh, *bias, nonlinearity=mode[4:].lower(), **kw)


def _project(x: Tensor, w_ih: Tensor, b_ih: Tensor | None) -> Tensor:
    """x @ w_ih^T + b_ih for every timestep with one 2-D matmul: (L, N, in) -> (L, N, G*H)."""
    steps, n = x.shape[0], x.shape[1]
    return F.linear(x.reshape(steps * n, x.shape[2]), w_ih, b_ih).reshape(steps, n, -1)


class RNNBase(Module):
    """The shared body of RNN, LSTM and GRU (PyTorch's constructor arguments).

    Raises:
        ValueError: for non-positive sizes, ``dropout`` outside [0, 1] or an unknown mode.
        NotImplementedError: for ``proj_size`` > 0 (LSTM projections are not implemented).
    """

    def __init__(
        self,
        mode: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if mode not in _GATES:
            raise ValueError(f"Unrecognized RNN mode: {mode!r}; use one of {sorted(_GATES)}")
        _check_sizes(input_size, hidden_size)
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"num_layers must be a positive integer, got {num_layers!r}")
        if isinstance(dropout, bool) or not 0 <= dropout <= 1:
            raise ValueError(
                f"dropout should be a number in range [0, 1] representing the probability of an element being zeroed, got {dropout!r}"
            )
        if proj_size:
            raise NotImplementedError("LSTM proj_size > 0 is not implemented in gradwire")
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bias, self.batch_first = num_layers, bias, batch_first
        self.dropout, self.bidirectional, self.proj_size = float(dropout), bidirectional, 0
        gate_size = _GATES[mode] * hidden_size
        directions = 2 if bidirectional else 1
        for layer in range(num_layers):
            layer_in = input_size if layer == 0 else hidden_size * directions
            for suffix in ("", "_reverse")[:directions]:
                shapes: list[tuple[str, tuple[int, ...]]] = [
                    ("weight_ih", (gate_size, layer_in)),
                    ("weight_hh", (gate_size, hidden_size)),
                ]
                if bias:
                    shapes += [("bias_ih", (gate_size,)), ("bias_hh", (gate_size,))]
                for name, shape in shapes:
                    p = Parameter(empty(*shape, dtype=dtype, device=device))
                    setattr(self, f"{name}_l{layer}{suffix}", p)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every parameter from U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), as PyTorch."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def flatten_parameters(self) -> None:
        """No-op (PyTorch uses it to compact cuDNN weights)."""

    def _weights(self, layer: int, suffix: str) -> tuple[Any, ...]:
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        return tuple(getattr(self, f"{n}_l{layer}{suffix}", None) for n in names)

    def _check_state(self, h: Tensor, expected: tuple[int, ...], which: str) -> None:
        if tuple(h.shape) != expected:
            raise ArgumentError(f"Expected hidden{which} size {expected}, got {list(h.shape)}")

    def forward(self, input: Tensor, hx: Any = None) -> tuple[Tensor, Any]:
        """Run the layers over a sequence.

        Args:
            input: (L, N, input_size), (N, L, input_size) with ``batch_first``, or unbatched
                (L, input_size).
            hx: initial state, zeros when None: (num_layers * num_directions, N, hidden_size)
                (without N for unbatched input); for LSTM a tuple ``(h_0, c_0)``.

        Returns:
            ``(output, h_n)``, for LSTM ``(output, (h_n, c_n))``; ``output`` holds the last
            layer's hidden state at every step, both directions concatenated.

        Raises:
            ValueError: input not 2-D or 3-D.
            ArgumentError: the input's last dimension is not ``input_size``, a state of the
                wrong shape, or a dtype other than the parameters' (also RuntimeError).
        """
        name = "LSTM" if self.mode == "LSTM" else self.mode[:3]
        if input.ndim not in (2, 3):
            raise ValueError(
                f"{name}: Expected input to be 2D or 3D, got {input.ndim}D input instead"
            )
        if input.shape[-1] != self.input_size:
            raise ArgumentError(
                f"input.size(-1) must be equal to input_size. Expected {self.input_size}, got {input.shape[-1]}"
            )
        _check_dtype(input, self.weight_ih_l0, "input")
        batched = input.ndim == 3
        x = input if batched else input.unsqueeze(1)
        if batched and self.batch_first:
            x = x.transpose(0, 1)
        n = x.shape[1]
        directions = 2 if self.bidirectional else 1
        state_shape = (self.num_layers * directions, n, self.hidden_size)
        is_lstm = self.mode == "LSTM"
        if hx is None:
            h0 = zeros(*state_shape, dtype=x.dtype, device=x.device)
            c0 = h0 if is_lstm else None
        else:
            if is_lstm:
                if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                    raise TypeError("LSTM expects hx as a tuple (h_0, c_0)")
                h0, c0 = hx
            else:
                h0, c0 = hx, None
            states = [h0] + ([c0] if is_lstm else [])
            for i, s in enumerate(states):
                want = state_shape if batched else (state_shape[0], self.hidden_size)
                self._check_state(s, want, f"[{i}]" if is_lstm else "")
                _check_dtype(s, self.weight_ih_l0, "hx")
            if not batched:
                h0 = h0.unsqueeze(1)
                c0 = c0.unsqueeze(1) if c0 is not None else None
        h_n: list[Tensor] = []
        c_n: list[Tensor] = []
        for layer in range(self.num_layers):
            if layer and self.dropout and self.training:
                x = dropout(x, self.dropout, True)
            outs = []
            for d, suffix in enumerate(("", "_reverse")[:directions]):
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, suffix)
                k = layer * directions + d
                res = _run(
                    self.mode,
                    _project(x, w_ih, b_ih),
                    h0[k],
                    c0[k] if c0 is not None else None,
                    w_hh,
                    b_hh,
                    reverse=d == 1,
                )
                outs.append(res[0])
                h_n.append(res[1])
                if is_lstm:
                    c_n.append(res[2])
            x = outs[0] if directions == 1 else cat(outs, 2)
        output = x
        hn = stack(h_n)
        cn = stack(c_n) if is_lstm else None
        if not batched:
            output = output.squeeze(1)
            hn = hn.squeeze(1)
            cn = cn.squeeze(1) if cn is not None else None
        elif self.batch_first:
            output = output.transpose(0, 1)
        return output, ((hn, cn) if is_lstm else hn)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s


class RNN(RNNBase):
    """Elman RNN: h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh) (or relu).

    Example:
        >>> rnn = gradwire.nn.RNN(10, 20, num_layers=2)
        >>> out, h_n = rnn(gradwire.randn(5, 3, 10))
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        *args: Any,
        **kwargs: Any,
    ) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(
                f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'."
            )
        mode = "RNN_" + nonlinearity.upper()
        super().__init__(mode, input_size, hidden_size, num_layers, *args, **kwargs)
        self.nonlinearity = nonlinearity

    def extra_repr(self) -> str:
        s = super().extra_repr()
        return s + (", nonlinearity='relu'" if self.nonlinearity == "relu" else "")


class LSTM(RNNBase):
    """Long short-term memory; gates i, f, g, o stacked in that order in ``weight_ih_l{k}``.

    Example:
        >>> lstm = gradwire.nn.LSTM(10, 20, num_layers=2, batch_first=True)
        >>> out, (h_n, c_n) = lstm(gradwire.randn(3, 5, 10))
    """

    def __init__(
        self, input_size: int, hidden_size: int, num_layers: int = 1, *args: Any, **kwargs: Any
    ) -> None:
        super().__init__("LSTM", input_size, hidden_size, num_layers, *args, **kwargs)


class GRU(RNNBase):
    """Gated recurrent unit; gates r, z, n stacked in that order in ``weight_ih_l{k}``.

    Example:
        >>> gru = gradwire.nn.GRU(10, 20)
        >>> out, h_n = gru(gradwire.randn(5, 3, 10))
    """

    def __init__(
        self, input_size: int, hidden_size: int, num_layers: int = 1, *args: Any, **kwargs: Any
    ) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, *args, **kwargs)


class RNNCellBase(Module):
    """One step of a recurrent layer: parameters ``weight_ih``, ``weight_hh``, ``bias_ih``,
    ``bias_hh`` shaped as in PyTorch."""

    def __init__(
        self,
        mode: str,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        _check_sizes(input_size, hidden_size)
        self.mode, self.input_size, self.hidden_size, self.bias = (
            mode,
            input_size,
            hidden_size,
            bias,
        )
        g = _GATES[mode] * hidden_size
        self.weight_ih = Parameter(empty(g, input_size, dtype=dtype, device=device))
        self.weight_hh = Parameter(empty(g, hidden_size, dtype=dtype, device=device))
        if bias:
            self.bias_ih = Parameter(empty(g, dtype=dtype, device=device))
            self.bias_hh = Parameter(empty(g, dtype=dtype, device=device))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every parameter from U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), as PyTorch."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def _step(self, input: Tensor, hx: Any) -> tuple[Any, bool]:
        if input.ndim not in (1, 2):
            raise ValueError(
                f"{type(self).__name__}: Expected input to be 1D or 2D, got {input.ndim}D instead"
            )
        if input.shape[-1] != self.input_size:
            raise ArgumentError(
                f"input has inconsistent input_size: got {input.shape[-1]} expected {self.input_size}"
            )
        _check_dtype(input, self.weight_ih, "input")
        batched = input.ndim == 2
        x = input if batched else input.unsqueeze(0)
        want = (x.shape[0], self.hidden_size)
        states: list[Tensor] = []
        count = 2 if self.mode == "LSTM" else 1
        if hx is None:
            states = [zeros(*want, dtype=x.dtype, device=x.device)] * count
        else:
            given = list(hx) if count == 2 else [hx]
            if len(given) != count:
                raise TypeError("LSTMCell expects hx as a tuple (h_0, c_0)")
            for s in given:
                if tuple(s.shape) != (want if batched else want[1:]):
                    raise ArgumentError(
                        f"{type(self).__name__}: Expected hidden size {want if batched else want[1:]}, got {list(s.shape)}"
                    )
                _check_dtype(s, self.weight_ih, "hx")
                states.append(s if batched else s.unsqueeze(0))
        xg = F.linear(x, self.weight_ih, self.bias_ih).unsqueeze(0)
        c = states[1] if count == 2 else None
        res = _run(self.mode, xg, states[0], c, self.weight_hh, self.bias_hh)
        return res[1:], batched

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        return s if self.bias else s + ", bias=False"


class RNNCell(RNNCellBase):
    """h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh) (or relu); returns h'."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        nonlinearity: str = "tanh",
        **kwargs: Any,
    ) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity: {nonlinearity}. Select from 'tanh' or 'relu'.")
        super().__init__("RNN_" + nonlinearity.upper(), input_size, hidden_size, bias, **kwargs)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        """One step: input (N, input_size) or (input_size,), hx like the output (zeros if None)."""
        (h,), batched = self._step(input, hx)
        return h if batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
    """One LSTM step; returns ``(h', c')``.

    Example:
        >>> cell = gradwire.nn.LSTMCell(10, 20)
        >>> h, c = cell(gradwire.randn(3, 10))
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, **kwargs: Any) -> None:
        super().__init__("LSTM", input_size, hidden_size, bias, **kwargs)

    def forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        """One step: input (N, input_size) or (input_size,), hx = (h, c) (zeros if None)."""
        (h, c), batched = self._step(input, hx)
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    """One GRU step; returns h'."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, **kwargs: Any) -> None:
        super().__init__("GRU", input_size, hidden_size, bias, **kwargs)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        """One step: input (N, input_size) or (input_size,), hx like the output (zeros if None)."""
        (h,), batched = self._step(input, hx)
        return h if batched else h.squeeze(0)
