"""What differs between the Pythons gradwire supports (3.10 to 3.13, pyproject.toml)."""

from __future__ import annotations

__all__ = ["add_note"]


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``: on Python 3.10, which has no ``add_note``, the note goes into
    ``__notes__`` as 3.11 keeps it (readable by code and tests; 3.10's traceback omits it)."""
    method = getattr(exc, "add_note", None)
    if method is not None:
        method(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined]
