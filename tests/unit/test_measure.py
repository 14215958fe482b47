"""The measurement protocol's window sizing, on a clock the test owns: a step costs exactly
what the fake backend says, however busy the machine is."""

import types

import pytest

from xbench.contract.timing import TimingProtocol
from xbench.worker import measure as measure_module
from xbench.worker.measure import measure, window_steps


class Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(measure_module, "time", types.SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


class SteppingBackend:
    """Each step advances the clock by `seconds`; counts the steps it was asked to run."""

    def __init__(self, clock, seconds):
        self.clock, self.seconds, self.steps = clock, seconds, 0

    def run(self, prepared, steps):
        self.steps += steps
        self.clock.now += self.seconds * steps


def test_short_windows_get_a_whole_multiple_of_steps(clock):
    backend = SteppingBackend(clock, 0.001)
    steps = window_steps(backend, None, TimingProtocol(steps=10, min_window_s=0.05))
    assert steps == 50  # 10 ms windows need 5x


def test_zero_min_window_keeps_the_steps_and_runs_nothing_extra(clock):
    backend = SteppingBackend(clock, 0.001)
    assert window_steps(backend, None, TimingProtocol(steps=10, min_window_s=0)) == 10
    assert backend.steps == 0


def test_measure_records_the_window_it_used(clock):
    backend = SteppingBackend(clock, 0.0005)
    result = measure(backend, None, TimingProtocol(warmup_steps=2, steps=4, repeats=3, min_window_s=0.01))
    assert result.steps_per_window == 20  # 4 steps take 2 ms; 10 ms windows need 5x
    assert len(result.window_s) == 3 and all(w == pytest.approx(0.01) for w in result.window_s)
