"""The process group the tests use as a barrier between their ranks, for gradwire runs.

PyTorch's RPC tests call ``initialize_pg`` and ``dist.barrier()`` (c10d with gloo) only to line
their ranks up; gradwire has no c10d. Under gradwire, ``torch.distributed`` therefore resolves
to :func:`gradwire_distributed`: gradwire's ``distributed`` package plus these four functions,
a barrier over files in the test's scratch folder (``$TORCHSUITE_SCRATCH``), and the default
store (``distributed_c10d._get_default_store()``) as files there too. Tests of c10d itself are
in not_applicable.toml.
"""

from __future__ import annotations

import os
import time
import types
from pathlib import Path
from typing import Any

__all__ = ["gradwire_distributed", "init_process_group", "barrier", "is_initialized"]

_group: dict[str, int] = {}
_BARRIER_TIMEOUT = 120.0


def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    rank: int = -1,
    world_size: int = -1,
    **kwargs: Any,
) -> None:
    """Join the test's barrier group (the arguments of c10d's ``init_process_group``)."""
    if _group:
        raise RuntimeError("trying to initialize the default process group twice!")
    _group.update(rank=rank, world_size=world_size, generation=0)


def is_initialized() -> bool:
    return bool(_group)


def is_available() -> bool:
    return True


def destroy_process_group(group: Any = None) -> None:
    _group.clear()


def barrier(group: Any = None, **kwargs: Any) -> None:
    """Wait until every rank of the group has reached its barrier of the same generation."""
    if not _group:
        raise RuntimeError("Default process group has not been initialized")
    scratch = Path(os.environ["TORCHSUITE_SCRATCH"])
    gen = _group["generation"] = _group["generation"] + 1
    (scratch / f"barrier.{gen}.{_group['rank']}").touch()
    deadline = time.monotonic() + _BARRIER_TIMEOUT
    while sum(1 for _ in scratch.glob(f"barrier.{gen}.*")) < _group["world_size"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"barrier {gen} timed out after {_BARRIER_TIMEOUT} s")
        time.sleep(0.01)


class _FileStore:
    """The default group's key-value store (``set``, ``get``, ``wait``), as files in the scratch
    folder; tests use it to signal between ranks when RPC may be broken."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder

    def _path(self, key: str) -> Path:
        return self._folder / f"store.{key.replace('/', '_')}"

    def set(self, key: str, value: str | bytes) -> None:
        data = value.encode() if isinstance(value, str) else value
        tmp = self._path(key).with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(self._path(key))

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        seconds = _BARRIER_TIMEOUT if timeout is None else timeout.total_seconds()
        deadline = time.monotonic() + seconds
        while not all(self._path(k).exists() for k in keys):
            if time.monotonic() > deadline:
                raise RuntimeError(f"Socket Timeout: keys {keys} not set within {seconds} s")
            time.sleep(0.01)

    def get(self, key: str) -> bytes:
        self.wait([key])
        return self._path(key).read_bytes()


def _get_default_store() -> _FileStore:
    if not _group:
        raise RuntimeError("Default process group has not been initialized")
    return _FileStore(Path(os.environ["TORCHSUITE_SCRATCH"]))


_MODULE: types.ModuleType | None = None


def gradwire_distributed() -> types.ModuleType:
    """``torch.distributed`` under gradwire: gradwire.distributed and the barrier group."""
    global _MODULE
    if _MODULE is None:
        import importlib

        import gradwire.distributed as real

        for sub in ("rpc", "autograd", "optim", "nn"):
            importlib.import_module(f"gradwire.distributed.{sub}")
        mod = types.ModuleType("torch.distributed (gradwire)")
        mod.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
        for fn in (
            init_process_group,
            is_initialized,
            is_available,
            destroy_process_group,
            barrier,
        ):
            setattr(mod, fn.__name__, fn)
        mod.distributed_c10d = types.SimpleNamespace(_get_default_store=_get_default_store)  # type: ignore[attr-defined]
        _MODULE = mod
    return _MODULE
