"""Timing shared by the benchmarks that race programs in one process (overhead.py,
expert_loops.py): a distribution-free interval for a median, and interleaved rounds of
windows, each program warmed up first and each window ending in a device sync (the
programs' `run` waits for its device before it returns).

Interleaving: every round times one window of every program, in alternating order (forward
on even rounds, backward on odd ones), so that drift of the machine falls on all programs
alike; two programs' windows of one round are adjacent, so their ratio cancels most of it.
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free interval for the median: order statistics (x_(k), x_(n+1-k)) with
    the largest k whose coverage 1 - 2 P(Binom(n, 1/2) < k) is at least `confidence`; with
    too few values, (min, max). Returns (low, high, coverage)."""
    ordered = sorted(values)
    n = len(ordered)
    below, k = 0.0, 0  # below = P(Binom(n, 1/2) <= k - 1)
    while k < n // 2:
        nxt = below + math.comb(n, k) / 2 ** n
        if 1 - 2 * nxt < confidence:
            break
        below, k = nxt, k + 1
    k = max(k, 1)
    coverage = 1 - 2 * sum(math.comb(n, j) for j in range(k)) / 2 ** n
    return ordered[k - 1], ordered[n - k], coverage


def timed(run: Callable[[int], None], steps: int) -> float:
    started = time.perf_counter()
    run(steps)
    return time.perf_counter() - started


@dataclass
class Runner:
    """One program to race: `run(steps)` runs `steps` training steps (a multiple of
    `steps_per_call`) and returns after the device finished them. `before()` runs untimed
    before every call: it puts back settings that are global to the process (cuDNN's
    benchmark mode, matmul precision), as this program set them when it was built, so that
    another program's settings never leak into its windows."""

    name: str
    run: Callable[[int], None]
    steps_per_call: int = 1
    warmup_steps: int = 0  # untimed steps after the first call (rounded up to whole calls)
    before: Callable[[], None] = lambda: None
    last_loss: Callable[[], float] | None = None  # the last step's loss, where the program can say
    first_call_s: float | None = None
    steps_per_window: int | None = None
    per_step_s: list[float] = field(default_factory=list)  # one per timed window
    error: str | None = None

    def call(self, steps: int) -> float:
        self.before()
        gc.collect()  # a collection inside a window would be charged to the program
        return timed(self.run, steps)

    def whole_calls(self, steps: int) -> int:
        """`steps` rounded up to whole calls (at least one)."""
        return max(1, -(-steps // self.steps_per_call)) * self.steps_per_call


def warm_up(runner: Runner) -> None:
    """The first call (compilation, autotuning, first allocations), timed on its own, then
    the runner's untimed warm-up steps."""
    runner.first_call_s = runner.call(runner.steps_per_call)
    if runner.warmup_steps:
        runner.call(runner.whole_calls(runner.warmup_steps))


def calibrate(runner: Runner, window_s: float, max_steps: int = 1 << 20,
              agree: Callable[[float], float] = lambda elapsed: elapsed) -> int:
    """Steps per window so that the runner's window lasts about `window_s`, judged from
    probe calls that double until one lasts a quarter of it (they also warm up further).
    `agree` makes the processes of one job decide alike (each rank's time -> the slowest),
    since every rank must run the same steps."""
    steps = runner.steps_per_call
    while True:
        elapsed = agree(runner.call(steps))
        if elapsed >= window_s / 4 or steps >= max_steps:
            break
        steps *= 2
    per_step = elapsed / steps
    runner.steps_per_window = runner.whole_calls(math.ceil(window_s / max(per_step, 1e-9)))
    return runner.steps_per_window


def race(runners: list[Runner], rounds: int, on_round: Callable[[int], None] = lambda r: None) -> None:
    """`rounds` rounds of one window per runner, alternating the order; each runner's
    per-step times go to its `per_step_s`. A runner that raises is marked (`error`) and
    left out of the later rounds; the others go on."""
    for r in range(rounds):
        order = runners if r % 2 == 0 else list(reversed(runners))
        for runner in order:
            if runner.error is not None:
                continue
            try:
                runner.per_step_s.append(runner.call(runner.steps_per_window) / runner.steps_per_window)
            except Exception as err:  # one failing program must not stop the others
                runner.error = describe(err)
        on_round(r)


def paired_ratio(numerators: list[float], denominators: list[float]) -> dict[str, float] | None:
    """Median and interval of the per-round ratios numerators[r] / denominators[r] (rounds
    both timed); None with fewer than two pairs."""
    pairs = [a / b for a, b in zip(numerators, denominators)]
    if len(pairs) < 2:
        return None
    low, high, coverage = median_interval(pairs)
    return {"median": statistics.median(pairs), "low": low, "high": high, "coverage": coverage, "rounds": len(pairs)}


def describe(err: BaseException) -> str:
    """One line for a record: the exception and where it came from."""
    where = traceback.extract_tb(err.__traceback__)
    place = f" (at {where[-1].filename.rsplit('/', 1)[-1]}:{where[-1].lineno})" if where else ""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:500]}{place}"


def child_records(command: list[str], mark: str, on_record: Callable[[dict], None]) -> tuple[list[dict], int, str]:
    """Run a child process that reports JSON records on stdout, each line starting with
    `mark`; pass each to `on_record` as it comes. Returns (records, exit status, stderr)."""
    records = []
    with tempfile.TemporaryFile(mode="w+") as err:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1)
        for line in child.stdout:
            if line.startswith(mark):
                record = json.loads(line[len(mark):])
                records.append(record)
                on_record(record)
        code = child.wait()
        err.seek(0)
        return records, code, err.read()
