"""gradwire.multiprocessing: the standard multiprocessing API, with tensors in shared memory.

Everything ``multiprocessing`` offers is re-exported (Process, Queue, SimpleQueue, Pool, Pipe,
get_context, ...). Importing this package registers tensor reductions with ForkingPickler, so
gradwire tensors sent through any of them move to shared memory and arrive as views of the same
memory. ``Process`` is a subclass that shares tensor arguments also under ``fork`` (where
arguments are inherited, not pickled). On top of that: :func:`spawn` / :func:`start_processes`
and the sharing strategies.

Example:
    >>> import gradwire.multiprocessing as mp
    >>> q = mp.Queue()
    >>> p = mp.Process(target=fill, args=(q,)); p.start()
"""

from __future__ import annotations

import multiprocessing as _mp
from multiprocessing import *  # noqa: F403

from ._sharing import is_shared, share_memory_
from ._strategy import get_all_sharing_strategies, get_sharing_strategy, set_sharing_strategy
from .process import Process as Process  # replaces the star-imported one
from .reductions import init_reductions
from .spawn import (
    ProcessContext,
    ProcessException,
    ProcessExitedException,
    ProcessRaisedException,
    SpawnContext,
    spawn,
    start_processes,
)

__all__ = [
    *_mp.__all__,
    "ProcessContext",
    "ProcessException",
    "ProcessExitedException",
    "ProcessRaisedException",
    "SpawnContext",
    "get_all_sharing_strategies",
    "get_sharing_strategy",
    "init_reductions",
    "is_shared",
    "set_sharing_strategy",
    "share_memory_",
    "spawn",
    "start_processes",
]

init_reductions()
