"""What a run will cost, said before it starts: its wall time, verification and timing apart,
from the plan (the trials and the worker processes that run them), the presets' FLOPs, this
machine's arithmetic speed and a few fixed costs per worker and per trial; and what would
make it cheaper.

The estimate is rough by design (a factor of 2 either way): a trial's seconds on a CPU are
mostly the framework's start and compilation, which no FLOP count predicts, and the adaptive
rounds run until the intervals are narrow or the time budget is spent, which only the
measurements decide. So the timing is given as a range: the planned replicates, then at most
the time budget, which counts the planned replicates' own seconds too (`adaptive.Budget`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from xbench.contract import Trial, first_call_of, first_call_per_array_of
from xbench.contract.abilities import positive_seconds
from xbench.contract.timing import TimingProtocol
from xbench.experiment import Spec
from xbench.models import usable_cores
from xbench.results.allreduce import sizes_for
from xbench.run.adaptive import adaptive
from xbench.run.plan import Lineup, plan_trials
from xbench.run.verify_plan import verification_trials


@dataclass(frozen=True)
class Costs:
    """The seconds of one platform that do not come from the model's arithmetic. Measured on
    this project's 2-core CPU (`make compare` on a busy machine, 2026-11-28: a forked worker
    started in 0.03-1.1 s, a fork server imported TensorFlow in up to 8 s, first calls took
    0.4-3.3 s, 20 verification runs 38 s two at a time) and on one H100/H200
    (docs/statistics.md, "Where a replicate's seconds go": jax's first calls 5 s). A backend
    may declare its own first call per platform (`DeclaresFirstCall`): `first_calls`."""

    flops: float  # arithmetic per second: the whole host for simulated CPU devices, one GPU otherwise
    shared_host: bool  # simulated devices share the host's arithmetic (no speed-up from more of them)
    start_s: float  # a timed worker process: start (forked), device set-up
    import_s: float  # per backend, once: its fork server's import of the framework
    first_call_s: float  # per trial: the model and data built, the first call (compilation) ...
    per_array_s: float  # ... and this much more per parameter array (layers compile one by one)
    step_overhead_s: float  # per step: dispatch, synchronisation, the all-reduce of a small model
    fixed_s: float  # finding the devices (a worker per backend, at once) before; the report and plots after
    verify_run_s: float  # a verification run: its share of a worker's start, compilation, ten steps, read
    # back; plus `per_array_s` per parameter array
    verify_parallel: int  # verification workers at once (`verify_phase.parallel_verification`)
    # backend -> its own `first_call_s` where it declares one (`DeclaresFirstCall`): compilation
    # differs between frameworks far more than between models (on a GPU, jax autotunes its kernels)
    first_calls: Mapping[str, float] = field(default_factory=dict)
    # backend, or (backend, variant) -> its own seconds per parameter array, where declared
    # (eager torch compiles no layer; torch.compile every one)
    per_arrays: Mapping[str | tuple[str, str], float] = field(default_factory=dict)

    def first_call(self, backend: str) -> float:
        return self.first_calls.get(backend, self.first_call_s)

    def per_array(self, backend: str, variant: str) -> float:
        return self.per_arrays.get((backend, variant), self.per_arrays.get(backend, self.per_array_s))


CPU_COSTS = Costs(flops=200e9, shared_host=True, start_s=1.0, import_s=4.0, first_call_s=0.6, per_array_s=0.1,
                  step_overhead_s=2e-3, fixed_s=12.0, verify_run_s=2.5, verify_parallel=2)
GPU_COSTS = Costs(flops=100e12, shared_host=False, start_s=1.5, import_s=5.0, first_call_s=4.0, per_array_s=0.1,
                  step_overhead_s=2e-4, fixed_s=20.0, verify_run_s=8.0, verify_parallel=4)
# The share of the matmul speed a training step reaches: small layers, element-wise work and
# the framework's own dispatch keep it well below. On the 2-core CPU the seed's large MLP at
# batch 256 trained at 65-77 GFLOP/s where numpy's matmul ran at 200 (2 cores x 100).
STEP_EFFICIENCY = {"cpu": 0.3, "gpu": 0.4}


@dataclass(frozen=True)
class Estimate:
    """A plan's cost. Seconds are wall time; `timing_max_s` is where adaptive rounds end at
    the latest (the time budget), equal to `timing_s` without them."""

    configurations: int  # timed configurations (compute-only twins counted apart)
    trials: int  # planned trial replicates
    processes: int  # the worker processes that time them
    verify_runs: int  # verification runs (0: --no-verify)
    fixed_s: float  # finding the devices, and the report
    verify_s: float
    timing_s: float  # the planned replicates
    timing_max_s: float  # ... and adaptive rounds up to the time budget
    per_configuration_s: float  # a configuration's planned replicates, on average
    time_budget_s: float  # 0: no adaptive rounds

    @property
    def total_s(self) -> float:
        return self.fixed_s + self.verify_s + self.timing_s

    @property
    def total_max_s(self) -> float:
        return self.fixed_s + self.verify_s + self.timing_max_s


def step_seconds(trial: Trial, costs: Costs, efficiency: float) -> float:
    """One training step of `trial`: its model FLOPs over the devices' arithmetic, plus the
    step's fixed overhead. Simulated CPU devices share one host, so more of them are no
    faster; GPUs split the global batch."""
    flops = trial.model.training_flops_per_sample * trial.global_batch
    devices = 1 if costs.shared_host else max(1, trial.devices)
    return flops / (costs.flops * efficiency * devices) + costs.step_overhead_s


def trial_seconds(trial: Trial, costs: Costs, efficiency: float) -> float:
    """One trial replicate in its worker: the first call, the warm-up steps, then its windows:
    `repeats` of them, each `steps` steps or more to last `min_window_s`, none started once
    they have taken the window budget, but never fewer than `least_windows`."""
    protocol: TimingProtocol = trial.protocol
    step = step_seconds(trial, costs, efficiency)
    window_steps = max(protocol.steps, protocol.steps * math.ceil(protocol.min_window_s / (protocol.steps * step)))
    window = window_steps * step
    windows = window * max(protocol.least_windows, min(protocol.repeats, math.ceil(protocol.window_budget_s / window)))
    return compile_seconds(trial, costs) + protocol.warmup_steps * step + windows


def compile_seconds(trial: Trial, costs: Costs) -> float:
    """A trial's first call: its backend's fixed part and a part per parameter array of its model."""
    arrays = len(trial.model.kind.parameters(trial.model.shape))
    return costs.first_call(trial.backend) + costs.per_array(trial.backend, trial.variant) * arrays


def timing_seconds(trials: Sequence[Trial], costs: Costs, efficiency: float) -> tuple[float, int]:
    """The planned replicates' seconds, one worker process after another (each backend's
    fork server imports its framework once), and how many processes run them (consecutive
    trials of one backend, device count, launcher and replicate share one, as
    `plan.group_trials` groups them)."""
    processes = len({(t.backend, t.devices, t.launcher, t.replicate) for t in trials})
    imports = len({t.backend for t in trials}) * costs.import_s
    return imports + processes * costs.start_s + sum(trial_seconds(t, costs, efficiency) for t in trials), processes


def verify_seconds(trials: Sequence[Trial], costs: Costs) -> float:
    """Verification: each run pays its worker's start and compilation (its ten steps are on a
    small instance of the model), its backend's first call in place of the platform's;
    `verify_parallel` of them at once."""
    runs = sum(costs.verify_run_s + compile_seconds(t, costs) - costs.first_call_s for t in trials)
    return runs / max(1, costs.verify_parallel)


def estimate(spec: Spec, backends: Sequence[str], lineups: Mapping[str, Lineup], launchers: Mapping[str, str],
             costs: Costs, platform: str, breakdown: bool = False, verify: bool = True,
             done: Collection[str] = frozenset()) -> Estimate:
    """The cost of running `spec` (its protocol resolved) for `backends` on `platform` ("cpu"
    or "gpu"), the trials in `done` (a resumed run's) left out."""
    efficiency = STEP_EFFICIENCY[platform]
    costs = with_variants(costs, lineups, platform)
    trials = [t for t in plan_trials(spec, backends, breakdown, launchers, lineups) if t.id not in done]
    timing, processes = timing_seconds(trials, costs, efficiency)
    checks = verification_trials(spec, backends, spec.devices, launchers, lineups) if verify else []
    protocol = spec.protocol
    budget = (protocol.time_budget_s or 0.0) if adaptive(protocol) else 0.0
    # the rounds' ceiling: the budget, or as long again as the planned replicates (adaptive_floor)
    ceiling = max(budget, timing * (1 + (protocol.adaptive_floor or 0.0))) if budget else 0.0
    configurations = len({t.config_id for t in trials if t.all_reduce})
    per_configuration = timing / configurations if configurations else 0.0
    fixed = (costs.fixed_s if trials or checks else 0.0) + (allreduce_seconds(spec, backends, platform) if breakdown
                                                           and not done else 0.0)
    return Estimate(configurations=configurations, trials=len(trials), processes=processes,
                    verify_runs=len(checks), fixed_s=fixed,
                    verify_s=verify_seconds(checks, costs), timing_s=timing,
                    timing_max_s=max(timing, ceiling),
                    per_configuration_s=per_configuration, time_budget_s=budget)


ALLREDUCE_SIZE_S = 2.0  # --breakdown's all-reduce: one size on one device count, roughly


def allreduce_seconds(spec: Spec, backends: Sequence[str], platform: str) -> float:
    """--breakdown's all-reduce measurement (`allreduce_phase.breakdown_allreduce`): each
    model's gradient size and a sweep of sizes, per backend and multi-device count."""
    multi = [n for n in spec.devices if n > 1]
    sizes = sizes_for([4 * m.params for m in spec.models], platform == "gpu") if multi else []
    return len(sizes) * len(backends) * len(multi) * ALLREDUCE_SIZE_S


def with_variants(costs: Costs, lineups: Mapping[str, Lineup], platform: str) -> Costs:
    """`costs` with the per-array first calls the lineups' compiling variants declare (GPUs)."""
    if platform != "gpu":
        return costs
    declared: dict[str | tuple[str, str], float] = {
        (backend, v.name): seconds for backend, lineup in lineups.items()
        for v in lineup.variants if (seconds := positive_seconds(v.first_call_per_array_s)) is not None}
    return replace(costs, per_arrays={**costs.per_arrays, **declared}) if declared else costs


def duration(seconds: float) -> str:
    """A duration as a user reads it: "40 s", "3 min", "1 h 20 min"."""
    if seconds < 90:
        return f"{max(1, round(seconds / 5) * 5 if seconds >= 20 else round(seconds))} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def plan_lines(found: Estimate, replicates: int) -> list[str]:
    """The plan and its cost in one line, what would make it cheaper in a second."""
    total = duration(found.total_s)
    if found.timing_max_s > found.timing_s:
        total = f"{total} to {duration(found.total_max_s)}"
    verify = (f"verification ~{duration(found.verify_s)} ({found.verify_runs} run(s))" if found.verify_runs
              else "no verification")
    timing = f"timing ~{duration(found.timing_s)} ({found.trials} replicate(s) in {found.processes} worker process(es))"
    if found.timing_max_s > max(found.timing_s, found.time_budget_s):
        timing += (f", then adaptive rounds for up to as long again (~{duration(found.timing_max_s - found.timing_s)}: "
                   f"the planned replicates take most of the {found.time_budget_s:g} s time budget)")
    elif found.timing_max_s > found.timing_s:
        timing += f", then adaptive rounds up to the {found.time_budget_s:g} s time budget"
    head = (f"plan: {found.configurations} configuration(s) x {replicates} replicate(s); estimated {total}: "
            f"{verify}, {timing}")
    return [head, *cheaper(found)]


def cheaper(found: Estimate) -> list[str]:
    """What would cut the estimate most, largest first, as one line (none for a short run)."""
    saves: list[tuple[float, str]] = []
    adaptive_s = found.timing_max_s - found.timing_s
    if adaptive_s > 0:
        saves.append((adaptive_s, f"--time-budget 0 (the planned replicates only, up to ~{duration(adaptive_s)} less, "
                                  "wider intervals)"))
    if found.verify_runs:
        saves.append((found.verify_s, f"--no-verify (~{duration(found.verify_s)} less, no identical-work check)"))
    if found.configurations > 1:
        saves.append((found.per_configuration_s, f"fewer models, batches or device counts (~"
                                                 f"{duration(found.per_configuration_s)} per configuration)"))
    saves = [s for s in saves if s[0] >= 5]
    if found.total_max_s < 60 or not saves:
        return []
    return ["cheaper: " + "; ".join(text for _, text in sorted(saves, key=lambda s: -s[0]))]


def host_flops(clock: Callable[[], float] = time.perf_counter, seconds: float = 0.1) -> float:
    """This host's float32 matrix-multiply speed, what simulated CPU devices share: the
    fastest of numpy's 64x64 products over about `seconds`, times the cores this process may
    use. A product that small runs on one core: a multithreaded BLAS on a busy machine stalls
    (on the 2-core machine under load a 256x256 product ran at 2 GFLOP/s, then at 200 once
    the load passed), while one core's fastest call stays put (100 GFLOP/s, loaded or not)."""
    import numpy as np

    n = 64
    a = np.ones((n, n), dtype=np.float32)
    a @ a  # the first call loads the BLAS
    fastest = float("inf")
    started = clock()
    while clock() - started < seconds or fastest == float("inf"):
        before = clock()
        a @ a
        fastest = min(fastest, clock() - before)
    return 2 * n**3 / max(fastest, 1e-9) * usable_cores()


def costs_for(platform: str, measured_flops: float | None = None, backends: Mapping[str, object] | None = None
              ) -> Costs:
    """The platform's costs, with this host's measured speed for simulated CPU devices and
    the first calls that `backends` (instances by name) declare for the platform."""
    costs = GPU_COSTS if platform == "gpu" else CPU_COSTS
    if platform != "gpu" and measured_flops is not None:
        costs = replace(costs, flops=measured_flops)
    declared = {name: first_call_of(backend, platform) for name, backend in (backends or {}).items()}
    per_array = {name: first_call_per_array_of(backend, platform) for name, backend in (backends or {}).items()}
    return replace(costs, first_calls={name: s for name, s in declared.items() if s is not None},
                   per_arrays={name: s for name, s in per_array.items() if s is not None})
