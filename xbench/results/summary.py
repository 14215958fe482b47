"""From records to result rows: one row per configuration, its replicates combined.

A record is one replicate (one fresh worker process) of a configuration. A row combines them:
two-level statistics over the replicates' timing windows (`stats.replicated_summary`), an
interval over the replicate means whose spread is pooled over the configurations that vary
alike (`variance_group`, `stats.pooled_log_spreads`), speedup against 1 device from the same
model, and the labels a reader needs before trusting a number: unstable (replicates disagree
beyond what their windows explain), host-bound (the step measures dispatch, not arithmetic),
throttled, wide (the interval missed the spec's target).

Pure functions over records (`xbench.results.records.Record`), computed on demand from the raw windows stored in the
records, so nothing cached can go stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from xbench import stats
from xbench.contract import AS_WRITTEN, DATA_PARALLEL, PLAIN, trial_id
from xbench.models.model_spec import ModelSpec
from xbench.results.conditions import busy_host, host_bound_reason
from xbench.results.fit import estimate_gib
from xbench.results.links import short
from xbench.results.peaks import Peak, peak_for
from xbench.results.records import Record, StoredModel
from xbench.results.rows import Breakdown, Replicate, Row, full_rows, program_kind, variance_group


def throughput_samples(record: Record) -> np.ndarray:
    """Samples/s for each timed window of an ok record."""
    timing = record["timing"]
    step_s = np.asarray(timing["window_s"], dtype=float) / timing["steps_per_window"]
    return record["trial"]["global_batch"] / step_s


def rows_from_records(records: Sequence[Record]) -> list[Row]:
    """One row per configuration, in reading order (`_display_order`)."""
    groups: dict[str, list[Record]] = {}
    for record in records:
        groups.setdefault(_config_key(record), []).append(record)
    busy = busy_host(records)
    machine = None if busy is None else (busy.load, busy.cores)  # the run's, said with each of its rows
    rows = sorted((replace(_row(group), busy=machine) for group in groups.values()), key=_display_order(records))
    rows = _with_pooled_intervals([replace(row, host_bound=host_bound_reason(row, rows)) for row in rows])
    return [_with_breakdown(_with_scaling(row, rows), rows) for row in rows]


def _with_pooled_intervals(rows: list[Row]) -> list[Row]:
    """Each measured row's interval from the spread its variance group shares, and the
    run-to-run variation of this machine where it applies (`Row.run_var`)."""
    groups: dict[tuple, list[int]] = {}
    for index, row in enumerate(rows):
        if row.throughput is not None:
            groups.setdefault(variance_group(row), []).append(index)
    pooled = list(rows)
    for members in groups.values():
        spreads = stats.pooled_log_spreads([rows[i].means for i in members])
        for i, spread in zip(members, spreads):
            row = rows[i]
            pooled[i] = replace(row, throughput=stats.with_spread(row.measured, spread, run_var=row.run_var))
    return pooled


def _display_order(records: Sequence[Record]):
    """Rows in a reading order, whatever the (shuffled) order the trials ran in: models from
    the smallest, backends by name, then launcher, devices, batch, and the full step before
    its compute-only twin."""
    sizes = {r["trial"]["model"]["name"]: _model_size(r["trial"]["model"]) for r in records}
    return lambda row: (sizes[row.model], row.model, row.backend, row.variant != AS_WRITTEN, row.variant,
                        row.launcher, row.devices, row.program != PLAIN, row.global_batch, not row.all_reduce)


def _model_size(model: StoredModel) -> int:
    try:
        return ModelSpec.from_dict(model).params
    except (KeyError, TypeError, ValueError):
        return 0


def _model_facts(model: StoredModel) -> dict[str, Any]:
    """What the model's family says of a stored model: FLOPs per sample and the throughput
    unit; nothing where its family is not installed here (a plugin's)."""
    try:
        spec = ModelSpec.from_dict(model)
        return {"flops_per_sample": spec.training_flops_per_sample, "unit": spec.unit,
                "units_per_sample": spec.units_per_sample}
    except (KeyError, TypeError, ValueError):
        return {}


def _simulated(record: Record) -> bool:
    devices = record.get("devices")
    return bool(devices and devices.get("simulated"))


def _framework(records: Sequence[Record]) -> str:
    """The framework a worker reported (tests' records may lack it)."""
    for record in records:
        devices = record.get("devices")
        if devices:
            return str(devices.get("framework") or "")
    return ""


def _device_peak(records: Sequence[Record], precision: str) -> Peak | None:
    """The peak of the devices a measured replicate ran on (simulated devices have none)."""
    for record in records:
        devices = record.get("devices")
        if record["status"] == "ok" and devices and devices.get("platform") == "gpu" and not devices.get("simulated"):
            names = devices.get("device_names") or ()
            return peak_for(names[0], precision) if names else None
    return None


def mfu(row: Row) -> tuple[float, float, float] | None:
    """Model FLOPs utilisation: the (geometric) mean the tables print, and the ends of the
    throughput's 95 % interval, as fractions of the devices' peak; None where the peak is unknown."""
    t = row.throughput
    if t is None or row.peak is None or not row.flops_per_sample:
        return None
    scale = row.flops_per_sample / (row.devices * row.peak.flops)
    return geomean_rate(row) * scale, t.ci_low * scale, t.ci_high * scale


def _config_key(record: Record) -> str:
    trial = record["trial"]
    return trial_id(trial["backend"], trial["model"]["name"], trial["devices"], trial["global_batch"],
                    trial.get("launcher", "subprocess"), trial.get("all_reduce", True),
                    trial.get("variant", AS_WRITTEN), trial.get("program", DATA_PARALLEL))


def _replicate(record: Record) -> Replicate:
    index = record["trial"].get("replicate", 0)
    if record["status"] != "ok":
        return Replicate(index, record["status"], record.get("reason"))
    confounders = record.get("replicate")
    throttled = tuple(confounders.get("throttle_reasons") or ()) if confounders else ()
    return Replicate(index, "ok", None, tuple(throughput_samples(record)), record["timing"]["first_call_s"],
                     record.get("telemetry"), throttled, record["timing"].get("stopped"))


def _row(records: Sequence[Record]) -> Row:
    trial = records[0]["trial"]
    replicates = tuple(sorted((_replicate(r) for r in records), key=lambda r: r.index))
    measured = [r for r in replicates if r.status == "ok"]
    last = records[-1]
    protocol = trial.get("protocol") or {}
    common = dict(
        backend=trial["backend"],
        model=trial["model"]["name"],
        devices=trial["devices"],
        global_batch=trial["global_batch"],
        per_device_batch=trial["global_batch"] // trial["devices"],
        scaling_mode=trial["scaling"],
        all_reduce=trial.get("all_reduce", True),
        launcher=trial.get("launcher", "subprocess"),
        variant=trial.get("variant", AS_WRITTEN),
        program=trial.get("program", DATA_PARALLEL),
        params=next((r["work"]["params"] for r in records if r.get("work")), None),
        replicates=replicates,
        scaling=None,
        planned=max(len(replicates), protocol.get("replicates") or 0),
        run_variation=float(protocol.get("run_variation") or 0.0),
        device_run_variation=float(protocol.get("device_run_variation") or 0.0),
        simulated=any(_simulated(r) for r in records),
        framework=_framework(records),
        links=short((records[0].get("environment") or {}).get("links")) if records else "",
        interval_target=float(protocol.get("interval_target") or 0.0),
        peak=_device_peak(records, trial["precision"]),
        precision=trial["precision"],
        memory_estimate_gib=estimate_gib(records),
        sharded=any(r["memory"]["sharded"] for r in records if r.get("memory")),
        **_model_facts(trial["model"]),
    )
    if not measured:
        return Row(**common, status=last["status"], reason=last.get("reason"), throughput=None, step_ms=None,
                   first_call_s=None)
    summary = stats.replicated_summary([r.windows for r in measured])
    ranks = max(len(r["timing"].get("ranks") or ()) for r in records if r["status"] == "ok") or 1
    return Row(**common, status="ok", reason=None, throughput=summary,
               step_ms=1e3 * trial["global_batch"] / summary.median,
               first_call_s=max(r.first_call_s for r in measured if r.first_call_s is not None), ranks=ranks)


def _with_scaling(row: Row, rows: list[Row]) -> Row:
    """Attach the speedup that says whether devices help: the row's throughput over the same
    program's on 1 device (same backend, variant, program and launcher, the same work per step:
    the same global batch under strong scaling, the same per-device batch under weak), so that
    a program is compared with itself. Where that program did not run on 1 device (`--single-device
    plain`) the speedup is taken over the plain program, and `baseline` says it is another
    program. Separately, a data-parallel row gets its ratio to the plain single-device program
    (`vs_plain`): what a user gains over the program they would write without distribution,
    program and devices together. The sample on each side is the replicate means."""
    if row.throughput is None or not row.all_reduce:
        return row
    bases = {base.program: base for base in one_device_rows(row, rows)}
    plain = bases.get(PLAIN)
    if row.program != PLAIN and plain is not None:
        row = replace(row, vs_plain=_ratio(row, plain))
    if row.devices == 1:
        return row
    base = bases.get(row.program) or plain
    if base is None:
        return row
    if base is plain:
        row = replace(row, vs_plain=None)  # the speedup already is the ratio to the plain program
    return replace(row, scaling=_ratio(row, base), baseline=base.program)


def one_device_rows(row: Row, rows: Sequence[Row]) -> list[Row]:
    """The measured 1-device rows of the row's backend, variant, model and launcher with the same
    work per step (the row itself excluded)."""
    return [base for base in full_rows(rows) if base.devices == 1 and base.throughput is not None
            and base.trial_id != row.trial_id and _same_work(base, row)
            and (base.backend, base.variant, base.model, base.launcher)
            == (row.backend, row.variant, row.model, row.launcher)]


def _ratio(row: Row, base: Row) -> stats.Scaling:
    return stats.scaling(row.measured, base.measured, row.devices, run_vars=(row.run_var, base.run_var),
                         shared=variance_group(row) == variance_group(base))


# A speedup above the device count by more than this factor is flagged with its likely cause.
ABOVE_LINEAR_MARGIN = 1.05


def above_linear(row: Row) -> str | None:
    """Why a speedup beyond the device count most likely arose, or None where it is not beyond
    it: N devices cannot do more than N times one device's arithmetic."""
    s = row.scaling
    if s is None or row.devices < 2 or not s.speedup > row.devices * ABOVE_LINEAR_MARGIN:
        return None
    if row.baseline == PLAIN and row.program != PLAIN:
        return "the 1-device row is another program, the plain one"
    if row.host_bound:
        return "host-bound steps (the 1-device row measures dispatch, which N devices overlap)"
    if row.busy:
        return "a busy machine (other programs competed with the replicates, slowing some more than others)"
    if row.simulated:
        return "simulated devices (the CPU's cores and caches are shared unevenly)"
    return "a per-device batch that fits faster memory, or a slow 1-device row: see its notes"


def _same_work(base: Row, row: Row) -> bool:
    if row.scaling_mode == "strong":
        return base.global_batch == row.global_batch
    return base.per_device_batch == row.per_device_batch


def _with_breakdown(row: Row, rows: list[Row]) -> Row:
    if row.step_ms is None or not row.all_reduce:  # a measured row has a step time
        return row
    for twin in rows:
        if (not twin.all_reduce and twin.step_ms is not None
                and (twin.backend, twin.variant, twin.program, twin.model, twin.devices, twin.global_batch,
                     twin.launcher)
                == (row.backend, row.variant, row.program, row.model, row.devices, row.global_batch, row.launcher)):
            comm = row.step_ms - twin.step_ms
            return replace(row, breakdown=Breakdown(twin.step_ms, comm, comm / row.step_ms))
    return row


# Verdict thresholds on speedup (the seed study's). A verdict names the zone that holds the
# speedup's whole 95 % interval; an interval that spans a threshold is inconclusive.
BENEFICIAL_SPEEDUP = 1.10
SINGLE_PREFERRED_BELOW = 0.95
INCONCLUSIVE = "inconclusive"


def verdict(row: Row) -> str:
    """From the speedup's interval alone, so that it can never contradict it: multi-device
    beneficial (the interval lies at or above BENEFICIAL_SPEEDUP), single device preferred (at
    or below SINGLE_PREFERRED_BELOW), about even (between them), inconclusive (it spans one);
    or why there is none."""
    if row.throughput is None:
        return row.status
    if row.devices == 1:
        return "baseline"
    if row.scaling is None:
        return "no 1-device result"
    s = row.scaling
    if s.ci_low != s.ci_low:
        return INCONCLUSIVE
    if s.ci_low >= BENEFICIAL_SPEEDUP:
        return "multi-device beneficial"
    if s.ci_high <= SINGLE_PREFERRED_BELOW:
        return "single device preferred"
    if s.ci_low >= SINGLE_PREFERRED_BELOW and s.ci_high <= BENEFICIAL_SPEEDUP:
        return "about even"
    return INCONCLUSIVE


def run_floor(row: Row) -> float:
    """The ±95 % the run-level variation alone gives the row, as a fraction of its mean: no
    number of replicates of one run narrows it below this."""
    return 1.96 * row.run_var ** 0.5


def can_narrow(row: Row) -> bool:
    """Whether more replicates could bring the row within its target."""
    return run_floor(row) < row.interval_target


def wide(row: Row) -> bool:
    """The row's ±95 % is wider than the spec's interval target (adaptive replicates stopped at
    the time budget before it got there), or it has no interval at all."""
    t = row.throughput
    if t is None or not row.interval_target:
        return False
    return not t.ci_half_width <= row.interval_target * t.mean


@dataclass(frozen=True)
class Fastest:
    """One configuration (model, devices, global batch) and one kind of program (plain or
    data-parallel) across backends and variants: the fastest row, the fastest row as written,
    and what tuning gained."""

    model: str
    devices: int
    global_batch: int
    kind: str  # the programs ranked (`program_kind`): plain ones, or data-parallel ones
    best: Row
    as_written: Row | None  # the fastest row of a backend's as-written variant
    gain: stats.LogRatio | None  # best over as_written (`_ratio`); None when best is as written
    tied: tuple[str, ...]  # rows whose interval of best / row holds 1: not significantly slower
    untested: tuple[str, ...] = ()  # rows that cannot be compared (no spread on a side)


def fastest_rows(rows: Sequence[Row]) -> list[Fastest]:
    """Per configuration with at least two measured rows of one kind of program, in reading
    order (model, devices, batch, then plain before data-parallel): plain programs against
    plain ones, data-parallel ones against data-parallel ones."""
    groups: dict[tuple, list[Row]] = {}
    for row in full_rows(rows):
        if row.throughput is not None:
            groups.setdefault((row.model, row.devices, row.global_batch, program_kind(row)), []).append(row)
    found = []
    for (model, devices, batch, kind), group in groups.items():
        if len(group) < 2:
            continue
        ranked = sorted(group, key=geomean_rate, reverse=True)  # the scale of the ratios beside it
        best = ranked[0]
        written = next((r for r in ranked if r.variant == AS_WRITTEN), None)
        gain = None if written is None or written is best else ratio_of(best, written)
        untested = tuple(r.label for r in ranked[1:] if ratio_of(best, r).ci_low != ratio_of(best, r).ci_low)
        tied = tuple(r.label for r in ranked[1:] if r.label not in untested and not ratio_of(best, r).ci_low > 1)
        found.append(Fastest(model, devices, batch, kind, best, written, gain, tied, untested))
    order = list(dict.fromkeys(model for model, *_ in groups))  # the models as the rows met them
    return sorted(found, key=lambda f: (order.index(f.model), f.devices, f.global_batch, f.kind != PLAIN))


def geomean_rate(row: Row) -> float:
    """The geometric mean of a row's replicate means: what `ratio_of` compares, so that the row
    ranked first never trails the next by a ratio below 1."""
    means = [m for m in row.means if m > 0]
    return float(np.exp(np.mean(np.log(means)))) if means else 0.0


def ratio_of(b: Row, a: Row) -> stats.LogRatio:
    """b's throughput over a's, from the model behind their intervals."""
    return stats.log_ratio(b.means, b.measured.log_spread, a.means, a.measured.log_spread, run_var=a.run_var,
                           b_run_var=b.run_var, shared=variance_group(a) == variance_group(b))
