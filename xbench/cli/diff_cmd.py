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
from xbench.errors import XbenchError, brief
from xbench.results.control import Movement, movements, read_controls
from xbench.results.diff import TOO_NOISY, UNDERPOWERED, Diff, diff_runs
from xbench.results.records import read_records
from xbench.stats import SIGNIFICANCE

HEADERS = ("model", "program", "dev", "batch", "A samples/s", "B samples/s", "B/A", "95% CI", "p adj.", "detects",
           "reps", "change")
UNDERPOWERED_EXIT = 4


def diff(
    a: Annotated[Path, typer.Argument(metavar="A", help="The baseline run directory.")],
    b: Annotated[Path, typer.Argument(metavar="B", help="The run to compare with it.")],
    threshold: Annotated[str, typer.Option(
        metavar="PERCENT", help="Slowdown that counts as a regression, e.g. 5% or 0.05.")] = "5%",
    fail_underpowered: Annotated[bool, typer.Option(
        "--fail-underpowered",
        help=f"Exit {UNDERPOWERED_EXIT} when a configuration could not have detected a change of the threshold's "
             "size (too few replicates, or a machine too noisy between runs; for CI: no silent pass).")] = False,
) -> int:
    """Compare B with A per configuration; exit 1 when B is significantly slower beyond the threshold."""
    limit = parse_threshold(threshold)
    for run_dir in (a, b):
        note_torn_records(run_dir)
    result = diff_runs(read_records(a), read_records(b))
    data_console().print(diff_table(result, a, b, limit))
    err = status_console()
    _print_differences(err, result)
    _print_machine(err, movements(read_controls(a), read_controls(b)))
    _check_comparable(err, result)
    regressions = result.regressions(limit)
    changed = [row for row in result.rows if row.change(limit) in ("regression", "improvement")]
    shown = f"{100 * limit:.3g}%"
    err.print(f"{len(changed)} of {len(result.rows)} configuration(s) changed significantly beyond {shown}")
    if regressions:
        err.print(f"[red]{len(regressions)} significant slowdown(s) beyond {shown}[/]")
        return 1
    _say_power(err, result, limit)
    underpowered = result.underpowered(limit)
    among = " among the configurations that could detect one" if underpowered else ""
    err.print(f"no significant slowdown beyond {shown}{among}")
    return UNDERPOWERED_EXIT if underpowered and fail_underpowered else 0


def _say_power(err: Console, result: Diff, limit: float) -> None:
    """Which configurations could not have detected a change of the threshold's size, and what
    would decide them."""
    shown = f"{100 * limit:.3g}%"
    few = [row for row in result.rows if row.change(limit) == UNDERPOWERED]
    noisy = [row for row in result.rows if row.change(limit) == TOO_NOISY]
    if few:
        err.print(f"[yellow]{len(few)} configuration(s) could not detect a change of {shown} (detects: the smallest "
                  "change each would find significant 80% of the time): more replicates in both runs "
                  "(--replicates, or a longer --time-budget) would decide them[/]")
    if noisy:
        floor = min(row.floor for row in noisy)
        err.print(f"[yellow]{len(noisy)} configuration(s) could not detect a change of {shown} whatever their "
                  f"replicates: this machine's run-to-run variation (run_variation or device_run_variation in the "
                  f"runs' spec) alone hides "
                  f"changes below {100 * floor:.3g}%; compare with a larger --threshold, or on a quieter machine[/]")


def diff_table(result: Diff, a: Path, b: Path, limit: float) -> Table:
    """One row per configuration both runs measured: their throughputs, the ratio and its tests."""
    table = Table(title=f"xbench diff: B = {b} over A = {a}", title_justify="left",
                  caption=f"B/A: ratio of (geometric) mean throughputs with its 95% interval, from the replicate "
                          f"means with each backend's pooled spread (reps: A/B replicates); p adj.: its test after "
                          f"Holm's correction over the {len(result.rows)} configurations (the runs' run-to-run "
                          f"variation counts too: run_variation on simulated CPU devices and host-bound rows, "
                          f"device_run_variation on the others); detects: the smallest "
                          f"change the row would find significant 80% of the time; regression: p adj. < "
                          f"{SIGNIFICANCE} and B/A < {1 - limit:.3f}; improvement: p adj. < {SIGNIFICANCE} and B/A > "
                          f"{1 + limit:.3f}; no change: not significant where detects ≤ {100 * limit:.3g}%",
                  caption_justify="left")
    for header in HEADERS:
        table.add_column(header, justify="left" if header in ("model", "program", "change") else "right")
    for row in result.rows:
        backend, model, devices, batch, _, _, all_reduce = row.key
        model = model if all_reduce else f"{model} (compute-only)"
        r, change = row.ratio, row.change(limit)
        style = {"regression": "[red]", "improvement": "[green]", UNDERPOWERED: "[yellow]",
                 TOO_NOISY: "[yellow]"}.get(change, "")
        table.add_row(model, backend, str(devices), str(batch), f"{row.a_mean:,.0f}", f"{row.b_mean:,.0f}",
                      f"{r.ratio:.3f}", "" if r.ci_low != r.ci_low else f"{r.ci_low:.3f}–{r.ci_high:.3f}",
                      _p_text(row.adjusted_p), _detects_text(row.detectable), f"{row.a_replicates}/{row.b_replicates}",
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


def _print_machine(err: Console, found: list[Movement]) -> None:
    """Whether the machine itself moved between the runs (the drift control of each run)."""
    if not found:
        return
    ratios = ", ".join(f"{m.workload} time B/A {m.ratio:.2f} (within a run ±{m.within:.0%})" for m in found)
    moved = [m.workload for m in found if m.moved]
    if moved:
        err.print(f"[yellow]the machine moved between the runs ({ratios}): a change in host-bound configurations "
                  f"may be the machine's ({', '.join(moved)}), not the code's[/]")
    else:
        err.print(f"machine control: {ratios}; the machine did not move")


def _check_comparable(err: Console, result: Diff) -> None:
    """An error when nothing can be tested; a warning for the configurations that cannot."""
    if not result.rows:
        raise XbenchError("the runs share no measured configuration; nothing to compare")
    untested = result.untested
    if len(untested) == len(result.rows):
        raise XbenchError(f"none of the {len(result.rows)} shared configurations has a spread in both runs (2 or "
                          "more replicates), so no difference can be tested; rerun them with --replicates 2 or more")
    if untested:
        err.print(f"[yellow]{len(untested)} configuration(s) have no spread in a run (one replicate): not tested[/]")


def _detects_text(change: float) -> str:
    """e.g. "7.3%"; beyond a tenfold change (one replicate's degree of freedom on a side can put
    it in the billions) the exact figure says nothing more."""
    if change != change:
        return "n/a"
    return ">1000%" if change > 10 else f"{change:.1%}"


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
        raise XbenchError(f"--threshold takes a fraction such as 5% or 0.05, got {brief(text)}")
    return value
