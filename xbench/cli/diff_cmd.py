"""`xbench diff`: two stored runs compared per configuration, with significance tests."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from xbench.cli.consoles import data_console, status_console
from xbench.cli.stored_runs import note_torn_records
from xbench.errors import XbenchError
from xbench.results.diff import Diff, diff_runs
from xbench.results.records import read_records
from xbench.stats import SIGNIFICANCE

HEADERS = ("model", "backend", "dev", "batch", "A samples/s", "B samples/s", "B/A", "95% CI", "p", "p adj.", "reps",
           "change")


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
    data_console().print(diff_table(result, a, b, limit))
    err = status_console()
    _print_differences(err, result)
    _check_comparable(err, result)
    regressions = result.regressions(limit)
    changed = [row for row in result.rows if row.change(limit) in ("regression", "improvement")]
    err.print(f"{len(changed)} of {len(result.rows)} configuration(s) changed significantly beyond {limit:.1%}")
    if regressions:
        err.print(f"[red]{len(regressions)} significant slowdown(s) beyond {limit:.1%}[/]")
        return 1
    err.print(f"no significant slowdown beyond {limit:.1%}")
    return 0


def diff_table(result: Diff, a: Path, b: Path, limit: float) -> Table:
    """One row per configuration both runs measured: their throughputs, the ratio and its tests."""
    table = Table(title=f"xbench diff: B = {b} over A = {a}", title_justify="left",
                  caption=f"B/A: ratio of mean throughputs with its 95% interval; p: Welch's t-test on the "
                          f"replicate means (reps: A/B replicates); p adj.: after Holm's correction over the "
                          f"{len(result.rows)} configurations; regression: p adj. < {SIGNIFICANCE} and B/A < "
                          f"{1 - limit:.3f}; improvement: p adj. < {SIGNIFICANCE} and B/A > {1 + limit:.3f}",
                  caption_justify="left")
    for header in HEADERS:
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
    return table


def _print_differences(err: Console, result: Diff) -> None:
    """What differs between the runs besides their numbers: environment, configurations."""
    for line in result.environment_changes:
        err.print(f"environment differs: {escape(line)}")
    for side, keys in (("A", result.only_a), ("B", result.only_b)):
        if keys:
            err.print(f"only in {side}: " + ", ".join(
                f"{k[0]}/{k[1]}/d{k[2]}/b{k[3]}" + ("" if k[6] else "/compute-only") for k in keys))


def _check_comparable(err: Console, result: Diff) -> None:
    """An error when nothing can be tested; a warning for the configurations that cannot."""
    if not result.rows:
        raise XbenchError("the runs share no measured configuration; nothing to compare")
    untested = result.untested
    if len(untested) == len(result.rows):
        raise XbenchError(f"none of the {len(result.rows)} shared configurations has 2 or more replicates in both "
                          "runs, so no difference can be tested; rerun them with --replicates 2 or more")
    if untested:
        err.print(f"[yellow]{len(untested)} configuration(s) have fewer than 2 replicates in a run: not tested "
                  "(n.s. says nothing there)[/]")


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
