"""Where the CLI writes: data (tables) to stdout, progress and diagnostics to stderr."""

from __future__ import annotations

import sys

from rich.console import Console

PIPED_WIDTH = 160  # rich assumes 80 columns when not on a terminal; tables need more


def data_console() -> Console:
    return Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)


def status_console() -> Console:
    return Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else PIPED_WIDTH)
