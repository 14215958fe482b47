"""`xbench export`: a stored run's records as a table file (CSV or Parquet)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Optional

import typer

from xbench.cli.consoles import data_console
from xbench.cli.stored_runs import REPORT_EXTRA, note_torn_records
from xbench.errors import XbenchError
from xbench.results.records import read_records, write_atomic


def export(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run directory (holds records.jsonl).")],
    csv: Annotated[bool, typer.Option("--csv", help="Write CSV.")] = False,
    parquet: Annotated[bool, typer.Option("--parquet", help="Write Parquet (needs pyarrow).")] = False,
    out: Annotated[Optional[Path], typer.Option(
        metavar="FILE", help="Output file (default RUN_DIR/configurations.csv or .parquet).")] = None,
) -> int:
    """Write a run as a table file: one row per configuration, statistics included.

    Each row combines a configuration's replicates (mean, interval, speedup, verdict, notes)
    beside its environment; pandas writes it (Parquet needs pyarrow)."""
    if csv == parquet:
        raise XbenchError("choose one of --csv or --parquet")
    for module in ("pandas", "pyarrow") if parquet else ("pandas",):
        if importlib.util.find_spec(module) is None:
            raise XbenchError(f"{module} is not installed; {REPORT_EXTRA}")
    from xbench.report.export import to_frame

    note_torn_records(run_dir)
    frame = to_frame(read_records(run_dir))
    target = out or Path(run_dir) / ("configurations.parquet" if parquet else "configurations.csv")
    write_atomic(target, (lambda tmp: frame.to_parquet(tmp, index=False)) if parquet
                 else (lambda tmp: frame.to_csv(tmp, index=False)))
    data_console().print(str(target))
    return 0
