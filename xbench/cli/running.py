"""What `xbench compare` and `xbench sweep` share to carry out a prepared run: the checks on
their --out and --resume options, the progress display and messages while it runs, and the
tables, report and summary lines after it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from xbench.cli.consoles import data_console, status_console
from xbench.cli.progress import ProgressObserver
from xbench.cli.stored_runs import make_report
from xbench.errors import Interrupted, XbenchError
from xbench.experiment import Spec
from xbench.report.bottom_line import bottom_line
from xbench.report.terminal import bottom_line_text, busbw_by_size, devices_line, model_tables
from xbench.report.words import busy_text, left_out_line
from xbench.results.conditions import busy_host
from xbench.results.control import read_controls
from xbench.results.records import RECORDS_FILE, RUN_FILE, finished_trials, iter_records, last_line_torn
from xbench.results.schema import LOG_FILE
from xbench.results.summary import Row, rows_from_records
from xbench.run import compare
from xbench.run.adaptive import reached
from xbench.run.cluster import Launch
from xbench.run.comparison import Comparison, trial_count
from xbench.run.estimate import plan_lines
from xbench.run.resume import complete
from xbench.run.verify_phase import verifies

# The options --resume may come with: the rest would change the run's own spec.
RESUME_ALLOWS = {"resume", "no_verify", "startup_timeout", "startup", "wide"}  # "wide": how tables print


def check_resume_alone(given: dict[str, Any]) -> None:
    """--resume takes the run's own spec; anything that would change it is an error."""
    # `is not`, not `in`: 0 == False, and --seed 0 is a change the run would ignore.
    changed = [name for name, v in given.items() if name not in RESUME_ALLOWS and v is not None and v is not False]
    if changed:
        flags = ", ".join("--" + name.replace("_", "-") for name in changed)
        raise XbenchError(f"--resume reruns the run's own spec; drop {flags}")


def print_plan(spec: Spec, launch: Launch, breakdown: bool, no_verify: bool) -> int:
    """--dry-run: the plan and its estimated cost on stdout, checked as the run would check it;
    no worker starts and nothing is written."""
    resolved_spec, found = compare.dry_run(spec, launch, breakdown, no_verify)
    console = data_console()
    backends = ", ".join(resolved_spec.backends)
    console.print(escape(f"dry run: {backends} on {'/'.join(map(str, resolved_spec.devices))} device(s); "
                         "nothing started (once a run finds the devices, a count no backend has is left out, "
                         "or refused if --devices asked for it)"),
                  soft_wrap=True)
    for line in plan_lines(found, resolved_spec.protocol.replicates or 1):
        console.print(escape(line), soft_wrap=True)
    return 0


def run_dir_option(out: str | None) -> Path | None:
    """--out as a path; an empty one would mean the current directory, which is never meant."""
    if out is None:
        return None
    if not out.strip():
        raise XbenchError("--out is empty; name a new or empty directory, e.g. --out results/my-run")
    return Path(out)


def run_comparison(comparison: Comparison, no_verify: bool, resumed: bool = False, command: str = "compare",
             wide: bool = False) -> int:
    """Print what runs where, call the orchestrator under a progress display, print the tables;
    the run directory is released however this ends. Returns the command's exit code;
    `command` is the one that finishes an interrupted run with --resume."""
    try:
        return _run_locked(comparison, no_verify, resumed, command, wide)
    finally:
        comparison.release()


def _run_locked(comparison: Comparison, no_verify: bool, resumed: bool, command: str, wide: bool) -> int:
    err = status_console()
    if resumed and complete(comparison):
        return _report_complete(err, comparison, wide)
    for name, info in comparison.devices.items():
        err.print(devices_line(name, info, comparison.launchers.get(name, "subprocess")))
    if comparison.left_out:
        err.print(left_out_line(comparison.left_out, comparison.spec.devices))
    done = finished_trials(comparison.run_dir) if resumed else set()
    if resumed:
        _announce_resume(err, comparison, done)
    protocol = comparison.spec.protocol
    err.print(f"{protocol.replicates} replicate(s) per configuration (fresh worker processes), "
              f"in a shuffled order (order seed {protocol.order_seed})")
    verifying = verifies(comparison.run_dir, comparison.implementations, no_verify, resumed)
    for line in plan_lines(compare.planned_cost(comparison, not verifying, done), protocol.replicates or 1):
        err.print(escape(line))
    try:
        with ProgressObserver(err, trial_count(comparison, done), protocol.repeats) as observer:
            outcome = compare.run(comparison, observer, no_verify=no_verify, resumed=resumed)
    except KeyboardInterrupt:
        raise Interrupted(_interrupted_message(comparison.run_dir, command)) from None
    return _finish(err, comparison, outcome, wide)


def _announce_resume(err: Console, comparison: Comparison, done: set[str]) -> None:
    torn = last_line_torn(comparison.run_dir / RECORDS_FILE)
    if torn:
        err.print(f"{comparison.run_dir / RECORDS_FILE}:{torn} was cut off mid-write (an interrupted append); "
                  "dropped, and its trial runs again")
    err.print(f"resuming {comparison.run_dir}: {len(done)} trial(s) already recorded, "
              f"{trial_count(comparison, done)} to run")


def _report_complete(err: Console, comparison: Comparison, wide: bool) -> int:
    """A --resume of a run with nothing left to run: say so at once, then its tables, summary
    and report from its records; nothing is verified or timed."""
    outcome = compare.recorded(comparison)
    err.print(f"{comparison.run_dir} is already complete ({len(outcome.records)} replicate(s) recorded); "
              "nothing to run")
    return _finish(err, comparison, outcome, wide)


def _finish(err: Console, comparison: Comparison, outcome: compare.Outcome, wide: bool) -> int:
    """The tables on stdout, the summary and the report on stderr; 1 when anything failed."""
    console = data_console()
    rows = rows_from_records(outcome.records)
    for table in model_tables(rows, busbw_by_size(outcome.allreduce), wide=wide, width=console.width):
        console.print(table)
        console.print()
    err.print(f"{outcome.tally} in {outcome.seconds:.0f} s; "
              f"records: {comparison.run_dir / RECORDS_FILE}")
    _say_precision(err, comparison, rows)
    busy = busy_host(outcome.records)
    if busy is not None:
        err.print(f"[yellow]{escape(busy_text(busy))}[/]")
    err.print(f"report: {make_report(comparison.run_dir, html=True)[0]}")
    found = bottom_line(rows, read_controls(comparison.run_dir))
    if found:
        console.print()
        console.print(bottom_line_text(found))
    if outcome.failures:
        err.print(f"[red]{outcome.failures} trial(s) or all-reduce measurement(s) failed or did not pass "
                  f"verification[/]; reasons in the tables, verify.json and {comparison.run_dir / LOG_FILE}")
        return 1
    return 0


def _say_precision(err: Console, comparison: Comparison, rows: list[Row]) -> None:
    """How many intervals reached the spec's target, and what would narrow the rest."""
    protocol = comparison.spec.protocol
    within, targeted, floored = reached(rows)
    if not targeted or not protocol.interval_target:
        return
    target = f"±{100 * protocol.interval_target:.3g}%"
    line = f"{within} of {targeted} configuration(s) within {target} (95% interval)"
    if within + floored < targeted:
        line += (f"; {targeted - within - floored} (marked \"wide\") need more replicates: a longer --time-budget than "
                 f"{protocol.time_budget_s:g} s, or a larger --max-replicates than {protocol.max_replicates}")
    if floored:
        device = 1.96 * (protocol.device_run_variation or 0.0) >= protocol.interval_target
        line += (f"; {floored} cannot reach {target}: this machine's run-to-run variation (--run-variation "
                 f"{protocol.run_variation:g}"
                 + (f", --device-run-variation {protocol.device_run_variation:g}" if device else "")
                 + ") alone is wider")
    err.print(line)


def _interrupted_message(run_dir: Path, command: str) -> str:
    """What was kept, and the command (`compare` or `sweep`) that finishes the run."""
    records = run_dir / RECORDS_FILE
    kept = sum(1 for _ in iter_records(records)) if records.exists() else 0
    if kept:
        return (f"interrupted; {kept} finished trial record(s) kept in {records}; "
                f"`xbench {command} --resume {run_dir}` runs the rest")
    if (run_dir / RUN_FILE).exists():
        return (f"interrupted before any trial finished; nothing was measured yet; "
                f"`xbench {command} --resume {run_dir}` starts it again")
    return "interrupted before the run started; nothing was written"
