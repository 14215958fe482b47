"""Records as a table for pandas users: one row per trial, statistics included."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from xbench.summary import energy_mj_per_sample, gpu_util_pct, memory_gib, rows_from_records, verdict


def flat_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One flat dict per trial: configuration, environment facts, and its statistics."""
    out = []
    for record, row in zip(records, rows_from_records(records)):
        trial, devices = record["trial"], record.get("devices") or {}
        t, s, b = row.throughput, row.scaling, row.breakdown
        out.append({
            "run_id": record.get("run_id"), "trial_id": record.get("trial_id"),
            "status": record["status"], "reason": record.get("reason"),
            "backend": row.backend, "launcher": row.launcher, "model": row.model, "params": row.params,
            "devices": row.devices, "global_batch": row.global_batch, "per_device_batch": row.per_device_batch,
            "scaling": trial["scaling"], "precision": trial["precision"],
            "steps_per_call": trial["protocol"]["steps_per_call"], "all_reduce": row.all_reduce,
            "framework": devices.get("framework"), "framework_version": devices.get("framework_version"),
            "platform": devices.get("platform"), "simulated": devices.get("simulated"),
            "samples_per_s_mean": t.mean if t else None, "samples_per_s_median": t.median if t else None,
            "ci95_low": t.ci_low if t else None, "ci95_high": t.ci_high if t else None,
            "windows_kept": t.n if t else None, "outliers_removed": t.removed if t else None,
            "step_ms": row.step_ms, "first_call_s": row.first_call_s,
            "speedup": s.speedup if s else None, "efficiency": s.efficiency if s else None,
            "p_value": s.p_value if s else None, "verdict": verdict(row),
            "compute_ms": b.compute_ms if b else None, "exposed_comm_ms": b.comm_ms if b else None,
            "comm_fraction": b.comm_fraction if b else None,
            "gpu_util_pct": gpu_util_pct(row), "memory_gib": memory_gib(row),
            "energy_mj_per_sample": energy_mj_per_sample(row),
            "verification": (record.get("verification") or {}).get("status"),
        })
    return out


def to_frame(records: Sequence[Mapping[str, Any]]):
    import pandas as pd

    return pd.DataFrame(flat_rows(records))
