"""Check analytic gradients against float64 central differences (complex inputs included).

Convention (the seed's): for a real loss L, the gradient of a complex input z = x + iy is
dL/dx + i dL/dy. A complex output o is checked through L = Re(sum(conj(v) * o)) with v = e_j
and v = i e_j, so both its real and imaginary parts are covered.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["gradcheck", "gradgradcheck", "GradcheckError"]


class GradcheckError(RuntimeError):
    """Raised by gradcheck when analytic and numerical gradients differ."""


def _outputs(fn: Callable[..., Any], inputs: Sequence[Any]) -> list[Any]:
    from .._tensor import Tensor

    out = fn(*inputs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o for o in outs if isinstance(o, Tensor)]


def _numerical(
    fn: Callable[..., Any], inputs: Sequence[Any], i: int, eps: float
) -> list[list[np.ndarray]]:
    """Central differences of every output w.r.t. input ``i``.

    Returns, per output k, one matrix per direction (real step; imaginary step for complex
    inputs) of shape (input numel, output numel), complex128.
    """
    data = inputs[i]._data
    flat = data.reshape(-1)
    if not np.shares_memory(flat, data):
        raise ValueError(f"gradcheck needs input {i} to be contiguous (call .contiguous() first)")
    steps = [1.0, 1j] if data.dtype.kind == "c" else [1.0]
    result: list[list[np.ndarray]] = []
    for step in steps:
        cols: list[list[np.ndarray]] = []
        for j in range(flat.size):
            orig = flat[j].copy()
            evals = []
            for sign in (1, -1):
                flat[j] = orig + sign * step * eps
                # Grad mode stays on: gradgradcheck's function itself calls autograd.grad.
                evals.append(
                    [o._to_host().astype(np.complex128).reshape(-1) for o in _outputs(fn, inputs)]
                )
            flat[j] = orig
            cols.append([(p - m) / (2 * eps) for p, m in zip(*evals)])
        for k in range(len(cols[0]) if cols else 0):
            if len(result) <= k:
                result.append([])
            result[k].append(np.stack([c[k] for c in cols]) if cols else np.zeros((0, 0)))
    return result


def gradcheck(
    func: Callable[..., Any],
    inputs: Any,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
) -> bool:
    """Compare the analytic gradient of ``func`` with central finite differences.

    Inputs that require grad should be float64 or complex128 for the check to be meaningful.

    Args:
        func: function of the inputs returning a Tensor or a tuple of Tensors.
        inputs: a Tensor or a tuple of inputs (non-tensors are passed through).
        eps: finite-difference step.
        atol, rtol: tolerances.
        raise_exception: raise GradcheckError on mismatch instead of returning False.

    Returns:
        True when every gradient matches.

    Raises:
        GradcheckError: on a mismatch, naming the input, the output and both values.

    Example:
        >>> x = gradwire.randn(3, dtype=gradwire.float64, requires_grad=True)
        >>> gradwire.autograd.gradcheck(lambda t: (t * t).sin(), (x,))
        True
    """
    from .._tensor import Tensor
    from . import grad as autograd_grad

    ins = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    diff = [i for i, x in enumerate(ins) if isinstance(x, Tensor) and x.requires_grad]
    if not diff:
        raise ValueError("gradcheck expects at least one input tensor to require gradient")
    for i in diff:
        if ins[i]._data.dtype not in (np.float64, np.complex128):
            import warnings

            warnings.warn(
                f"input {i} is {ins[i].dtype}, not float64/complex128: gradcheck may fail spuriously",
                stacklevel=2,
            )
    for i in diff:
        x = ins[i]
        numerical = _numerical(func, ins, i, eps)
        outs = _outputs(func, ins)
        for k, out in enumerate(outs):
            probes = [1.0, 1j] if out._data.dtype.kind == "c" else [1.0]
            for j in range(out.numel()):
                for v in probes:
                    # L = Re(conj(v) * o_j): its gradient w.r.t. x is dL/dRe(x) + i dL/dIm(x).
                    expect = (np.conj(v) * numerical[k][0][:, j]).real.astype(np.complex128)
                    if len(numerical[k]) > 1:
                        expect = expect + 1j * (np.conj(v) * numerical[k][1][:, j]).real
                    if out.requires_grad:
                        go = np.zeros(out.shape, dtype=out._data.dtype)
                        go.reshape(-1)[j] = v
                        (g,) = autograd_grad(
                            out, x, Tensor._wrap(go), retain_graph=True, allow_unused=True
                        )
                        got = (
                            np.zeros(x.numel(), np.complex128)
                            if g is None
                            else g._to_host().astype(np.complex128).reshape(-1)
                        )
                    else:
                        got = np.zeros(x.numel(), np.complex128)
                    if not np.allclose(got, expect, atol=atol, rtol=rtol):
                        part = "" if v == 1.0 else " (imaginary part)"
                        msg = (
                            f"Jacobian mismatch for output {k}{part}, element {j}, with respect to input {i},\n"
                            f"numerical: {expect}\nanalytical: {got}\n"
                        )
                        if raise_exception:
                            raise GradcheckError(msg)
                        return False
    return True


def gradgradcheck(
    func: Callable[..., Any],
    inputs: Any,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
) -> bool:
    """gradcheck of the first derivative (built with create_graph) w.r.t. the inputs."""
    from .._tensor import Tensor
    from . import grad as autograd_grad

    ins = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    diff = [x for x in ins if isinstance(x, Tensor) and x.requires_grad]

    def first(*args: Any) -> Any:
        outs = _outputs(func, args)
        d = [a for a in args if isinstance(a, Tensor) and a.requires_grad]
        total = None
        for o in outs:
            s = (o * o.conj()).real.sum() if o._data.dtype.kind == "c" else o.sum()
            total = s if total is None else total + s
        return autograd_grad(total, d, create_graph=True, allow_unused=True, materialize_grads=True)

    if not diff:
        raise ValueError("gradgradcheck expects at least one input tensor to require gradient")
    return gradcheck(first, ins, eps=eps, atol=atol, rtol=rtol)
