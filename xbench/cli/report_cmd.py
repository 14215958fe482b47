"""`xbench report`: write a stored run's report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from xbench.cli.consoles import data_console
from xbench.cli.stored_runs import make_report, note_torn_records


def report(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run directory (holds records.jsonl).")],
    html: Annotated[bool, typer.Option("--html", help="Also write a self-contained report.html.")] = False,
) -> int:
    """Write a run's report into RUN_DIR: bottom line, tables, verdicts and plots.

    report.md always; report.html (self-contained, the plots inlined) with --html."""
    note_torn_records(run_dir)
    for path in make_report(run_dir, html):
        data_console().print(str(path))
    return 0
