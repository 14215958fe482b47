"""What crosses the process boundary between xbench and its workers.

The launcher (`xbench.run.launcher`) writes one `Job` as JSON on a worker's stdin; the worker
(`python -m xbench.worker`) answers with events, one JSON object a line on its stdout:

    Unavailable or SetupFailed      it cannot run the job, and exits
    Ready                           set up; then, for each of the job's trials (modes time, verify):
      Start, Window..., Result        Window after each timed window (mode time only)
    or, for each collective and buffer size (mode allreduce):
      AllReduce
    Done                            every trial or size reported

Every message carries `WIRE_VERSION` ("wire") and, for an event, its kind ("event"); the
other keys are the fields of the dataclasses below, coded by their annotations, so adding a
field is adding it here and using it. `Job.from_json` and `decode_event` refuse what they
cannot read whole (bad JSON, an unknown kind, a missing, unknown or wrongly typed field,
another wire version) with a one-line `WireError`.

Verification arrays are too large for the event stream: the worker writes them to a file
(`save_reference`) that a `Result` names and the parent reads (`load_reference`).
"""

from __future__ import annotations

import functools
import json
import types
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import numpy as np

from xbench.contract import Process, Trial
from xbench.errors import XbenchError, brief, one_line
from xbench.stats import relative_errors

WIRE_VERSION = 4  # raise it with any change to the messages below


class WireError(XbenchError):
    """A message between xbench and a worker that cannot be read; the message says what is wrong."""


# -- the job ---------------------------------------------------------------------------------

Mode = Literal["time", "verify", "allreduce"]


@dataclass(frozen=True)
class Job:
    """What one worker process does: set up backend `target` on `devices` devices of
    `platform`, then run its trials (or all-reduce sizes) in turn."""

    target: str  # the backend's entry-point value, "module:Class"
    devices: int
    platform: str
    mode: Mode = "time"  # time the trials; capture verification arrays of them; time all-reduces
    trials: tuple[Trial, ...] = ()  # modes time and verify
    arrays_dir: Path | None = None  # mode verify (and only it): where each trial's arrays go
    shard_counts: tuple[int, ...] = ()  # mode verify: the slice counts a 1-device run reports (the N planned)
    sizes: tuple[int, ...] = ()  # mode allreduce: buffer sizes, nccl-tests' size (bytes)
    collectives: tuple[str, ...] = ()  # mode allreduce: each size's collective, by position; () all "allreduce"
    options: dict[str, Any] = field(default_factory=dict)  # mode allreduce: the backend's options
    process: Process | None = None  # spmd launcher: this process's place in the job; else None

    def __post_init__(self) -> None:
        if (self.mode == "verify") != (self.arrays_dir is not None):
            raise WireError(f"mode {self.mode!r} {'needs' if self.mode == 'verify' else 'takes no'} arrays_dir "
                            "(only mode 'verify' has one)")
        if self.collectives and len(self.collectives) != len(self.sizes):
            raise WireError(f"{len(self.collectives)} collectives for {len(self.sizes)} sizes (one each, or none)")

    def collective_sizes(self) -> list[tuple[str, int]]:
        """Mode allreduce: (collective, size) in the order the worker times them."""
        return list(zip(self.collectives or ("allreduce",) * len(self.sizes), self.sizes))

    def to_json(self) -> str:
        return json.dumps({"wire": WIRE_VERSION, **_plain_fields(self)})

    @classmethod
    def from_json(cls, text: str | bytes) -> Job:
        return _decode(cls, _versioned(_parsed(text, "job"), "job"), "job")


# -- the events ------------------------------------------------------------------------------

Status = Literal["ok", "failed", "unsupported"]


class _Event:
    KIND: ClassVar[str]  # the "event" key that names it on the wire

    def to_json(self) -> str:
        return json.dumps({"wire": WIRE_VERSION, "event": self.KIND, **_plain_fields(self)})


@dataclass(frozen=True)
class Ready(_Event):
    """Set up: the devices this process drives (each process of an spmd job names its own)."""

    KIND: ClassVar[str] = "ready"
    device_info: dict[str, Any]  # the fields of the backend's xbench.contract.DeviceInfo


@dataclass(frozen=True)
class Unavailable(_Event):
    """The devices asked for do not exist here (`DeviceUnavailable`): the job is skipped."""

    KIND: ClassVar[str] = "unavailable"
    reason: str


@dataclass(frozen=True)
class SetupFailed(_Event):
    """Setup raised, or the worker could not read its job: the job fails."""

    KIND: ClassVar[str] = "setup_failed"
    reason: str


@dataclass(frozen=True)
class Start(_Event):
    """A trial begins (its timeout counts from here)."""

    KIND: ClassVar[str] = "start"
    trial: str  # Trial.id
    at: str  # utc_now()


@dataclass(frozen=True)
class Window(_Event):
    """A timed window of the trial ended (for progress)."""

    KIND: ClassVar[str] = "window"
    trial: str
    done: int  # timed windows so far


@dataclass(frozen=True)
class Result(_Event):
    """A trial's outcome. Its measurement fields (after `reason`) are those the worker filled
    in: the record keeps each one that is not None, under its name (see `measured`)."""

    KIND: ClassVar[str] = "result"
    trial: str
    status: Status
    at: str
    reason: str | None = None  # why it is not ok
    work: dict[str, Any] | None = None  # ok: params, weights_hash and data_hash of the common start
    backend: dict[str, Any] | None = None  # ok: the fields of the trial's xbench.contract.PreparedInfo
    timing: dict[str, Any] | None = None  # mode time: first_call_s, window_s, steps_per_window, stopped, ranks
    arrays: str | None = None  # mode verify: the file of the trial's Reference
    phases: dict[str, float] | None = None  # mode verify: seconds of each phase (xbench.worker.capture.PHASES)
    framework_memory: dict[str, Any] | None = None  # mode verify: the framework's own peak (ReportsMemory)
    telemetry: dict[str, Any] | None = None  # mode time: GPU samples over the windows, framework memory
    replicate: dict[str, Any] | None = None  # mode time: host state around the trial, settings, throttling

    def measured(self) -> dict[str, Any]:
        """The measurement fields the worker filled in, in declaration order."""
        header = {"trial", "status", "at", "reason"}
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in header and getattr(self, f.name) is not None}


@dataclass(frozen=True)
class AllReduce(_Event):
    """One buffer size of a collective (all-reduce unless it says) timed, or why not."""

    KIND: ClassVar[str] = "allreduce"
    nbytes: int
    status: Status
    reason: str | None = None
    timing: dict[str, Any] | None = None  # ok: as Result.timing
    collective: str = "allreduce"  # one of xbench.contract.COLLECTIVES


@dataclass(frozen=True)
class Done(_Event):
    """Every trial or size of the job was reported; the worker exits next."""

    KIND: ClassVar[str] = "done"


Event = Union[Ready, Unavailable, SetupFailed, Start, Window, Result, AllReduce, Done]
EVENT_TYPES: dict[str, type[Event]] = {cls.KIND: cls for cls in get_args(Event)}


def decode_event(line: str | bytes) -> Event:
    """The event one line of a worker's output holds; WireError when it holds none."""
    raw = _versioned(_parsed(line, "event"), "event")
    kind = raw.pop("event", None)
    if kind not in EVENT_TYPES:
        known = ", ".join(EVENT_TYPES)
        said = "has no kind ('event' field)" if kind is None else f"kind {brief(kind)} is unknown"
        raise WireError(f"event {said} (known: {known})")
    return _decode(EVENT_TYPES[kind], raw, f"{kind!r} event")


# -- coding by annotation --------------------------------------------------------------------
# A field may be str, int, float, bool, a Literal of strings, Path, tuple[X, ...],
# dict[str, Any] (any JSON object), `X | None`, a Trial (its own to_dict/from_dict) or another
# dataclass of such fields (Process); anything else is a TypeError on first use.

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

M = TypeVar("M", bound="DataclassInstance")


def _plain_fields(message: Any) -> dict[str, Any]:
    return {f.name: _plain(getattr(message, f.name)) for f in fields(message)}


def _plain(value: Any) -> Any:
    """A field's value as JSON types."""
    if isinstance(value, Trial):
        return value.to_dict()  # the contract's own coding
    if is_dataclass(value) and not isinstance(value, type):
        return _plain_fields(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _parsed(text: str | bytes, what: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
        shown = text.decode(errors="replace") if isinstance(text, bytes) else text
        raise WireError(f"{what} is not JSON ({one_line(str(err))}): {brief(shown.strip())}") from None
    if not isinstance(raw, dict):
        raise WireError(f"{what} is not a JSON object: {brief(raw)}")
    return raw


def _versioned(raw: dict[str, Any], what: str) -> dict[str, Any]:
    """`raw` less its wire version, which must be this xbench's."""
    version = raw.pop("wire", None)
    if version is None:
        raise WireError(f"{what} carries no wire version ('wire' field)")
    if version != WIRE_VERSION:
        raise WireError(f"{what} is of wire version {brief(version)}, this xbench speaks {WIRE_VERSION} "
                        "(xbench and its worker come from different installations)")
    return raw


def _decode(cls: type[M], raw: Mapping[str, Any], what: str, path: str = "") -> M:
    """An instance of dataclass `cls` from the JSON object `raw`: every field present, no other."""
    names = [f.name for f in fields(cls)]
    unknown = [key for key in raw if key not in names]
    if unknown:
        raise WireError(f"{what}: unknown field {path + unknown[0]!r}")
    missing = [name for name in names if name not in raw]
    if missing:
        raise WireError(f"{what}: field {path + missing[0]!r} is missing")
    hints = _hints(cls)
    values = {name: _value(raw[name], hints[name], what, path + name) for name in names}
    try:
        return cls(**values)
    except WireError as err:
        raise WireError(f"{what}: {err}") from None


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return get_type_hints(cls)


def _value(value: Any, hint: Any, what: str, path: str) -> Any:
    """`value` read as type `hint`; WireError naming `path` when it is not one."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        (inner,) = [arm for arm in args if arm is not type(None)]  # only `X | None` is coded
        return None if value is None else _value(value, inner, what, path)
    if origin is Literal:
        if value in args and isinstance(value, str):
            return value
        raise _wrong(value, "one of " + ", ".join(repr(a) for a in args), what, path)
    if origin is tuple:
        if not isinstance(value, list):
            raise _wrong(value, "a list", what, path)
        return tuple(_value(v, args[0], what, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise _wrong(value, "an object", what, path)
        return dict(value)
    if hint is Trial:
        return _trial(value, what, path)
    if isinstance(hint, type) and is_dataclass(hint):
        if not isinstance(value, dict):
            raise _wrong(value, "an object", what, path)
        return _decode(hint, value, what, path + ".")
    if hint is Path:
        if not isinstance(value, str):
            raise _wrong(value, "a path (str)", what, path)
        return Path(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool):
        if isinstance(value, hint) and (hint is bool or not isinstance(value, bool)):
            return value
        raise _wrong(value, hint.__name__, what, path)
    raise TypeError(f"xbench.wire cannot code {hint!r} (field {path!r})")  # a new field of a new type


def _trial(value: Any, what: str, path: str) -> Trial:
    if not isinstance(value, dict):
        raise _wrong(value, "a trial (an object)", what, path)
    try:
        return Trial.from_dict(value)
    except (TypeError, KeyError, ValueError) as err:
        raise WireError(f"{what}: field {path!r} is not a trial ({type(err).__name__}: "
                        f"{one_line(str(err))})") from None


def _wrong(value: Any, expected: str, what: str, path: str) -> WireError:
    return WireError(f"{what}: field {path!r} must be {expected}, got {type(value).__name__} {brief(value)}")


# -- verification arrays ---------------------------------------------------------------------

# The columns of a full-size probe's gradient summaries, one row per tensor
# (`xbench.worker.capture.summarize` writes them, `xbench.results.full_size` compares them).
SUMMARY_COLUMNS = ("norm", "sum", "projection 1", "projection 2", "absolute sum")


@dataclass(frozen=True)
class Reference:
    """What one (backend, devices, model) produced from the common start."""

    loss: float
    gradients: list[np.ndarray]
    losses: list[float]
    replicas: list[list[np.ndarray]]  # per replica: kernels and biases in layer order
    # Each other replica's errors against replica 0 (max abs, max rel, norm rel), computed in
    # the worker so that only replica 0 is stored (200 M parameters x 4 replicas is 3 GB).
    replica_errors: tuple[tuple[float, float, float], ...] | None = None
    # The full-size probe's gradients as summaries (one row per tensor, `SUMMARY_COLUMNS`),
    # computed in the worker instead of whole arrays; None for a run that kept its arrays.
    summaries: np.ndarray | None = None
    # Slice count -> the loss of each of that many equal slices of the first batch, each
    # computed where the program computes it (`ReportsShardLosses`); empty where unreported.
    shard_losses: dict[int, tuple[float, ...]] = field(default_factory=dict)

    @property
    def replica_count(self) -> int:
        return 1 + len(self.replica_errors) if self.replica_errors is not None else len(self.replicas)

    def worst_replica_error(self) -> tuple[float, float, float] | None:
        """The largest disagreement of a replica with replica 0, or None with one replica."""
        found = (self.replica_errors if self.replica_errors is not None
                 else tuple(relative_errors(r, self.replicas[0]) for r in self.replicas[1:]))
        return max(found, key=lambda e: e[2]) if found else None


def save_reference(path: Path, ref: Reference) -> None:
    arrays: dict[str, Any] = {"loss": np.float64(ref.loss), "losses": np.asarray(ref.losses, np.float64)}
    arrays.update({f"grad_{i}": g for i, g in enumerate(ref.gradients)})
    for r, weights in enumerate(ref.replicas):
        arrays.update({f"replica_{r}_{i}": w for i, w in enumerate(weights)})
    if ref.replica_errors is not None:
        arrays["replica_errors"] = np.asarray(ref.replica_errors, np.float64).reshape(-1, 3)
    if ref.summaries is not None:
        arrays["summaries"] = np.asarray(ref.summaries, np.float64)
    arrays.update({f"shards_{count}": np.asarray(losses, np.float64) for count, losses in ref.shard_losses.items()})
    np.savez(path, **arrays)


def load_reference(path: Path) -> Reference:
    with np.load(path) as data:
        grads = _numbered(data, "grad_")
        replicas: list[list[np.ndarray]] = []
        while f"replica_{len(replicas)}_0" in data:
            replicas.append(_numbered(data, f"replica_{len(replicas)}_"))
        found = data["replica_errors"] if "replica_errors" in data else None
        replica_errors = None if found is None else tuple((float(a), float(b), float(c)) for a, b, c in found)
        summaries = np.asarray(data["summaries"]) if "summaries" in data else None
        shards = {int(name.removeprefix("shards_")): tuple(float(x) for x in data[name])
                  for name in data.files if name.startswith("shards_")}
        return Reference(float(data["loss"]), grads, list(data["losses"]), replicas, replica_errors, summaries,
                         shards)


def _numbered(data: Mapping[str, np.ndarray], prefix: str) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    while f"{prefix}{len(out)}" in data:
        out.append(data[f"{prefix}{len(out)}"])
    return out


def utc_now() -> str:
    """A timestamp for records: UTC, ISO 8601, seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
