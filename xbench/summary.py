"""From records to result rows: statistics per trial and scaling against 1 device.

Pure functions over record dicts; computed on demand from the raw timing windows stored in
the records, so nothing cached can go stale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from xbench import stats
from xbench.contract import backend_label, trial_id


@dataclass(frozen=True)
class Breakdown:
    """Where a multi-device step's time goes: its compute-only twin (the same step without
    the gradient all-reduce) against the full step, both at the median throughput."""

    compute_ms: float
    comm_ms: float  # exposed communication: full step - compute-only step
    comm_fraction: float  # of the full step


@dataclass(frozen=True)
class Row:
    """One trial as a table shows it."""

    backend: str
    model: str
    devices: int
    global_batch: int
    per_device_batch: int
    scaling_mode: str  # "strong" or "weak"
    status: str
    reason: str | None
    params: int | None
    throughput: stats.Summary | None  # samples/s, outliers removed
    kept: tuple[float, ...]  # the throughput values the summary used
    step_ms: float | None  # global batch / median throughput
    first_call_s: float | None
    scaling: stats.Scaling | None
    all_reduce: bool = True  # False for a compute-only twin (--breakdown)
    breakdown: Breakdown | None = None
    telemetry: dict[str, Any] | None = None  # GPU utilisation, memory, power (xbench.telemetry)
    launcher: str = "subprocess"  # "spmd": one process per device
    ranks: int = 1  # processes whose window times the step time is the maximum of

    @property
    def trial_id(self) -> str:
        return trial_id(self.backend, self.model, self.devices, self.global_batch, self.launcher, self.all_reduce)

    @property
    def label(self) -> str:
        return backend_label(self.backend, self.launcher)


def throughput_samples(record: Mapping[str, Any]) -> np.ndarray:
    """Samples/s for each timed window of an ok record."""
    timing = record["timing"]
    step_s = np.asarray(timing["window_s"], dtype=float) / timing["steps_per_window"]
    return record["trial"]["global_batch"] / step_s


def rows_from_records(records: Sequence[Mapping[str, Any]]) -> list[Row]:
    rows = [_row(record) for record in records]
    return [_with_breakdown(_with_scaling(row, rows), rows) for row in rows]


def full_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows of real training steps (compute-only twins only feed the breakdown)."""
    return [row for row in rows if row.all_reduce]


def _row(record: Mapping[str, Any]) -> Row:
    trial = record["trial"]
    common = dict(
        backend=trial["backend"],
        model=trial["model"]["name"],
        devices=trial["devices"],
        global_batch=trial["global_batch"],
        per_device_batch=trial["global_batch"] // trial["devices"],
        scaling_mode=trial["scaling"],
        all_reduce=trial.get("all_reduce", True),
        launcher=trial.get("launcher", "subprocess"),
        status=record["status"],
        reason=record.get("reason"),
        params=record.get("work", {}).get("params"),
        scaling=None,
    )
    if record["status"] != "ok":
        return Row(**common, throughput=None, kept=(), step_ms=None, first_call_s=None)
    common["telemetry"] = record.get("telemetry")
    common["ranks"] = len(record["timing"].get("ranks") or ()) or 1
    kept, removed = stats.remove_outliers(throughput_samples(record))
    summary = stats.describe(kept, removed)
    return Row(**common, throughput=summary, kept=tuple(kept),
               step_ms=1e3 * trial["global_batch"] / summary.median,
               first_call_s=record["timing"]["first_call_s"])


def _with_scaling(row: Row, rows: list[Row]) -> Row:
    """Attach speedup against the same backend's 1-device row with the same work per step:
    the same global batch under strong scaling, the same per-device batch under weak."""
    if row.throughput is None or row.devices == 1 or not row.all_reduce:
        return row
    for base in full_rows(rows):
        same_work = (base.global_batch == row.global_batch if row.scaling_mode == "strong"
                     else base.per_device_batch == row.per_device_batch)
        if (base.devices == 1 and base.throughput is not None and same_work
                and (base.backend, base.model, base.launcher) == (row.backend, row.model, row.launcher)):
            return replace(row, scaling=stats.scaling(row.kept, base.kept, row.devices))
    return row


def _with_breakdown(row: Row, rows: list[Row]) -> Row:
    if row.throughput is None or not row.all_reduce:
        return row
    for twin in rows:
        if (not twin.all_reduce and twin.throughput is not None
                and (twin.backend, twin.model, twin.devices, twin.global_batch, twin.launcher)
                == (row.backend, row.model, row.devices, row.global_batch, row.launcher)):
            comm = row.step_ms - twin.step_ms
            return replace(row, breakdown=Breakdown(twin.step_ms, comm, comm / row.step_ms))
    return row


# Verdict thresholds on speedup (the seed study's), applied only when Welch's test says the
# N-device and 1-device throughputs differ; otherwise the difference is not established.
BENEFICIAL_SPEEDUP = 1.10
SINGLE_PREFERRED_BELOW = 0.95


def verdict(row: Row) -> str:
    """multi-device beneficial / marginal / single device preferred, or why there is none."""
    if row.throughput is None:
        return row.status
    if row.devices == 1:
        return "baseline"
    if row.scaling is None:
        return "no 1-device result"
    s = row.scaling
    if s.significant and s.speedup >= BENEFICIAL_SPEEDUP:
        return "multi-device beneficial"
    if s.significant and s.speedup < SINGLE_PREFERRED_BELOW:
        return "single device preferred"
    return "marginal"


def gpu_util_pct(row: Row) -> float | None:
    """Mean NVML utilisation over the devices, while the timed windows ran."""
    devices = ((row.telemetry or {}).get("devices")) or []
    values = [d["util_mean_pct"] for d in devices if d.get("util_mean_pct") is not None]
    return sum(values) / len(values) if values else None


def memory_gib(row: Row) -> float | None:
    """The framework's own peak where it has one (pitfall 6), else NVML's peak 'used'."""
    telemetry = row.telemetry or {}
    peak = (telemetry.get("framework_memory") or {}).get("peak_bytes")
    if peak:
        return max(peak) / 2**30
    used = [d["nvml_memory_max_mib"] for d in telemetry.get("devices") or [] if d.get("nvml_memory_max_mib")]
    return max(used) / 1024 if used else None


def energy_mj_per_sample(row: Row) -> float | None:
    energy = (row.telemetry or {}).get("energy_per_sample_j")
    return energy * 1e3 if energy is not None else None
