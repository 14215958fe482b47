"""Where the CLI writes: data (tables) to stdout, progress and diagnostics to stderr.

Standard output may be closed (`>&-`), full (`> /dev/full`), a broken pipe, or unable to
encode what the tables hold (an ASCII locale). None of that may cost a run its records or its
report, so `guarded_stdout` keeps writes from raising: characters stdout cannot encode are
replaced, and once a write fails the rest of the output is dropped and the failure is kept
for `main` to report in one line."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import Any

from rich.console import Console

PIPED_WIDTH = 160  # rich assumes 80 columns when not on a terminal; tables need more


def data_console() -> Console:
    return Console(width=_width(sys.stdout))


def status_console() -> Console:
    return Console(stderr=True, highlight=False, width=_width(sys.stderr))


def _width(stream: Any) -> int | None:
    """A terminal's own width (None: rich asks it); when piped, $COLUMNS if set, else PIPED_WIDTH."""
    if stream is not None and stream.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return None  # rich reads the terminal, or $COLUMNS
    return PIPED_WIDTH


class GuardedStdout(io.TextIOBase):
    """sys.stdout that never raises: the first failed write is kept in `lost`, and later
    output goes nowhere."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.lost: str | None = None if stream is not None else "standard output is closed"
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(errors="replace")  # an ASCII locale gets "?" for "—", not an error

    def write(self, text: str) -> int:
        self._attempt(lambda: self.stream.write(text))
        return len(text)

    def flush(self) -> None:
        self._attempt(lambda: self.stream.flush())

    def _attempt(self, action: Any) -> None:
        if self.lost is not None:
            return
        try:
            action()
        except (OSError, ValueError) as err:  # ValueError: the file was closed under us
            self.lost = (getattr(err, "strerror", None) or str(err) or type(err).__name__)

    def isatty(self) -> bool:
        try:
            return self.lost is None and bool(self.stream.isatty())
        except (AttributeError, ValueError, OSError):
            return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]  # rich reads it to choose its box characters
        return getattr(self.stream, "encoding", None) or "utf-8"


@contextlib.contextmanager
def guarded_stdout() -> Iterator[GuardedStdout]:
    """sys.stdout as a `GuardedStdout` for the duration; the real one is back afterwards."""
    real = sys.stdout
    guard = GuardedStdout(real)
    sys.stdout = guard
    try:
        yield guard
    finally:
        guard.flush()
        sys.stdout = real
        if guard.lost is not None and real is not None:
            _silence(real)


def _silence(stream: Any) -> None:
    """Point a failed stdout at /dev/null, so that Python's own flush at exit does not print
    a traceback for output that is already reported lost."""
    with contextlib.suppress(AttributeError, ValueError, OSError, io.UnsupportedOperation):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)
