"""Result rows: one configuration as tables show it, its replicates combined
(`xbench.results.summary` builds them from records), and the groupings every reader of rows
shares: which rows vary alike, which are real training steps, which kind of program a row is."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xbench import stats
from xbench.contract import AS_WRITTEN, DATA_PARALLEL, PLAIN, backend_label, implementation, trial_id
from xbench.results.peaks import Peak
from xbench.results.records import Telemetry


@dataclass(frozen=True)
class Breakdown:
    """Where a multi-device step's time goes: its compute-only twin (the same step without
    the gradient all-reduce) against the full step, both at the median throughput."""

    compute_ms: float
    comm_ms: float  # exposed communication: full step - compute-only step
    comm_fraction: float  # of the full step


@dataclass(frozen=True)
class Replicate:
    """One replicate's share of a row: what its record says."""

    index: int
    status: str
    reason: str | None
    windows: tuple[float, ...] = ()  # samples/s per timed window
    first_call_s: float | None = None
    telemetry: Telemetry | None = None
    throttled: tuple[str, ...] = ()  # why this replicate counts as throttled (empty: it does not)
    stopped: str | None = None  # why its timed windows ended (xbench.worker.measure.stop_reason)


@dataclass(frozen=True)
class Row:
    """One configuration as tables show it, its replicates combined."""

    backend: str
    model: str
    devices: int
    global_batch: int
    per_device_batch: int
    scaling_mode: str  # "strong" or "weak"
    status: str  # "ok" when at least one replicate measured, else the last replicate's status
    reason: str | None
    params: int | None
    replicates: tuple[Replicate, ...]
    throughput: stats.Replicated | None  # samples/s, two levels: windows within replicates
    step_ms: float | None  # global batch / median throughput
    first_call_s: float | None  # the slowest first call: compilation without a warm cache
    scaling: stats.Scaling | None
    all_reduce: bool = True  # False for a compute-only twin (--breakdown)
    breakdown: Breakdown | None = None
    launcher: str = "subprocess"  # "spmd": one process per device
    ranks: int = 1  # processes whose window times the step time is the maximum of
    host_bound: str | None = None  # why the step measures host dispatch rather than arithmetic
    planned: int = 0  # replicates the run's spec asked for (records may hold fewer: an interrupted run)
    variant: str = AS_WRITTEN
    program: str = DATA_PARALLEL  # "plain": the single-device program without distribution
    baseline: str | None = None  # the 1-device program the speedup is taken against
    vs_plain: stats.Scaling | None = None  # throughput over the plain single-device program's
    flops_per_sample: int | None = None  # model FLOPs of a training step per sample
    peak: Peak | None = None  # each device's dense peak at the trial's precision; None: unknown
    precision: str = "fp32"
    unit: str = "samples"  # what a sample holds, as tables count throughput: "tokens", "images"
    units_per_sample: int = 1  # e.g. a sequence's tokens
    run_variation: float = 0.0  # relative sd of a row's mean between runs on this machine (the spec's)
    device_run_variation: float = 0.0  # the same for a row whose step is the device's (absent in older runs)
    simulated: bool = False  # measured on simulated CPU devices: the host is the device
    interval_target: float = 0.0  # the ±95 % the spec asked of each interval, as a fraction (0: none)
    framework: str = ""  # the framework behind the backend, as its worker named it ("" before it started)
    links: str = ""  # the GPU-to-GPU links where P2P was off (`xbench.results.links.short`); "": the machine's own
    busy: tuple[float, int] | None = None  # the run's host load and cores where other programs competed (`busy_host`)
    memory_estimate_gib: float | None = None  # per device, estimated before launching (`xbench.results.fit`)
    sharded: bool = False  # parameters, gradients and Adam state split over the devices (as the memory check knew)

    @property
    def trial_id(self) -> str:
        """The configuration's id (its replicates' ids add "/r<k>")."""
        return trial_id(self.backend, self.model, self.devices, self.global_batch, self.launcher, self.all_reduce,
                        self.variant, self.program)

    @property
    def framework_key(self) -> str:
        """What rows of one framework share (a plot's colour, a contest's sides): the framework
        as its worker named it, else the backend's name (a row no worker reported on)."""
        return self.framework or self.backend

    @property
    def implementation(self) -> str:
        return implementation(self.backend, self.variant, self.program)

    @property
    def label(self) -> str:
        return backend_label(self.implementation, self.launcher)

    @property
    def measured(self) -> stats.Replicated:
        """The throughput of a row the caller knows was measured (ValueError otherwise)."""
        if self.throughput is None:
            raise ValueError(f"{self.trial_id} has no measurement ({self.status})")
        return self.throughput

    @property
    def means(self) -> tuple[float, ...]:
        """Each measured replicate's mean throughput: the sample behind intervals and tests."""
        return self.throughput.means if self.throughput else ()

    @property
    def failed_replicates(self) -> tuple[Replicate, ...]:
        return tuple(r for r in self.replicates if r.status != "ok")

    @property
    def throttled(self) -> tuple[str, ...]:
        return tuple(f"r{r.index}: {why}" for r in self.replicates for why in r.throttled)

    @property
    def unstable(self) -> bool:
        return bool(self.throughput and self.throughput.unstable)

    @property
    def run_var(self) -> float:
        """The run-level variance of the row's log mean: the spec's run_variation squared for
        host-bound rows and for every row on simulated CPU devices, else its
        device_run_variation squared."""
        return (self.run_variation if self.host_bound or self.simulated else self.device_run_variation) ** 2


def variance_group(row: Row) -> tuple:
    """The configurations whose processes vary alike, so that their intervals share one spread
    (`stats.pooled_log_spreads`): one program of one backend, started one way, in one regime
    (host-bound steps vary with the host's scheduling, device-bound ones with the device's)."""
    return row.backend, row.variant, row.program, row.launcher, row.host_bound is not None


def full_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows of real training steps (compute-only twins only feed the breakdown)."""
    return [row for row in rows if row.all_reduce]


def program_kind(row: Row) -> str:
    """What a row is ranked among: "plain" (the single-device program without distribution)
    or "data-parallel" (the program that runs on 1 to N devices), whatever its variant."""
    return PLAIN if row.program == PLAIN else DATA_PARALLEL
