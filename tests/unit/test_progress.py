"""The progress display (`xbench.cli.progress`): named units, the time left, verification's
progress, and plain lines where stderr is not a terminal."""

from __future__ import annotations

import contextlib
import re

import pytest
from rich.console import Console

from xbench.cli.progress import Pace, ProgressObserver, duration, watching_verification
from xbench.experiment import load_spec
from xbench.run.plan import plan_trials
from xbench.run.verify_plan import verification_trials


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def trials(replicates: int = 2):
    spec = load_spec(None, {"models": ["medium"], "batch_sizes": [64], "devices": [2], "replicates": replicates,
                            "order_seed": 0})
    return plan_trials(spec, ["jax"], launchers={"jax": "subprocess"})


def ok_record(trial, window_s: float = 0.01, status: str = "ok") -> dict:
    record = {"trial_id": trial.id, "status": status, "reason": None if status == "ok" else "worker exit code 3",
              "trial": trial.to_dict()}
    if status == "ok":
        record["timing"] = {"window_s": [window_s] * 3, "steps_per_window": 2}
    return record


def terminal() -> Console:
    return Console(record=True, force_terminal=True, force_interactive=True, width=150, color_system=None)


def piped() -> Console:
    return Console(record=True, force_terminal=False, width=150, color_system=None)


def bar_text(observer: ProgressObserver) -> str:
    """The live display as it would be drawn now."""
    out = Console(record=True, width=150, color_system=None)
    out.print(observer.progress.make_tasks_table(observer.progress.tasks))
    return out.export_text()


def observed(console: Console, count: int = 4) -> tuple[ProgressObserver, Clock]:
    observer = ProgressObserver(console, count, repeats=3)
    clock = Clock()
    observer.pace.clock = clock
    observer.progress.disable = True  # drawn by bar_text, not by rich's refresh thread
    return observer, clock


def test_the_bar_names_the_replicate_its_configuration_and_window():
    observer, _ = observed(terminal())
    first = trials()[0]
    observer.trial_started(first)
    observer.window_done(first, 2)
    shown = bar_text(observer)
    assert f"replicate 1/4 · {first.id.replace('/', ' ')} · window 2/3" in shown
    assert "left" not in shown  # no time left before a replicate has finished


def test_the_time_left_appears_once_a_replicate_finished_and_follows_added_rounds():
    observer, clock = observed(terminal())
    first, second = trials()[:2]
    observer.trial_started(first)
    clock.now += 60
    observer.trial_finished(first, ok_record(first))
    assert "~03:00 left" in bar_text(observer)  # 3 more at 60 s each
    observer.trial_started(second)
    clock.now += 30
    assert "~02:30 left" in bar_text(observer)  # counting down
    observer.round_added(2, "round 3: 1 configuration(s) wider than ±10%, one more replicate each")
    assert "replicate 2/6" in bar_text(observer) and "~04:30 left" in bar_text(observer)


def test_pace_is_the_average_replicate_and_never_counts_skipped_ones():
    clock = Clock()
    pace = Pace(total=5, clock=clock)
    pace.finish()  # skipped before any ran: no time of its own
    pace.start()
    assert pace.remaining() is None
    clock.now += 40
    pace.finish()
    clock.now += 100  # the running one is late: the two after it still take 40 s each
    assert pace.remaining() == 80
    assert duration(41) == "41 s" and duration(150) == "2 min" and duration(3900) == "1 h 05 min"


def test_piped_output_is_a_plain_line_per_finished_replicate():
    console = piped()
    observer, clock = observed(console)
    assert not observer.live
    first, second = trials()[:2]
    observer.trial_started(first)
    clock.now += 41
    observer.trial_finished(first, ok_record(first, window_s=0.01))  # 64 samples in 5 ms
    observer.trial_started(second)
    observer.trial_finished(second, ok_record(second, status="crashed"))
    lines = console.export_text().splitlines()
    assert lines[0] == f"[1/4] {first.id.replace('/', ' ')}: 12,800 samples/s (41 s elapsed, ~2 min left)"
    assert lines[1].startswith(f"[2/4] {second.id.replace('/', ' ')}: crashed: worker exit code 3 (41 s elapsed")
    assert len(lines) == 2 and "\x1b" not in console.export_text(styles=True)


def medium_plan():
    """Verification's runs of jax on the medium MLP, 1 and 2 devices."""
    spec = load_spec(None, {"models": ["medium"], "devices": [2]})
    return verification_trials(spec, ["jax"], spec.devices)


@pytest.mark.parametrize("live", [True, False], ids=["terminal", "piped"])
def test_verification_says_which_run_and_how_many(live):
    console = terminal() if live else piped()
    planned = medium_plan()
    with watching_verification(console, "verifying identical work") as watch:
        watch.bar.disable = True
        watch.planned(planned)
        watch.trial_started(planned[0])
        watch.trial_started(planned[1])
        watch.trial_finished(planned[0], {"status": "ok"})
        table = watch.bar.make_tasks_table(watch.bar.tasks)
        drawn = Console(record=True, width=150, color_system=None)
        drawn.print(table)
    text = console.export_text()
    assert f"verifying identical work: {len(planned)} reference run(s)" in text
    assert f"verifying 1/{len(planned)} done · jax medium d2 fp32 running" in drawn.export_text()
    line = re.search(rf"verifying 1/{len(planned)}: jax medium d1 fp32: ok in \d+ s \(\d+ s elapsed\)", text)
    assert (line is None) == live  # a line per finished run where there is no live bar


@contextlib.contextmanager
def watched_plan():
    """A plain-line verification watch of `medium_plan()`'s runs, planned."""
    console, planned = piped(), medium_plan()
    with watching_verification(console, "verifying identical work") as watch:
        watch.bar.disable = True
        watch.planned(planned)
        yield console, watch, planned


def test_a_finished_verification_run_says_where_its_seconds_went():
    with watched_plan() as (console, watch, planned):
        for trial, phases in zip(planned, [{"work": 0.2, "gradients": 20.4, "train": 65.0}, {"work": 0.3}]):
            watch.trial_started(trial)
            watch.trial_finished(trial, {"status": "ok", "phases": phases})
    lines = [line for line in console.export_text().splitlines() if line.startswith("verifying 1") or
             line.startswith("verifying 2")]
    assert re.search(r": ok in \d+ s \(gradients 20 s, train 65 s\) \(\d+ s elapsed\)$", lines[0])  # under 1 s left out
    assert re.search(r": ok in \d+ s \(\d+ s elapsed\)$", lines[1])


def test_runs_again_alone_are_said_and_counted():
    with watched_plan() as (console, watch, planned):
        watch.trial_started(planned[0])
        watch.trial_finished(planned[0], {"status": "failed", "reason": "CUDA out of memory"})
        watch.again(planned[:1])
        watch.trial_started(planned[0])
        watch.trial_finished(planned[0], {"status": "ok"})
        assert watch.bar.tasks[0].total == len(planned) + 1
    text = console.export_text()
    assert "1 run(s) ran out of memory beside others: again, one at a time" in text
    assert f"verifying 2/{len(planned) + 1}: jax medium d1 fp32: ok" in text
