"""How each configuration is timed: the settings the core's measurement follows."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimingProtocol:
    """How each configuration is timed; see `xbench.worker.measure`.

    A configuration is measured by `replicates` replicates, each a fresh worker process (a
    fresh start of the framework); None until resolved: 3 on GPUs, 2 on CPUs. Within a
    replicate, warmup runs whole calls (at least `warmup_steps` steps, rounded up to a
    multiple of `steps_per_call`), then up to `repeats` windows are timed. A window has
    `steps` steps, or a whole multiple of them when that is needed to last `min_window_s`.
    Windows stop early once their own 95 % interval is within `target_ci` of the mean (after
    `stats.MIN_WINDOWS` windows; 0: never early) or once they have taken `window_budget_s`.
    `compile_cache` "run" lets the replicates of one run share compiled programs (the first
    compiles, the others load). Off by default: measured on an H200, replicates that share
    one compilation also share its autotuned kernel choices, which are a large part of the
    variation between processes (large @64: replicate means within 2.4 % with a shared
    cache, 117k-247k samples/s with fresh compilation), so the interval would no longer
    cover a rerun.
    `order_seed` shuffles the order of (configuration, replicate); None until resolved."""

    warmup_steps: int = 2
    steps: int = 4
    repeats: int = 5
    steps_per_call: int = 1
    trial_timeout_s: float = 300.0
    min_window_s: float = 0.1  # windows shorter than this get more steps (0: exactly `steps`)
    replicates: int | None = None
    target_ci: float = 0.01
    window_budget_s: float = 1.0
    compile_cache: str = "off"
    order_seed: int | None = None

    @property
    def least_windows(self) -> int:
        """The windows every replicate times before it may stop early."""
        from xbench.stats import MIN_WINDOWS

        return min(self.repeats, MIN_WINDOWS)


def window_protocol(nbytes: int) -> TimingProtocol:
    """Fewer operations per window for larger buffers, so each window lasts a similar time."""
    steps = 100 if nbytes <= 2**22 else 20 if nbytes <= 2**28 else 10
    return TimingProtocol(warmup_steps=5, steps=steps, repeats=10, steps_per_call=1, trial_timeout_s=300)
