"""`xbench report`, `xbench export` and `xbench diff`: reading stored runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from xbench.cli.consoles import data_console, status_console
from xbench.diff import diff_runs
from xbench.stats import SIGNIFICANCE
from xbench.errors import XbenchError
from xbench.records import RECORDS_FILE, last_line_torn, read_records, write_atomic
from xbench.report import write_report

REPORT_EXTRA = "pip install 'xbench[report]'"


def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (holds records.jsonl).")],
    html: Annotated[bool, typer.Option("--html", help="Also write a self-contained report.html.")] = False,
) -> int:
    """Write report.md (tables, verdicts, plots) into RUN_DIR."""
    note_torn_records(run_dir)
    for path in make_report(run_dir, html):
        data_console().print(str(path))
    return 0


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


def export(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (holds records.jsonl).")],
    csv: Annotated[bool, typer.Option("--csv", help="Write CSV.")] = False,
    parquet: Annotated[bool, typer.Option("--parquet", help="Write Parquet (needs pyarrow).")] = False,
    out: Annotated[Optional[Path], typer.Option(help="Output file (default RUN_DIR/records.csv or .parquet).")] = None,
) -> int:
    """Write one row per trial, statistics included, through pandas."""
    if csv == parquet:
        raise XbenchError("choose one of --csv or --parquet")
    for module in ("pandas", "pyarrow") if parquet else ("pandas",):
        if importlib.util.find_spec(module) is None:
            raise XbenchError(f"{module} is not installed; {REPORT_EXTRA}")
    from xbench.export import to_frame

    note_torn_records(run_dir)
    frame = to_frame(read_records(run_dir))
    target = out or Path(run_dir) / ("records.parquet" if parquet else "records.csv")
    write_atomic(target, (lambda tmp: frame.to_parquet(tmp, index=False)) if parquet
                 else (lambda tmp: frame.to_csv(tmp, index=False)))
    data_console().print(str(target))
    return 0


def diff(
    a: Annotated[Path, typer.Argument(help="The baseline run directory.")],
    b: Annotated[Path, typer.Argument(help="The run to compare with it.")],
    threshold: Annotated[str, typer.Option(help="Slowdown that counts as a regression, e.g. 5% or 0.05.")] = "5%",
) -> int:
    """Compare B with A per configuration; exit 1 when B is significantly slower beyond the threshold."""
    limit = parse_threshold(threshold)
    for run_dir in (a, b):
        note_torn_records(run_dir)
    result = diff_runs(read_records(a), read_records(b))
    table = Table(title=f"xbench diff: B = {b} over A = {a}", title_justify="left",
                  caption=f"B/A: ratio of mean throughputs with its 95% interval; p: Welch's t-test on the "
                          f"replicate means (reps: A/B replicates); p adj.: after Holm's correction over the "
                          f"{len(result.rows)} configurations; regression: p adj. < {SIGNIFICANCE} and B/A < "
                          f"{1 - limit:.3f}; improvement: p adj. < {SIGNIFICANCE} and B/A > {1 + limit:.3f}",
                  caption_justify="left")
    for header in ("model", "backend", "dev", "batch", "A samples/s", "B samples/s", "B/A", "95% CI", "p", "p adj.",
                   "reps", "change"):
        table.add_column(header, justify="left" if header in ("model", "backend", "change") else "right")
    for row in result.rows:
        backend, model, devices, batch, _, _, all_reduce = row.key
        model = model if all_reduce else f"{model} (compute-only)"
        r, change = row.ratio, row.change(limit)
        style = {"regression": "[red]", "improvement": "[green]"}.get(change, "")
        table.add_row(model, backend, str(devices), str(batch), f"{row.a_mean:,.0f}", f"{row.b_mean:,.0f}",
                      f"{r.ratio:.3f}", "" if r.ci_low != r.ci_low else f"{r.ci_low:.3f}–{r.ci_high:.3f}",
                      _p_text(r.p_value), _p_text(row.adjusted_p), f"{row.a_replicates}/{row.b_replicates}",
                      f"{style}{change}[/]" if style else change)
    data_console().print(table)
    err = status_console()
    for line in result.environment_changes:
        err.print(f"environment differs: {escape(line)}")
    for side, keys in (("A", result.only_a), ("B", result.only_b)):
        if keys:
            err.print(f"only in {side}: " + ", ".join(
                f"{k[0]}/{k[1]}/d{k[2]}/b{k[3]}" + ("" if k[6] else "/compute-only") for k in keys))
    if not result.rows:
        raise XbenchError("the runs share no measured configuration; nothing to compare")
    untested = result.untested
    if len(untested) == len(result.rows):
        raise XbenchError(f"none of the {len(result.rows)} shared configurations has 2 or more replicates in both "
                          "runs, so no difference can be tested; rerun them with --replicates 2 or more")
    if untested:
        err.print(f"[yellow]{len(untested)} configuration(s) have fewer than 2 replicates in a run: not tested "
                  "(n.s. says nothing there)[/]")
    regressions = result.regressions(limit)
    changed = [row for row in result.rows if row.change(limit) in ("regression", "improvement")]
    err.print(f"{len(changed)} of {len(result.rows)} configuration(s) changed significantly beyond {limit:.1%}")
    if regressions:
        err.print(f"[red]{len(regressions)} significant slowdown(s) beyond {limit:.1%}[/]")
        return 1
    err.print(f"no significant slowdown beyond {limit:.1%}")
    return 0


def _p_text(p: float) -> str:
    if p != p:
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def parse_threshold(text: str) -> float:
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise XbenchError(f"--threshold takes a fraction such as 5% or 0.05, got {text!r}")
    return value
