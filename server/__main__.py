"""``python -m gradwire.server``: the same as ``gradwire-worker``."""

from __future__ import annotations

from gradwire.server.cli.worker import console_main

__all__: list[str] = []

if __name__ == "__main__":
    console_main()
