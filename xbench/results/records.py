"""Result records: one JSON line per trial in `<run dir>/records.jsonl`, appended as each
trial ends, so a crash, timeout or Ctrl-C loses nothing already measured.

Every record carries `schema`. `read_records` upgrades older records one version at a time
(`MIGRATIONS`) and refuses a schema newer than this code knows.

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

The types below are the schema: `Record` is one line of records.jsonl, `AllReduceRecord` one
line of allreduce.jsonl, `RunInfo` run.json. A field that only some records have (older
schemas, or a trial that never produced it: a failed trial has no timing) is declared in a
`total=False` class; everything else is in every record read back. Changing what is written
means changing the type here, `SCHEMA_VERSION`, and a migration for the records already on
disk. Validation (`_record_problem`) checks only what readers cannot do without.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, TypedDict, TypeGuard, cast, overload

from xbench.contract import AS_WRITTEN, DATA_PARALLEL
from xbench.errors import XbenchError

SCHEMA_VERSION = 5
RECORDS_FILE: Final = "records.jsonl"
ALLREDUCE_FILE: Final = "allreduce.jsonl"  # the all-reduce microbenchmark, one record per size
RUN_FILE = "run.json"


# ----------------------------------------------------------------------------- the schema
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
    trial `arrays` instead of timing."""

    schema: int  # added by RecordWriter: every record read back has it
    verification: VerificationOutcome
    work: WorkHashes
    backend: StoredPreparedInfo
    timing: Timing
    telemetry: Telemetry
    replicate: ReplicateFacts
    process: ProcessFacts  # timed records since the fork server
    arrays: str  # verification trials: where the reference arrays are


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


# ----------------------------------------------------------------------------- files


class ResultsNotWritten(XbenchError):
    """A results file could not be written (a full disk, a lost mount): what was finished before
    is kept, and the message says what is lost and how to go on."""


def prepare_run_dir(path: Path) -> Path:
    """Create the run directory and prove it is writable, before any trial runs."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise XbenchError(f"cannot write results to {path}: {reason}; choose another --out") from None
    return path


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    """Write a whole JSON file atomically (a reader never sees half of it)."""
    write_atomic(path, (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def write_atomic(path: Path, data: bytes | Callable[[Path], None]) -> Path:
    """Write `path` whole or not at all: into a temporary file beside it, synced, then renamed
    over it. `data` is the bytes, or a function that writes a given path (a figure's savefig).
    On failure the temporary file is removed and `ResultsNotWritten` names the file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if callable(data):
            data(tmp)
        else:
            tmp.write_bytes(data)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:  # a writer's own error or Ctrl-C too: never leave the temporary file
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise ResultsNotWritten(f"could not write {path}: {err.strerror or err}") from None
        raise
    return path


class RecordWriter:
    """Appends records to a run directory, one complete line per write, synced to disk. A write
    that fails is undone (the file is cut back to its last complete line), so a full disk never
    leaves half a record; a crash in mid-write can tear only the last line, which readers
    recognise (`last_line_torn`) and the next append cuts off."""

    def __init__(self, run_dir: Path, name: str = RECORDS_FILE) -> None:
        self.path = Path(run_dir) / name
        self.checked = False  # whether a torn last line (from an earlier crash) was cut off

    def append(self, record: Mapping[str, Any]) -> None:
        """Write a `Record` or an `AllReduceRecord` (this file's kind) with its `schema`. Typed
        as any mapping: the launcher builds records as plain dicts."""
        line = (json.dumps({"schema": SCHEMA_VERSION, **record}, sort_keys=True) + "\n").encode("utf-8")
        existed = self.path.exists()
        try:
            # Unbuffered: a buffer would retry the failed bytes when the file is cut back.
            with open(self.path, "ab", buffering=0) as handle:
                if not self.checked:
                    _cut_torn_tail(handle)
                    self.checked = True
                end = handle.seek(0, os.SEEK_END)
                try:
                    _write_line(handle, line)
                except OSError:
                    os.ftruncate(handle.fileno(), end)  # never leave half a record behind
                    raise
        except OSError as err:
            if not existed and self.path.exists() and self.path.stat().st_size == 0:
                self.path.unlink()
            what = f"the record of trial {record['trial_id']}" if "trial_id" in record else "a record"
            raise ResultsNotWritten(
                f"could not write {what} to {self.path}: {err.strerror or err}; that measurement is lost, every "
                f"earlier record is kept: free the space, then `xbench compare --resume {self.path.parent}` "
                f"reruns what is missing") from None


def _write_line(handle, line: bytes) -> None:
    """One record's line, whole, then synced (a test injects a full disk here)."""
    view = memoryview(line)
    while view:
        view = view[handle.write(view):]  # a raw write may take only part of it
    os.fsync(handle.fileno())


def _cut_torn_tail(handle) -> None:
    """Make the file end with a complete line before appending: a last line a crash cut off
    mid-write (`last_line_torn`, which readers leave out) is cut away; a whole record that lost
    only its newline (readers count it) gets the newline."""
    if handle.seek(0, os.SEEK_END) == 0:
        return
    torn = last_line_torn(Path(handle.name))
    if torn is None:
        with open(handle.name, "rb") as reader:
            reader.seek(-1, os.SEEK_END)
            if reader.read(1) != b"\n":
                _write_line(handle, b"\n")
        return
    with open(handle.name, "rb") as reader:
        data = reader.read()
    os.ftruncate(handle.fileno(), data.rfind(b"\n") + 1)


@overload
def read_records(run_dir: Path, name: Literal["records.jsonl"] = ...) -> list[Record]: ...


@overload
def read_records(run_dir: Path, name: Literal["allreduce.jsonl"]) -> list[AllReduceRecord]: ...


def read_records(run_dir: Path, name: str = RECORDS_FILE) -> list[Record] | list[AllReduceRecord]:
    """All records of a run directory (`name`: RECORDS_FILE or ALLREDUCE_FILE), oldest first;
    an empty file is an error (a run that finished no trial has nothing to report). A torn
    last line is left out (`last_line_torn`)."""
    path = Path(run_dir) / name
    raw = list(_valid_records(path))
    if not raw:
        raise XbenchError(f"{path} holds no records; the run finished no trial")
    if name == RECORDS_FILE and (Path(run_dir) / RUN_FILE).exists():  # all-reduce records carry no run id
        check_same_run(read_run(run_dir)["run_id"], (r.get("run_id") for r in raw), path)
    if name == ALLREDUCE_FILE:
        return [cast(AllReduceRecord, record) for record in raw]
    return latest_per_trial([cast(Record, record) for record in raw])


def check_same_run(run_id: str, record_run_ids: Iterable[Any], records_path: Path,
                   fix: str = "keep one run per directory") -> None:
    """A run directory holds one run: a record of another run (a file copied in, two runs
    appended to one file) would be counted as this run's, or replace one of its trials."""
    others = sorted({str(r) for r in record_run_ids if r != run_id})
    if others:
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        shown = ", ".join(_brief(o, 40) for o in others[:3]) + more
        raise XbenchError(f"{records_path} holds records of run(s) {shown}, but {RUN_FILE} is run {run_id}: "
                          f"the directory mixes runs; {fix}")


def latest_per_trial(records: list[Record]) -> list[Record]:
    """One record per trial, the last written (a resumed run appends a retried trial's new
    record after its failed one), in the order the trials first ran."""
    latest = {record["trial_id"]: record for record in records}
    return list(latest.values())


# A resumed run retries trials whose last record has one of these statuses.
RETRIED_STATUSES = ("failed", "crashed", "timeout", "skipped")
STATUSES = ("ok", "unsupported", *RETRIED_STATUSES)


def finished_trials(run_dir: Path) -> set[str]:
    """Trial ids a resumed run skips: those whose last record is final."""
    path = Path(run_dir) / RECORDS_FILE
    if not path.exists():
        return set()
    return {r["trial_id"] for r in latest_per_trial(list(iter_records(path))) if r["status"] not in RETRIED_STATUSES}


def last_line_torn(path: Path) -> int | None:
    """The number of the file's last line when a crash cut it off mid-write (no newline, not
    JSON): an interrupted append, which readers leave out and a resumed run reruns."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    if not data or data.endswith(b"\n"):
        return None
    tail = data[data.rfind(b"\n") + 1:]
    try:
        json.loads(tail)
    except ValueError:
        return data.count(b"\n") + 1
    return None


def iter_records(path: Path) -> Iterator[Record]:
    """Every record of a records file (RECORDS_FILE), validated and migrated to
    SCHEMA_VERSION; a one-line error names the file and line of anything else. A torn last
    line is skipped."""
    for record in _valid_records(path):
        yield cast(Record, record)


def _valid_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every record of a records or all-reduce file, validated and migrated: a `Record` or an
    `AllReduceRecord`, as the file's name says."""
    if not path.exists():
        raise XbenchError(f"no {path.name} in {path.parent}; is it an xbench run directory?")
    torn = last_line_torn(path)
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip() or number == torn:
                    continue
                yield migrate(_checked(line, path, number))
    except UnicodeDecodeError:
        raise XbenchError(f"{path} is not UTF-8 text; the file was damaged or is not an xbench record file") from None
    except OSError as err:
        raise XbenchError(f"cannot read {path}: {err.strerror or err}") from None


def _checked(line: str, path: Path, number: int) -> dict[str, Any]:
    """One line as a record of the file's kind, or a one-line error naming file and line."""
    where = f"{path}:{number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        raise XbenchError(f"{where} is not a JSON record; the file was edited or damaged") from None
    if not isinstance(record, dict):
        raise XbenchError(f"{where} is {type(record).__name__}, not a record; the file was edited or damaged")
    schema = record.get("schema")
    if not _is_int(schema) or schema < 1:
        raise XbenchError(f"{where} has record schema {schema!r}, not a version of xbench's records (1 to "
                          f"{SCHEMA_VERSION}); the file was edited or damaged")
    if schema > SCHEMA_VERSION:
        raise XbenchError(f"{where} has record schema {schema!r}, newer than this xbench understands "
                          f"({SCHEMA_VERSION}); upgrade xbench")
    problem = (_record_problem if path.name != ALLREDUCE_FILE else _allreduce_problem)(record)
    if problem:
        raise XbenchError(f"{where} {problem}; not an xbench record (the file was edited or damaged)")
    return record


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _record_problem(record: Mapping[str, Any]) -> str | None:
    """What makes a trial record unusable by the readers, or None."""
    if "trial" not in record:
        return "lacks trial"
    trial = record["trial"]
    if not isinstance(trial, dict):
        return "has a trial that is not a table"
    for key, ok in (("backend", lambda v: isinstance(v, str) and v),
                    ("devices", lambda v: _is_int(v) and 0 < v <= MOST_DEVICES),
                    ("global_batch", lambda v: _is_int(v) and 0 < v <= MOST_SAMPLES),
                    ("model", lambda v: isinstance(v, dict) and isinstance(v.get("name"), str))):
        if not ok(trial.get(key)):
            return f"has trial.{key} {_brief(trial.get(key))}"
    if not isinstance(record.get("trial_id"), str) or not record["trial_id"]:
        return f"lacks a trial_id (has {record.get('trial_id')!r})"
    problem = _protocol_problem(trial.get("protocol"))
    if problem:
        return problem
    if record.get("status") not in STATUSES:
        return f"has status {record.get('status')!r}, not one of {', '.join(STATUSES)}"
    if record["status"] == "ok":
        return _timing_problem(record.get("timing"))
    return None


# What a measurement can be. No timer measures a window shorter than a nanosecond, no trial
# runs a week, and a step count must survive the float arithmetic of the statistics (2**53):
# anything outside is damage (a hand edit, a broken disk), and would overflow or divide by
# almost nothing downstream.
SHORTEST_S = 1e-9
LONGEST_S = 7 * 24 * 3600.0
MOST_STEPS = 2**53
MOST_DEVICES = 65_536
MOST_SAMPLES = 2**31 - 1


def _seconds(value: Any, shortest: float = SHORTEST_S) -> bool:
    return _is_number(value) and math.isfinite(value) and shortest <= value <= LONGEST_S


def _protocol_problem(protocol: Any) -> str | None:
    """The protocol's fractions that the statistics read (absent or null in older records)."""
    if protocol is None:
        return None
    if not isinstance(protocol, dict):
        return f"has trial.protocol {_brief(protocol)}, not a table"
    for key in ("interval_target", "run_variation", "device_run_variation"):
        value = protocol.get(key)
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                      and 0 <= value <= 1):
            return f"has trial.protocol.{key} {_brief(value)}, not a fraction from 0 to 1"
    return None


def _timing_problem(timing: Any) -> str | None:
    if not isinstance(timing, dict):
        return "is ok but lacks its timing"
    windows = timing.get("window_s")
    if not isinstance(windows, list) or not windows or not all(_seconds(w) for w in windows):
        return (f"has timing.window_s that is not a list of seconds between {SHORTEST_S:g} and "
                f"{LONGEST_S:g}: {_brief(windows)}")
    steps = timing.get("steps_per_window")
    if not _is_int(steps) or not 1 <= steps <= MOST_STEPS:
        return f"has timing.steps_per_window {_brief(steps)}"
    if not _seconds(timing.get("first_call_s"), shortest=0.0):
        return f"has timing.first_call_s {_brief(timing.get('first_call_s'))}"
    return None


def _brief(value: Any, limit: int = 60) -> str:
    """A value for a one-line error, cut short (a damaged file may hold anything)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _allreduce_problem(record: Mapping[str, Any]) -> str | None:
    for key, ok in (("backend", lambda v: isinstance(v, str) and v),
                    ("devices", lambda v: _is_int(v) and 0 < v <= MOST_DEVICES),
                    ("nbytes", lambda v: _is_int(v) and 0 < v <= MOST_STEPS), ("status", lambda v: v in STATUSES)):
        if key not in record:
            return f"lacks {key}"
        if not ok(record[key]):
            return f"has {key} {_brief(record[key])}"
    if record["status"] == "ok":
        return _timing_problem(record.get("timing"))
    return None


def read_run(run_dir: Path) -> RunInfo:
    """run.json of a run directory, checked: UTF-8 JSON holding a run id, the command and the
    spec; a one-line error names the file and what is wrong."""
    path = Path(run_dir) / RUN_FILE
    if not path.exists():
        raise XbenchError(f"no {RUN_FILE} in {run_dir}; is it an xbench run directory?")
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise XbenchError(f"{path} is not UTF-8 text; the file was damaged") from None
    except json.JSONDecodeError as err:
        raise XbenchError(f"{path} is not JSON (line {err.lineno}: {err.msg}); "
                          "the file was edited or damaged") from None
    except OSError as err:
        raise XbenchError(f"cannot read {path}: {err.strerror or err}") from None
    problem = _run_problem(run)
    if problem:
        raise XbenchError(f"{path} {problem}; the file was edited or damaged")
    return cast(RunInfo, run)


def _run_problem(run: Any) -> str | None:
    if not isinstance(run, dict):
        return f"holds {type(run).__name__}, not a run"
    required: tuple[tuple[str, type], ...] = (("run_id", str), ("command", str), ("spec", dict))
    for key, kind in required:
        if not isinstance(run.get(key), kind):
            return f"has {key} {run.get(key)!r}" if key in run else f"lacks {key}"
    optional: tuple[tuple[str, type], ...] = (("launch", dict), ("devices", dict), ("resumed", list),
                                              ("breakdown", bool))
    for key, kind in optional:
        if key in run and not isinstance(run[key], kind):
            return f"has {key} {_brief(run[key])}"
    if not isinstance(run["spec"].get("protocol"), dict):  # every release recorded the protocol
        return f"has spec.protocol {_brief(run['spec'].get('protocol'))}, not a table"
    return _launch_problem(run.get("launch", {}))


def _launch_problem(launch: Mapping[str, Any]) -> str | None:
    """run.json's launch table, as `xbench.run.cluster.Launch.to_dict` writes it (plus the
    launcher each backend started with)."""
    def count(least: int) -> Callable[[Any], bool]:
        return lambda v: _is_int(v) and least <= v <= MOST_DEVICES

    kinds: dict[str, Callable[[Any], bool]] = {
        "launcher": lambda v: isinstance(v, str), "source": lambda v: isinstance(v, str),
        "nproc_per_node": lambda v: v is None or count(1)(v), "nnodes": count(1), "node_rank": count(0),
        "coordinator": lambda v: v is None or isinstance(v, str),
        "hosts": lambda v: isinstance(v, list) and all(isinstance(h, str) for h in v),
        "backends": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
    }
    for key, value in launch.items():
        if key not in kinds:
            return f"has launch.{_brief(key, 30)}, which xbench never writes"
        if not kinds[key](value):
            return f"has launch.{key} {_brief(value)}"
    if launch.get("node_rank", 0) >= launch.get("nnodes", 1):
        return f"has launch.node_rank {launch['node_rank']} of {launch.get('nnodes', 1)} nodes"
    return None


def migrate(record: dict[str, Any]) -> dict[str, Any]:
    """Upgrade a record as read (of any schema, either file) to SCHEMA_VERSION, one version
    at a time: a `Record` or an `AllReduceRecord` as this code declares them."""
    while record["schema"] < SCHEMA_VERSION:
        record = MIGRATIONS[record["schema"]](record)
    return record


def _v1_to_v2(record: dict[str, Any]) -> dict[str, Any]:
    unverified = {"status": "skipped", "reason": "recorded before xbench verified (schema 1)"}
    return {"verification": unverified, **record, "schema": 2}


def _v2_to_v3(record: dict[str, Any]) -> dict[str, Any]:
    if "trial" in record:
        record = {**record, "trial": {"all_reduce": True, **record["trial"]}}
    return {**record, "schema": 3}


def _v3_to_v4(record: dict[str, Any]) -> dict[str, Any]:
    """Before replicates every configuration ran in one process: replicate 0."""
    if "trial" not in record:
        return {**record, "schema": 4}
    trial = {**record["trial"], "replicate": record["trial"].get("replicate", 0)}
    ids = {"trial_id": f"{record['trial_id']}/r0"} if "trial_id" in record else {}
    return {**record, **ids, "trial": trial, "schema": 4}


def _v4_to_v5(record: dict[str, Any]) -> dict[str, Any]:
    """Before variants and plain programs every trial ran its backend's data-parallel program
    as written."""
    if "trial" not in record:
        return {**record, "schema": 5}
    trial = {"variant": AS_WRITTEN, "program": DATA_PARALLEL, **record["trial"]}
    return {**record, "trial": trial, "schema": 5}


MIGRATIONS = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5}
