"""Errors a user can act on.

Every `XbenchError` message is one line that says what to change; the CLI prints it as
`error: <message>` and exits non-zero, never with a traceback: 2 for input to change, 3 when
results could not be written (`xbench.results.records.ResultsNotWritten`).
"""

from typing import Any


class XbenchError(Exception):
    """A problem the user can fix; the message says how."""


class SpecError(XbenchError):
    """The experiment spec (TOML file or command-line override) is invalid."""


class BackendError(XbenchError):
    """A backend is unknown, not installed, or cannot provide what was asked."""


class Interrupted(Exception):
    """The user stopped a command (Ctrl-C, SIGTERM); the message says what was kept. Not an
    XbenchError: its exit status is 130, as for any interrupt."""


def brief(value: Any, limit: int = 60) -> str:
    """A value for a one-line error: its repr, cut short where a long one would bury the
    message (a typo, a damaged file or an environment variable may hold anything), with the
    length of a string that was cut."""
    return _cut(repr(value), limit, len(value) if isinstance(value, str) else None)


def one_line(text: str, limit: int = 300) -> str:
    """Someone else's words (a framework's error, a plugin's reason, a log line) as one line,
    cut short with the length of what was cut."""
    flat = " ".join(str(text).split())
    return _cut(flat, limit, len(flat))


def _cut(text: str, limit: int, length: int | None) -> str:
    """The one way xbench shortens what it echoes: the first `limit` characters, then "...",
    then the whole length where it is known."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({length:,} characters)" if length is not None else f"{text[:limit]}..."
