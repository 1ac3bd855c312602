"""Errors raised by the RRef protocol state machine.

The tree::

    RRefProtocolError (RuntimeError)   the agent drove the state machine against the protocol:
    │                                  an unknown fork or RRef, a fork of a released reference
    └── UnknownRRefError (KeyError)    the owner has no record of an RRef it is asked about
                                       (already deleted, or never created on this worker)

The agent maps these to gradwire's public errors; the state machine never imports them.
"""

from __future__ import annotations

__all__ = ["RRefProtocolError", "UnknownRRefError"]


class RRefProtocolError(RuntimeError):
    """A call into the state machine that the protocol does not allow."""


class UnknownRRefError(RRefProtocolError, KeyError):
    """The owner no longer knows (or never knew) the RRef."""

    def __str__(self) -> str:
        # KeyError quotes its argument; this message is prose.
        return str(self.args[0]) if self.args else "unknown RRef"
