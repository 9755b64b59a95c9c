"""The exception types the CLI turns into one line and an exit status: ``OpmapError`` (bad input, status 2) and
``Interrupted`` (a stop signal, status 128 + the signal's number: 130 for SIGINT, 143 for SIGTERM)."""

from __future__ import annotations

import signal
from typing import Any


class OpmapError(Exception):
    """Bad input or an impossible request: the message names what was wrong and what is accepted."""


class Interrupted(KeyboardInterrupt):
    """A stop signal (Ctrl-C's SIGINT, or SIGTERM) reached the process: the work in hand stops. A KeyboardInterrupt,
    so that whatever lets Ctrl-C through lets it through too. ``done``: the results an engine's map finished
    before the stop, by task index; ``partial``: what a library call keeps of its work (a result marked
    ``interrupted`` with its own typed stop record: the signal's ``name`` and what was kept), or None where nothing
    was finished."""

    def __init__(self, signum: int = signal.SIGINT, done: dict[int, Any] | None = None, partial: Any = None):
        super().__init__(signum)
        self.signum, self.done, self.partial = int(signum), dict(done or {}), partial

    @classmethod
    def of(cls, e: BaseException) -> Interrupted:
        """``e`` itself when it is one; a plain KeyboardInterrupt (Python's own Ctrl-C) as SIGINT's."""
        return e if isinstance(e, Interrupted) else cls(signal.SIGINT)

    @property
    def name(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    @property
    def exit_status(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + its number."""
        return 128 + self.signum
