"""``gradwire run TARGET``: the driver is itself a worker (as in PyTorch).

It joins with the same flags and GRADWIRE_* variables as ``gradwire-worker``, runs the job's entry
point, then leaves through the graceful shutdown (the barrier where the other workers wait).

TARGET is one of:
    path/to/script.py   the script's top-level ``main()`` if it defines one (the script is
                        imported as a module named after the file), else the whole script as
                        ``__main__``
    package.module:fn   that function
    package.module      its ``main()``, else the module as ``__main__`` (like ``python -m``)

Arguments after TARGET become ``sys.argv[1:]``. The entry point must not call ``init_rpc`` or
``shutdown``: ``gradwire run`` does. Exit codes: what ``main()`` returned (an int) or passed to
``sys.exit``, 0 otherwise; 1 if the job raised or the shutdown failed; 2 bad configuration or
target; 3 could not join; 128+N stopped by signal N.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import logging
import os
import runpy
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .lifecycle import EXIT_CONFIG, EXIT_FAILURE, EXIT_OK, Background, abandon, join, wait_for
from .observe import observe
from .settings import ConfigError
from .signals import EXIT_SIGNALLED, Interrupted, StopSignals
from .worker_config import add_worker_arguments, setup_logging, worker_config

__all__ = ["Entry", "load_entry", "add_run_arguments", "run_command", "main"]

log = logging.getLogger("gradwire.run")


@dataclass(frozen=True)
class Entry:
    """A loaded job entry point.

    Attributes:
        call: runs the job; returns what ``main()`` returned.
        argv0: ``sys.argv[0]`` for the job.
        description: for logs (``script.py:main``, ``pkg.mod:fn``, ...).
    """

    call: Callable[[], Any]
    argv0: str
    description: str


def _defines_main(path: str) -> bool:
    with open(path, encoding="utf-8") as f:
        source = f.read()
    try:
        tree = ast.parse(source, path)
    except SyntaxError as exc:
        raise ConfigError(f"{path} is not valid Python: {exc}") from None
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "main"
        for node in tree.body
    )


def _load_script(path: str) -> Entry:
    if not os.path.isfile(path):
        raise ConfigError(f"no such script: {path}")
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # as `python script.py` does
    if not _defines_main(path):
        return Entry(lambda: runpy.run_path(path, run_name="__main__"), path, path)
    name = os.path.splitext(os.path.basename(path))[0]
    if not name.isidentifier() or name in sys.modules:
        name = "__gradwire_job__"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # functions of the job pickle by this module name
    spec.loader.exec_module(module)
    main = getattr(module, "main", None)
    if not callable(main):
        raise ConfigError(f"{path}: main is not callable")
    return Entry(main, path, f"{path}:main")


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module!r}: {exc}") from None


def load_entry(target: str) -> Entry:
    """Load the job entry point named by ``target`` (see the module docstring).

    Args:
        target: ``script.py``, ``package.module:function`` or ``package.module``.

    Returns:
        The entry point, ready to call.

    Raises:
        ConfigError: no such file or module, no such function, not callable, invalid Python.

    Example:
        >>> load_entry("gradwire.demo:main").description
        'gradwire.demo:main'
    """
    if target.endswith(".py") or os.path.sep in target or os.path.isfile(target):
        return _load_script(target)
    module_name, sep, attr = target.partition(":")
    if sep:
        module = _import(module_name)
        fn: Any = module
        for part in attr.split("."):
            fn = getattr(fn, part, None)
            if fn is None:
                raise ConfigError(f"module {module_name!r} has no {attr!r}")
        if not callable(fn):
            raise ConfigError(f"{target} is not callable")
        return Entry(fn, module_name, target)
    module = _import(module_name)
    main = getattr(module, "main", None)
    if callable(main):
        return Entry(main, module_name, f"{module_name}:main")
    return Entry(
        lambda: runpy.run_module(module_name, run_name="__main__", alter_sys=True),
        module_name,
        module_name,
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the worker flags, TARGET and the job's arguments to ``parser``."""
    add_worker_arguments(parser, serve=False)
    parser.add_argument("target", help="script.py, package.module:function or package.module")
    parser.add_argument("job_args", nargs=argparse.REMAINDER, help="arguments of the job")


def _returned_code(value: Any) -> int:
    # main() returning an int sets the exit code; any other value (None, a result) means 0.
    return value if isinstance(value, int) and not isinstance(value, bool) else EXIT_OK


def _exit_code(value: Any) -> int:
    # sys.exit() semantics: None -> 0, an int -> itself, anything else is printed -> 1.
    if value is None:
        return EXIT_OK
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)  # sys.exit("message") convention
    return EXIT_FAILURE


def run_command(args: argparse.Namespace, prog: str = "gradwire run") -> int:
    """Run a job as a worker of the cluster.

    Args:
        args: parsed by a parser prepared with :func:`add_run_arguments`.
        prog: command name for messages.

    Returns:
        The exit code (see the module docstring).
    """
    try:
        cfg = worker_config(args, serve=False)
        setup_logging(cfg.log_level)
        entry = load_entry(args.target)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    from gradwire.distributed import rpc

    stops = StopSignals(
        on_second=lambda s: abandon(EXIT_SIGNALLED[s], "second stop signal: exiting at once")
    ).install()
    code = observe(cfg, prog)  # --metrics-port, --tracing (docs/observability.md)
    if code is None:
        code = join(cfg, stops, prog)
    if code is not None:
        return code
    sys.argv = [entry.argv0, *args.job_args]
    log.info("running %s", entry.description)
    started = time.monotonic()
    try:
        with stops.raising():
            code = _returned_code(entry.call())
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except Interrupted as exc:
        log.warning("job %s: %s", entry.description, exc)
        code = EXIT_SIGNALLED[exc.signum]
    except BaseException:  # noqa: BLE001 - the job's failure is the process's
        traceback.print_exc()
        code = EXIT_FAILURE
    log.info(
        "%s ended with exit code %d after %.1f s",
        entry.description,
        code,
        time.monotonic() - started,
    )
    if not rpc.is_initialized():
        return code
    task = Background(
        lambda: rpc.shutdown(graceful=True, timeout=cfg.shutdown_timeout), "gw-shutdown"
    )
    limit = time.monotonic() + cfg.shutdown_timeout + 10.0
    left = wait_for(task, "leaving the cluster", stops, cfg.shutdown_timeout, limit)
    return code if code != EXIT_OK else left


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m gradwire.server.cli.run TARGET``."""
    parser = argparse.ArgumentParser(
        prog="gradwire run", description=__doc__.split("\n")[0], allow_abbrev=False
    )
    add_run_arguments(parser)
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
