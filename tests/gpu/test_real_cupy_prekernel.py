"""Real CuPy, before any kernel: the reference the stand-in (tests/fake_cupy) is calibrated on.

``cupy-cuda12x`` installs and imports on a machine with no GPU and no driver. Its arrays can be
built over *host* memory (``cupy.cuda.UnownedMemory`` with a device id), and everything CuPy
does before it calls the driver then runs for real: views, reshapes, strides, ``.device``, the
dtype checks of ``ufunc.at``, argument errors. Each probe below runs on real CuPy and on the
stand-in over the same host memory: where real CuPy answers, the stand-in must answer the
same; where real CuPy refuses before the driver, the stand-in must refuse with the same type.
A probe that reaches the driver on real CuPy (a kernel) is out of reach here (docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

real_cupy = pytest.importorskip("cupy", reason="real CuPy (cupy-cuda12x) is not installed")
if getattr(real_cupy, "IS_FAKE", False):  # pragma: no cover - the stand-in left installed
    pytest.skip("cupy is the test stand-in here, not real CuPy", allow_module_level=True)


def _driver_error(exc: BaseException) -> bool:
    return type(exc).__name__ == "CUDARuntimeError"


def over_host(cp: Any, host: np.ndarray, device: int) -> Any:
    """A ``cp.ndarray`` over ``host``'s memory, on device ``device`` (no allocation)."""
    mem = cp.cuda.UnownedMemory(host.ctypes.data, host.nbytes, host, device_id=device)
    return cp.ndarray(host.shape, host.dtype, cp.cuda.MemoryPointer(mem, 0), strides=host.strides)


@pytest.fixture
def modules(fake_cupy_module: Any) -> dict[str, Any]:
    return {"real": real_cupy, "stand-in": fake_cupy_module}


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "value", fn()
    except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
        if _driver_error(exc):
            return "driver", None
        return "raised", type(exc)


def _layout(a: Any, base: Any) -> tuple[Any, ...]:
    return (a.shape, a.strides, str(a.dtype), a.device.id, a.data.ptr - base.data.ptr)


#: name -> probe(cp, a) where ``a`` is a (2, 3) float64 array on device 1 over host memory
PROBES: dict[str, Callable[[Any, Any], Any]] = {
    "T": lambda cp, a: _layout(a.T, a),
    "slice": lambda cp, a: _layout(a[:, 1:], a),
    "row": lambda cp, a: _layout(a[1], a),
    "reshape (a view)": lambda cp, a: _layout(a.reshape(3, 2), a),
    "swapaxes": lambda cp, a: _layout(a.swapaxes(0, 1), a),
    "squeeze": lambda cp, a: _layout(a[None].squeeze(0), a),
    "newaxis": lambda cp, a: _layout(a[:, None, :], a),
    "len": lambda cp, a: len(a),
    "reshape to a wrong size": lambda cp, a: a.reshape(5),
    "index out of bounds": lambda cp, a: a[5],
    "astype to an unknown dtype": lambda cp, a: a.astype("no-such-dtype"),
    "implicit conversion to NumPy": lambda cp, a: np.asarray(a),
    "truth of a 2-D array": lambda cp, a: bool(a),
    "indices(sparse=True)": lambda cp, a: cp.indices((2, 3), sparse=True),
    "multiply.at": lambda cp, a: cp.multiply.at(a, over_host(cp, np.array([0]), 1), 1.0),
}


@pytest.mark.parametrize("name", sorted(PROBES))
def test_the_stand_in_answers_as_real_cupy_before_any_kernel(name: str, modules: Any) -> None:
    host = np.arange(6.0).reshape(2, 3)
    outcomes = {}
    for which, cp in modules.items():
        with cp.cuda.Device(1) if which == "stand-in" else contextlib.nullcontext():
            a = over_host(cp, host, 1)
            outcomes[which] = _outcome(lambda cp=cp, a=a: PROBES[name](cp, a))
    real, stand_in = outcomes["real"], outcomes["stand-in"]
    assert real[0] != "driver", f"{name}: reaches the driver on real CuPy; not a pre-kernel probe"
    if real[0] == "raised":
        assert stand_in[0] == "raised", f"{name}: real CuPy raises {real[1]}, the stand-in did not"
        assert issubclass(stand_in[1], real[1]) or issubclass(real[1], stand_in[1]), (
            name,
            real,
            stand_in,
        )
    else:
        assert stand_in == real, name


UFUNCS = ("add", "subtract", "maximum", "minimum", "bitwise_or", "multiply")
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint32", "uint64", "float16")
DTYPES += ("float32", "float64", "complex64", "complex128")


def _at_outcome(cp: Any, ufunc: str, dtype: str) -> str:
    target = over_host(cp, np.zeros(4, dtype), 0)
    index = over_host(cp, np.array([0, 1]), 0)
    values = over_host(cp, np.ones(2, dtype), 0)
    kind, what = _outcome(lambda: getattr(cp, ufunc).at(target, index, values))
    if kind == "raised":
        return what.__name__
    return "accepted"  # reached the kernel (the driver here), or ran (the stand-in)


def test_ufunc_at_dtype_limits_match_real_cupy(modules: Any) -> None:
    """CuPy's ``ufunc.at`` takes only some dtypes (TypeError) and some ufuncs
    (NotImplementedError), before any kernel; the stand-in and gradwire's own table
    (``_backend._CUPY_AT_DTYPES``, what ``ufunc_at`` sends through a wider dtype) agree."""
    from gradwire import _backend

    real_accepts: dict[str, set[str]] = {}
    for ufunc in UFUNCS:
        for dtype in DTYPES:
            real = _at_outcome(real_cupy, ufunc, dtype)
            stand_in = _at_outcome(modules["stand-in"], ufunc, dtype)
            assert stand_in == real, (ufunc, dtype, real, stand_in)
            if real == "accepted":
                real_accepts.setdefault(ufunc, set()).add(dtype)
    assert "multiply" not in real_accepts  # NotImplementedError for every dtype
    for ufunc, dtypes in _backend._CUPY_AT_DTYPES.items():
        assert dtypes & set(DTYPES) == real_accepts[ufunc], ufunc


def test_the_driver_error_is_named_when_cupy_has_no_usable_driver(monkeypatch: Any) -> None:
    """With real CuPy and no driver (this machine), a CUDA request names the driver's error
    and what to do, and the CPU keeps working."""
    import gradwire as gw
    from gradwire import _backend

    try:
        real_cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        if not _driver_error(exc):
            raise
        driver_error = str(exc)
    else:  # pragma: no cover - a machine with a GPU
        pytest.skip("a CUDA device is usable here: nothing to refuse")
    monkeypatch.setitem(importlib.sys.modules, "cupy", real_cupy)  # type: ignore[attr-defined]
    monkeypatch.setattr(_backend, "_cupy_checked", False)
    assert not gw.is_cuda_available()
    with pytest.raises(RuntimeError) as info:
        gw.ones(2, device="cuda:0")
    message = str(info.value)
    assert driver_error in message and f"CuPy {real_cupy.__version__} is installed" in message
    assert "gradwire[cuda]" not in message  # it is installed: the driver is what is missing
    if driver_error.startswith("cudaErrorInsufficientDriver"):
        assert "install or update the driver" in message
    assert _backend.cuda_unavailable_reason() in message
    assert gw.ones(2).tolist() == [1.0, 1.0]


def test_a_missing_cupy_says_to_install_the_cuda_extra(monkeypatch: Any) -> None:
    import gradwire as gw
    from gradwire import _backend

    monkeypatch.setitem(importlib.sys.modules, "cupy", None)  # type: ignore[attr-defined]
    monkeypatch.setattr(_backend, "_cupy_checked", False)
    with pytest.raises(RuntimeError, match=r"CuPy is not installed .*install gradwire\[cuda\]"):
        gw.zeros(1, device="cuda:1")


def test_gradwire_reads_a_real_cupy_arrays_device_and_layout(monkeypatch: Any) -> None:
    """Where gradwire only reads an array (no kernel): the device of a real CuPy array on
    device 1, and a Tensor's metadata over it, as they would be on a GPU."""
    import gradwire as gw
    from gradwire import _backend

    monkeypatch.setattr(_backend, "_cupy", real_cupy)  # as if getDeviceCount() had answered
    monkeypatch.setattr(_backend, "_cupy_checked", True)
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    arr = over_host(real_cupy, host, 1)
    assert _backend.device_of(arr) == gw.device("cuda:1")
    assert _backend.array_module(arr) is real_cupy
    t = gw.Tensor._wrap(arr)
    assert (t.device, t.is_cuda, t.dtype, t.shape) == (
        gw.device("cuda:1"),
        True,
        gw.float32,
        (3, 4),
    )
    assert t.stride() == (4, 1) and t.numel() == 12 and t.element_size() == 4
    view = gw.Tensor._wrap(arr.T)
    assert view.device == gw.device("cuda:1") and view.stride() == (1, 4)
