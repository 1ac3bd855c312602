"""``set_num_threads`` / ``get_num_threads``: PyTorch's intra-op thread knob, for NumPy's BLAS.

gradwire's ops run on NumPy, whose matrix products run on its BLAS library (OpenBLAS in the
PyPI wheels) with one thread per core by default. On a machine shared with other workers
(two workers on two cores, say) those threads compete with the other process; PyTorch
programs call ``torch.set_num_threads(1)`` for that, and the same call works here. The BLAS
thread pools are found and limited with threadpoolctl (the library made for this), so the
limit applies to whichever BLAS NumPy was built with.
"""

from __future__ import annotations

import operator

__all__ = ["set_num_threads", "get_num_threads"]


def set_num_threads(num: int) -> None:
    """Use at most ``num`` threads in the BLAS library behind matrix products (as
    ``torch.set_num_threads``).

    Raises:
        RuntimeError: ``num`` is not a positive int (PyTorch raises RuntimeError too).
    """
    try:
        if isinstance(num, bool):
            raise TypeError
        num = operator.index(num)  # an int, or an integer type such as numpy.int64
    except TypeError:
        raise RuntimeError(
            f"set_num_threads expects an int, but got {type(num).__name__}: pass the "
            "number of threads as an int, e.g. set_num_threads(1)"
        ) from None
    if num <= 0:
        raise RuntimeError(f"set_num_threads expects a positive integer, got {num}")
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=num, user_api="blas")


def get_num_threads() -> int:
    """The number of threads the BLAS library behind matrix products uses (as
    ``torch.get_num_threads``); 1 when NumPy has none that threadpoolctl knows."""
    from threadpoolctl import threadpool_info

    counts = [int(pool["num_threads"]) for pool in threadpool_info() if pool["user_api"] == "blas"]
    return max(counts) if counts else 1
