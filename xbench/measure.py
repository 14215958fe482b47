"""The measurement protocol, shared by every backend.

One trial: the first call (compilation plus `steps_per_call` steps) is timed on its own, then
warmup steps run untimed, then `repeats` windows of `steps` steps are timed with a monotonic
clock. `Backend.run` returns only after a device sync, so each window ends with one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, ContextManager
from dataclasses import dataclass

from xbench.contract import Backend, Prepared
from xbench.spec import Protocol


@dataclass(frozen=True)
class Measurement:
    first_call_s: float  # compile + first `steps_per_call` steps, reported separately
    window_s: tuple[float, ...]  # one per repeat
    steps_per_window: int


def measure(
    backend: Backend,
    prepared: Prepared,
    protocol: Protocol,
    on_window: Callable[[int], None] = lambda done: None,
    during_windows: Callable[[], ContextManager[Any]] = nullcontext,
) -> Measurement:
    """Time one prepared trial; `on_window(k)` is called after the k-th timed window, and
    `during_windows()` wraps the timed windows (telemetry samples only there)."""
    first_call_s = _timed(backend, prepared, protocol.steps_per_call)
    if protocol.warmup_steps:
        backend.run(prepared, warmup_steps(protocol))
    windows = []
    with during_windows():
        for done in range(1, protocol.repeats + 1):
            windows.append(_timed(backend, prepared, protocol.steps))
            on_window(done)
    return Measurement(first_call_s, tuple(windows), protocol.steps)


def _timed(backend: Backend, prepared: Prepared, steps: int) -> float:
    start = time.perf_counter()
    backend.run(prepared, steps)
    return time.perf_counter() - start


def warmup_steps(protocol: Protocol) -> int:
    """`warmup_steps` rounded up to whole compiled calls."""
    calls = -(-protocol.warmup_steps // protocol.steps_per_call)
    return calls * protocol.steps_per_call
