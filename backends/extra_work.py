"""`extra_work`, an option of the `jax` (and `jax-shardmap`, `jax-auto`) and `torch` backends:
a planted slowdown, so that a benchmark can check that `xbench diff` flags a real one
(`benchmarks/repeatability.py --planted jax.extra_work=0.2`).

With `extra_work = f` (a fraction, 0 to 1; default 0), the timed loop (`run`) makes, besides
the calls of the training step it was asked for, one more call of the same step for every
1/f calls: after n calls in all, floor(n f) extra ones. Each is a whole call of the compiled
step (forward, backward, all-reduce, optimizer update; `steps_per_call` steps where those are
fused) on the next batch, run and waited for like the others, but not counted: a window of
many calls does about f more of exactly the work the step does, and its throughput falls to
about 1 / (1 + f) of the real one. A window of few calls gets 0 or 1 extra call, so the
window-to-window spread grows too; only windows of many calls see the average.

Only `run` pays it: `gradients`, `train` and `replica_weights`, what verification compares,
never make extra calls, and with f = 0 the loop is the one without the option.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

OPTION = "extra_work"
LARGEST = 1.0  # at most one extra call per call: the work doubled


def parse(value: Any) -> float:
    """The option's value as a fraction in [0, LARGEST], from a number (TOML) or a string (the
    command line's `--option jax.extra_work=0.2`); ValueError with one line otherwise."""
    fraction = math.nan
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            fraction = float(value)
        except ValueError:
            pass
    if not 0 <= fraction <= LARGEST:  # NaN (not a number) fails this too
        raise ValueError(f"{OPTION} must be a number from 0 to {LARGEST:g} (0.2: about 20 % more work per step), "
                         f"got {value!r}")
    return fraction


def validate(options: dict[str, Any], backend: str) -> None:
    """A backend's `validate_options` when `extra_work` is its only option."""
    for key, value in options.items():
        if key != OPTION:
            raise ValueError(f"unknown option {key!r}; {backend} takes only {OPTION}")
        parse(value)


@dataclass
class ExtraWork:
    """One prepared trial's account: how many calls of the step `run` made and how many extra."""

    fraction: float = 0.0
    calls: int = 0
    extra: int = 0

    @classmethod
    def of(cls, options: dict[str, Any]) -> ExtraWork:
        return cls(parse(options.get(OPTION, 0)))

    def owed(self, calls: int) -> int:
        """The extra calls to make along with `calls` more calls of the step: floor(n f) for
        the n calls so far, less those already made (the same on every rank of a job)."""
        if not self.fraction:
            return 0
        self.calls += calls
        due = math.floor(self.calls * self.fraction + 1e-9)  # 5 * 0.2 is 1, not 0.999...
        owed, self.extra = due - self.extra, due
        return owed
