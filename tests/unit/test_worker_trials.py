"""The worker runs a job's trials in turn, and a finished trial's state is gone before the next
trial starts, even where it holds reference cycles (as a framework's model state does): its
arrays would otherwise live on into the next trials and slow them."""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass
from typing import Any

from tests.support.fakes import NumpyBackend
from xbench.experiment.spec import load_spec
from xbench.run.plan import plan_trials
from xbench.worker.main import run_trials


@dataclass
class CyclicPrepared:
    info: Any
    loop: Any = None


class CyclicBackend(NumpyBackend):
    """Its prepared state refers to itself; `prepare` notes whether the last one still lives."""

    def __init__(self) -> None:
        self.last: weakref.ref | None = None
        self.found_alive: list[bool] = []

    def prepare(self, trial, work):
        self.found_alive.append(self.last is not None and self.last() is not None)
        prepared = CyclicPrepared(info=super().prepare(trial, work).info)
        prepared.loop = prepared
        self.last = weakref.ref(prepared)
        return prepared


def test_no_trial_starts_beside_the_last_ones_state():
    spec = load_spec(None, {"models": ["medium"], "batch_sizes": [16, 32, 64], "devices": [1], "samples": 64})
    backend, events = CyclicBackend(), []
    enabled = gc.isenabled()
    gc.disable()  # only the worker's own collection may free the cycles
    try:
        run_trials(backend, plan_trials(spec, ["numpy"]), events.append, lambda *_: {})
    finally:
        if enabled:
            gc.enable()
    assert backend.found_alive == [False, False, False]
    assert [type(e).__name__ for e in events].count("Result") == 3
    assert all(e.status == "ok" for e in events if type(e).__name__ == "Result")


class ForgetfulBackend(NumpyBackend):
    """Has `forget_trial`; notes, when a trial is prepared, how often it was called before."""

    def __init__(self, fails: bool = False) -> None:
        self.forgotten = 0
        self.fails = fails
        self.seen: list[int] = []

    def prepare(self, trial, work):
        self.seen.append(self.forgotten)
        return super().prepare(trial, work)

    def forget_trial(self) -> None:
        self.forgotten += 1
        if self.fails:
            raise RuntimeError("cache already gone")


def _three_trials(backend) -> list:
    spec = load_spec(None, {"models": ["medium"], "batch_sizes": [16, 32, 64], "devices": [1], "samples": 64})
    events: list = []
    run_trials(backend, plan_trials(spec, ["numpy"]), events.append, lambda *_: {})
    return [e.status for e in events if type(e).__name__ == "Result"]


def test_a_backend_forgets_each_trial_before_the_next_starts():
    backend = ForgetfulBackend()
    assert _three_trials(backend) == ["ok", "ok", "ok"]
    assert backend.seen == [0, 1, 2] and backend.forgotten == 3


def test_a_failing_forget_stops_no_trial(capsys):
    backend = ForgetfulBackend(fails=True)
    assert _three_trials(backend) == ["ok", "ok", "ok"]
    assert backend.seen == [0, 1, 2]
    assert "cache already gone" in capsys.readouterr().err
