"""The guard: keeps what a peer makes a worker run off files, processes and sockets.

Defence in depth behind the callable policy. A Python audit hook (PEP 578) watches the
events that reach outside the process: opening files, starting processes or threads, sockets,
file-system changes, ``ctypes``, ``mmap`` of a file, compiling or executing code, rewriting a
function's code or defaults or a class's name or bases, and importing a module not yet loaded (except modules of the standard library, gradwire and NumPy, which
their lazy imports need). While a thread runs *guarded* code (a callable that only the reviewed
default lists allow, or the unpickling of a peer's payload), such an event raises
:class:`PolicyError`, naming the event and the callable; the operation does not happen, the
error reaches the caller and the worker goes on serving. The program's own code and names the
user allowed run unguarded.

The hook is installed once per process (audit hooks cannot be removed); outside guarded code
it returns after reading one thread-local attribute.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import PolicyError

__all__ = ["Guarded", "install", "guarded", "suspended", "is_active", "REFUSED_EVENTS"]

#: Audit events refused in guarded code (exact names).
REFUSED_EVENTS: frozenset[str] = frozenset(
    """open os.system subprocess.Popen os.posix_spawn os.fork os.forkpty os.startfile os.kill
    os.killpg os.remove os.rename os.rmdir os.mkdir os.truncate os.chmod os.chown os.link
    os.symlink os.utime os.listdir os.scandir os.chdir os.chflags os.lchflags os.putenv
    os.unsetenv os.setxattr os.removexattr os.listxattr os.getxattr os.walk os.fwalk os.lockf
    os.add_dll_directory pty.spawn exec compile code.__new__ function.__new__
    pickle.find_class sys.addaudithook sys.settrace sys.setprofile
    sys._current_frames sys.remote_exec _thread.start_new_thread
    webbrowser.open tempfile.mkstemp tempfile.mkdtemp object.__setattr__ object.__delattr__""".split()
)
# object.__setattr__ / object.__delattr__: CPython raises them for writes that change code or
# how it is found: a function's __code__, __defaults__ and __kwdefaults__, a class's __module__,
# __name__, __qualname__ and __bases__ (issue 36: a peer may build values, never change code).
# Not refused: marshal.loads. Importing a module from its bytecode cache raises it (with no file
# name to tell gradwire's from others); a code object it makes runs only through exec or a new
# function, which are refused. Nor sys._getframe: every logging call raises it (findCaller),
# and frames are reached only through dunder attributes, which the policy never resolves.
#: Audit event prefixes refused in guarded code.
REFUSED_PREFIXES: tuple[str, ...] = (
    "os.exec",
    "os.spawn",
    "shutil.",
    "ctypes.",
    "socket.",
    "glob.",
    "fcntl.",
    "syslog.",
    "urllib.",
    "http.",
    "ftplib.",
    "smtplib.",
    "poplib.",
    "imaplib.",
    "nntplib.",
    "telnetlib.",
    "sqlite3.",
    "cpython.run_",
    "subprocess.",
    "resource.",
    "signal.",
)


class _State(threading.local):
    # (callable, worker) of the guarded code running on this thread; None when unguarded.
    label: tuple[str, str] | None = None


_state = _State()
_installed = False
_install_lock = threading.Lock()


#: Packages whose callables the default lists allow: their own lazy imports (and the reads of
#: their code, and the bytecode cache that goes with them) are part of the reviewed surface, and
#: so are the standard library's modules that they import.
_LIBRARIES = ("gradwire", "numpy")
_STDLIB_DIRS = tuple(
    os.path.realpath(p) + os.sep
    for key in ("stdlib", "platstdlib")
    if (p := sysconfig.get_paths().get(key))
)
_STDLIB_MODULES = frozenset(getattr(sys, "stdlib_module_names", ()))
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _library_dirs() -> tuple[str, ...]:
    dirs = list(_STDLIB_DIRS)
    for name in (*_LIBRARIES, "gradwire.server"):  # gradwire.server has a folder of its own
        module = sys.modules.get(name)
        for path in getattr(module, "__path__", None) or ():
            dirs.append(os.path.realpath(path) + os.sep)
    return tuple(dirs)


def _library_file(path: Any, write: bool) -> bool:
    """A file of gradwire's or NumPy's own code (or its bytecode cache, when ``write``)."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str):
        return False
    real = os.path.realpath(path)
    if not (real + os.sep).startswith(_library_dirs()):
        return False
    return not write or f"{os.sep}__pycache__" in real


def _library_source(path: Any) -> bool:
    """A module of gradwire or NumPy being compiled or run as it is imported."""
    return (
        isinstance(path, str)
        and path.endswith(".py")
        and os.path.isfile(path)
        and _library_file(path, False)
    )


def _library_event(event: str, args: tuple[Any, ...]) -> bool:
    """True for the file events of importing a module of gradwire or NumPy."""
    if not args:
        return False
    if event == "open":
        mode, flags = (args[1:3] + (None, None))[:2]
        write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and bool(flags & _WRITE_FLAGS) and mode is None
        )
        return _library_file(args[0], write)
    if event in ("os.listdir", "os.scandir"):
        return _library_file(args[0], False)
    if event in ("os.mkdir", "os.rename"):
        return _library_file(args[0], True)
    if event == "compile" and len(args) > 1:
        return _library_source(args[1])
    if event == "exec":
        return _library_source(getattr(args[0], "co_filename", None))
    return False


def _refused(event: str, args: tuple[Any, ...]) -> bool:
    if event in REFUSED_EVENTS or event.startswith(REFUSED_PREFIXES):
        return not _library_event(event, args)
    if event == "import":
        if not args or args[0] in sys.modules:
            return False
        top = str(args[0]).partition(".")[0]
        return top not in _LIBRARIES and top not in _STDLIB_MODULES
    if event == "mmap.__new__":
        return bool(args) and args[0] != -1  # a file mapping (anonymous memory is fine)
    return False


def _describe(event: str, args: tuple[Any, ...]) -> str:
    if event == "open" and args:
        return f"open {args[0]!r}"
    if event == "import" and args:
        return f"import module {args[0]!r}"
    if event == "socket.connect" and len(args) > 1:
        return f"connect a socket to {args[1]!r}"
    if event == "os.system":
        return f"start a process (os.system {args[0]!r})"
    if event in ("subprocess.Popen", "os.posix_spawn") and len(args) > 1:
        return f"start a process ({event} {args[1]!r})"
    return f"raise audit event {event!r}"


def _hook(event: str, args: tuple[Any, ...]) -> None:
    label = _state.label
    if label is None or not _refused(event, args):
        return
    _state.label = None  # building the error must not trip the hook again
    try:
        what, worker = label
        where = f" on worker {worker!r}" if worker else ""
        error = PolicyError(
            f"{what} tried to {_describe(event, args)}{where}; the callable guard refuses "
            "files, processes, threads, sockets, code loading and new imports in callables "
            "allowed by the default policy and while unpickling a peer's payload (run such "
            "work in a function of your own program, or set rpc_backend_options "
            "callable_guard=False on a trusted cluster; docs/security.md)"
        )
    finally:
        _state.label = label
    raise error


def install() -> None:
    """Install the audit hook in this process (once; later calls do nothing)."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if not _installed:
            sys.addaudithook(_hook)
            _installed = True


def is_active() -> bool:
    """True while this thread runs guarded code."""
    return _state.label is not None


@contextmanager
def guarded(what: str, worker: str = "") -> Iterator[None]:
    """Run the block as guarded code, ``what`` naming it in refusals."""
    install()
    previous = _state.label
    _state.label = (what, worker)
    try:
        yield
    finally:
        _state.label = previous


@contextmanager
def suspended() -> Iterator[None]:
    """Run the block unguarded (gradwire's own work inside guarded code: resolving a global,
    rebuilding a tensor from shared memory)."""
    previous = _state.label
    if previous is None:
        yield
        return
    _state.label = None
    try:
        yield
    finally:
        _state.label = previous


class Guarded:
    """A default-allowed callable that runs guarded: ``Guarded(fn, "numpy:sum", "w1")(...)``."""

    __slots__ = ("fn", "label")

    def __init__(self, fn: Callable[..., Any], what: str, worker: str = "") -> None:
        install()
        self.fn = fn
        self.label = (what, worker)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        state = _state
        previous = state.label
        state.label = self.label
        try:
            return self.fn(*args, **kwargs)
        finally:
            state.label = previous

    def __repr__(self) -> str:
        return f"<guarded {self.label[0]}>"
