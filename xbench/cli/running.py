"""What `xbench compare` and `xbench sweep` share to carry out a prepared run: the checks on
their --out and --resume options, the progress display and messages while it runs, and the
tables, report and summary lines after it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from xbench.cli.consoles import data_console, status_console
from xbench.cli.stored_runs import make_report
from xbench.contract import Trial
from xbench.errors import Interrupted, XbenchError
from xbench.report.terminal import busbw_by_size, devices_line, model_tables
from xbench.report.words import busy_text
from xbench.results.records import RECORDS_FILE, RUN_FILE, Record, finished_trials, iter_records, last_line_torn
from xbench.results.summary import Row, busy_host, rows_from_records
from xbench.run import compare as comparison
from xbench.run.adaptive import reached

# The options --resume may come with: the rest would change the run's own spec.
RESUME_ALLOWS = {"resume", "no_verify", "startup_timeout", "startup"}


def check_resume_alone(given: dict[str, Any]) -> None:
    """--resume takes the run's own spec; anything that would change it is an error."""
    # `is not`, not `in`: 0 == False, and --seed 0 is a change the run would ignore.
    changed = [name for name, v in given.items() if name not in RESUME_ALLOWS and v is not None and v is not False]
    if changed:
        flags = ", ".join("--" + name.replace("_", "-") for name in changed)
        raise XbenchError(f"--resume reruns the run's own spec; drop {flags}")


def run_dir_option(out: str | None) -> Path | None:
    """--out as a path; an empty one would mean the current directory, which is never meant."""
    if out is None:
        return None
    if not out.strip():
        raise XbenchError("--out is empty; name a new or empty directory, e.g. --out results/my-run")
    return Path(out)


def run_plan(plan: comparison.Comparison, no_verify: bool, resumed: bool = False, command: str = "compare") -> int:
    """Print what runs where, call the orchestrator under a progress display, print the tables;
    the run directory is released however this ends. Returns the command's exit code;
    `command` is the one that finishes an interrupted run with --resume."""
    try:
        return _run_locked(plan, no_verify, resumed, command)
    finally:
        plan.release()


def _run_locked(plan: comparison.Comparison, no_verify: bool, resumed: bool, command: str) -> int:
    err = status_console()
    for name, info in plan.devices.items():
        err.print(devices_line(name, info, plan.launchers.get(name, "subprocess")))
    done = finished_trials(plan.run_dir) if resumed else set()
    if resumed:
        _announce_resume(err, plan, done)
    protocol = plan.spec.protocol
    err.print(f"{protocol.replicates} replicate(s) per configuration (fresh worker processes), "
              f"in a shuffled order (order seed {protocol.order_seed})")
    try:
        with ProgressObserver(err, comparison.trial_count(plan, done), protocol.repeats) as observer:
            outcome = comparison.run(plan, observer, no_verify=no_verify, resumed=resumed)
    except KeyboardInterrupt:
        raise Interrupted(_interrupted_message(plan.run_dir, command)) from None
    return _finish(err, plan, outcome)


def _announce_resume(err: Console, plan: comparison.Comparison, done: set[str]) -> None:
    torn = last_line_torn(plan.run_dir / RECORDS_FILE)
    if torn:
        err.print(f"{plan.run_dir / RECORDS_FILE}:{torn} was cut off mid-write (an interrupted append); "
                  "dropped, and its trial runs again")
    err.print(f"resuming {plan.run_dir}: {len(done)} trial(s) already recorded, "
              f"{comparison.trial_count(plan, done)} to run")


def _finish(err: Console, plan: comparison.Comparison, outcome: comparison.Outcome) -> int:
    """The tables on stdout, the summary and the report on stderr; 1 when anything failed."""
    console = data_console()
    rows = rows_from_records(outcome.records)
    for table in model_tables(rows, busbw_by_size(outcome.allreduce)):
        console.print(table)
    if any(info["simulated"] for info in plan.devices.values()):
        err.print("note: simulated CPU devices share this machine's cores; these numbers test the "
                  "harness and the frameworks' CPU paths, not multi-GPU scaling.")
    err.print(f"{len(outcome.records)} trial replicate(s) in {outcome.seconds:.0f} s; "
              f"records: {plan.run_dir / RECORDS_FILE}")
    _say_precision(err, plan, rows)
    busy = busy_host(outcome.records)
    if busy is not None:
        err.print(f"[yellow]{escape(busy_text(busy))}[/]")
    err.print(f"report: {make_report(plan.run_dir, html=True)[0]}")
    if outcome.failures:
        err.print(f"[red]{outcome.failures} trial(s) or all-reduce measurement(s) failed or did not pass "
                  f"verification[/]; reasons in the tables, verify.json and {plan.run_dir / 'workers.log'}")
        return 1
    return 0


def _say_precision(err: Console, plan: comparison.Comparison, rows: list[Row]) -> None:
    """How many intervals reached the spec's target, and what would narrow the rest."""
    protocol = plan.spec.protocol
    within, targeted, floored = reached(rows)
    if not targeted or not protocol.interval_target:
        return
    target = f"±{100 * protocol.interval_target:.3g}%"
    line = f"{within} of {targeted} configuration(s) within {target} (95% interval)"
    if within + floored < targeted:
        line += (f"; {targeted - within - floored} (marked \"wide\") need more replicates: a longer --time-budget than "
                 f"{protocol.time_budget_s:g} s, or a larger --max-replicates than {protocol.max_replicates}")
    if floored:
        line += (f"; {floored} cannot reach {target}: this machine's run-to-run variation (--run-variation "
                 f"{protocol.run_variation:g}) alone is wider")
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


def _report_verification(err: Console, outcome: Mapping[str, Mapping[str, Any]]) -> None:
    for backend, result in outcome.items():
        if result["status"] == "passed" and not result["checks"]:
            err.print(f"verify {backend}: nothing to compare (one backend on one device); timing it")
        elif result["status"] == "passed":
            err.print(f"verify {backend}: [green]passed[/] ({result['checks']} checks; details in verify.json)")
        elif result["status"] == "unverifiable":
            err.print(f"verify {backend}: [yellow]not verifiable[/] ({escape(result['reason'])}); timing it anyway")
        else:
            err.print(f"verify {backend}: [red]FAILED[/], its trials are skipped:")
            for line in result["failed"]:
                err.print(f"  {escape(line)}")


class ProgressObserver:
    """A progress bar over timed windows, and the run's messages, on stderr
    (a `xbench.run.compare.Observer`)."""

    def __init__(self, console: Console, trials: int, repeats: int) -> None:
        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.trials = trials
        self.task = self.progress.add_task("starting", total=trials * repeats)
        self.repeats = repeats
        self.finished = 0
        self.current: str | None = None
        self.windows = 0

    def phase(self, text: str) -> Any:
        self.progress.stop()  # rich shows one live display at a time
        return self.console.status(text)

    def verified(self, outcome: Mapping[str, Mapping[str, Any]]) -> None:
        _report_verification(self.progress.console, outcome)

    def note(self, text: str) -> None:
        self.progress.console.print(f"[yellow]{escape(text)}[/]")

    def round_added(self, trials: int, text: str) -> None:
        self.trials += trials
        self.progress.update(self.task, total=self.trials * self.repeats)
        self.progress.console.print(escape(text))

    def __enter__(self) -> ProgressObserver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def trial_started(self, trial: Trial) -> None:
        self.progress.start()  # after verification: one live display at a time
        self.current, self.windows = trial.id, 0
        self.progress.update(self.task, description=f"[{self.finished + 1}/{self.trials}] {trial.id}")

    def window_done(self, trial: Trial, done: int) -> None:
        self.progress.advance(self.task, done - self.windows)
        self.windows = done

    def trial_finished(self, trial: Trial, record: Record) -> None:
        # Skipped trials never started; windows may stop before `repeats` (steady, or out of budget).
        counted = self.windows if self.current == trial.id else 0
        self.progress.advance(self.task, self.repeats - counted)
        self.current, self.windows = None, 0
        self.finished += 1
        if record["status"] != "ok":
            self.progress.console.print(f"{trial.id}: {record['status']}: {escape(str(record.get('reason')))}")
