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
    `order_seed` shuffles the order of (configuration, replicate); None until resolved.

    Adaptive replicates: after the `replicates` rounds, each configuration whose 95 % interval
    is wider than ±`interval_target` (a fraction of its mean; 0: never; None until resolved:
    DEFAULT_INTERVAL_TARGET) gets one more replicate
    per round, in interleaved rounds, until every interval is narrow enough, a configuration has
    `max_replicates`, or the next round would end past `time_budget_s` seconds of timing (None
    until resolved: DEFAULT_TIME_BUDGET_S). `adaptive_floor`: the rounds may run at least this
    multiple of the planned replicates' own seconds, whatever the budget left (None until
    resolved: DEFAULT_ADAPTIVE_FLOOR where the budget is the platform's default, so that a
    slower or busy machine, whose planned replicates use up the default budget, still gets the
    rounds that make its intervals as narrow; 0 where the spec or the command line set the
    budget: a budget given is kept). `run_variation`: the relative standard deviation of
    a configuration's mean between whole runs on this machine (measure it with
    benchmarks/repeatability.py; None until resolved: DEFAULT_RUN_VARIATION); the intervals of
    host-bound rows, and of every row on simulated CPU devices, include it, since the
    replicates of one run share the run's state and cannot see it. `device_run_variation`:
    the same for the other rows, whose step is the device's (None until resolved:
    DEFAULT_DEVICE_RUN_VARIATION)."""

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
    interval_target: float | None = None
    time_budget_s: float | None = None
    max_replicates: int = 12
    adaptive_floor: float | None = None
    run_variation: float | None = None
    device_run_variation: float | None = None

    @property
    def least_windows(self) -> int:
        """The windows every replicate times before it may stop early."""
        from xbench.stats import MIN_WINDOWS

        return min(self.repeats, MIN_WINDOWS)


# Adaptive replicates by platform: on a GPU ±5 %; simulated CPU devices share the host's cores
# and vary 5-30 % between processes, so ±10 %, and a budget that keeps `make compare` within
# 3 minutes on a 2-core machine.
DEFAULT_INTERVAL_TARGET = {"cpu": 0.10, "gpu": 0.05}
DEFAULT_TIME_BUDGET_S = {"cpu": 120.0, "gpu": 150.0}
# Where the default budget holds: adaptive rounds get at least as long as the planned replicates
# took. On the 2-core machine the planned replicates of `make compare` take about half the
# default budget; on one 1.5x slower they took all of it, leaving no round (8 and 3 of 16 rows
# within ±10 % instead of 14-16).
DEFAULT_ADAPTIVE_FLOOR = 1.0
# Run-to-run variation (relative sd of a configuration's mean between whole runs, beyond what
# its replicates show) where nothing better is known: measured on this project's machines with
# benchmarks/repeatability.py. A 2-core CPU (7 runs of the quick spec): median 3 % over
# configurations (rms 6 %: jax on 2 simulated devices varies most); one H100, host-bound rows:
# 9-19 %. It widens every row on a CPU (the host is the device) and host-bound rows on a GPU;
# measure yours and pass --run-variation. (At 5 % on the CPU no interval could reach ±10 %.)
DEFAULT_RUN_VARIATION = {"cpu": 0.03, "gpu": 0.10}
# The same for rows whose step is the device's (not host-bound, on a real accelerator), which
# replicates alone can put at ±0.01 %: on one H100 such rows' means moved 0.1-0.2 % between
# three runs (up to 0.5 %), on one H200 0.02-0.04 %; an interval of ±0.004 % from two processes
# that agreed missed a rerun 0.17 % away. (A program whose processes draw different autotuned
# kernels varies far more between runs, but that is between processes: replicates show it.)
DEFAULT_DEVICE_RUN_VARIATION = 0.002


def window_protocol(nbytes: int) -> TimingProtocol:
    """Fewer operations per window for larger buffers, so each window lasts a similar time.
    Every window runs (no early stop on the mean's interval): the printed statistic is the
    median, whose 95 % interval needs 6 windows or more."""
    steps = 100 if nbytes <= 2**22 else 20 if nbytes <= 2**28 else 10
    return TimingProtocol(warmup_steps=5, steps=steps, repeats=10, steps_per_call=1, trial_timeout_s=300,
                          target_ci=0.0, window_budget_s=60.0)
