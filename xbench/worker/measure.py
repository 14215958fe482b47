"""The measurement protocol, shared by every backend.

One trial (one replicate of a configuration): the first call (compilation plus
`steps_per_call` steps) is timed on its own, then warmup steps run untimed, then up to
`repeats` windows of `steps` steps are timed with a monotonic clock, stopping early when they
are steady enough or have used their time budget. `Backend.run` returns only after a device
sync, so each window ends with one.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ContextManager, Protocol

from xbench import stats
from xbench.contract.timing import TimingProtocol

# NVML averages utilisation over 1/6 s to 1 s on recent GPUs: the untimed stretch that stands
# in for windows too short for the driver's samples (first replicate only) lasts this long.
TELEMETRY_MIN_S = 1.0


class Steps(Protocol):
    """What `measure` times: a `Backend`'s training steps, or its all-reduces (xbench.worker.main)."""

    def run(self, prepared: Any, steps: int) -> None: ...


@dataclass(frozen=True)
class Measurement:
    first_call_s: float  # compile + first `steps_per_call` steps, reported separately
    window_s: tuple[float, ...]  # one per timed window
    steps_per_window: int
    stopped: str = "repeats"  # why the windows ended: "repeats", "target_ci" or "window_budget_s"


def measure(
    backend: Steps,
    prepared: Any,
    protocol: TimingProtocol,
    on_window: Callable[[int], None] = lambda done: None,
    agree: Callable[[int], int] = lambda steps: steps,
    watch: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
    all_stop: Callable[[bool], bool] = lambda stop: stop,
) -> Measurement:
    """Time one prepared trial; `on_window(k)` is called after the k-th timed window.
    `agree` turns this process's choice of steps per window into the one every process of
    the job uses (one process per device: all must run the same steps), and `all_stop` this
    process's wish to stop into the job's decision. `watch()` brackets the timed windows
    (telemetry reads before the first and after the last, none in between)."""
    first_call_s = _timed(backend, prepared, protocol.steps_per_call)
    if protocol.warmup_steps:
        backend.run(prepared, warmup_steps(protocol))
    steps = agree(window_steps(backend, prepared, protocol))
    windows: list[float] = []
    stopped = "repeats"
    with watch():
        all_stop(False)  # one process per node read telemetry: every rank starts the windows together
        while len(windows) < protocol.repeats:
            windows.append(_timed(backend, prepared, steps))
            on_window(len(windows))
            reason = stop_reason(windows, protocol)
            if all_stop(reason is not None) and len(windows) < protocol.repeats:
                stopped = reason or "another rank"
                break
    return Measurement(first_call_s, tuple(windows), steps, stopped)


def stop_reason(windows: Sequence[float], protocol: TimingProtocol) -> str | None:
    """Why the timed windows may end before `repeats`, or None: their 95 % interval is within
    `target_ci` of the mean (judged on throughputs, 1 / window time, since every window has
    the same steps), or they have used `window_budget_s`. Never before `least_windows`."""
    if len(windows) < protocol.least_windows:
        return None
    if stats.enough_windows([1 / w for w in windows], protocol.target_ci, protocol.least_windows):
        return "target_ci"
    if sum(windows) >= protocol.window_budget_s:
        return "window_budget_s"
    return None


def window_steps(backend: Steps, prepared: Any, protocol: TimingProtocol) -> int:
    """`steps`, or the smallest multiple of it whose window lasts `min_window_s`, judged
    from one untimed window (which also serves as more warmup). Short windows let host
    jitter and timer resolution dominate."""
    if protocol.min_window_s <= 0:
        return protocol.steps
    probe = _timed(backend, prepared, protocol.steps)
    return protocol.steps * max(1, math.ceil(protocol.min_window_s / max(probe, 1e-9)))


def telemetry_steps(timing: dict[str, Any], protocol: TimingProtocol, min_seconds: float = TELEMETRY_MIN_S) -> int:
    """Whole windows' worth of steps that last at least `min_seconds`, judged from the
    fastest timed window. Fixed in advance, not by a clock, so that every process of an
    spmd job (which all see the same gathered windows) runs the same steps."""
    fastest = max(min(timing["window_s"]), 1e-9)
    return timing["steps_per_window"] * max(1, math.ceil(min_seconds / fastest))


def observe(backend: Steps, prepared: Any, steps: int, watch: Callable[[], ContextManager[Any]]) -> float:
    """After the timed windows: `steps` more training steps, untimed, inside `watch()`
    (telemetry), so that sampling never disturbs a timed window and counters that average
    over a second or more see the steady state. Returns the seconds they took."""
    start = time.perf_counter()
    with watch():
        backend.run(prepared, steps)
    return time.perf_counter() - start


def _timed(backend: Steps, prepared: Any, steps: int) -> float:
    start = time.perf_counter()
    backend.run(prepared, steps)
    return time.perf_counter() - start


def warmup_steps(protocol: TimingProtocol) -> int:
    """`warmup_steps` rounded up to whole compiled calls."""
    calls = -(-protocol.warmup_steps // protocol.steps_per_call)
    return calls * protocol.steps_per_call
