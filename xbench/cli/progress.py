"""What a run shows while it works, on stderr. On an interactive terminal: a live bar that names
what it counts (the verification runs; then the replicate, its configuration and its timed
windows) and, once a replicate has finished, the time left. Elsewhere (a pipe, CI, `tee`): no
live display, one plain line as each thing happens, written at once."""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, Task, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column
from rich.text import Text

from xbench.contract import Trial
from xbench.report.words import duration
from xbench.results.records import Record
from xbench.results.summary import throughput_samples


def trial_label(trial: Trial) -> str:
    """A timed replicate as the lines name it: "jax medium d2 b64 r2"."""
    return trial.id.replace("/", " ")


def verification_label(trial: Trial) -> str:
    """A verification run as the lines name it: "jax medium d2 fp32", "torch plain medium d1 fp64"."""
    return f"{trial.implementation} {trial.model.name} d{trial.devices} {trial.precision}"


def record_result(record: Record) -> str:
    """What a finished replicate measured ("12,345 samples/s", the median of its windows), or
    why it did not."""
    samples = throughput_samples(record) if record["status"] == "ok" and record.get("timing") else ()
    if len(samples):
        return f"{statistics.median(samples):,.0f} samples/s"
    reason = record.get("reason")
    return f"{record['status']}: {reason}" if reason else str(record["status"])


def _phases(record: Record) -> str:
    """Where a verification run's seconds went, the phases of a second or more, and its
    framework's peak memory where it reported one: " (gradients 20 s, train 25 s; peak 12.3
    GiB)"; nothing when none took that long and no peak was recorded."""
    shown = [f"{name} {duration(seconds)}" for name, seconds in record.get("phases", {}).items() if seconds >= 1]
    memory = record.get("framework_memory")
    # a peak of the worker's, not the run's own (a counter a framework cannot reset) only bounds it
    bound = "" if memory and memory.get("scope") == "trial" else "<= "
    peak = f"peak {bound}{max(memory['peak_bytes']) / 2**30:.1f} GiB" if memory and memory.get("peak_bytes") else ""
    inside = "; ".join(part for part in (", ".join(shown), peak) if part)
    return f" ({inside})" if inside else ""


@dataclass
class Pace:
    """How far the timed replicates are, and the time left: the replicates to go at the
    average time a replicate has taken so far (starting its worker and compiling included),
    counting down from the last one's end."""

    total: int  # replicates to run (an adaptive round adds to it)
    finished: int = 0  # replicates finished: timed, failed or skipped
    fraction: float = 0.0  # of the running one: its timed windows done, of those planned
    started: float | None = None  # when the first one started (time.monotonic)
    before: int = 0  # replicates finished before then (skipped: verification failed); they took no time
    last: float = 0.0  # when the last one finished
    clock: Callable[[], float] = time.monotonic

    def start(self) -> None:
        if self.started is None:
            self.started, self.before = self.clock(), self.finished

    def finish(self) -> None:
        self.finished, self.fraction, self.last = self.finished + 1, 0.0, self.clock()

    @property
    def done(self) -> float:
        return min(self.total, self.finished + self.fraction)

    @property
    def elapsed(self) -> float:
        return 0.0 if self.started is None else self.clock() - self.started

    def remaining(self) -> float | None:
        """Seconds left, once a replicate has finished since the first started; None before
        that, and once none is left."""
        to_go = self.total - self.finished
        if self.started is None or self.finished <= self.before or to_go <= 0:
            return None
        each = (self.last - self.started) / (self.finished - self.before)
        # The running replicate may be late, but those after it still take their time.
        return max(each * (to_go - 1), each * to_go - (self.clock() - self.last), 0.0)


class TimeLeft(TimeRemainingColumn):
    """Rich's time-remaining column from the run's own `Pace` (rich's estimate spans the last
    30 s of progress, and forgets it when an adaptive round grows the total); empty until a
    replicate has finished, and for a task without a pace (verification)."""

    def render(self, task: Task) -> Text:
        pace = task.fields.get("pace")
        left = pace.remaining() if isinstance(pace, Pace) else None
        if left is None:
            return Text("")
        minutes, seconds = divmod(int(left), 60)
        hours, minutes = divmod(minutes, 60)
        clock = f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes:02d}:{seconds:02d}"
        return Text(f"~{clock} left", style="progress.remaining")


def progress_bar(console: Console) -> Progress:
    """The live display: off (no output of its own) where the console is not an interactive
    terminal."""
    described = TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis"))
    return Progress(described, BarColumn(), TimeElapsedColumn(), TimeLeft(), console=console, transient=True,
                    disable=not console.is_interactive)


@dataclass
class VerificationWatch:
    """Verification's progress (an `xbench.run.verification.Progress`): the runs done of those
    planned and those running, on the live bar; on other consoles a line as each one ends.
    Its callbacks come from several threads at once."""

    console: Console
    bar: Progress
    text: str  # what verification is, e.g. "verifying identical work and all-reduce"
    live: bool = False  # a live bar (an interactive terminal), else plain lines
    total: int = 0
    done: int = 0
    running: dict[str, str] = field(default_factory=dict)  # trial id -> its label
    began: dict[str, float] = field(default_factory=dict)  # trial id -> when its worker began it
    started: float = field(default_factory=time.monotonic)
    task: TaskID | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def planned(self, trials: Sequence[Trial]) -> None:
        with self.lock:
            self.total = len(trials)
            self.console.print(f"{escape(self.text)}: {self.total} reference run(s)")
            self.task = self.bar.add_task(self._description(), total=self.total)
            self.bar.start()

    def again(self, trials: Sequence[Trial]) -> None:
        with self.lock:
            self.total += len(trials)
            self.console.print(f"{len(trials)} run(s) ran out of memory beside others: again, one at a time")
            if self.task is not None:
                self.bar.update(self.task, total=self.total)
            self._show()

    def trial_started(self, trial: Trial) -> None:
        with self.lock:
            self.running[trial.id] = verification_label(trial)
            self.began[trial.id] = time.monotonic()
            self._show()

    def window_done(self, trial: Trial, done: int) -> None:
        pass

    def trial_finished(self, trial: Trial, record: Record) -> None:
        with self.lock:
            self.running.pop(trial.id, None)
            self.done += 1
            began = self.began.pop(trial.id, None)
            if not self.live:
                status = "ok" if record["status"] == "ok" else escape(record_result(record))
                # A run's own seconds (from its start in the worker, or the worker's start for
                # one that never started) say where verification's time goes.
                took = "" if began is None else f" in {duration(time.monotonic() - began)}{_phases(record)}"
                self.console.print(f"verifying {self.done}/{self.total}: {verification_label(trial)}: {status}{took} "
                                   f"({duration(time.monotonic() - self.started)} elapsed)", soft_wrap=True)
            self._show()

    def close(self) -> None:
        if self.task is not None:
            self.bar.remove_task(self.task)
            self.task = None

    def _show(self) -> None:
        if self.task is not None:
            self.bar.update(self.task, completed=self.done, description=self._description())

    def _description(self) -> str:
        """e.g. "verifying 1/4 done · jax medium d2 fp32 and 1 more running"."""
        labels = list(self.running.values())
        more = f" and {len(labels) - 1} more" if len(labels) > 1 else ""
        running = f" · {labels[0]}{more} running" if labels else ""
        return escape(f"verifying {self.done}/{self.total} done{running}")


@contextlib.contextmanager
def watching_verification(console: Console, text: str, bar: Progress | None = None) -> Iterator[VerificationWatch]:
    """A `VerificationWatch` for the duration (on a bar of its own unless given one)."""
    own = bar is None
    watch = VerificationWatch(console, bar or progress_bar(console), text, console.is_interactive)
    try:
        yield watch
    finally:
        watch.close()
        if own:
            watch.bar.stop()


def report_verification(console: Console, outcome: Mapping[str, Mapping[str, Any]]) -> None:
    """Each program's verification outcome, a line each."""
    for backend, result in outcome.items():
        if result["status"] == "passed" and not result["checks"]:
            console.print(f"verify {backend}: nothing to compare (one backend on one device); timing it")
        elif result["status"] == "passed":
            console.print(f"verify {backend}: [green]passed[/] ({result['checks']} checks; details in verify.json)")
        elif result["status"] == "unverifiable":
            console.print(f"verify {backend}: [yellow]not verifiable[/] ({escape(result['reason'])}); timing it anyway")
        else:
            console.print(f"verify {backend}: [red]FAILED[/], its trials are skipped:")
            for line in result["failed"]:
                console.print(f"  {escape(line)}")


class ProgressObserver:
    """The run's progress and messages on stderr (a `xbench.run.compare.Observer`): a live bar
    on an interactive terminal, plain lines elsewhere."""

    def __init__(self, console: Console, trials: int, repeats: int) -> None:
        self.console = console
        self.live = console.is_interactive  # else plain lines: a pipe, CI, a dumb terminal
        self.progress = progress_bar(console)
        self.pace = Pace(trials)
        self.repeats = repeats
        self.task: TaskID | None = None  # the timing bar, from the first replicate on

    def phase(self, text: str) -> Any:
        if not self.live:
            self.console.print(escape(text))
            return contextlib.nullcontext()
        self.progress.stop()  # rich shows one live display at a time
        return self.console.status(text)

    def verifying(self, text: str) -> Any:
        return watching_verification(self.console, text, self.progress)

    def verified(self, outcome: Mapping[str, Mapping[str, Any]]) -> None:
        report_verification(self.console, outcome)

    def note(self, text: str) -> None:
        self.console.print(f"[yellow]{escape(text)}[/]")

    def round_added(self, trials: int, text: str) -> None:
        self.pace.total += trials
        self.console.print(escape(text))
        self._show()

    def __enter__(self) -> ProgressObserver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def trial_started(self, trial: Trial) -> None:
        self.pace.start()
        self.pace.fraction = 0.0
        if self.task is None:
            self.task = self.progress.add_task("", total=self.pace.total, pace=self.pace)
        self._show(f"{trial_label(trial)} · window 0/{self.repeats}")
        self.progress.start()  # after verification or a phase: one live display at a time

    def window_done(self, trial: Trial, done: int) -> None:
        self.pace.fraction = min(1.0, done / max(1, self.repeats))
        self._show(f"{trial_label(trial)} · window {done}/{self.repeats}")

    def trial_finished(self, trial: Trial, record: Record) -> None:
        self.pace.finish()
        if not self.live:
            self.console.print(self._finished_line(trial, record), soft_wrap=True)  # one line, however long
        elif record["status"] != "ok":
            self.console.print(f"{trial.id}: {record['status']}: {escape(str(record.get('reason')))}")
        self._show()

    def _finished_line(self, trial: Trial, record: Record) -> str:
        """e.g. "[3/32] jax medium d2 b64 r2: 12,345 samples/s (41 s elapsed, ~2 min left)"."""
        left = self.pace.remaining()
        when = duration(self.pace.elapsed) + " elapsed" + (f", ~{duration(left)} left" if left is not None else "")
        count = f"[{self.pace.finished}/{self.pace.total}]"
        return escape(f"{count} {trial_label(trial)}: {record_result(record)} ({when})")

    def _show(self, what: str | None = None) -> None:
        if self.task is None:
            return
        running = min(self.pace.finished + 1, self.pace.total)
        description = f"replicate {running}/{self.pace.total}" + (f" · {what}" if what else "")
        self.progress.update(self.task, total=self.pace.total, completed=self.pace.done,
                             description=escape(description))
