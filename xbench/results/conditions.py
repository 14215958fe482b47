"""What the machine did while a row was measured, as its replicates' telemetry and records say:
GPU utilisation, memory and energy, whether the step measured the host rather than the devices
(host-bound), and whether other programs competed for the host (a busy machine)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from xbench.results.records import Record, Telemetry
from xbench.results.rows import Row

# Host-bound: the GPU computed for less than this share of the timed windows, or the step time
# grew by less than FLAT_STEP_GROWTH while the batch grew FLAT_BATCH_SPAN-fold or more.
HOST_BOUND_GPU_UTIL_PCT = 50.0
FLAT_STEP_GROWTH = 1.25
FLAT_BATCH_SPAN = 4


def host_bound_reason(row: Row, rows: Sequence[Row]) -> str | None:
    """Why this row's step time measures the host (Python, the framework's dispatch, launch
    latency) rather than the devices' arithmetic, or None. Such a number is real (a user's own
    loop pays it too) but says nothing about the devices or the model's size."""
    if row.throughput is None:
        return None
    util = gpu_util_pct(row)
    if util is not None and util < HOST_BOUND_GPU_UTIL_PCT:
        return f"GPU busy {util:.0f} % of the time"
    flat = _flat_span(row, rows)
    if flat is not None:
        return f"step time flat from batch {flat[0]} to {flat[1]}"
    return None


def _flat_span(row: Row, rows: Sequence[Row]) -> tuple[int, int] | None:
    """The batch range over which this row's group (same backend, model, devices, kind of
    step) keeps a step time within FLAT_STEP_GROWTH of its smallest batch's, when that range
    spans FLAT_BATCH_SPAN or more and holds this row."""
    group = sorted(((r, r.step_ms) for r in rows if r.step_ms is not None and _same_group(r, row)),
                   key=lambda timed: timed[0].global_batch)
    if len(group) < 2:
        return None
    smallest, smallest_ms = group[0]
    flat = [r for r, step_ms in group if step_ms <= FLAT_STEP_GROWTH * smallest_ms]
    widest = max(r.global_batch for r in flat)
    if widest < FLAT_BATCH_SPAN * smallest.global_batch or row not in flat:
        return None
    return smallest.global_batch, widest


def _same_group(a: Row, b: Row) -> bool:
    return ((a.implementation, a.model, a.devices, a.launcher, a.all_reduce, a.scaling_mode)
            == (b.implementation, b.model, b.devices, b.launcher, b.all_reduce, b.scaling_mode))


def _telemetry(row: Row) -> list[Telemetry]:
    """The telemetry of each replicate that has some."""
    return [r.telemetry for r in row.replicates if r.telemetry]


def _measured_telemetry(row: Row) -> list[Telemetry]:
    """Each measured replicate's telemetry over its timed windows, or (where the driver had
    no sample of them) over the untimed stretch after them."""
    found = []
    for telemetry in _telemetry(row):
        if any(d.get("util_mean_pct") is not None for d in telemetry.get("devices") or []):
            found.append(telemetry)
        elif telemetry.get("after_windows"):
            found.append(telemetry["after_windows"])
    return found


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def gpu_util_pct(row: Row) -> float | None:
    """Mean NVML utilisation over the devices and replicates."""
    values = _present(d.get("util_mean_pct") for t in _measured_telemetry(row) for d in t.get("devices") or [])
    return sum(values) / len(values) if values else None


def memory_gib(row: Row) -> float | None:
    """The framework's own peak where it has one (a framework that preallocates makes NVML's
    'used' meaningless), else NVML's peak 'used'."""
    telemetry = _telemetry(row)
    peaks = _framework_peaks(telemetry)
    if peaks:
        return max(peaks) / 2**30
    used = [mib for mib in _present(d.get("nvml_memory_max_mib") for t in telemetry for d in t.get("devices") or [])
            if mib]
    return max(used) / 1024 if used else None


def memory_is_bound(row: Row) -> bool:
    """Whether `memory_gib` only bounds the row's trials: no replicate's framework counter was
    its trial's own, and one says it covered its worker process, where an earlier trial may
    have set the peak (a counter that names no scope claims neither)."""
    scopes = {memory.get("scope") for t in _telemetry(row) if (memory := t.get("framework_memory"))}
    return "trial" not in scopes and "worker process" in scopes


def _framework_peaks(telemetry: Iterable[Telemetry]) -> list[int]:
    """The trials' own peaks where any replicate has one (scope "trial"), else what the
    counters give (a worker process's peak bounds the trials it ran)."""
    own: list[int] = []
    bounds: list[int] = []
    for t in telemetry:
        memory = t.get("framework_memory")
        if memory:
            (own if memory.get("scope") == "trial" else bounds).extend(memory.get("peak_bytes") or [])
    return own or bounds


def energy_mj_per_sample(row: Row) -> float | None:
    """Mean over replicates of NVML energy per sample."""
    values = _present(t.get("energy_per_sample_j") for t in _telemetry(row))
    if not values:
        values = [v for v in _present(t.get("energy_per_sample_j") for t in _measured_telemetry(row)) if v]
    return 1e3 * sum(values) / len(values) if values else None


@dataclass(frozen=True)
class BusyHost:
    """The host's load while replicates ran, where it exceeded the cores it had."""

    load: float  # the median 1-minute load average as replicates started
    cores: int  # the cores the workers could use


def busy_host(records: Sequence[Record]) -> BusyHost | None:
    """The host's load when it exceeded its cores while replicates ran (other programs were
    competing with the measurement), else None. A replicate's own worker stays within the
    cores it has (about 1.7 on 2 cores here), so a median above them means something else ran."""
    loads: list[float] = []
    cores: list[int] = []
    for record in records:
        facts = record.get("replicate")
        before = facts.get("host_before") if facts else None
        if not before:
            continue
        load, count = before.get("loadavg_1m"), before.get("cpus_allowed") or before.get("cpu_count")
        if isinstance(load, (int, float)) and not isinstance(load, bool) and 0 <= load < 1e6:  # advice, never data
            loads.append(float(load))
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            cores.append(count)
    if not loads or not cores:
        return None
    load, available = float(np.median(loads)), min(cores)
    return BusyHost(load, available) if load > available else None
