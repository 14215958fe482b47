"""The `xbench` console script. A Ctrl-C while the CLI's modules are still loading (the first
half second or so) ends it as any other interrupt does: one line, exit status 130."""

from __future__ import annotations

import sys


def run() -> None:
    try:
        from xbench.cli.main import run as run_cli
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    run_cli()
