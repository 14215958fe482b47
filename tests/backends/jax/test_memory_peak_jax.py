"""jax's peak-memory counter covers its worker process and cannot be reset: the backend says
which readings are a trial's own (the peak rose during it) and which only bound it."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

from xbench_backends.jax.pmap import JaxPmapBackend  # noqa: E402


class Device:
    """A GPU as jax reports its memory: the process's peak so far."""

    platform = "gpu"
    process_index = 0

    def __init__(self) -> None:
        self.peak = 0

    def memory_stats(self) -> dict[str, int]:
        return {"peak_bytes_in_use": self.peak, "bytes_in_use": 0}


def test_a_peak_is_the_trials_own_only_where_it_rose_during_the_trial():
    backend, device = JaxPmapBackend(), Device()
    backend.devices = [device]
    device.peak = 50  # the first trial of the worker: its peak
    assert backend.memory_peak_bytes(None) == {"peak_bytes": [50], "scope": "trial"}
    backend.forget_trial()
    device.peak = 50  # a smaller program after it: the counter still says 50, a bound only
    assert backend.memory_peak_bytes(None) == {"peak_bytes": [50], "scope": "worker process"}
    backend.forget_trial()
    device.peak = 70  # a larger one sets a new peak: its own
    assert backend.memory_peak_bytes(None) == {"peak_bytes": [70], "scope": "trial"}


def test_no_counter_no_peak():
    class Cpu(Device):
        platform = "cpu"

        def memory_stats(self):
            return None

    backend = JaxPmapBackend()
    backend.devices = [Cpu()]
    assert backend.memory_peak_bytes(None) is None
    backend.forget_trial()
    assert backend.peaks_before is None
