"""Compare two runs trial by trial: which configurations got slower, and is it real?"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xbench import stats
from xbench.summary import Row, rows_from_records

Key = tuple[str, str, int, int, str, str, bool]  # backend, model, devices, batch, scaling, precision, all-reduce


@dataclass(frozen=True)
class DiffRow:
    key: Key
    a_mean: float
    b_mean: float
    ratio: stats.Ratio  # throughput of B over A

    def change(self, threshold: float) -> str:
        """regression / improvement (significant and beyond the threshold), else why not."""
        r = self.ratio
        if r.p_value >= stats.SIGNIFICANCE:
            return "n.s."
        if r.ratio < 1 - threshold:
            return "regression"
        if r.ratio > 1 + threshold:
            return "improvement"
        return "within threshold"


@dataclass(frozen=True)
class Diff:
    rows: tuple[DiffRow, ...]
    only_a: tuple[Key, ...]
    only_b: tuple[Key, ...]
    environment_changes: tuple[str, ...]

    def regressions(self, threshold: float) -> list[DiffRow]:
        return [row for row in self.rows if row.change(threshold) == "regression"]


def diff_runs(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> Diff:
    """Match measured trials of runs A and B by configuration and compare throughputs."""
    rows_a, rows_b = _by_key(a), _by_key(b)
    both = [k for k in rows_a if k in rows_b]
    return Diff(
        rows=tuple(DiffRow(k, rows_a[k].throughput.mean, rows_b[k].throughput.mean,
                           stats.ratio_interval(rows_b[k].kept, rows_a[k].kept)) for k in both),
        only_a=tuple(k for k in rows_a if k not in rows_b),
        only_b=tuple(k for k in rows_b if k not in rows_a),
        environment_changes=tuple(environment_changes(a, b)),
    )


def _by_key(records: Sequence[Mapping[str, Any]]) -> dict[Key, Row]:
    keyed = {}
    for record, row in zip(records, rows_from_records(records)):
        if row.throughput is not None:
            trial = record["trial"]
            keyed[(row.label, row.model, row.devices, row.global_batch, trial["scaling"], trial["precision"],
                   row.all_reduce)] = row
    return keyed


def environment_changes(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> list[str]:
    """What differs between the runs' machines and frameworks (a diff across them is weaker)."""
    def facts(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        out: dict[str, str] = {}
        for record in records:
            env = record.get("environment", {})
            out["cpu"] = str(env.get("cpu"))
            out["gpus"] = ", ".join(g.get("name", "?") for g in env.get("gpus") or []) or "none"
            if record.get("devices"):
                d = record["devices"]
                out[f"{record['trial']['backend']} framework"] = f"{d['framework']} {d['framework_version']}"
        return out

    fa, fb = facts(a), facts(b)
    return [f"{key}: {fa.get(key, '-')} -> {fb.get(key, '-')}" for key in sorted(set(fa) | set(fb))
            if fa.get(key) != fb.get(key)]
