"""One rank of one PyTorch RPC test: ``python -m torchsuite.worker MODULE CLASS TEST RANK``.

Started by ``torchsuite.runner`` with the generated test files on ``sys.path`` and
``TORCHSUITE_IMPL``, ``TORCHSUITE_PORT`` and ``TORCHSUITE_SCRATCH`` set. Builds the test class
as PyTorch's ``generate_tests`` does (the suite class mixed with the process test case), runs
the one method as this rank and exits 0 (passed), ``SKIP_EXIT`` (skipped) or ``ERROR_EXIT``
(raised; the traceback is on stderr), as PyTorch's ``MultiProcessTestCase`` processes do.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import traceback
import unittest

__all__ = ["main", "ERROR_EXIT", "SKIP_EXIT"]

#: PyTorch's MultiProcessTestCase.TEST_ERROR_EXIT_CODE.
ERROR_EXIT = 10
SKIP_EXIT = 77


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler writing to whatever ``sys.stderr`` is when a record is emitted."""

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def main(argv: list[str]) -> int:
    module_name, class_name, test_name, rank = argv[0], argv[1], argv[2], int(argv[3])
    # Log records go to the sys.stderr of the moment they are written, as PyTorch's prints
    # do: its tests capture them by replacing sys.stderr (captured_output).
    logging.basicConfig(
        level=os.environ.get("GRADWIRE_TEST_LOG", "WARNING"), handlers=[_CurrentStderr()]
    )
    from torchsuite.shim.common_distributed import MultiProcessTestCase

    module = importlib.import_module(module_name)
    # As PyTorch's generate_tests: a class of its own in the test module, so that pickling a
    # test's bound methods finds it by name on every rank.
    name = f"TorchSuite{class_name}"
    cls = type(name, (getattr(module, class_name), MultiProcessTestCase), {})
    cls.__module__ = module_name
    setattr(module, name, cls)
    case = cls(test_name)
    case.rank = rank
    case.file_name = os.path.join(os.environ["TORCHSUITE_SCRATCH"], "init_file")
    method = getattr(case, test_name)
    if getattr(method, "__unittest_skip__", False):
        print(f"rank {rank}: skipped: {method.__unittest_skip_why__}", file=sys.stderr, flush=True)
        return SKIP_EXIT
    # As MultiProcessTestCase.run_test: the method alone (dist_init sets up and tears down),
    # an exception is an error, and a test's own sys.exit() ends the process with its code.
    try:
        method()
    except unittest.SkipTest as exc:
        print(f"rank {rank}: skipped: {exc}", file=sys.stderr, flush=True)
        return SKIP_EXIT
    except Exception:
        print(f"rank {rank}: {traceback.format_exc()}", file=sys.stderr, flush=True)
        return ERROR_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))  # a normal exit: a hang at exit fails the test at its deadline
