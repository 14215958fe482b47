"""The schema of what a run leaves: `Record` is one line of records.jsonl, `AllReduceRecord` one
line of allreduce.jsonl, `RunInfo` run.json; the files' names and the statuses a trial ends in.

Every record carries `schema`. Reading upgrades older records one version at a time
(`xbench.results.validation.MIGRATIONS`) and refuses a schema newer than this code knows.

Schema history:
1. the first release.
2. adds `verification` (the identical-work check before timing; `xbench verify`).
3. adds `trial.all_reduce` (False for --breakdown's compute-only twins), `telemetry`, and
   allreduce.jsonl records.
4. one record per replicate: `trial.replicate`, a trial id ending in "/r<replicate>", and
   `replicate` (host load before and after, kernel-choice settings, why the windows stopped,
   throttling); telemetry over the timed windows. Older records are replicate 0.
5. adds `trial.variant` (a backend's named variant, or "as-written") and `trial.program`
   ("data-parallel", or "plain": the single-device program without distribution); a trial
   id names them when they are not the default. Older records are as written, data-parallel.

A field that only some records have (older schemas, or a trial that never produced it: a
failed trial has no timing) is declared in a `total=False` class; everything else is in every
record read back. Changing what is written means changing the type here, `SCHEMA_VERSION`, and
a migration for the records already on disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal, TypedDict

SCHEMA_VERSION = 5
RECORDS_FILE: Final = "records.jsonl"
ALLREDUCE_FILE: Final = "allreduce.jsonl"  # the all-reduce microbenchmark, one record per size
RUN_FILE = "run.json"
# The run directory's other files, named here only: the verification phase's outcome, every
# worker's output, the drift control, the reports, and `xbench sweep`'s step-model fit.
VERIFY_FILE = "verify.json"
LOG_FILE = "workers.log"
CONTROL_FILE = "control.jsonl"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
FIT_FILE = "fit.json"
# What a run leaves in its directory; any of them means the directory holds (part of) a run.
RUN_FILES = (RUN_FILE, RECORDS_FILE, ALLREDUCE_FILE, VERIFY_FILE, LOG_FILE, REPORT_MD, CONTROL_FILE)


# Required keys and optional ones live in two classes (a base, and a `total=False` subclass)
# rather than `NotRequired`, which Python 3.10 lacks. Tuples in memory are lists on disk, so
# sequences are declared as `Sequence`.


class _StoredModelBase(TypedDict):
    name: str
    widths: Sequence[int]
    dropout: float
    batch_sizes: Sequence[int]
    inputs: int
    outputs: int


class StoredModel(_StoredModelBase, total=False):
    """A `ModelSpec` as stored (`dataclasses.asdict`); `ModelSpec.from_dict` reads it back."""

    family: str  # absent before other families than the MLP: "mlp"
    dims: Sequence[Sequence[Any]]  # (key, value) pairs of other families' shapes


class _StoredProtocolBase(TypedDict):
    warmup_steps: int
    steps: int
    repeats: int
    steps_per_call: int
    trial_timeout_s: float


class StoredProtocol(_StoredProtocolBase, total=False):
    """A `TimingProtocol` as stored; older records lack the fields added since."""

    min_window_s: float
    replicates: int | None
    target_ci: float
    window_budget_s: float
    compile_cache: str
    order_seed: int | None
    interval_target: float | None  # adaptive replicates (absent before them; None: verify's trials)
    time_budget_s: float | None
    max_replicates: int
    adaptive_floor: float | None  # absent before it
    run_variation: float | None
    device_run_variation: float | None


class _StoredTrialBase(TypedDict):
    backend: str
    model: StoredModel
    devices: int
    global_batch: int
    scaling: str  # "strong" or "weak"
    precision: str
    platform: str
    learning_rate: float
    seed: int
    samples: int
    protocol: StoredProtocol
    options: dict[str, Any]
    all_reduce: bool  # schema 3; False: the compute-only twin of --breakdown
    replicate: int  # schema 4
    variant: str  # schema 5
    program: str  # schema 5


class StoredTrial(_StoredTrialBase, total=False):
    """A `Trial` as stored (`Trial.to_dict`; `Trial.from_dict` reads it back)."""

    launcher: str  # absent before spmd: "subprocess"


class StoredDeviceInfo(TypedDict):
    """A `DeviceInfo` as stored: what the worker's `setup` found."""

    framework: str
    framework_version: str
    platform: str
    device_names: Sequence[str]
    simulated: bool
    available: int
    details: dict[str, Any]


class _StoredPreparedInfoBase(TypedDict):
    params: int
    weights_hash: str
    precision: dict[str, Any]
    sync_every_call: bool
    notes: Sequence[str]


class StoredPreparedInfo(_StoredPreparedInfoBase, total=False):
    """A `PreparedInfo` as stored: what the backend reports of a prepared trial."""

    settings: dict[str, Any]  # schema 4


class WorkHashes(TypedDict):
    """The work a trial did (`xbench.contract.Work`), as stored."""

    params: int
    weights_hash: str
    data_hash: str


class RankTiming(TypedDict):
    rank: int
    first_call_s: float
    window_s: list[float]


class _TimingBase(TypedDict):
    first_call_s: float
    window_s: list[float]  # seconds per timed window
    steps_per_window: int


class Timing(_TimingBase, total=False):
    """How long the timed windows took (`xbench.worker.measure`)."""

    stopped: str  # schema 4: why the windows ended ("repeats", "target_ci", "window_budget_s")
    ranks: list[RankTiming]  # spmd: each rank's own times (the windows are the slowest rank's)


class ClockRange(TypedDict):
    start: float | None
    end: float | None
    min: float | None
    max: float | None


class ThrottleTime(TypedDict):
    power: float | None
    thermal: float | None


class DeviceTelemetry(TypedDict, total=False):
    """One GPU over the timed windows (`xbench.worker.telemetry`)."""

    util_mean_pct: float | None
    nvml_memory_max_mib: float | None
    power_mean_w: float | None
    util_samples: int  # from here on: the driver's own samples (schema 4)
    sm_clock_mhz: ClockRange
    mem_clock_mhz: ClockRange
    clock_events: list[str] | None
    throttle_ms: ThrottleTime
    energy_j: float | None


class FrameworkMemory(TypedDict):
    peak_bytes: list[int]  # per device (or rank)
    scope: str  # what the peak covers: the trial, or the worker process


class _TelemetryBase(TypedDict):
    available: bool


class Telemetry(_TelemetryBase, total=False):
    """GPU telemetry of a replicate; polled samples (schema 3, and `after_windows`) or the
    driver's own samples over the timed windows (schema 4)."""

    reason: str  # why there is none
    error: str | None
    devices: list[DeviceTelemetry]
    energy_per_sample_j: float | None
    framework_memory: FrameworkMemory | None
    after_windows: Telemetry  # an untimed stretch after the windows, where the driver had no sample of them
    source: str  # from here: the driver's samples
    watched_s: float | None
    throttled: bool
    throttle_reasons: list[str]
    energy_source: str  # from here: polled samples
    interval_s: float
    sampled_s: float
    samples: list[int]


class HostState(TypedDict):
    """Host load around a replicate (None where the platform cannot tell)."""

    loadavg_1m: float | None
    loadavg_5m: float | None
    cpu_count: int | None
    cpus_allowed: int | None


class ReplicateFacts(TypedDict):
    """What may make one replicate differ from another (schema 4)."""

    index: int
    host_before: HostState
    host_after: HostState
    settings: dict[str, Any]  # kernel-choice settings in force
    stopped: str
    throttled: bool
    throttle_reasons: list[str]


class ProcessFacts(TypedDict):
    """The worker process that ran the trial (from the launcher): `start_s` from asking for it
    to its "ready" event (interpreter and framework import, or a fork from the run's fork
    server, whose own import the first forked worker waits for; then the device set-up), paid
    once by all of the process's trials; `forked`: from a fork server (xbench.run.zygote)."""

    pid: int
    start_s: float
    forked: bool


class MemoryFacts(TypedDict):
    """The memory a trial needs per device, estimated before it was launched
    (`xbench.models.memory`), and the device memory it was checked against (None: not checked,
    e.g. simulated CPU devices without XBENCH_DEVICE_MEMORY_GIB)."""

    estimate_bytes: int
    capacity_bytes: int | None
    sharded: bool


class _VerificationOutcomeBase(TypedDict):
    status: str  # "passed", "failed", "unverifiable" or "skipped"


class VerificationOutcome(_VerificationOutcomeBase, total=False):
    """What `xbench verify` found for the trial's implementation, before timing (schema 2)."""

    reason: str  # unverifiable or skipped: why
    checks: int
    failed: list[str]  # the failed checks and missing results, one line each


class _RecordBase(TypedDict):
    run_id: str
    trial_id: str  # the trial's replicate id, e.g. "jax/medium/d2/b32/r1"
    status: str  # one of STATUSES
    reason: str | None  # why not ok
    trial: StoredTrial
    devices: StoredDeviceInfo | None  # None: the worker never started
    environment: dict[str, Any]  # the host (`xbench.run.environment.host_environment`)
    started_at: str
    finished_at: str


class Record(_RecordBase, total=False):
    """One replicate of one trial: a line of records.jsonl. An ok record has `timing`, `work`
    and `backend`; a timed one `telemetry` and `replicate` too (schema 4); a verification
    trial `arrays` (and, since they are recorded, `phases`) instead of timing."""

    schema: int  # added by RecordWriter: every record read back has it
    verification: VerificationOutcome
    work: WorkHashes
    backend: StoredPreparedInfo
    timing: Timing
    telemetry: Telemetry
    replicate: ReplicateFacts
    process: ProcessFacts  # timed records since the fork server
    arrays: str  # verification trials: where the reference arrays are
    phases: dict[str, float]  # verification trials: seconds of each phase (xbench.worker.capture.PHASES)
    framework_memory: FrameworkMemory  # verification trials on GPUs: the framework's own peak
    memory: MemoryFacts  # timed trials since the check before launching


class _AllReduceRecordBase(TypedDict):
    kind: Literal["allreduce"]
    backend: str
    devices: int
    platform: str | None  # as the backend found it ("simulated CPU" for split CPUs)
    nbytes: int
    status: str  # one of STATUSES
    reason: str | None
    timing: Timing | None  # ok: per window, `steps_per_window` all-reduces
    environment: dict[str, Any]


class AllReduceRecord(_AllReduceRecordBase, total=False):
    """One buffer size of the all-reduce microbenchmark: a line of allreduce.jsonl."""

    schema: int
    launcher: str  # absent before spmd: "subprocess"
    collective: str  # one of contract.COLLECTIVES; absent before all-gather and reduce-scatter: "allreduce"


class Resumption(TypedDict):
    at: str
    command: str
    no_verify: bool
    environment: dict[str, Any]


class _RunInfoBase(TypedDict):
    run_id: str
    command: str
    spec: dict[str, Any]  # `Spec` as stored (asdict)


class RunInfo(_RunInfoBase, total=False):
    """run.json: what a run was asked to do, written before its first trial."""

    started_at: str
    breakdown: bool
    no_verify: bool
    launch: dict[str, Any]  # `Launch.to_dict()`, and "backends": each backend's launcher
    environment: dict[str, Any]
    devices: dict[str, dict[str, Any]]  # backend -> its `DeviceInfo` on one device, as stored
    resumed: list[Resumption]  # each --resume of the run
    fork_server_off: str  # why the fork servers were turned off mid-run, if they were
    planned: list[str]  # the trial ids of the plan, so that a report can tell an incomplete run
    devices_left_out: list[int]  # device counts asked by default or a spec file that no backend here had

NO_VERIFY = "--no-verify"  # the verification outcome's reason in every record of a run timed unverified

RETRIED_STATUSES = ("failed", "crashed", "timeout", "skipped")
STATUSES = ("ok", "unsupported", *RETRIED_STATUSES)
