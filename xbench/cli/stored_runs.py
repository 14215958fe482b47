"""What the commands that read a stored run share: the note on a record cut off by a crash,
and writing the run's report (`xbench report`, and `compare` and `sweep` when they finish)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from xbench.cli.consoles import status_console
from xbench.errors import XbenchError
from xbench.report.pages import write_report
from xbench.results.records import RECORDS_FILE, last_line_torn

REPORT_EXTRA = "pip install 'xbench[report]'"


def note_torn_records(run_dir: Path) -> None:
    """Say that a record cut off by a crash is left out (`xbench compare --resume` reruns it)."""
    torn = last_line_torn(Path(run_dir) / RECORDS_FILE)
    if torn:
        status_console().print(f"{Path(run_dir) / RECORDS_FILE}:{torn} was cut off mid-write (an interrupted "
                               f"append) and is left out; `xbench compare --resume {run_dir}` runs that trial again")


def make_report(run_dir: Path, html: bool) -> list[Path]:
    """The report with plots when matplotlib is installed, without them (and a note) if not."""
    plots = importlib.util.find_spec("matplotlib") is not None
    if not plots:
        status_console().print(f"matplotlib is not installed: the report has no plots ({REPORT_EXTRA})")
    try:
        return write_report(run_dir, html=html, plots=plots)
    except OSError as err:
        raise XbenchError(f"cannot write the report into {run_dir}: {err.strerror}") from None
