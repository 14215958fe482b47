"""Records as a table for pandas users: one row per configuration, statistics included."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xbench.contract import AS_WRITTEN, DATA_PARALLEL
from xbench.report.words import notes
from xbench.results.conditions import energy_mj_per_sample, gpu_util_pct, memory_gib, memory_is_bound
from xbench.results.records import Record, StoredDeviceInfo
from xbench.results.summary import Row, geomean_rate, mfu, rows_from_records, verdict


def flat_rows(records: Sequence[Record]) -> list[dict[str, Any]]:
    """One flat dict per configuration (its replicates combined): configuration, environment
    facts, and its statistics."""
    out = []
    first: dict[tuple, Record] = {}
    for record in records:  # a measured replicate's facts where there is one
        if _config(record) not in first or (record["status"] == "ok" and first[_config(record)]["status"] != "ok"):
            first[_config(record)] = record
    for row in rows_from_records(records):
        record = first[(row.backend, row.model, row.devices, row.global_batch, row.launcher, row.all_reduce,
                        row.variant, row.program)]
        trial, devices = record["trial"], record.get("devices")
        t, s, b = row.throughput, row.scaling, row.breakdown
        out.append({
            "run_id": record.get("run_id"), "config_id": row.trial_id,
            "status": row.status, "reason": row.reason,
            "backend": row.backend, "variant": row.variant, "program": row.program, "launcher": row.launcher,
            "model": row.model, "family": trial["model"].get("family", "mlp"), "params": row.params,
            "unit": row.unit, "units_per_sample": row.units_per_sample,
            "devices": row.devices, "global_batch": row.global_batch, "per_device_batch": row.per_device_batch,
            "scaling": trial["scaling"], "precision": trial["precision"],
            "steps_per_call": trial["protocol"]["steps_per_call"], "all_reduce": row.all_reduce,
            **_device_fields(devices),
            "replicates": t.replicates if t else 0, "replicates_planned": max(row.planned, len(row.replicates)),
            "replicate_means": ";".join(f"{m:.6g}" for m in t.means) if t else None,
            "samples_per_s_mean": t.mean if t else None,
            "samples_per_s_geomean": geomean_rate(row) if t else None,  # what the tables print
            "samples_per_s_median": t.median if t else None,
            "ci95_low": t.ci_low if t else None, "ci95_high": t.ci_high if t else None,
            "between_var": t.between_var if t else None, "within_var": t.within_var if t else None,
            "anova_p": t.anova_p if t else None, "replicate_spread": t.spread if t else None,
            "unstable": row.unstable, "host_bound": row.host_bound, "throttled": "; ".join(row.throttled) or None,
            "windows_kept": t.windows if t else None, "outliers_removed": t.removed if t else None,
            "step_ms": row.step_ms, "first_call_s": row.first_call_s,
            "flops_per_sample": row.flops_per_sample, "peak_tflops": row.peak.flops / 1e12 if row.peak else None,
            "peak_device": row.peak.device if row.peak else None,
            **_mfu_fields(row),
            "speedup": s.speedup if s else None, "speedup_ci95_low": s.ci_low if s else None,
            "speedup_ci95_high": s.ci_high if s else None,
            "efficiency": s.efficiency if s and row.devices > 1 else None,
            "speedup_baseline": row.baseline,
            "vs_plain": row.vs_plain.speedup if row.vs_plain else None,
            "vs_plain_ci95_low": row.vs_plain.ci_low if row.vs_plain else None,
            "vs_plain_ci95_high": row.vs_plain.ci_high if row.vs_plain else None,
            "p_value": s.p_value if s else None, "verdict": verdict(row),
            "notes": "; ".join(notes(row)) if t else None,
            "compute_ms": b.compute_ms if b else None, "exposed_comm_ms": b.comm_ms if b else None,
            "comm_fraction": b.comm_fraction if b else None,
            "gpu_util_pct": gpu_util_pct(row), "memory_gib": memory_gib(row),
            "memory_estimate_gib": row.memory_estimate_gib,  # per device, before launching ("est. GiB")
            "memory_is_bound": memory_is_bound(row),  # memory_gib is a worker process's peak, not the trial's
            "energy_mj_per_sample": energy_mj_per_sample(row),
            "verification": _verification_status(record),
        })
    return out


def _device_fields(devices: StoredDeviceInfo | None) -> dict[str, Any]:
    if not devices:  # the worker never started
        return dict.fromkeys(("framework", "framework_version", "platform", "simulated"))
    return {"framework": devices.get("framework"), "framework_version": devices.get("framework_version"),
            "platform": devices.get("platform"), "simulated": devices.get("simulated")}


def _verification_status(record: Record) -> str | None:
    verification = record.get("verification")
    return verification.get("status") if verification else None


def _mfu_fields(row: Row) -> dict[str, float | None]:
    found = mfu(row) or (None, None, None)
    return dict(zip(("mfu", "mfu_ci95_low", "mfu_ci95_high"), found))


def _config(record: Record) -> tuple:
    trial = record["trial"]
    return (trial["backend"], trial["model"]["name"], trial["devices"], trial["global_batch"],
            trial.get("launcher", "subprocess"), trial.get("all_reduce", True), trial.get("variant", AS_WRITTEN),
            trial.get("program", DATA_PARALLEL))


def to_frame(records: Sequence[Record]):
    import pandas as pd

    return pd.DataFrame(flat_rows(records))
