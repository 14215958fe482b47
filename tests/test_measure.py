import time

from xbench.measure import measure, window_steps
from xbench.spec import Protocol


class SleepingBackend:
    """Each step takes `seconds`; counts the steps it was asked to run."""

    def __init__(self, seconds):
        self.seconds, self.steps = seconds, 0

    def run(self, prepared, steps):
        self.steps += steps
        time.sleep(self.seconds * steps)


def test_short_windows_get_a_whole_multiple_of_steps():
    backend = SleepingBackend(0.001)
    steps = window_steps(backend, None, Protocol(steps=10, min_window_s=0.05))
    assert steps % 10 == 0 and 50 <= steps <= 60  # 10 ms windows need about 5x


def test_zero_min_window_keeps_the_steps_and_runs_nothing_extra():
    backend = SleepingBackend(0.001)
    assert window_steps(backend, None, Protocol(steps=10, min_window_s=0)) == 10
    assert backend.steps == 0


def test_measure_records_the_window_it_used():
    backend = SleepingBackend(0.0005)
    result = measure(backend, None, Protocol(warmup_steps=2, steps=4, repeats=3, min_window_s=0.01))
    assert result.steps_per_window % 4 == 0 and result.steps_per_window >= 20
    assert len(result.window_s) == 3 and all(w >= 0.009 for w in result.window_s)
